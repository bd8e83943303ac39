"""Step 10's ring inside the grader's sandbox: its gloo ranks are child processes of the worker.

With namespaces (root and util-linux `unshare`), the worker's network namespace has its loopback
up and nothing else (grading/sandbox.py): the ranks connect to each other, and are as shut in as
the worker -- same PID namespace (they cannot see the grader), no network, the grader's library
read-only. Without the loopback, the ring group says it needs a process group, never passes.
Skipped, saying why, where no namespace can be made.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from grading import config as cfg
from grading import sandbox
from grading.grade import Grader

REPO = Path(__file__).resolve().parent.parent
FIX = Path(__file__).resolve().parent / "grading_fixtures"

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not sandbox.namespaces_available(),
                                 reason="no PID/network namespace here (needs root and util-linux unshare)")]

# Appended to the solution's step10_ring.py: on every rank of a real ring (torch.distributed
# initialized), write down what the rank can see and reach, then compute as the solution does.
SPY = '''

import os as _os, socket as _socket
_MARK = {mark!r}
_solution_ring_attention = ring_attention


def ring_attention(q_shard, k_shard, v_shard, is_causal=False, scale=None, group=None, kernel="auto"):
    world, rank = ring_world(group)
    if world > 1 and not _os.path.exists(f"{{_MARK}}.{{rank}}.pid"):
        procs = sorted(int(p) for p in _os.listdir("/proc") if p.isdigit())
        try:
            _socket.create_connection(("1.1.1.1", 53), timeout=2)
            net = "connected"
        except OSError as exc:
            net = type(exc).__name__
        import attnlib
        try:
            open(attnlib.__file__, "a").close()
            lib = "writable " + attnlib.__file__
        except OSError as exc:
            lib = type(exc).__name__
        with open(f"{{_MARK}}.{{rank}}.pid", "w") as f:
            f.write(f"{{_os.getpid()}}\\n{{' '.join(map(str, procs))}}\\n{{net}}\\n{{lib}}")
    return _solution_ring_attention(q_shard, k_shard, v_shard, is_causal, scale, group, kernel)
'''


def _ring_only_config():
    conf = cfg.load(FIX / "config.toml")
    conf.steps[10].groups = [g for g in conf.steps[10].groups if g.kind == "ring"]
    return conf


def _submission(tmp_path, spy_mark=None) -> Path:
    sub = tmp_path / "sub"
    sub.mkdir()
    for p in (REPO / "solutions").glob("*.py"):
        shutil.copyfile(p, sub / p.name)
    if spy_mark:
        with open(sub / "step10_ring.py", "a") as f:
            f.write(SPY.format(mark=spy_mark))
    return sub


def test_ring_ranks_connect_and_stay_shut_in(tmp_path):
    mark = str(tmp_path / "mark")
    sub = _submission(tmp_path, mark)
    g = Grader(_ring_only_config(), jobs=1, threads=1).grade(sub, [10])
    s = g.steps[0]
    ring = next(gr for gr in s.groups if gr.group.name == "ring")
    assert ring.n_passed == len(ring.checks), (
        "the ring on 2 gloo ranks inside the worker did not pass: " + ring.checks[0].message[:2000])
    for rank in (0, 1):
        path = Path(f"{mark}.{rank}.pid")
        assert path.exists(), f"rank {rank} never ran ring_attention with torch.distributed initialized"
        pid, procs, net, lib = path.read_text().splitlines()
        procs = procs.split()
        # worker (PID 1), its forkserver, 2 ranks, and multiprocessing's resource tracker: a handful,
        # numbered from 1 in the worker's own namespace
        assert int(pid) < 50 and len(procs) <= 8, f"rank {rank}: pid {pid}, sees {procs}: not the worker's namespace"
        assert str(os.getpid()) not in procs, f"rank {rank} could see the grader's process in /proc"
        assert net != "connected", f"rank {rank} reached the network"
        assert not lib.startswith("writable"), lib + f": rank {rank} could write the grader's library (attnlib)"


def test_ring_without_a_loopback_needs_a_process_group(tmp_path, monkeypatch):
    """Take the loopback away: the ring group must say why it scores 0, not pass or hang."""
    monkeypatch.setattr(sandbox, "READ_ONLY", sandbox.READ_ONLY.replace(sandbox.LOOPBACK_UP, ""))
    sub = _submission(tmp_path)
    g = Grader(_ring_only_config(), jobs=1, threads=1).grade(sub, [10])
    s = g.steps[0]
    ring = next(gr for gr in s.groups if gr.group.name == "ring")
    runs = [c for c in ring.checks if not c.name.startswith("shard/unshard")]
    assert runs and all(c.status == "error" and "needs a process group" in c.message for c in runs), (
        [(c.name, c.status, c.message[:300]) for c in runs])
    assert s.status != "passed" and s.points < s.max_points


HOG = '''

_solution_ring_attention = ring_attention
_HOG = []


def ring_attention(q_shard, k_shard, v_shard, is_causal=False, scale=None, group=None, kernel="auto"):
    if ring_world(group)[0] > 1 and not _HOG:
        _HOG.append(torch.ones(2 ** 28 + 2 ** 27))      # 1.5 GiB, filled, on each rank
    return _solution_ring_attention(q_shard, k_shard, v_shard, is_causal, scale, group, kernel)
'''


def test_ring_ranks_count_against_the_workers_memory(tmp_path):
    """Each rank stays under its own address-space cap (3 GiB, inherited from the worker), but the two
    ranks together with the worker and the forkserver go past the step's 3 GiB: the watchdog, which
    sums the worker's whole process tree, kills the worker and the ranks with it."""
    sub = _submission(tmp_path)
    with open(sub / "step10_ring.py", "a") as f:
        f.write(HOG)
    conf = _ring_only_config()
    conf.steps[10].memory_mb = 3072
    s = Grader(conf, jobs=1, threads=1).grade(sub, [10]).steps[0]
    assert s.status == "crashed" and "went over its 3072 MiB memory limit" in s.message, (s.status, s.message)
    assert s.points == 0.0
