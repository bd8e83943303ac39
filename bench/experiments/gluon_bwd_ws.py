"""Experiment: a backward shaped like FlashAttention-3's, in Gluon: one warp-specialized kernel computing dQ, dK and
dV in five products, dQ added by the TMA unit's bulk reduce. Does it beat step 06's two kernels (seven products)?

Question. Step 06's backward gives the tensor cores 1.40x cuDNN's work (seven products against five: its dQ pass
recomputes S and dP), and issue 17's forward + backward target (>= 0.90x cuDNN) is met in 2 of 12 cells
(results/h200/issue17_targets/). A five-product kernel in Gluon lost twice (gluon_dkdv_dq.py rounds 1 and 2:
0.66-0.91x step 06's backward): one warpgroup a program, 64 keys, 141-151 registers so three programs an SM, every
program adding a whole dQ tile per 64 keys, and heads first in the grid, so the programs resident together add
into as many heads' dQ as there are programs. FlashAttention-3 differs in each of these: 128 keys a CTA on two
consumer warpgroups, a producer warp loading Q and dO by TMA, the registers moved to the consumers (setmaxnreg),
and a head's key tiles side by side. This asks whether that shape, in Gluon, takes the five products past step 06.

Method. ``_gluon_bwd_ws``: one CTA a (key block of 128, batch x head), the grid key blocks first (a head's CTAs side
by side; causal, the heaviest key block of a head first). ``gl.warp_specialize`` splits it into
    loader (1 warp, 24 registers)  K and V (two 64-key tiles) once; Q_i and dO_i (BLOCK_M rows) by TMA into STAGES
                                   buffers, each refilled once both consumers hand it back (``empty``, count 2)
    consumer w (4 warps, w = 0, 1) its own 64 keys, per query tile i, step 06's Gluon dK/dV order (S^T_i and dP^T_i
                                   issued together, P^T_i under dP^T_i, dV, dS^T_i under dV, dK) and a fifth product,
                                   dQ_i(w) = dS_i(w) K(w) (BLOCK_M x D over its 64 keys: dS^T_i(w) stored to shared
                                   memory and read transposed); every product waited for in the iteration; Q_i, dO_i
                                   handed back; dQ_i(w), scaled, staged in shared memory (fp32, DQ_BUFS buffers) and
                                   added to an fp32 (B*H*N, D) buffer by one bulk reduce (gluon_dkdv_dq.py's
                                   ``tma_reduce_add``), ``tma.store_wait(DQ_BUFS - 1)`` before a buffer is written again
Under a causal mask consumer 1 skips the query tile wholly above its keys (it hands the buffer back unread). After
the kernel dQ is the buffer cast (one elementwise kernel). D = rowsum(dO * O) by step 06's own preprocess kernel.
(1) dQ, dK, dV against the float64 reference beside step 06's errors (bf16 D 64 and 128, causal and not; fp16
once), dK and dV bitwise repeatable. (2) the backward alone, do_bench median, against step 06's ``backward`` as it
ships (twice) and cuDNN's, in the same run: the CS336 leaderboard shape and FlashAttention's grid (B = 16384/N,
H = 2048/D) at N 4096, 8192, 16384, D 64 and 128, causal and not.

    python bench/experiments/gluon_bwd_ws.py --out DIR     # an H200: about 2 minutes
    python bench/experiments/gluon_bwd_ws.py --aot-check   # no GPU: compile for sm_90a, registers, spills, waits
(not under TRITON_INTERPRET=1: Gluon has no interpreter)

Answer: not yet run on a GPU.
"""

from __future__ import annotations

import argparse
import functools
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
from gluon_dkdv_dq import step06_backward, tma_reduce_add  # noqa: E402

REC = gpu_run.Record("gluon_bwd_ws")
T0 = time.time()
LOG2E = 1.4426950408889634
WG_KEYS = 64          # keys a consumer warpgroup owns (one m64 wgmma for S^T, dP^T, dK, dV)
NUM_WG = 2            # consumer warpgroups: 128 keys a CTA
# How a CTA's dQ_i is made (DQ_MODE):
#   0 "ws"    each consumer its share over its own 64 keys, dQ_i(w) = dS_i(w) K(w) (BLOCK_M x D), and adds it: two
#             bulk reduces a CTA a query tile
#   1 "alt"   both consumers' dS^T_i in shared memory (an mbarrier says when both are there, another when they may be
#             overwritten); consumer i % 2 makes the whole dQ_i over the CTA's 128 keys and adds it: one reduce a
#             query tile, half the adds to L2 of mode 0 (FlashAttention-3 makes one dQ a CTA too)
#   2 "split" the same dS^T_i shared, each consumer makes half of dQ_i's columns over all 128 keys, dS_i K[:, half]
#             (FlashAttention-3's split at D=128): the accumulator half mode 0's, two reduces of half a tile
# name -> (BLOCK_M queries a step, STAGES, DQ_BUFS, DQ_MODE, maxnreg, consumer registers, loader registers). Three
# warpgroups' worth of registers a CTA (the loader warp is allocated a warpgroup's): 3 x 128 x 168 <= 65536, one CTA
# an SM. Shared memory at D=128: K, V 64 KB, Q, dO 32 KB a stage, dS^T 16 KB (32 shared), dQ 32 KB a buffer a
# consumer (16 split).
VARIANTS = {"ws m64 s2 q2": (64, 2, 2, 0, 168, 240, 24), "ws m64 s3 q2": (64, 3, 2, 0, 168, 240, 24),
            "ws m64 s2 q1": (64, 2, 1, 0, 168, 240, 24),
            "alt m64 s2 q1": (64, 2, 1, 1, 168, 240, 24), "alt m64 s3 q1": (64, 3, 1, 1, 168, 240, 24),
            "split m64 s2 q1": (64, 2, 1, 2, 168, 240, 24), "split m64 s2 q2": (64, 2, 2, 2, 168, 240, 24)}
DEFAULT = {64: ["ws m64 s2 q2", "ws m64 s3 q2", "alt m64 s2 q1", "alt m64 s3 q1"],
           128: ["split m64 s2 q1", "split m64 s2 q2"]}


def log(msg):
    REC.log(f"[{time.time() - T0:6.1f}s] {msg}")


@gluon.jit
def _bws_loader(q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, ready, empty,
                row0, start_n, lo, n_tiles, BLOCK_M: gl.constexpr, STAGES: gl.constexpr):
    """One warp: the CTA's two K and V tiles, then Q_i and dO_i into buffer i % STAGES once both consumers hand it
    back."""
    mbarrier.expect(kv_bar, 4 * k_desc.block_type.nbytes)
    for w in gl.static_range(2):
        tma.async_copy_global_to_shared(k_desc, [row0 + start_n + w * 64, 0], kv_bar, k_smem.index(w))
        tma.async_copy_global_to_shared(v_desc, [row0 + start_n + w * 64, 0], kv_bar, v_smem.index(w))
    qdo_bytes: gl.constexpr = 2 * q_desc.block_type.nbytes
    for i in range(n_tiles):
        st = i % STAGES
        # An mbarrier starts with its phase "1" complete: the first round of waits passes at once.
        mbarrier.wait(empty.index(st), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(st), qdo_bytes)
        tma.async_copy_global_to_shared(q_desc, [row0 + lo + i * BLOCK_M, 0], ready.index(st), q_smem.index(st))
        tma.async_copy_global_to_shared(do_desc, [row0 + lo + i * BLOCK_M, 0], ready.index(st), do_smem.index(st))


@gluon.jit
def _bws_consumer(LSE, DELTA, DK, DV, dq_desc, k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, kv_bar, ready,
                  empty, ds_full, ds_free, bh, row0, start_n, lo, n_tiles, sm_scale, qk_scale,
                  WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr,
                  DQ_BUFS: gl.constexpr, DQ_MODE: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """One warpgroup: dK and dV of its 64 keys, and its share of every query tile's dQ."""
    dtype: gl.constexpr = k_smem.dtype
    t_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_M, 16])        # S^T, dP^T: (64, BM)
    g_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])       # dK, dV (64, D); dQ (BM, D)
    DQ_COLS: gl.constexpr = HEAD_DIM // 2 if DQ_MODE == 2 else HEAD_DIM
    q_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, DQ_COLS, 16])        # dQ (BM, DQ_COLS)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=g_layout, k_width=2)
    col_t: gl.constexpr = gl.SliceLayout(0, t_layout)
    row_t: gl.constexpr = gl.SliceLayout(1, t_layout)

    n0 = start_n + WG * 64
    k_w = k_smem.index(WG)
    v_w = v_smem.index(WG)
    # Causal: the query tiles wholly above this warpgroup's keys (consumer 1's first) are handed back unread, where
    # the consumers' dS^T are their own (mode 0; shared, consumer 0's dQ_i needs consumer 1's zeros).
    n_skip = 0
    if IS_CAUSAL and DQ_MODE == 0:
        n_skip = (n0 - lo) // BLOCK_M
    for i in range(n_skip):
        st = i % STAGES
        mbarrier.wait(ready.index(st), phase=(i // STAGES) & 1)
        mbarrier.arrive(empty.index(st), count=1)

    offs_n = n0 + gl.arange(0, 64, layout=row_t)
    zero_t = gl.zeros([64, BLOCK_M], gl.float32, layout=t_layout)
    zero_q = gl.zeros([BLOCK_M, DQ_COLS], gl.float32, layout=q_layout)
    dk = gl.zeros([64, HEAD_DIM], gl.float32, layout=g_layout)
    dv = gl.zeros([64, HEAD_DIM], gl.float32, layout=g_layout)
    mbarrier.wait(kv_bar, phase=0)

    for i in range(n_skip, n_tiles):
        buf = i % STAGES
        start_m = lo + i * BLOCK_M
        offs_m = start_m + gl.arange(0, BLOCK_M, layout=col_t)
        lse2 = gl.load(LSE + row0 + offs_m) * 1.4426950408889634
        delta = gl.load(DELTA + row0 + offs_m)
        mbarrier.wait(ready.index(buf), phase=(i // STAGES) & 1)
        st = warpgroup_mma(k_w, q_smem.index(buf).permute((1, 0)), zero_t, use_acc=False, is_async=True)
        dpt = warpgroup_mma(v_w, do_smem.index(buf).permute((1, 0)), zero_t, use_acc=False, is_async=True)
        st = warpgroup_mma_wait(num_outstanding=1, deps=(st,))
        pt = gl.exp2(st * qk_scale - lse2[None, :])
        if IS_CAUSAL:
            if start_m < n0 + 64:
                pt = gl.where(offs_n[:, None] <= offs_m[None, :], pt, 0.0)
        pt_op = gl.convert_layout(pt.to(dtype), a_layout)
        dv = warpgroup_mma(pt_op, do_smem.index(buf), dv, is_async=True)
        dpt, pt_op = warpgroup_mma_wait(num_outstanding=1, deps=(dpt, pt_op))
        dst = (pt * (dpt - delta[None, :])).to(dtype)
        if DQ_MODE == 0:
            # dS^T to shared memory, every warp's rows written before the warpgroup's dQ product reads them
            ds_w = ds_smem.index(WG)
            ds_w.store(dst)
            fence_async_shared()
            gl.thread_barrier()
            dst_op = gl.convert_layout(dst, a_layout)
            dk = warpgroup_mma(dst_op, q_smem.index(buf), dk, is_async=True)
            dq = warpgroup_mma(ds_w.permute((1, 0)), k_w, zero_q, use_acc=False, is_async=True)
            dk, dv, dq, pt_op, dst_op = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv, dq, pt_op, dst_op))
            # Q_i, dO_i and dS^T_i are read by nothing in flight now: Q_i's buffer back to the loader.
            mbarrier.arrive(empty.index(buf), count=1)
            # dQ_i(w), scaled, into the buffer the reduce of DQ_BUFS tiles ago read from: wait for that reduce (the
            # issuing thread's bulk groups), then for every thread of the warpgroup.
            dbuf = WG * DQ_BUFS + i % DQ_BUFS
            tma.store_wait(DQ_BUFS - 1)
            gl.thread_barrier()
            dq_smem.index(dbuf).store(dq * sm_scale)
            fence_async_shared()
            gl.thread_barrier()
            tma_reduce_add(dq_desc, [row0 + start_m, 0], dq_smem.index(dbuf))
        else:
            # dS^T_i shared: this consumer's 64 rows into buffer i % 2 once the dQ products of tile i - 2 are done
            # with it (an mbarrier starts with its phase "1" complete: the first use passes), then said written.
            b = i % 2
            u = i // 2
            mbarrier.wait(ds_free.index(b), (u & 1) ^ 1)
            ds_smem.index(2 * b + WG).store(dst)
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(ds_full.index(b), count=1)
            dst_op = gl.convert_layout(dst, a_layout)
            dk = warpgroup_mma(dst_op, q_smem.index(buf), dk, is_async=True)
            # mode 1: consumer i % 2 makes all of dQ_i; mode 2: each consumer its half of the columns
            if (DQ_MODE == 2) or (b == WG):
                mbarrier.wait(ds_full.index(b), u & 1)
                if DQ_MODE == 2:
                    k0 = k_smem.index(0).slice(WG * DQ_COLS, DQ_COLS, dim=1)
                    k1 = k_smem.index(1).slice(WG * DQ_COLS, DQ_COLS, dim=1)
                else:
                    k0 = k_smem.index(0)
                    k1 = k_smem.index(1)
                dq = warpgroup_mma(ds_smem.index(2 * b).permute((1, 0)), k0, zero_q, use_acc=False, is_async=True)
                dq = warpgroup_mma(ds_smem.index(2 * b + 1).permute((1, 0)), k1, dq, is_async=True)
                dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))
                mbarrier.arrive(ds_free.index(b), count=1)
                if DQ_MODE == 2:
                    dbuf = WG * DQ_BUFS + i % DQ_BUFS
                else:
                    dbuf = WG * DQ_BUFS + u % DQ_BUFS
                tma.store_wait(DQ_BUFS - 1)
                gl.thread_barrier()
                dq_smem.index(dbuf).store(dq * sm_scale)
                fence_async_shared()
                gl.thread_barrier()
                tma_reduce_add(dq_desc, [row0 + start_m, WG * DQ_COLS * (DQ_MODE == 2)], dq_smem.index(dbuf))
            dk, dv, pt_op, dst_op = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv, pt_op, dst_op))
            mbarrier.arrive(empty.index(buf), count=1)
    tma.store_wait(0)           # the last reduces have read their shared memory before the CTA leaves

    rows = n0 + gl.arange(0, 64, layout=gl.SliceLayout(1, g_layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, g_layout))
    off = (row0 + rows)[:, None].to(gl.int64) * HEAD_DIM + cols[None, :]
    gl.store(DK + off, (dk * sm_scale).to(dtype))
    gl.store(DV + off, dv.to(dtype))


@gluon.jit
def _gluon_bwd_ws(q_desc, k_desc, v_desc, do_desc, dq_desc, LSE, DELTA, DK, DV, N, sm_scale, qk_scale,
                  HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, STAGES: gl.constexpr, DQ_BUFS: gl.constexpr,
                  DQ_MODE: gl.constexpr, IS_CAUSAL: gl.constexpr, CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr,
                  num_warps: gl.constexpr):
    pid = gl.program_id(0)                      # grid (key blocks, B*H): a head's key blocks side by side
    bh = gl.program_id(1)                       # causal: key block 0 sees every query, the heaviest, so it starts first
    start_n = pid * 128
    row0 = bh * N
    dtype: gl.constexpr = q_desc.dtype

    k_smem = gl.allocate_shared_memory(dtype, [2] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [2] + v_desc.block_type.shape, v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, BLOCK_M], dtype)
    ds_smem = gl.allocate_shared_memory(dtype, [2 if DQ_MODE == 0 else 4, 64, BLOCK_M], ds_layout)
    dq_smem = gl.allocate_shared_memory(gl.float32, [2 * DQ_BUFS] + dq_desc.block_type.shape, dq_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())     # modes 1, 2
    ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for b in gl.static_range(2):
        mbarrier.init(ds_full.index(b), count=2)
        mbarrier.init(ds_free.index(b), count=2 if DQ_MODE == 2 else 1)
    mbarrier.init(kv_bar, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)

    # Query tiles [lo, N): causal, from the first tile holding a query >= start_n.
    if IS_CAUSAL:
        lo = (start_n // BLOCK_M) * BLOCK_M
    else:
        lo = 0
    n_tiles = (N - lo) // BLOCK_M

    # The argument tuples written out in full: a tuple built by `+` in a kernel drops its constexprs' wrapping.
    gl.warp_specialize([
        (_bws_consumer, (LSE, DELTA, DK, DV, dq_desc, k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, kv_bar,
                         ready, empty, ds_full, ds_free, bh, row0, start_n, lo, n_tiles, sm_scale, qk_scale,
                         0, HEAD_DIM, BLOCK_M, STAGES, DQ_BUFS, DQ_MODE, IS_CAUSAL)),
        (_bws_consumer, (LSE, DELTA, DK, DV, dq_desc, k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, kv_bar,
                         ready, empty, ds_full, ds_free, bh, row0, start_n, lo, n_tiles, sm_scale, qk_scale,
                         1, HEAD_DIM, BLOCK_M, STAGES, DQ_BUFS, DQ_MODE, IS_CAUSAL)),
        (_bws_loader, (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, ready, empty,
                       row0, start_n, lo, n_tiles, BLOCK_M, STAGES)),
    ], [4, 1], [CONSUMER_REGS, LOADER_REGS])


# %% Host -----------------------------------------------------------------------------------------------------

def check_inputs(q, k, v, do):
    if not (q.dim() == 4 and q.shape == k.shape == v.shape == do.shape):
        raise ValueError(f"gluon_bwd_ws takes q, k, v, dO of one shape (B, H, N, D), got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}, {tuple(do.shape)}")
    if q.dtype not in (torch.float16, torch.bfloat16) or len({t.dtype for t in (q, k, v, do)}) != 1:
        raise ValueError("gluon_bwd_ws takes 16-bit q, k, v, dO of one dtype")
    B, H, N, D = q.shape
    if D not in (64, 128) or N % 128:
        raise ValueError(f"gluon_bwd_ws takes D 64 or 128 and N a multiple of 128 (an experiment's limits), got "
                         f"D={D}, N={N}")
    if not all(t.is_contiguous() for t in (q, k, v, do)):
        raise ValueError("gluon_bwd_ws takes contiguous (B, H, N, D) q, k, v, dO")


def launch_args(q, k, v, do, lse, delta, causal, variant, dk=None, dv=None, dq_acc=None):
    """(grid, args, kwargs, dk, dv, dq_acc) of one launch; tensors may be on the CPU (the compile report)."""
    B, H, N, D = q.shape
    bm, stages, dq_bufs, dq_mode, maxnreg, cregs, lregs = VARIANTS[variant]
    gdt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    m_layout = gl.NVMMASharedLayout.get_default_for([bm, D], gdt)
    n_layout = gl.NVMMASharedLayout.get_default_for([WG_KEYS, D], gdt)
    descs = []
    for t, box, lay in ((q, bm, m_layout), (k, WG_KEYS, n_layout), (v, WG_KEYS, n_layout), (do, bm, m_layout)):
        t2 = t.view(B * H * N, D)
        descs.append(TensorDescriptor(t2, list(t2.shape), list(t2.stride()), [box, D], lay))
    dk = torch.empty_like(q) if dk is None else dk
    dv = torch.empty_like(q) if dv is None else dv
    dq_acc = torch.zeros(B * H * N, D, device=q.device, dtype=torch.float32) if dq_acc is None else dq_acc
    dq_box = [bm, D // 2 if dq_mode == 2 else D]
    dq_desc = TensorDescriptor(dq_acc, list(dq_acc.shape), list(dq_acc.stride()), dq_box,
                               gl.NVMMASharedLayout.get_default_for(dq_box, gl.float32))
    scale = D ** -0.5
    kwargs = dict(HEAD_DIM=D, BLOCK_M=bm, STAGES=stages, DQ_BUFS=dq_bufs, DQ_MODE=dq_mode, IS_CAUSAL=bool(causal),
                  CONSUMER_REGS=cregs, LOADER_REGS=lregs, num_warps=4, maxnreg=maxnreg)
    args = (*descs, dq_desc, lse, delta, dk, dv, N, scale, scale * LOG2E)
    return (N // (NUM_WG * WG_KEYS), B * H), args, kwargs, dk, dv, dq_acc


@functools.cache
def _step06():
    from attnlib.loader import load_step
    return load_step(6, "solutions")


def backward(q, k, v, o, lse, do, causal, variant):
    """(dQ, dK, dV) of one backward: D by step 06's own preprocess kernel, the kernel, dQ cast. ``lse``: (B, H, N)
    natural-log float32."""
    check_inputs(q, k, v, do)
    B, H, N, D = q.shape
    delta = torch.empty(B * H, N, device=q.device, dtype=torch.float32)
    _step06()._bwd_preprocess[(triton.cdiv(N, 64), B * H)](o, do, delta, *o.stride(), *do.stride(), H, N,
                                                           HEAD_DIM=D, BLOCK_M=64, BLOCK_D=D)
    grid, args, kwargs, dk, dv, dq_acc = launch_args(q, k, v, do, lse.contiguous(), delta, causal, variant)
    _gluon_bwd_ws[grid](*args, **kwargs)
    return dq_acc.view(q.shape).to(q.dtype), dk, dv       # scaled in the kernel


# %% Without a GPU: the sm_90a compile ------------------------------------------------------------------------

def compile_sm90(variant: str, d: int, causal: bool):
    from gluon_fwd_overlap import compile_for_sm90
    q = torch.empty(1, 2, 1024, d, dtype=torch.bfloat16)
    lse = torch.empty(1, 2, 1024, dtype=torch.float32)
    grid, args, kwargs, *_ = launch_args(q, q, q, q, lse, lse, causal, variant)
    return compile_for_sm90(_gluon_bwd_ws, args, kwargs)


def report(variant: str, d: int, causal: bool) -> dict:
    """ptxas's registers and spills (sm_90a, the kernel's cap: the consumers' setmaxnreg is in the PTX), the PTX's
    wgmma and their waits, bulk reduces and their waits, named barriers, setmaxnreg, shared memory."""
    from gluon_dkdv_overlap import ptxas_report
    from gluon_fwd_overlap import wgmma_waits
    ck = compile_sm90(variant, d, causal)
    ptx = ck.asm["ptx"]
    r = ptxas_report(ptx)
    return {"regs": r["regs"], "spill": [int(x) for x in r["spills"].split("/")] if r["spills"] else None,
            "serialized": r["serialized"], "waits": wgmma_waits(ptx),
            "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
            "tma_reduce_add": len(re.findall(r"cp\.reduce\.async\.bulk\.tensor\.[\w:.]*\.add\b", ptx)),
            "bulk_waits": sorted(int(x) for x in re.findall(r"cp\.async\.bulk\.wait_group\.read\s+(\d+)", ptx)),
            "named_barriers": sorted(set(re.findall(r"bar\.sync\s+(\d+),\s*(\d+)", ptx))),
            "setmaxnreg": sorted(set(re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx))),
            "smem_kb": ck.metadata.shared // 1024}


def aot_check(names, dims) -> int:
    rows, failures = {}, 0
    for name in names:
        name, _, own_mask = name.partition("@")      # "NAME@causal" / "NAME@full": that mask alone
        for d in dims:
            for causal in ((own_mask == "causal",) if own_mask else (True, False)):
                key = f"{name} D{d} {'causal' if causal else 'full'}"
                try:
                    rows[key] = report(name, d, causal)
                except Exception as e:  # noqa: BLE001
                    failures += 1
                    rows[key] = f"FAIL {type(e).__name__}: {str(e)[:1500]}"
                print(f"{key:<28} {rows[key]}", flush=True)
    print(json.dumps(rows))
    return 1 if failures else 0


# %% On a GPU -------------------------------------------------------------------------------------------------

def correctness(names_by_d) -> dict:
    from attnlib.reference import reference_backward
    rows, wrong = [], 0
    cases = [((2, 4, 1024, d), c, torch.bfloat16) for d in (64, 128) for c in (True, False)]
    cases += [((1, 2, 1024, 64), True, torch.float16), ((1, 2, 384, 128), True, torch.bfloat16)]
    for (b, h, n, d), causal, dt in cases:
        g = torch.Generator(device="cpu").manual_seed(0)
        q, k, v, do = (torch.randn(b, h, n, d, generator=g).to("cuda", dt) for _ in range(4))
        ref = reference_backward(q, k, v, do, causal)
        o, lse, s6 = step06_backward(q, k, v, do, causal)
        base = [float((x.double() - r).abs().max()) for x, r in zip(s6(), ref)]
        case = f"B{b} H{h} N{n} D{d} {'causal' if causal else 'full'} {str(dt)[6:]}"
        for name in names_by_d[d]:
            try:
                got = backward(q, k, v, o, lse, do, causal, name)
                again = backward(q, k, v, o, lse, do, causal, name)
                torch.cuda.synchronize()
                e = [float((x.double() - r).abs().max()) for x, r in zip(got, ref)]
                ok = all(x <= 1.5 * y + 1e-3 and math.isfinite(x) for x, y in zip(e, base))
                # the reduces add in any order: dQ may differ in its last bits between runs, dK and dV may not
                steady = all(torch.equal(a, b) for a, b in zip(got[1:], again[1:]))
            except Exception as ex:  # noqa: BLE001
                e, ok, steady = f"{type(ex).__name__}: {str(ex)[:300]}", False, False
            wrong += not (ok and steady)
            rows.append({"case": case, "variant": name, "err": e, "step06": base, "ok": ok, "dkdv_repeatable": steady})
            log(f"  {case:<30} {name:<14} "
                + (e if isinstance(e, str) else "dQ {:.1e} dK {:.1e} dV {:.1e}".format(*e))
                + "  (step 06 dQ {:.1e} dK {:.1e} dV {:.1e}) ".format(*base)
                + ("ok" if ok and steady else "WRONG"))
    return {"rows": rows, "wrong": wrong}


def timing(names_by_d, budget_s: float) -> dict:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    shapes = [("leaderboard", 1, 16, 16384, 64, True)]
    shapes += [("grid", 16384 // n, 2048 // d, n, d, c) for d in (64, 128) for c in (True, False)
               for n in (4096, 8192, 16384)]
    out = []
    for label, b, h, n, d, causal in shapes:
        names = names_by_d[d]
        if not names:
            continue
        if time.time() - T0 > budget_s:
            log(f"  budget reached: {label} D{d} N{n} and after not timed")
            break
        q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
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
        row = {"shape": f"{label} B{b} H{h} N{n} D{d} {'causal' if causal else 'full'}", "ms": ms,
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
    ap.add_argument("--variants64", default=None, help=f"comma-separated, of {', '.join(VARIANTS)} (D=64)")
    ap.add_argument("--variants128", default=None, help="the same for D=128 ('' for none)")
    ap.add_argument("--budget-s", type=float, default=150)
    args = ap.parse_args()
    names_by_d = {d: (DEFAULT[d] if a is None else [x for x in a.split(",") if x])
                  for d, a in ((64, args.variants64), (128, args.variants128))}
    if unknown := [x for d in names_by_d for x in names_by_d[d] if x.partition("@")[0] not in VARIANTS]:
        ap.error(f"unknown variants {unknown}")
    if args.aot_check:
        return max(aot_check(names_by_d[d], (d,)) for d in (64, 128) if names_by_d[d])
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        ap.error("a Hopper GPU (or --aot-check)")
    if args.out is None:
        ap.error("--out DIR on a GPU")
    # Step 06 as it ships on Hopper (its Gluon kernels), which gpu_run.Record would turn off by default.
    os.environ["ATTN_GLUON_DKDV"] = os.environ["ATTN_GLUON_FWD"] = "1"
    REC.open(args.out, ROOT)
    REC.result["gpu"] = torch.cuda.get_device_name()
    REC.part("1 correctness")(lambda: correctness(names_by_d))()
    rows = REC.result["parts"]["1 correctness"].get("rows", [])
    right = {d: [n for n in names_by_d[d]
                 if all(r["ok"] and r["dkdv_repeatable"] for r in rows if r["variant"] == n and f" D{d} " in r["case"])
                 and any(r["variant"] == n and f" D{d} " in r["case"] for r in rows)]
             for d in (64, 128)}
    log(f"timing the variants right in every case: {right}")
    if any(right.values()):
        REC.part("2 timing")(lambda: timing(right, args.budget_s))()
    log(f"wrote {REC.json_path}")
    return 0 if all(right[d] or not names_by_d[d] for d in (64, 128)) else 1


if __name__ == "__main__":
    sys.exit(main())
