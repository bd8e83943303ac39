"""Experiment: why is step 06's dK/dV kernel slow? Alternative dK/dV kernels, checked, compiled and timed against it.

Answer (two H200 runs, 2026-11-30 02:14 and 02:24 UTC: results/h200/triton/dkdv_variants_0214.json,
dkdv_0214.log, dkdv_variants_0224.json, dkdv_0224.log; the table is in results/h200/triton/README.md,
"The dK/dV kernel (later the same day): 5.60 -> 5.29 ms", and in notebook 06, section 8). Occupancy
and the wait on each product: at 64x128 on 8 warps the kernel used 186 registers, one program per
SM. Of the changes below, two paid (kernel alone, "control" 2.616 ms): 32x128 on 8 warps capped at
128 registers, two programs per SM ("2cta", 2.384), and V dO^T issued right after K Q^T
("early-dp", 2.439); K and V from registers, the tutorial's formulation, the host pre-scale and the
heavy-first grid did not. Step 06 took both (commit 567f908): its dK/dV kernel 2.50 ms, forward +
backward 5.29 ms, under the 5.36 ms target. Open: step 06's own kernel runs 7-12% slower than
"control" at the same tiles (the README's last paragraph; ptxas: 186 registers for step 06, 225 for
the copy).

How the kernel here differs from step 06's ``_bwd_dkdv_kernel`` (solutions/step06_triton_bwd.py):
``_dkdv_var_kernel`` with every flag off ("control") is step 06's dK/dV loop as it was before commit
567f908 -- the same stage split (masked diagonal, unmasked body, masked tail) and the same math,
but dP = V dO^T computed after dV += P^T dO, where step 06 now issues it right after K Q^T (that is
the EARLY_DP flag) -- restricted to contiguous (B, H, N, D) inputs with one row stride, Nq == Nk, D
in 16..128 with no padding, and no atomic dQ. Each flag adds one change to that copy. Step 06's own
rows run step 06 itself (solutions/, launched by its ``backward()`` and recorded), not a copy.

Question. At the CS336 leaderboard shape (B=1, H=16, N=16384, D=64, bf16, causal) on an H200, step 06's
``_bwd_dkdv_kernel`` ran at about 360 TFLOP/s on its four matrix products and the dQ kernel at about
570 TFLOP/s on its three (results/h200/triton/lb.log; its kernel rows used that run's table tiles,
32x128 w4 s4 for dK/dV: 3.04 ms; the table has since moved to 64x128 w8 s4, about 2.8 ms by the
backward totals of the same run). Each kernel below is a candidate explanation of the gap turned into
a fix; one run checks every one against the float64 reference and times it against step 06's own
kernel, launched exactly as step 06's ``backward()`` launches it (captured, as
bench/experiments/triton_lb_variants.py does), at the current table's tiles and at the old ones.

    python bench/experiments/triton_dkdv_variants.py --out DIR            # an H200: about 40-70 s; no timing starts after 110 s
    python bench/experiments/triton_dkdv_variants.py --small              # a CPU: Triton's interpreter, fp32 / fp16 (~1 min)
    python bench/experiments/triton_dkdv_variants.py --aot-check          # no GPU: compile every kernel for sm_90 and report
    ... --variants control,2cta,k-regs                        # a subset, extras included (step 06's rows always run)

What the compile report (``--aot-check``: sm_90 code from Triton's bundled ptxas, no GPU) shows of step
06's kernel at the table's tiles (64x128, 8 warps). Its loop, per query tile: ``sT = K Q^T`` (wgmma, K
read from shared memory), wait; exp2; ``dV += pT dO`` (pT from registers) and ``dpT = V dO^T`` (V from
shared memory), wait for both; ``dsT = pT (dpT - delta)``; ``dK += dsT Q``, left in flight into the
next iteration. Triton waits for a product whose result is used in the same iteration right after
issuing it (``pendings = 0``), so inside a program the exp2 / dS work and the tensor cores take turns.
At 186 registers x 8 warps one program fits on an SM; the dQ kernel has the same kind of loop (three
products, two waits) but 128 registers, two programs and 16 warps per SM: the second program can
fill the first one's gaps. The multiply of S by scale*log2(e) is already fused into the FFMA in front
of each exp2 (FFMA count = EX2 count). The candidates (``--aot-check`` prints registers, spills,
shared memory, programs per SM and this loop for each):

  control          this file's copy of step 06's kernel (same math, loop split, tiles): its time must
                   match step 06's (ptxas gives it 225 registers instead of 186: still one program per
                   SM, same SASS instruction mix).
  tutorial-32x128  Triton's tutorial 06-fused-attention ``_attn_bwd_dkdv``: K pre-scaled by
  tutorial-64x128  scale*log2(e) once on the host (no multiply of S), LSE passed in log2 units, Q
                   loaded transposed (``qT`` pointers, ``tl.dot(k, qT)``, ``tl.trans(qT)`` for dK), the
                   diagonal in steps of BLOCK_M // 2 (its BLK_SLICE_FACTOR = 2), the rest unmasked; at
                   the tutorial's tiles (32x128, 4 warps, 5 stages: 255 registers, 48 B of spills, two
                   programs per SM) and at step 06's. The host multiply is timed as its own row and
                   added to their implied backward. Rounding K*scale*log2(e) to bf16 / fp16 costs
                   accuracy: up to 3x step 06's error in fp16 (--small), printed by the check.
  prescale         the pre-scaled K / log2 LSE alone (what the FFMA fusion leaves of the multiply:
                   48 of 176 FMULs, the LSE * log2(e)).
  kv-regs          K scaled by scale*log2(e) once per program in the kernel and V passed through a
                   select: Triton gives wgmma its A operand from shared memory only when it comes
                   straight from a load (AccelerateMatmul's ``comesFromLoadOrBlockArg``), so both K Q^T
                   and V dO^T read K and V from registers (245 registers, no spills): by a count of
                   operand bytes, 32 of the ~112 KB of shared-memory traffic per iteration.
  early-dp         ``dpT = V dO^T`` written right after ``sT = K Q^T``. Triton still waits for each at
                   once (the compile report), so what changes is the schedule: both non-accumulating
                   products back to back, then all the elementwise work, then dV and dK both issued
                   asynchronously and in flight across the loop's back edge.
  heavy-first      grid (B*H, key tiles) instead of (key tiles, B*H): the heavy first key tiles of every
                   head start first. Causal key tile j does N - j*BLOCK_N query rows; step 06 launches
                   head 0's tiles, then head 1's, ..., so the last head's heaviest tiles start last. A
                   greedy list schedule on 132 SMs loses ~1% to that with one program slot per SM, ~12%
                   with two (so 2cta and combined carry it too).
  2cta             ``maxnreg=128`` at 32x128 on 8 warps (170 registers without it, 12 B of spills with
                   it): two 8-warp programs per SM, as the dQ kernel has: tests the occupancy
                   explanation. (Extra ``32x128w8``: the same without maxnreg; ``2cta-64x128``: maxnreg
                   at step 06's tiles, ~340 B of spills.)
  combined         kv-regs + early-dp + heavy-first.

Extras (``--variants``): k-regs, v-regs (the two halves of kv-regs), 32x128w8, 2cta-64x128.
Not here: ``tl.range(..., num_stages=...)`` per loop (the diagonal loops run BLOCK_N / BLOCK_M = 2
iterations, so their pipeline prologue costs one fill per program, ~1%; shared memory does not limit
occupancy, registers do), ``out_dtype`` / accumulator forms (every product already accumulates in
fp32, the two accumulating ones in place, ``tl.dot(a, b, acc)``), tile sweeps of step 06's kernel
(done: 38 candidates within 3%, results/h200/), TMA and warp specialization (bench/experiments/triton_fwd_tma.py:
no gain in the forward; warp specialization NaN with 3 stages, slower with 2).

The run:

1. Check (a pool of processes, one kernel each: it also compiles every kernel into Triton's on-disk
   cache for the timing): B=2, H=16, N=1008, D=64 bf16, causal and not (1008 = 7*128 + 112: partial
   last tiles for every tile size, yet every length and stride a multiple of 16, the same Triton
   specialization as N=16384), from the float64 O and LSE and D = rowsum(dO * O) in fp32; dK and dV
   against ``attnlib.reference_backward``, max|x - ref| / max|ref|, printed next to step 06's own
   errors (its kernels launched by ``backward()`` with the leaderboard tiles pinned). A variant whose
   error exceeds 2x step 06's + a small absolute margin (1e-3) is WRONG and not timed.
2. Time (``triton.testing.do_bench(warmup=25, rep=100, return_mode="median")``, the same inputs and
   step 06's own D for all): step 06's dK/dV (table tiles), preprocess and dQ kernels, SDPA-FLASH's
   backward alone (``torch.autograd.grad`` on a held output), step 05's forward, the host pre-scale,
   every variant's dK/dV kernel alone, step 06's dK/dV at the old tiles, step 06's again (drift).
   TFLOP/s of a dK/dV kernel = its four products, 4 * 2 * B*H*N^2*D / 2 (causal) / time (dQ: three).
   "x s06" = step 06's dK/dV time / this one (> 1: faster). Implied backward = this dK/dV kernel +
   its host pre-scale + step 06's preprocess + dQ kernel, all measured in this run; "x flash" =
   SDPA-FLASH's backward / that; implied fwd+bwd adds step 05's forward (the leaderboard's 5.36 ms
   target). No new timing starts after ``--budget-s`` (default 110 s from the start); a watchdog writes
   the JSON and exits at ``--hard-limit-s`` (165 s).

Writes DIR/dkdv_variants.json after every row and prints a table. Only contiguous (B, H, N, D)
inputs with Nq == Nk and D in 16, 32, 64, 128 (the GPU run uses D=64); anything else is refused with
a ValueError. Not imported by the tests.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

T_START = time.time()
REPO = Path(__file__).resolve().parents[2]    # the repository root: bench/experiments/../..
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

if "--small" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")     # before anything imports triton

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from bench.core import machine_info  # noqa: E402
from bench.core import time_ms as bench_ms  # noqa: E402  (do_bench median on a GPU)
from bench.experiments.triton_lb_variants import (errors, first_line, make_inputs,  # noqa: E402
                                                  record_launches, steps)

LOG2E = 1.4426950408889634
LOG2E_C: tl.constexpr = tl.constexpr(LOG2E)
TARGET_MS = 5.36                                       # best CS336 2025 leaderboard fwd+bwd (an H100)
GPU_SHAPE = dict(B=1, H=16, N=16384, D=64)
GPU_CHECK = dict(B=2, H=16, N=1008, D=64)
SMALL_SHAPE = dict(B=1, H=2, N=160, D=32)              # --small timing (the code path only)
SMALL_CHECK = dict(B=1, H=2, N=100, D=32)              # --small check: partial tiles everywhere
SMALL_CHECK_GPU_TILES = dict(B=1, H=2, N=1008, D=64)   # --small check of the GPU's own tiles (fp16)
SMALL_OLD_TILES = dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1)
# A variant is WRONG when its error > 2 x step 06's + this margin (both relative to max|ref|). 1e-3 is a quarter
# of attnlib's fp16 tolerance and 1/30 of its bf16 one; an indexing or masking bug is off by 1e-1 or more.
# (Pre-scaling K rounds K*scale*log2(e) to the input dtype: in fp16, where step 06's own error is small, the
# tutorial's formulation is 2-3x step 06's error, about 1e-3; printed in the check's "x s06" column.)
MARGIN = {torch.bfloat16: 1e-3, torch.float16: 1e-3, torch.float32: 1e-5}
STEP06_OLD_TILES = dict(BLOCK_M=32, BLOCK_N=128, num_warps=4, num_stages=4)   # the table of results/h200 lb.log
# Step 06's own dK/dV kernel at other tiles (GPU only): checked like the variants, then timed. ``maxnreg``
# caps registers per thread (a Triton launch option): 128 lets two 8-warp programs share an SM.
STEP06_TRY = {
    "step06 32x128 w8 r128": dict(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=4, maxnreg=128),
    "step06 32x128 w8 s3 r128": dict(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=3, maxnreg=128),
    "step06 32x128 w8": dict(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=4),
    "step06 64x64 w4": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=4),
    "step06 64x128 w8 s3": dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=3),
    # 2026-12-02: the table's tiles (32x64 w4 s4, heads first) without the spills of the 128 cap: three programs an SM
    "step06 32x64 w4 r168 hf": dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=4, maxnreg=168,
                                    EARLY_DP=False, HEADS_FIRST=True),
}


# %% Variants ----------------------------------------------------------------------------------------

FLAG_DEFAULTS = dict(K_PRESCALED=False, K_SCALE_IN_KERNEL=False, V_IN_REGS=False, Q_T=False, DIAG_SPLIT=1,
                     EARLY_DP=False, HEAVY_FIRST=False, K_IN_REGS=False)


SHORT = dict(K_PRESCALED="K*c host", K_SCALE_IN_KERNEL="K*c kern", V_IN_REGS="V regs", Q_T="qT", DIAG_SPLIT="diag/",
             EARLY_DP="early dp", HEAVY_FIRST="heavy 1st", K_IN_REGS="K regs")


@dataclass(frozen=True)
class Variant:
    name: str
    BLOCK_M: int                      # query rows per loop step
    BLOCK_N: int                      # key rows per program
    num_warps: int
    num_stages: int
    flags: dict = field(default_factory=dict)
    maxnreg: int | None = None
    why: str = ""

    def consts(self):
        c = dict(FLAG_DEFAULTS)
        c.update(self.flags)
        return c

    def label(self):
        f = [SHORT[k] if v is True else f"{SHORT[k]}{v}" for k, v in self.flags.items() if v != FLAG_DEFAULTS[k]]
        return (f"{self.BLOCK_M}x{self.BLOCK_N} w{self.num_warps} s{self.num_stages}"
                + (f" maxnreg={self.maxnreg}" if self.maxnreg else "") + (" " + ",".join(f) if f else ""))

    def small(self):
        """The same code path at --small's sizes: BLOCK_N 32, BLOCK_M / 4 (the same BLOCK_N / BLOCK_M ratios
        up to 4, the same diagonal split)."""
        bm = max(8, self.BLOCK_M // 4)
        return Variant(self.name, bm, max(32, bm), self.num_warps, 1, self.flags, None, self.why)


TUTORIAL = dict(K_PRESCALED=True, Q_T=True, DIAG_SPLIT=2)
KV_REGS = dict(K_SCALE_IN_KERNEL=True, V_IN_REGS=True)
VARIANTS = [
    Variant("control", 64, 128, 8, 4, {}, why="this file's copy of step 06 (same tiles): must match it"),
    Variant("tutorial-32x128", 32, 128, 4, 5, TUTORIAL,
            why="tutorial 06 as written: host-prescaled K, log2 LSE, qT loads, diagonal in BLOCK_M/2 steps, its tiles"),
    Variant("tutorial-64x128", 64, 128, 8, 4, TUTORIAL, why="the tutorial's formulation at step 06's tiles"),
    Variant("prescale", 64, 128, 8, 4, dict(K_PRESCALED=True),
            why="host K*c and log2 LSE alone (S*c is already an FFMA: saves the LSE*log2e)"),
    Variant("kv-regs", 64, 128, 8, 4, KV_REGS,
            why="K*c in-kernel and V via a select: wgmma reads K and V from registers, not shared memory"),
    Variant("early-dp", 64, 128, 8, 4, dict(EARLY_DP=True), why="V dO^T issued right after K Q^T"),
    Variant("heavy-first", 64, 128, 8, 4, dict(HEAVY_FIRST=True),
            why="grid (B*H, tiles): heavy key tiles of all heads first"),
    Variant("2cta", 32, 128, 8, 4, dict(HEAVY_FIRST=True), maxnreg=128,
            why="maxnreg=128: two 8-warp programs per SM (as the dQ kernel), 12 B spills"),
    Variant("combined", 64, 128, 8, 4, dict(KV_REGS, EARLY_DP=True, HEAVY_FIRST=True),
            why="kv-regs + early-dp + heavy-first"),
    Variant("2cta-early-dp", 32, 128, 8, 4, dict(EARLY_DP=True, HEAVY_FIRST=True), maxnreg=128,
            why="the two best of the first run (11-30 02:14): 2cta + early-dp"),
    Variant("2cta-early-dp-rowgrid", 32, 128, 8, 4, dict(EARLY_DP=True), maxnreg=128,
            why="2cta-early-dp on step 06's grid order"),
]
# Not run by default (``--variants NAME,...``): the parts of kv-regs and of 2cta.
EXTRA_VARIANTS = [
    Variant("k-regs", 64, 128, 8, 4, dict(K_SCALE_IN_KERNEL=True), why="K*c in-kernel only (K from registers)"),
    Variant("v-regs", 64, 128, 8, 4, dict(V_IN_REGS=True), why="V via a select only (V from registers)"),
    Variant("32x128w8", 32, 128, 8, 4, dict(HEAVY_FIRST=True), why="2cta without maxnreg (one program per SM)"),
    Variant("2cta-64x128", 64, 128, 8, 4, dict(HEAVY_FIRST=True), maxnreg=128,
            why="maxnreg=128 at step 06's tiles (about 340 B of spills)"),
    # 2026-12-02, the table's tiles since 23218fc (32x64, 4 warps, four programs an SM): K Q^T and V dO^T are
    # m64n32k16 products there, and with both operands in shared memory each reads 3 KB for 16 clocks of
    # tensor work (~190 B/clock against the SM's 128): does reading K and V from registers pay at these tiles?
    Variant("t32x64", 32, 64, 4, 4, dict(HEAVY_FIRST=True), maxnreg=128,
            why="the table's dK/dV tiles (32x64 w4 s4 r128, heads first): this copy's control there"),
    Variant("t32x64-kvr-r128", 32, 64, 4, 4, dict(HEAVY_FIRST=True, K_IN_REGS=True, V_IN_REGS=True), maxnreg=128,
            why="t32x64 with K and V read from registers (no rounding change), capped at 128"),
    Variant("t32x64-kvr-r168", 32, 64, 4, 4, dict(HEAVY_FIRST=True, K_IN_REGS=True, V_IN_REGS=True), maxnreg=168,
            why="t32x64 with K and V from registers, three programs an SM"),
    Variant("t32x64-kvr", 32, 64, 4, 4, dict(HEAVY_FIRST=True, K_IN_REGS=True, V_IN_REGS=True),
            why="t32x64 with K and V from registers, no cap"),
    Variant("t64x64-kvr", 64, 64, 4, 3, dict(HEAVY_FIRST=True, K_IN_REGS=True, V_IN_REGS=True),
            why="64x64 w4 s3 (m64n64 products) with K and V from registers, no cap"),
    Variant("t64x64", 64, 64, 4, 3, dict(HEAVY_FIRST=True), why="64x64 w4 s3, heads first, no cap"),
]


# %% Kernels -------------------------------------------------------------------------------------------

@triton.jit
def _rows(base, offs_m, offs_d, stride_tok, N, MASKED: tl.constexpr):
    """base[offs_m, offs_d] as a (len(offs_m), len(offs_d)) tile; rows >= N read 0 when MASKED."""
    ptrs = base + offs_m[:, None] * stride_tok + offs_d[None, :]
    if MASKED:
        return tl.load(ptrs, mask=offs_m[:, None] < N, other=0.0)
    return tl.load(ptrs)


@triton.jit
def _var_inner(dk, dv, k, v, Q, DO, LSE, DELTA, stride_tok, offs_n, offs_d, lo, hi, N, qk_scale,
               BLOCK_M: tl.constexpr, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr,
               SCALE_S: tl.constexpr, LSE_IN_LOG2: tl.constexpr, Q_T: tl.constexpr, EARLY_DP: tl.constexpr,
               DOT_PRECISION: tl.constexpr):
    """Query tiles [lo, hi) in steps of BLOCK_M against this program's key tile; MASKED: rows >= N and
    (causal) key > query are zeroed. With every flag off this is step 06's ``_dkdv_inner`` (no atomics)."""
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        if Q_T:
            # The tutorial: Q^T straight from memory, (BLOCK_D, BLOCK_M).
            qT_ptrs = Q + offs_m[None, :] * stride_tok + offs_d[:, None]
            if MASKED:
                qT = tl.load(qT_ptrs, mask=offs_m[None, :] < N, other=0.0)
            else:
                qT = tl.load(qT_ptrs)
        else:
            q = _rows(Q, offs_m, offs_d, stride_tok, N, MASKED)
            qT = tl.trans(q)
        do = _rows(DO, offs_m, offs_d, stride_tok, N, MASKED)
        if MASKED:
            lse = tl.load(LSE + offs_m, mask=offs_m < N, other=0.0)
            delta = tl.load(DELTA + offs_m, mask=offs_m < N, other=0.0)
        else:
            lse = tl.load(LSE + offs_m)
            delta = tl.load(DELTA + offs_m)
        if LSE_IN_LOG2:
            lse2 = lse
        else:
            lse2 = lse * LOG2E_C
        sT = tl.dot(k, qT, input_precision=DOT_PRECISION)                     # (BLOCK_N, BLOCK_M)
        if EARLY_DP:
            dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        if SCALE_S:
            sT = sT * qk_scale
        pT = tl.math.exp2(sT - lse2[None, :])
        if MASKED:
            visible = offs_m[None, :] < N
            if IS_CAUSAL:
                visible = visible & (offs_n[:, None] <= offs_m[None, :])
            pT = tl.where(visible, pT, 0.0)
        dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        if not EARLY_DP:
            dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        dsT = pT * (dpT - delta[None, :])
        if Q_T:
            dk = tl.dot(dsT.to(qT.dtype), tl.trans(qT), dk, input_precision=DOT_PRECISION)
        else:
            dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=DOT_PRECISION)
    return dk, dv


@triton.jit
def _dkdv_var_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV,          # contiguous (B, H, N, D); LSE, DELTA (B*H, N) fp32
    stride_tok, N, scale, qk_scale,           # row stride (= D), sequence length, softmax scale, scale*log2(e)
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
    K_PRESCALED: tl.constexpr,                # K arrives as K*scale*log2(e), LSE in log2 units (host)
    K_SCALE_IN_KERNEL: tl.constexpr,          # K*scale*log2(e) once per program, here
    V_IN_REGS: tl.constexpr,                  # V through a select once per program: wgmma reads it from registers
    K_IN_REGS: tl.constexpr,                  # the same for K (unscaled: S^T * qk_scale stays an FFMA, no rounding)
    Q_T: tl.constexpr,                        # load Q^T with transposed pointers
    DIAG_SPLIT: tl.constexpr,                 # diagonal tiles in steps of BLOCK_M // DIAG_SPLIT
    EARLY_DP: tl.constexpr,                   # V dO^T right after K Q^T
    HEAVY_FIRST: tl.constexpr,                # grid (B*H, key tiles) instead of (key tiles, B*H)
):
    tl.static_assert(BLOCK_N % BLOCK_M == 0)
    MASK_BLOCK_M: tl.constexpr = BLOCK_M // DIAG_SPLIT
    if HEAVY_FIRST:
        bh = tl.program_id(0)
        pid_n = tl.program_id(1)
    else:
        pid_n = tl.program_id(0)
        bh = tl.program_id(1)
    off = bh.to(tl.int64) * N * stride_tok
    Q += off
    K += off
    V += off
    DO += off
    DK += off
    DV += off
    LSE += bh.to(tl.int64) * N
    DELTA += bh.to(tl.int64) * N
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    k = _rows(K, offs_n, offs_d, stride_tok, N, True)
    v = _rows(V, offs_n, offs_d, stride_tok, N, True)
    # Triton's AccelerateMatmul gives wgmma its A operand from shared memory when the value comes straight
    # from a load (comesFromLoadOrBlockArg), from registers otherwise: a value computed once per program
    # moves K (or V) from shared memory to registers for the whole loop.
    if K_SCALE_IN_KERNEL:
        k = (k.to(tl.float32) * qk_scale).to(K.dtype.element_ty)
    if V_IN_REGS:
        v = tl.where(offs_n[:, None] < N, v, 0.0)          # a no-op on the values (the load already zeroed them)
    if K_IN_REGS:
        k = tl.where(offs_n[:, None] < N, k, 0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    SCALE_S: tl.constexpr = not (K_PRESCALED or K_SCALE_IN_KERNEL)
    # Query ranges: causal, queries before start_n see none of these keys; [start_n, start_n + BLOCK_N)
    # crosses the diagonal (masked, in MASK_BLOCK_M steps); then whole unmasked BLOCK_M tiles while they
    # fit below N; then the masked partial tail. Not causal: no diagonal stage.
    if IS_CAUSAL:
        diag_end = tl.minimum(start_n + BLOCK_N, N)
        dk, dv = _var_inner(dk, dv, k, v, Q, DO, LSE, DELTA, stride_tok, offs_n, offs_d, start_n, diag_end, N,
                            qk_scale, MASK_BLOCK_M, True, IS_CAUSAL, SCALE_S, K_PRESCALED, Q_T, EARLY_DP,
                            DOT_PRECISION)
        body = start_n + BLOCK_N
    else:
        body = 0
    body_end = body + tl.maximum(N - body, 0) // BLOCK_M * BLOCK_M
    dk, dv = _var_inner(dk, dv, k, v, Q, DO, LSE, DELTA, stride_tok, offs_n, offs_d, body, body_end, N,
                        qk_scale, BLOCK_M, False, IS_CAUSAL, SCALE_S, K_PRESCALED, Q_T, EARLY_DP, DOT_PRECISION)
    dk, dv = _var_inner(dk, dv, k, v, Q, DO, LSE, DELTA, stride_tok, offs_n, offs_d, body_end, N, N,
                        qk_scale, BLOCK_M, True, IS_CAUSAL, SCALE_S, K_PRESCALED, Q_T, EARLY_DP, DOT_PRECISION)
    out = offs_n[:, None] * stride_tok + offs_d[None, :]
    in_range = offs_n[:, None] < N
    tl.store(DK + out, (dk * scale).to(DK.dtype.element_ty), mask=in_range)
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=in_range)


# %% Launchers -----------------------------------------------------------------------------------------

@dataclass
class Launch:
    """One kernel launch, kept so it can be run again (timing) or compiled without a GPU (--aot-check)."""
    name: str
    kernel: object
    grid: tuple
    args: tuple
    kwargs: dict

    def __call__(self):
        return self.kernel[self.grid](*self.args, **self.kwargs)


def dot_precision(dtype):
    return "ieee" if dtype == torch.float32 else "tf32"


def refuse_unsupported(q, k, v, do, lse, delta):
    """The variants cover what the leaderboard needs, nothing more: say so instead of computing garbage."""
    if not (q.dim() == 4 and q.shape == k.shape == v.shape == do.shape):
        raise ValueError(f"dK/dV variants need q, k, v, dO of one shape (B, H, N, D) (self-attention, Nq == Nk); "
                         f"got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}, {tuple(do.shape)}")
    if not all(t.is_contiguous() for t in (q, k, v, do)):
        raise ValueError("dK/dV variants need contiguous (B, H, N, D) q, k, v, dO (no strides handled)")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32) or len({t.dtype for t in (q, k, v, do)}) != 1:
        raise ValueError(f"dK/dV variants need one dtype among fp16 / bf16 / fp32, got {q.dtype}, {k.dtype}, "
                         f"{v.dtype}, {do.dtype}")
    d = q.shape[-1]
    if d not in (16, 32, 64, 128):
        raise ValueError(f"dK/dV variants need a head dim of 16, 32, 64 or 128 (no padding), got {d}")
    if len({t.device for t in (q, k, v, do, lse, delta)}) != 1:
        raise ValueError("dK/dV variants need every tensor on one device")
    B, H, N, _ = q.shape
    for name, t in (("LSE", lse), ("delta", delta)):
        if t.dtype != torch.float32 or not t.is_contiguous() or t.numel() != B * H * N:
            raise ValueError(f"{name} must be a contiguous float32 tensor of B*H*N elements")


def variant_launch(var: Variant, q, k, v, do, lse, delta, causal, scale, prep=True):
    """(launch, prep, dk, dv): the variant's kernel launch on these inputs; ``prep`` is None or a closure
    that redoes the host work the variant needs (K * scale*log2(e), LSE * log2(e)), for timing;
    ``prep=False`` passes K and LSE through unchanged (the compile report: same types and shapes)."""
    refuse_unsupported(q, k, v, do, lse, delta)
    B, H, N, D = q.shape
    c = var.consts()
    qk_scale = scale * LOG2E
    host = None
    kk, ll = k, lse
    if c["K_PRESCALED"]:
        host = lambda: ((k * qk_scale).to(k.dtype), lse * LOG2E)      # noqa: E731 -- the tutorial's host pass
        if prep:
            kk, ll = host()
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    n_tiles = triton.cdiv(N, var.BLOCK_N)
    grid = (B * H, n_tiles) if c["HEAVY_FIRST"] else (n_tiles, B * H)
    kwargs = dict(HEAD_DIM=D, BLOCK_M=var.BLOCK_M, BLOCK_N=var.BLOCK_N, IS_CAUSAL=bool(causal),
                  DOT_PRECISION=dot_precision(q.dtype), num_warps=var.num_warps, num_stages=var.num_stages, **c)
    if var.maxnreg and os.environ.get("TRITON_INTERPRET") != "1":
        kwargs["maxnreg"] = var.maxnreg
    args = (q, kk, v, do, ll, delta, dk, dv, D, N, scale, qk_scale)
    return Launch(var.name, _dkdv_var_kernel, grid, args, kwargs), host, dk, dv


def step06_launches(s6, q, k, v, o, lse, do, causal, scale, config, run=True):
    """Step 06's ``backward()`` with its launches recorded (triton_lb_variants.record_launches): [Launch] in
    launch order (preprocess, dK/dV, dQ), each with the grid, arguments and launch options ``backward()`` gave
    it, and backward()'s (dQ, dK, dV). ``run=False`` records without launching (the compile report: no GPU)."""
    log, out = record_launches(s6, lambda: s6.backward(q, k, v, o, lse, do, causal, scale, config=config,
                                                       dq_mode="separate"), run=run)
    return [Launch(*x) for x in log], out


def step06_config(s6, shape, dtype, causal, device, dkdv=None):
    """Step 06's table at ``shape`` (the leaderboard's, pinned for the check shape), dK/dV tiles optionally replaced."""
    B, H, N, D = (shape[x] for x in "BHND")
    cfg = s6.bwd_config(N, N, D, dtype, causal, device, B * H)
    cfg = dict(cfg, dq_mode="separate")
    if dkdv is not None:
        cfg["dkdv"] = dict(dkdv)
    return cfg


# %% Compile report (no GPU needed) -------------------------------------------------------------------

SM90_REGS = 65536                      # registers per SM
SM90_SMEM = 233472                     # shared memory per SM, bytes (228 KB); a block may use 227 KB
SM90_WARPS = 64


from bench.experiments.gpu_run import triton_tool as _triton_tool  # noqa: E402  (the ptxas Triton compiles with)


def loop_schedule(ttgir):
    """Per ``scf.for`` (in order), its matrix products and waits as a short string: ``D(s)`` a wgmma whose
    A operand is read from shared memory, ``D(r)`` from registers, ``W1`` a wait that leaves 1 in flight."""
    lines = ttgir.splitlines()
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        if "scf.for" in line and "=" in line:
            indent = len(line) - len(line.lstrip())
            toks, j = [], i + 1
            while j < len(lines):
                s = lines[j]
                if s.strip().startswith("}") and len(s) - len(s.lstrip()) == indent:
                    break
                if "ttng.warp_group_dot_wait" in s:
                    m = re.search(r"pendings = (\d+)", s)
                    toks.append(f"W{m.group(1) if m else '?'}")
                elif "ttng.warp_group_dot " in s or "tt.dot " in s:
                    m = re.search(r"\}\s*:\s*(\S+)", s)
                    toks.append("D(s)" if m and m.group(1).startswith("!ttg.memdesc") else "D(r)")
                j += 1
            out.append(" ".join(toks))
            i = j
        i += 1
    return out


def aot_compile(launch: Launch, capability=90):
    """Compile ``launch`` for a CUDA target without a GPU (the binder Triton's launcher uses, on CPU tensors of
    the same dtypes, shapes and alignment: the same specialization); returns facts about the code."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature
    target = GPUTarget("cuda", capability, 32)
    backend = make_backend(target)
    kern = launch.kernel
    binder = create_function_from_signature(kern.signature, kern.params, backend)
    bound, spec, opts = binder(*launch.args, **launch.kwargs)
    options, signature, constexprs, attrs = kern._pack_args(backend, launch.kwargs, bound, spec, opts)
    t = time.time()
    ck = triton.compile(ASTSource(kern, signature, constexprs, attrs), target=target, options=options.__dict__)
    info = dict(compile_s=time.time() - t, shared_bytes=ck.metadata.shared, num_warps=options.num_warps,
                num_stages=options.num_stages, maxnreg=options.maxnreg)
    ptxas = _triton_tool("ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "k.ptx"
        ptx.write_text(ck.asm["ptx"])
        if ptxas:
            r = subprocess.run([ptxas, "-v", f"--gpu-name=sm_{capability}a", str(ptx), "-o", str(ptx) + ".o"],
                               capture_output=True, text=True)
            m = re.search(r"Used (\d+) registers", r.stderr)
            s = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)
            if m:
                info["regs"] = int(m.group(1))
            if s:
                info.update(stack=int(s.group(1)), spill_stores=int(s.group(2)), spill_loads=int(s.group(3)))
        cuobjdump = _triton_tool("cuobjdump")
        if cuobjdump and "cubin" in ck.asm:
            cub = Path(tmp) / "k.cubin"
            cub.write_bytes(ck.asm["cubin"])
            sass = subprocess.run([cuobjdump, "-sass", str(cub)], capture_output=True, text=True).stdout
            for op in ("HGMMA", "MUFU.EX2", "FMUL", "FFMA", "F2FP", "BAR.SYNC", "LDL", "STL"):
                info[f"sass_{op}"] = len(re.findall(r"\b" + re.escape(op) + r"\b", sass))
    if "regs" in info:
        w = info["num_warps"]
        per_warp = math.ceil(info["regs"] * 32 / 256) * 256
        by_regs = SM90_REGS // (per_warp * w)
        by_smem = SM90_SMEM // (info["shared_bytes"] + 1024)
        info["ctas_per_sm"] = max(0, min(by_regs, by_smem, SM90_WARPS // w, 32))
        info["limited_by"] = "regs" if by_regs <= by_smem else "smem"
        info["warps_per_sm"] = info["ctas_per_sm"] * w
    info["loops"] = loop_schedule(ck.asm.get("ttgir", ""))
    return info


def aot_line(name, i):
    sp = f"{i.get('spill_stores', '?')}/{i.get('spill_loads', '?')}"
    loops = i.get("loops") or []
    body = loops[1] if len(loops) == 3 else (loops[0] if loops else "")
    return (f"{name[:22]:<23}{i.get('regs', '?'):>5}{sp:>11}{i['shared_bytes'] // 1024:>6}K"
            f"{i.get('ctas_per_sm', '?'):>5}{i.get('warps_per_sm', '?'):>6}  "
            f"{i.get('sass_HGMMA', '?'):>5}{i.get('sass_MUFU.EX2', '?'):>5}{i.get('sass_FMUL', '?'):>5}"
            f"{i.get('sass_FFMA', '?'):>5}  {body}")


AOT_HEADER = (f"{'kernel':<23}{'regs':>5}{'spill st/ld':>11}{'smem':>7}{'CTA':>5}{'warps':>6}  "
              f"{'HGMMA':>5}{'EX2':>5}{'FMUL':>5}{'FFMA':>5}  main loop (D(s): wgmma A from smem, D(r): "
              f"from registers, Wn: wait leaving n in flight)")


def aot_main(args, variants):
    """Compile step 06's kernels and every variant for sm_90 at the leaderboard shape, causal (the table) and
    not causal (compiled too: the GPU check runs both); print the facts."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("--aot-check compiles for sm_90: unset TRITON_INTERPRET")
        return 1
    _, s6 = steps()
    shape, dtype = GPU_SHAPE, torch.bfloat16
    B, H, N, D = (shape[x] for x in "BHND")
    q, k, v, o, do = (torch.empty(B, H, N, D, dtype=dtype) for _ in range(5))
    lse = torch.empty(B, H, N, dtype=torch.float32)
    delta = torch.empty(B * H, N, dtype=torch.float32)
    scale = D ** -0.5
    print(f"Compiled for sm_90 (cuda:90, no GPU) at B={B} H={H} N={N} D={D} bf16; triton {triton.__version__}.\n"
          f"regs: per thread (ptxas -v); CTA / warps: programs / warps per SM that registers and shared memory allow;\n"
          f"HGMMA ... FFMA: static SASS instruction counts (all loops).\n")
    report, failures, n = {}, 0, 0
    for causal in (True, False):
        items = []
        launches, _ = step06_launches(s6, q, k, v, o, lse, do, causal, scale,
                                      step06_config(s6, shape, dtype, causal, "cuda"), run=False)
        items += [(f"step06 {x.name.replace('_bwd_', '').replace('_kernel', '')}", x) for x in launches]
        old, _ = step06_launches(s6, q, k, v, o, lse, do, causal, scale,
                                 step06_config(s6, shape, dtype, causal, "cuda", dkdv=STEP06_OLD_TILES), run=False)
        items += [("step06 dkdv 32x128 w4", x) for x in old if x.name == "_bwd_dkdv_kernel"]
        for tname, tiles in STEP06_TRY.items():
            tl_, _ = step06_launches(s6, q, k, v, o, lse, do, causal, scale,
                                     step06_config(s6, shape, dtype, causal, "cuda", dkdv=tiles), run=False)
            items += [(tname, x) for x in tl_ if x.name == "_bwd_dkdv_kernel"]
        for var in variants:
            launch, _, _, _ = variant_launch(var, q, k, v, do, lse.reshape(B * H, N), delta, causal, scale, prep=False)
            items.append((var.name, launch))
        print(("causal" if causal else "not causal") + ":")
        print(AOT_HEADER)
        for name, launch in items:
            n += 1
            tag = f"{name} ({'causal' if causal else 'full'})"
            try:
                i = aot_compile(launch)
                report[tag] = i
                print(aot_line(name, i), flush=True)
            except Exception as e:
                failures += 1
                report[tag] = f"{type(e).__name__}: {first_line(e)}"
                print(f"{name[:22]:<23}FAIL {report[tag][:150]}", flush=True)
        print()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "dkdv_aot.json").write_text(json.dumps(report, indent=1, default=str))
        print(f"wrote {args.out / 'dkdv_aot.json'}")
    print(f"{n - failures} compiled, {failures} failed; {time.time() - T_START:.0f} s")
    return 1 if failures else 0


# %% Inputs, reference, errors ----------------------------------------------------------------------------


_REF = {}


def reference(shape, dtype, device, causal):
    """The check input and its float64 results (cached per process): q, k, v, dO in ``dtype``; O (rounded to
    ``dtype``) and LSE (fp32) from the float64 forward; D = rowsum(dO * O) in fp32, (B*H, N); dQ, dK, dV."""
    key = (tuple(shape.values()), str(dtype), device, causal)
    if key not in _REF:
        from attnlib import reference_attention, reference_backward
        q, k, v, do = make_inputs(shape, dtype, device)
        o64, lse64 = reference_attention(q, k, v, causal)
        dq, dk, dv = reference_backward(q, k, v, do, causal)
        o = o64.to(dtype)
        B, H, N = q.shape[:3]
        delta = (do.float() * o.float()).sum(-1).reshape(B * H, N).contiguous()
        _REF[key] = dict(q=q, k=k, v=v, do=do, o=o, lse=lse64.to(torch.float32).contiguous(), delta=delta,
                         O=o64, dQ=dq, dK=dk, dV=dv)
    return _REF[key]


def all_variants():
    return {v.name: v for v in VARIANTS + EXTRA_VARIANTS}


def kernel_facts(ck):
    """Registers / spills / shared memory of a kernel Triton just launched (a GPU; None in the interpreter)."""
    if ck is None or not hasattr(ck, "n_regs"):
        return None
    try:
        return dict(regs=ck.n_regs, spills=ck.n_spills, shared_bytes=ck.metadata.shared)
    except Exception:
        return None


def check_job(job):
    """One kernel at a check shape (a pool worker on the GPU; in-process with --small): compiles it, returns its
    errors. job: kind ("variant" | "step06"), name, set (the check set's label), causal, dtype, device, shape,
    small_tiles (the variant's --small tiles; step 06's table at this shape on a CPU) or the GPU's tiles (the
    variant's own; step 06's table at the leaderboard shape, pinned), dkdv (step 06's dK/dV tiles, optional)."""
    t = time.time()
    facts = None
    try:
        dtype = getattr(torch, job["dtype"])
        r = reference(job["shape"], dtype, job["device"], job["causal"])
        scale = job["shape"]["D"] ** -0.5
        if job["kind"] == "fwd":
            # Step 05's forward with the leaderboard shape's tiles: compiled here for the timing's forward row.
            s5, _ = steps()
            g = GPU_SHAPE
            cfg = s5.fwd_config(g["N"], g["N"], g["D"], dtype, job["causal"], "cuda", g["B"] * g["H"])
            outs = {"O": s5.forward(r["q"], r["k"], r["v"], job["causal"], scale, config=cfg)[0]}
        elif job["kind"] == "step06":
            _, s6 = steps()
            if job["small_tiles"]:
                cfg = step06_config(s6, job["shape"], dtype, job["causal"], "cpu", dkdv=job.get("dkdv"))
            else:
                cfg = step06_config(s6, GPU_SHAPE, dtype, job["causal"], "cuda", dkdv=job.get("dkdv"))
            log, (dq, dk, dv) = step06_launches(s6, r["q"], r["k"], r["v"], r["o"], r["lse"], r["do"], job["causal"],
                                                scale, cfg)
            outs = {"dQ": dq, "dK": dk, "dV": dv}
        else:
            var = all_variants()[job["name"]]
            if job["small_tiles"]:
                var = var.small()
            launch, _, dk, dv = variant_launch(var, r["q"], r["k"], r["v"], r["do"], r["lse"].reshape(-1),
                                               r["delta"], job["causal"], scale)
            facts = kernel_facts(launch())
            outs = {"dK": dk, "dV": dv}
        if job["device"] == "cuda":
            torch.cuda.synchronize()
        res = errors(outs, r, dtype)
    except Exception as e:
        res = f"{type(e).__name__}: {first_line(e)}"
    return dict(name=job["name"], set=job["set"], causal=job["causal"], dtype=job["dtype"], result=res, facts=facts,
                seconds=time.time() - t)


# %% Timing ---------------------------------------------------------------------------------------------


def sdpa_bwd_fn(q, k, v, do, causal, device):
    """SDPA-FLASH's backward alone: torch.autograd.grad on an output held from one forward (--small: MATH)."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = SDPBackend.FLASH_ATTENTION if device == "cuda" else SDPBackend.MATH
    qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    with sdpa_kernel([backend]):
        out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
    return lambda: torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True)


def dkdv_flops(B, H, N, D, causal, products=4):
    """``products`` matrix products of 2 * N * N * D flops per (batch, head), halved when causal."""
    return products * 2.0 * B * H * N * N * D / (2 if causal else 1)


def log(msg):
    print(f"[{time.time() - T_START:5.1f}s] {msg}", flush=True)


# %% The run -------------------------------------------------------------------------------------------

def verdict(res, s06, dtype):
    """(ok, why, worst error / step 06's): WRONG when dK or dV is not finite or beyond 2 x step 06's + MARGIN."""
    if not isinstance(res, dict):
        return False, f"ERROR {res}", None
    worst, bad = 0.0, []
    for n in ("dK", "dV"):
        e = res[n]["err"]
        if isinstance(s06, dict):
            ref = s06[n]["err"]
            worst = max(worst, e / max(ref, 1e-30))
            if not (math.isfinite(e) and e <= 2 * ref + MARGIN[dtype]):
                bad.append(n)
        elif not (math.isfinite(e) and res[n]["bad"] == 0):      # step 06 failed: attnlib's policy alone
            bad.append(n)
    return (not bad), ("ok" if not bad else "WRONG: " + ", ".join(bad)), (worst if isinstance(s06, dict) else None)


def run_checks(jobs, workers, deadline):
    """Every job's result dict, keyed (name, set, causal); a pool of processes on the GPU."""
    results = {}
    if workers <= 1:
        for j in jobs:
            if time.time() > deadline:
                break
            r = check_job(j)
            results[(r["name"], r["set"], r["causal"])] = r
        return results
    import multiprocessing as mp
    from bench.experiments import triton_dkdv_variants as mod     # workers import this module by that name: one Triton cache key
    n = 0
    try:
        with mp.get_context("spawn").Pool(workers) as pool:
            it = pool.imap_unordered(mod.check_job, jobs, chunksize=1)
            for _ in jobs:
                r = it.next(timeout=max(1.0, deadline - time.time()))
                results[(r["name"], r["set"], r["causal"])] = r
                n += 1
                if n % 6 == 0 or n == len(jobs) or not isinstance(r["result"], dict):
                    log(f"checked {n}/{len(jobs)}: {r['name']} ({'causal' if r['causal'] else 'full'}) "
                        f"{r['seconds']:.0f} s" + ("" if isinstance(r["result"], dict) else f": {r['result']}"))
    except mp.TimeoutError:
        log(f"check phase stopped at its deadline: {len(jobs) - len(results)} checks unfinished (not timed)")
    except Exception as e:                            # no pool: the rest in this process
        log(f"process pool failed ({type(e).__name__}: {e}); checking in this process")
        for j in jobs:
            if (j["name"], j["set"], j["causal"]) not in results and time.time() < deadline:
                r = check_job(j)
                results[(r["name"], r["set"], r["causal"])] = r
    return results


HEADER = (f"{'row':<26}{'config':<49}{'ms':>8}{'TFLOP/s':>9}{'x s06':>7}{'bwd ms':>8}{'x flash':>8}"
          f"{'f+b ms':>8}{'regs':>6}{'spill':>6}")


def fmt_row(r):
    f = lambda x, p: "-" if x is None else f"{x:.{p}f}"      # noqa: E731
    facts = r.get("facts") or {}
    return (f"{r['row'][:25]:<26}{r.get('config', '')[:48]:<49}{f(r.get('ms'), 3):>8}{f(r.get('tflops'), 0):>9}"
            f"{f(r.get('x_s06'), 2):>7}{f(r.get('implied_bwd_ms'), 3):>8}{f(r.get('x_flash'), 2):>8}"
            f"{f(r.get('implied_fwd_bwd_ms'), 3):>8}{facts.get('regs', ''):>6}{facts.get('spills', ''):>6}"
            + ("" if r.get("status", "ok") == "ok" else "  " + str(r["status"])[:70]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="folder for dkdv_variants.json (default out/dkdv_variants)")
    ap.add_argument("--budget-s", type=float, default=110.0,
                    help="start no new timing after this many seconds from the start (default 110)")
    ap.add_argument("--hard-limit-s", type=float, default=165.0,
                    help="write the JSON and exit if the run is still going after this many seconds (default 165)")
    ap.add_argument("--workers", type=int, default=None, help="check/compile processes (default: CPUs - 2, at most 14)")
    ap.add_argument("--variants", default=None,
                    help="comma-separated names (default: " + ",".join(v.name for v in VARIANTS) + "; also "
                    + ",".join(v.name for v in EXTRA_VARIANTS) + ")")
    ap.add_argument("--small", action="store_true", help="a CPU: Triton's interpreter, fp32 / fp16, tiny sizes")
    ap.add_argument("--aot-check", action="store_true", help="no GPU: compile every kernel for sm_90 and report")
    args = ap.parse_args(argv)
    known = all_variants()
    if args.variants:
        names = [x.strip() for x in args.variants.split(",") if x.strip()]
        unknown = [x for x in names if x not in known]
        if unknown:
            ap.error(f"unknown variants {unknown}; known: {sorted(known)}")
        variants = [known[x] for x in names]
    else:
        variants = list(VARIANTS)
    if args.aot_check:
        return aot_main(args, variants if args.variants else VARIANTS + EXTRA_VARIANTS)
    small = args.small
    if not small and not torch.cuda.is_available():
        print("bench/experiments/triton_dkdv_variants.py needs a CUDA GPU (or --small for the CPU interpreter, "
              "--aot-check for the sm_90 compile report)")
        return 1
    out_dir = args.out or REPO / "out" / "dkdv_variants"
    out_dir.mkdir(parents=True, exist_ok=True)
    out_path = out_dir / "dkdv_variants.json"
    device = "cpu" if small else "cuda"
    dtype = torch.float32 if small else torch.bfloat16
    shape = SMALL_SHAPE if small else GPU_SHAPE
    # Check sets: (label, dtype, shape, the variants' --small tiles?). --small also runs the GPU's own tiles
    # (fp16: the interpreter's bf16 dots are wrong) at N=1008, the GPU check's partial tiles.
    if small:
        check_sets = [("fp32 N=100 small tiles", torch.float32, SMALL_CHECK, True),
                      ("fp16 N=100 small tiles", torch.float16, SMALL_CHECK, True),
                      ("fp16 N=1008 GPU tiles", torch.float16, SMALL_CHECK_GPU_TILES, False)]
    else:
        check_sets = [("bf16 N=1008", torch.bfloat16, GPU_CHECK, False)]
    causal = True
    info = machine_info()
    print(json.dumps(info), flush=True)
    s5, s6 = steps()
    B, H, N, D = (shape[x] for x in "BHND")
    old_tiles = SMALL_OLD_TILES if small else STEP06_OLD_TILES
    s06_cfg = step06_config(s6, shape, dtype, causal, device)
    doc = {"machine": info, "shape": dict(shape, dtype=str(dtype)[6:], causal=causal),
           "check_sets": [dict(label=x[0], dtype=str(x[1])[6:], shape=x[2], small_tiles=x[3]) for x in check_sets],
           "budget_s": args.budget_s, "margin": {str(k)[6:]: v for k, v in MARGIN.items()},
           "step06_config": s06_cfg, "step06_old_dkdv": old_tiles,
           "variants": [dict(name=v.name, config=(v.small() if small else v).label(), why=v.why,
                             flags=v.consts(), maxnreg=v.maxnreg) for v in variants],
           "checks": [], "rows": [], "skipped": []}

    def save():
        out_path.write_text(json.dumps(doc, indent=1, default=str))

    import threading

    def hard_stop():
        doc["skipped"].append(f"hard limit {args.hard_limit_s:.0f} s reached: the run was stopped")
        save()
        print(f"!! hard limit {args.hard_limit_s:.0f} s reached; wrote {out_path}", flush=True)
        os._exit(3)
    watchdog = threading.Timer(max(1.0, args.hard_limit_s - (time.time() - T_START)), hard_stop)
    watchdog.daemon = True
    watchdog.start()

    # ---- 1. check every kernel (and compile it) -----------------------------------------------------------
    jobs = []
    for label, dt, cshape, small_tiles in check_sets:
        for c in (True, False):
            base = dict(set=label, causal=c, dtype=str(dt)[6:], device=device, shape=cshape, small_tiles=small_tiles)
            jobs.append(dict(base, kind="step06", name="step06"))
            jobs.append(dict(base, kind="step06", name="step06 old tiles",
                             dkdv=SMALL_OLD_TILES if small_tiles else STEP06_OLD_TILES))
            jobs += [dict(base, kind="variant", name=v.name) for v in variants]
            if not small:
                jobs += [dict(base, kind="step06", name=n, dkdv=t) for n, t in STEP06_TRY.items()]
            if c and not small:
                jobs.append(dict(base, kind="fwd", name="step05 fwd"))
    workers = args.workers or (1 if small else max(1, min(len(jobs), 14, (os.cpu_count() or 2) - 2)))
    log(f"checking {len(jobs)} (kernel, check set, causal) jobs " + ("in this process" if workers <= 1 else
                                                                     f"with {workers} processes"))
    results = run_checks(jobs, workers, T_START + 0.6 * args.budget_s)
    ok = {}
    print("\nCheck: max|x - ref| / max|ref| against the float64 reference (attnlib.reference_backward), from the\n"
          "float64 O and LSE; WRONG: dK or dV beyond 2 x step 06's error + "
          + ", ".join(f"{v:g} ({str(k)[6:]})" for k, v in MARGIN.items())
          + "; x s06: the worse of dK, dV over step 06's")
    for label, dt, cshape, small_tiles in check_sets:
        for c in (True, False):
            s06 = (results.get(("step06", label, c)) or {}).get("result", "not checked (time)")
            where = (f"{label} (B={cshape['B']} H={cshape['H']} N={cshape['N']} D={cshape['D']}) "
                     f"{'causal' if c else 'not causal'}")
            if isinstance(s06, dict):
                print(f"  {where}: step06 " + "  ".join(f"{n} {s06[n]['err']:.2e}" for n in ("dQ", "dK", "dV")))
            else:
                print(f"  {where}: step06 {s06}")
            doc["checks"].append(dict(name="step06", set=label, causal=c, errors=s06, verdict="reference"))
            fwd = results.get(("step05 fwd", label, c))
            if fwd:
                res = fwd["result"]
                print(f"  {'':<{len(where)}}  step05 fwd (compiled for the timing) "
                      + (f"O {res['O']['err']:.2e}" if isinstance(res, dict) else str(res)))
                doc["checks"].append(dict(name="step05 fwd", set=label, causal=c, errors=res, verdict="info"))
            for name in ["step06 old tiles"] + [v.name for v in variants] + ([] if small else list(STEP06_TRY)):
                r = results.get((name, label, c))
                res = r["result"] if r else "not checked (time)"
                good, why, worst = verdict(res, s06, dt)
                ok[name] = ok.get(name, True) and good
                errs = (f"dK {res['dK']['err']:.2e}  dV {res['dV']['err']:.2e}" if isinstance(res, dict) else "")
                print(f"    {'ok   ' if good else 'WRONG' if isinstance(res, dict) else 'ERROR'} {name:<20} {errs:<28}"
                      f"{'' if worst is None else f'{worst:5.2f}x s06'}" + ("" if good else f"  {why}"[:150]))
                doc["checks"].append(dict(name=name, set=label, causal=c, errors=res, verdict=why, x_s06=worst,
                                          facts=r.get("facts") if r else None))
    save()

    # ---- 2. time, most important first -------------------------------------------------------------------
    log(f"timing at B={B} H={H} N={N} D={D} {str(dtype)[6:]} causal")
    q, k, v, do = make_inputs(shape, dtype, device)
    scale = D ** -0.5
    o, lse = s5.forward(q, k, v, causal, scale)
    s06_log, _ = step06_launches(s6, q, k, v, o, lse, do, causal, scale, s06_cfg)
    by = {x.name: x for x in s06_log}
    pre06, dkdv06, dq06 = by["_bwd_preprocess"], by["_bwd_dkdv_kernel"], by["_bwd_dq_kernel"]
    delta, lse_flat = pre06.args[2], dkdv06.args[4]           # step 06's D and its (B*H, N) view of the LSE
    f4, f3 = dkdv_flops(B, H, N, D, causal, 4), dkdv_flops(B, H, N, D, causal, 3)
    ms = {}
    rows = doc["rows"]

    def timed(key, label, config, make, flops=None, facts=None):
        if time.time() - T_START > args.budget_s:
            doc["skipped"].append(f"{label}: budget ({args.budget_s:.0f} s) spent")
            log(f"  skipped (budget): {label}")
            return None
        row = dict(row=label, key=key, config=config, ms=None, status="ok")
        try:
            fn = make()
            ck = fn()                                         # compiled already (checks); facts of the kernel
            row["facts"] = facts or kernel_facts(ck)
            if device == "cuda":
                torch.cuda.synchronize()
            row["ms"] = bench_ms(fn, device)
            if flops:
                row["tflops"] = flops / (row["ms"] * 1e-3) / 1e12
        except Exception as e:
            row["status"] = f"error: {type(e).__name__}: {first_line(e, 200)}"
        ms[key] = row["ms"]
        rows.append(row)
        fill_ratios()
        save()
        print(fmt_row(row), flush=True)
        return row["ms"]

    def fill_ratios():
        """x s06, implied backward and fwd+bwd of every dK/dV row, from what has been measured so far."""
        for r in rows:
            if r.get("kind") != "dkdv" or not r.get("ms"):
                continue
            if ms.get("s06"):
                r["x_s06"] = ms["s06"] / r["ms"]
            rest = [ms.get("pre"), ms.get("dq")] + ([ms.get("prep")] if r.get("needs_prep") else [])
            if all(rest):
                r["implied_bwd_ms"] = r["ms"] + sum(rest)
                if ms.get("flash_bwd"):
                    r["x_flash"] = ms["flash_bwd"] / r["implied_bwd_ms"]
                if ms.get("fwd"):
                    r["implied_fwd_bwd_ms"] = ms["fwd"] + r["implied_bwd_ms"]

    def kernel_row(key, label, config, launch, needs_prep=False, flops=f4):
        n = len(rows)
        timed(key, label, config, lambda: launch, flops=flops)
        if len(rows) > n:
            rows[-1].update(kind="dkdv", needs_prep=needs_prep)
            fill_ratios()
            save()

    print("\n" + HEADER, flush=True)
    c = s06_cfg["dkdv"]
    s06_label = f"{c['BLOCK_M']}x{c['BLOCK_N']} w{c['num_warps']} s{c['num_stages']} (table)"
    kernel_row("s06", "step06 dK/dV", s06_label, dkdv06)
    timed("pre", "step06 preprocess", "", lambda: pre06)
    c = s06_cfg["dq"]
    timed("dq", "step06 dQ", f"{c['BLOCK_M']}x{c['BLOCK_N']} w{c['num_warps']} s{c['num_stages']} (table)",
          lambda: dq06, flops=f3)
    timed("flash_bwd", "sdpa_flash bwd" if device == "cuda" else "sdpa_math bwd (--small)", "autograd.grad",
          lambda: sdpa_bwd_fn(q, k, v, do, causal, device))
    timed("fwd", "step05 fwd", "table", lambda: (lambda: s5.forward(q, k, v, causal, scale)))
    pre_scaled = [v for v in variants if v.consts()["K_PRESCALED"]]
    if pre_scaled:
        _, host, _, _ = variant_launch(pre_scaled[0], q, k, v, do, lse_flat, delta, causal, scale, prep=False)
        timed("prep", "host K*c, LSE*log2e", "tutorial's host pre-scale", lambda: host)
    for var in variants:
        vv = var.small() if small else var
        if not ok.get(var.name):
            doc["skipped"].append(f"{var.name}: failed or missed its check")
            log(f"  not timed (check): {var.name}")
            continue
        launch, _, _, _ = variant_launch(vv, q, k, v, do, lse_flat, delta, causal, scale)
        kernel_row(var.name, var.name, vv.label(), launch, needs_prep=vv.consts()["K_PRESCALED"])
    if ok.get("step06 old tiles"):
        old_log, _ = step06_launches(s6, q, k, v, o, lse, do, causal, scale,
                                     step06_config(s6, shape, dtype, causal, device, dkdv=old_tiles))
        c = old_tiles
        kernel_row("s06_old", "step06 dK/dV old tiles",
                   f"{c['BLOCK_M']}x{c['BLOCK_N']} w{c['num_warps']} s{c['num_stages']} (lb.log's table)",
                   next(x for x in old_log if x.name == "_bwd_dkdv_kernel"))
    for tname, tiles in ({} if small else STEP06_TRY).items():
        if not ok.get(tname):
            doc["skipped"].append(f"{tname}: failed or missed its check")
            continue
        t_log, _ = step06_launches(s6, q, k, v, o, lse, do, causal, scale,
                                   step06_config(s6, shape, dtype, causal, device, dkdv=tiles))
        kernel_row(tname, tname, ", ".join(f"{a}={b}" for a, b in tiles.items()),
                   next(x for x in t_log if x.name == "_bwd_dkdv_kernel"))
    kernel_row("s06_again", "step06 dK/dV (again)", s06_label + ", drift check", dkdv06)

    # ---- 3. the table -----------------------------------------------------------------------------------------
    watchdog.cancel()
    print(f"\nB={B} H={H} N={N} D={D} {str(dtype)[6:]} causal; {info.get('gpu')}, torch {info.get('torch')}, "
          f"triton {info.get('triton')}, {info.get('date')}")
    print(f"TFLOP/s: dK/dV rows 4 products, dQ 3: n * 2*B*H*N^2*D / 2 (causal) / time; x s06: step 06's dK/dV ms / "
          f"this;\nbwd ms: implied backward = this dK/dV + step 06's preprocess + dQ (+ host pre-scale where needed); "
          f"x flash: SDPA-FLASH bwd / that;\nf+b ms: + step 05's forward (leaderboard target {TARGET_MS} ms); "
          f"regs / spill: of the launched kernel (GPU)")
    print(HEADER)
    for r in rows:
        print(fmt_row(r))
    timed_var = [r for r in rows if r.get("kind") == "dkdv" and r.get("ms") and not r["key"].startswith("s06")]
    if timed_var and ms.get("s06"):
        best = min(timed_var, key=lambda r: r.get("implied_bwd_ms") or r["ms"])
        doc["best"] = dict(variant=best["key"], ms=best["ms"], x_s06=best.get("x_s06"),
                           implied_bwd_ms=best.get("implied_bwd_ms"), implied_fwd_bwd_ms=best.get("implied_fwd_bwd_ms"))
        print(f"best variant: {best['key']} {best['ms']:.3f} ms ({best.get('x_s06', 0):.2f}x step 06's dK/dV)")
    if doc["skipped"]:
        print("skipped:\n  " + "\n  ".join(doc["skipped"][:30]))
    doc["total_s"] = time.time() - T_START
    save()
    print(f"wrote {out_path}; total {time.time() - T_START:.0f} s")
    return 0


if __name__ == "__main__":
    # Run the module under its package name, so that the pool's workers (which import it by that name) and this
    # process share Triton's cache keys (they include the kernel's module name).
    from bench.experiments import triton_dkdv_variants as _this
    _this.T_START = T_START                           # the budget counts from this process's start
    sys.exit(_this.main())
