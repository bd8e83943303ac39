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


AS_USER = '''
import os
MARK = {mark!r}
open(MARK + ".who", "w").write(f"{{os.getuid()}} {{os.getgid()}} {{os.getpid()}}")

def attention(q, k, v, is_causal=False, scale=None):
    raise NotImplementedError("Step 01: nothing here")
'''


def test_worker_user_inside_the_namespace():
    """Gradescope's run: `--worker-user student` and a namespace. The user is taken on inside the
    namespace, after it is set up as root; dropped before `unshare`, every worker crashed."""
    import pwd
    import shutil
    import tempfile
    user = pwd.getpwnam("nobody")
    top = Path(tempfile.mkdtemp(prefix="attn-worker-user-"))
    try:
        os.chmod(top, 0o755)
        marks, sub = top / "marks", top / "sub"
        marks.mkdir(mode=0o777)
        os.chmod(marks, 0o777)
        sub.mkdir(mode=0o755)
        (sub / "step01_naive.py").write_text(AS_USER.format(mark=str(marks / "m")))
        os.chmod(sub / "step01_naive.py", 0o644)
        g = Grader(cfg.load(FIX / "config.toml"), jobs=1, threads=1, worker_user="nobody").grade(sub, [1])
        s = g.steps[0]
        assert s.status == "not implemented", f"the worker did not run as {user.pw_name}: {s.status}: {s.message}"
        uid, gid, pid = (marks / "m.who").read_text().split()
        assert (int(uid), int(gid)) == (user.pw_uid, user.pw_gid), f"the worker ran as uid {uid}, gid {gid}"
        assert int(pid) < 10, f"the worker (pid {pid}) is not inside its own PID namespace"
    finally:
        shutil.rmtree(top, ignore_errors=True)
