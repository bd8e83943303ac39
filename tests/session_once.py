"""One expensive computation per test session, however many pytest-xdist workers ask for it.

A module-scoped fixture runs once per *worker*: when `--dist worksteal` splits a module's tests over
`make test`'s two workers (tests/test_experiment_cuda_v6.py's were split in each of three runs on
2026-12-02), both compile the same kernels. ``once_per_session`` runs ``compute`` in the first worker
that asks and hands the others its result, through a file in the session's temporary root (shared by
the workers, new for every run: nothing carries over from one run to the next). Without xdist it just
calls ``compute``. If ``compute`` raises, nothing is stored: the next worker computes again and meets
the same error.
"""

from __future__ import annotations

import os
import pickle

from filelock import FileLock


def once_per_session(tmp_path_factory, name: str, compute):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return compute()
    path = tmp_path_factory.getbasetemp().parent / f"once-{name}.pickle"
    with FileLock(f"{path}.lock"):
        if path.exists():
            return pickle.loads(path.read_bytes())
        value = compute()
        path.write_bytes(pickle.dumps(value))
        return value
