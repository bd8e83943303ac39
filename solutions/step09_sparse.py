"""Step 09 -- sliding window + global tokens: block-sparse attention in Triton.

Long-context models (Longformer, BigBird, Mistral's sliding window) let each token see only its
neighbours within a ``window``, plus a few ``global`` tokens that everyone sees and that see
everyone. The score matrix is then mostly empty, and a kernel that only visits the tiles with
something visible does O(N * window) work instead of O(N^2):

    visible(i, j) = |i - j| < window  or  j < n_global  or  i < n_global     (and j <= i if causal)

``visible`` below is the one statement of the pattern, in the style of FlexAttention's
``mask_mod``: the kernels call it on tiles of indices, and the float64 reference calls the same
function (its ``.fn``) on index tensors to build its boolean mask.

Which tiles each program visits (the tile schedule, a few integer operations per program):

    forward / dQ, query tile [m0, m0 + BM):   all key tiles if the tile holds a global query;
        else the global key tiles [0, cdiv(n_global, BN) * BN), then the window's key tiles
        [floor((m0 - window + 1) / BN) * BN, m0 + BM + window - 1) (to m0 + BM when causal)
    dK/dV, key tile [n0, n0 + BN):            all query tiles if the tile holds a global key;
        else the global query tiles, then the window's query tiles

Within each of those ranges the tiles whose every (query, key) pair is visible form one run
(``_full_keys``, ``_full_queries``): each range is walked as step 05 walks the causal diagonal, in
three stages, masked / unmasked / masked, the mask a compile-time flag (``MASKED``), so the interior
tiles carry no mask code at all, and only the tiles that cross the window's edges, the diagonal, a
global token's edge or the sequence's end are masked. A query row
may see nothing in the first tiles it visits (the window starts inside a tile): the online
softmax then keeps m = -inf, and the update below guards exp2(-inf - -inf).

Coverage: Nq, Nk >= 1 with positions aligned top-left (as the course's causal mask), head dims
1..256, fp32 / fp16 / bf16. Every query must see at least one key: with Nq > Nk and no global
tokens, rows far past the last key would see nothing, so ``attention_sparse`` asks Nq == Nk.
"""

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from attnlib import check_inputs
from attnlib.ops import configured, direct_launches, eager_fast, kernel_op, op_namespace, raise_if_stubbed, tiles
from attnlib.rowdot import rowdot_block, rowdot_kernel

from .step05_triton_fwd import LOG2E, _dot_precision, _pow2_dim, as_bhnd, fwd_config, load_tile, store_tile
from .step06_triton_bwd import bwd_config, tiles_only

LN2: tl.constexpr = tl.constexpr(0.6931471805599453)
LOG2E_C: tl.constexpr = tl.constexpr(LOG2E)


# %% The pattern and the tile schedule ---------------------------------------------------

@triton.jit
def visible(q_idx, k_idx, WINDOW, N_GLOBAL, IS_CAUSAL: tl.constexpr):
    """True where query ``q_idx`` sees key ``k_idx`` (broadcasting index tiles or tensors)."""
    # >>> STUDENT: near = |q - k| < WINDOW as two comparisons of k against q - WINDOW and q + WINDOW (bounds computed per query row, not per pair); seen = near or k < N_GLOBAL or q < N_GLOBAL; if IS_CAUSAL also k <= q
    seen = (k_idx > (q_idx - WINDOW)) & (k_idx < (q_idx + WINDOW))
    seen = seen | (k_idx < N_GLOBAL) | (q_idx < N_GLOBAL)
    if IS_CAUSAL:
        seen = seen & (k_idx <= q_idx)
    return seen
    # <<< STUDENT


@triton.jit
def _full_keys(m0, N_Q, N_K, WINDOW, N_GLOBAL,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr):
    """For query tile [m0, m0 + BM): key tiles whose every pair is in range and visible start in
    [0, a_hi) among the global key tiles (range a of ``_key_ranges``) and in [b_lo, b_hi) among the
    window's (range b). A bound may leave out a full tile (it then runs masked), never take in a tile
    that is not full: tests/test_step09_sparse.py checks both against the explicit mask."""
    top = N_K - BLOCK_N + 1                                # the key tile ends inside N_K
    if IS_CAUSAL:
        top = tl.minimum(top, m0 - BLOCK_N + 2)            # its last key <= the tile's first query
    top = tl.where(m0 + BLOCK_M <= N_Q, top, 0)            # a query tile past N_Q: nothing is full
    # range a: the key tile is global through and through, or the query tile is
    a_hi = tl.where(m0 + BLOCK_M <= N_GLOBAL, top, tl.minimum(top, N_GLOBAL - BLOCK_N + 1))
    # range b: every pair within the window, |q - k| < WINDOW
    b_lo = m0 + BLOCK_M - WINDOW
    b_hi = tl.minimum(top, m0 + WINDOW - BLOCK_N + 1)
    return a_hi, b_lo, b_hi


@triton.jit
def _full_queries(n0, N_Q, N_K, WINDOW, N_GLOBAL,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr):
    """For key tile [n0, n0 + BN), the same for query tiles (``_query_ranges``' ranges a and b):
    full ones start in [bottom, a_hi) and in [b_lo, b_hi)."""
    top = N_Q - BLOCK_M + 1                                # the query tile ends inside N_Q
    top = tl.where(n0 + BLOCK_N <= N_K, top, 0)            # a key tile past N_K: nothing is full
    if IS_CAUSAL:
        bottom = n0 + BLOCK_N - 1                          # its first query >= the tile's last key
    else:
        bottom = n0 * 0
    a_hi = tl.where(n0 + BLOCK_N <= N_GLOBAL, top, tl.minimum(top, N_GLOBAL - BLOCK_M + 1))
    b_lo = tl.maximum(bottom, n0 + BLOCK_N - WINDOW)
    b_hi = tl.minimum(top, n0 + WINDOW - BLOCK_M + 1)
    return bottom, a_hi, b_lo, b_hi


@triton.jit
def _unmasked_part(lo, hi, f_lo, f_hi, BLOCK: tl.constexpr):
    """The unmasked stage [u_lo, u_hi) of the tile range [lo, hi) (lo a multiple of BLOCK): the tiles
    starting in [f_lo, f_hi). The range runs masked [lo, u_lo), unmasked [u_lo, u_hi), masked [u_hi, hi)."""
    u_lo = tl.minimum(tl.maximum(lo, tl.cdiv(tl.maximum(f_lo, 0), BLOCK) * BLOCK), hi)
    u_hi = tl.maximum(tl.minimum(hi, tl.cdiv(tl.maximum(f_hi, 0), BLOCK) * BLOCK), u_lo)
    return u_lo, u_hi


@triton.jit
def _key_ranges(m0, N_K, WINDOW, N_GLOBAL, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr):
    """The key tiles query tile [m0, m0 + BM) visits: [lo_a, hi_a) then [lo_b, hi_b), tile-aligned starts."""
    # >>> STUDENT: hi_all = N_K, or min(m0 + BM, N_K) when causal; a tile holding a global query (m0 < N_GLOBAL) visits [0, hi_all) (so lo_b = hi_b = hi_a = hi_all); else the global key tiles [0, g_end) with g_end = min(cdiv(N_GLOBAL, BN) * BN, hi_all), then the window [max(g_end, floor(max(m0 - WINDOW + 1, 0) / BN) * BN), min(m0 + BM + WINDOW - 1, N_K), or hi_all when causal); tl.where picks per case
    if IS_CAUSAL:
        hi_all = tl.minimum(m0 + BLOCK_M, N_K)
        w_hi = hi_all
    else:
        hi_all = N_K
        w_hi = tl.minimum(m0 + BLOCK_M + WINDOW - 1, N_K)
    glob = m0 < N_GLOBAL
    g_end = tl.minimum(tl.cdiv(N_GLOBAL, BLOCK_N) * BLOCK_N, hi_all)
    w_lo = (tl.maximum(m0 - WINDOW + 1, 0) // BLOCK_N) * BLOCK_N
    hi_a = tl.where(glob, hi_all, g_end)
    lo_b = tl.where(glob, hi_all, tl.maximum(g_end, w_lo))
    hi_b = tl.where(glob, hi_all, tl.maximum(tl.maximum(g_end, w_lo), w_hi))
    # <<< STUDENT
    return 0, hi_a, lo_b, hi_b


@triton.jit
def _query_ranges(n0, N_Q, WINDOW, N_GLOBAL, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr):
    """The query tiles that see key tile [n0, n0 + BN): [lo_a, hi_a) then [lo_b, hi_b)."""
    # >>> STUDENT: a tile holding a global key (n0 < N_GLOBAL) is seen by every query tile from first = 0 (causal: floor(n0 / BM) * BM) to N_Q; else the global query tiles [0, g_end) with g_end = min(cdiv(N_GLOBAL, BM) * BM, N_Q) (0 when causal: they come before the key), then the window [max(g_end, floor(lo / BM) * BM), min(n0 + BN + WINDOW - 1, N_Q)) with lo = n0 when causal, max(n0 - WINDOW + 1, 0) if not; tl.where picks per case
    if IS_CAUSAL:
        first = (n0 // BLOCK_M) * BLOCK_M
        w_lo = first
        g_end = 0
    else:
        first = 0
        w_lo = (tl.maximum(n0 - WINDOW + 1, 0) // BLOCK_M) * BLOCK_M
        g_end = tl.minimum(tl.cdiv(N_GLOBAL, BLOCK_M) * BLOCK_M, N_Q)
    glob = n0 < N_GLOBAL
    lo_a = tl.where(glob, first, 0)
    hi_a = tl.where(glob, N_Q, g_end)
    lo_b = tl.where(glob, N_Q, tl.maximum(g_end, w_lo))
    hi_b = tl.where(glob, N_Q, tl.maximum(tl.maximum(g_end, w_lo), tl.minimum(n0 + BLOCK_N + WINDOW - 1, N_Q)))
    # <<< STUDENT
    return lo_a, hi_a, lo_b, hi_b


# %% Forward -----------------------------------------------------------------------------

@triton.jit
def _sparse_fwd_inner(acc, l_i, m_i, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                      offs_m, offs_d, lo, hi, N_K, WINDOW, N_GLOBAL, qk_scale,
                      HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, PAD_D: tl.constexpr,
                      MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        # >>> STUDENT: the K and V tiles, loaded as in step 05's stages: only a MASKED stage can run past N_K
        k = load_tile(K, offs_n, offs_d, stride_kn, stride_kd, N_K, HEAD_DIM, MASKED, PAD_D)
        v = load_tile(V, offs_n, offs_d, stride_vn, stride_vd, N_K, HEAD_DIM, MASKED, PAD_D)
        # <<< STUDENT
        # >>> STUDENT: scores s = q @ k^T * qk_scale as in step 05; in a MASKED stage only, set s to -inf where not visible(...) or the key is >= N_K
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        if MASKED:                                       # a boundary tile: mask it
            seen = visible(offs_m[:, None], offs_n[None, :], WINDOW, N_GLOBAL, IS_CAUSAL) & (offs_n[None, :] < N_K)
            s = tl.where(seen, s, float("-inf"))
        # <<< STUDENT
        # >>> STUDENT: step 05's online softmax update in base 2, with one guard: where m_new is -inf (nothing seen yet in the row) subtract 0 instead, so exp2 never sees -inf - -inf
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
        # <<< STUDENT
    return acc, l_i, m_i


@triton.jit
def _sparse_fwd_range(acc, l_i, m_i, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                      offs_m, offs_d, lo, hi, f_lo, f_hi, N_K, WINDOW, N_GLOBAL, qk_scale,
                      HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, PAD_D: tl.constexpr,
                      IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """The key tiles [lo, hi) in three stages: masked, the full ones [f_lo, f_hi) unmasked, masked."""
    u_lo, u_hi = _unmasked_part(lo, hi, f_lo, f_hi, BLOCK_N)
    acc, l_i, m_i = _sparse_fwd_inner(acc, l_i, m_i, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                                      offs_m, offs_d, lo, u_lo, N_K, WINDOW, N_GLOBAL, qk_scale,
                                      HEAD_DIM, BLOCK_N, PAD_D, True, IS_CAUSAL, DOT_PRECISION)
    acc, l_i, m_i = _sparse_fwd_inner(acc, l_i, m_i, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                                      offs_m, offs_d, u_lo, u_hi, N_K, WINDOW, N_GLOBAL, qk_scale,
                                      HEAD_DIM, BLOCK_N, PAD_D, False, IS_CAUSAL, DOT_PRECISION)
    acc, l_i, m_i = _sparse_fwd_inner(acc, l_i, m_i, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                                      offs_m, offs_d, u_hi, hi, N_K, WINDOW, N_GLOBAL, qk_scale,
                                      HEAD_DIM, BLOCK_N, PAD_D, True, IS_CAUSAL, DOT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def _sparse_fwd_kernel(
    Q, K, V, O, LSE,                                       # (B, H, N, D); LSE (B*H, Nq) fp32
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    H, N_Q, N_K, WINDOW, N_GLOBAL, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    qk_scale = tl.cast(qk_scale, tl.float32)               # fp64 when Inductor relaunches the kernel (step 05)
    PAD_D: tl.constexpr = BLOCK_D != HEAD_DIM
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    Q += b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    K += b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
    V += b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh
    O += b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
    LSE += bh.to(tl.int64) * N_Q
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_tile(Q, offs_m, offs_d, stride_qm, stride_qd, N_Q, HEAD_DIM, True, PAD_D)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lo_a, hi_a, lo_b, hi_b = _key_ranges(m0, N_K, WINDOW, N_GLOBAL, BLOCK_M, BLOCK_N, IS_CAUSAL)
    a_hi, b_lo, b_hi = _full_keys(m0, N_Q, N_K, WINDOW, N_GLOBAL, BLOCK_M, BLOCK_N, IS_CAUSAL)
    acc, l_i, m_i = _sparse_fwd_range(acc, l_i, m_i, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                                      offs_m, offs_d, lo_a, hi_a, 0, a_hi, N_K, WINDOW, N_GLOBAL, qk_scale,
                                      HEAD_DIM, BLOCK_N, PAD_D, IS_CAUSAL, DOT_PRECISION)
    acc, l_i, m_i = _sparse_fwd_range(acc, l_i, m_i, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                                      offs_m, offs_d, lo_b, hi_b, b_lo, b_hi, N_K, WINDOW, N_GLOBAL, qk_scale,
                                      HEAD_DIM, BLOCK_N, PAD_D, IS_CAUSAL, DOT_PRECISION)
    store_tile(O, acc * (1.0 / l_i)[:, None], offs_m, offs_d, stride_om, stride_od, N_Q, HEAD_DIM)
    tl.store(LSE + offs_m, (m_i + tl.math.log2(l_i)) * LN2, mask=offs_m < N_Q)


# %% Backward ----------------------------------------------------------------------------

@triton.jit
def _sparse_dkdv_inner(dk, dv, k, v, Q, DO, LSE, DELTA, stride_qm, stride_qd, stride_dom, stride_dod,
                       offs_n, offs_d, lo, hi, N_Q, N_K, WINDOW, N_GLOBAL, qk_scale,
                       HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, PAD_D: tl.constexpr,
                       MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = load_tile(Q, offs_m, offs_d, stride_qm, stride_qd, N_Q, HEAD_DIM, MASKED, PAD_D)
        do = load_tile(DO, offs_m, offs_d, stride_dom, stride_dod, N_Q, HEAD_DIM, MASKED, PAD_D)
        if MASKED:
            lse2 = tl.load(LSE + offs_m, mask=offs_m < N_Q, other=0.0) * LOG2E_C
            delta = tl.load(DELTA + offs_m, mask=offs_m < N_Q, other=0.0)
        else:
            lse2 = tl.load(LSE + offs_m) * LOG2E_C
            delta = tl.load(DELTA + offs_m)
        # >>> STUDENT: step 06's recomputation, transposed: sT = k @ q^T * qk_scale, dpT = v @ do^T, pT = exp2(sT - lse2); in a MASKED stage only, pT = 0 where not visible(...) or out of range
        sT = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * qk_scale
        dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        pT = tl.math.exp2(sT - lse2[None, :])
        if MASKED:
            seen = visible(offs_m[None, :], offs_n[:, None], WINDOW, N_GLOBAL, IS_CAUSAL)
            pT = tl.where(seen & (offs_m[None, :] < N_Q) & (offs_n[:, None] < N_K), pT, 0.0)
        # <<< STUDENT
        # >>> STUDENT: step 06's dK/dV updates: dv += pT @ do; dsT = pT * (dpT - delta); dk += dsT @ q (casts to the operands' dtype)
        dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        dsT = pT * (dpT - delta[None, :])
        dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=DOT_PRECISION)
        # <<< STUDENT
    return dk, dv


@triton.jit
def _sparse_dkdv_range(dk, dv, k, v, Q, DO, LSE, DELTA, stride_qm, stride_qd, stride_dom, stride_dod,
                       offs_n, offs_d, lo, hi, f_lo, f_hi, N_Q, N_K, WINDOW, N_GLOBAL, qk_scale,
                       HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, PAD_D: tl.constexpr,
                       IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """The query tiles [lo, hi) in three stages: masked, the full ones [f_lo, f_hi) unmasked, masked."""
    u_lo, u_hi = _unmasked_part(lo, hi, f_lo, f_hi, BLOCK_M)
    dk, dv = _sparse_dkdv_inner(dk, dv, k, v, Q, DO, LSE, DELTA, stride_qm, stride_qd, stride_dom, stride_dod,
                                offs_n, offs_d, lo, u_lo, N_Q, N_K, WINDOW, N_GLOBAL, qk_scale,
                                HEAD_DIM, BLOCK_M, PAD_D, True, IS_CAUSAL, DOT_PRECISION)
    dk, dv = _sparse_dkdv_inner(dk, dv, k, v, Q, DO, LSE, DELTA, stride_qm, stride_qd, stride_dom, stride_dod,
                                offs_n, offs_d, u_lo, u_hi, N_Q, N_K, WINDOW, N_GLOBAL, qk_scale,
                                HEAD_DIM, BLOCK_M, PAD_D, False, IS_CAUSAL, DOT_PRECISION)
    dk, dv = _sparse_dkdv_inner(dk, dv, k, v, Q, DO, LSE, DELTA, stride_qm, stride_qd, stride_dom, stride_dod,
                                offs_n, offs_d, u_hi, hi, N_Q, N_K, WINDOW, N_GLOBAL, qk_scale,
                                HEAD_DIM, BLOCK_M, PAD_D, True, IS_CAUSAL, DOT_PRECISION)
    return dk, dv


@triton.jit
def _sparse_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,        # dK and dV share one layout (both made here)
    H, N_Q, N_K, WINDOW, N_GLOBAL, scale, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, FIRST_TILE=0,
):
    scale = tl.cast(scale, tl.float32)
    qk_scale = tl.cast(qk_scale, tl.float32)
    PAD_D: tl.constexpr = BLOCK_D != HEAD_DIM
    pid_n = tl.program_id(0) + FIRST_TILE          # key tiles before FIRST_TILE: _sparse_dkdv_split_kernel
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    Q += b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    K += b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
    V += b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh
    DO += b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
    DK += b.to(tl.int64) * stride_dkb + h.to(tl.int64) * stride_dkh
    DV += b.to(tl.int64) * stride_dkb + h.to(tl.int64) * stride_dkh
    LSE += bh.to(tl.int64) * N_Q
    DELTA += bh.to(tl.int64) * N_Q
    n0 = pid_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k = load_tile(K, offs_n, offs_d, stride_kn, stride_kd, N_K, HEAD_DIM, True, PAD_D)
    v = load_tile(V, offs_n, offs_d, stride_vn, stride_vd, N_K, HEAD_DIM, True, PAD_D)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    lo_a, hi_a, lo_b, hi_b = _query_ranges(n0, N_Q, WINDOW, N_GLOBAL, BLOCK_M, BLOCK_N, IS_CAUSAL)
    a_lo, a_hi, b_lo, b_hi = _full_queries(n0, N_Q, N_K, WINDOW, N_GLOBAL, BLOCK_M, BLOCK_N, IS_CAUSAL)
    dk, dv = _sparse_dkdv_range(dk, dv, k, v, Q, DO, LSE, DELTA, stride_qm, stride_qd, stride_dom, stride_dod,
                                offs_n, offs_d, lo_a, hi_a, a_lo, a_hi, N_Q, N_K, WINDOW, N_GLOBAL, qk_scale,
                                HEAD_DIM, BLOCK_M, PAD_D, IS_CAUSAL, DOT_PRECISION)
    dk, dv = _sparse_dkdv_range(dk, dv, k, v, Q, DO, LSE, DELTA, stride_qm, stride_qd, stride_dom, stride_dod,
                                offs_n, offs_d, lo_b, hi_b, b_lo, b_hi, N_Q, N_K, WINDOW, N_GLOBAL, qk_scale,
                                HEAD_DIM, BLOCK_M, PAD_D, IS_CAUSAL, DOT_PRECISION)
    in_range = (offs_n[:, None] < N_K) & (offs_d[None, :] < HEAD_DIM)
    tl.store(DK + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd, (dk * scale).to(DK.dtype.element_ty),
             mask=in_range)
    tl.store(DV + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd, dv.to(DV.dtype.element_ty),
             mask=in_range)


@triton.jit
def _sparse_dq_inner(dq, q, do, lse2, delta, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                     offs_m, offs_d, lo, hi, N_K, WINDOW, N_GLOBAL, qk_scale,
                     HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, PAD_D: tl.constexpr,
                     MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        # >>> STUDENT: the K and V tiles, loaded as in step 05's stages: only a MASKED stage can run past N_K
        k = load_tile(K, offs_n, offs_d, stride_kn, stride_kd, N_K, HEAD_DIM, MASKED, PAD_D)
        v = load_tile(V, offs_n, offs_d, stride_vn, stride_vd, N_K, HEAD_DIM, MASKED, PAD_D)
        # <<< STUDENT
        # >>> STUDENT: step 06's recomputation: s = q @ k^T * qk_scale, p = exp2(s - lse2); in a MASKED stage only, p = 0 where not visible(...) or the key is >= N_K
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        p = tl.math.exp2(s - lse2[:, None])
        if MASKED:
            seen = visible(offs_m[:, None], offs_n[None, :], WINDOW, N_GLOBAL, IS_CAUSAL)
            p = tl.where(seen & (offs_n[None, :] < N_K), p, 0.0)
        # <<< STUDENT
        # >>> STUDENT: step 06's dQ update: dp = do @ v^T; ds = p * (dp - delta); dq += ds @ k (ds cast to k's dtype)
        dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
        # <<< STUDENT
    return dq


@triton.jit
def _sparse_dq_range(dq, q, do, lse2, delta, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                     offs_m, offs_d, lo, hi, f_lo, f_hi, N_K, WINDOW, N_GLOBAL, qk_scale,
                     HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, PAD_D: tl.constexpr,
                     IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """The key tiles [lo, hi) in three stages: masked, the full ones [f_lo, f_hi) unmasked, masked."""
    u_lo, u_hi = _unmasked_part(lo, hi, f_lo, f_hi, BLOCK_N)
    dq = _sparse_dq_inner(dq, q, do, lse2, delta, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                          offs_m, offs_d, lo, u_lo, N_K, WINDOW, N_GLOBAL, qk_scale,
                          HEAD_DIM, BLOCK_N, PAD_D, True, IS_CAUSAL, DOT_PRECISION)
    dq = _sparse_dq_inner(dq, q, do, lse2, delta, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                          offs_m, offs_d, u_lo, u_hi, N_K, WINDOW, N_GLOBAL, qk_scale,
                          HEAD_DIM, BLOCK_N, PAD_D, False, IS_CAUSAL, DOT_PRECISION)
    dq = _sparse_dq_inner(dq, q, do, lse2, delta, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                          offs_m, offs_d, u_hi, hi, N_K, WINDOW, N_GLOBAL, qk_scale,
                          HEAD_DIM, BLOCK_N, PAD_D, True, IS_CAUSAL, DOT_PRECISION)
    return dq


@triton.jit
def _sparse_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    H, N_Q, N_K, WINDOW, N_GLOBAL, scale, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, FIRST_TILE=0,
):
    scale = tl.cast(scale, tl.float32)
    qk_scale = tl.cast(qk_scale, tl.float32)
    PAD_D: tl.constexpr = BLOCK_D != HEAD_DIM
    pid_m = tl.program_id(0) + FIRST_TILE          # query tiles before FIRST_TILE: _sparse_dq_split_kernel
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    Q += b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    K += b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
    V += b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh
    DO += b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
    DQ += b.to(tl.int64) * stride_dqb + h.to(tl.int64) * stride_dqh
    LSE += bh.to(tl.int64) * N_Q
    DELTA += bh.to(tl.int64) * N_Q
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_tile(Q, offs_m, offs_d, stride_qm, stride_qd, N_Q, HEAD_DIM, True, PAD_D)
    do = load_tile(DO, offs_m, offs_d, stride_dom, stride_dod, N_Q, HEAD_DIM, True, PAD_D)
    lse2 = tl.load(LSE + offs_m, mask=offs_m < N_Q, other=0.0) * LOG2E_C
    delta = tl.load(DELTA + offs_m, mask=offs_m < N_Q, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lo_a, hi_a, lo_b, hi_b = _key_ranges(m0, N_K, WINDOW, N_GLOBAL, BLOCK_M, BLOCK_N, IS_CAUSAL)
    a_hi, b_lo, b_hi = _full_keys(m0, N_Q, N_K, WINDOW, N_GLOBAL, BLOCK_M, BLOCK_N, IS_CAUSAL)
    dq = _sparse_dq_range(dq, q, do, lse2, delta, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                          offs_m, offs_d, lo_a, hi_a, 0, a_hi, N_K, WINDOW, N_GLOBAL, qk_scale,
                          HEAD_DIM, BLOCK_N, PAD_D, IS_CAUSAL, DOT_PRECISION)
    dq = _sparse_dq_range(dq, q, do, lse2, delta, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                          offs_m, offs_d, lo_b, hi_b, b_lo, b_hi, N_K, WINDOW, N_GLOBAL, qk_scale,
                          HEAD_DIM, BLOCK_N, PAD_D, IS_CAUSAL, DOT_PRECISION)
    tl.store(DQ + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd, (dq * scale).to(DQ.dtype.element_ty),
             mask=(offs_m[:, None] < N_Q) & (offs_d[None, :] < HEAD_DIM))


# %% The tiles that see everything, split -----------------------------------------------------------
#
# A key tile holding a global key is seen by every query: its dK/dV program walks all N queries
# while every other program walks a window, and one such program per head sets the kernel's end
# (H200, N = 64k, window 256, 64 global tokens: forward + backward 7.85 ms against 3.49 without them;
# results/h200/sparse/README.md). The same holds for the dQ program of a query tile holding a global
# query (not causal: there a global query sees only the keys before it). These kernels give such a
# tile one program per chunk of SPLIT rows; each writes its partial sum (fp32) and the launcher adds
# them up: the main kernels start after these tiles (FIRST_TILE).

@triton.jit
def _sparse_dkdv_split_kernel(
    Q, K, V, DO, LSE, DELTA, PART,                       # PART (2, splits, B*H, tiles * BLOCK_N, HEAD_DIM) fp32
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    H, N_Q, N_K, WINDOW, N_GLOBAL, scale, qk_scale, SPLIT, ROWS,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    scale = tl.cast(scale, tl.float32)
    qk_scale = tl.cast(qk_scale, tl.float32)
    PAD_D: tl.constexpr = BLOCK_D != HEAD_DIM
    pid_s = tl.program_id(0)                             # which chunk of SPLIT query rows
    pid_n = tl.program_id(1)                             # which of the key tiles that hold a global key
    bh = tl.program_id(2)
    b = bh // H
    h = bh % H
    Q += b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    K += b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
    V += b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh
    DO += b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
    LSE += bh.to(tl.int64) * N_Q
    DELTA += bh.to(tl.int64) * N_Q
    n0 = pid_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k = load_tile(K, offs_n, offs_d, stride_kn, stride_kd, N_K, HEAD_DIM, True, PAD_D)
    v = load_tile(V, offs_n, offs_d, stride_vn, stride_vd, N_K, HEAD_DIM, True, PAD_D)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    lo, hi, _, _ = _query_ranges(n0, N_Q, WINDOW, N_GLOBAL, BLOCK_M, BLOCK_N, IS_CAUSAL)   # the whole column
    lo = tl.maximum(lo, pid_s * SPLIT)                   # SPLIT is a multiple of BLOCK_M: tiles stay aligned
    hi = tl.minimum(hi, pid_s * SPLIT + SPLIT)
    a_lo, a_hi, _, _ = _full_queries(n0, N_Q, N_K, WINDOW, N_GLOBAL, BLOCK_M, BLOCK_N, IS_CAUSAL)
    dk, dv = _sparse_dkdv_range(dk, dv, k, v, Q, DO, LSE, DELTA, stride_qm, stride_qd, stride_dom, stride_dod,
                                offs_n, offs_d, lo, hi, a_lo, a_hi, N_Q, N_K, WINDOW, N_GLOBAL, qk_scale,
                                HEAD_DIM, BLOCK_M, PAD_D, IS_CAUSAL, DOT_PRECISION)
    part = PART + ((pid_s * tl.num_programs(2) + bh).to(tl.int64) * ROWS) * HEAD_DIM
    where = part + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    in_range = (offs_n[:, None] < ROWS) & (offs_d[None, :] < HEAD_DIM)
    tl.store(where, dk * scale, mask=in_range)
    half = tl.num_programs(0).to(tl.int64) * tl.num_programs(2) * ROWS * HEAD_DIM    # dV after every dK
    tl.store(where + half, dv, mask=in_range)


@triton.jit
def _sparse_dq_split_kernel(
    Q, K, V, DO, LSE, DELTA, PART,                       # PART (splits, B*H, tiles * BLOCK_M, HEAD_DIM) fp32
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    H, N_Q, N_K, WINDOW, N_GLOBAL, scale, qk_scale, SPLIT, ROWS,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    scale = tl.cast(scale, tl.float32)
    qk_scale = tl.cast(qk_scale, tl.float32)
    PAD_D: tl.constexpr = BLOCK_D != HEAD_DIM
    pid_s = tl.program_id(0)                             # which chunk of SPLIT keys
    pid_m = tl.program_id(1)                             # which of the query tiles that hold a global query
    bh = tl.program_id(2)
    b = bh // H
    h = bh % H
    Q += b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    K += b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
    V += b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh
    DO += b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
    LSE += bh.to(tl.int64) * N_Q
    DELTA += bh.to(tl.int64) * N_Q
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_tile(Q, offs_m, offs_d, stride_qm, stride_qd, N_Q, HEAD_DIM, True, PAD_D)
    do = load_tile(DO, offs_m, offs_d, stride_dom, stride_dod, N_Q, HEAD_DIM, True, PAD_D)
    lse2 = tl.load(LSE + offs_m, mask=offs_m < N_Q, other=0.0) * LOG2E_C
    delta = tl.load(DELTA + offs_m, mask=offs_m < N_Q, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lo, hi, _, _ = _key_ranges(m0, N_K, WINDOW, N_GLOBAL, BLOCK_M, BLOCK_N, IS_CAUSAL)     # the whole row
    lo = tl.maximum(lo, pid_s * SPLIT)                   # SPLIT is a multiple of BLOCK_N
    hi = tl.minimum(hi, pid_s * SPLIT + SPLIT)
    a_hi, _, _ = _full_keys(m0, N_Q, N_K, WINDOW, N_GLOBAL, BLOCK_M, BLOCK_N, IS_CAUSAL)
    dq = _sparse_dq_range(dq, q, do, lse2, delta, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                          offs_m, offs_d, lo, hi, 0, a_hi, N_K, WINDOW, N_GLOBAL, qk_scale,
                          HEAD_DIM, BLOCK_N, PAD_D, IS_CAUSAL, DOT_PRECISION)
    part = PART + ((pid_s * tl.num_programs(2) + bh).to(tl.int64) * ROWS) * HEAD_DIM
    tl.store(part + offs_m[:, None] * HEAD_DIM + offs_d[None, :], dq * scale,
             mask=(offs_m[:, None] < ROWS) & (offs_d[None, :] < HEAD_DIM))


def split_rows(device_type):
    """Rows (or keys) per program for the tiles that see everything: 1024 on a GPU (32 steps of dK/dV's
    32-row tiles); 64 in the interpreter, so that the CPU tests' short sequences are split too."""
    return 1024 if device_type == "cuda" else 64


# %% Launchers: the dense steps' tile tables, with what step 09 measured otherwise -----------------------

def sparse_fwd_config(nq, nk, d, dtype, is_causal, device_type, bh=1):
    """Step 05's forward table, except: on a GPU, 16-bit, D <= 64, its 8-warp tiles capped at 128
    registers a thread (``maxnreg``), so that two programs share an SM. Uncapped, step 09's forward
    takes 178 (one program per SM: its mask and its two ranges need more than step 05's). H200, B=1
    H=16 bf16 causal, 16k-64k tokens, window 256-4096: 1.25-1.33x faster than uncapped, 0.88-1.11x
    FlexAttention (bench/experiments/sparse_bwd_tiles.py; results/h200/sparse/README.md)."""
    cfg = fwd_config(nq, nk, d, dtype, is_causal, device_type, bh)
    if device_type == "cuda" and dtype != torch.float32 and _pow2_dim(d) <= 64 and cfg["num_warps"] == 8:
        cfg = dict(cfg, maxnreg=128)
    return cfg


def sparse_bwd_config(nq, nk, d, dtype, is_causal, device_type, bh=1):
    """Step 06's backward table, except on a GPU, 16-bit, D <= 64: dK/dV on 32x64 tiles, 4 warps, and dQ
    capped at 128 registers. Step 06's causal dK/dV tiles (32x128, 8 warps, capped at 128) spill 56 bytes
    a thread here, and uncapped they run one program per SM, 12-16% slower; 32x64 on 4 warps took the
    dK/dV + dQ backward 1-14% under step 06's table, and the cap on dQ (two programs per SM instead of
    one at 180 registers) about 6% (H200, the same run and shapes as ``sparse_fwd_config``)."""
    cfg = tiles_only(bwd_config(nq, nk, d, dtype, is_causal, device_type, bh))
    if device_type == "cuda" and dtype != torch.float32 and _pow2_dim(d) <= 64:
        cfg = dict(cfg, dkdv=dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=3),
                   dq=dict(cfg["dq"], maxnreg=128) if cfg["dq"]["num_warps"] == 8 else cfg["dq"])
    return cfg


def _in_range(window, nq, nk):
    """The same pattern with a window the kernels' int32 index arithmetic can hold: no |i - j| reaches
    max(Nq, Nk), so a wider window sees nothing more (``visible`` adds it to a query index)."""
    return min(int(window), max(nq, nk))


@direct_launches
def forward(q, k, v, window, n_global, is_causal, scale):
    """``(O, LSE)``: O shaped like q, LSE ``(..., Nq)`` float32."""
    raise_if_stubbed(_sparse_fwd_kernel)
    q4, k4, v4 = as_bhnd(q), as_bhnd(k), as_bhnd(v)
    B, H, nq, d = q4.shape
    nk = k4.shape[2]
    window = _in_range(window, nq, nk)
    o = q.new_empty(q.shape)
    lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
    o4 = as_bhnd(o)
    cfg = sparse_fwd_config(nq, nk, d, q.dtype, is_causal, q.device.type, B * H)
    kernel = configured(_sparse_fwd_kernel, cfg)
    wrap_triton(kernel)[(triton.cdiv(nq, cfg["BLOCK_M"]), B * H)](
        q4, k4, v4, o4, lse, *q4.stride(), *k4.stride(), *v4.stride(), *o4.stride(),
        H, nq, nk, window, n_global, scale * LOG2E,
        HEAD_DIM=d, BLOCK_D=_pow2_dim(d), IS_CAUSAL=is_causal, DOT_PRECISION=_dot_precision(q.dtype), **tiles(cfg))
    return o, lse


@direct_launches
def backward(q, k, v, o, lse, do, window, n_global, is_causal, scale, split=None):
    """``(dQ, dK, dV)`` shaped like q, k, v.

    ``split``: rows per program for the tiles that hold a global token (``split_rows``: None); 0 turns
    the split off (one program per tile, as the other tiles).
    """
    raise_if_stubbed(_sparse_dkdv_kernel)
    if do.stride(-1) != 1:
        do = do.contiguous()
    q4, k4, v4, do4 = (as_bhnd(t) for t in (q, k, v, do))
    B, H, nq, d = q4.shape
    nk = k4.shape[2]
    window = _in_range(window, nq, nk)
    bd, prec = _pow2_dim(d), _dot_precision(q.dtype)
    # D = rowsum(dO * O), fp32, one kernel (attnlib/rowdot.py: PyTorch's three took 0.42 ms at N = 32k)
    delta = q.new_empty((B * H, nq), dtype=torch.float32)
    o4 = as_bhnd(o)
    rbm, rbd = rowdot_block(d)
    pre = configured(rowdot_kernel, {})
    wrap_triton(pre)[(triton.cdiv(nq, rbm), B * H)](
        o4, do4, delta, *o4.stride(), *do4.stride(), H, nq, HEAD_DIM=d, BLOCK_M=rbm, BLOCK_D=rbd)
    lse = lse.reshape(B * H, nq).contiguous()     # the kernels index it as (B*H, nq), row stride nq: a row slice of a longer LSE (the ring passes lse[..., rows]) is a view with another stride
    dq, dk, dv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    dq4, dk4, dv4 = as_bhnd(dq), as_bhnd(dk), as_bhnd(dv)
    cfg = sparse_bwd_config(nq, nk, d, q.dtype, is_causal, q.device.type, B * H)
    split = split_rows(q.device.type) if split is None else split
    c = cfg["dkdv"]
    n_tiles = triton.cdiv(nk, c["BLOCK_N"])
    # The key tiles that hold a global key, split over chunks of queries (see _sparse_dkdv_split_kernel)
    # when their column is more than two chunks long.
    g_tiles = min(triton.cdiv(n_global, c["BLOCK_N"]), n_tiles) if split and nq > 2 * split else 0
    if g_tiles:
        chunk = triton.cdiv(split, c["BLOCK_M"]) * c["BLOCK_M"]
        n_splits = triton.cdiv(nq, chunk)
        rows = min(g_tiles * c["BLOCK_N"], nk)
        part = torch.empty((2, n_splits, B * H, rows, d), device=q.device, dtype=torch.float32)
        dkdv_split = configured(_sparse_dkdv_split_kernel, c)
        wrap_triton(dkdv_split)[(n_splits, g_tiles, B * H)](
            q4, k4, v4, do4, lse, delta, part,
            *q4.stride(), *k4.stride(), *v4.stride(), *do4.stride(),
            H, nq, nk, window, n_global, scale, scale * LOG2E, chunk, rows,
            HEAD_DIM=d, BLOCK_D=bd, IS_CAUSAL=is_causal, DOT_PRECISION=prec, **tiles(c))
        sums = part.sum(1).view(2, B, H, rows, d)
        dk4[:, :, :rows] = sums[0]
        dv4[:, :, :rows] = sums[1]
    if n_tiles > g_tiles:
        dkdv = configured(_sparse_dkdv_kernel, c)
        wrap_triton(dkdv)[(n_tiles - g_tiles, B * H)](
            q4, k4, v4, do4, lse, delta, dk4, dv4,
            *q4.stride(), *k4.stride(), *v4.stride(), *do4.stride(), *dk4.stride(),
            H, nq, nk, window, n_global, scale, scale * LOG2E,
            HEAD_DIM=d, BLOCK_D=bd, IS_CAUSAL=is_causal, DOT_PRECISION=prec, FIRST_TILE=g_tiles, **tiles(c))
    c = cfg["dq"]
    n_tiles = triton.cdiv(nq, c["BLOCK_M"])
    # The query tiles that hold a global query, split over chunks of keys; causal, they see few keys.
    g_tiles = (min(triton.cdiv(n_global, c["BLOCK_M"]), n_tiles)
               if split and not is_causal and nk > 2 * split else 0)
    if g_tiles:
        chunk = triton.cdiv(split, c["BLOCK_N"]) * c["BLOCK_N"]
        n_splits = triton.cdiv(nk, chunk)
        rows = min(g_tiles * c["BLOCK_M"], nq)
        part = torch.empty((n_splits, B * H, rows, d), device=q.device, dtype=torch.float32)
        dq_split = configured(_sparse_dq_split_kernel, c)
        wrap_triton(dq_split)[(n_splits, g_tiles, B * H)](
            q4, k4, v4, do4, lse, delta, part,
            *q4.stride(), *k4.stride(), *v4.stride(), *do4.stride(),
            H, nq, nk, window, n_global, scale, scale * LOG2E, chunk, rows,
            HEAD_DIM=d, BLOCK_D=bd, IS_CAUSAL=is_causal, DOT_PRECISION=prec, **tiles(c))
        dq4[:, :, :rows] = part.sum(0).view(B, H, rows, d)
    if n_tiles > g_tiles:
        dq_kernel = configured(_sparse_dq_kernel, c)
        wrap_triton(dq_kernel)[(n_tiles - g_tiles, B * H)](
            q4, k4, v4, do4, lse, delta, dq4,
            *q4.stride(), *k4.stride(), *v4.stride(), *do4.stride(), *dq4.stride(),
            H, nq, nk, window, n_global, scale, scale * LOG2E,
            HEAD_DIM=d, BLOCK_D=bd, IS_CAUSAL=is_causal, DOT_PRECISION=prec, FIRST_TILE=g_tiles, **tiles(c))
    return dq, dk, dv


# %% Input checks, the operators, autograd and the public API ------------------------------

def check_sparse(q, k, v, window, n_global, is_causal, scale, where="step09 attention_sparse"):
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale, where=where,
                         dtypes=(torch.float16, torch.bfloat16, torch.float32))
    for name, val in (("window", window), ("n_global", n_global)):
        if isinstance(val, bool) or not isinstance(val, int):
            raise ValueError(f"{where}: {name} must be an int, got {type(val).__name__}")
    if window < 1:
        raise ValueError(f"{where}: window must be at least 1 (a query sees itself), got {window}")
    if not 0 <= n_global <= k.shape[-2]:
        raise ValueError(f"{where}: n_global must be in 0..Nk={k.shape[-2]}, got {n_global}")
    return scale


def mask(nq, nk, window, n_global, is_causal, device=None):
    """The boolean (Nq, Nk) mask of the pattern, from the kernels' own ``visible``: for the reference."""
    q_idx = torch.arange(nq, device=device)[:, None]
    k_idx = torch.arange(nk, device=device)[None, :]
    return visible.fn(q_idx, k_idx, window, n_global, is_causal)


def _fwd_fake(q, k, v, window, n_global, is_causal, scale):
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


def _fwd_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, n_global: int, is_causal: bool,
              scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return forward(q, k, v, window, n_global, is_causal, scale)


def _bwd_fake(q, k, v, o, lse, do, window, n_global, is_causal, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _bwd_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
              do: torch.Tensor, window: int, n_global: int, is_causal: bool,
              scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return backward(q, k, v, o, lse, do, window, n_global, is_causal, scale)


NAMESPACE = op_namespace(__name__)
bwd_op = kernel_op(f"{NAMESPACE}::step09_bwd", _bwd_impl, fake=_bwd_fake, opaque=True)   # maxnreg: ops.py
run_bwd = eager_fast(bwd_op, _bwd_impl)      # the operator when compiled, its launchers in eager mode (attnlib/ops.py)


def _setup_context(ctx, inputs, output):
    q, k, v, window, n_global, is_causal, scale = inputs
    ctx.save_for_backward(q, k, v, *output)
    ctx.args = (window, n_global, is_causal, scale)


def _backward(ctx, do, _dlse=None):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = run_bwd(q, k, v, o, lse, do, *ctx.args)
    return dq, dk, dv, None, None, None, None


fwd_op = kernel_op(f"{NAMESPACE}::step09_fwd", _fwd_impl, fake=_fwd_fake,
                   backward=_backward, setup_context=_setup_context)
run_fwd = eager_fast(fwd_op, _fwd_impl)


class FlashAttentionSparse(torch.autograd.Function):
    """``apply(q, k, v, window, n_global, is_causal=False, scale=None)`` -> O; saves one LSE ``(..., Nq)``."""

    @staticmethod
    def forward(ctx, q, k, v, window, n_global, is_causal=False, scale=None):
        scale = check_sparse(q, k, v, window, n_global, is_causal, scale, where="step09 FlashAttentionSparse")
        args = (q, k, v, int(window), int(n_global), is_causal, scale)
        o, lse = run_fwd(*args)
        _setup_context(ctx, args, (o, lse))
        return o

    @staticmethod
    def backward(ctx, do):
        return _backward(ctx, do)


def attention_sparse(q, k, v, window, n_global=0, is_causal=False, scale=None):
    """Sliding-window + global-token attention on ``(..., N, D)`` (see the module doc); Nq == Nk."""
    if isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor) and q.shape[-2:-1] != k.shape[-2:-1]:
        raise ValueError(f"step09 attention_sparse: a window pattern needs Nq == Nk, got {q.shape[-2]} and {k.shape[-2]}")
    return FlashAttentionSparse.apply(q, k, v, window, n_global, is_causal, scale)


def attention(q, k, v, is_causal=False, scale=None):
    """The course contract: a window wider than the sequences, no global token (every pair visible)."""
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale, where="step09 attention",
                         dtypes=(torch.float16, torch.bfloat16, torch.float32))
    return FlashAttentionSparse.apply(q, k, v, max(q.shape[-2], k.shape[-2]) + 1, 0, is_causal, scale)


def attention_with_lse(q, k, v, is_causal=False, scale=None):
    """``(O, LSE)`` of the contract, no autograd."""
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale, where="step09 attention_with_lse",
                         dtypes=(torch.float16, torch.bfloat16, torch.float32))
    return forward(q, k, v, max(q.shape[-2], k.shape[-2]) + 1, 0, is_causal, scale)
