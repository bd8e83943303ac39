# SOLUTION-ONLY FILE: no stub (attnlib/stubgen.py); a whole forward kernel would give step 05's regions away.
"""Step 05's forward for Hopper at long sequences, in Gluon and warp-specialized: the solution's forward uses it on an
sm_90 GPU where it applies.

Notebook 06 §11 ("What Triton cannot write, Gluon can") teaches it beside step 06's Gluon dK/dV kernel. A CTA owns
NUM_WG x 64 query rows and is split by ``gl.warp_specialize`` into partitions that run side by side:

    loader (1 warp, 24 registers)      Q's row blocks, then K_j, V_j by TMA into STAGES buffers; waits for a buffer's
                                       ``empty`` mbarrier (every consumer done with it) before refilling it
    consumer warpgroups (4 warps each) their own 64 rows: S_j = Q K_j^T and O += P_{j-1} V_{j-1} issued, S_j waited
                                       for alone, its softmax while P_{j-1} V_{j-1} runs (FlashAttention-3's
                                       intra-warpgroup order), then the buffer handed back by an mbarrier arrive;
                                       under a causal mask each stops at its own rows' diagonal and hands the CTA's
                                       later buffers back unread

The registers move from the loader to the consumers (``setmaxnreg`` under the kernel's ``maxnreg``). Measured (H200,
bf16, ``bench/experiments/gluon_fwd_ws.py``, results/h200/triton/gluon_fwd_ws_1203/), against step 05's Triton
kernel in the same run, at N=16384: D=64 three consumer warpgroups and 128-key tiles 1.08x causal, 1.14x not
(0.99x and 1.06x cuDNN); D=128 two warpgroups and three stages 1.04x causal, 1.09x not (1.01x, 0.99x cuDNN); the
CS336 leaderboard shape level (1.268 ms against 1.277-1.335). A second run (2026-12-03 08:15 UTC,
results/h200/triton/gluon_fwd_ws_1203_round2/) added N=8192: these tiles 1.07x step 05 at D=64 causal, 1.16x not,
1.01x and 1.07x at D=128. At N=4096 they ran 0.95-1.07x: 1.04x and 1.07x without a causal mask (D 64, 128), 0.95x
and 0.98x with it (round 1 at N=4096: 1.02x and 1.03x not causal). So the path started at N=8192 under a causal
mask and at ``FULL_MIN_LEN`` = 4096 without one. Under a causal mask it took every head's heaviest query tile before
any head's next, so every head's K and V were in flight at once: at N=4096, D=64, 128 heads of 1 MB against the
H200's 60 MB of L2, whose hit rate ncu read at 12%. Taking the heads in groups whose K and V fit 8 MB (step 05's
``head_group``; 82% hit) made it 1.13-1.17x faster at N=4096 and 1.03-1.13x from 8192 (two runs, results/h200/
triton/fwd_tile_order_1204/, bench/experiments/fwd_tile_order.py): 0.95-1.00x cuDNN at N=4096 (where step 05's
Triton kernel, grouped too, ran 0.91-0.93x), 1.02-1.10x from 8192, so the path starts at ``MIN_LEN`` = 4096 under a
causal mask too. Without a causal mask at D=64 it runs the same partitions
persistent (``_gluon_fwd_ws_persistent``: one CTA an SM walking the work tiles, the loader running on into the next
tile's Q and K/V while the consumers finish this one): 1.09x the kernel above at N=4096 and 1.02x at 8192 and 16384
in that run (1.14-1.18x step 05, 1.04-1.10x cuDNN); causal and at D=128 it lost. Where it applies: D 64 or 128,
fp16/bf16, self-attention (one shape for q, k, v), contiguous (B, H, N, D), N >= MIN_LEN (causal) or FULL_MIN_LEN
(not) and a multiple of 64. Elsewhere, on other GPUs, while a compiler traces the call, and with ``ATTN_GLUON_FWD=0``
in the environment, step 05 runs its Triton kernel.

Your step 05 (``steps/``) does not call this file: its forward runs the Triton kernel you write, on every GPU.
"""

from __future__ import annotations

import os

import torch

try:
    import triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
except ImportError as e:          # a Triton without Gluon: step 05 keeps its Triton kernel
    from types import SimpleNamespace
    gluon = SimpleNamespace(jit=lambda fn: fn)      # the kernels below are then never launched
    GLUON_MISSING = f"{type(e).__name__}: {e}"
else:
    GLUON_MISSING = None

LOG2E = 1.4426950408889634
WG_ROWS = 64          # query rows a consumer warpgroup owns (one m64 wgmma)
# (NUM_WG, BLOCK_N, STAGES, maxnreg, consumer registers, loader registers) by head dim: the experiment's best at
# N=16384 ("ws 3wg n128 s2" at D=64, "ws 2wg n128 s3" at D=128). A warpgroup is the unit of registers:
# (NUM_WG + 1) warpgroups x 128 threads x maxnreg <= 65536.
TILES = {64: (3, 128, 2, 128, 160, 24), 128: (2, 128, 3, 168, 240, 24)}
# Without a causal mask at D=64, the persistent kernel (one CTA an SM walking the work tiles; round 2's best there,
# "pers 3wg n128 s3": 1.09x round 1's kernel at N=4096, 1.02x at 8192 and 16384; 1.04-1.10x cuDNN). Causal and at
# D=128 it lost to the kernel above (0.81-0.98x cuDNN against 0.83-1.00x; 8-18% slower at D=128).
PERSISTENT_TILES = {64: (3, 128, 3, 128, 160, 24)}
MIN_LEN = 4096          # under a causal mask (8192 until its heads were taken in groups: fwd_tile_order_1204)
FULL_MIN_LEN = 4096     # without one (gluon_fwd_ws_1203_round2/: 1.04x step 05 at D=64, 1.07x at D=128, N=4096)
LAUNCHES = 0                      # how many times ``launch_if_covered`` ran the kernel (the GPU tests read it)
LAST_KERNEL = None                # which of the two it ran last: "ws" or "persistent" (the GPU tests read it)


def enabled() -> bool:
    """False when ``ATTN_GLUON_FWD=0`` is in the environment (step 05 then runs its Triton kernel everywhere)."""
    return os.environ.get("ATTN_GLUON_FWD", "1") != "0"


def device_reason(q) -> str | None:
    """Why this Triton and ``q``'s device cannot run the kernel, or None."""
    if GLUON_MISSING:
        return f"this Triton has no Gluon ({GLUON_MISSING})"
    if not enabled():
        return "ATTN_GLUON_FWD=0"
    if type(q) is not torch.Tensor:
        return "a tensor subclass (a compiler tracing): the Triton kernel is what it can see"
    if not q.is_cuda or torch.cuda.get_device_capability(q.device)[0] != 9:
        return "not a Hopper GPU (sm_90: warpgroup_mma, TMA and setmaxnreg as this kernel uses them)"
    return None


def shape_reason(q4, k4, v4, is_causal=True) -> str | None:
    """Why the kernel does not cover these (B, H, N, D) views (or q, k, v as a caller passes them: (..., N, D)) with
    or without a causal mask, or None when it does."""
    if not (q4.shape == k4.shape == v4.shape):
        return "q, k and v of different shapes (the kernel is self-attention only)"
    if q4.dtype not in (torch.float16, torch.bfloat16) or not (q4.dtype == k4.dtype == v4.dtype):
        return "not one 16-bit dtype"
    N, D = q4.shape[-2], q4.shape[-1]
    if D not in TILES:
        return f"D={D} (measured at D in {sorted(TILES)})"
    floor = MIN_LEN if is_causal else FULL_MIN_LEN
    if N < floor:
        return (f"N={N} {'with' if is_causal else 'without'} a causal mask: the path lost or tied below N={floor} "
                f"there (bench/experiments/gluon_fwd_ws.py)")
    if N % WG_ROWS:
        return f"N={N} is not a multiple of {WG_ROWS}"
    if not all(t.is_contiguous() for t in (q4, k4, v4)):
        return "not contiguous (B, H, N, D)"
    return None


@torch.compiler.assume_constant_result
def device_takes(device_type: str, index: int | None) -> bool:
    """Whether this Triton, the environment and the device ``(type, index)`` run the kernel. Asked while
    ``torch.compile`` traces too, where a device query would be a graph break: the compiler calls it once and keeps
    the answer as a constant."""
    if device_type != "cuda" or GLUON_MISSING or not enabled():
        return False
    return torch.cuda.get_device_capability(index)[0] == 9


def takes(q, k, v, is_causal) -> bool:
    """Step 05's ``hopper_fwd_takes``: would ``launch_if_covered`` run the kernel on q, k, v (as step 05's
    ``forward`` takes them)? Asked while a compiler traces the call (tensors without data), where
    ``launch_if_covered`` itself declines: step 05 then registers the call as an opaque operator, which the compiled
    graph calls with real tensors, so this kernel runs there as it does in eager mode."""
    if not device_takes(q.device.type, q.device.index):
        return False
    return shape_reason(q, k, v, is_causal) is None


def not_covered(q4, k4, v4, is_causal=True) -> str | None:
    """Why the Gluon kernel does not apply here, or None when it does."""
    return device_reason(q4) or shape_reason(q4, k4, v4, is_causal)


# %% The kernel: a loader partition and NUM_WG consumer partitions --------------------------------------------------

@gluon.jit
def _ws_loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready, empty, row0, start_m, n_tiles,
               NUM_WG: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """One warp: Q's NUM_WG row blocks, then K_j and V_j into buffer j % STAGES as soon as the consumers hand it
    back."""
    mbarrier.expect(q_bar, NUM_WG * q_desc.block_type.nbytes)
    for w in gl.static_range(NUM_WG):
        tma.async_copy_global_to_shared(q_desc, [row0 + start_m + w * 64, 0], q_bar, q_smem.index(w))
    kv_bytes: gl.constexpr = 2 * k_desc.block_type.nbytes
    for j in range(n_tiles):
        st = j % STAGES
        # An mbarrier starts with its phase "1" complete: the first round of waits passes at once.
        mbarrier.wait(empty.index(st), ((j // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(st), kv_bytes)
        tma.async_copy_global_to_shared(k_desc, [row0 + j * BLOCK_N, 0], ready.index(st), k_smem.index(st))
        tma.async_copy_global_to_shared(v_desc, [row0 + j * BLOCK_N, 0], ready.index(st), v_smem.index(st))


@gluon.jit
def _ws_consumer(O, LSE, q_smem, k_smem, v_smem, q_bar, ready, empty, turn, row0, start_m, n_tiles, qk_scale, N,
                 WG: gl.constexpr, NUM_WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                 STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, PINGPONG: gl.constexpr):
    """One warpgroup: the softmax and both products of its 64 query rows, FlashAttention-3's intra-warpgroup order.
    PINGPONG: the consumers issue their products in turn (warpgroup WG waits for ``turn[WG]``, issues, then hands the
    turn to the next), so one warpgroup's products run under the others' softmax (FlashAttention-3's inter-warpgroup
    schedule); every warpgroup takes n_tiles + 1 turns."""
    BM: gl.constexpr = 64
    dtype: gl.constexpr = k_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    m_start = start_m + WG * BM
    # Under a causal mask a consumer computes only the key tiles its own rows see, up to its diagonal (one tile for
    # rows wholly past N), and hands the CTA's later buffers back untouched (below the loop). That skips work only
    # where the CTA holds more rows than a key tile: with three warpgroups and 128-key tiles 11% of the products at
    # N=4096, 4% at 8192 (gluon_fwd_ws.py round 4: 1.01-1.03x). Ping-pong needs every warpgroup to take every turn.
    SKIP_PAST_DIAGONAL: gl.constexpr = IS_CAUSAL and not PINGPONG and NUM_WG * BM > BLOCK_N
    n_own = n_tiles
    if SKIP_PAST_DIAGONAL:
        n_own = gl.where(m_start < N, gl.cdiv(gl.minimum(m_start + BM, N), BLOCK_N), 1)
    offs_m = m_start + gl.arange(0, BM, layout=row_s)
    q_tile = q_smem.index(WG)
    m_i = gl.full([BM], float("-inf"), gl.float32, layout=row_s)
    acc = gl.zeros([BM, HEAD_DIM], gl.float32, layout=o_layout)
    zero_s = gl.zeros([BM, BLOCK_N], gl.float32, layout=s_layout)
    mbarrier.wait(q_bar, phase=0)

    # Tile 0: S_0 and its softmax (no O to rescale yet).
    mbarrier.wait(ready.index(0), phase=0)
    if PINGPONG:
        # Warpgroup 0's first wait passes at once (an mbarrier starts with phase "1" complete).
        mbarrier.wait(turn.index(WG), phase=1 if WG == 0 else 0)
    s_acc = warpgroup_mma(q_tile, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    if PINGPONG:
        mbarrier.arrive(turn.index((WG + 1) % NUM_WG), count=1)
    s_acc = warpgroup_mma_wait(num_outstanding=0, deps=(s_acc,))
    offs_n = gl.arange(0, BLOCK_N, layout=col_s)
    if IS_CAUSAL:
        s_acc = gl.where(offs_n[None, :] <= offs_m[:, None], s_acc, float("-inf"))
    else:
        if BLOCK_N > N:
            s_acc = gl.where(offs_n[None, :] < N, s_acc, float("-inf"))
    m_i = gl.maximum(m_i, gl.max(s_acc, 1) * qk_scale)
    p = gl.exp2(s_acc * qk_scale - m_i[:, None])
    l_i = gl.sum(p, 1)
    p_op = gl.convert_layout(p.to(dtype), p_layout)

    for j in range(1, n_own):
        st = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(ready.index(st), phase=(j // STAGES) & 1)
        if PINGPONG:
            mbarrier.wait(turn.index(WG), phase=(j & 1) ^ (1 if WG == 0 else 0))
        s_acc = warpgroup_mma(q_tile, k_smem.index(st).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        acc = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
        if PINGPONG:
            mbarrier.arrive(turn.index((WG + 1) % NUM_WG), count=1)
        s_acc = warpgroup_mma_wait(num_outstanding=1, deps=(s_acc,))
        # The softmax of S_j while P_{j-1} V_{j-1} is still on the tensor cores.
        if IS_CAUSAL:
            if j * BLOCK_N + BLOCK_N > m_start:
                offs_n = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=col_s)
                s_acc = gl.where(offs_n[None, :] <= offs_m[:, None], s_acc, float("-inf"))
        else:
            # The last key tile may run past N into the next head's rows (or past the tensor: TMA reads zeros).
            if j * BLOCK_N + BLOCK_N > N:
                offs_n = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=col_s)
                s_acc = gl.where(offs_n[None, :] < N, s_acc, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s_acc, 1) * qk_scale)
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s_acc * qk_scale - m_new[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
        # K_{j-1} (read by S_{j-1}) and V_{j-1} (read by the product just waited for): this warpgroup is done with them.
        mbarrier.arrive(empty.index(prev), count=1)
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        p_op = gl.convert_layout(p.to(dtype), p_layout)

    last = (n_own - 1) % STAGES
    if PINGPONG:
        mbarrier.wait(turn.index(WG), phase=(n_tiles & 1) ^ (1 if WG == 0 else 0))
    acc = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
    if PINGPONG:
        mbarrier.arrive(turn.index((WG + 1) % NUM_WG), count=1)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    mbarrier.arrive(empty.index(last), count=1)
    if SKIP_PAST_DIAGONAL:
        # The CTA's key tiles past this warpgroup's diagonal: each handed back once filled (an arrive before the fill
        # would count toward the buffer's previous use), never read.
        for j in range(n_own, n_tiles):
            st = j % STAGES
            mbarrier.wait(ready.index(st), phase=(j // STAGES) & 1)
            mbarrier.arrive(empty.index(st), count=1)

    acc = acc / gl.convert_layout(l_i, row_o)[:, None]
    rows_o = m_start + gl.arange(0, BM, layout=row_o)
    cols_o = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    o_ptrs = O + (row0 + rows_o)[:, None].to(gl.int64) * HEAD_DIM + cols_o[None, :]
    # Rows past N (the CTA's last tile when N is not a multiple of its rows) are computed and not stored.
    gl.store(o_ptrs, acc.to(dtype), mask=(rows_o < N)[:, None])
    gl.store(LSE + row0 + offs_m, (m_i + gl.log2(l_i)) * 0.6931471805599453, mask=offs_m < N)


@gluon.jit
def _gluon_fwd_ws(q_desc, k_desc, v_desc, O, LSE, N, qk_scale,
                  HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, NUM_WG: gl.constexpr,
                  CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr, IS_CAUSAL: gl.constexpr,
                  PINGPONG: gl.constexpr, num_warps: gl.constexpr, HEAD_GROUP: gl.constexpr = 0):
    BM_CTA: gl.constexpr = NUM_WG * 64
    n_m = gl.cdiv(N, BM_CTA)
    if IS_CAUSAL:
        # Every head's heaviest query tile first (step 05's HEADS_FIRST); HEAD_GROUP > 0: so within groups of that
        # many heads, one group after another (step 05's program_tile).
        pid = gl.program_id(1)
        bh = gl.program_id(0)
        if HEAD_GROUP > 0:
            n_bh = gl.num_programs(0)
            start = pid * n_bh + bh
            group = start // (HEAD_GROUP * n_m)
            heads = gl.minimum(n_bh - group * HEAD_GROUP, HEAD_GROUP)
            within = start - group * HEAD_GROUP * n_m
            pid = within // heads
            bh = group * HEAD_GROUP + within % heads
        pid = n_m - 1 - pid
    else:
        pid = gl.program_id(0)
        bh = gl.program_id(1)
    start_m = pid * BM_CTA
    row0 = bh * N
    dtype: gl.constexpr = q_desc.dtype

    q_smem = gl.allocate_shared_memory(dtype, [NUM_WG] + q_desc.block_type.shape, q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], mbarrier.MBarrierLayout())
    for w in gl.static_range(NUM_WG):
        mbarrier.init(turn.index(w), count=1)
    mbarrier.init(q_bar, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=NUM_WG)

    if IS_CAUSAL:
        hi = gl.minimum(start_m + BM_CTA, N)
    else:
        hi = N
    n_tiles = gl.cdiv(hi, BLOCK_N)

    # The argument tuples written out in full: a tuple built by `+` in a kernel drops its constexprs' wrapping.
    if NUM_WG == 2:
        gl.warp_specialize([
            (_ws_consumer, (O, LSE, q_smem, k_smem, v_smem, q_bar, ready, empty, turn, row0, start_m, n_tiles,
                            qk_scale, N, 0, NUM_WG, HEAD_DIM, BLOCK_N, STAGES, IS_CAUSAL, PINGPONG)),
            (_ws_consumer, (O, LSE, q_smem, k_smem, v_smem, q_bar, ready, empty, turn, row0, start_m, n_tiles,
                            qk_scale, N, 1, NUM_WG, HEAD_DIM, BLOCK_N, STAGES, IS_CAUSAL, PINGPONG)),
            (_ws_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready, empty, row0, start_m, n_tiles,
                          NUM_WG, BLOCK_N, STAGES)),
        ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
    else:
        gl.warp_specialize([
            (_ws_consumer, (O, LSE, q_smem, k_smem, v_smem, q_bar, ready, empty, turn, row0, start_m, n_tiles,
                            qk_scale, N, 0, NUM_WG, HEAD_DIM, BLOCK_N, STAGES, IS_CAUSAL, PINGPONG)),
            (_ws_consumer, (O, LSE, q_smem, k_smem, v_smem, q_bar, ready, empty, turn, row0, start_m, n_tiles,
                            qk_scale, N, 1, NUM_WG, HEAD_DIM, BLOCK_N, STAGES, IS_CAUSAL, PINGPONG)),
            (_ws_consumer, (O, LSE, q_smem, k_smem, v_smem, q_bar, ready, empty, turn, row0, start_m, n_tiles,
                            qk_scale, N, 2, NUM_WG, HEAD_DIM, BLOCK_N, STAGES, IS_CAUSAL, PINGPONG)),
            (_ws_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready, empty, row0, start_m, n_tiles,
                          NUM_WG, BLOCK_N, STAGES)),
        ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, LOADER_REGS])


# %% The persistent kernel (without a causal mask at D=64): the same partitions, one CTA an SM -------------------------
# bench/experiments/gluon_fwd_ws.py --round 2. At N=4096 the kernel above lost 0.96-1.03x step 05 where at N=16384 it
# won 1.04-1.14x, with the same number of CTAs: per CTA about 7 us of fixed cost (Q's load, filling the K/V ring,
# the epilogue) that nothing overlaps, one CTA an SM. Here the grid is one CTA an SM and each walks work tiles
# t = pid, pid + G, ... (causal: every head's heaviest query tile first, as step 05 orders them); the loader runs on
# into the next tile's Q (two Q buffers) and K/V (one ring across tiles) while the consumers finish and store this one.

@gluon.jit
def _tile_coords(t, BH, n_m, N, BM_CTA: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr):
    if IS_CAUSAL:
        bh = t % BH
        start_m = (n_m - 1 - t // BH) * BM_CTA
        hi = gl.minimum(start_m + BM_CTA, N)
    else:
        bh = t // n_m
        start_m = (t % n_m) * BM_CTA
        hi = N
    return bh * N, start_m, gl.cdiv(hi, BLOCK_N)


@gluon.jit
def _pers_loader(q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, ready, empty, BH, n_m, N,
                 NUM_WG: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr):
    BM_CTA: gl.constexpr = NUM_WG * 64
    kv_bytes: gl.constexpr = 2 * k_desc.block_type.nbytes
    kv = 0
    i = 0
    for t in range(gl.program_id(0), BH * n_m, gl.num_programs(0)):
        row0, start_m, n_tiles = _tile_coords(t, BH, n_m, N, BM_CTA, BLOCK_N, IS_CAUSAL)
        qb = i % 2
        mbarrier.wait(q_empty.index(qb), ((i // 2) & 1) ^ 1)
        mbarrier.expect(q_ready.index(qb), NUM_WG * q_desc.block_type.nbytes)
        for w in gl.static_range(NUM_WG):
            tma.async_copy_global_to_shared(q_desc, [row0 + start_m + w * 64, 0], q_ready.index(qb),
                                            q_smem.index(qb * NUM_WG + w))
        for j in range(n_tiles):
            st = kv % STAGES
            mbarrier.wait(empty.index(st), ((kv // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(st), kv_bytes)
            tma.async_copy_global_to_shared(k_desc, [row0 + j * BLOCK_N, 0], ready.index(st), k_smem.index(st))
            tma.async_copy_global_to_shared(v_desc, [row0 + j * BLOCK_N, 0], ready.index(st), v_smem.index(st))
            kv += 1
        i += 1


@gluon.jit
def _pers_consumer(O, LSE, q_smem, k_smem, v_smem, q_ready, q_empty, ready, empty, BH, n_m, N, qk_scale,
                   WG: gl.constexpr, NUM_WG: gl.constexpr, HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr,
                   STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr):
    BM: gl.constexpr = 64
    BM_CTA: gl.constexpr = NUM_WG * 64
    dtype: gl.constexpr = k_smem.dtype
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    zero_s = gl.zeros([BM, BLOCK_N], gl.float32, layout=s_layout)
    kv = 0
    i = 0
    for t in range(gl.program_id(0), BH * n_m, gl.num_programs(0)):
        row0, start_m, n_tiles = _tile_coords(t, BH, n_m, N, BM_CTA, BLOCK_N, IS_CAUSAL)
        m_start = start_m + WG * BM
        offs_m = m_start + gl.arange(0, BM, layout=row_s)
        qb = i % 2
        q_tile = q_smem.index(qb * NUM_WG + WG)
        mbarrier.wait(q_ready.index(qb), (i // 2) & 1)

        st = kv % STAGES
        mbarrier.wait(ready.index(st), (kv // STAGES) & 1)
        s_acc = warpgroup_mma(q_tile, k_smem.index(st).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        s_acc = warpgroup_mma_wait(num_outstanding=0, deps=(s_acc,))
        offs_n = gl.arange(0, BLOCK_N, layout=col_s)
        if IS_CAUSAL:
            s_acc = gl.where(offs_n[None, :] <= offs_m[:, None], s_acc, float("-inf"))
        else:
            if BLOCK_N > N:
                s_acc = gl.where(offs_n[None, :] < N, s_acc, float("-inf"))
        m_i = gl.max(s_acc, 1) * qk_scale
        p = gl.exp2(s_acc * qk_scale - m_i[:, None])
        l_i = gl.sum(p, 1)
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        acc = gl.zeros([BM, HEAD_DIM], gl.float32, layout=o_layout)

        for j in range(1, n_tiles):
            st = (kv + j) % STAGES
            prev = (kv + j - 1) % STAGES
            mbarrier.wait(ready.index(st), ((kv + j) // STAGES) & 1)
            s_acc = warpgroup_mma(q_tile, k_smem.index(st).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            acc = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
            s_acc = warpgroup_mma_wait(num_outstanding=1, deps=(s_acc,))
            if IS_CAUSAL:
                if j * BLOCK_N + BLOCK_N > m_start:
                    offs_n = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=col_s)
                    s_acc = gl.where(offs_n[None, :] <= offs_m[:, None], s_acc, float("-inf"))
            else:
                if j * BLOCK_N + BLOCK_N > N:
                    offs_n = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=col_s)
                    s_acc = gl.where(offs_n[None, :] < N, s_acc, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s_acc, 1) * qk_scale)
            alpha = gl.exp2(m_i - m_new)
            p = gl.exp2(s_acc * qk_scale - m_new[:, None])
            l_i = l_i * alpha + gl.sum(p, 1)
            m_i = m_new
            acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
            mbarrier.arrive(empty.index(prev), count=1)
            acc = acc * gl.convert_layout(alpha, row_o)[:, None]
            p_op = gl.convert_layout(p.to(dtype), p_layout)

        # Every S of this tile is waited for: Q's buffer can take the tile after next.
        mbarrier.arrive(q_empty.index(qb), count=1)
        last = (kv + n_tiles - 1) % STAGES
        acc = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index(last), count=1)

        acc = acc / gl.convert_layout(l_i, row_o)[:, None]
        rows_o = m_start + gl.arange(0, BM, layout=row_o)
        cols_o = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
        o_ptrs = O + (row0 + rows_o)[:, None].to(gl.int64) * HEAD_DIM + cols_o[None, :]
        gl.store(o_ptrs, acc.to(dtype), mask=(rows_o < N)[:, None])
        gl.store(LSE + row0 + offs_m, (m_i + gl.log2(l_i)) * 0.6931471805599453, mask=offs_m < N)
        kv += n_tiles
        i += 1


@gluon.jit
def _gluon_fwd_ws_persistent(q_desc, k_desc, v_desc, O, LSE, BH, N, qk_scale,
                             HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                             NUM_WG: gl.constexpr, CONSUMER_REGS: gl.constexpr, LOADER_REGS: gl.constexpr,
                             IS_CAUSAL: gl.constexpr, num_warps: gl.constexpr):
    BM_CTA: gl.constexpr = NUM_WG * 64
    n_m = gl.cdiv(N, BM_CTA)
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [2 * NUM_WG] + q_desc.block_type.shape, q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for b in gl.static_range(2):
        mbarrier.init(q_ready.index(b), count=1)
        mbarrier.init(q_empty.index(b), count=NUM_WG)
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=NUM_WG)
    # Written out in full, as in _gluon_fwd_ws (a tuple built by `+` drops its constexprs' wrapping).
    if NUM_WG == 2:
        gl.warp_specialize([
            (_pers_consumer, (O, LSE, q_smem, k_smem, v_smem, q_ready, q_empty, ready, empty, BH, n_m, N, qk_scale,
                              0, NUM_WG, HEAD_DIM, BLOCK_N, STAGES, IS_CAUSAL)),
            (_pers_consumer, (O, LSE, q_smem, k_smem, v_smem, q_ready, q_empty, ready, empty, BH, n_m, N, qk_scale,
                              1, NUM_WG, HEAD_DIM, BLOCK_N, STAGES, IS_CAUSAL)),
            (_pers_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, ready, empty, BH, n_m,
                            N, NUM_WG, BLOCK_N, STAGES, IS_CAUSAL)),
        ], [4, 1], [CONSUMER_REGS, LOADER_REGS])
    else:
        gl.warp_specialize([
            (_pers_consumer, (O, LSE, q_smem, k_smem, v_smem, q_ready, q_empty, ready, empty, BH, n_m, N, qk_scale,
                              0, NUM_WG, HEAD_DIM, BLOCK_N, STAGES, IS_CAUSAL)),
            (_pers_consumer, (O, LSE, q_smem, k_smem, v_smem, q_ready, q_empty, ready, empty, BH, n_m, N, qk_scale,
                              1, NUM_WG, HEAD_DIM, BLOCK_N, STAGES, IS_CAUSAL)),
            (_pers_consumer, (O, LSE, q_smem, k_smem, v_smem, q_ready, q_empty, ready, empty, BH, n_m, N, qk_scale,
                              2, NUM_WG, HEAD_DIM, BLOCK_N, STAGES, IS_CAUSAL)),
            (_pers_loader, (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_ready, q_empty, ready, empty, BH, n_m,
                            N, NUM_WG, BLOCK_N, STAGES, IS_CAUSAL)),
        ], [4, 4, 1], [CONSUMER_REGS, CONSUMER_REGS, LOADER_REGS])


# %% Host -----------------------------------------------------------------------------------------------------------

def launch_args(q4, k4, v4, o4, lse, is_causal, scale, tiles, pingpong=False, head_group=0):
    """(grid, args, kwargs) of one launch on contiguous (B, H, N, D) q4, k4, v4 and outputs ``o4`` (like q4) and
    ``lse`` ((B, H, N) float32, contiguous); ``tiles`` as in ``TILES``. Tensors may be on the CPU (a compile report)."""
    B, H, N, D = q4.shape
    wg, bn, stages, maxnreg, cregs, lregs = tiles
    gdt = gl.bfloat16 if q4.dtype == torch.bfloat16 else gl.float16
    q2, k2, v2 = (t.view(B * H * N, D) for t in (q4, k4, v4))
    q_layout = gl.NVMMASharedLayout.get_default_for([WG_ROWS, D], gdt)
    kv_layout = gl.NVMMASharedLayout.get_default_for([bn, D], gdt)
    q_desc = TensorDescriptor(q2, list(q2.shape), list(q2.stride()), [WG_ROWS, D], q_layout)
    k_desc = TensorDescriptor(k2, list(k2.shape), list(k2.stride()), [bn, D], kv_layout)
    v_desc = TensorDescriptor(v2, list(v2.shape), list(v2.stride()), [bn, D], kv_layout)
    n_m = triton.cdiv(N, wg * WG_ROWS)
    grid = (B * H, n_m) if is_causal else (n_m, B * H)
    args = (q_desc, k_desc, v_desc, o4, lse, N, scale * LOG2E)
    kwargs = dict(HEAD_DIM=D, BLOCK_N=bn, STAGES=stages, NUM_WG=wg, CONSUMER_REGS=cregs, LOADER_REGS=lregs,
                  IS_CAUSAL=bool(is_causal), PINGPONG=bool(pingpong), num_warps=4, maxnreg=maxnreg)
    if head_group:
        kwargs["HEAD_GROUP"] = int(head_group)
    return grid, args, kwargs


def persistent_launch_args(q4, k4, v4, o4, lse, scale, tiles, is_causal=False):
    """(grid, args, kwargs) of the persistent kernel: as ``launch_args``, with one CTA an SM (no more than the work
    tiles, NUM_WG x 64 query rows of one head each) and B*H passed in."""
    B, H, N, D = q4.shape
    _, args, kwargs = launch_args(q4, k4, v4, o4, lse, is_causal, scale, tiles)
    kwargs.pop("PINGPONG")
    q_desc, k_desc, v_desc, o4, lse, n, qk_scale = args
    n_work = B * H * triton.cdiv(N, tiles[0] * WG_ROWS)
    sms = torch.cuda.get_device_properties(q4.device).multi_processor_count if q4.is_cuda else 132
    return (min(sms, n_work),), (q_desc, k_desc, v_desc, o4, lse, B * H, n, qk_scale), kwargs


def launch_if_covered(q, k, v, is_causal, scale):
    """Step 05's hook: ``(O, LSE)`` from the Gluon kernel where it applies (``not_covered``), else None. q, k, v as
    step 05's ``forward`` takes them; O shaped like q, LSE ``q.shape[:-1]`` float32, both contiguous."""
    global LAUNCHES, LAST_KERNEL
    from .step05_triton_fwd import as_bhnd, head_group
    q4, k4, v4 = as_bhnd(q), as_bhnd(k), as_bhnd(v)
    if not_covered(q4, k4, v4, is_causal) is not None:
        return None
    o = q.new_empty(q.shape)
    lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
    D = q4.shape[-1]
    if not is_causal and D in PERSISTENT_TILES:
        grid, args, kwargs = persistent_launch_args(q4, k4, v4, as_bhnd(o), lse, scale, PERSISTENT_TILES[D])
        _gluon_fwd_ws_persistent[grid](*args, **kwargs)
        LAST_KERNEL = "persistent"
    else:
        group = head_group(q4.shape[2], D, q4.element_size()) if is_causal else 0
        grid, args, kwargs = launch_args(q4, k4, v4, as_bhnd(o), lse, is_causal, scale, TILES[D], head_group=group)
        _gluon_fwd_ws[grid](*args, **kwargs)
        LAST_KERNEL = "ws"
    LAUNCHES += 1
    return o, lse
