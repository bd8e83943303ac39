"""The shapes every step is tested on, shared by the tests and the grader.

Awkward on purpose: N = 1, 17, 100, 257 are not multiples of any tile; Nq != Nk
in both directions; head dims from 16 to 128, one not a power of two.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Case:
    batch: tuple            # leading dims, e.g. (B, H)
    nq: int
    nk: int
    d: int

    @property
    def id(self):
        b = "x".join(map(str, self.batch)) or "nobatch"
        return f"{b}-q{self.nq}-k{self.nk}-d{self.d}"


CASES = [
    Case((2, 3), 1, 1, 16),
    Case((1, 2), 17, 17, 32),
    Case((2, 1), 100, 100, 64),
    Case((1, 1), 257, 257, 64),
    Case((1, 2), 17, 40, 32),        # Nq < Nk
    Case((2, 1), 100, 33, 128),      # Nq > Nk
    Case((3,), 65, 65, 80),          # rank 3, D not a power of two
]

# A smaller set for steps that are slow to run on a CPU (compiled, interpreted).
QUICK_CASES = [CASES[1], CASES[2], CASES[4], CASES[5]]

# The Triton steps (05, 06) on a CPU run every program in Triton's interpreter: the same awkward
# shapes as CASES (N = 1, 17, 100, Nq != Nk both ways, rank 3, D = 80) at sizes it runs in seconds.
INTERPRETED_CASES = [
    Case((2, 3), 1, 1, 16),
    Case((1, 2), 17, 17, 32),
    Case((2, 1), 100, 100, 64),
    Case((1, 2), 17, 40, 32),        # Nq < Nk
    Case((1, 2), 100, 33, 32),       # Nq > Nk
    Case((3,), 65, 65, 80),          # rank 3, D not a power of two
]
INTERPRETER_BF16_SKIP = "bf16 needs a GPU: the Triton interpreter's bf16 tl.dot is wrong"


def devices():
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def dtypes_for(device):
    """fp32 and fp16 everywhere (CPU PyTorch and Triton's interpreter both compute in fp16, so a
    dtype bug — a product left in fp32, an output returned in fp32 — shows on a laptop); bf16 on a
    GPU only (INTERPRETER_BF16_SKIP)."""
    if device == "cuda":
        return [torch.float32, torch.float16, torch.bfloat16]
    return [torch.float32, torch.float16]


def device_dtype_params():
    return [(dev, dt) for dev in devices() for dt in dtypes_for(dev)]
