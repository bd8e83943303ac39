"""Experiment: step 06's Gluon dK/dV kernel computing dQ too (five products, dQ added by fp32 atomics): does removing
the dQ kernel's recomputation of S and dP pay?

Question. ncu puts the whole of step 06's backward gap to cuDNN in the tensor work (results/h200/triton/ncu/ at the
CS336 leaderboard shape, ncu_c4k/ at N=4096 causal): step 06 gives the tensor pipe 1.40-1.41x cuDNN's work, its two
kernels keeping it busier than cuDNN's one does. The extra work is the dQ kernel recomputing S and dP (seven
products against cuDNN's five, which adds dQ from its one kernel into an fp32 buffer and converts it after). Issue
17's forward + backward target (>= 0.90x cuDNN) is met only at D=64 without a mask from N=8192. This asks whether
the same in Gluon -- step 06's Gluon dK/dV kernel with a fifth product, dQ_i^T = K^T dS_i^T, added to an fp32
buffer -- beats step 06's two kernels at D=64.

Method. ``_gluon_dkdv_dq`` is the solution's ``_gluon_dkdv`` (solutions/gluon_dkdv.py, same order and waits) with,
per query tile i: dS^T_i stored to shared memory (bf16, a (BLOCK_N, BLOCK_M) tile) and fenced; dQ_i^T (D x BLOCK_M)
= K^T dS^T_i issued after dK's product (K^T: the K tile already in shared memory, read transposed; wgmma's M is D, as
BLOCK_M = 32 is under its 64 rows); all waited for in the iteration; dQ_i^T added to the fp32 buffer by
``gl.atomic_add`` (relaxed, one red.global.add.f32 an element: Gluon 3.6 has no TMA reduce on Hopper, which step 06's
``atomic_tma`` mode uses in Triton). After the kernel: dQ = scale x buffer, cast (step 06's atomic modes do the
same). D = rowsum(dO * O) by PyTorch (three small kernels, against step 06's one: charged to this side).
(1) dQ, dK, dV against the float64 reference beside step 06's errors (bf16, causal and not, N 1024; fp16 once).
(2) the backward alone (D, the kernel, dQ's scale and cast), do_bench median, against step 06's ``backward`` as it
ships (its Delta kernel, the Gluon dK/dV kernel, the Triton dQ kernel) and cuDNN's backward, in the same run: D=64,
bf16, causal and not, FlashAttention's grid at N 4096, 8192, 16384 (B = 16384/N, H = 32) and the leaderboard shape.

    python bench/experiments/gluon_dkdv_dq.py --out DIR     # an H200: about 2 minutes
    python bench/experiments/gluon_dkdv_dq.py --aot-check   # no GPU: compile for sm_90a, registers, spills, waits
(not under TRITON_INTERPRET=1: Gluon has no interpreter)

Answer: **no: it loses everywhere, 0.66-0.85x step 06's backward.** One H200, 2026-12-03 13:50 UTC (4a90375;
results/h200/triton/gluon_dkdv_dq_1203/): dQ, dK, dV right in every case, equal to step 06's errors to the digit.
Backward alone, ms (step 06 / best variant / cuDNN): leaderboard 3.645 / 4.742 / 3.187; D=64 causal N 4096, 8192,
16384: 2.136 / 3.132, 3.949 / 4.906 ("vec"), 7.536 / 8.839 ("vec") against cuDNN 1.833, 3.407, 6.353; not causal:
3.789 / 5.565, 7.312 / 9.086 ("vec"), 14.300 / 17.039 ("vec") against 3.178, 6.253, 12.224. "vec" (4-float
atomics) is the best from N=8192 (0.81-0.85x step 06), the scalar adds at N=4096 (0.68x); two stages never win.
Not profiled. What the numbers allow: the fifth product adds 25% to the kernel's tensor work and removes the dQ
kernel (37-44% of step 06's backward under ncu, results/h200/triton/ncu_c4k/), so the loss is elsewhere; the adds are the likely part: with 64-key tiles every
(query tile, key tile) pair adds a whole BLOCK_M x D tile of fp32 to L2 (one add per 10 x BLOCK_N flops; 2.1e9
adds at the leaderboard shape), where FlashAttention-3 adds one 128-key tile's dQ by one TMA reduce from shared
memory. Triton's ``atomic_tma`` mode (step 06) has that reduce, and lost to two kernels too (results/h200/triton/
gluon_d128_1202/). Step 06 keeps its two kernels.

Compiled for sm_90a beforehand (``--aot-check``, ptxas 13.0): 16 wgmma a loop iteration in the PTX (S^T 4, dP^T 4,
dV 2, dK 2, dQ^T 4), 16 fp32 atomic adds a thread (64 x 32 / 128), two ``wgmma.wait_group 1`` and one ``0`` as in
the solution's kernel; uncapped 144-147 registers, no spill, not serialized (three programs an SM, where the
solution's runs four); capped at 128, 52-84 B spilled and, causal, every wgmma serialized. In the wgmma layout a
thread's two adjacent columns of dQ^T are 64 floats apart in dQ, so the adds are scalar; "vec" converts dQ^T first
to a layout holding four consecutive d of one query a thread (through shared memory, 52 KB in all): 4
``atom.global.add.v4.f32`` a thread instead of 16, 136-142 registers, no spill.

Round 2 (``--round 2``): the adds as FlashAttention-3 makes them. Triton 3.6's Gluon has no Python function for the
TMA unit's bulk reduce on Hopper, but its IR builder has the op (``create_async_tma_reduce``, what Triton's
``desc.atomic_add`` lowers to); ``tma_reduce_add`` below is the missing three-line builtin. Each program stages its
dQ_i^T (D x BLOCK_M fp32, scaled) in one of two shared-memory buffers, fences, and one thread issues a
``cp.reduce.async.bulk.tensor ... .add`` of the tile into an fp32 dQ^T buffer (B*H*D, N); ``tma.store_wait(1)`` before
a buffer is written again, ``store_wait(0)`` before the CTA leaves; the host transposes and casts. Is the loss of
round 1 the adds, and does one bulk reduce a tile take the five-product kernel past step 06's two kernels?
Variants: round 1's tiles with three and two stages, and 64x64 (one 64x64 dQ^T tile a step: half the reduces per
product), beside round 1's best ("vec"). ``--aot-check`` (ptxas 13.0): one ``cp.reduce.async.bulk.tensor.2d ... add``
in the loop, bulk waits 1 and 0, 16 wgmma (20 at 64x64), no fp32 atomic; 138-142 registers at 64x32 (60 / 52 KB),
190-200 at 64x64 (88 KB), no spill, not serialized.
Answer: **no.** One H200, 2026-12-03 20:46 UTC (9a182be; results/h200/triton/gluon_dkdv_dq_1203_round2/): every
variant right (step 06's errors to the digit). The bulk reduce beats round 1's atomics ("vec") at every shape,
1.04-1.09x, but the kernel still loses to step 06's two kernels: at its
best tile 0.91x at the leaderboard shape (4.034 ms against 3.653; cuDNN 3.196), 0.75-0.91x causal and 0.77-0.90x not
over N 4096-16384. The adds were part of round 1's loss, not all of it; the rest is not profiled (141 registers:
three programs an SM where step 06's dK/dV kernel runs four). Step 06 keeps its two kernels.

Round 3 (``--round 3``): round 2's kernels with the grid turned round (``KEY_FIRST``): a head's key tiles side by side,
so the programs resident together add into one head's dQ buffer and read one head's Q and dO, where heads first they
add into the whole buffer (134 MB at D=64 on FlashAttention's grid) against a 50 MB L2.
Answer: **it pays, not enough.** One H200, 2026-12-03 23:42 UTC (bdb33f0; results/h200/triton/gluon_dkdv_dq_1203_round3/):
1.03-1.21x the same kernel heads first (the most at N=4096, 128 heads), but 0.85-0.93x step 06's two kernels. The
rest is the one-warpgroup shape; ``gluon_bwd_ws.py`` (FlashAttention-3's shape) is what wins.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "experiments"))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: E402
    fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

from bench.experiments import gpu_run  # noqa: E402
from solutions.gluon_dkdv import descriptors, tma_reduce_add  # noqa: E402  (the builtin lives in the solution since 12-04)

REC = gpu_run.Record("gluon_dkdv_dq")
T0 = time.time()
LOG2E = 1.4426950408889634
# name -> (BLOCK_N keys a program, BLOCK_M queries a step, STAGES, num_warps, maxnreg): the solution's D=64 tiles
# uncapped (the fifth product's accumulator is 16 more registers a thread: 144-147, three programs an SM) on three
# and two stages. Capped at 128 as the solution is (four programs an SM), ptxas spills 76-80 B and, causal,
# serializes the wgmmas (--aot-check): "dq 64x32 s3 w4 r128" is kept for --variants, not run by default.
VARIANTS = {"dq 64x32 s3 w4": (64, 32, 3, 4, None, False), "dq 64x32 s2 w4": (64, 32, 2, 4, None, False),
            "dq 64x32 s3 w4 vec": (64, 32, 3, 4, None, True),
            "dq 64x32 s3 w4 r128": (64, 32, 3, 4, 128, False),
            # Round 2: dQ^T added by the TMA unit's bulk reduce from shared memory (``tma_reduce_add``), as
            # FlashAttention-3 adds dQ; the last field says so.
            "dq 64x32 s3 w4 tma": (64, 32, 3, 4, None, False, True),
            "dq 64x32 s2 w4 tma": (64, 32, 2, 4, None, False, True),
            "dq 64x64 s2 w4 tma": (64, 64, 2, 4, None, False, True),
            # Round 3: round 2's kernels with the grid's order turned round (``KEY_FIRST``, the last field): a head's
            # key tiles side by side, so the programs resident together add into one head's dQ buffer (1 MB at
            # N=4096, D=64) and read one head's Q and dO, where heads first they add into as many heads' buffers as
            # there are programs, the whole fp32 dQ (134 MB on FlashAttention's grid) against a 50 MB L2.
            "dq 64x32 s3 w4 tma kf": (64, 32, 3, 4, None, False, True, True),
            "dq 64x64 s2 w4 tma kf": (64, 64, 2, 4, None, False, True, True)}
ROUND2 = ["dq 64x32 s3 w4 tma", "dq 64x32 s2 w4 tma", "dq 64x64 s2 w4 tma"]
ROUND3 = ["dq 64x32 s3 w4 tma kf", "dq 64x64 s2 w4 tma kf", "dq 64x32 s3 w4 tma"]
DEFAULT = ["dq 64x32 s3 w4", "dq 64x32 s2 w4", "dq 64x32 s3 w4 vec"]


def log(msg):
    REC.log(f"[{time.time() - T0:6.1f}s] {msg}")


def variant_tiles(variant: str):
    """(BLOCK_N, BLOCK_M, STAGES, num_warps, maxnreg, VEC_DQ, TMA_DQ, KEY_FIRST) of a variant."""
    bn, bm, stages, warps, maxnreg, vec, *more = VARIANTS[variant]
    more = list(more) + [False] * (2 - len(more))
    return bn, bm, stages, warps, maxnreg, vec, bool(more[0]), bool(more[1])


@gluon.jit
def _gluon_dkdv_dq(q_desc, k_desc, v_desc, do_desc, LSE, DELTA, DK, DV, DQ, dqt_desc, N, sm_scale, qk_scale,
                   HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                   IS_CAUSAL: gl.constexpr, DS_LAYOUT: gl.constexpr, VEC_DQ: gl.constexpr, TMA_DQ: gl.constexpr,
                   num_warps: gl.constexpr, KEY_FIRST: gl.constexpr = False):
    dtype: gl.constexpr = q_desc.dtype
    if KEY_FIRST:                               # grid (key tiles, B*H): a head's key tiles side by side (round 3)
        pid = gl.program_id(0)
        bh = gl.program_id(1)
    else:                                       # grid (B*H, key tiles): every head's tile before the next tile
        bh = gl.program_id(0)
        pid = gl.program_id(1)
    start_n = pid * BLOCK_N
    row0 = bh * N

    t_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_M, 16])        # S^T, dP^T: (BN, BM)
    g_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])       # dK, dV: (BN, D)
    # dQ^T: (D, BM), the same instruction shape as S^T (N = BLOCK_M)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=g_layout, k_width=2)
    # dQ^T for the atomics (VEC_DQ): four consecutive d of one query a thread, 16 bytes apart from nothing else
    v_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[4, 1], threads_per_warp=[16, 2],
                                              warps_per_cta=[1, num_warps], order=[0, 1])
    col_t: gl.constexpr = gl.SliceLayout(0, t_layout)
    row_t: gl.constexpr = gl.SliceLayout(1, t_layout)

    k_smem = gl.allocate_shared_memory(dtype, k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, v_desc.block_type.shape, v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M], DS_LAYOUT)
    if TMA_DQ:
        # dQ_i^T staged for the bulk reduce, two buffers: one being read by the TMA unit while the next is written
        dq_smem = gl.allocate_shared_memory(gl.float32, [2] + dqt_desc.block_type.shape, dqt_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)

    if IS_CAUSAL:
        lo = (start_n // BLOCK_M) * BLOCK_M
    else:
        lo = 0
    n_tiles = (N - lo) // BLOCK_M
    qdo_bytes: gl.constexpr = 2 * q_desc.block_type.nbytes

    mbarrier.expect(kv_bar, 2 * k_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [row0 + start_n, 0], kv_bar, k_smem)
    tma.async_copy_global_to_shared(v_desc, [row0 + start_n, 0], kv_bar, v_smem)
    for s in gl.static_range(STAGES):
        go = s < n_tiles
        mbarrier.expect(ready.index(s), qdo_bytes, pred=go)
        tma.async_copy_global_to_shared(q_desc, [row0 + lo + s * BLOCK_M, 0], ready.index(s), q_smem.index(s), pred=go)
        tma.async_copy_global_to_shared(do_desc, [row0 + lo + s * BLOCK_M, 0], ready.index(s), do_smem.index(s), pred=go)

    offs_n = start_n + gl.arange(0, BLOCK_N, layout=row_t)
    zero_t = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=t_layout)
    zero_q = gl.zeros([HEAD_DIM, BLOCK_M], gl.float32, layout=t_layout)
    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=g_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=g_layout)
    offs_d = gl.arange(0, HEAD_DIM, layout=row_t)
    offs_dv = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(1, v_layout))
    mbarrier.wait(kv_bar, phase=0)

    for i in range(n_tiles):
        buf = i % STAGES
        start_m = lo + i * BLOCK_M
        offs_m = start_m + gl.arange(0, BLOCK_M, layout=col_t)
        offs_mv = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, v_layout))
        lse2 = gl.load(LSE + row0 + offs_m) * 1.4426950408889634
        delta = gl.load(DELTA + row0 + offs_m)
        mbarrier.wait(ready.index(buf), phase=(i // STAGES) & 1)
        st = warpgroup_mma(k_smem, q_smem.index(buf).permute((1, 0)), zero_t, use_acc=False, is_async=True)
        dpt = warpgroup_mma(v_smem, do_smem.index(buf).permute((1, 0)), zero_t, use_acc=False, is_async=True)
        st = warpgroup_mma_wait(num_outstanding=1, deps=(st,))
        pt = gl.exp2(st * qk_scale - lse2[None, :])
        if IS_CAUSAL:
            if start_m < start_n + BLOCK_N:
                pt = gl.where(offs_n[:, None] <= offs_m[None, :], pt, 0.0)
        pt_op = gl.convert_layout(pt.to(dtype), a_layout)
        dv = warpgroup_mma(pt_op, do_smem.index(buf), dv, is_async=True)
        dpt, pt_op = warpgroup_mma_wait(num_outstanding=1, deps=(dpt, pt_op))
        dst = (pt * (dpt - delta[None, :])).to(dtype)
        # dS^T to shared memory for dQ^T's B operand (every warp's rows visible to the warpgroup's product)
        ds_smem.store(dst)
        fence_async_shared()
        gl.thread_barrier()
        dst_op = gl.convert_layout(dst, a_layout)
        dk = warpgroup_mma(dst_op, q_smem.index(buf), dk, is_async=True)
        dqt = warpgroup_mma(k_smem.permute((1, 0)), ds_smem, zero_q, use_acc=False, is_async=True)
        dk, dv, dqt, pt_op, dst_op = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv, dqt, pt_op, dst_op))
        # dQ_i^T (D, BM) into the fp32 buffer (B*H*N, D): element (d, m) at row row0 + start_m + m, column d
        if TMA_DQ:
            # dQ_i^T scaled here (the host then only transposes and casts), into the buffer the reduce of two tiles
            # ago read from: wait for that reduce (the issuing thread's bulk groups), then for every thread.
            dbuf = i % 2
            tma.store_wait(1)
            gl.thread_barrier()
            dq_smem.index(dbuf).store(dqt * sm_scale)
            fence_async_shared()
            gl.thread_barrier()
            tma_reduce_add(dqt_desc, [bh * HEAD_DIM, start_m], dq_smem.index(dbuf))
        elif VEC_DQ:
            dqv = gl.convert_layout(dqt, v_layout)
            gl.atomic_add(DQ + (row0 + offs_mv)[None, :].to(gl.int64) * HEAD_DIM + offs_dv[:, None], dqv,
                          sem="relaxed")
        else:
            gl.atomic_add(DQ + (row0 + offs_m)[None, :].to(gl.int64) * HEAD_DIM + offs_d[:, None], dqt,
                          sem="relaxed")
        # Tile i's buffers (Q, dO, dS^T) are read by nothing in flight now, in any warp: refill Q and dO.
        gl.thread_barrier()
        nxt = i + STAGES
        go = nxt < n_tiles
        mbarrier.expect(ready.index(buf), qdo_bytes, pred=go)
        tma.async_copy_global_to_shared(q_desc, [row0 + lo + nxt * BLOCK_M, 0], ready.index(buf),
                                        q_smem.index(buf), pred=go)
        tma.async_copy_global_to_shared(do_desc, [row0 + lo + nxt * BLOCK_M, 0], ready.index(buf),
                                        do_smem.index(buf), pred=go)
    mbarrier.invalidate(kv_bar)
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
    if TMA_DQ:
        tma.store_wait(0)           # the last reduces have read their shared memory before the CTA leaves

    rows = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, g_layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, g_layout))
    off = (row0 + rows)[:, None].to(gl.int64) * HEAD_DIM + cols[None, :]
    gl.store(DK + off, (dk * sm_scale).to(dtype))
    gl.store(DV + off, dv.to(dtype))


# %% Host -----------------------------------------------------------------------------------------------------

def check_inputs(q, k, v, do):
    if not (q.dim() == 4 and q.shape == k.shape == v.shape == do.shape):
        raise ValueError(f"gluon_dkdv_dq takes q, k, v, dO of one shape (B, H, N, D), got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}, {tuple(do.shape)}")
    if q.dtype not in (torch.float16, torch.bfloat16) or len({t.dtype for t in (q, k, v, do)}) != 1:
        raise ValueError("gluon_dkdv_dq takes 16-bit q, k, v, dO of one dtype")
    B, H, N, D = q.shape
    if D != 64 or N % 128:
        raise ValueError(f"gluon_dkdv_dq takes D=64 and N a multiple of 128 (an experiment's limits), got D={D}, N={N}")
    if not all(t.is_contiguous() for t in (q, k, v, do)):
        raise ValueError("gluon_dkdv_dq takes contiguous (B, H, N, D) q, k, v, dO")


def launch_args(q, k, v, do, lse, delta, causal, variant, dk=None, dv=None, dq_acc=None):
    """(grid, args, kwargs, dk, dv, dq_acc) of one launch; tensors may be on the CPU (the compile report)."""
    B, H, N, D = q.shape
    bn, bm, stages, warps, maxnreg, vec, tma_dq, key_first = variant_tiles(variant)
    gdt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    descs = descriptors(q, k, v, do, bm, bn)
    dk = torch.empty_like(q) if dk is None else dk
    dv = torch.empty_like(q) if dv is None else dv
    # The fp32 buffer dQ is added into: (B*H*N, D) for the atomics; with the TMA reduce dQ^T, (B*H*D, N), so that a
    # program's dQ_i^T tile (D, BLOCK_M) is a box of it.
    shape = (B * H * D, N) if tma_dq else (B * H * N, D)
    dq_acc = torch.zeros(shape, device=q.device, dtype=torch.float32) if dq_acc is None else dq_acc
    dqt_desc = None             # the atomics address DQ by pointer
    if tma_dq:
        t_layout = gl.NVMMASharedLayout.get_default_for([D, bm], gl.float32)
        dqt_desc = TensorDescriptor(dq_acc, list(dq_acc.shape), list(dq_acc.stride()), [D, bm], t_layout)
    scale = D ** -0.5
    kwargs = dict(HEAD_DIM=D, BLOCK_M=bm, BLOCK_N=bn, STAGES=stages, IS_CAUSAL=bool(causal),
                  DS_LAYOUT=gl.NVMMASharedLayout.get_default_for([bn, bm], gdt), VEC_DQ=vec, TMA_DQ=tma_dq,
                  KEY_FIRST=key_first, num_warps=warps)
    if maxnreg:
        kwargs["maxnreg"] = maxnreg
    args = (*descs, lse, delta, dk, dv, dq_acc, dqt_desc, N, scale, scale * LOG2E)
    grid = (N // bn, B * H) if key_first else (B * H, N // bn)
    return grid, args, kwargs, dk, dv, dq_acc


def backward(q, k, v, o, lse, do, causal, variant):
    """(dQ, dK, dV) of one backward: D by PyTorch, the kernel, dQ scaled and cast. ``lse``: (B, H, N) natural-log
    float32 (step 05's)."""
    check_inputs(q, k, v, do)
    delta = (do.float() * o.float()).sum(-1).contiguous()
    grid, args, kwargs, dk, dv, dq_acc = launch_args(q, k, v, do, lse.contiguous(), delta, causal, variant)
    _gluon_dkdv_dq[grid](*args, **kwargs)
    if kwargs["TMA_DQ"]:
        B, H, N, D = q.shape
        dq = torch.empty_like(q)
        dq.copy_(dq_acc.view(B, H, D, N).transpose(-1, -2))     # scaled in the kernel: transpose and cast
    else:
        dq = torch.mul(dq_acc.view(q.shape), q.shape[-1] ** -0.5).to(q.dtype)
    return dq, dk, dv


# %% Without a GPU: the sm_90a compile ------------------------------------------------------------------------

def compile_sm90(variant: str, causal: bool):
    from gluon_fwd_overlap import compile_for_sm90
    q = torch.empty(1, 2, 1024, 64, dtype=torch.bfloat16)
    lse = torch.empty(1, 2, 1024, dtype=torch.float32)
    grid, args, kwargs, *_ = launch_args(q, q, q, q, lse, lse, causal, variant)
    return compile_for_sm90(_gluon_dkdv_dq, args, kwargs)


def report(variant: str, causal: bool) -> dict:
    """Registers, spills and whether ptxas serialized the wgmmas (gluon_dkdv_overlap's ``ptxas_report``, sm_90a), the
    PTX's wgmma waits, its wgmma and fp32 atomic instructions, shared memory."""
    from gluon_dkdv_overlap import ptxas_report
    from gluon_fwd_overlap import wgmma_waits
    ck = compile_sm90(variant, causal)
    ptx = ck.asm["ptx"]
    r = ptxas_report(ptx)
    return {"regs": r["regs"], "spill": [int(x) for x in r["spills"].split("/")] if r["spills"] else None,
            "serialized": r["serialized"], "waits": wgmma_waits(ptx),
            "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
            "atomics_f32": len(re.findall(r"\b(?:red|atom)\.[\w.]*add\.f32", ptx)),
            "atomics_v4_f32": len(re.findall(r"\b(?:red|atom)\.[\w.]*add\.v4\.f32", ptx)),
            "tma_reduce_add": len(re.findall(r"cp\.reduce\.async\.bulk\.tensor\.[\w:.]*\.add\b", ptx)),
            "bulk_waits": sorted(int(x) for x in re.findall(r"cp\.async\.bulk\.wait_group\.read\s+(\d+)", ptx)),
            "smem_kb": ck.metadata.shared // 1024}


def aot_check(names) -> int:
    rows, failures = {}, 0
    for name in names:
        name, _, own_mask = name.partition("@")      # "NAME@causal" / "NAME@full": that mask alone
        for causal in ((own_mask == "causal",) if own_mask else (True, False)):
            key = f"{name} {'causal' if causal else 'full'}"
            try:
                rows[key] = report(name, causal)
            except Exception as e:  # noqa: BLE001
                failures += 1
                rows[key] = f"FAIL {type(e).__name__}: {str(e)[:1500]}"
            print(f"{key:<28} {rows[key]}", flush=True)
    print(json.dumps(rows))
    return 1 if failures else 0


# %% On a GPU -------------------------------------------------------------------------------------------------

def step06_backward(q, k, v, do, causal):
    """Step 06's forward (O, LSE) and its shipped backward's closure and gradients."""
    from attnlib.loader import load_step
    s5, s6 = load_step(5, "solutions"), load_step(6, "solutions")
    sc = q.shape[-1] ** -0.5
    o, lse = s5.forward(q, k, v, causal, sc)
    fn = lambda: s6.backward(q, k, v, o, lse, do, causal, sc)   # noqa: E731
    return o, lse, fn


def correctness(names) -> dict:
    from attnlib.reference import reference_backward
    rows, wrong = [], 0
    cases = [((2, 4, 1024, 64), c, torch.bfloat16) for c in (True, False)] + [((1, 2, 1024, 64), True, torch.float16)]
    for (b, h, n, d), causal, dt in cases:
        g = torch.Generator(device="cpu").manual_seed(0)
        q, k, v, do = (torch.randn(b, h, n, d, generator=g).to("cuda", dt) for _ in range(4))
        ref = reference_backward(q, k, v, do, causal)
        o, lse, s6 = step06_backward(q, k, v, do, causal)
        base = [float((x.double() - r).abs().max()) for x, r in zip(s6(), ref)]
        case = f"B{b} H{h} N{n} D{d} {'causal' if causal else 'full'} {str(dt)[6:]}"
        for name in names:
            try:
                got = backward(q, k, v, o, lse, do, causal, name)
                again = backward(q, k, v, o, lse, do, causal, name)
                torch.cuda.synchronize()
                e = [float((x.double() - r).abs().max()) for x, r in zip(got, ref)]
                ok = all(x <= 1.5 * y + 1e-3 and math.isfinite(x) for x, y in zip(e, base))
                # fp32 atomics add in any order: dQ may differ in its last bits between runs, dK and dV may not
                steady = all(torch.equal(a, b) for a, b in zip(got[1:], again[1:]))
            except Exception as ex:  # noqa: BLE001
                e, ok, steady = f"{type(ex).__name__}: {str(ex)[:300]}", False, False
            wrong += not (ok and steady)
            rows.append({"case": case, "variant": name, "err": e, "step06": base, "ok": ok, "dkdv_repeatable": steady})
            log(f"  {case:<30} {name:<22} "
                + (e if isinstance(e, str) else "dQ {:.1e} dK {:.1e} dV {:.1e}".format(*e))
                + "  (step 06 dQ {:.1e} dK {:.1e} dV {:.1e}) ".format(*base)
                + ("ok" if ok and steady else "WRONG"))
    return {"rows": rows, "wrong": wrong}


def timing(names, budget_s: float) -> dict:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    shapes = [("leaderboard", 1, 16, 16384, True)] + [("grid", 16384 // n, 32, n, c)
                                                      for c in (True, False) for n in (4096, 8192, 16384)]
    out = []
    for label, b, h, n, causal in shapes:
        if time.time() - T0 > budget_s:
            log(f"  budget reached: {label} N{n} and after not timed")
            break
        q, k, v, do = (torch.randn(b, h, n, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        o, lse, s6 = step06_backward(q, k, v, do, causal)
        bench = lambda fn: round(float(triton.testing.do_bench(fn, warmup=25, rep=200)), 4)   # noqa: E731
        ms = {"step06": bench(s6)}
        for name in names:
            ms[name] = bench(lambda: backward(q, k, v, o, lse, do, causal, name))
        ms["step06 again"] = bench(s6)
        qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            og = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
        ms["cudnn"] = bench(lambda: torch.autograd.grad(og, (qg, kg, vg), do, retain_graph=True))
        s06 = min(ms["step06"], ms["step06 again"])
        row = {"shape": f"{label} B{b} H{h} N{n} D64 {'causal' if causal else 'full'}", "ms": ms,
               "vs_step06": {x: round(s06 / t, 3) for x, t in ms.items() if x in names},
               "vs_cudnn": {x: round(ms["cudnn"] / t, 3) for x, t in ms.items() if x != "cudnn"}}
        out.append(row)
        REC.result.setdefault("timing_rows", []).append(row)
        REC.save()
        log(f"  {row['shape']:<34} " + "  ".join(f"{x} {t:.3f}" for x, t in ms.items()))
        log(f"  {'':34} vs step 06: " + "  ".join(f"{x} {r:.2f}" for x, r in row["vs_step06"].items())
            + "   vs cuDNN: " + "  ".join(f"{x} {r:.2f}" for x, r in row["vs_cudnn"].items()))
    return {"rows": out}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--aot-check", action="store_true", help="no GPU: compile for sm_90a and report")
    ap.add_argument("--variants", default=None, help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--budget-s", type=float, default=150)
    ap.add_argument("--round", type=int, default=1, choices=(1, 2, 3),
                    help="1: the atomics; 2: dQ^T added by the TMA bulk reduce, beside round 1's best (\"vec\"); "
                         "3: round 2's kernels with a head's key tiles side by side")
    args = ap.parse_args()
    names = args.variants.split(",") if args.variants else {1: DEFAULT, 2: ROUND2 + ["dq 64x32 s3 w4 vec"],
                                                            3: ROUND3}[args.round]
    if unknown := [x for x in names if x.partition("@")[0] not in VARIANTS]:
        ap.error(f"--variants: unknown {unknown}")
    if args.aot_check:
        return aot_check(names)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        ap.error("a Hopper GPU (or --aot-check)")
    if args.out is None:
        ap.error("--out DIR on a GPU")
    # Step 06 as it ships on Hopper (its Gluon dK/dV kernel), which gpu_run.Record would turn off by default.
    os.environ["ATTN_GLUON_DKDV"] = os.environ["ATTN_GLUON_FWD"] = "1"
    REC.open(args.out, ROOT)
    REC.result["gpu"] = torch.cuda.get_device_name()
    REC.part("1 correctness")(lambda: correctness(names))()
    rows = REC.result["parts"]["1 correctness"].get("rows", [])
    right = [n for n in names if rows and all(r["ok"] and r["dkdv_repeatable"] for r in rows if r["variant"] == n)]
    log(f"timing the variants right in every case: {right or 'none'}")
    if right:
        REC.part("2 timing")(lambda: timing(right, args.budget_s))()
    log(f"wrote {REC.json_path}")
    return 0 if right else 1


if __name__ == "__main__":
    sys.exit(main())
