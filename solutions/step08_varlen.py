"""Step 08 -- ragged batches (varlen) and grouped-query attention, in Triton.

Pre-training packs documents of every length into one batch; padding them to the longest wastes
the compute and memory of every pad token, and an attention mask over the padded square wastes it
twice. The packed layout FlashAttention's ``flash_attn_varlen_func`` uses removes the padding:

    q: (total_q, H, D)     the sequences' tokens one after the other, no padding
    k, v: (total_k, H_kv, D)
    cu_seqlens_q: int32 (batch + 1,)   sequence b's queries are rows cu_seqlens_q[b] : cu_seqlens_q[b+1]
    cu_seqlens_k: the same for keys;   max_seqlen_q / max_seqlen_k: the longest, for the grid

Each program finds its sequence from ``cu_seqlens`` and runs exactly the dense kernels' tile loops
(step 05's ``_fwd_inner``; step 06's ``_dkdv_inner`` and ``_dq_tile``) on that sequence's rows,
with ``N_Q`` and ``N_K`` the sequence's own lengths: no program ever touches a pad token, because
there are none. Programs past their sequence's end do nothing (the grid is sized for the longest).

Grouped-query attention (GQA; MQA when H_kv = 1): H_q query heads share H_kv key/value heads,
G = H_q / H_kv query heads per K/V head. Query head h reads K/V head h // G: nothing is copied per
query head. In the backward, dK and dV of a K/V head sum over its G query heads: one program per
(key tile, K/V head) loops over the G heads, so each dK/dV element is still written once.

Causal masking is top-left within each sequence, as in every step of the course (query i of a
sequence sees that sequence's keys j <= i). A sequence with queries needs at least one key.

The LSE is ``(H, total_q)`` float32, as FlashAttention's varlen ``softmax_lse``: contiguous along
the tokens of a head, which is what the dense kernels' LSE loads assume.
"""

import weakref

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from attnlib import check_inputs
from attnlib.ops import configured, direct_launches, eager_fast, kernel_op, op_namespace, raise_if_stubbed, tiles
from attnlib.rowdot import rowdot_block, rowdot_kernel

from .step05_triton_fwd import LOG2E, _dot_precision, _fwd_inner, _pow2_dim, fwd_config, load_tile, store_tile
from .step06_triton_bwd import _dkdv_inner, _dq_tile, bwd_config, tiles_only

LN2: tl.constexpr = tl.constexpr(0.6931471805599453)


# %% Where a program's sequence lives -------------------------------------------------

@triton.jit
def _sequence(CU_Q, CU_K, b, h, GROUP):
    """Sequence ``b``'s first query row and query count, first key row and key count; query head h's K/V head."""
    # >>> STUDENT: q_start = CU_Q[b], N_Q = CU_Q[b + 1] - q_start, the same for keys (k_start, N_K) from CU_K; the K/V head of query head h is h // GROUP
    q_start = tl.load(CU_Q + b)
    N_Q = tl.load(CU_Q + b + 1) - q_start
    k_start = tl.load(CU_K + b)
    N_K = tl.load(CU_K + b + 1) - k_start
    kvh = h // GROUP
    # <<< STUDENT
    return q_start, N_Q, k_start, N_K, kvh


# %% Forward ------------------------------------------------------------------------

@triton.jit
def _varlen_fwd_kernel(
    Q, K, V, O, LSE, CU_Q, CU_K,                   # packed (total, heads, D); LSE (H, total_q) fp32; int32 offsets
    stride_qt, stride_qh, stride_qd,               # strides in elements: token, head, head dim
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_ot, stride_oh, stride_od,
    H, GROUP, TOTAL_Q, qk_scale,                   # query heads, query heads per K/V head, rows of q
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    qk_scale = tl.cast(qk_scale, tl.float32)       # fp64 when Inductor relaunches the kernel (step 05)
    PAD_D: tl.constexpr = BLOCK_D != HEAD_DIM
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    q_start, N_Q, k_start, N_K, kvh = _sequence(CU_Q, CU_K, b, h, GROUP)
    start_m = pid_m * BLOCK_M
    if start_m < N_Q:                              # the grid covers the longest sequence
        Q += q_start.to(tl.int64) * stride_qt + h.to(tl.int64) * stride_qh
        O += q_start.to(tl.int64) * stride_ot + h.to(tl.int64) * stride_oh
        K += k_start.to(tl.int64) * stride_kt + kvh.to(tl.int64) * stride_kh
        V += k_start.to(tl.int64) * stride_vt + kvh.to(tl.int64) * stride_vh
        LSE += h.to(tl.int64) * TOTAL_Q + q_start
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        q = load_tile(Q, offs_m, offs_d, stride_qt, stride_qd, N_Q, HEAD_DIM, True, PAD_D)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        # >>> STUDENT: the key ranges of step 05's kernel for this sequence: [0, hi_full) unmasked, [hi_full, hi) masked
        if IS_CAUSAL:
            hi_full = (tl.minimum(start_m, N_K) // BLOCK_N) * BLOCK_N
            hi = tl.minimum(start_m + BLOCK_M, N_K)
        else:
            hi_full = (N_K // BLOCK_N) * BLOCK_N
            hi = N_K
        # <<< STUDENT
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K, V, stride_kt, stride_kd, stride_vt, stride_vd,
                                   offs_m, offs_d, 0, hi_full, N_K, qk_scale,
                                   HEAD_DIM, BLOCK_N, PAD_D, False, IS_CAUSAL, DOT_PRECISION)
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K, V, stride_kt, stride_kd, stride_vt, stride_vd,
                                   offs_m, offs_d, hi_full, hi, N_K, qk_scale,
                                   HEAD_DIM, BLOCK_N, PAD_D, True, IS_CAUSAL, DOT_PRECISION)
        store_tile(O, acc * (1.0 / l_i)[:, None], offs_m, offs_d, stride_ot, stride_od, N_Q, HEAD_DIM)
        tl.store(LSE + offs_m, (m_i + tl.math.log2(l_i)) * LN2, mask=offs_m < N_Q)


# %% Backward: dK, dV per (key tile, K/V head), summed over the head's query heads ----------

@triton.jit
def _varlen_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, CU_Q, CU_K,   # DK, DV shaped like K; LSE, DELTA (H, total_q) fp32
    stride_qt, stride_qh, stride_qd,
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_dot, stride_doh, stride_dod,
    stride_dkt, stride_dkh, stride_dkd,            # dK and dV share one layout (both made here)
    H_KV, GROUP, TOTAL_Q, scale, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    scale = tl.cast(scale, tl.float32)
    qk_scale = tl.cast(qk_scale, tl.float32)
    PAD_D: tl.constexpr = BLOCK_D != HEAD_DIM
    pid_n = tl.program_id(0)
    bkv = tl.program_id(1)
    b = bkv // H_KV
    kvh = bkv % H_KV
    q_start, N_Q, k_start, N_K, _ = _sequence(CU_Q, CU_K, b, kvh * GROUP, GROUP)
    start_n = pid_n * BLOCK_N
    if start_n < N_K:
        K += k_start.to(tl.int64) * stride_kt + kvh.to(tl.int64) * stride_kh
        V += k_start.to(tl.int64) * stride_vt + kvh.to(tl.int64) * stride_vh
        DK += k_start.to(tl.int64) * stride_dkt + kvh.to(tl.int64) * stride_dkh
        DV += k_start.to(tl.int64) * stride_dkt + kvh.to(tl.int64) * stride_dkh
        offs_n = start_n + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        k = load_tile(K, offs_n, offs_d, stride_kt, stride_kd, N_K, HEAD_DIM, True, PAD_D)
        v = load_tile(V, offs_n, offs_d, stride_vt, stride_vd, N_K, HEAD_DIM, True, PAD_D)
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        # >>> STUDENT: the query ranges of step 06's _dkdv_tile (masked [lo, diag_end), unmasked [diag_end, q_full), masked tail [max(diag_end, q_full), N_Q)): the same for every query head of the group
        q_full = (N_Q // BLOCK_M) * BLOCK_M
        if IS_CAUSAL:
            lo = (start_n // BLOCK_M) * BLOCK_M
            diag_end = tl.minimum(tl.cdiv(start_n + BLOCK_N - 1, BLOCK_M) * BLOCK_M, N_Q)
        else:
            lo = 0
            diag_end = 0
        tail = tl.maximum(diag_end, q_full)
        # <<< STUDENT
        # >>> STUDENT: for each of the GROUP query heads h = kvh * GROUP + g: point Qh, DOh at (q_start, h) and LSEh, DELTAh at h * TOTAL_Q + q_start, then run step 06's _dkdv_inner over the three ranges, accumulating into dk, dv
        for g in range(0, GROUP):
            h = kvh * GROUP + g
            Qh = Q + q_start.to(tl.int64) * stride_qt + h.to(tl.int64) * stride_qh
            DOh = DO + q_start.to(tl.int64) * stride_dot + h.to(tl.int64) * stride_doh
            LSEh = LSE + h.to(tl.int64) * TOTAL_Q + q_start
            DELTAh = DELTA + h.to(tl.int64) * TOTAL_Q + q_start
            dk, dv = _dkdv_inner(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, Qh,
                                 stride_qt, stride_qd, stride_dot, stride_dod, 0, 0,
                                 offs_n, offs_d, lo, diag_end, N_Q, N_K, qk_scale,
                                 HEAD_DIM, BLOCK_M, PAD_D, True, IS_CAUSAL, False, DOT_PRECISION)
            dk, dv = _dkdv_inner(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, Qh,
                                 stride_qt, stride_qd, stride_dot, stride_dod, 0, 0,
                                 offs_n, offs_d, diag_end, q_full, N_Q, N_K, qk_scale,
                                 HEAD_DIM, BLOCK_M, PAD_D, False, IS_CAUSAL, False, DOT_PRECISION)
            dk, dv = _dkdv_inner(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, Qh,
                                 stride_qt, stride_qd, stride_dot, stride_dod, 0, 0,
                                 offs_n, offs_d, tail, N_Q, N_Q, N_K, qk_scale,
                                 HEAD_DIM, BLOCK_M, PAD_D, True, IS_CAUSAL, False, DOT_PRECISION)
        # <<< STUDENT
        in_range = (offs_n[:, None] < N_K) & (offs_d[None, :] < HEAD_DIM)
        tl.store(DK + offs_n[:, None] * stride_dkt + offs_d[None, :] * stride_dkd,
                 (dk * scale).to(DK.dtype.element_ty), mask=in_range)
        tl.store(DV + offs_n[:, None] * stride_dkt + offs_d[None, :] * stride_dkd,
                 dv.to(DV.dtype.element_ty), mask=in_range)


# %% Backward: dQ per (query tile, query head), step 06's _dq_tile on the sequence ----------

@triton.jit
def _varlen_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, CU_Q, CU_K,
    stride_qt, stride_qh, stride_qd,
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_dot, stride_doh, stride_dod,
    stride_dqt, stride_dqh, stride_dqd,
    H, GROUP, TOTAL_Q, scale, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    scale = tl.cast(scale, tl.float32)
    qk_scale = tl.cast(qk_scale, tl.float32)
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    q_start, N_Q, k_start, N_K, kvh = _sequence(CU_Q, CU_K, b, h, GROUP)
    if pid_m * BLOCK_M < N_Q:
        _dq_tile(Q + q_start.to(tl.int64) * stride_qt + h.to(tl.int64) * stride_qh,
                 K + k_start.to(tl.int64) * stride_kt + kvh.to(tl.int64) * stride_kh,
                 V + k_start.to(tl.int64) * stride_vt + kvh.to(tl.int64) * stride_vh,
                 DO + q_start.to(tl.int64) * stride_dot + h.to(tl.int64) * stride_doh,
                 LSE + h.to(tl.int64) * TOTAL_Q + q_start, DELTA + h.to(tl.int64) * TOTAL_Q + q_start,
                 DQ + q_start.to(tl.int64) * stride_dqt + h.to(tl.int64) * stride_dqh,
                 stride_qt, stride_qd, stride_kt, stride_kd, stride_vt, stride_vd,
                 stride_dot, stride_dod, stride_dqt, stride_dqd,
                 pid_m * BLOCK_M, N_Q, N_K, scale, qk_scale,
                 HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_D, IS_CAUSAL, DOT_PRECISION)


# %% Launchers ------------------------------------------------------------------------
#
# Tiles: the dense steps' tables, chosen for the longest sequence of the batch.

@direct_launches
def forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale):
    """``(O, LSE)``: O shaped like q, LSE ``(H, total_q)`` float32."""
    raise_if_stubbed(_varlen_fwd_kernel)
    total_q, H, d = q.shape
    group = H // k.shape[1]
    batch = cu_seqlens_q.shape[0] - 1
    o = q.new_empty(q.shape)
    lse = q.new_empty((H, total_q), dtype=torch.float32)
    cfg = fwd_config(max_seqlen_q, max_seqlen_k, d, q.dtype, is_causal, q.device.type, batch * H)
    kernel = configured(_varlen_fwd_kernel, cfg)
    wrap_triton(kernel)[(triton.cdiv(max(max_seqlen_q, 1), cfg["BLOCK_M"]), batch * H)](
        q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        H, group, total_q, scale * LOG2E,
        HEAD_DIM=d, BLOCK_D=_pow2_dim(d), IS_CAUSAL=is_causal, DOT_PRECISION=_dot_precision(q.dtype),
        **tiles(cfg))
    return o, lse


@direct_launches
def backward(q, k, v, o, lse, do, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale):
    """``(dQ, dK, dV)`` shaped like q, k, v."""
    raise_if_stubbed(_varlen_dkdv_kernel)
    if do.stride(-1) != 1:
        do = do.contiguous()                      # as step 06: an expanded dO loads slowly
    total_q, H, d = q.shape
    H_kv = k.shape[1]
    group = H // H_kv
    batch = cu_seqlens_q.shape[0] - 1
    bd = _pow2_dim(d)
    prec = _dot_precision(q.dtype)
    # D = rowsum(dO * O) per (head, token), (H, total_q) like the LSE, fp32, one kernel (attnlib/rowdot.py):
    # O and dO seen as (1, H, total_q, D) through their strides.
    delta = q.new_empty((H, total_q), dtype=torch.float32)
    o3, do3 = o.permute(1, 0, 2)[None], do.permute(1, 0, 2)[None]
    rbm, rbd = rowdot_block(d)
    pre = configured(rowdot_kernel, {})
    wrap_triton(pre)[(triton.cdiv(total_q, rbm), H)](
        o3, do3, delta, *o3.stride(), *do3.stride(), H, total_q, HEAD_DIM=d, BLOCK_M=rbm, BLOCK_D=rbd)
    dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    cfg = varlen_bwd_config(max_seqlen_q, max_seqlen_k, d, q.dtype, is_causal, q.device.type, batch * H)
    c = cfg["dkdv"]
    dkdv = configured(_varlen_dkdv_kernel, c)
    wrap_triton(dkdv)[(triton.cdiv(max(max_seqlen_k, 1), c["BLOCK_N"]), batch * H_kv)](
        q, k, v, do, lse, delta, dk, dv, cu_seqlens_q, cu_seqlens_k,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dk.stride(),
        H_kv, group, total_q, scale, scale * LOG2E,
        HEAD_DIM=d, BLOCK_D=bd, IS_CAUSAL=is_causal, DOT_PRECISION=prec, **tiles(c))
    c = cfg["dq"]
    dq_kernel = configured(_varlen_dq_kernel, c)
    wrap_triton(dq_kernel)[(triton.cdiv(max(max_seqlen_q, 1), c["BLOCK_M"]), batch * H)](
        q, k, v, do, lse, delta, dq, cu_seqlens_q, cu_seqlens_k,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(),
        H, group, total_q, scale, scale * LOG2E,
        HEAD_DIM=d, BLOCK_D=bd, IS_CAUSAL=is_causal, DOT_PRECISION=prec, **tiles(c))
    return dq, dk, dv


# Step 06's dQ tile at D <= 64 in 16 bits on a GPU (128x64, 8 warps) fits step 06's dQ kernel in 128
# registers, two programs per SM; step 08's, which also finds its sequence and its K/V head, takes 136-139
# and runs alone. 64x64 on 4 warps: backward 1.142 -> 1.043 ms causal, 1.742 -> 1.659 not, on a 16k-token
# ragged batch (H200, bf16; bench/experiments/triton_bwd_tiles.py, results/h200/triton/bwd_tiles.json).
_STEP06_DQ_D64 = dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
_VARLEN_DQ_D64 = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)
# Step 06's causal D <= 64 dK/dV tiles until 2026-12-01, the ones step 08 was measured with
# (results/h200/varlen/); step 06 moved to 32x64 on 4 warps at the leaderboard shape, not measured here.
_STEP06_DKDV_CAUSAL_D64 = dict(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=4, maxnreg=128)


def varlen_bwd_config(nq, nk, d, dtype, is_causal, device_type, bh):
    """Step 06's backward table, with step 08's own dQ tile where step 06's does not fit its dQ kernel."""
    cfg = tiles_only(bwd_config(nq, nk, d, dtype, is_causal, device_type, bh))
    if device_type == "cuda" and dtype != torch.float32 and _pow2_dim(d) <= 64 and is_causal:
        cfg = dict(cfg, dkdv=dict(_STEP06_DKDV_CAUSAL_D64))
    return dict(cfg, dq=dict(_VARLEN_DQ_D64)) if cfg["dq"] == _STEP06_DQ_D64 else cfg


# %% Input checks, the operators, autograd and the public API ------------------------------

# The values of cu_seqlens decide where every program reads and writes: wrong ones are out-of-bounds
# accesses, not an error. Reading them on the host is a device sync, and a sync a call stops the host
# from running ahead of the GPU: at 16k tokens step 08's forward took 0.42 ms against dense step 06's
# 0.21 on the same work, with the same compiled kernel (H200, bench/varlen_gpu.py, varlen_uniform).
# So they are read once per pair of cu_seqlens tensors (one sync for every check), and the check is
# remembered while the same tensor objects come back unchanged (their version counter: any in-place
# write bumps it), as a model's layers and the backward pass them. Under torch.compile they are not read.
_CHECKED: dict = {}     # (id(cu_q), id(cu_k)) -> (weakref cu_q, weakref cu_k, stamp)


def _stamp(cu_q, cu_k, q, k, mq, mk):
    return (cu_q._version, cu_k._version, q.shape[0], k.shape[0], int(mq), int(mk))


def _values_checked(cu_q, cu_k, q, k, mq, mk):
    hit = _CHECKED.get((id(cu_q), id(cu_k)))
    return hit is not None and hit[0]() is cu_q and hit[1]() is cu_k and hit[2] == _stamp(cu_q, cu_k, q, k, mq, mk)


def _mark_checked(cu_q, cu_k, q, k, mq, mk):
    if len(_CHECKED) > 256:
        _CHECKED.clear()
    _CHECKED[(id(cu_q), id(cu_k))] = (weakref.ref(cu_q), weakref.ref(cu_k), _stamp(cu_q, cu_k, q, k, mq, mk))


def _check_values(cu_q, cu_k, q, k, mq, mk, where):
    lq, lk = torch.diff(cu_q), torch.diff(cu_k)
    lonely = (lq > 0) & (lk == 0)                                 # queries with no key to attend to
    facts = torch.stack([cu_q[0], cu_q[-1], lq.min(), lq.max(), cu_k[0], cu_k[-1], lk.min(), lk.max(),
                         lonely.any().to(cu_q.dtype), lonely.to(cu_q.dtype).argmax().to(cu_q.dtype)]).tolist()
    for name, cu, (first, last, shortest, longest), total, mx in (
            ("q", cu_q, facts[0:4], q.shape[0], mq), ("k", cu_k, facts[4:8], k.shape[0], mk)):
        if first != 0 or last != total or shortest < 0:
            offs = cu[:9].tolist()
            raise ValueError(f"{where}: cu_seqlens_{name} must start at 0, never decrease and end at the "
                             f"{total} rows of {name}; got {offs[:8]}{'...' if len(offs) > 8 else ''}")
        if longest > mx:
            raise ValueError(f"{where}: max_seqlen_{name}={mx} but a sequence has {longest} rows")
    if facts[8]:
        b = facts[9]
        raise ValueError(f"{where}: sequence {b} has {int(lq[b])} queries and no key to attend to")


def check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale,
                 where="step08 attention_varlen"):
    """Validate the packed inputs; return the scale. Values of cu_seqlens are read (one sync) unless compiling."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"{where}: {name} must be a packed (total_tokens, heads, D) tensor, got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if k.shape != v.shape:
        raise ValueError(f"{where}: v must be shaped like k, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"{where}: q and k must have the same head dim D, got {q.shape[2]} and {k.shape[2]}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{where}: the query heads ({q.shape[1]}) must be a multiple of the K/V heads "
                         f"({k.shape[1]}) for grouped-query attention")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"{where}: q, k, v must share one dtype among float16, bfloat16, float32; got "
                         f"{q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device == cu_seqlens_q.device == cu_seqlens_k.device):
        raise ValueError(f"{where}: q, k, v and both cu_seqlens must be on one device")
    if not 1 <= q.shape[2] <= 256:
        raise ValueError(f"{where}: head dim D={q.shape[2]} is outside 1..256")
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if cu.dtype != torch.int32 or cu.dim() != 1 or cu.shape[0] < 2:
            raise ValueError(f"{where}: {name} must be a 1-D int32 tensor of batch + 1 offsets, got "
                             f"{cu.dtype} {tuple(cu.shape)}")
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(f"{where}: cu_seqlens_q and cu_seqlens_k must list the same batch, got "
                         f"{cu_seqlens_q.shape[0] - 1} and {cu_seqlens_k.shape[0] - 1} sequences")
    if not isinstance(is_causal, bool):
        raise ValueError(f"{where}: is_causal must be a bool")
    if not torch.compiler.is_compiling() and not _values_checked(cu_seqlens_q, cu_seqlens_k, q, k, max_seqlen_q,
                                                                  max_seqlen_k):
        _check_values(cu_seqlens_q, cu_seqlens_k, q, k, max_seqlen_q, max_seqlen_k, where)
        _mark_checked(cu_seqlens_q, cu_seqlens_k, q, k, max_seqlen_q, max_seqlen_k)
    d = q.shape[2]
    return d ** -0.5 if scale is None else float(scale)


def _fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale):
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


def _fwd_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
              cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, is_causal: bool,
              scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale)


def _bwd_fake(q, k, v, o, lse, do, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _bwd_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
              do: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, max_seqlen_q: int,
              max_seqlen_k: int, is_causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return backward(q, k, v, o, lse, do, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale)


NAMESPACE = op_namespace(__name__)
bwd_op = kernel_op(f"{NAMESPACE}::step08_bwd", _bwd_impl, fake=_bwd_fake, opaque=True)   # maxnreg: ops.py
run_bwd = eager_fast(bwd_op, _bwd_impl)      # the operator when compiled, its launchers in eager mode (attnlib/ops.py)


def _setup_context(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, is_causal, scale = inputs
    ctx.save_for_backward(q, k, v, *output, cu_q, cu_k)
    ctx.args = (max_q, max_k, is_causal, scale)


def _backward(ctx, do, _dlse=None):
    q, k, v, o, lse, cu_q, cu_k = ctx.saved_tensors
    dq, dk, dv = run_bwd(q, k, v, o, lse, do, cu_q, cu_k, *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None


fwd_op = kernel_op(f"{NAMESPACE}::step08_fwd", _fwd_impl, fake=_fwd_fake,
                   backward=_backward, setup_context=_setup_context)
run_fwd = eager_fast(fwd_op, _fwd_impl)


class FlashAttentionVarlen(torch.autograd.Function):
    """``apply(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False, scale=None)`` -> O.

    Saves q, k, v, O, the LSE ``(H, total_q)`` and the two offset tensors: nothing per pad token.
    """

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False, scale=None):
        scale = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale)
        args = (q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), is_causal, scale)
        o, lse = run_fwd(*args)
        _setup_context(ctx, args, (o, lse))
        return o

    @staticmethod
    def backward(ctx, do):
        return _backward(ctx, do)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False, scale=None):
    """Attention over a packed batch of sequences (see the module doc). Returns O ``(total_q, H, D)``."""
    return FlashAttentionVarlen.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                      is_causal, scale)


def attention_varlen_with_lse(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal=False,
                              scale=None):
    """``(O, LSE)`` with LSE ``(H, total_q)`` float32, no autograd."""
    scale = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale,
                         where="step08 attention_varlen_with_lse")
    return forward(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), is_causal, scale)


def attention(q, k, v, is_causal=False, scale=None):
    """The course contract on ``(..., N, D)``: every (batch, head) a sequence of its own, packed with one head."""
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale, where="step08 attention",
                         dtypes=(torch.float16, torch.bfloat16, torch.float32))
    qp, kp, vp, cu_q, cu_k = _dense_as_packed(q, k, v)
    o = FlashAttentionVarlen.apply(qp, kp, vp, cu_q, cu_k, q.shape[-2], k.shape[-2], is_causal, scale)
    return o.view(q.shape)


def attention_with_lse(q, k, v, is_causal=False, scale=None):
    """``(O, LSE)`` of the contract, LSE ``(..., Nq)`` float32, no autograd."""
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale, where="step08 attention_with_lse",
                         dtypes=(torch.float16, torch.bfloat16, torch.float32))
    qp, kp, vp, cu_q, cu_k = _dense_as_packed(q, k, v)
    o, lse = forward(qp, kp, vp, cu_q, cu_k, q.shape[-2], k.shape[-2], is_causal, scale)
    return o.view(q.shape), lse.view(q.shape[:-1])


def _dense_as_packed(q, k, v):
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    n = q.shape[:-2].numel()
    offsets = torch.arange(n + 1, device=q.device, dtype=torch.int32)
    qp, kp, vp, cu_q, cu_k = (q.reshape(n * nq, 1, d), k.reshape(n * nk, 1, d), v.reshape(n * nk, 1, d),
                              offsets * nq, offsets * nk)
    if nq > 0 and nk == 0:
        raise ValueError("step08 attention: queries with no key to attend to (Nk = 0)")
    _mark_checked(cu_q, cu_k, qp, kp, nq, nk)            # right by construction: no sync to read them back
    return qp, kp, vp, cu_q, cu_k


def pack(seqs):
    """A list of ``(N_b, H, D)`` tensors -> (packed ``(sum N_b, H, D)``, cu_seqlens int32, max_seqlen)."""
    lens = [s.shape[0] for s in seqs]
    cu = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lens), 0)
    return torch.cat(seqs, 0), cu.to(seqs[0].device), max(lens)
