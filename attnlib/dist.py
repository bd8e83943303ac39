"""A small group of processes joined by torch.distributed (gloo), kept alive between jobs.

Step 10's tests, its notebook and the grader run ring attention on 2-4 CPU processes. Starting them
costs seconds (each imports torch), so a ``RankGroup`` starts them once and runs many jobs::

    with RankGroup(world=2) as g:
        results = g.run(some_module.job, spec)   # job(rank, world, spec) on every rank; a list by rank

A job is a module-level function (the workers import it by name). Its result
travels back through ``torch.save``, so tensors of any dtype are fine. When a rank raises, or a rank
does not answer within ``timeout_s`` (a receive with no matching send: the classic ring bug), ``run``
raises ``RankError`` naming the rank and its traceback, and the group restarts itself before the next
job: a rank that failed mid-ring may have left messages in flight that would poison the next one.
"""

from __future__ import annotations

import io
import os
import queue
import tempfile
import time
import traceback
from datetime import timedelta

import torch
import torch.multiprocessing as mp


# torch._dynamo too, where it is safe: the first autograd.Function call in a process imports it
# (torch._compile's lazy disable), 1.5-2 s of CPU; preloaded, every rank of every (re)start is forked
# with it. A group restarts after each failed job, so a stub's ring (every input fails) paid it on both
# ranks for every input: step 10's stub took 16-21 s to grade on a CPU, mostly this. But it imports
# triton, and triton.language's own @jit helpers (tl.zeros, ...) are compiled or interpreted as
# TRITON_INTERPRET says when triton is imported: preloaded where the ranks turn the interpreter on
# themselves (a GPU machine, gloo ranks holding CPU tensors), every interpreted kernel fails with
# "Cannot call @triton.jit'd outside of the scope of a kernel" (the H200's gpu-check at c3669d0,
# tests/test_step10_ring.py::test_ring_through_the_triton_kernels). So only where TRITON_INTERPRET=1
# is already in the environment the forkserver inherits (a CPU machine under conftest.py or the grader).
DYNAMO = "torch._dynamo"
PRELOAD = ["torch", "torch.distributed", DYNAMO, "attnlib.ringcheck"]
# What the grader's worker preloads: not attnlib. Python 3.11's forkserver imports its preloads with
# the interpreter's default sys.path, not the parent's (3.12 passes it), so a worker started as
# `python -I` with its private copy of attnlib first on sys.path would give its ranks whichever
# attnlib the environment finds (an editable install: the grader's own, writable). The ranks then
# import attnlib after the fork, once the parent's sys.path is theirs.
PRELOAD_TORCH_ONLY = ["torch", "torch.distributed", DYNAMO]


def forkserver_preload(modules, environ=os.environ):
    """``modules`` less torch._dynamo (which imports triton) unless TRITON_INTERPRET=1 is already set for the
    forkserver to inherit: triton must not be imported before a rank decides on the interpreter."""
    if environ.get("TRITON_INTERPRET") == "1":
        return list(modules)
    return [m for m in modules if m != DYNAMO]


class RankError(AssertionError):
    """A job failed or hung on some rank; ``str(err)`` says which and how."""


class RankNotImplemented(RankError, NotImplementedError):
    """Every failing rank stopped at a stub's NotImplementedError."""


def _worker(rank, world, store_file, impl, timeout_s, threads, jobs, results, interpret):
    os.environ["ATTN_IMPL"] = impl
    if interpret or not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"                 # as conftest.py: before a step defines its kernels
    torch.set_num_threads(threads)
    import torch.distributed as dist
    try:
        dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
    except Exception:
        results.put(("error", rank, traceback.format_exc(), "init"))
        return
    results.put(("ready", rank, None, None))
    while True:
        job = jobs.get()
        if job is None:
            break
        fn, args = job
        try:
            out = fn(rank, world, *args)
            buf = io.BytesIO()
            torch.save(out, buf)
            results.put(("ok", rank, buf.getvalue(), None))
        except BaseException as e:   # noqa: BLE001 -- reported to the parent, which decides
            results.put(("error", rank, traceback.format_exc(), type(e).__name__))
    # No destroy_process_group(), no interpreter shutdown: both can wait on the other ranks' sockets.
    results.close()
    results.join_thread()                                    # our messages are out; then leave at once
    os._exit(0)


class RankGroup:
    """``world`` spawned processes in one gloo group; ``run(fn, *args)`` runs ``fn`` on all of them.

    ``impl``: the folder whose steps the jobs load (default ``$ATTN_IMPL``). ``timeout_s``: how long
    one job may take on any rank before the group is declared hung (also gloo's own timeout, so a
    receive that never matches raises inside the rank too). ``threads``: torch threads per rank.
    ``interpret``: run the steps' Triton kernels in Triton's interpreter even where a GPU is present
    (the ranks of a gloo group hold CPU tensors, which compiled Triton cannot take; without a GPU
    the interpreter is used anyway). ``preload``: the modules the forkserver imports once for every
    rank (default ``PRELOAD``; the grader's worker passes ``PRELOAD_TORCH_ONLY``, which says why).
    """

    def __init__(self, world=2, impl=None, timeout_s=60.0, threads=1, interpret=False, preload=None):
        from .loader import impl_root
        self.world = world
        self.impl = str(impl_root(impl))
        self.timeout_s = float(timeout_s)
        self.threads = threads
        self.interpret = bool(interpret)
        self.preload = list(PRELOAD if preload is None else preload)
        self._procs = []
        self.starts = 0                              # how many times the group was (re)started

    # -- lifecycle ----------------------------------------------------------------------
    def start(self):
        # forkserver: one clean server process imports torch once and forks the ranks from it, so a
        # (re)start costs a fork, not W imports of torch (spawn: 19 s for 4 ranks on 2 busy cores).
        # Not fork: the parent may already run OpenMP threads, which a fork does not survive.
        ctx = mp.get_context("forkserver")
        if not torch.cuda.is_available():
            # No GPU: every rank interprets Triton anyway (_worker). Saying so in the environment the
            # forkserver inherits lets it preload torch._dynamo (forkserver_preload): the grader's
            # worker, started with a clean environment, then grades step 10's stub in 9 s, not 18.
            os.environ.setdefault("TRITON_INTERPRET", "1")
        ctx.set_forkserver_preload(forkserver_preload(self.preload))
        self._tmp = tempfile.TemporaryDirectory(prefix="attn_dist_")
        store = os.path.join(self._tmp.name, "store")
        self._results = ctx.Queue()
        self._jobs = [ctx.Queue() for _ in range(self.world)]
        self._procs = [ctx.Process(target=_worker, daemon=True,
                                   args=(r, self.world, store, self.impl, self.timeout_s, self.threads,
                                         self._jobs[r], self._results, self.interpret))
                       for r in range(self.world)]
        for p in self._procs:
            p.start()
        self.starts += 1
        ready = self._collect("ready", timeout=max(self.timeout_s, 120.0))
        if len(ready) != self.world or any(m[0] != "ready" for m in ready.values()):
            # A rank whose init_process_group raised sends its traceback instead of "ready" (and exits).
            self.close()
            why = [f"rank {r}: " + (m[2].strip().splitlines()[-1] if m[2] else m[0])
                   for r, m in sorted(ready.items()) if m[0] != "ready"]
            silent = [r for r in range(self.world) if r not in ready]
            if silent:
                why.append(f"ranks {silent} did not answer")
            raise RankError("the process group did not start: " + "; ".join(why))

    def close(self):
        for j in getattr(self, "_jobs", []):
            try:
                j.put(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 5
        for p in self._procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.terminate()                        # only our own children, by handle
                p.join(timeout=5)
        self._procs = []
        if getattr(self, "_tmp", None) is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.close()

    # -- jobs -----------------------------------------------------------------------------
    def _collect(self, kind, timeout):
        """Wait for one message per rank; returns {rank: message}. Stops early on a dead rank."""
        got, deadline = {}, time.monotonic() + timeout
        while len(got) < self.world and time.monotonic() < deadline:
            try:
                msg = self._results.get(timeout=0.2)
            except queue.Empty:
                dead = [r for r, p in enumerate(self._procs) if not p.is_alive() and r not in got]
                if dead:
                    for r in dead:
                        got[r] = ("dead", r, f"rank {r} exited with code {self._procs[r].exitcode}", None)
                continue
            got[msg[1]] = msg
        return got

    def run(self, fn, *args):
        """``[fn(rank, world, *args) for every rank]``, run at once on every rank."""
        if not self._procs:
            self.start()
        for j in self._jobs:
            j.put((fn, args))
        got = self._collect("ok", timeout=self.timeout_s + 10)
        if len(got) == self.world and all(m[0] == "ok" for m in got.values()):
            return [torch.load(io.BytesIO(got[r][2]), weights_only=False) for r in range(self.world)]
        self.close()                                 # never reuse a group after a failure
        failed = [m for m in got.values() if m[0] != "ok"]
        stub = failed and all(m[3] == "NotImplementedError" for m in failed)
        raise (RankNotImplemented if stub else RankError)(self._report(fn, got))

    def _report(self, fn, got):
        name = getattr(fn, "__name__", str(fn))
        silent = [r for r in range(self.world) if r not in got]
        failed = {r: m for r, m in got.items() if m[0] != "ok"}
        lines = [f"{name} failed on a group of {self.world} ranks"]
        if silent:
            lines.append(f"  ranks {silent} did not answer within {self.timeout_s:.0f} s: they are waiting in "
                         "a receive that no rank sends (or a send no rank receives). Check that every rank "
                         "makes the same number of send_recv calls, in the same order, and waits for each")
        for r, (kind, _, text, exc) in sorted(failed.items()):
            last = text.strip().splitlines()[-1] if text else kind
            lines.append(f"  rank {r}: {last}")
            if "Timed out" in last:
                lines.append(f"    (rank {r} waited {self.timeout_s:.0f} s for a message no rank sent: check that "
                             "every rank posts the same hops in the same order, and that the sender's peer is "
                             "this rank)")
        first = next((m for _, m in sorted(failed.items()) if m[2]), None)
        if first is not None:
            lines.append(f"  traceback of rank {first[1]}:\n" + "\n".join("    " + s for s in first[2].splitlines()))
        if any(m[3] == "NotImplementedError" for m in failed.values()):
            lines.insert(0, next(m[2].strip().splitlines()[-1]
                                                     for m in failed.values() if m[3] == "NotImplementedError"))
        return "\n".join(lines)

