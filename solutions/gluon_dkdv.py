# SOLUTION-ONLY FILE: no stub (attnlib/stubgen.py); a whole dK/dV kernel would give step 06's regions away.
"""Step 06's dK/dV kernel for Hopper, in Gluon: the solution's backward uses it on an sm_90 GPU where it applies.

Notebook 06 §11 ("What Triton cannot write, Gluon can") teaches it. In Triton 3.6 every ``tl.dot`` of step 06's
dK/dV loop is waited for right after it is issued, so the tensor cores idle while the exponentials run. Gluon
(``triton.experimental.gluon``, in Triton 3.6) is Triton's lower layer: the kernel chooses its layouts, its TMA
copies and mbarriers, and when to wait for each asynchronous warpgroup product (``warpgroup_mma(is_async=True)``).
This kernel, per query tile i of a program's key tile (FlashAttention-3's order):

    issue  S^T_i = K Q_i^T  and  dP^T_i = V dO_i^T
    wait (1 left)  -> P^T_i = exp2(S^T_i - LSE)        while dP^T_i runs
    issue  dV += P^T_i dO_i
    wait (1 left)  -> dS^T_i = P^T_i (dP^T_i - D)      while dV runs
    issue  dK += dS^T_i Q_i ;  wait (0 left) ; refill tile i's buffer (TMA)

Measured (H200, bf16, ``bench/experiments/gluon_dkdv_overlap.py``, results/h200/triton/gluon_1202*/): against
step 06's Triton dK/dV kernel at its table's tiles 1.05x at the CS336 leaderboard shape (2.268 ms against
2.373-2.452), 1.02-1.11x at N=4096; the whole of step 06 in CS336's harness 5.065 ms against 5.174/5.181 on one
H200 and 4.964 against 5.080/5.080 on another (rounds 3 and 4). At D=128, with 64x64 tiles and two stages, step
06's whole backward with it and a second dQ pass ran 1.01-1.10x step 06's as it was, FlashAttention's grid N
2048-16384, causal and not, including where step 06 had added dQ inside its dK/dV kernel (``atomic_tma``, causal N
>= 4096: 1.015-1.037x) (round 5, results/h200/triton/gluon_d128_1202/). Where it applies is where it was
measured: D 64 or 128, fp16/bf16, self-attention (one shape for q, k, v and dO), contiguous (B, H, N, D), N a
multiple of 128 and, without a causal mask, at least ``FULL_MIN_LEN`` = 4096 (round 6), and ``dq_mode="separate"``
(the dK/dV kernel adds no dQ; step 06 takes that mode instead of its table's ``atomic_tma`` where the kernel
``takes`` the inputs). Elsewhere, on other GPUs, and with
``ATTN_GLUON_DKDV=0`` in the environment, step 06 runs its Triton kernel.

At D=128 step 06's dQ pass runs here too (``_gluon_dq``, the same recipe on the forward's loop: Q and dO loaded once,
K and V tiles through a TMA ring; S and dP issued together, P = exp2(S - LSE) computed while dP is on the tensor
cores, then dQ += dS K): 1.04-1.17x step 06's Triton dQ kernel there at N 4096-16384, causal and not; the whole
backward 1.02-1.06x the better of two runs of step 06's, except at N=4096 without a mask (0.95x, where those two runs
differ by 5%); at D=64 it ran 0.88-0.97x the Triton kernel, which keeps that head dim (bench/experiments/gluon_dq.py, results/h200/triton/gluon_dq_1203/).

From N=1024 (``BWD_MIN_LEN``), causal or not, where step 06's table chooses (no ``config``, no ``dq_mode`` asked for)
and deterministic algorithms are off, neither of the two kernels above runs: the whole backward is one
warp-specialized kernel, ``_gluon_bwd_ws`` (below: FlashAttention-3's shape, five products where the two kernels
compute seven, dQ added by the TMA unit's bulk reduce), 1.09-1.21x the two kernels at D=64 and 1.05-1.25x at D=128 but
causal N=16384 (0.99x), taking step 06's forward + backward to 0.94-1.05x cuDNN at D=64 and 0.86-0.98x at D=128
(bench/experiments/gluon_bwd_ws.py, results/h200/triton/gluon_bwd_ws_1203_r2/, results/h200/grid_1204/). At D=128
causal it runs with its mask from the tile's own indices and dS^T before dV (``BWD_SWITCHES``; round 3,
results/h200/triton/gluon_bwd_ws_1204_r3/: 1.06-1.12x the kernel without them at N 1024-16384).

Your step 06 (``steps/``) does not call this file: its backward runs the Triton kernels you write, on every GPU.
"""

from __future__ import annotations

import os

import torch

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language._core import builtin
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                  warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError as e:          # a Triton without Gluon: step 06 keeps its Triton kernel
    from types import SimpleNamespace
    gluon = SimpleNamespace(jit=lambda fn: fn)      # the kernel below is then never launched
    builtin = lambda fn: fn                         # noqa: E731
    GLUON_MISSING = f"{type(e).__name__}: {e}"
else:
    GLUON_MISSING = None

LOG2E = 1.4426950408889634
# (BLOCK_N keys a program, BLOCK_M queries a step, STAGES, num_warps, maxnreg) by head dim. D=64: round 2's best
# ("overlap 64x32 s3 w4 r128"); the 128-register cap lets four programs share an SM, as step 06's own cap does.
# D=128: round 1's and round 5's best ("overlap 64x64 s2 w4", no cap: 255 registers and 56 bytes spilled a thread
# with ptxas 12.8, as measured; three stages spilled more and ran 0.75-0.92x step 06's kernel in round 2).
TILES = {64: (64, 32, 3, 4, 128), 128: (64, 64, 2, 4, None)}
# Without a causal mask the path runs from this N on: below it, step 06's backward with the kernel ran 0.93-1.00x
# the same backward without it (round 6, results/h200/triton/gluon_short_n_1202/: the kernel's gain at short N is
# less than what its launch and host side cost); causal it tied or won at every N (0.99-1.08x), so it has no floor.
FULL_MIN_LEN = 4096
LAUNCHES = 0                      # how many times ``launch_if_covered`` ran the kernel (the GPU tests read it)
# The dQ pass in Gluon (``_gluon_dq``), by head dim: (BLOCK_M queries a program, BLOCK_N keys a step, STAGES,
# num_warps). D=128 only: there it ran 1.04-1.17x step 06's Triton dQ kernel at every length and mask measured (N
# 4096-16384), at D=64 0.88-0.97x (bench/experiments/gluon_dq.py, results/h200/triton/gluon_dq_1203/). Measured from
# N=4096 only, so it starts there, with or without a causal mask.
DQ_TILES = {128: (64, 64, 2, 4)}
DQ_MIN_LEN = 4096
DQ_LAUNCHES = 0                   # how many times ``launch_dq_if_covered`` ran ``_gluon_dq``
# The one-kernel backward (``_gluon_bwd_ws``, below), by head dim: (BLOCK_M queries a step, STAGES, DQ_BUFS fp32 dQ
# staging buffers a consumer, DQ_MODE, maxnreg, consumer registers, loader registers); the experiment's best
# ("alt m64 s2 q1" at D=64, "split m64 s2 q2" at D=128). Three warpgroups' registers a CTA: 3 x 128 x 168 <= 65536.
# Measured from N=4096 (results/h200/triton/gluon_bwd_ws_1203_r2/), then at N 1024 and 2048, where it ran 1.04-1.27x
# step 06's two kernels (gluon_bwd_ws_1204_short/, gluon_bwd_ws_1204_r3/), so it starts at 1024; below, the two kernels.
BWD_TILES = {64: (64, 2, 1, 1, 168, 240, 24), 128: (64, 2, 2, 2, 168, 240, 24)}
BWD_MIN_LEN = 1024
# The kernel's switches step 06 sets, by (D, causal): at D=128 under a causal mask both, the mask from the tile's own
# indices and dS^T before dV is issued (FlashAttention-3's order). ptxas: 176 B spilled a thread without them, 72
# with. Measured 1.06-1.12x the kernel without them at N 1024-16384 (round 3, results/h200/triton/gluon_bwd_ws_1204_r3/);
# at D=64 and without a mask they were within the run's noise (0.95-1.03x), so they stay off there.
BWD_SWITCHES = {(128, True): {"LOCAL_MASK": True, "DS_FIRST": True}}
BWD_LAUNCHES = 0                  # how many times ``launch_bwd_if_covered`` ran ``_gluon_bwd_ws``


def enabled() -> bool:
    """False when ``ATTN_GLUON_DKDV=0`` is in the environment (step 06 then runs its Triton kernel everywhere)."""
    return os.environ.get("ATTN_GLUON_DKDV", "1") != "0"


def device_reason(q4) -> str | None:
    """Why this Triton and ``q4``'s device cannot run the kernel, or None."""
    if GLUON_MISSING:
        return f"this Triton has no Gluon ({GLUON_MISSING})"
    if not enabled():
        return "ATTN_GLUON_DKDV=0"
    if type(q4) is not torch.Tensor:
        return "a tensor subclass (a compiler tracing): the Triton kernel is what it can see"
    if not q4.is_cuda or torch.cuda.get_device_capability(q4.device)[0] != 9:
        return "not a Hopper GPU (sm_90: warpgroup_mma and TMA as this kernel uses them)"
    return None


def shape_reason(q4, k4, v4, do4, dq_mode, is_causal=True) -> str | None:
    """Why the kernel does not cover these (B, H, N, D) views, ``dq_mode`` and mask, or None when it does."""
    if dq_mode != "separate":
        return f"dq_mode={dq_mode!r}: the Triton dK/dV kernel adds dQ there"
    if not (q4.shape == k4.shape == v4.shape == do4.shape):
        return "q, k, v and dO of different shapes"
    if q4.dtype not in (torch.float16, torch.bfloat16) or len({t.dtype for t in (q4, k4, v4, do4)}) != 1:
        return "not one 16-bit dtype"
    B, H, N, D = q4.shape
    if D not in TILES:
        return f"D={D} (measured at D in {sorted(TILES)})"
    if N % 128:
        return f"N={N} is not a multiple of 128 (the kernel has no masks for partial tiles)"
    if not is_causal and N < FULL_MIN_LEN:
        return f"N={N} without a causal mask: the path lost below N={FULL_MIN_LEN} there (round 6)"
    if not all(t.is_contiguous() for t in (q4, k4, v4, do4)):
        return "not contiguous (B, H, N, D)"
    return None


def not_covered(q4, k4, v4, do4, dq_mode, is_causal=True) -> str | None:
    """Why the Gluon kernel does not apply here, or None when it does."""
    return device_reason(q4) or shape_reason(q4, k4, v4, do4, dq_mode, is_causal)


def takes(q4, k4, v4, do4, is_causal) -> bool:
    """Whether the kernel runs on these inputs with ``dq_mode="separate"`` (step 06 then prefers that mode)."""
    return not_covered(q4, k4, v4, do4, "separate", is_causal) is None


@gluon.jit
def _gluon_dkdv(q_desc, k_desc, v_desc, do_desc, LSE, DELTA, DK, DV, N, sm_scale, qk_scale,
                HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                IS_CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, num_warps: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    bh = gl.program_id(0)                       # grid (B*H, key tiles): every head's tile before the next tile
    pid = gl.program_id(1)                      # causal: key tile 0 sees every query, the heaviest, so it starts first
    start_n = pid * BLOCK_N
    row0 = bh * N

    t_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_M, 16])        # S^T, dP^T: (BN, BM)
    g_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])       # dK, dV: (BN, D)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=g_layout, k_width=2)
    col_t: gl.constexpr = gl.SliceLayout(0, t_layout)
    row_t: gl.constexpr = gl.SliceLayout(1, t_layout)

    k_smem = gl.allocate_shared_memory(dtype, k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, v_desc.block_type.shape, v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)

    # Query tiles [lo, N): causal, the first tile holding a query >= start_n.
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
    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=g_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=g_layout)
    mbarrier.wait(kv_bar, phase=0)

    for i in range(n_tiles):
        buf = i % STAGES
        start_m = lo + i * BLOCK_M
        offs_m = start_m + gl.arange(0, BLOCK_M, layout=col_t)
        lse2 = gl.load(LSE + row0 + offs_m) * 1.4426950408889634
        delta = gl.load(DELTA + row0 + offs_m)
        mbarrier.wait(ready.index(buf), phase=(i // STAGES) & 1)
        # S^T_i and dP^T_i issued together; then S^T_i waited for alone (OVERLAP) or both.
        st = warpgroup_mma(k_smem, q_smem.index(buf).permute((1, 0)), zero_t, use_acc=False, is_async=True)
        dpt = warpgroup_mma(v_smem, do_smem.index(buf).permute((1, 0)), zero_t, use_acc=False, is_async=True)
        if OVERLAP:
            st = warpgroup_mma_wait(num_outstanding=1, deps=(st,))
        else:
            st, dpt = warpgroup_mma_wait(num_outstanding=0, deps=(st, dpt))
        # P^T = exp2(S^T * scale*log2e - LSE*log2e), while dP^T_i is on the tensor cores (OVERLAP).
        pt = gl.exp2(st * qk_scale - lse2[None, :])
        if IS_CAUSAL:
            if start_m < start_n + BLOCK_N:
                pt = gl.where(offs_n[:, None] <= offs_m[None, :], pt, 0.0)
        pt_op = gl.convert_layout(pt.to(dtype), a_layout)
        dv = warpgroup_mma(pt_op, do_smem.index(buf), dv, is_async=True)
        if OVERLAP:
            dpt, pt_op = warpgroup_mma_wait(num_outstanding=1, deps=(dpt, pt_op))
        else:
            dv, pt_op = warpgroup_mma_wait(num_outstanding=0, deps=(dv, pt_op))
        # dS^T = P^T (dP^T - D), while dV runs (OVERLAP).
        dst = pt * (dpt - delta[None, :])
        dst_op = gl.convert_layout(dst.to(dtype), a_layout)
        dk = warpgroup_mma(dst_op, q_smem.index(buf), dk, is_async=True)
        # Every product issued in this iteration is waited for in it: a product still in flight across the
        # loop's back edge (the next tile's S^T issued here, dV and dK waited for next time) made ptxas
        # serialize every wgmma of the kernel (its C7515 warning, seen in --aot-check): the loop-carried
        # accumulators are copied by ordinary instructions there.
        dk, dv, pt_op, dst_op = warpgroup_mma_wait(num_outstanding=0, deps=(dk, dv, pt_op, dst_op))
        # Tile i's buffer is read by nothing in flight now, in any warp: refill it with tile i + STAGES.
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

    rows = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, g_layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, g_layout))
    off = (row0 + rows)[:, None].to(gl.int64) * HEAD_DIM + cols[None, :]
    gl.store(DK + off, (dk * sm_scale).to(dtype))
    gl.store(DV + off, dv.to(dtype))


@gluon.jit
def _gluon_dq(q_desc, k_desc, v_desc, do_desc, LSE, DELTA, DQ, N, sm_scale, qk_scale,
              HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
              IS_CAUSAL: gl.constexpr, num_warps: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    bh = gl.program_id(0)                       # grid (B*H, query tiles): every head's tile before the next tile
    pid = gl.program_id(1)
    if IS_CAUSAL:
        pid = gl.num_programs(1) - 1 - pid      # the last query tile sees every key: the heaviest first
    start_m = pid * BLOCK_M
    row0 = bh * N

    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])        # S, dP: (BM, BN)
    g_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])       # dQ: (BM, D)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=g_layout, k_width=2)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)

    q_smem = gl.allocate_shared_memory(dtype, q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, do_desc.block_type.shape, do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    qdo_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(qdo_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)

    # Key tiles [0, hi): causal, up to the last key <= the tile's last query.
    if IS_CAUSAL:
        hi = start_m + BLOCK_M
    else:
        hi = N
    n_tiles = gl.cdiv(hi, BLOCK_N)
    kv_bytes: gl.constexpr = 2 * k_desc.block_type.nbytes

    mbarrier.expect(qdo_bar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [row0 + start_m, 0], qdo_bar, q_smem)
    tma.async_copy_global_to_shared(do_desc, [row0 + start_m, 0], qdo_bar, do_smem)
    for i in gl.static_range(STAGES):
        go = i < n_tiles
        mbarrier.expect(ready.index(i), kv_bytes, pred=go)
        tma.async_copy_global_to_shared(k_desc, [row0 + i * BLOCK_N, 0], ready.index(i), k_smem.index(i), pred=go)
        tma.async_copy_global_to_shared(v_desc, [row0 + i * BLOCK_N, 0], ready.index(i), v_smem.index(i), pred=go)

    offs_m = start_m + gl.arange(0, BLOCK_M, layout=row_s)
    lse2 = gl.load(LSE + row0 + offs_m) * 1.4426950408889634
    delta = gl.load(DELTA + row0 + offs_m)
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=g_layout)
    mbarrier.wait(qdo_bar, phase=0)

    for j in range(n_tiles):
        buf = j % STAGES
        start_n = j * BLOCK_N
        mbarrier.wait(ready.index(buf), phase=(j // STAGES) & 1)
        st = warpgroup_mma(q_smem, k_smem.index(buf).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        dp = warpgroup_mma(do_smem, v_smem.index(buf).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        st = warpgroup_mma_wait(num_outstanding=1, deps=(st,))
        # P = exp2(S * scale*log2e - LSE*log2e), while dP is on the tensor cores.
        p = gl.exp2(st * qk_scale - lse2[:, None])
        if IS_CAUSAL:
            if start_n + BLOCK_N > start_m:
                offs_n = start_n + gl.arange(0, BLOCK_N, layout=col_s)
                p = gl.where(offs_n[None, :] <= offs_m[:, None], p, 0.0)
        dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp,))
        ds = p * (dp - delta[:, None])
        ds_op = gl.convert_layout(ds.to(dtype), a_layout)
        dq = warpgroup_mma(ds_op, k_smem.index(buf), dq, is_async=True)
        dq, ds_op = warpgroup_mma_wait(num_outstanding=0, deps=(dq, ds_op))
        # Buffer j is read by nothing in flight now, in any warp: refill it with tile j + STAGES.
        gl.thread_barrier()
        nxt = j + STAGES
        go = nxt < n_tiles
        mbarrier.expect(ready.index(buf), kv_bytes, pred=go)
        tma.async_copy_global_to_shared(k_desc, [row0 + nxt * BLOCK_N, 0], ready.index(buf), k_smem.index(buf),
                                        pred=go)
        tma.async_copy_global_to_shared(v_desc, [row0 + nxt * BLOCK_N, 0], ready.index(buf), v_smem.index(buf),
                                        pred=go)
    mbarrier.invalidate(qdo_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))

    rows = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, g_layout))
    cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, g_layout))
    off = (row0 + rows)[:, None].to(gl.int64) * HEAD_DIM + cols[None, :]
    gl.store(DQ + off, (dq * sm_scale).to(dtype))


def descriptors(q, k, v, do, bm, bn):
    """TMA descriptors of the (B*H*N, D) views of contiguous (B, H, N, D) tensors: Q and dO in (bm, D) boxes, K and
    V in (bn, D)."""
    B, H, N, D = q.shape
    gdt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    m_layout = gl.NVMMASharedLayout.get_default_for([bm, D], gdt)
    n_layout = gl.NVMMASharedLayout.get_default_for([bn, D], gdt)
    out = []
    for t, box, lay in ((q, bm, m_layout), (k, bn, n_layout), (v, bn, n_layout), (do, bm, m_layout)):
        t2 = t.view(B * H * N, D)
        out.append(TensorDescriptor(t2, list(t2.shape), list(t2.stride()), [box, D], lay))
    return out


def launch(q4, k4, v4, do4, lse, delta, dk4, dv4, is_causal: bool, scale: float):
    """dK and dV into ``dk4``, ``dv4`` (contiguous, like q4). ``lse``: the forward's natural-log LSE and ``delta``
    rowsum(dO * O), both (B*H, N) float32 contiguous (step 06's preprocess makes delta)."""
    B, H, N, D = q4.shape
    bn, bm, stages, warps, maxnreg = TILES[D]
    descs = descriptors(q4, k4, v4, do4, bm, bn)
    cap = {"maxnreg": maxnreg} if maxnreg else {}
    _gluon_dkdv[(B * H, N // bn)](*descs, lse, delta, dk4, dv4, N, scale, scale * LOG2E,
                                  HEAD_DIM=D, BLOCK_M=bm, BLOCK_N=bn, STAGES=stages, IS_CAUSAL=bool(is_causal),
                                  OVERLAP=True, num_warps=warps, **cap)


def launch_if_covered(q4, k4, v4, do4, lse, delta, dk4, dv4, is_causal, scale, dq_mode) -> bool:
    """Step 06's hook: run the Gluon kernel and return True where it applies (``not_covered``), else False."""
    global LAUNCHES
    if not_covered(q4, k4, v4, do4, dq_mode, is_causal) is not None or not (dk4.is_contiguous() and dv4.is_contiguous()):
        return False
    launch(q4, k4, v4, do4, lse.contiguous(), delta, dk4, dv4, is_causal, scale)
    LAUNCHES += 1
    return True


def dq_not_covered(q4, k4, v4, do4, dq4, is_causal) -> str | None:
    """Why ``_gluon_dq`` does not apply to step 06's dQ pass here, or None when it does: the dK/dV kernel's device and
    shape conditions (``not_covered``), D in ``DQ_TILES``, N from ``DQ_MIN_LEN``, dQ contiguous like q."""
    # The dK/dV kernel's conditions but its floor without a mask (FULL_MIN_LEN): this kernel was measured from
    # N=1024 either way, so the shape is checked as the causal case is.
    why = device_reason(q4) or shape_reason(q4, k4, v4, do4, "separate", is_causal=True)
    if why:
        return why
    B, H, N, D = q4.shape
    if D not in DQ_TILES:
        return f"D={D}: the Gluon dQ kernel ran slower than the Triton one there, or was not measured (D=128 only)"
    if N < DQ_MIN_LEN:
        return f"N={N}: the Gluon dQ kernel was measured from N={DQ_MIN_LEN}"
    if dq4.shape != q4.shape or dq4.dtype != q4.dtype or not dq4.is_contiguous():
        return "dQ not a contiguous tensor like q"
    return None


def launch_dq(q4, k4, v4, do4, lse, delta, dq4, is_causal: bool, scale: float):
    """dQ into ``dq4`` (contiguous, like q4); ``lse`` and ``delta`` as ``launch`` takes them."""
    B, H, N, D = q4.shape
    bm, bn, stages, warps = DQ_TILES[D]
    descs = descriptors(q4, k4, v4, do4, bm, bn)
    _gluon_dq[(B * H, N // bm)](*descs, lse, delta, dq4, N, scale, scale * LOG2E,
                                HEAD_DIM=D, BLOCK_M=bm, BLOCK_N=bn, STAGES=stages, IS_CAUSAL=bool(is_causal),
                                num_warps=warps)


def launch_dq_if_covered(q4, k4, v4, do4, lse, delta, dq4, is_causal, scale) -> bool:
    """Step 06's hook for its dQ pass: run ``_gluon_dq`` and return True where it applies (``dq_not_covered``)."""
    global DQ_LAUNCHES
    if dq_not_covered(q4, k4, v4, do4, dq4, is_causal) is not None:
        return False
    launch_dq(q4, k4, v4, do4, lse.contiguous(), delta, dq4, is_causal, scale)
    DQ_LAUNCHES += 1
    return True


# %% The whole backward in one kernel (FlashAttention-3's shape): five products, dQ by the TMA unit's bulk reduce ------
# bench/experiments/gluon_bwd_ws.py (its header says what each piece was measured to give): step 06's two kernels
# give the tensor cores seven products a tile (the dQ pass recomputes S and dP); this kernel gives them five. One
# CTA a (128 keys, batch x head), a head's CTAs side by side in the grid (their dQ adds land in one head's buffer, in
# L2); ``gl.warp_specialize`` splits it into a loader warp (TMA: K and V once, Q_i and dO_i through a ring) and two
# consumer warpgroups of 64 keys each (240 registers), which do the dK/dV kernel's order above plus dQ_i = dS_i K:
# both consumers' dS^T_i go to shared memory, and dQ_i over the CTA's 128 keys is made once (DQ_MODE 1: by consumer
# i % 2, D=64) or in two column halves (DQ_MODE 2: one a consumer, D=128, where a whole dQ_i's accumulator does not
# fit beside dK and dV), staged in shared memory as fp32 and added to an fp32 buffer by one
# ``cp.reduce.async.bulk.tensor ... .add`` (``tma_reduce_add``). DQ_MODE 0 (each consumer adds its own 64 keys'
# share: twice the adds) is the experiment's first run, kept for it.
# Measured (H200, bf16, results/h200/triton/gluon_bwd_ws_1203_r2/), the backward alone against step 06's two
# kernels: D=64 1.09-1.21x (0.93-1.04x cuDNN; the CS336 leaderboard shape 1.12x), D=128 1.05-1.25x except causal
# N=16384 (0.99x).


@builtin
def tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """Add the shared-memory tile ``src`` into global memory at ``coord`` of ``tensor_desc`` with the TMA unit's bulk
    reduce (``cp.reduce.async.bulk.tensor ... .add``), one thread issuing for the CTA, as ``tma.async_copy_shared_to_global``
    stores; ``tma.store_wait`` waits for it. Triton 3.6's Gluon builds this op (``create_async_tma_reduce``, what
    Triton's own ``desc.atomic_add`` lowers to) but exposes no function for it on Hopper."""
    from triton._C.libtriton import ir as _ir
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(_ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


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
                  DQ_BUFS: gl.constexpr, DQ_MODE: gl.constexpr, IS_CAUSAL: gl.constexpr,
                  LOCAL_MASK: gl.constexpr = False, DS_FIRST: gl.constexpr = False):
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
                if LOCAL_MASK:
                    # key n0 + r <= query start_m + c, in the tile's own indices (round 3: fewer registers under the
                    # mask, ptxas says, than the global offsets; set at D=128 causal, ``BWD_SWITCHES``)
                    pt = gl.where(gl.arange(0, 64, layout=row_t)[:, None]
                                  <= gl.arange(0, BLOCK_M, layout=col_t)[None, :] + (start_m - n0), pt, 0.0)
                else:
                    pt = gl.where(offs_n[:, None] <= offs_m[None, :], pt, 0.0)
        if DS_FIRST:
            # FlashAttention-3's order (round 3; set at D=128 causal): dS^T before dV is issued
            dpt = warpgroup_mma_wait(num_outstanding=0, deps=(dpt,))
            dst = (pt * (dpt - delta[None, :])).to(dtype)
            pt_op = gl.convert_layout(pt.to(dtype), a_layout)
            dv = warpgroup_mma(pt_op, do_smem.index(buf), dv, is_async=True)
        else:
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
                  num_warps: gl.constexpr, LOCAL_MASK: gl.constexpr = False,
                  DS_FIRST: gl.constexpr = False):
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
                         0, HEAD_DIM, BLOCK_M, STAGES, DQ_BUFS, DQ_MODE, IS_CAUSAL, LOCAL_MASK, DS_FIRST)),
        (_bws_consumer, (LSE, DELTA, DK, DV, dq_desc, k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, kv_bar,
                         ready, empty, ds_full, ds_free, bh, row0, start_n, lo, n_tiles, sm_scale, qk_scale,
                         1, HEAD_DIM, BLOCK_M, STAGES, DQ_BUFS, DQ_MODE, IS_CAUSAL, LOCAL_MASK, DS_FIRST)),
        (_bws_loader, (q_desc, k_desc, v_desc, do_desc, k_smem, v_smem, q_smem, do_smem, kv_bar, ready, empty,
                       row0, start_n, lo, n_tiles, BLOCK_M, STAGES)),
    ], [4, 1], [CONSUMER_REGS, LOADER_REGS])


def bwd_not_covered(q4, k4, v4, do4, dq4, is_causal) -> str | None:
    """Why ``_gluon_bwd_ws`` does not make this backward, or None when it does: the dK/dV kernel's device and shape
    conditions (``not_covered``) but its floor without a mask, N from ``BWD_MIN_LEN`` with either mask, dQ a contiguous tensor like q, and not under
    ``torch.use_deterministic_algorithms(True)`` (the reduces add dQ in any order: its last bits change from run to
    run, as step 06's atomic modes' do)."""
    # The dK/dV kernel's conditions but its floor without a mask (FULL_MIN_LEN): this kernel was measured from
    # N=1024 either way, so the shape is checked as the causal case is.
    why = device_reason(q4) or shape_reason(q4, k4, v4, do4, "separate", is_causal=True)
    if why:
        return why
    if torch.are_deterministic_algorithms_enabled():
        return "deterministic algorithms on: the kernel adds dQ by reduces that land in any order"
    B, H, N, D = q4.shape
    if N < BWD_MIN_LEN:
        return f"N={N}: the one-kernel backward was measured from N={BWD_MIN_LEN}"
    if dq4.shape != q4.shape or dq4.dtype != q4.dtype or not dq4.is_contiguous():
        return "dQ not a contiguous tensor like q"
    return None


def bwd_launch_args(q4, k4, v4, do4, lse, delta, dk4, dv4, is_causal: bool, scale: float, tiles=None):
    """(grid, args, kwargs, dq_acc) of one ``_gluon_bwd_ws`` launch (tensors may be on the CPU: the compile
    checks). ``tiles``: (BLOCK_M, STAGES, DQ_BUFS, DQ_MODE, maxnreg, consumer registers, loader registers), by
    default ``BWD_TILES[D]`` with ``BWD_SWITCHES``' switches for (D, causal); tiles given, no switch is set. dq_acc:
    the zeroed fp32 (B*H*N, D) buffer the kernel adds dQ (scaled) into."""
    B, H, N, D = q4.shape
    bm, stages, dq_bufs, dq_mode, maxnreg, cregs, lregs = tiles or BWD_TILES[D]
    switches = {} if tiles else BWD_SWITCHES.get((D, bool(is_causal)), {})     # tiles given: no switch added
    q_desc, k_desc, v_desc, do_desc = descriptors(q4, k4, v4, do4, bm, 64)
    dq_acc = torch.zeros(B * H * N, D, device=q4.device, dtype=torch.float32)
    dq_box = [bm, D // 2 if dq_mode == 2 else D]
    dq_desc = TensorDescriptor(dq_acc, list(dq_acc.shape), list(dq_acc.stride()), dq_box,
                               gl.NVMMASharedLayout.get_default_for(dq_box, gl.float32))
    kwargs = dict(HEAD_DIM=D, BLOCK_M=bm, STAGES=stages, DQ_BUFS=dq_bufs, DQ_MODE=dq_mode,
                  IS_CAUSAL=bool(is_causal), CONSUMER_REGS=cregs, LOADER_REGS=lregs, num_warps=4, maxnreg=maxnreg,
                  **switches)
    args = (q_desc, k_desc, v_desc, do_desc, dq_desc, lse, delta, dk4, dv4, N, scale, scale * LOG2E)
    return (N // 128, B * H), args, kwargs, dq_acc


def launch_bwd(q4, k4, v4, do4, lse, delta, dq4, dk4, dv4, is_causal: bool, scale: float, tiles=None):
    """dQ, dK, dV into ``dq4``, ``dk4``, ``dv4`` (contiguous, like q4); ``lse`` and ``delta`` as ``launch`` takes
    them."""
    grid, args, kwargs, dq_acc = bwd_launch_args(q4, k4, v4, do4, lse, delta, dk4, dv4, is_causal, scale, tiles)
    _gluon_bwd_ws[grid](*args, **kwargs)
    dq4.copy_(dq_acc.view(q4.shape))            # scaled in the kernel: the cast alone


def launch_bwd_if_covered(q4, k4, v4, do4, lse, delta, dq4, dk4, dv4, is_causal, scale) -> bool:
    """Step 06's hook for its whole backward: run ``_gluon_bwd_ws`` and return True where it applies
    (``bwd_not_covered``), else False."""
    global BWD_LAUNCHES
    if bwd_not_covered(q4, k4, v4, do4, dq4, is_causal) is not None or not (dk4.is_contiguous()
                                                                            and dv4.is_contiguous()):
        return False
    launch_bwd(q4, k4, v4, do4, lse.contiguous(), delta, dq4, dk4, dv4, is_causal, scale)
    BWD_LAUNCHES += 1
    return True
