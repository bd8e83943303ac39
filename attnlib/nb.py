"""Helpers for the notebooks: one switch for the implementation, one for the size."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent


def setup(impl: str | None = None):
    """Point the loader at ``impl`` ("steps", "solutions" or a folder) and report the machine.

    Returns ``(load_step, device, small)``: ``small`` is True on a CPU, where the
    notebooks shrink their sizes so they run in seconds.
    """
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    if not torch.cuda.is_available() and "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")   # Triton kernels run in its interpreter
    impl = impl or os.environ.get("ATTN_IMPL", "steps")
    os.environ["ATTN_IMPL"] = impl
    from .loader import impl_root, load_step
    device = "cuda" if torch.cuda.is_available() else "cpu"
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (small sizes)"
    print(f"implementation: {impl_root()}\ndevice: {name}; torch {torch.__version__}")
    return load_step, device, device == "cpu"


def median_ms(fn, device, reps=5):
    """Median wall-clock milliseconds of ``fn()`` after two warm-up calls, synchronising on a GPU.

    Good enough for the notebooks' curves; ``bench/`` times with CUDA events (do_bench).
    """
    import time
    for _ in range(2):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return sorted(times)[len(times) // 2]
