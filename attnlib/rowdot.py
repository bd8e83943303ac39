"""The backward's first pass for steps 08 and 09: D = rowsum(dO * O) in fp32, one Triton kernel.

Step 06 teaches this pass (its ``_bwd_preprocess`` is a student exercise); steps 08 and 09 need
the same numbers without depending on a student's step 06, so they launch this one. It replaced
``(do.float() * o.float()).sum(-1)`` there: three PyTorch kernels (two fp32 copies of dO and O,
a multiply, a reduction) that took 0.42 ms of step 09's 1.52 ms forward + backward at N = 32k,
H = 16, D = 64, window 256 on an H200, more than its whole dQ kernel
(``bench/experiments/sparse_vs_flex_ncu.py``, results/h200/sparse/README.md). Here each row of
O and dO is read once, in bf16/fp16, and only the fp32 row sums are written.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rowdot_kernel(O, DO, OUT,                           # O, dO (A, C, N, D) by strides; OUT (A*C, N) fp32, contiguous
                  stride_oa, stride_oc, stride_on, stride_od,
                  stride_da, stride_dc, stride_dn, stride_dd,
                  C, N, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    ac = tl.program_id(1)
    a = (ac // C).to(tl.int64)
    c = (ac % C).to(tl.int64)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_D)
    keep = (rows[:, None] < N) & (cols[None, :] < HEAD_DIM)
    o_ptr = O + a * stride_oa + c * stride_oc + rows[:, None].to(tl.int64) * stride_on + cols[None, :] * stride_od
    d_ptr = DO + a * stride_da + c * stride_dc + rows[:, None].to(tl.int64) * stride_dn + cols[None, :] * stride_dd
    prod = tl.load(o_ptr, mask=keep, other=0.0).to(tl.float32) * tl.load(d_ptr, mask=keep, other=0.0).to(tl.float32)
    tl.store(OUT + ac.to(tl.int64) * N + rows, tl.sum(prod, axis=1), mask=rows < N)


def rowdot_block(d: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_D): 64 rows a program, D padded to a power of two (at least 16)."""
    return 64, max(16, triton.next_power_of_2(d))
