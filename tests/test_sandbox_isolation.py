"""The worker's OS isolation: its own PID, mount and network namespace (where root and unshare allow).

A submission that detaches a daemon to act after its worker ends, that lists /proc to find the
grader, and that opens a socket: graded, then checked from outside. Skipped, saying why, where no
namespace can be made (not root, no util-linux `unshare`); `python -m grading doctor` says the same.
"""

import os
import time
from pathlib import Path

import pytest

from grading import config as cfg
from grading import sandbox
from grading.grade import Grader

FIX = Path(__file__).resolve().parent / "grading_fixtures"

pytestmark = pytest.mark.skipif(not sandbox.namespaces_available(),
                                reason="no PID/mount namespace here (needs root and util-linux unshare)")

SUBMISSION = '''
import os, socket, sys, time
MARK = {mark!r}
procs = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
with open(MARK + ".proc", "w") as f:
    f.write(" ".join(map(str, procs)) + "\\n" + str(os.getpid()) + " " + str(os.getppid()))
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2)
    net = "connected"
except OSError as exc:
    net = type(exc).__name__
open(MARK + ".net", "w").write(net)
if os.fork() == 0:                       # a daemon: detached, waits for the grader to finish, then writes
    os.setsid()
    if os.fork() == 0:
        time.sleep(4)
        open(MARK + ".daemon", "w").write("I outlived my worker")
    os._exit(0)

def attention(q, k, v, is_causal=False, scale=None):
    raise NotImplementedError("Step 01: nothing here")
'''


def test_worker_is_isolated(tmp_path):
    mark = str(tmp_path / "mark")
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "step01_naive.py").write_text(SUBMISSION.format(mark=mark))
    g = Grader(cfg.load(FIX / "config.toml"), jobs=1, threads=1).grade(sub, [1])
    assert g.steps[0].points == 0.0
    procs, ids = Path(mark + ".proc").read_text().splitlines()
    assert ids.split()[0] == "1", f"the worker is not PID 1 of its own namespace (pid, ppid = {ids})"
    assert str(os.getpid()) not in procs.split(), "the worker could see the grader's process in /proc"
    assert len(procs.split()) <= 4, f"the worker sees processes beyond its own namespace: {procs}"
    assert Path(mark + ".net").read_text() != "connected", "the worker reached the network"
    time.sleep(6)
    assert not Path(mark + ".daemon").exists(), "a daemon started by the worker outlived it"


def test_doctor_lists_the_protections():
    rows = sandbox.protections()
    assert any("PID namespace" in name and active for name, active, _ in rows)
