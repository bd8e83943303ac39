"""Experiment: software-pipelining step 05's forward loop by hand -- does Triton 3.6 keep S_{j+1} in flight across the softmax?

Question. Compiled for sm_90, step 05's loop over key tiles (solutions/step05_triton_fwd.py, ``_fwd_inner``) is
``D(s) W0 D(r)``: S = Q K^T issued as a wgmma and waited for at once (``pendings = 0``), the softmax while the
tensor cores idle, then P V issued and left in flight into the next iteration. At the CS336 leaderboard shape
(B=1, H=16, N=16384, D=64, bf16, causal) it runs 1.26 ms on an H200 against cuDNN's ~1.2 ms forward
(results/h200/triton/lb_5ms_1201_1711.json); two programs per SM (122 registers) hide part of the gap.
FlashAttention-3's intra-warpgroup overlap keeps a product on the tensor cores while the exponentials run.
Can Triton 3.6 express that by software-pipelining the loop by hand (the next tile's S computed in this
iteration and carried into the next), does its compiler keep that wgmma in flight across the exponentials,
and does it pay? (``triton_fwd_overlap.py`` asked the first half for the simplest form, S_{j+1} issued first
in the unmasked stage only: no, Triton waits at once. This file tries the forms that Triton's rules allow,
through both stages, reads ptxas's verdict and the SASS too, and prepares the timing.)

Answer: no form pays; step 05's kernel stays as it is. Measured on one H200 (2026-12-01 ~19:15 UTC, torch
2.11.0+cu130, Triton 3.6.0, commit c7087a7; results/h200/triton/fwd_pipelined_1201_1915.json and .log): every
row's O and LSE errors equal to step 05's at the same tiles (36 checks, B=2 H=16 N=1008), and every pipelined
form slower than step 05's own kernel at every shape timed. At the leaderboard shape (B=1 H=16 N=16384 D=64 bf16
causal) step 05's table ran 1.206 ms (1.283 ms at the run's end; cuDNN 1.214), the control at its tiles 1.303;
pipe 128x64 w8 1.695 ms (0.71x step 05), defer 1.987 (0.61x), defer-f32 1.732 (0.70x), defer-end 128x64 w8 1.754
(0.69x; at r128 1.778, 0.68x), defer-end 128x32 w8 1.729 (0.70x; its control at 128x32 1.540, 0.78x), defer-end
64x64 w4 1.678 (0.72x) and the fastest, defer-end 64x64 w4 r168, 1.567 (0.77x; its control 1.395). Not causal:
step 05 2.465 ms, the best pipelined form 0.81x (defer-end 64x64 w4 r168, 3.045). D=128: the best is defer-end
128x64 w8, 0.885x step 05 causal (2.481 against 2.196 ms) and 0.899x not (4.771 against 4.288). At the same
tiles and the same programs per SM the overlap form still loses to its control (128x32 w8, two per SM: 0.89x;
64x64 w4 r168 against 64x64 w4: 0.89x): the wgmma kept in flight does not buy back its extra work and registers
where a second program per SM already fills the gaps. The CPU evidence below (compile reports, no GPU) says
why the forms look as they do: Triton 3.6 *can* be made to keep the product in flight -- but not in the form (b)
that the question names, only in FlashAttention-3's order with a dummy product that makes it wait before the
loop's back edge, (d) below -- at a cost in registers.

The kernel (``_fwd_pipe_kernel``): step 05's ``_attn_fwd_kernel`` (its helpers ``load_tile``, ``store_tile``,
``key_range``, ``finish_rows`` and, for the control, ``_fwd_inner``, imported from solutions/), the same causal
stage split (unmasked tiles, then the masked diagonal / last partial tile), HEADS_FIRST, base-2 exponentials
with qk_scale folded in, the same LSE. The loop is picked by the constexpr ``PIPE`` (and two flags):

  (a) control    PIPE=0: step 05's ``_fwd_inner`` for both stages (the same code as step 05's kernel: the
                 compile report gives both the same registers and schedule).
  (b) pipe       PIPE=1: a prologue computes S_0 = Q K_0^T; each step issues S_{j+1} first (K_{j+1} loaded with
                 a row mask: past the keys it reads zeros), then the softmax of S_j, the rescale and P_j V_j.
                 S is carried raw (unscaled, unmasked) and scaled / masked where it is used. One S pipeline
                 runs through both stages: the unmasked stage's last step issues S of the masked stage's first
                 tile. The last step's S (past the last tile) is thrown away: one extra Q K^T per program.
  (c) defer      PIPE=2: FlashAttention-3's order. Each step first adds P_{j-1} V_{j-1} (P of the previous
                 tile, carried; zeros before the first tile, with V of tile 0), then issues S_{j+1}, then the
                 softmax of S_j and acc *= alpha_j (the rescale now after the product it used to precede);
                 after both stages, P V of the last tile. Carrying P in bf16 makes it a loop block argument,
                 which Triton gives wgmma through shared memory (AccelerateMatmul's ``comesFromLoadOrBlockArg``).
      defer-f32  + ``P_F32``: P carried in fp32 and rounded at the product, so wgmma reads it from registers.
  (d) defer-end  + ``END_WAIT``: at the end of each step a product of exact zeros (BLOCK_M x 16 @ 16 x 16,
                 A = l_i * 0 so it is not hoisted) whose result the loop reads (l_i += rowsum, + 0): Triton
                 waits for it at once, and that wait also retires S_{j+1} before the loop's back edge.

The math is step 05's, operation for operation (in the interpreter, fp16 and fp32, every variant's O and LSE are
bitwise step 05's at the same tiles). Extra work: (b)-(d) one Q K^T past the last tile per program; (c)-(d) one
P V with P = 0 per program; (d) one 64x16x16 wgmma per warpgroup per step.

Why (b) cannot work and (c) can (Triton 3.6, lib/Dialect/TritonGPU/Transforms/Pipeliner/WGMMAPipeline.cpp,
``dotCanBeProperlyAsync``): a wgmma in a loop is left in flight ("properly async") only if its result is used
by nothing in the loop but the yield, and, in the next iteration, only as another wgmma's accumulator or only
after the body's first ``warp_group_dot_wait {pendings = 0}``; every other wgmma gets ``pendings = 0`` right
after it. In (b) nothing waits before the softmax of S_j, so S_{j+1} is waited at once: ``D(s) W0``. In (c)
P_{j-1} V_{j-1} is used in its own iteration (the rescale), so it is waited at once, and that wait, placed
before S_{j+1} is issued, is the one the softmax of S_j follows: the TTGIR has ``D(r) W0 D(s) EX2``, nothing
waiting between S_{j+1} and the exponentials. But then ptxas serializes every wgmma of the kernel (warning
C7514, "non wgmma instructions reading accumulator registers of a wgmma between start and end of the
pipeline stage"): the loop-carried S needs a register copy at the back edge (S_{j+1} is written while S_j is
still read, so they cannot share registers), and that copy reads the accumulator before its wait, which is
the next iteration's. (d) moves a wait to the end of the iteration, after the exponentials: no warning, and in
the SASS the exponentials of tile j are interleaved with the HGMMAs of P_{j-1} V_{j-1} and S_{j+1}.

CPU evidence (``--aot-check``, 2026-12-01, Triton 3.6.0 and its bundled ptxas, sm_90a, no GPU; B=1 H=16
N=16384 D=64 bf16 causal, HEADS_FIRST as step 05's table). "EX2 in flight": per SASS loop (unmasked stage /
masked stage), the MUFU.EX2 issued while a wgmma is outstanding, of all MUFU.EX2 of the loop. The SASS column is
ptxas's layout of the unmasked loop (it may start mid-iteration): Hs / Hr HGMMA with A from shared memory /
registers, Wn a wait leaving n in flight, EXn n MUFU.EX2.

    row                       regs  spill CTA/SM serial EX2 in flight  TTGIR loop               SASS loop
    step05 itself (table)      122    0/0    2      no   0:34/0:34   D(s) W0 EX2 D(r)          Hsx4 W0 EX34 Hrx4
    control 128x64 w8          122    0/0    2      no   0:34/0:34   D(s) W0 EX2 D(r)          Hsx4 W0 EX34 Hrx4
    pipe 128x64 w8             172    0/0    1      no   0:34/0:34   D(s) W0 EX2 D(r)          Hsx4 W0 EX34 Hrx4
    defer 128x64 w8            181    0/0    1     YES  21:34/11:34  D(s) W0 D(s) EX2          Hs W0 Hs EX8 W0 ... (a wait after each HGMMA)
    defer-f32 128x64 w8        186    0/0    1     YES  27:34/30:34  D(r) W0 D(s) EX2          Hr W0 Hr W0 Hr EX3 W0 ...
    defer-end 128x64 w8        184    0/0    1      no  33:34/31:34  D(r) W0 D(s) EX2 D(r) W0  Hrx2 EX4 Hr EX7 Hr EX10 W0 EX1 Hs EX9 Hs EX3 Hsx2 Hr W0
    defer-end 128x64 w8 r128   128 188/112   2      no  34:34/34:34  (same)                    Hrx4 W0 Hs EX3 Hs EX23 Hs EX8 Hs Hr W0
    control 128x32 w8          108    0/0    2      no   0:18/0:18   D(s) W0 EX2 D(r)          Hsx4 W0 EX18 Hrx2
    defer-end 128x32 w8        124    0/0    2      no  17:18/18:18  D(r) W0 D(s) EX2 D(r) W0  Hrx2 EX8 W0 EX1 Hs EX7 Hs EX2 Hsx2 Hr W0
    control 64x64 w4           124    0/0    4      no   0:34/0:34   D(s) W0 EX2 D(r)          Hsx4 W0 EX34 Hrx4
    defer-end 64x64 w4         190    0/0    2      no  33:34/31:34  (as 128x64)
    defer-end 64x64 w4 r168    164    0/0    3      no  33:34/31:34  (as 128x64)

So: (b) is step 05's schedule with 50 more registers (one program per SM instead of two): no overlap, only the
loss. (c) gets the overlap in the TTGIR and loses it, and every other overlap, to ptxas's serialization. (d) is
the one form where the compiler keeps a wgmma in flight across the exponentials: 33 of the 34 MUFU.EX2 of an
iteration are issued while P_{j-1} V_{j-1} or S_{j+1} is on the tensor cores (step 05: 0 of 34). Its price:
at step 05's 128x64 tiles 184 registers, one 8-warp program per SM (step 05: two), or 188 bytes of spills at
a 128-register cap; at 128x32 tiles 124 registers, no spills, two programs per SM (17 of 18 in flight); at
64x64 on 4 warps 190 registers (two 4-warp programs), 164 at a 168 cap (three). Not causal and D=128 alike
(D=128: 255 registers at 128x64, 170 at 128x32; step 05's own 128x128 table tile is already at 255 with 4 B
spilled causal). Whether any of it pays was the GPU's question: the overlap inside one program against the
second program per SM that step 05 uses to fill the same gaps; the answer above says it does not. Not tried
here: Gluon (``triton.experimental.gluon``, in Triton 3.6: ``warpgroup_mma(..., is_async=True)``, ``warpgroup_mma_wait(num_outstanding=...)``), which states the
waits by hand (the carried S would still need its back-edge copy after a wait, or the loop unrolled by two).

How to run:

    python bench/experiments/triton_fwd_pipelined.py --small           # a CPU, interpreter: every variant vs the float64
                                                                       #   reference, fp16 and fp32 (~1 min); exit 1 if any fails
    python bench/experiments/triton_fwd_pipelined.py --aot-check       # no GPU: compile for sm_90a, the report above (~45 s)
    python bench/experiments/triton_fwd_pipelined.py --out DIR         # an H200 (under 3 min; --budget-s 150 by default)
    python bench/experiments/triton_fwd_pipelined.py --out DIR --smoke # a CPU: the GPU plan's code, interpreter, tiny sizes
    pytest tests/test_experiment_fwd_pipelined.py                      # the variants vs the reference (interpreter on a CPU)

``--aot-check --out DIR`` also writes every row's facts to DIR/fwd_pipelined_aot.json.

The GPU run (``--out DIR``): (1) check, in a pool of processes (``--workers``, 8) that also compiles every kernel
into Triton's on-disk cache: every row of ``ROWS`` (D=64: the table above; D=128: control at 128x128 (step 05's
table), 128x64, 128x32, 64x64 w4 and defer-end at the last three), causal and not, at B=2 H=16 N=1008 bf16
(partial tiles; the leaderboard shape's Triton specialization), O and LSE against the float64 reference and
against step 05 at the same tiles: within the course's bf16 tolerance and at most twice step 05's error + 1e-3,
or the row is not timed. (2) Time (``triton.testing.do_bench``, median, rep 100 ms) at B=1 H=16 N=16384, D=64
causal (the leaderboard) and not, then D=128 causal and not: step 05's own ``forward`` (its table), SDPA's
cuDNN and FLASH backends, every checked row, step 05 again (drift); "x step05" = step 05's time / the row's.
No row starts after ``--budget-s``; a watchdog stops the run 30 s later. Writes DIR/fwd_pipelined.json
(machine, date, versions, commit, rows, checks) and DIR/fwd_pipelined.log, both after every line.
What to read first: "defer-end 128x32 w8" and "defer-end 64x64 w4 r168" against "control 128x64 w8 (table)"
at the leaderboard shape, and "control 128x32 w8" (the tile alone).
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

S5 = load_step(5, "solutions")
load_tile, store_tile, key_range, finish_rows, _fwd_inner = (
    S5.load_tile, S5.store_tile, S5.key_range, S5.finish_rows, S5._fwd_inner)

# What PIPE selects (a constexpr of the kernel).
CONTROL, PIPE_S, DEFER_PV = 0, 1, 2


# %% The kernel ------------------------------------------------------------------------------------------

@triton.jit
def _scores(s_raw, offs_m, offs_n, N_K, qk_scale, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr):
    """Step 05's scores from a raw Q K^T tile: times qk_scale (base 2), -inf where masked."""
    s = s_raw * qk_scale
    if MASKED:
        visible = offs_n[None, :] < N_K
        if IS_CAUSAL:
            visible = visible & (offs_n[None, :] <= offs_m[:, None])
        s = tl.where(visible, s, float("-inf"))
    return s


@triton.jit
def _softmax_rows(s, m_i, l_i):
    """Step 05's online-softmax update of one tile's scores: ``(p, alpha, l_i, m_new)``, fp32."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    return p, alpha, l_i, m_new


@triton.jit
def _stage_pipe_s(acc, l_i, m_i, s_raw, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                  offs_m, offs_d, lo, hi, N_K, qk_scale,
                  HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, PAD_D: tl.constexpr,
                  MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """(b) One stage, S pipelined: ``s_raw`` holds Q K^T of tile ``lo`` (unscaled) on entry; each step
    issues S of the next tile first, then the softmax of this tile, the rescale and P V of this tile.
    Returns the state and the raw S of the tile after the stage's last one: the next stage's first tile,
    or, past the last tile, a product of zero rows that nothing uses."""
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        v = load_tile(V, offs_n, offs_d, stride_vn, stride_vd, N_K, HEAD_DIM, MASKED, PAD_D)
        # The next tile may be the masked stage's first (partial) tile or past the keys: rows masked.
        k_next = load_tile(K, offs_n + BLOCK_N, offs_d, stride_kn, stride_kd, N_K, HEAD_DIM, True, PAD_D)
        s_next = tl.dot(q, tl.trans(k_next), input_precision=DOT_PRECISION)   # only yielded: scaled where used
        s = _scores(s_raw, offs_m, offs_n, N_K, qk_scale, MASKED, IS_CAUSAL)
        p, alpha, l_i, m_i = _softmax_rows(s, m_i, l_i)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        s_raw = s_next
    return acc, l_i, m_i, s_raw


@triton.jit
def _stage_defer_pv(acc, l_i, m_i, s_raw, p_prev, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                    offs_m, offs_d, lo, hi, N_K, qk_scale,
                    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, PAD_D: tl.constexpr,
                    MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
                    P_F32: tl.constexpr, END_WAIT: tl.constexpr, BLOCK_M: tl.constexpr):
    """(c) One stage in FlashAttention-3's order: each step first adds P V of the *previous* tile
    (``p_prev``, zeros before the first tile), then issues S of the next tile, then does the softmax of
    this tile and rescales acc by its alpha (the rescale deferred past the P V it now follows).

    Why this order: Triton 3.6 (WGMMAPipeline.cpp, ``dotCanBeProperlyAsync``) leaves a product in flight
    across the loop's back edge only if its result is used just by the yield and, next iteration, only
    after the first ``warp_group_dot_wait {pendings = 0}`` of the body (or only as another product's
    accumulator). In (b) nothing waits before the softmax, so S_{j+1} gets a wait of its own at once.
    Here P V of the previous tile is used in the same iteration (the rescale), so it is waited at once,
    and that wait, placed before S_{j+1} is issued, is the one the softmax of S_j follows.

    ``P_F32``: carry P in fp32 (a bf16 / fp16 block argument is given to wgmma through shared memory).
    ``END_WAIT``: without it ptxas serializes every wgmma of the kernel (C7514): S_{j+1}, carried, is copied
    at the back edge while still in flight. The dummy product at the end makes Triton wait there first."""
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        # The previous tile: never the last one, so whole; before the very first tile, tile 0 (P is 0
        # there), which only the masked stage can meet partial (N_K < BLOCK_N): rows checked there.
        prev_n = tl.multiple_of(tl.maximum(start_n - BLOCK_N, 0), BLOCK_N)
        v_prev = load_tile(V, prev_n + tl.arange(0, BLOCK_N), offs_d, stride_vn, stride_vd, N_K, HEAD_DIM,
                           MASKED, PAD_D)
        acc = tl.dot(p_prev.to(v_prev.dtype), v_prev, acc, input_precision=DOT_PRECISION)
        k_next = load_tile(K, offs_n + BLOCK_N, offs_d, stride_kn, stride_kd, N_K, HEAD_DIM, True, PAD_D)
        s_next = tl.dot(q, tl.trans(k_next), input_precision=DOT_PRECISION)
        s = _scores(s_raw, offs_m, offs_n, N_K, qk_scale, MASKED, IS_CAUSAL)
        p, alpha, l_i, m_i = _softmax_rows(s, m_i, l_i)
        acc = acc * alpha[:, None]
        if END_WAIT:
            # A 16-column product of exact zeros whose result the loop reads: Triton waits for it at once
            # (pendings = 0), and that wait also retires S_{j+1} before the loop's back edge copies it.
            z_a = (l_i[:, None] * 0.0 + tl.zeros([BLOCK_M, 16], tl.float32)).to(v_prev.dtype)   # l_i is finite
            z = tl.dot(z_a, tl.zeros([16, 16], v_prev.dtype), input_precision=DOT_PRECISION)
            l_i = l_i + tl.sum(z, 1)
        if P_F32:
            p_prev = p
        else:
            p_prev = p.to(v_prev.dtype)
        s_raw = s_next
    return acc, l_i, m_i, s_raw, p_prev


@triton.jit
def _fwd_pipe_kernel(
    Q, K, V, O, LSE,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    H, N_Q, N_K, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
    PIPE: tl.constexpr,                                    # 0 control (step 05's loop), 1 S pipelined, 2 + P V deferred
    HEADS_FIRST: tl.constexpr = False,
    P_F32: tl.constexpr = False,                           # PIPE 2: carry P in fp32 (rounded at the product)
    END_WAIT: tl.constexpr = False,                        # PIPE 2: a dummy product that retires S_{j+1} at the end
):
    """Step 05's ``_attn_fwd_kernel`` with the loop over key tiles chosen by PIPE; the rest is step 05's."""
    PAD_D: tl.constexpr = BLOCK_D != HEAD_DIM
    qk_scale = tl.cast(qk_scale, tl.float32)
    TILE_AXIS: tl.constexpr = 1 if HEADS_FIRST else 0
    pid_m = tl.program_id(TILE_AXIS)
    if IS_CAUSAL:
        pid_m = tl.num_programs(TILE_AXIS) - 1 - pid_m
    bh = tl.program_id(1 - TILE_AXIS)
    b = bh // H
    h = bh % H
    Q += b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    K += b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
    V += b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh
    O += b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
    LSE += bh.to(tl.int64) * N_Q

    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_tile(Q, offs_m, offs_d, stride_qm, stride_qd, N_Q, HEAD_DIM, True, PAD_D)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    hi_full, hi = key_range(start_m, N_K, BLOCK_M, BLOCK_N, IS_CAUSAL)

    if PIPE == 0:
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                                   offs_m, offs_d, 0, hi_full, N_K, qk_scale,
                                   HEAD_DIM, BLOCK_N, PAD_D, False, IS_CAUSAL, DOT_PRECISION)
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                                   offs_m, offs_d, hi_full, hi, N_K, qk_scale,
                                   HEAD_DIM, BLOCK_N, PAD_D, True, IS_CAUSAL, DOT_PRECISION)
    else:
        # Prologue: S of tile 0, the first tile of whichever stage runs first. One S pipeline runs
        # through both stages: the unmasked stage's last step issues S of the masked stage's first tile.
        offs_n0 = tl.arange(0, BLOCK_N)
        k0 = load_tile(K, offs_n0, offs_d, stride_kn, stride_kd, N_K, HEAD_DIM, True, PAD_D)
        s_raw = tl.dot(q, tl.trans(k0), input_precision=DOT_PRECISION)
        if PIPE == 1:
            acc, l_i, m_i, s_raw = _stage_pipe_s(
                acc, l_i, m_i, s_raw, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                offs_m, offs_d, 0, hi_full, N_K, qk_scale, HEAD_DIM, BLOCK_N, PAD_D, False, IS_CAUSAL, DOT_PRECISION)
            acc, l_i, m_i, s_raw = _stage_pipe_s(
                acc, l_i, m_i, s_raw, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                offs_m, offs_d, hi_full, hi, N_K, qk_scale, HEAD_DIM, BLOCK_N, PAD_D, True, IS_CAUSAL, DOT_PRECISION)
        else:
            if P_F32:
                p_prev = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            else:
                p_prev = tl.zeros([BLOCK_M, BLOCK_N], q.dtype)
            acc, l_i, m_i, s_raw, p_prev = _stage_defer_pv(
                acc, l_i, m_i, s_raw, p_prev, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                offs_m, offs_d, 0, hi_full, N_K, qk_scale, HEAD_DIM, BLOCK_N, PAD_D, False, IS_CAUSAL, DOT_PRECISION,
                P_F32, END_WAIT, BLOCK_M)
            acc, l_i, m_i, s_raw, p_prev = _stage_defer_pv(
                acc, l_i, m_i, s_raw, p_prev, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                offs_m, offs_d, hi_full, hi, N_K, qk_scale, HEAD_DIM, BLOCK_N, PAD_D, True, IS_CAUSAL, DOT_PRECISION,
                P_F32, END_WAIT, BLOCK_M)
            # Epilogue: P V of the last tile (the largest multiple of BLOCK_N below hi; hi >= 1).
            last_n = ((hi - 1) // BLOCK_N) * BLOCK_N
            v_last = load_tile(V, last_n + tl.arange(0, BLOCK_N), offs_d, stride_vn, stride_vd, N_K, HEAD_DIM,
                               True, PAD_D)
            acc = tl.dot(p_prev.to(v_last.dtype), v_last, acc, input_precision=DOT_PRECISION)

    o, lse = finish_rows(acc, l_i, m_i)
    store_tile(O, o, offs_m, offs_d, stride_om, stride_od, N_Q, HEAD_DIM)
    tl.store(LSE + offs_m, lse, mask=offs_m < N_Q)


# %% Launching ---------------------------------------------------------------------------------------------

LOG2E = 1.4426950408889634


class Launch:
    """One launch of ``_fwd_pipe_kernel``, kept so it can be run again (timing) or compiled without a GPU."""

    def __init__(self, q, k, v, causal, pipe, cfg, scale=None):
        self.q, self.k, self.v = (S5.as_bhnd(t) for t in (q, k, v))
        B, H, nq, d = self.q.shape
        nk = self.k.shape[2]
        self.o = torch.empty_like(self.q)
        self.lse = torch.empty(B * H, nq, dtype=torch.float32, device=q.device)
        cfg = dict(cfg)
        heads_first = bool(cfg.pop("HEADS_FIRST", False))
        grid = (triton.cdiv(nq, cfg["BLOCK_M"]), B * H)
        self.grid = grid[::-1] if heads_first else grid
        scale = d ** -0.5 if scale is None else scale
        self.args = (self.q, self.k, self.v, self.o, self.lse, *self.q.stride(), *self.k.stride(), *self.v.stride(),
                     *self.o.stride(), H, nq, nk, scale * LOG2E)
        self.kwargs = dict(HEAD_DIM=d, BLOCK_D=S5._pow2_dim(d), IS_CAUSAL=bool(causal),
                           DOT_PRECISION=S5._dot_precision(q.dtype), PIPE=pipe, HEADS_FIRST=heads_first, **cfg)
        if os.environ.get("TRITON_INTERPRET") == "1":
            self.kwargs.pop("maxnreg", None)
        self.kernel = _fwd_pipe_kernel

    def __call__(self):
        _fwd_pipe_kernel[self.grid](*self.args, **self.kwargs)
        return self.o, self.lse


# %% Compile report (no GPU) -------------------------------------------------------------------------------

def ttgir_loops(ttgir):
    """Per ``scf.for`` of the TTGIR (in order), its products, waits and exponentials as a short string:
    ``D(s)`` a wgmma whose A operand is read from shared memory, ``D(r)`` from registers, ``Wn`` a
    ``warp_group_dot_wait`` leaving n in flight, ``EX2`` a run of ``math.exp2``."""
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
                elif "math.exp2" in s and (not toks or toks[-1] != "EX2"):
                    toks.append("EX2")
                j += 1
            out.append(" ".join(toks))
            i = j
        i += 1
    return out


_SASS_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def sass_loops(sass):
    """The loops of a cuobjdump SASS listing (a backward branch and its target), innermost last, each as
    ``dict(schedule, ex2, ex2_in_flight, hgmma, waits)``. The schedule: ``Hs`` / ``Hr`` a run of HGMMA
    (A from shared memory / registers), ``Wn`` a ``WARPGROUP.DEPBAR.LE gsb0, n`` (wait until at most n
    wgmma groups are in flight), ``EXn`` a run of n ``MUFU.EX2``, ``mov`` a run of register copies of
    the accumulator of a product still in flight. ``ex2_in_flight``: how many of the loop's EX2 come
    after an HGMMA with no ``DEPBAR.LE gsb0, 0x0`` between (the exponentials the tensor cores can overlap;
    counted in program order, from the loop's top, so a product left in flight across the back edge
    is not counted)."""
    ins = [(int(a, 16), t) for a, t in _SASS_LINE.findall(sass)]
    loops = []
    for addr, text in ins:
        m = re.search(r"\bBRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            loops.append((int(m.group(1), 16), addr))
    out = []
    for lo, hi in loops:
        toks, in_flight, ex2, ex2_in, hg, waits, acc_regs = [], False, 0, 0, 0, [], set()
        for addr, text in ins:
            if not lo <= addr <= hi:
                continue
            if text.startswith("@"):
                text = text.split(None, 1)[1]                     # drop the predicate
            op, _, operands = text.partition(" ")
            parts = [p.strip() for p in operands.split(",")]
            if op.startswith("HGMMA"):
                hg += 1
                kind = "Hs" if len(parts) > 1 and parts[1].startswith("gdesc") else "Hr"
                dst, shape = re.match(r"R(\d+)", parts[0]), re.search(r"\.\d+x(\d+)x\d+", op)
                if dst and shape:                                 # m64nNk16: N/2 fp32 accumulators a thread
                    acc_regs = set(range(int(dst.group(1)), int(dst.group(1)) + int(shape.group(1)) // 2))
                in_flight = True
                if toks and toks[-1][0] == kind:
                    toks[-1][1] += 1
                else:
                    toks.append([kind, 1])
            elif op.startswith("WARPGROUP.DEPBAR"):
                m = re.search(r"0x([0-9a-f]+)", operands)
                n = int(m.group(1), 16) if m else -1
                waits.append(n)
                if n == 0:
                    in_flight = False
                toks.append([f"W{n}", 1])
            elif op.startswith("MUFU.EX2"):
                ex2 += 1
                ex2_in += in_flight
                if toks and toks[-1][0] == "EX":
                    toks[-1][1] += 1
                else:
                    toks.append(["EX", 1])
            elif in_flight and "MOV" in op and not op.startswith("UMOV") and acc_regs:
                srcs = [int(r) for r in re.findall(r"\bR(\d+)\b", ",".join(parts[1:]))]
                if any(r in acc_regs for r in srcs) and not (toks and toks[-1][0] == "mov"):
                    toks.append(["mov", 1])
        sched = " ".join(k + (str(n) if k == "EX" else (f"x{n}" if n > 1 and k in ("Hs", "Hr") else ""))
                         for k, n in toks)
        out.append(dict(schedule=sched, ex2=ex2, ex2_in_flight=ex2_in, hgmma=hg, waits=waits))
    return out


SM90_REGS, SM90_SMEM, SM90_WARPS = 65536, 233472, 64


from bench.experiments.gpu_run import triton_tool as _triton_tool  # noqa: E402  (the ptxas Triton compiles with)


def aot_compile(kernel, grid, args, kwargs, capability=90):
    """Compile one launch for sm_90 without a GPU (as triton_dkdv_variants.aot_compile does, on CPU tensors
    of the same dtypes, shapes and alignment), run the bundled ptxas, and return facts about the code:
    registers, spills, shared memory, programs per SM, ptxas's own warnings (``C7514``: it serialized
    every wgmma of the kernel), the TTGIR loops and the SASS loops."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature
    target = GPUTarget("cuda", capability, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, spec, opts = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, spec, opts)
    t = time.time()
    ck = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target, options=options.__dict__)
    info = dict(compile_s=round(time.time() - t, 1), shared_bytes=ck.metadata.shared, num_warps=options.num_warps,
                num_stages=options.num_stages, maxnreg=options.maxnreg, ptxas_warnings=[])
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
            info["ptxas_warnings"] = [re.sub(r"\s+in the function '\w+'", "", ln.split(":", 1)[-1].strip())
                                      for ln in r.stderr.splitlines() if "(C7" in ln or "arning" in ln]
        cuobjdump = _triton_tool("cuobjdump")
        if cuobjdump and "cubin" in ck.asm:
            cub = Path(tmp) / "k.cubin"
            cub.write_bytes(ck.asm["cubin"])
            sass = subprocess.run([cuobjdump, "-sass", str(cub)], capture_output=True, text=True).stdout
            info["sass_loops"] = sass_loops(sass)
            for op in ("HGMMA", "MUFU.EX2"):
                info[f"sass_{op}"] = len(re.findall(r"\b" + re.escape(op) + r"\b", sass))
    info["serialized"] = any("C7514" in w or "serialized" in w for w in info["ptxas_warnings"])
    if "regs" in info:
        w = info["num_warps"]
        per_warp = math.ceil(info["regs"] * 32 / 256) * 256
        by_regs = SM90_REGS // (per_warp * w)
        by_smem = SM90_SMEM // (info["shared_bytes"] + 1024)
        info["ctas_per_sm"] = max(0, min(by_regs, by_smem, SM90_WARPS // w, 32))
        info["warps_per_sm"] = info["ctas_per_sm"] * w
    info["ttgir_loops"] = ttgir_loops(ck.asm.get("ttgir", ""))
    return info


# %% Variants ----------------------------------------------------------------------------------------------

# The loop variants: kernel flags on top of step 05's kernel (``_fwd_pipe_kernel``).
VARIANTS = {
    "control": dict(PIPE=CONTROL),                                      # (a) step 05's _fwd_inner, both stages
    "pipe": dict(PIPE=PIPE_S),                                          # (b) S_{j+1} issued before the softmax
    "defer": dict(PIPE=DEFER_PV),                                       # (c) P_{j-1} V_{j-1}, S_{j+1}, softmax, rescale
    "defer-f32": dict(PIPE=DEFER_PV, P_F32=True),                       # (c) with P carried in fp32
    "defer-end": dict(PIPE=DEFER_PV, P_F32=True, END_WAIT=True),        # (d) (c) + a wait at the iteration's end
}

TILE_128x64 = dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
TILE_128x32 = dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=3)
TILE_64x64 = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)
TILE_128x128 = dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3)

# The rows compiled (--aot-check) and timed (--out) at each head dim, in order of interest: name -> (variant,
# tiles). "table" is step 05's dense_fwd_config on an H200 (HEADS_FIRST as the table sets it, for every row).
ROWS = {
    64: {
        "control 128x64 w8 (table)": ("control", TILE_128x64),
        "pipe 128x64 w8": ("pipe", TILE_128x64),
        "defer 128x64 w8": ("defer", TILE_128x64),
        "defer-f32 128x64 w8": ("defer-f32", TILE_128x64),
        "defer-end 128x64 w8": ("defer-end", TILE_128x64),
        "defer-end 128x64 w8 r128": ("defer-end", dict(TILE_128x64, maxnreg=128)),
        "control 128x32 w8": ("control", TILE_128x32),
        "defer-end 128x32 w8": ("defer-end", TILE_128x32),
        "control 64x64 w4": ("control", TILE_64x64),
        "defer-end 64x64 w4": ("defer-end", TILE_64x64),
        "defer-end 64x64 w4 r168": ("defer-end", dict(TILE_64x64, maxnreg=168)),
    },
    128: {
        "control 128x128 w8 (table)": ("control", TILE_128x128),
        "control 128x64 w8": ("control", TILE_128x64),
        "defer-end 128x64 w8": ("defer-end", TILE_128x64),
        "control 128x32 w8": ("control", TILE_128x32),
        "defer-end 128x32 w8": ("defer-end", TILE_128x32),
        "control 64x64 w4": ("control", TILE_64x64),
        "defer-end 64x64 w4": ("defer-end", TILE_64x64),
    },
}

# Step 05's table on an H200 (dense_fwd_config needs a GPU to ask for its shared memory at D=128): the
# heaviest query tiles of every head first when causal at D <= 64.
def table_heads_first(d, causal):
    return bool(causal and d <= 64)


def launch_row(q, k, v, causal, variant, tiles, heads_first=False, scale=None):
    """A ``Launch`` of one row: the variant's flags on the tiles (and HEADS_FIRST)."""
    cfg = dict(tiles, **{f: val for f, val in VARIANTS[variant].items() if f != "PIPE"})
    if heads_first:
        cfg["HEADS_FIRST"] = True
    return Launch(q, k, v, causal, VARIANTS[variant]["PIPE"], cfg, scale)


# %% Checks ----------------------------------------------------------------------------------------------

# --small: Triton's interpreter on a CPU, fp16 and fp32 (bf16 dots are wrong there). Shapes (B, H, Nq, Nk, D)
# with partial tiles everywhere: Nq != Nk both ways, lengths not multiples of the tiles, D padded (24 -> 32),
# and fewer keys than one key tile (the unmasked stage empty, the "previous tile" clamped to a partial tile 0).
SMALL_SHAPES = [(1, 2, 70, 100, 16), (1, 2, 100, 45, 24), (1, 1, 40, 20, 16)]
# Interpreter tiles: BLOCK_M > BLOCK_N (several masked tiles), =, < (a stage boundary inside a key tile).
SMALL_TILES = [dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=1),
               dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1),
               dict(BLOCK_M=16, BLOCK_N=32, num_warps=4, num_stages=1)]


def check_case(variant, tiles, shape, dtype, causal, device, heads_first=False, with_step05=True, inputs=None):
    """One variant at one shape against the float64 reference: ``dict(ok, o_err, lse_err, ...)``, errors as
    max |x - ref| (O's relative to max |ref|); ``ok``: every element within the course's tolerance for the
    dtype (attnlib.compare), no NaN / Inf. ``with_step05``: also step 05's own forward at the same tiles
    (``o_err_s05``, ``lse_err_s05``) and the largest differences between the two (``o_vs_s05``, ``lse_vs_s05``).
    ``inputs``: ``(q, k, v, ref_o, ref_lse)`` to reuse (else drawn from the shape and a fixed seed)."""
    from attnlib import make_qkv, reference_attention
    from attnlib.compare import measure, tolerance_for
    B, H, nq, nk, d = shape
    if inputs is None:
        q, k, v = make_qkv(B, H, nq, nk, d, dtype=dtype, device=device, seed=nq * 1000 + nk + d)
        ref_o, ref_lse = reference_attention(q, k, v, is_causal=causal)
    else:
        q, k, v, ref_o, ref_lse = inputs
    o, lse = launch_row(q, k, v, causal, variant, tiles, heads_first)()
    lse = lse.view(B, H, nq)
    atol, rtol = tolerance_for(dtype)
    scale_o = float(ref_o.abs().max())

    def err(a, b, rel=1.0):
        return float((a.double() - b.double()).abs().max()) / rel

    bad_o = int(measure(o, ref_o, atol, rtol)[3].sum())
    bad_lse = int(measure(lse, ref_lse, atol, rtol)[3].sum())
    finite = bool(torch.isfinite(o).all() and torch.isfinite(lse).all())
    r = dict(ok=finite and bad_o == 0 and bad_lse == 0, bad_o=bad_o, bad_lse=bad_lse,
             o_err=err(o, ref_o, scale_o), lse_err=err(lse, ref_lse))
    if with_step05:
        s5_cfg = {x: tiles[x] for x in ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")}
        o5, lse5 = S5.forward(q, k, v, causal, d ** -0.5, config=dict(s5_cfg, HEADS_FIRST=heads_first))
        r.update(o_err_s05=err(o5, ref_o, scale_o), lse_err_s05=err(lse5.view(B, H, nq), ref_lse),
                 o_vs_s05=err(o, o5, scale_o), lse_vs_s05=err(lse, lse5.view(B, H, nq)))
    return r


def small_check(variants=None, shapes=SMALL_SHAPES, tiles_list=SMALL_TILES, dtypes=(torch.float16, torch.float32),
                with_step05=True, verbose=True):
    """Every variant against the float64 reference at small sizes: a list of failure lines (empty: all pass).
    Under Triton's interpreter (TRITON_INTERPRET=1) on a CPU; without it, compiled on the GPU (the same sizes).
    ``dtypes`` may map a dtype to the tiles to run it on."""
    from attnlib import make_qkv, reference_attention
    device = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("no GPU: run with TRITON_INTERPRET=1 (--small sets it)")
    failures, refs = [], {}
    for name in variants or VARIANTS:
        for dtype in dtypes:
            for tiles in (dtypes[dtype] if isinstance(dtypes, dict) else tiles_list):
                for shape in shapes:
                    for causal in (False, True):
                        key = (shape, str(dtype), causal)
                        if key not in refs:
                            B, H, nq, nk, d = shape
                            q, k, v = make_qkv(B, H, nq, nk, d, dtype=dtype, device=device, seed=nq * 1000 + nk + d)
                            refs[key] = (q, k, v, *reference_attention(q, k, v, is_causal=causal))
                        r = check_case(name, tiles, shape, dtype, causal, device, with_step05=with_step05,
                                       inputs=refs[key])
                        line = (f"{'ok  ' if r['ok'] else 'FAIL'} {name:10} {tiles['BLOCK_M']:>3}x{tiles['BLOCK_N']:<3} "
                                f"{str(shape):22} {str(dtype)[6:]:8} causal={causal!s:5}  O err {r['o_err']:.1e}")
                        if with_step05:
                            line += f" (step 05 {r['o_err_s05']:.1e}, vs step 05 {r['o_vs_s05']:.1e})"
                        line += f"  LSE err {r['lse_err']:.1e}"
                        if with_step05:
                            line += f" (step 05 {r['lse_err_s05']:.1e}, vs step 05 {r['lse_vs_s05']:.1e})"
                        if not r["ok"]:
                            line += f"  [{r['bad_o']} O / {r['bad_lse']} LSE elements out of tolerance]"
                            failures.append(line)
                        if verbose:
                            print(line, flush=True)
    return failures


# %% --aot-check -------------------------------------------------------------------------------------------

LB = dict(B=1, H=16, N=16384)                 # the CS336 leaderboard shape (D=64) and the D=128 companion


def step05_launch(q, k, v, causal, config):
    """Step 05's own kernel launch (solutions/, ``forward``) with ``config``, recorded, not run:
    ``(kernel, grid, args, kwargs)`` -- so --aot-check compiles step 05 itself next to the control copy."""
    from triton_lb_variants import record_launches
    log, _ = record_launches(S5, lambda: S5.forward(q, k, v, causal, q.shape[-1] ** -0.5, config=config), run=False)
    (_, kern, grid, args, kwargs), = log
    return kern, grid, args, kwargs


AOT_HEADER = (f"{'row':<27}{'regs':>5}{'spill':>8}{'smem':>6}{'CTA':>4}{'warps':>6}{'serial':>7}"
              f"{'HGMMA':>6}{'EX2 in flight':>14}  TTGIR loop (unmasked stage) | SASS loop (unmasked stage)")


def aot_line(name, i):
    sl = i.get("sass_loops") or []
    inflight = "/".join(f"{x['ex2_in_flight']}:{x['ex2']}" for x in sl) or "?"
    sp = f"{i.get('spill_stores', '?')}/{i.get('spill_loads', '?')}"
    return (f"{name[:26]:<27}{i.get('regs', '?'):>5}{sp:>8}{i['shared_bytes'] // 1024:>5}K{i.get('ctas_per_sm', '?'):>4}"
            f"{i.get('warps_per_sm', '?'):>6}{'YES' if i['serialized'] else 'no':>7}{i.get('sass_HGMMA', '?'):>6}"
            f"{inflight:>14}  {(i['ttgir_loops'] or ['?'])[0]} | {sl[0]['schedule'] if sl else '?'}")


def aot_main(args):
    """Compile step 05, the control copy and every variant for sm_90 at the leaderboard shape (D=64) and
    at D=128, causal and not; print registers, spills, shared memory, programs per SM, whether ptxas
    serialized the wgmmas, and the loop schedules (TTGIR and SASS)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("--aot-check compiles for sm_90: unset TRITON_INTERPRET")
        return 1
    dims = [int(x) for x in args.dims.split(",")]
    print(f"Compiled for sm_90a (no GPU; Triton {triton.__version__}'s bundled ptxas) at B={LB['B']} H={LB['H']} "
          f"N={LB['N']} bf16.\n"
          "regs: per thread (ptxas -v); spill: bytes stored/loaded; CTA / warps: programs / warps per SM that registers\n"
          "and shared memory allow; serial: ptxas C7514, 'wgmma.mma_async instructions are serialized' (it then waits\n"
          "for every wgmma before the next); EX2 in flight: per SASS loop (unmasked stage / masked stage), the MUFU.EX2\n"
          "issued while a wgmma is outstanding : all MUFU.EX2 of the loop (program order from the loop's top).\n"
          "TTGIR: D(s) wgmma with A from shared memory, D(r) A from registers, Wn wait leaving n in flight, EX2 exp2s.\n"
          "SASS: Hs/Hr HGMMA runs (xN), Wn WARPGROUP.DEPBAR.LE gsb0 n, EXn n MUFU.EX2, mov a copy of an in-flight\n"
          "accumulator (the loop is laid out by ptxas: it may start mid-iteration).\n")
    report, failures = {}, 0
    for d in dims:
        for causal in (True, False):
            q = torch.empty(LB["B"], LB["H"], LB["N"], d, dtype=torch.bfloat16)
            hf = table_heads_first(d, causal)
            print(f"D={d} {'causal' if causal else 'not causal'} (HEADS_FIRST={hf} on every row, as step 05's table):")
            print(AOT_HEADER)
            items = []
            table = TILE_128x64 if d <= 64 else TILE_128x128
            try:
                items.append(("step05 itself (table)", step05_launch(q, q, q, causal, dict(table, HEADS_FIRST=hf))))
            except Exception as e:  # noqa: BLE001 - the report goes on without it
                print(f"step05 itself: not recorded ({type(e).__name__}: {str(e)[:120]})")
            for name, (variant, tiles) in ROWS[d].items():
                ln = launch_row(q, q, q, causal, variant, tiles, hf)
                items.append((name, (ln.kernel, ln.grid, ln.args, ln.kwargs)))
            failures += aot_rows(items, report, f"D{d} {'causal' if causal else 'full'}")
    return aot_finish(report, failures, args.out, "fwd_pipelined_aot.json", T0)


def aot_rows(items, report, tag, line=None):
    """Compile each ``(name, (kernel, grid, args, kwargs))`` for sm_90 and print its line (``line(name, facts)``,
    this file's ``aot_line`` by default); its facts (or its error) go to ``report[f"{tag} {name}"]``. Returns how
    many failed to compile."""
    line = line or aot_line
    failures = 0
    for name, (kern, grid, a, kw) in items:
        key = f"{tag} {name}"
        try:
            i = aot_compile(kern, grid, a, kw)
            report[key] = i
            print(line(name, i), flush=True)
        except Exception as e:  # noqa: BLE001 - one row that fails to compile is a line, not the end
            failures += 1
            report[key] = f"{type(e).__name__}: {str(e)[:300]}"
            print(f"{name[:26]:<27}FAIL {report[key][:150]}", flush=True)
    print()
    return failures


def aot_finish(report, failures, out, filename, t0):
    """The ptxas warnings seen, the report as DIR/filename when ``out``, the count; the exit status."""
    warned = sorted({w for i in report.values() if isinstance(i, dict) for w in i["ptxas_warnings"]})
    for w in warned:
        print(f"ptxas: {w}")
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / filename).write_text(json.dumps(report, indent=1, default=str) + "\n")
        print(f"wrote {out / filename}")
    print(f"{len(report) - failures} compiled, {failures} failed; {time.time() - t0:.0f} s")
    return 1 if failures else 0


# %% --out DIR: the GPU run ----------------------------------------------------------------------------------

CHECK_SHAPE = (2, 16, 1008, 1008)     # B, H, Nq, Nk: partial last tiles (1008 = 7*128 + 112 = 15*64 + 48), yet every
                                      # length and stride a multiple of 16 and H = 16: the leaderboard shape's
                                      # Triton specialization, so the check compiles what the timing runs


def check_job(job):
    """One row's check on the GPU (a worker process): the row and step 05 at the same tiles against the float64
    reference, bf16, at CHECK_SHAPE. Compiling it fills Triton's on-disk cache for the timing process.
    ``job``: (D, causal, row name, device, dtype name, (B, H, Nq, Nk)); --smoke passes a CPU and fp16."""
    d, causal, name, device, dtype, shape = job
    variant, tiles = ROWS[d][name]
    t = time.time()
    try:
        r = check_case(variant, tiles, (*shape, d), getattr(torch, dtype), causal, device,
                       heads_first=table_heads_first(d, causal))
        # bf16: inside the course's tolerance, and no more than twice step 05's own error at the same tiles.
        r["ok"] = bool(r["ok"] and r["o_err"] <= 2 * r["o_err_s05"] + 1e-3 and r["lse_err"] <= 2 * r["lse_err_s05"] + 1e-3)
    except Exception as e:  # noqa: BLE001 - a row that fails to compile or run is reported, not timed
        r = dict(ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")
    r["seconds"] = round(time.time() - t, 1)
    return job, r


class Log:
    """Print and keep every line; DIR/NAME.json and .log are rewritten after every row (NAME: this experiment's,
    or another's that imports it, with its own start time ``t0``)."""

    def __init__(self, out, name="fwd_pipelined", t0=None):
        self.out, self.name, self.t0 = Path(out), name, T0 if t0 is None else t0
        self.out.mkdir(parents=True, exist_ok=True)
        self.lines, self.data = [], dict(meta={}, checks={}, rows=[])

    def __call__(self, msg):
        msg = f"[{time.time() - self.t0:6.1f}s] {msg}"
        print(msg, flush=True)
        self.lines.append(msg)
        self.flush()

    def flush(self):
        (self.out / f"{self.name}.log").write_text("\n".join(self.lines) + "\n")
        tmp = self.out / f"{self.name}.json.tmp"
        tmp.write_text(json.dumps(self.data, indent=1, default=str) + "\n")
        os.replace(tmp, self.out / f"{self.name}.json")


def run_checks(log, jobs, workers, deadline):
    """Every job's check, in a pool of spawned processes (one CUDA context each); ``{job: result}``."""
    import multiprocessing as mp
    from bench.experiments import triton_fwd_pipelined as mod     # the timing imports this name too: one cache key
    results = {}
    try:
        with mp.get_context("spawn").Pool(workers) as pool:
            it = pool.imap_unordered(mod.check_job, jobs, chunksize=1)
            for _ in jobs:
                job, r = it.next(timeout=max(1.0, deadline - time.time()))
                d, causal, name = job[:3]
                results[(d, causal, name)] = r
                what = (f"O err {r['o_err']:.2e} (step 05 {r['o_err_s05']:.2e}), LSE err {r['lse_err']:.2e} "
                        f"(step 05 {r['lse_err_s05']:.2e})") if "o_err" in r else r.get("error", "?")
                log(f"check D={d} {'causal' if causal else 'full  '} {name:<28} {'ok ' if r['ok'] else 'BAD'} "
                    f"{what} [{r['seconds']:.0f} s]")
    except mp.TimeoutError:
        log(f"check phase stopped at its deadline: {len(jobs) - len(results)} checks unfinished (not timed)")
    return results


def gpu_main(args):
    """Check every row at a small bf16 shape, then time them at the leaderboard shape (and D=128) beside step 05's
    own forward and SDPA's cuDNN and FLASH backends; DIR/fwd_pipelined.json and .log."""
    import subprocess as sp
    import threading

    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from bench.core import machine_info
    from bench.experiments import triton_fwd_pipelined as mod     # the kernels by the workers' module name
    smoke = args.smoke
    if not smoke and not torch.cuda.is_available():
        print("--out times on a GPU (an H200: sm_90); none here. --small and --aot-check run on a CPU "
              "(and --smoke runs this plan's code in the interpreter at tiny sizes).")
        return 2
    # --smoke: this very plan on a CPU, in Triton's interpreter: fp16, tiny shapes, one call's wall clock as the
    # "time" (it checks the script, not the kernels' speed; SDPA's GPU backends fail there and say so).
    device, dtype = ("cpu", torch.float16) if smoke else ("cuda", torch.bfloat16)
    lb = dict(B=1, H=2, N=128) if smoke else LB
    check_shape = (1, 2, 80, 80) if smoke else CHECK_SHAPE
    log = Log(args.out)
    try:
        commit = sp.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = None
    cap = torch.cuda.get_device_capability() if device == "cuda" else (0, 0)
    log.data["meta"] = dict(machine_info(), commit=commit, argv=sys.argv, budget_s=args.budget_s, smoke=smoke,
                            capability=f"{cap[0]}{cap[1]}", dtype=str(dtype),
                            timed_shape=dict(lb, D="64 and 128"), check_shape=check_shape,
                            rows={d: {n: dict(variant=v, tiles=t) for n, (v, t) in r.items()} for d, r in ROWS.items()},
                            variants=VARIANTS)
    log(f"{log.data['meta']['gpu']} (sm_{log.data['meta']['capability']}), torch {torch.__version__}, triton "
        f"{triton.__version__}, commit {commit}" + ("; SMOKE: interpreter, fp16, tiny shapes" if smoke else ""))
    if device == "cuda" and cap < (9, 0):
        log("not a Hopper GPU: the kernels run (mma.sync instead of wgmma), but the question is about wgmma")

    hard = threading.Timer(args.budget_s + 30, lambda: (log("hard limit: stopping"), os._exit(3)))
    hard.daemon = True
    hard.start()

    # 1. Check (and compile) every row in a pool; the timing skips any row that is not right.
    jobs = [(d, causal, name, device, str(dtype)[6:], check_shape)
            for d in (64, 128) for causal in (True, False) for name in ROWS[d]]
    checks = run_checks(log, jobs, args.workers, T0 + 0.5 * args.budget_s)
    log.data["checks"] = {f"D{d} {'causal' if c else 'full'} {n}": r for (d, c, n), r in checks.items()}
    log.flush()

    # 2. Time: per shape step 05 itself, SDPA cuDNN and FLASH, every checked row, step 05 again.
    def bench(fn):
        if smoke:
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3
        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))

    def sdpa(backend, q, k, v, causal):
        def run():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return run

    for d, causal in ((64, True), (64, False), (128, True), (128, False)):
        B, H, N = lb["B"], lb["H"], lb["N"]
        torch.manual_seed(0)
        q, k, v = (torch.randn(B, H, N, d, device=device, dtype=dtype) for _ in range(3))
        flops = 4 * B * H * N * N * d / (2 if causal else 1)
        shape = f"B={B} H={H} N={N} D={d} {'causal' if causal else 'full'}"
        table = S5.dense_fwd_config(N, N, d, dtype, causal, device, B * H)
        base = {}
        for name, fn in (("step05 forward (its table)", lambda: S5.forward(q, k, v, causal, d ** -0.5)),
                         ("sdpa cudnn", sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v, causal)),
                         ("sdpa flash", sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, causal))):
            try:
                base[name] = bench(fn)
            except Exception as e:  # noqa: BLE001 - a backend missing here is a line
                log(f"{shape} {name}: {type(e).__name__}: {str(e)[:200]}")
        s05 = base.get("step05 forward (its table)")
        log(f"{shape}: step 05's table {table}; " + ", ".join(f"{n} {ms:.3f} ms" for n, ms in base.items()))
        for name, ms in base.items():
            log.data["rows"].append(dict(shape=shape, D=d, causal=causal, row=name, ms=ms,
                                         tflops=round(flops / ms / 1e9, 1), config=table if name.startswith("step05") else None))
        for name, (variant, tiles) in ROWS[d].items():
            if time.time() - T0 > args.budget_s:
                log(f"budget of {args.budget_s:.0f} s spent: no more rows")
                break
            chk = checks.get((d, causal, name))
            if not chk or not chk["ok"]:
                log(f"{shape} {name:<28} not timed: check {'did not finish' if not chk else 'failed'}")
                continue
            ln = mod.launch_row(q, k, v, causal, variant, tiles, table_heads_first(d, causal))
            try:
                ms = bench(ln)
            except Exception as e:  # noqa: BLE001
                log(f"{shape} {name:<28} {type(e).__name__}: {str(e)[:200]}")
                continue
            r = dict(shape=shape, D=d, causal=causal, row=name, variant=variant, config=dict(tiles, **VARIANTS[variant]),
                     ms=ms, tflops=round(flops / ms / 1e9, 1), x_step05=round(s05 / ms, 3) if s05 else None,
                     x_cudnn=round(base["sdpa cudnn"] / ms, 3) if "sdpa cudnn" in base else None)
            log.data["rows"].append(r)
            log(f"{shape} {name:<28} {ms:7.3f} ms {r['tflops']:6.1f} TFLOP/s  x step05 {r['x_step05']}  "
                f"x cudnn {r['x_cudnn']}")
        if s05 is not None and time.time() - T0 <= args.budget_s + 10:
            again = bench(lambda: S5.forward(q, k, v, causal, d ** -0.5))
            log.data["rows"].append(dict(shape=shape, D=d, causal=causal, row="step05 forward again (drift)", ms=again))
            log(f"{shape} step05 forward again {again:.3f} ms (first {s05:.3f})")
        del q, k, v
    log.data["meta"]["total_s"] = round(time.time() - T0, 1)
    log(f"done in {time.time() - T0:.0f} s: {args.out / 'fwd_pipelined.json'}")
    hard.cancel()
    return 0


def _cli():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="a CPU: Triton's interpreter, every variant vs the reference")
    ap.add_argument("--aot-check", action="store_true", help="no GPU: compile for sm_90 and report")
    ap.add_argument("--dims", default="64,128", help="--aot-check: head dims (default 64,128)")
    ap.add_argument("--out", type=Path, help="GPU run: folder for fwd_pipelined.json and .log (--aot-check: its JSON)")
    ap.add_argument("--budget-s", type=float, default=150, help="GPU run: start no new row after this many seconds")
    ap.add_argument("--workers", type=int, default=8, help="GPU run: processes for the check / compile phase")
    ap.add_argument("--smoke", action="store_true",
                    help="with --out: the GPU run's code on a CPU (interpreter, fp16, tiny shapes, no real timing)")
    return ap


def main(argv=None):
    args = _cli().parse_args(argv)
    if args.small:
        failures = small_check()
        print(f"{len(failures)} failed; {time.time() - T0:.0f} s")
        return 1 if failures else 0
    if args.aot_check:
        return aot_main(args)
    if not args.out:
        _cli().error("give --small, --aot-check or --out DIR")
    return gpu_main(args)


if __name__ == "__main__":
    sys.exit(main())
