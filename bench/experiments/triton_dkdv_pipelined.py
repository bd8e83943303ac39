"""Experiment: software-pipelining step 06's dK/dV loop by hand -- does Triton 3.6 keep a product in flight across its exponentials?

Question. Step 06's dK/dV kernel (solutions/step06_triton_bwd.py, ``_dkdv_inner``) is the largest part of the CS336
leaderboard time (B=1 H=16 N=16384 D=64 bf16 causal): about 2.3 of 5.1 ms on an H200 at the table's tiles (32x64,
4 warps, maxnreg=128: four programs per SM; EARLY_DP=False, HEADS_FIRST=True). Compiled for sm_90 its loop waits
on each wgmma right after issuing it (TTGIR ``D(s) W0 EX2 D(r) D(s) W0 D(r)``: sT = K Q^T, wait, the exponentials,
dV += pT dO, dpT = V dO^T, wait, dS, dK += dS Q), so inside a program the exponentials and the tensor cores take
turns. bench/experiments/triton_fwd_pipelined.py found for the forward that Triton 3.6 keeps the next tile's
product in flight across the exponentials only in FlashAttention-3's deferred order plus a tiny zero product at
the end of the iteration that forces a wait there ("defer-end"), at a register cost. Does the same trick apply to
the dK/dV loop, and what does it cost in registers at the table's 32x64 w4 tiles and at 32x128 w8 (maxnreg 128)?

Answer: no form pays; step 06's kernel stays as it is. Measured on one H200 (2026-12-01 ~19:15 UTC, torch
2.11.0+cu130, Triton 3.6.0, commit c7087a7; results/h200/triton/dkdv_pipelined_1201_1915.json and .log), at the
leaderboard shape causal (the one shape timed; every timed row's dK and dV bitwise step 06's at the same tiles,
B=2 H=16 N=1008; the check phase reached its deadline with 13 non-causal checks unfinished): step 06's dK/dV
kernel at its table 2.249 ms (2.360 at the run's end), the control (its copy at 32x64 w4 r128) 2.186 (1.03x).
Every pipelined form is slower. pipe and pipe-end 0.63-0.90x step 06: the fastest, pipe 32x128 w8 r128, 2.492 ms
(0.90x; serialized by ptxas); pipe-end 32x64 w4 r168 -- three programs per SM, no spills, 16 of 16 exponentials
under a wgmma -- 2.886 (0.78x); pipe-end 32x64 w4 (two per SM) 3.087 (0.73x). defer and defer-end at the
128-register cap 0.18-0.28x (8.08-12.53 ms: every wgmma serialized and 676-1052 B a thread reloaded from spills,
as the compile report below predicted); uncapped or at r168 0.59-0.70x. The exponentials under dP's wgmma do not
pay for the programs per SM they cost. The CPU evidence (compile reports, no GPU) that explains it: with the wait
at the step's end ptxas keeps a wgmma in flight under all 16 exponentials of a step (step 06: 0 of 16) -- but
not the product the question names, and not within 128 registers. At the table's cap (maxnreg=128, 32x64 w4
and 32x128 w8) every new form is serialized by ptxas (every wgmma waited before the next: C7512 "insufficient register
resources", or C7514 without the end wait) and spills; the overlap needs 187 registers at 32x64 w4 (two 4-warp
programs per SM instead of four), 168 with a 168 cap and no spills (three per SM), 192 at 32x128 w8 (one 8-warp
program per SM instead of two). The GPU run above says that trade does not pay.

The kernel (``_dkdv_pipe_kernel``): step 06's ``_bwd_dkdv_kernel`` -- the same parameters in the same order, so
every launch here is step 06's own launch (recorded from its ``backward()``: grid, arguments, options) with fresh
dK / dV, a row's tiles and the variant's flags -- the same pointer set-up and the same three stages (masked
diagonal, unmasked body, masked tail: step 06's ``_dkdv_tile`` ranges), the same math operation for operation
(in the interpreter, fp16 and fp32, every variant's dK and dV are bitwise step 06's at the same tiles). The loop
is picked by the constexpr ``PIPE`` and two flags:

  (a) control    PIPE=0: step 06's own ``_dkdv_tile`` (imported from solutions/; same registers and schedule
                 as step 06 in the compile report).
  (b) pipe       PIPE=1: a prologue computes sT of the first query tile; each step j: dpT_j = V dO_j^T (used in
                 this step, so Triton waits for it at once), then sT_{j+1} = K Q_{j+1}^T (Q_{j+1} loaded with a
                 row mask; only yielded), then the exponentials of sT_j (carried raw, scaled where used), dV += pT
                 dO, dS, dK += dS Q. One sT pipeline runs through the three stages (their query tiles are
                 consecutive); past N_Q its rows read zeros and the product is thrown away: one extra K Q^T per
                 program.
      pipe-end   + ``END_WAIT``: at the end of each step a product of exact zeros (BLOCK_N x 16 @ 16 x 16, A =
                 rowsum(dS) * 0) whose result the loop reads: Triton waits for it at once, and that wait retires
                 sT_{j+1} (and dV, dK) before the back edge.
  (c) defer      PIPE=2: FlashAttention-3's order: each step j issues dpT_j (waited at once), then the previous
                 tile's dV += pT_{j-1} dO_{j-1} and dK += dS_{j-1} Q_{j-1} (pT, dS carried in fp32 and rounded at
                 the product, so wgmma reads them from registers; Q_{j-1}, dO_{j-1} loaded again), then sT_{j+1},
                 then the exponentials of sT_j and dS_j; after the stages, the last tile's dV and dK.
      defer-end  (c) + ``END_WAIT``.

Extra work: (b)-(d) one K Q^T past the last tile per program; (c)-(d) two products with zero A per program and
two more tile loads per step (Q_{j-1}, dO_{j-1}: 84 KB of shared memory at 4 stages, step 06 49 KB);
``END_WAIT`` one 64x16x16 wgmma per warpgroup per step.

Why these forms (Triton 3.6, WGMMAPipeline.cpp, ``dotCanBeProperlyAsync``; triton_fwd_pipelined.py says more): a
wgmma in a loop is left in flight only if its result is used by nothing in the loop but the yield and, in the next
iteration, only as another wgmma's accumulator or only after the body's first ``pendings = 0`` wait. Unlike the
forward, the backward has a product that every step needs at once and does not depend on the exponentials,
dpT_j: issued first, its wait is the body's first, and the carried sT_j is used after it. So (b) already gets the
TTGIR the question asks for (``D(s) W0 D(s) EX2 D(r) D(r)``: sT_{j+1} not waited before the exponentials), where
the forward's (b) did not. Then ptxas: without the end wait it serializes every wgmma of the kernel (C7514: the
carried sT is copied at the back edge while in flight), as in the forward; with it, it does not when registers
allow. Two findings of the SASS: (1) the end product's A must depend on the step's elementwise work (rowsum(dS)
* 0 here, l_i * 0 in the forward): with A = (a loop-carried zero) * 0 alone, ptxas moved all 16 MUFU.EX2 of the
step below the end wait (defer-end 32x64 w4, uncapped: ``... Hr W0 EX16``, 0 of 16 under a wgmma). (2) In every unserialized form ptxas then places the exponentials
under dpT_j, not under sT_{j+1}: sT_j was retired at the previous step's end, so nothing holds them below dpT's
wait. The SASS loop is ``Hs EX5 Hs EX8 Hs EX3 Hs W0 Hsx4 Hrx5 W0``: the four k-steps of dpT_j interleaved with the
16 exponentials, its wait, then sT_{j+1}, dV, dK and the zero product back to back (the dS arithmetic between),
the end wait. The deferred order (c)/(d) gives the same SASS shape (dV_{j-1}, dK_{j-1}, sT_{j+1} after dpT's
wait) at 50 more registers: deferring buys nothing here. (A loop-carried start of the previous tile in (c) made
Triton's pipeliner give up on the loop -- no multi-buffered loads, every wgmma waited -- so the previous tile is
start_m - BLOCK_M.)

CPU evidence (``--aot-check``, 2026-12-01, Triton 3.6.0 and its bundled ptxas, sm_90a, no GPU; B=1 H=16 N=16384
D=64 bf16 causal, EARLY_DP=False and HEADS_FIRST=True on every row as step 06's table). "EX2 under wgmma"
(triton_fwd_pipelined.sass_loops): per SASS loop (diagonal / body / tail stage), the MUFU.EX2 issued while a
wgmma is outstanding : all MUFU.EX2 of the loop. "serial": ptxas serialized every wgmma of the kernel, and why
(7512 registers, 7514 / 7515 an accumulator read / written before its wait). In a serialized kernel each HGMMA
k-step is waited before the next, so its "EX2 under wgmma" counts exponentials that overlap one 64xNx16 step
only. SASS columns: Hs / Hr HGMMA with A from shared memory / registers, Wn a wait leaving n in flight, EXn n
MUFU.EX2.

    row (causal)              regs     spill  smem CTA    serial    EX2 under wgmma  TTGIR loop (body stage)             SASS loop (body stage)
    step06 itself 32x64 w4     128     24/40   49K   4        no     0:16/0:16/0:16  D(s) W0 EX2 D(r) D(s) W0 D(r)       Hsx4 W0 EX16 Hrx2 Hsx4 W0 Hrx2
    control 32x64 w4 r128      128     24/40   49K   4        no     0:16/0:16/0:16  D(s) W0 EX2 D(r) D(s) W0 D(r)       Hsx4 W0 EX16 Hrx2 Hsx4 W0 Hrx2
    pipe 32x64 w4 r128         128     36/56   69K   3      7514    0:16/3:16/12:16  D(s) W0 D(s) EX2 D(r) D(r)          (a wait after each HGMMA)
    pipe-end 32x64 w4 r128     128     32/52   69K   3      7512  14:16/12:16/13:16  D(s) W0 D(s) EX2 D(r) D(r) D(r) W0  (a wait after each HGMMA)
    defer 32x64 w4 r128        128 1220/1000   84K   2      7514     0:16/0:16/0:16  D(s) W0 D(r) D(r) D(s) EX2          (a wait after each HGMMA)
    defer-end 32x64 w4 r128    128 1268/1052   85K   2      7512   12:16/6:16/13:16  D(s) W0 D(r) D(r) D(s) EX2 D(r) W0  (a wait after each HGMMA)
    control 32x128 w8 r128     128       0/0   64K   2        no     0:16/0:16/0:16  D(s) W0 EX2 D(r) D(s) W0 D(r)       Hsx4 W0 EX16 Hrx2 Hsx4 W0 Hrx2
    pipe 32x128 w8 r128        128     28/48   85K   2      7514    0:16/3:16/13:16  D(s) W0 D(s) EX2 D(r) D(r)          (a wait after each HGMMA)
    pipe-end 32x128 w8 r128    128     32/56   85K   2      7512   13:16/9:16/13:16  D(s) W0 D(s) EX2 D(r) D(r) D(r) W0  (a wait after each HGMMA)
    defer 32x128 w8 r128       128   832/676  100K   2      7514     3:16/0:16/4:16  D(s) W0 D(r) D(r) D(s) EX2          (a wait after each HGMMA)
    defer-end 32x128 w8 r128   128  1192/980  101K   2      7512  16:16/12:16/15:16  D(s) W0 D(r) D(r) D(s) EX2 D(r) W0  (a wait after each HGMMA)
    pipe 32x64 w4              164       0/0   69K   3      7514   11:16/10:16/8:16  D(s) W0 D(s) EX2 D(r) D(r)          (a wait after each HGMMA)
    pipe-end 32x64 w4          187       0/0   69K   2        no  16:16/16:16/16:16  D(s) W0 D(s) EX2 D(r) D(r) D(r) W0  Hs EX5 Hs EX8 Hs EX3 Hs W0 Hsx4 Hrx5 W0
    defer 32x64 w4             218       0/0   84K   2      7514     0:16/0:16/0:16  D(s) W0 D(r) D(r) D(s) EX2          (a wait after each HGMMA)
    defer-end 32x64 w4         238       0/0   85K   2        no  16:16/16:16/16:16  D(s) W0 D(r) D(r) D(s) EX2 D(r) W0  Hs EX6 Hs EX8 Hs EX2 Hs W0 Hrx4 Hsx4 Hr W0
    pipe-end 32x64 w4 r168     168       0/0   69K   3        no  16:16/16:16/16:16  D(s) W0 D(s) EX2 D(r) D(r) D(r) W0  Hs EX4 Hs EX8 Hs EX4 Hs W0 Hsx4 Hrx5 W0
    defer-end 32x64 w4 r168    168   236/256   85K   2        no  16:16/16:16/16:16  D(s) W0 D(r) D(r) D(s) EX2 D(r) W0  Hs EX1 Hsx3 W0 Hr EX4 Hr EX1 Hr EX7 Hr EX1 Hs EX2 Hsx3 Hr W0
    pipe-end 32x128 w8         192       0/0   85K   1        no  16:16/16:16/16:16  D(s) W0 D(s) EX2 D(r) D(r) D(r) W0  Hs EX6 Hs EX8 Hs EX2 Hs W0 Hsx4 Hrx5 W0
    defer-end 32x128 w8        226       0/0  101K   1        no  16:16/16:16/16:16  D(s) W0 D(r) D(r) D(s) EX2 D(r) W0  Hs EX6 Hs EX8 Hs EX2 Hs W0 Hrx4 Hsx4 Hr W0

Not causal (step 06's table there: 32x64 w4 s4, EARLY_DP=True, no cap): the same picture (pipe-end 32x64 w4
uncapped 164 registers, three programs per SM, 16:16; at r128 C7512), and step 06's own kernel there is already
serialized by ptxas (C7515, 142 registers) -- a finding for step 06's non-causal table, not followed up here.

How to run:

    python bench/experiments/triton_dkdv_pipelined.py --small           # a CPU, interpreter: every variant vs the float64
                                                                        #   reference and step 06 (fp16, fp32; ~20 s)
    python bench/experiments/triton_dkdv_pipelined.py --aot-check       # no GPU: compile for sm_90a, the report above (~30-50 s)
    python bench/experiments/triton_dkdv_pipelined.py --out DIR         # an H200: the GPU plan (about 1-2 min; hard stop 170 s)
    python bench/experiments/triton_dkdv_pipelined.py --out DIR --smoke # a CPU: the GPU plan's code, interpreter, tiny sizes
    pytest tests/test_experiment_dkdv_pipelined.py                      # the new variants vs the reference (~20-30 s, 2 cores)

``--variants NAME,...`` picks rows of ``ROWS`` (names as in the table); ``--aot-check --out DIR`` also writes every
row's facts to DIR/dkdv_pipelined_aot.json.

The GPU run (``--out DIR``): (1) check, in a pool of processes (``--workers``, 8) that also compiles every kernel
into Triton's on-disk cache: every row, causal and not, at B=2 H=16 N=1008 D=64 bf16 (partial tiles; the
leaderboard shape's Triton specialization), dK and dV against the float64 reference and against step 06 itself
at the row's tiles (launched by its ``backward()``): inside the course's bf16 tolerance and at most 2 x step 06's
error + 1e-3, or the row is not timed. (2) Time (``triton.testing.do_bench``, warmup 25, rep 100, median) at the
leaderboard shape, causal: step 06's own dK/dV kernel as its ``backward()`` launches it (the table), every checked
row on step 06's very arguments (its D and LSE), step 06 again (drift); "x step06" = step 06's time / the row's.
No row starts after ``--budget-s`` (140); a watchdog stops the run 30 s later. Writes DIR/dkdv_pipelined.json
(machine, date, versions, commit, checks, rows) and DIR/dkdv_pipelined.log after every line. What to read first:
"pipe-end 32x64 w4 r168" (three programs per SM, no spills, no serialization, 16 of 16 under a wgmma) and
"pipe-end 32x64 w4" (two per SM) against "step06 dK/dV (its table)" and "control 32x64 w4 r128"; then the r128
rows (does a serialized kernel with the overlap lose, as the compile report predicts) and 32x128 w8.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

T0 = time.time()
if "--small" in sys.argv or "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"          # before triton is imported
ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT, ROOT / "bench" / "experiments"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from attnlib.loader import load_step  # noqa: E402
# The compile report's facts (registers, spills, ptxas's C7514 serialization warning, TTGIR and SASS loops, and
# the "EX2 under wgmma" count of ``sass_loops``) come from the forward experiment, unchanged.
from bench.experiments.triton_fwd_pipelined import aot_compile, aot_finish, aot_rows  # noqa: E402
from bench.experiments.triton_lb_variants import errors, first_line, record_launches  # noqa: E402

S5 = load_step(5, "solutions")
S6 = load_step(6, "solutions")
load_tile, _dkdv_tile = S6.load_tile, S6._dkdv_tile
LOG2E = 1.4426950408889634
LOG2E_C: tl.constexpr = tl.constexpr(LOG2E)

# What PIPE selects (a constexpr of the kernel).
CONTROL, PIPE_S, DEFER = 0, 1, 2


# %% The kernel ------------------------------------------------------------------------------------------

@triton.jit
def _rows_stats(LSE, DELTA, offs_m, N_Q, MASKED: tl.constexpr):
    """Step 06's per-query-row loads: LSE in base 2 and D."""
    if MASKED:
        lse2 = tl.load(LSE + offs_m, mask=offs_m < N_Q, other=0.0) * LOG2E_C
        delta = tl.load(DELTA + offs_m, mask=offs_m < N_Q, other=0.0)
    else:
        lse2 = tl.load(LSE + offs_m) * LOG2E_C
        delta = tl.load(DELTA + offs_m)
    return lse2, delta


@triton.jit
def _probs(sT_raw, lse2, offs_m, offs_n, N_Q, qk_scale, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr):
    """Step 06's pT from a raw K Q^T tile: exp2(sT * qk_scale - lse2), 0 where masked."""
    sT = sT_raw * qk_scale
    pT = tl.math.exp2(sT - lse2[None, :])
    if MASKED:
        visible = offs_m[None, :] < N_Q
        if IS_CAUSAL:
            visible = visible & (offs_n[:, None] <= offs_m[None, :])
        pT = tl.where(visible, pT, 0.0)
    return pT


@triton.jit
def _end_wait(zs, dsT, k, BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """A product of exact zeros (BLOCK_N x 16 @ 16 x 16) whose result the loop reads (zs += rowsum, + 0): Triton
    waits for it at once (pendings = 0), and that wait retires every product still in flight -- the carried
    sT_{j+1} among them -- before the loop's back edge. Its A operand is rowsum(dsT) * 0: it depends on this
    step's exponentials, so ptxas cannot move them below the wait (with A = zs * 0 alone, it put all 16 MUFU.EX2
    of a step after the wait: none under a wgmma). dsT is finite (masked entries are 0), so A is exact zeros."""
    z_a = (tl.sum(dsT, 1)[:, None] * 0.0 + zs[:, None] * 0.0 + tl.zeros([BLOCK_N, 16], tl.float32)).to(k.dtype)
    z = tl.dot(z_a, tl.zeros([16, 16], k.dtype), input_precision=DOT_PRECISION)
    return zs + tl.sum(z, 1)


@triton.jit
def _stage_pipe(dk, dv, sT_raw, zs, k, v, Q, DO, LSE, DELTA,
                stride_qm, stride_qd, stride_dom, stride_dod,
                offs_n, offs_d, lo, hi, N_Q, qk_scale,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAD_D: tl.constexpr,
                MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                END_WAIT: tl.constexpr):
    """(b) One stage with sT pipelined: ``sT_raw`` holds K Q^T of query tile ``lo`` (unscaled) on entry.
    Each step: dpT_j = V dO_j^T (used in this step: Triton waits for it at once -- the body's first
    ``pendings = 0`` wait, which the carried sT_j needs before its exponentials), then sT_{j+1} = K Q_{j+1}^T
    (only yielded: may stay in flight), then the exponentials of sT_j, dV += pT dO, dS, dK += dS Q.
    Returns the state and the raw sT of the tile after the stage's last one (the next stage's first, or past
    N_Q: rows read as zeros, never used)."""
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = load_tile(Q, offs_m, offs_d, stride_qm, stride_qd, N_Q, HEAD_DIM, MASKED, PAD_D)
        do = load_tile(DO, offs_m, offs_d, stride_dom, stride_dod, N_Q, HEAD_DIM, MASKED, PAD_D)
        lse2, delta = _rows_stats(LSE, DELTA, offs_m, N_Q, MASKED)
        dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        q_next = load_tile(Q, offs_m + BLOCK_M, offs_d, stride_qm, stride_qd, N_Q, HEAD_DIM, True, PAD_D)
        sT_next = tl.dot(k, tl.trans(q_next), input_precision=DOT_PRECISION)     # only yielded
        pT = _probs(sT_raw, lse2, offs_m, offs_n, N_Q, qk_scale, MASKED, IS_CAUSAL)
        dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        dsT = pT * (dpT - delta[None, :])
        dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=DOT_PRECISION)
        if END_WAIT:
            zs = _end_wait(zs, dsT, k, BLOCK_N, DOT_PRECISION)
        sT_raw = sT_next
    return dk, dv, sT_raw, zs


@triton.jit
def _stage_defer(dk, dv, sT_raw, zs, pT_prev, dsT_prev, k, v, Q, DO, LSE, DELTA,
                 stride_qm, stride_qd, stride_dom, stride_dod,
                 offs_n, offs_d, lo, hi, N_Q, qk_scale,
                 HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAD_D: tl.constexpr,
                 MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                 END_WAIT: tl.constexpr, P_F32: tl.constexpr):
    """(c) One stage in FlashAttention-3's deferred order: each step j issues dpT_j = V dO_j^T (waited at once:
    the body's first wait), then the *previous* tile's dV += pT_{j-1} dO_{j-1} and dK += dsT_{j-1} Q_{j-1}
    (pT, dsT carried, Q_{j-1} and dO_{j-1} loaded again; both only accumulate, so they may stay in flight),
    then sT_{j+1} = K Q_{j+1}^T (only yielded), then the exponentials of sT_j and dsT_j. Three products can
    run under the exponentials (pT, dsT are zeros before the first tile). ``P_F32``: pT and dsT carried in fp32 and rounded at the product (a bf16 / fp16 block
    argument is given to wgmma through shared memory; fp32 keeps the A operand in registers)."""
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        do = load_tile(DO, offs_m, offs_d, stride_dom, stride_dod, N_Q, HEAD_DIM, MASKED, PAD_D)
        lse2, delta = _rows_stats(LSE, DELTA, offs_m, N_Q, MASKED)
        dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        # The previous tile: the stages' tiles are consecutive, so start_m - BLOCK_M (clamped at the very first
        # step, where pT_prev and dsT_prev are zeros); rows past N_Q read zeros.
        offs_p = tl.maximum(start_m - BLOCK_M, 0) + tl.arange(0, BLOCK_M)
        q_p = load_tile(Q, offs_p, offs_d, stride_qm, stride_qd, N_Q, HEAD_DIM, True, PAD_D)
        do_p = load_tile(DO, offs_p, offs_d, stride_dom, stride_dod, N_Q, HEAD_DIM, True, PAD_D)
        dv = tl.dot(pT_prev.to(do_p.dtype), do_p, dv, input_precision=DOT_PRECISION)
        dk = tl.dot(dsT_prev.to(q_p.dtype), q_p, dk, input_precision=DOT_PRECISION)
        q_next = load_tile(Q, offs_m + BLOCK_M, offs_d, stride_qm, stride_qd, N_Q, HEAD_DIM, True, PAD_D)
        sT_next = tl.dot(k, tl.trans(q_next), input_precision=DOT_PRECISION)     # only yielded
        pT = _probs(sT_raw, lse2, offs_m, offs_n, N_Q, qk_scale, MASKED, IS_CAUSAL)
        dsT = pT * (dpT - delta[None, :])
        if END_WAIT:
            zs = _end_wait(zs, dsT, k, BLOCK_N, DOT_PRECISION)
        if P_F32:
            pT_prev = pT
            dsT_prev = dsT
        else:
            pT_prev = pT.to(do.dtype)
            dsT_prev = dsT.to(do.dtype)
        sT_raw = sT_next
    return dk, dv, sT_raw, zs, pT_prev, dsT_prev


@triton.jit
def _dkdv_pipe_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, DQ,                  # step 06's _bwd_dkdv_kernel's parameters, in order
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    H, N_Q, N_K, scale, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr, ATOMIC_DQ: tl.constexpr, DOT_PRECISION: tl.constexpr,
    EARLY_DP: tl.constexpr, HEADS_FIRST: tl.constexpr,
    PIPE: tl.constexpr = 0,                                # 0 step 06's loop, 1 sT pipelined, 2 + dV / dK deferred
    END_WAIT: tl.constexpr = False,                        # PIPE 1, 2: a dummy product that waits at the step's end
    P_F32: tl.constexpr = True,                            # PIPE 2: pT, dsT carried in fp32
    TMA_DQ: tl.constexpr = False,                          # step 06's launcher passes it (dq_mode "atomic_tma"): unused
):
    """Step 06's ``_bwd_dkdv_kernel`` (same arguments, same pointer set-up, same stage split: masked diagonal,
    unmasked body, masked tail) with the loop chosen by PIPE; PIPE=0 calls step 06's own ``_dkdv_tile``."""
    tl.static_assert(not ATOMIC_DQ and not TMA_DQ)
    scale = tl.cast(scale, tl.float32)
    qk_scale = tl.cast(qk_scale, tl.float32)
    if HEADS_FIRST:
        pid_n = tl.program_id(1)
        bh = tl.program_id(0)
    else:
        pid_n = tl.program_id(0)
        bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    Q += b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    K += b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
    V += b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh
    DO += b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
    DK += b.to(tl.int64) * stride_dkb + h.to(tl.int64) * stride_dkh
    DV += b.to(tl.int64) * stride_dkb + h.to(tl.int64) * stride_dkh
    DQ += b.to(tl.int64) * stride_dqb + h.to(tl.int64) * stride_dqh
    LSE += bh.to(tl.int64) * N_Q
    DELTA += bh.to(tl.int64) * N_Q
    start_n = pid_n * BLOCK_N
    if PIPE == 0:
        _dkdv_tile(Q, K, V, DO, LSE, DELTA, DK, DV, DQ,
                   stride_qm, stride_qd, stride_kn, stride_kd, stride_vn, stride_vd,
                   stride_dom, stride_dod, stride_dkn, stride_dkd, stride_dqm, stride_dqd,
                   start_n, N_Q, N_K, scale, qk_scale,
                   HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_D, IS_CAUSAL, ATOMIC_DQ, DOT_PRECISION, EARLY_DP)
    else:
        # Step 06's _dkdv_tile with one sT pipeline through its three stages.
        PAD_D: tl.constexpr = BLOCK_D != HEAD_DIM
        offs_n = start_n + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        k = load_tile(K, offs_n, offs_d, stride_kn, stride_kd, N_K, HEAD_DIM, True, PAD_D)
        v = load_tile(V, offs_n, offs_d, stride_vn, stride_vd, N_K, HEAD_DIM, True, PAD_D)
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        q_full = (N_Q // BLOCK_M) * BLOCK_M
        if IS_CAUSAL:
            lo = (start_n // BLOCK_M) * BLOCK_M
            diag_end = tl.minimum(tl.cdiv(start_n + BLOCK_N - 1, BLOCK_M) * BLOCK_M, N_Q)
        else:
            lo = 0
            diag_end = 0
        tail = tl.maximum(diag_end, q_full)
        # The stages' query tiles are consecutive (lo, lo + BLOCK_M, ...): the first stage's first tile is lo.
        offs_lo = lo + tl.arange(0, BLOCK_M)
        q_lo = load_tile(Q, offs_lo, offs_d, stride_qm, stride_qd, N_Q, HEAD_DIM, True, PAD_D)
        sT_raw = tl.dot(k, tl.trans(q_lo), input_precision=DOT_PRECISION)
        zs = tl.zeros([BLOCK_N], tl.float32)
        if PIPE == 1:
            dk, dv, sT_raw, zs = _stage_pipe(
                dk, dv, sT_raw, zs, k, v, Q, DO, LSE, DELTA, stride_qm, stride_qd, stride_dom, stride_dod,
                offs_n, offs_d, lo, diag_end, N_Q, qk_scale,
                HEAD_DIM, BLOCK_M, BLOCK_N, PAD_D, True, IS_CAUSAL, DOT_PRECISION, END_WAIT)
            dk, dv, sT_raw, zs = _stage_pipe(
                dk, dv, sT_raw, zs, k, v, Q, DO, LSE, DELTA, stride_qm, stride_qd, stride_dom, stride_dod,
                offs_n, offs_d, diag_end, q_full, N_Q, qk_scale,
                HEAD_DIM, BLOCK_M, BLOCK_N, PAD_D, False, IS_CAUSAL, DOT_PRECISION, END_WAIT)
            dk, dv, sT_raw, zs = _stage_pipe(
                dk, dv, sT_raw, zs, k, v, Q, DO, LSE, DELTA, stride_qm, stride_qd, stride_dom, stride_dod,
                offs_n, offs_d, tail, N_Q, N_Q, qk_scale,
                HEAD_DIM, BLOCK_M, BLOCK_N, PAD_D, True, IS_CAUSAL, DOT_PRECISION, END_WAIT)
        else:
            if P_F32:
                pT_prev = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
                dsT_prev = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
            else:
                pT_prev = tl.zeros([BLOCK_N, BLOCK_M], DO.dtype.element_ty)
                dsT_prev = tl.zeros([BLOCK_N, BLOCK_M], DO.dtype.element_ty)
            dk, dv, sT_raw, zs, pT_prev, dsT_prev = _stage_defer(
                dk, dv, sT_raw, zs, pT_prev, dsT_prev, k, v, Q, DO, LSE, DELTA,
                stride_qm, stride_qd, stride_dom, stride_dod, offs_n, offs_d, lo, diag_end, N_Q, qk_scale,
                HEAD_DIM, BLOCK_M, BLOCK_N, PAD_D, True, IS_CAUSAL, DOT_PRECISION, END_WAIT, P_F32)
            dk, dv, sT_raw, zs, pT_prev, dsT_prev = _stage_defer(
                dk, dv, sT_raw, zs, pT_prev, dsT_prev, k, v, Q, DO, LSE, DELTA,
                stride_qm, stride_qd, stride_dom, stride_dod, offs_n, offs_d, diag_end, q_full, N_Q, qk_scale,
                HEAD_DIM, BLOCK_M, BLOCK_N, PAD_D, False, IS_CAUSAL, DOT_PRECISION, END_WAIT, P_F32)
            dk, dv, sT_raw, zs, pT_prev, dsT_prev = _stage_defer(
                dk, dv, sT_raw, zs, pT_prev, dsT_prev, k, v, Q, DO, LSE, DELTA,
                stride_qm, stride_qd, stride_dom, stride_dod, offs_n, offs_d, tail, N_Q, N_Q, qk_scale,
                HEAD_DIM, BLOCK_M, BLOCK_N, PAD_D, True, IS_CAUSAL, DOT_PRECISION, END_WAIT, P_F32)
            # Epilogue: the last tile's dV and dK: the tiles run from lo to N_Q, so the last one holds row N_Q - 1
            # (if no tile ran, pT_prev and dsT_prev are zeros). (A loop-carried start of the previous tile
            # instead made Triton's pipeliner give up on the loops: no multi-buffered loads, every wgmma waited.)
            offs_p = tl.maximum((N_Q - 1) // BLOCK_M * BLOCK_M, 0) + tl.arange(0, BLOCK_M)
            q_p = load_tile(Q, offs_p, offs_d, stride_qm, stride_qd, N_Q, HEAD_DIM, True, PAD_D)
            do_p = load_tile(DO, offs_p, offs_d, stride_dom, stride_dod, N_Q, HEAD_DIM, True, PAD_D)
            dv = tl.dot(pT_prev.to(do_p.dtype), do_p, dv, input_precision=DOT_PRECISION)
            dk = tl.dot(dsT_prev.to(q_p.dtype), q_p, dk, input_precision=DOT_PRECISION)
        if END_WAIT:
            dk = dk + zs[:, None]                          # exact zeros: keeps the dummy products alive
        dk_ptrs = DK + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd
        dv_ptrs = DV + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd
        in_range = (offs_n[:, None] < N_K) & (offs_d[None, :] < HEAD_DIM)
        tl.store(dk_ptrs, (dk * scale).to(DK.dtype.element_ty), mask=in_range)
        tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=in_range)


# %% Variants, rows, launching --------------------------------------------------------------------------------

VARIANTS = {
    "control": dict(PIPE=CONTROL),                                    # (a) step 06's _dkdv_tile, as launched
    "pipe": dict(PIPE=PIPE_S),                                        # (b) sT_{j+1} after dpT_j, before the exp2
    "pipe-end": dict(PIPE=PIPE_S, END_WAIT=True),                     # (b) + a wait at the step's end
    "defer": dict(PIPE=DEFER, P_F32=True),                            # (c) dV, dK of tile j-1 deferred (FA3 order)
    "defer-end": dict(PIPE=DEFER, P_F32=True, END_WAIT=True),         # (d) (c) + a wait at the step's end
}
T32x64 = dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=4, maxnreg=128)    # step 06's table (causal D=64)
T32x128 = dict(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=4, maxnreg=128)
# Rows compiled (--aot-check) and timed (--out): name -> (variant, tiles). EARLY_DP and HEADS_FIRST: step 06's
# table at the leaderboard shape (False, True when causal) on every row.
ROWS = {}
for _t, _tiles in (("32x64 w4 r128", T32x64), ("32x128 w8 r128", T32x128)):
    for _v in VARIANTS:
        ROWS[f"{_v} {_t}"] = (_v, _tiles)
# Without the register cap (what each form needs), and between: 168 lets three 4-warp programs share an SM.
_U64, _U128 = ({k: v for k, v in t.items() if k != "maxnreg"} for t in (T32x64, T32x128))
for _v in ("pipe", "pipe-end", "defer", "defer-end"):
    ROWS[f"{_v} 32x64 w4"] = (_v, _U64)
ROWS["pipe-end 32x64 w4 r168"] = ("pipe-end", dict(T32x64, maxnreg=168))
ROWS["defer-end 32x64 w4 r168"] = ("defer-end", dict(T32x64, maxnreg=168))
ROWS["pipe-end 32x128 w8"] = ("pipe-end", _U128)
ROWS["defer-end 32x128 w8"] = ("defer-end", _U128)

LAUNCH_OPTS = ("num_warps", "num_stages", "maxnreg")


class Launch:
    """A launch of ``_dkdv_pipe_kernel`` made from a recorded launch of step 06's ``_bwd_dkdv_kernel`` (its grid,
    arguments and options as step 06's ``backward()`` gave them), with fresh dK / dV, the row's tiles and the
    variant's flags. Calling it runs it and returns (dK, dV)."""

    def __init__(self, s06_launch, variant, tiles):
        _, _, _, args, kwargs = s06_launch
        args = list(args)
        self.dk, self.dv = torch.empty_like(args[6]), torch.empty_like(args[7])
        args[6], args[7] = self.dk, self.dv
        kw = dict(kwargs)
        for o in LAUNCH_OPTS:
            kw.pop(o, None)
        kw.update(tiles)
        kw.update(VARIANTS[variant])
        if os.environ.get("TRITON_INTERPRET") == "1":
            kw.pop("maxnreg", None)
        B, H = self.dk.shape[0], self.dk.shape[1]
        n_k = args[35]
        tiles_n = triton.cdiv(n_k, kw["BLOCK_N"])
        self.grid = (B * H, tiles_n) if kw.get("HEADS_FIRST") else (tiles_n, B * H)
        self.kernel, self.args, self.kwargs = _dkdv_pipe_kernel, tuple(args), kw

    def __call__(self):
        self.kernel[self.grid](*self.args, **self.kwargs)
        return self.dk, self.dv


def step06_record(q, k, v, o, lse, do, causal, config=None, run=True):
    """Step 06's ``backward()`` (dq_mode "separate") recorded: ``(dkdv launch, (dQ, dK, dV))``. ``config``: its
    table is used when None; ``run=False`` records without launching (the compile report)."""
    scale = q.shape[-1] ** -0.5
    log, out = record_launches(S6, lambda: S6.backward(q, k, v, o, lse, do, causal, scale, config=config,
                                                       dq_mode="separate"), run=run)
    (dkdv,) = [x for x in log if x[0] == "_bwd_dkdv_kernel"]
    return dkdv, out


def small_config(tiles):
    """A step 06 config for the interpreter with the dK/dV tiles given (dQ / preprocess: small tiles)."""
    small = dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)
    return dict(dkdv=dict(tiles, EARLY_DP=False, HEADS_FIRST=True), dq=small, pre=dict(BLOCK_M=16),
                dq_mode="separate")


# %% Checks ----------------------------------------------------------------------------------------------

# --small / the test: Triton's interpreter on a CPU, fp16 and fp32 (bf16 dots are wrong there). (B, H, Nq, Nk, D):
# partial tiles everywhere, Nq != Nk both ways, a padded head dim (24 -> 32), fewer queries than one query tile.
SMALL_SHAPES = [(1, 1, 100, 70, 16), (1, 1, 45, 100, 24), (1, 1, 20, 40, 16)]
# Interpreter tiles: BLOCK_N / BLOCK_M = 2 (the table's ratio) and 4 (several diagonal steps).
SMALL_TILES = [dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1),
               dict(BLOCK_M=16, BLOCK_N=64, num_warps=4, num_stages=1)]
MARGIN = {torch.float16: 1e-3, torch.bfloat16: 1e-3, torch.float32: 1e-5}


def check_case(variant, tiles, shape, dtype, causal, device, config=None, inputs=None, s06_cache=None):
    """One variant against the float64 reference and against step 06's own kernels at the same dK/dV tiles:
    ``dict(ok, dk_err, dv_err, dk_err_s06, dv_err_s06, vs_s06)``; errors max|x - ref| / max|ref|. ok: finite,
    inside the course's tolerance for the dtype (attnlib.compare) and at most 2 x step 06's error + MARGIN.
    ``s06_cache``: a dict keeping step 06's run per (inputs, tiles), shared by the variants checked on them."""
    from attnlib import make_dout, make_qkv, reference_attention, reference_backward
    B, H, nq, nk, d = shape
    if inputs is None:
        q, k, v = make_qkv(B, H, nq, nk, d, dtype=dtype, device=device, seed=nq * 1000 + nk + d)
        do = make_dout(q, seed=1)
        o64, lse64 = reference_attention(q, k, v, is_causal=causal)
        ref = dict(zip(("dQ", "dK", "dV"), reference_backward(q, k, v, do, causal)))
        inputs = (q, k, v, do, o64.to(dtype), lse64.float().contiguous(), ref)
    q, k, v, do, o, lse, ref = inputs
    cfg = config or small_config(tiles)
    key = (id(q), causal, tuple(sorted(tiles.items())))
    if s06_cache is None or key not in s06_cache:
        rec = step06_record(q, k, v, o, lse, do, causal, cfg)
        if s06_cache is None:
            s06_cache = {}
        s06_cache[key] = rec
    launch, (_, dk6, dv6) = s06_cache[key]
    dk, dv = Launch(launch, variant, tiles)()
    if device == "cuda":
        torch.cuda.synchronize()
    e = errors({"dK": dk, "dV": dv}, ref, dtype)
    e6 = errors({"dK": dk6, "dV": dv6}, ref, dtype)
    vs = max(float((dk.double() - dk6.double()).abs().max()), float((dv.double() - dv6.double()).abs().max()))
    ok = all(e[n]["bad"] == 0 and e[n]["err"] <= 2 * e6[n]["err"] + MARGIN[dtype] for n in ("dK", "dV"))
    return dict(ok=bool(ok), dk_err=e["dK"]["err"], dv_err=e["dV"]["err"], dk_err_s06=e6["dK"]["err"],
                dv_err_s06=e6["dV"]["err"], vs_s06=vs, bad=e["dK"]["bad"] + e["dV"]["bad"])


def small_check(variants=None, shapes=SMALL_SHAPES, tiles_list=SMALL_TILES, dtypes=(torch.float16, torch.float32),
                verbose=True):
    """Every variant against the float64 reference at small sizes (the interpreter on a CPU, compiled on a GPU):
    a list of failure lines (empty: all pass). ``dtypes`` may map a dtype to the tiles to run it on."""
    from attnlib import make_dout, make_qkv, reference_attention, reference_backward
    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    failures, refs, s06 = [], {}, {}
    for name in variants or VARIANTS:
        for dtype in dtypes:
            for tiles in (dtypes[dtype] if isinstance(dtypes, dict) else tiles_list):
                for shape in shapes:
                    for causal in (False, True):
                        key = (shape, str(dtype), causal)
                        if key not in refs:
                            B, H, nq, nk, d = shape
                            q, k, v = make_qkv(B, H, nq, nk, d, dtype=dtype, device=device, seed=nq * 1000 + nk + d)
                            do = make_dout(q, seed=1)
                            o64, lse64 = reference_attention(q, k, v, is_causal=causal)
                            ref = dict(zip(("dQ", "dK", "dV"), reference_backward(q, k, v, do, causal)))
                            refs[key] = (q, k, v, do, o64.to(dtype), lse64.float().contiguous(), ref)
                        r = check_case(name, tiles, shape, dtype, causal, device, inputs=refs[key], s06_cache=s06)
                        line = (f"{'ok  ' if r['ok'] else 'FAIL'} {name:10} {tiles['BLOCK_M']:>3}x{tiles['BLOCK_N']:<3} "
                                f"{str(shape):22} {str(dtype)[6:]:8} causal={causal!s:5}  dK err {r['dk_err']:.1e} "
                                f"(step 06 {r['dk_err_s06']:.1e})  dV err {r['dv_err']:.1e} (step 06 "
                                f"{r['dv_err_s06']:.1e})  vs step 06 {r['vs_s06']:.1e}")
                        if not r["ok"]:
                            failures.append(line + f"  [{r['bad']} elements out of tolerance]")
                        if verbose:
                            print(line, flush=True)
    return failures


# %% --aot-check -------------------------------------------------------------------------------------------

LB = dict(B=1, H=16, N=16384, D=64)           # the CS336 leaderboard shape


def lb_config(causal, n=LB["N"], d=LB["D"], bh=LB["B"] * LB["H"]):
    """Step 06's table for an H200 at the leaderboard shape (the device type pinned to cuda: the compile report and
    the GPU check record step 06's launch with these tiles)."""
    return dict(S6.bwd_config(n, n, d, torch.bfloat16, causal, "cuda", bh), dq_mode="separate")


AOT_HEADER = (f"{'row':<27}{'regs':>5}{'spill':>10}{'smem':>6}{'CTA':>4}{'warps':>6}{'serial':>10}{'HGMMA':>6}"
              f"{'EX2 under wgmma':>18}  TTGIR loop (unmasked stage) | SASS loop (unmasked stage)")


def aot_line(name, i):
    """One compile report line. EX2 under wgmma: per SASS loop (diagonal / body / tail), the MUFU.EX2 issued while a
    wgmma is outstanding : all MUFU.EX2 of the loop (triton_fwd_pipelined.sass_loops)."""
    sl = i.get("sass_loops") or []
    under = "/".join(f"{x['ex2_in_flight']}:{x['ex2']}" for x in sl) or "?"
    tt = i.get("ttgir_loops") or ["?"]
    body_tt = tt[1] if len(tt) == 3 else tt[0]
    body_sl = (sl[1] if len(sl) == 3 else sl[0])["schedule"] if sl else "?"
    sp = f"{i.get('spill_stores', '?')}/{i.get('spill_loads', '?')}"
    return (f"{name[:26]:<27}{i.get('regs', '?'):>5}{sp:>10}{i['shared_bytes'] // 1024:>5}K{i.get('ctas_per_sm', '?'):>4}"
            f"{i.get('warps_per_sm', '?'):>6}{serial_codes(i):>10}{i.get('sass_HGMMA', '?'):>6}"
            f" {under:>17}  {body_tt} | {body_sl}")


def serial_codes(i):
    """ptxas's reasons for serializing every wgmma of the kernel: C7512 (insufficient register resources), C7514
    (non-wgmma instructions reading a wgmma's accumulator before its wait), C7515 (... defining one); "no" if none."""
    codes = sorted({c for w in i.get("ptxas_warnings", []) for c in ("C7512", "C7514", "C7515") if c in w})
    return "+".join(c[1:] for c in codes) if codes else ("YES" if i.get("serialized") else "no")


def aot_main(args, rows):
    """Compile step 06's own dK/dV kernel (its table, as ``backward()`` launches it) and every row for sm_90a at the
    leaderboard shape, causal and not; print registers, spills, shared memory, programs per SM, ptxas's
    serialization warning, EX2 under wgmma and the body loop's schedule (TTGIR and SASS)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("--aot-check compiles for sm_90: unset TRITON_INTERPRET")
        return 1
    B, H, N, D = (LB[x] for x in "BHND")
    print(f"Compiled for sm_90a (no GPU; Triton {triton.__version__}'s bundled ptxas) at B={B} H={H} N={N} D={D} bf16.\n"
          "regs: per thread (ptxas -v); spill: bytes stored/loaded; CTA / warps: programs / warps per SM that registers\n"
          "and shared memory allow; serial: ptxas serialized every wgmma of the kernel (it then waits for each before the\n"
          "next), and why: 7512 'insufficient register resources', 7514 'non wgmma instructions reading accumulator\n"
          "registers of a wgmma between start and end of the pipeline stage', 7515 the same with 'defining'; EX2 under wgmma: per SASS loop (diagonal / body / tail stage), the MUFU.EX2\n"
          "issued while a wgmma is outstanding : all MUFU.EX2 of the loop (program order from the loop's top).\n"
          "TTGIR: D(s) wgmma with A from shared memory, D(r) A from registers, Wn wait leaving n in flight, EX2 exp2s.\n"
          "SASS: Hs/Hr HGMMA runs (xN), Wn WARPGROUP.DEPBAR.LE gsb0 n, EXn n MUFU.EX2, mov a copy of an in-flight\n"
          "accumulator (the loop as ptxas lays it out: it may start mid-iteration).\n")
    report, failures = {}, 0
    causals = (True, False) if not args.causal_only else (True,)
    for causal in causals:
        q = torch.empty(B, H, N, D, dtype=torch.bfloat16)
        lse = torch.empty(B, H, N, dtype=torch.float32)
        s06, _ = step06_record(q, q, q, q, lse, q, causal, lb_config(causal), run=False)
        c = lb_config(causal)["dkdv"]
        print(f"{'causal' if causal else 'not causal'} (EARLY_DP={c.get('EARLY_DP', True)}, "
              f"HEADS_FIRST={c.get('HEADS_FIRST', False)} on every row, as step 06's table):")
        print(AOT_HEADER)
        items = [(f"step06 itself {c['BLOCK_M']}x{c['BLOCK_N']} w{c['num_warps']}", (s06[1], s06[2], s06[3], s06[4]))]
        for name, (variant, tiles) in rows.items():
            ln = Launch(s06, variant, tiles)
            items.append((name, (ln.kernel, ln.grid, ln.args, ln.kwargs)))
        failures += aot_rows(items, report, "causal" if causal else "full", aot_line)
    return aot_finish(report, failures, args.out, "dkdv_pipelined_aot.json", T0)


# %% --out DIR: the GPU run ----------------------------------------------------------------------------------

CHECK_SHAPE = (2, 16, 1008, 1008, 64)   # B, H, Nq, Nk, D: partial last tiles (1008 = 31*32 + 16 = 15*64 + 48 = 7*128 + 112),
                                        # every length and stride a multiple of 16, H = 16: the leaderboard shape's
                                        # Triton specialization, so the check compiles what the timing runs


def row_config(causal, tiles, n=LB["N"]):
    """Step 06's table at the leaderboard shape with the dK/dV tiles replaced by a row's (EARLY_DP, HEADS_FIRST
    kept): the check runs step 06 itself at the row's tiles next to the row."""
    cfg = lb_config(causal)
    cfg["dkdv"] = dict({x: y for x, y in cfg["dkdv"].items() if x not in LAUNCH_OPTS}, **tiles)
    return cfg


def check_job(job):
    """One row's check (a pool worker on the GPU; in-process with --smoke): the row and step 06 at the same
    tiles against the float64 reference. Compiling it fills Triton's on-disk cache for the timing process.
    ``job``: (row name, causal, device, dtype name, (B, H, Nq, Nk, D))."""
    name, causal, device, dtype, shape = job
    variant, tiles = ROWS[name]
    t = time.time()
    try:
        r = check_case(variant, tiles, shape, getattr(torch, dtype), causal, device,
                       config=row_config(causal, tiles) if device == "cuda" else small_config(tiles))
    except Exception as e:  # noqa: BLE001 - a row that fails to compile or run is reported, not timed
        r = dict(ok=False, error=f"{type(e).__name__}: {first_line(e, 300)}")
    r["seconds"] = round(time.time() - t, 1)
    return job, r


def run_checks(log, jobs, workers, deadline):
    """Every job's check, in a pool of spawned processes (one CUDA context each; in this process when workers <= 1):
    ``{(row, causal): result}``."""
    from bench.experiments import triton_dkdv_pipelined as mod     # the timing imports this name too: one cache key
    results = {}

    def note(job, r):
        name, causal = job[:2]
        results[(name, causal)] = r
        what = (f"dK err {r['dk_err']:.2e} dV err {r['dv_err']:.2e} (step 06 at these tiles {r['dk_err_s06']:.2e} "
                f"{r['dv_err_s06']:.2e}; max |row - step 06| {r['vs_s06']:.1e})") if "dk_err" in r else r.get("error")
        log(f"check {'causal' if causal else 'full  '} {name:<28} {'ok ' if r['ok'] else 'BAD'} {what} "
            f"[{r['seconds']:.0f} s]")

    if workers <= 1:
        for job in jobs:
            if time.time() > deadline:
                break
            note(*mod.check_job(job))
        return results
    import multiprocessing as mp
    try:
        with mp.get_context("spawn").Pool(workers) as pool:
            it = pool.imap_unordered(mod.check_job, jobs, chunksize=1)
            for _ in jobs:
                note(*it.next(timeout=max(1.0, deadline - time.time())))
    except mp.TimeoutError:
        log(f"check phase stopped at its deadline: {len(jobs) - len(results)} checks unfinished (not timed)")
    return results


def gpu_main(args, rows):
    """Check every row (causal and not, bf16, CHECK_SHAPE) against the float64 reference and step 06 at the same
    tiles, then time step 06's own dK/dV kernel (as its ``backward()`` launches it, the table's tiles) and every
    checked row at the leaderboard shape, causal; DIR/dkdv_pipelined.json and .log."""
    import subprocess as sp
    import threading

    from bench.core import machine_info
    from bench.experiments import triton_dkdv_pipelined as mod     # the kernels by the workers' module name
    smoke = args.smoke
    if not smoke and not torch.cuda.is_available():
        print("--out times on a GPU (an H200: sm_90); none here. --small and --aot-check run on a CPU "
              "(and --smoke runs this plan's code in the interpreter at tiny sizes).")
        return 2
    # --smoke: this plan on a CPU, in Triton's interpreter: fp16, tiny shapes, one call's wall clock as the "time"
    # (it checks the script, not the kernels' speed).
    device, dtype = ("cpu", torch.float16) if smoke else ("cuda", torch.bfloat16)
    lb = dict(B=1, H=2, N=192, D=64) if smoke else LB
    check_shape = (1, 2, 80, 80, 64) if smoke else CHECK_SHAPE
    from bench.experiments.triton_fwd_pipelined import Log
    log = Log(args.out, "dkdv_pipelined", T0)          # DIR/dkdv_pipelined.json and .log, after every line
    try:
        commit = sp.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = None
    cap = torch.cuda.get_device_capability() if device == "cuda" else (0, 0)
    log.data["meta"] = dict(machine_info(), commit=commit, argv=sys.argv, budget_s=args.budget_s, smoke=smoke,
                            capability=f"{cap[0]}{cap[1]}", dtype=str(dtype), timed_shape=dict(lb, causal=True),
                            check_shape=check_shape, rows={n: dict(variant=v, tiles=t) for n, (v, t) in rows.items()},
                            variants=VARIANTS)
    log(f"{log.data['meta']['gpu']} (sm_{log.data['meta']['capability']}), torch {torch.__version__}, triton "
        f"{triton.__version__}, commit {commit}" + ("; SMOKE: interpreter, fp16, tiny shapes" if smoke else ""))
    if device == "cuda" and cap < (9, 0):
        log("not a Hopper GPU: the kernels run (mma.sync instead of wgmma), but the question is about wgmma")
    hard = threading.Timer(args.budget_s + 30, lambda: (log("hard limit: stopping"), os._exit(3)))
    hard.daemon = True
    hard.start()

    # 1. Check (and compile) every row, causal and not; the timing skips any row that is not right.
    jobs = [(name, causal, device, str(dtype)[6:], check_shape) for causal in (True, False) for name in rows]
    checks = run_checks(log, jobs, 1 if smoke else args.workers, T0 + 0.55 * args.budget_s)
    log.data["checks"] = {f"{'causal' if c else 'full'} {n}": r for (n, c), r in checks.items()}
    log.flush()

    # 2. Time at the leaderboard shape, causal: step 06's own dK/dV kernel, every checked row, step 06 again.
    def bench(fn):
        if smoke:
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3
        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))

    from attnlib import make_dout, make_qkv
    B, H, N, D = (lb[x] for x in "BHND")
    q, k, v = make_qkv(B, H, N, N, D, dtype=dtype, device=device, seed=0)
    do = make_dout(q, seed=1)
    o, lse = S5.forward(q, k, v, True, D ** -0.5)
    cfg = lb_config(True) if not smoke else small_config(T32x64)
    s06, _ = step06_record(q, k, v, o, lse, do, True, cfg)       # runs step 06's backward once (its D for all rows)
    _, kern06, grid06, a06, kw06 = s06
    flops = 4 * 2.0 * B * H * N * N * D / 2                      # dK/dV's four products, causal
    shape = f"B={B} H={H} N={N} D={D} {str(dtype)[6:]} causal"
    c = cfg["dkdv"]
    ms06 = bench(lambda: kern06[grid06](*a06, **kw06))
    log.data["rows"].append(dict(row="step06 dK/dV (its table)", config=c, ms=ms06, tflops=round(flops / ms06 / 1e9, 1)))
    log(f"{shape}: step06 dK/dV (its table {c['BLOCK_M']}x{c['BLOCK_N']} w{c['num_warps']} s{c['num_stages']} "
        f"maxnreg={c.get('maxnreg')}) {ms06:.3f} ms {flops / ms06 / 1e9:.1f} TFLOP/s")
    for name, (variant, tiles) in rows.items():
        if time.time() - T0 > args.budget_s:
            log(f"budget of {args.budget_s:.0f} s spent: no more rows")
            break
        chk = checks.get((name, True))
        if not chk or not chk["ok"]:
            log(f"{name:<28} not timed: check {'did not finish' if not chk else 'failed'}")
            continue
        ln = mod.Launch(s06, variant, tiles)
        try:
            ms = bench(ln)
        except Exception as e:  # noqa: BLE001
            log(f"{name:<28} {type(e).__name__}: {first_line(e, 200)}")
            continue
        r = dict(row=name, variant=variant, config=dict(tiles, **VARIANTS[variant]), ms=ms,
                 tflops=round(flops / ms / 1e9, 1), x_step06=round(ms06 / ms, 3))
        log.data["rows"].append(r)
        log(f"{name:<28} {ms:7.3f} ms {r['tflops']:6.1f} TFLOP/s  x step06 {r['x_step06']}")
    again = bench(lambda: kern06[grid06](*a06, **kw06))
    log.data["rows"].append(dict(row="step06 dK/dV again (drift)", ms=again))
    log(f"step06 dK/dV again {again:.3f} ms (first {ms06:.3f})")
    log.data["meta"]["total_s"] = round(time.time() - T0, 1)
    log(f"done in {time.time() - T0:.0f} s: {args.out / 'dkdv_pipelined.json'}")
    hard.cancel()
    return 0


def _cli():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="a CPU: Triton's interpreter, every variant vs the reference")
    ap.add_argument("--aot-check", action="store_true", help="no GPU: compile for sm_90a and report")
    ap.add_argument("--causal-only", action="store_true", help="--aot-check: the causal rows only")
    ap.add_argument("--out", type=Path, help="GPU run: folder for dkdv_pipelined.json and .log (--aot-check: its JSON)")
    ap.add_argument("--variants", default=None, help="comma-separated row names (default: all of ROWS)")
    ap.add_argument("--budget-s", type=float, default=140, help="GPU run: start no new row after this many seconds")
    ap.add_argument("--workers", type=int, default=8, help="GPU run: processes for the check / compile phase")
    ap.add_argument("--smoke", action="store_true",
                    help="with --out: the GPU run's code on a CPU (interpreter, fp16, tiny shapes, no real timing)")
    return ap


def pick_rows(ap, spec):
    if not spec:
        return dict(ROWS)
    names = [x.strip() for x in spec.split(",") if x.strip()]
    unknown = [x for x in names if x not in ROWS]
    if unknown:
        ap.error(f"unknown rows {unknown}; known: {list(ROWS)}")
    return {n: ROWS[n] for n in names}


def main(argv=None):
    ap = _cli()
    args = ap.parse_args(argv)
    rows = pick_rows(ap, args.variants)
    if args.small:
        failures = small_check(sorted({v for v, _ in rows.values()}, key=list(VARIANTS).index))
        print(f"{len(failures)} failed; {time.time() - T0:.0f} s")
        return 1 if failures else 0
    if args.aot_check:
        return aot_main(args, rows)
    if not args.out:
        ap.error("give --small, --aot-check or --out DIR")
    return gpu_main(args, rows)


if __name__ == "__main__":
    from bench.experiments import triton_dkdv_pipelined as _this     # one module name for the pool's workers
    _this.T0 = T0
    sys.exit(_this.main())
