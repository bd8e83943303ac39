"""Step 05 -- FlashAttention-2's forward pass as one Triton kernel.

Step 04 wrote the algorithm with PyTorch tensors; every tile operation there
was a separate kernel launch that wrote its result to memory. Here one Triton
program does the whole loop for one tile of queries: the Q tile is loaded once
and stays in registers, K and V tiles stream past it, the running max ``m``,
running sum ``l`` and output accumulator stay on chip in fp32, and only O and
the LSE are written at the end. Memory traffic per program is one pass over
K and V, and no ``Nq x Nk`` tensor exists anywhere, not even on chip.

    grid = (cdiv(Nq, BLOCK_M), B * H)       program (i, bh): query rows i*BLOCK_M ...
    for each key tile j (skipping those above the diagonal when causal):
        S   = Q_i K_j^T * scale * log2(e)   (BLOCK_M, BLOCK_N), base-2 units
        m'  = max(m, rowmax(S));  P = 2^(S - m');  alpha = 2^(m - m')
        l   = alpha * l + rowsum(P);  acc = alpha * acc + P V_j;  m = m'
    O_i = acc / l;  LSE_i = (m + log2 l) * ln 2  (natural log, as the contract says)

Why base 2: ``exp(x) = 2^(x * log2 e)``. Folding ``log2 e`` into the softmax
scale costs nothing (one multiply that was there anyway), and ``exp2`` is the
GPU's native special-function instruction (``MUFU.EX2``); ``exp`` is ``exp2``
plus a multiply. The max and the sum are the same in either base, so only the
stored LSE is converted back to natural log.

Layout of this file: the tile helpers (``load_tile``, ``store_tile``, and the
kernel's pieces ``online_softmax_tile`` and ``key_range``), a warm-up for each piece
(a tiny kernel and its launcher, ``warmup_load_tile``, ``warmup_online_softmax_tile``,
``warmup_causal_key_range``: each testable alone, before the kernel exists), the inner
loop (``_fwd_inner``), the kernel (``_attn_fwd_kernel``), the tile table
(``fwd_config``), the launcher (``forward``), the launcher as a PyTorch operator
(``fwd_op``: ``torch.library.triton_op``, so ``torch.compile`` can hold it; see
attnlib/ops.py), the autograd Function whose backward is step 04's PyTorch one
(``FlashAttentionTritonFwd.apply(q, k, v, is_causal)``, as CS336 calls it), and the
public ``attention``. Between the kernel and the table: the TMA kernel
(``_attn_fwd_tma_kernel``); its launcher ``forward_tma`` follows ``forward``. The epilogue's
arithmetic is the helper ``finish_rows``, shared by both kernels.

Coverage: any Nq, Nk >= 1 (the last tiles are masked), head dims 1..256 (padded
to the next power of two >= 16 with masked loads: 80 and 96 run as 128), fp32
(dots in true fp32, ``input_precision="ieee"``), fp16 and bf16, any strides
(the kernel takes every stride; more than two leading dims are merged into one
when their strides allow it and copied once otherwise). On a CPU it runs in
Triton's interpreter (``TRITON_INTERPRET=1`` before triton is imported),
where bf16 dots are wrong: use fp32 or fp16 there.

TMA (``attention(..., tma=True)``, and by default where it pays): ``_attn_fwd_tma_kernel`` moves Q,
K, V and O by Hopper's bulk tensor copies through 4-D tensor descriptors (any N: tiles past N are
zero-filled, and the masked stage hides the padded keys), with the same helpers; ``tma_unsupported``
says why it cannot run where it cannot (with ``tma=True``, a ValueError, never a silent fallback). An
experiment with a TMA copy of this kernel (bench/experiments/triton_fwd_tma.py, results/h200/triton/)
found 1.02-1.11x over pointer loads at the same tiles at D=128 and nothing at D=64; this file's TMA
kernel, on the H200: 1.01-1.13x at D=128 for N >= 2048 but 0.40-0.77x for N 512-1024, 0.97-1.02x at
D=64 (bench/experiments/triton_fwd_tma_course.py, results/h200/grid_1202/). So ``tma=None``, the
default, takes it for 16-bit D=128 with N >= 2048 on sm_90 (``tma_by_default``): 0.89-0.97x cuDNN
from N = 4096 (pointers: 0.80-0.88x). Not done here in Triton: warp specialization (producer warps that only load,
consumer warps that only compute; NaN or slower in Triton 3.6, same experiment). The course's solution does it in
Gluon, Triton's lower layer, for N >= 4096 on Hopper (``hopper_fwd``; notebook 06 §11).
"""

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from attnlib import check_inputs
from attnlib.ops import _traced, configured, direct_launches, eager_fast, kernel_op, op_namespace, raise_if_stubbed, tiles

from .step04_flash_torch import BLOCK_K, BLOCK_Q, backward_strips

LOG2E = 1.4426950408889634                    # log2(e): exp(x) = exp2(x * LOG2E)
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)   # ln(2): log(x) = log2(x) * LN2


# %% Tile helpers -----------------------------------------------------------------

@triton.jit
def load_tile(base, rows, cols, stride_row, stride_col, n_rows, n_cols,
              CHECK_ROWS: tl.constexpr, CHECK_COLS: tl.constexpr):
    """Load ``base[rows, cols]`` as a (len(rows), len(cols)) tile; elements out of range read 0.

    base: pointer to element (0, 0) of one (batch, head) matrix; rows, cols: 1-D index ranges;
    CHECK_ROWS / CHECK_COLS: whether rows >= n_rows / cols >= n_cols can occur (a compile-time
    promise: a tile known to be in range is loaded with no mask, which is faster).
    """
    # >>> STUDENT: pointers = base + rows[:, None] * stride_row + cols[None, :] * stride_col; mask rows < n_rows only if CHECK_ROWS and cols < n_cols only if CHECK_COLS; tl.load(..., mask=..., other=0.0)
    ptrs = base + rows[:, None] * stride_row + cols[None, :] * stride_col
    if CHECK_ROWS:
        if CHECK_COLS:
            x = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0)
        else:
            x = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
    elif CHECK_COLS:
        x = tl.load(ptrs, mask=cols[None, :] < n_cols, other=0.0)
    else:
        x = tl.load(ptrs)
    # <<< STUDENT
    return x


@triton.jit
def store_tile(base, x, rows, cols, stride_row, stride_col, n_rows, n_cols):
    """Store the tile ``x`` at ``base[rows, cols]``, only where rows < n_rows and cols < n_cols."""
    # >>> STUDENT: same pointers as load_tile; tl.store(ptrs, x converted to base's element type with .to(base.dtype.element_ty), mask=rows and cols in range)
    ptrs = base + rows[:, None] * stride_row + cols[None, :] * stride_col
    tl.store(ptrs, x.to(base.dtype.element_ty), mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols))
    # <<< STUDENT


@triton.jit
def online_softmax_tile(acc, l_i, m_i,        # running state of this query tile, fp32: (BLOCK_M, BLOCK_D), (BLOCK_M,), (BLOCK_M,)
                        q, k, v,              # the Q tile (BLOCK_M, BLOCK_D), this key tile's K and V (BLOCK_N, BLOCK_D)
                        offs_m, offs_n,       # their row indices in the sequence: queries (BLOCK_M,), keys (BLOCK_N,)
                        N_K,                  # key length: keys >= N_K are padding
                        qk_scale,             # softmax scale * log2(e)
                        MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One key tile of the online softmax (base 2): returns the updated ``(acc, l_i, m_i)``.

    ``m_i`` is each row's running max of the scores in base-2 units (``q.k * qk_scale``), ``l_i`` the
    running sum of ``2^(s - m_i)``, ``acc`` the running sum of ``P V`` (not yet divided by ``l_i``).
    ``MASKED``: this tile may hold keys a row must not see (keys >= N_K; if ``IS_CAUSAL``, keys past
    the row's own index), whose scores become -inf; an unmasked tile is seen whole by every row.
    """
    # >>> STUDENT: scores s = q @ k^T (tl.dot(..., input_precision=DOT_PRECISION)) times qk_scale; when MASKED, set s to -inf where the key is >= N_K or, if IS_CAUSAL, where key > query
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale    # (BLOCK_M, BLOCK_N)
    if MASKED:
        visible = offs_n[None, :] < N_K
        if IS_CAUSAL:
            visible = visible & (offs_n[None, :] <= offs_m[:, None])
        s = tl.where(visible, s, float("-inf"))
    # <<< STUDENT
    # >>> STUDENT: online softmax in base 2: m_new = max(m_i, rowmax s); p = exp2(s - m_new); alpha = exp2(m_i - m_new); l_i = alpha*l_i + rowsum p; acc = alpha*acc + p @ v (p cast to v's dtype); m_i = m_new
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
    m_i = m_new
    # <<< STUDENT
    return acc, l_i, m_i


@triton.jit
def key_range(start_m, N_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr):
    """The keys the query tile of rows ``start_m .. start_m + BLOCK_M - 1`` visits: ``(hi_full, hi)``.

    ``[0, hi_full)``: whole key tiles that every row of the tile sees entirely (run without a mask;
    a multiple of BLOCK_N); ``[hi_full, hi)``: the tiles that need the mask (the diagonal, the last
    partial tile). ``hi`` is one past the last key any row of the tile sees: tiles from ``hi`` on are
    never loaded. Causal is aligned top-left: row i sees keys 0..i.
    """
    # >>> STUDENT: split the keys into [0, hi_full): tiles no row of this query tile needs masked (when causal: keys < start_m, whole tiles, and below N_K), and [hi_full, hi): masked tiles (diagonal, last partial); hi = N_K, or min(start_m + BLOCK_M, N_K) when causal
    if IS_CAUSAL:
        hi_full = (tl.minimum(start_m, N_K) // BLOCK_N) * BLOCK_N
        hi = tl.minimum(start_m + BLOCK_M, N_K)
    else:
        hi_full = (N_K // BLOCK_N) * BLOCK_N
        hi = N_K
    # <<< STUDENT
    return hi_full, hi


@triton.jit
def finish_rows(acc, l_i, m_i):
    """The epilogue's arithmetic, after the last key tile: ``(O, LSE)`` of the query tile.

    ``O = acc / l_i`` (the division happens once, here, not per tile); the LSE is the log of each
    row's softmax denominator in *natural* log, as the contract says, while ``m_i`` and ``l_i`` are
    kept in base 2. Both kernels (pointer loads and TMA) end with this.
    """
    # >>> STUDENT: epilogue: O = acc / l_i; LSE = (m_i + log2(l_i)) * LN2 (natural log); return both
    o = acc * (1.0 / l_i)[:, None]
    lse = (m_i + tl.math.log2(l_i)) * LN2
    # <<< STUDENT
    return o, lse


# %% Warm-ups: each helper launched alone -------------------------------------------
#
# In the spirit of Triton-Puzzles: each small kernel below calls ONE helper of the forward kernel
# on inputs you choose, and its launcher returns what the helper computed, so a helper can be
# written and tested before the rest of the kernel exists:
#
#     pytest -m step05 tests/test_step05_warmups.py        (each against plain PyTorch)
#
# The warm-up kernels and launchers are given; the helper they call is yours. Their own loads and
# stores are plain (contiguous tiles of known size, no masks), so no warm-up needs another helper.

@triton.jit
def _warmup_load_tile_kernel(X, OUT,                       # a 2-D matrix (any strides); the tile out, contiguous
                             stride_row, stride_col, n_rows, n_cols,
                             row0, col0,                   # the tile's element (0, 0) is X[row0, col0]
                             BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                             CHECK_ROWS: tl.constexpr, CHECK_COLS: tl.constexpr):
    i = tl.arange(0, BLOCK_R)
    j = tl.arange(0, BLOCK_C)
    x = load_tile(X, row0 + i, col0 + j, stride_row, stride_col, n_rows, n_cols, CHECK_ROWS, CHECK_COLS)
    tl.store(OUT + i[:, None] * BLOCK_C + j[None, :], x)


def warmup_load_tile(x, row0, col0, block_rows, block_cols):
    """``load_tile`` alone: the ``(block_rows, block_cols)`` tile of the 2-D ``x`` that starts at
    ``x[row0, col0]``, with 0 wherever the tile runs past x's rows or columns.

    ``x`` may have any strides (a transposed view, a slice of a larger buffer). CHECK_ROWS and
    CHECK_COLS are set as the kernel sets them: only when the tile can run past that edge.
    """
    raise_if_stubbed(_warmup_load_tile_kernel, whole_module=False)
    assert x.dim() == 2, f"x must be 2-D, got {tuple(x.shape)}"
    for n in (block_rows, block_cols):
        assert n >= 1 and n & (n - 1) == 0, f"tile sizes are powers of two (tl.arange), got {n}"
    n_rows, n_cols = x.shape
    out = x.new_empty(block_rows, block_cols)
    _warmup_load_tile_kernel[(1,)](
        x, out, x.stride(0), x.stride(1), n_rows, n_cols, row0, col0,
        BLOCK_R=block_rows, BLOCK_C=block_cols,
        CHECK_ROWS=row0 + block_rows > n_rows, CHECK_COLS=col0 + block_cols > n_cols)
    return out


@triton.jit
def _warmup_online_softmax_kernel(Q, K, V,                # tiles, contiguous: Q (BLOCK_M, BLOCK_D), K and V (BLOCK_N, BLOCK_D)
                                  M, L, ACC,              # the running state, fp32, contiguous, read then overwritten
                                  start_m, start_n, N_K,  # first query row and first key of the tiles; key length
                                  qk_scale,               # softmax scale * log2(e)
                                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                                  MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    qk_scale = tl.cast(qk_scale, tl.float32)
    i = tl.arange(0, BLOCK_M)
    j = tl.arange(0, BLOCK_N)
    d = tl.arange(0, BLOCK_D)
    q = tl.load(Q + i[:, None] * BLOCK_D + d[None, :])
    k = tl.load(K + j[:, None] * BLOCK_D + d[None, :])
    v = tl.load(V + j[:, None] * BLOCK_D + d[None, :])
    m_i = tl.load(M + i)
    l_i = tl.load(L + i)
    acc = tl.load(ACC + i[:, None] * BLOCK_D + d[None, :])
    acc, l_i, m_i = online_softmax_tile(acc, l_i, m_i, q, k, v, start_m + i, start_n + j, N_K, qk_scale,
                                        MASKED, IS_CAUSAL, DOT_PRECISION)
    tl.store(M + i, m_i)
    tl.store(L + i, l_i)
    tl.store(ACC + i[:, None] * BLOCK_D + d[None, :], acc)


def tile_needs_mask(start_m, block_m, start_n, block_n, n_keys, is_causal):
    """Whether some row of the query tile must not see some key of the key tile (the kernel's MASKED)."""
    return start_n + block_n > n_keys or (is_causal and start_n + block_n - 1 > start_m)


def warmup_online_softmax_tile(q, k, v, state=None, *, start_m=0, start_n=0, n_keys=None, is_causal=False,
                               masked=None, scale=None):
    """``online_softmax_tile`` alone: one program's query tile meets one key tile.

    q: ``(BLOCK_M, D)``, the queries of rows ``start_m ..``; k, v: ``(BLOCK_N, D)``, keys ``start_n ..``
    (BLOCK_M and BLOCK_N powers of two >= 16, as ``tl.dot`` wants; D is padded as the kernel pads it).
    state: ``(m, l, acc)`` before this tile, fp32: m ``(BLOCK_M,)`` the running max in base-2 units
    (scores times ``scale * log2 e``), l ``(BLOCK_M,)`` the running sum of ``2^(s - m)``, acc
    ``(BLOCK_M, D)`` the running sum of ``P V``; None: the kernel's start (-inf, 0, 0).
    n_keys: the key length N_K (default: every key of the tile is real); keys at or past it are padding.
    masked: run the tile as the kernel's masked stage (default: when it needs a mask, ``tile_needs_mask``).
    Returns the state after the tile, ``(m, l, acc)``, fp32, with acc ``(BLOCK_M, D)``.
    """
    raise_if_stubbed(_warmup_online_softmax_kernel, whole_module=False)
    bm, d = q.shape
    bn = k.shape[0]
    for n, what in ((bm, "BLOCK_M = q.shape[0]"), (bn, "BLOCK_N = k.shape[0]")):
        assert n >= 16 and n & (n - 1) == 0, f"{what} must be a power of two >= 16 (tl.dot), got {n}"
    assert k.shape == v.shape == (bn, d) and q.dtype == k.dtype == v.dtype, "k, v must be (BLOCK_N, D) like q's dtype"
    bd = _pow2_dim(d)
    n_keys = start_n + bn if n_keys is None else n_keys
    scale = d ** -0.5 if scale is None else scale
    if masked is None:
        masked = tile_needs_mask(start_m, bm, start_n, bn, n_keys, is_causal)

    def padded(t, rows):                       # (rows, D) -> (rows, BLOCK_D) contiguous, zeros past D
        out = t.new_zeros(rows, bd)
        out[:, :d] = t
        return out
    f32 = dict(dtype=torch.float32, device=q.device)
    if state is None:
        m, l, acc = torch.full((bm,), float("-inf"), **f32), torch.zeros(bm, **f32), torch.zeros(bm, d, **f32)
    else:
        m, l, acc = state
    m, l, acc = m.to(**f32).contiguous().clone(), l.to(**f32).contiguous().clone(), padded(acc.to(**f32), bm)
    _warmup_online_softmax_kernel[(1,)](
        padded(q, bm), padded(k, bn), padded(v, bn), m, l, acc, start_m, start_n, n_keys, scale * LOG2E,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=bd, MASKED=bool(masked), IS_CAUSAL=bool(is_causal),
        DOT_PRECISION=_dot_precision(q.dtype))
    return m, l, acc[:, :d]


@triton.jit
def _warmup_key_range_kernel(OUT,                          # (number of query tiles, 2) int32: (hi_full, hi) per tile
                             N_K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr):
    pid = tl.program_id(0)                                  # query tile pid: rows pid * BLOCK_M ...
    hi_full, hi = key_range(pid * BLOCK_M, N_K, BLOCK_M, BLOCK_N, IS_CAUSAL)
    tl.store(OUT + 2 * pid, hi_full)
    tl.store(OUT + 2 * pid + 1, hi)


def warmup_causal_key_range(n_q, n_k, block_m, block_n, is_causal=True, device=None):
    """``key_range`` alone: ``(hi_full, hi)`` for every query tile of ``n_q`` rows and ``n_k`` keys,
    as an int32 tensor ``(cdiv(n_q, block_m), 2)``; row t is the query tile of rows
    ``t * block_m ..``. Keys ``[0, hi_full)`` run unmasked, ``[hi_full, hi)`` masked, the rest never.
    """
    raise_if_stubbed(_warmup_key_range_kernel, whole_module=False)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    n_tiles = triton.cdiv(n_q, block_m)
    out = torch.full((n_tiles, 2), -1, dtype=torch.int32, device=device)
    _warmup_key_range_kernel[(n_tiles,)](out, n_k, BLOCK_M=block_m, BLOCK_N=block_n, IS_CAUSAL=bool(is_causal))
    return out


# %% The kernel ------------------------------------------------------------------

@triton.jit
def program_tile(IS_CAUSAL: tl.constexpr, HEADS_FIRST: tl.constexpr, HEAD_GROUP: tl.constexpr):
    """(query tile, batch * head) of this program: the order in which the GPU meets the tiles.

    Programs start in grid order, axis 0 fastest. The grid is (query tiles, B*H): one head's tiles one after
    another, so the few heads in flight keep their K and V in L2. HEADS_FIRST: the grid is (B*H, query tiles),
    every head's tile i before any head's tile i + 1. Under a causal mask the tiles are also reversed, the
    heaviest (the last rows see the most keys) first, so the light ones fill the end. HEAD_GROUP > 0 (with
    HEADS_FIRST): heads-first within groups of HEAD_GROUP heads, one group after another (FlashAttention-3's
    scheduler does this), so that only the group's K and V compete for L2 rather than every head's.
    """
    TILE_AXIS: tl.constexpr = 1 if HEADS_FIRST else 0
    n_m = tl.num_programs(TILE_AXIS)
    pid_m = tl.program_id(TILE_AXIS)
    bh = tl.program_id(1 - TILE_AXIS)
    if HEADS_FIRST and HEAD_GROUP > 0:
        n_bh = tl.num_programs(0)
        start = pid_m * n_bh + bh                         # this program's place in the launch order
        group = start // (HEAD_GROUP * n_m)
        heads = tl.minimum(HEAD_GROUP, n_bh - group * HEAD_GROUP)     # the last group may be smaller
        within = start - group * HEAD_GROUP * n_m
        pid_m = within // heads
        bh = group * HEAD_GROUP + within % heads
    if IS_CAUSAL:
        pid_m = n_m - 1 - pid_m
    return pid_m, bh


@triton.jit
def _fwd_inner(acc, l_i, m_i, q,            # running state (fp32) and the Q tile
               K, V,                         # pointers to this (batch, head)'s K and V
               stride_kn, stride_kd, stride_vn, stride_vd,
               offs_m, offs_d,               # query row indices (BLOCK_M,), head-dim indices (BLOCK_D,)
               lo, hi, N_K,                  # key range [lo, hi) of this stage; key length
               qk_scale,                     # softmax scale * log2(e)
               HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, PAD_D: tl.constexpr,
               MASKED: tl.constexpr,         # this stage holds diagonal / last tiles: mask scores
               IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One stage of the loop over key tiles: returns the updated (acc, l_i, m_i)."""
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        # >>> STUDENT: load the K tile and the V tile (BLOCK_N, BLOCK_D) with load_tile; only a MASKED stage can run past N_K, and columns need a check only when PAD_D
        k = load_tile(K, offs_n, offs_d, stride_kn, stride_kd, N_K, HEAD_DIM, MASKED, PAD_D)
        v = load_tile(V, offs_n, offs_d, stride_vn, stride_vd, N_K, HEAD_DIM, MASKED, PAD_D)
        # <<< STUDENT
        acc, l_i, m_i = online_softmax_tile(acc, l_i, m_i, q, k, v, offs_m, offs_n, N_K, qk_scale,
                                            MASKED, IS_CAUSAL, DOT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_kernel(
    Q, K, V, O, LSE,                                       # inputs (B, H, N, D); O like Q; LSE (B*H, Nq) fp32
    stride_qb, stride_qh, stride_qm, stride_qd,            # strides of Q, in elements
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    H, N_Q, N_K,                                           # heads, query and key lengths
    qk_scale,                                              # softmax scale * log2(e)
    HEAD_DIM: tl.constexpr,                                # the true head dim D
    BLOCK_M: tl.constexpr,                                 # query rows per program
    BLOCK_N: tl.constexpr,                                 # key rows per loop step
    BLOCK_D: tl.constexpr,                                 # head dim padded to a power of two >= 16
    IS_CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,                           # "ieee" for fp32 inputs (true fp32 dots)
    HEADS_FIRST: tl.constexpr = False,                     # grid (B*H, query tiles) instead of (query tiles, B*H)
    HEAD_GROUP: tl.constexpr = 0,                          # with HEADS_FIRST: that many heads at a time (0: all)
):
    PAD_D: tl.constexpr = BLOCK_D != HEAD_DIM
    # Triton types a Python float argument fp32; torch.compile's Inductor, relaunching this
    # kernel inside a compiled graph, types it fp64. Scores, max and accumulator would follow
    # into fp64 and tl.dot(p, v, acc) would refuse the fp64 acc: fix the type here.
    qk_scale = tl.cast(qk_scale, tl.float32)
    # Which query tile of which (batch, head) this program computes: see program_tile.
    pid_m, bh = program_tile(IS_CAUSAL, HEADS_FIRST, HEAD_GROUP)
    b = bh // H
    h = bh % H
    # 64-bit offsets to this (batch, head): B*H*N*D can pass 2**31 elements.
    Q += b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    K += b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
    V += b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh
    O += b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
    LSE += bh.to(tl.int64) * N_Q

    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    # The Q tile: loaded once, on chip for the whole loop. Rows past N_Q read as 0.
    q = load_tile(Q, offs_m, offs_d, stride_qm, stride_qd, N_Q, HEAD_DIM, True, PAD_D)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)   # running max of each row (base 2)
    l_i = tl.zeros([BLOCK_M], tl.float32)                  # running sum of 2^(s - m)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)         # running sum of P V

    # Keys [0, hi_full): tiles no row of this query tile needs masked; [hi_full, hi): the masked ones.
    hi_full, hi = key_range(start_m, N_K, BLOCK_M, BLOCK_N, IS_CAUSAL)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                               offs_m, offs_d, 0, hi_full, N_K, qk_scale,
                               HEAD_DIM, BLOCK_N, PAD_D, False, IS_CAUSAL, DOT_PRECISION)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                               offs_m, offs_d, hi_full, hi, N_K, qk_scale,
                               HEAD_DIM, BLOCK_N, PAD_D, True, IS_CAUSAL, DOT_PRECISION)

    # Epilogue: rows past N_Q are computed (on zero queries) but never stored.
    o, lse = finish_rows(acc, l_i, m_i)
    store_tile(O, o, offs_m, offs_d, stride_om, stride_od, N_Q, HEAD_DIM)
    tl.store(LSE + offs_m, lse, mask=offs_m < N_Q)


# %% The kernel with TMA loads (attention(..., tma=True); the default at D=128, N >= 2048 on sm_90) ---
#
# Hopper (sm_90) copies whole tiles between global and shared memory with one instruction, the
# Tensor Memory Accelerator, driven by a 128-byte *tensor descriptor*: base address, shape, strides,
# box (tile) shape. Triton 3.6 exposes it as ``desc.load([offsets])`` / ``desc.store([offsets], x)``
# on a descriptor that is either built on the host (``triton.tools.tensor_descriptor.TensorDescriptor``,
# passed as a kernel argument) or in the kernel (``tl.make_tensor_descriptor``, written to global
# scratch that ``triton.set_allocator`` provides). The kernel below takes either (``_as_descriptor``).
#
# Each descriptor is 4-D over the (B, H, N, D) tensor with a box of [1, 1, BLOCK, D]: a tile that
# runs past N (the last query tile, the last key tile) is zero-filled by the hardware within its own
# (batch, head), never read from the next head, and a store past Nq is dropped. Zero-filled keys
# still score 0, not -inf: the masked stage (``online_softmax_tile`` with MASKED) hides them, exactly
# as it hides the zeros ``load_tile`` returns past N_K. The math is the pointer kernel's, through the
# same helpers (``key_range``, ``online_softmax_tile``, ``finish_rows``); only the moves differ.
# What TMA cannot address is refused on the host (``tma_unsupported``), never silently sent to the
# pointer kernel.

@triton.jit
def _as_descriptor(desc_or_ptr, B, H, N, stride_b, stride_h, stride_n,
                   BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr):
    """A (B, H, N, HEAD_DIM) descriptor with a [1, 1, BLOCK, HEAD_DIM] box: a host descriptor as is,
    a pointer made into one here (the kernel is compiled once for each kind of argument)."""
    if isinstance(desc_or_ptr, tl.tensor_descriptor):
        return desc_or_ptr
    else:
        return tl.make_tensor_descriptor(desc_or_ptr, shape=[B, H, N, HEAD_DIM],
                                         strides=[stride_b, stride_h, stride_n, 1],
                                         block_shape=[1, 1, BLOCK, HEAD_DIM])


@triton.jit
def _fwd_inner_tma(acc, l_i, m_i, q,         # running state (fp32) and the Q tile
                   desc_k, desc_v,           # K and V descriptors, box [1, 1, BLOCK_N, HEAD_DIM]
                   b, h,                     # this program's batch and head
                   offs_m, lo, hi, N_K,      # query rows; key range [lo, hi) of this stage; key length
                   qk_scale,
                   HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                   MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """``_fwd_inner`` with the two tile loads done by TMA (rows past N_K arrive as zeros)."""
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = desc_k.load([b, h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)      # (1, 1, BLOCK_N, D) -> (BLOCK_N, D)
        v = desc_v.load([b, h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        acc, l_i, m_i = online_softmax_tile(acc, l_i, m_i, q, k, v, offs_m, offs_n, N_K, qk_scale,
                                            MASKED, IS_CAUSAL, DOT_PRECISION)
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_tma_kernel(
    desc_q, desc_k, desc_v, desc_o,                        # host descriptors, or pointers to (B, H, N, D) tensors
    LSE,                                                   # (B*H, Nq) fp32, contiguous
    stride_qb, stride_qh, stride_qm,                       # strides in elements (the last one is 1);
    stride_kb, stride_kh, stride_kn,                       # read only when a pointer is passed
    stride_vb, stride_vh, stride_vn,
    stride_ob, stride_oh, stride_om,
    B, H, N_Q, N_K,                                        # batch, heads, query and key lengths
    qk_scale,                                              # softmax scale * log2(e)
    HEAD_DIM: tl.constexpr,                                # D: a power of two, the descriptors' last box dim
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    HEADS_FIRST: tl.constexpr = False,                     # as in _attn_fwd_kernel
    HEAD_GROUP: tl.constexpr = 0,
):
    qk_scale = tl.cast(qk_scale, tl.float32)               # fp64 under Inductor: see _attn_fwd_kernel
    pid_m, bh = program_tile(IS_CAUSAL, HEADS_FIRST, HEAD_GROUP)
    b = bh // H
    h = bh % H
    desc_q = _as_descriptor(desc_q, B, H, N_Q, stride_qb, stride_qh, stride_qm, BLOCK_M, HEAD_DIM)
    desc_k = _as_descriptor(desc_k, B, H, N_K, stride_kb, stride_kh, stride_kn, BLOCK_N, HEAD_DIM)
    desc_v = _as_descriptor(desc_v, B, H, N_K, stride_vb, stride_vh, stride_vn, BLOCK_N, HEAD_DIM)
    desc_o = _as_descriptor(desc_o, B, H, N_Q, stride_ob, stride_oh, stride_om, BLOCK_M, HEAD_DIM)
    LSE += bh.to(tl.int64) * N_Q

    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = desc_q.load([b, h, start_m, 0]).reshape(BLOCK_M, HEAD_DIM)   # rows past N_Q: zeros

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    hi_full, hi = key_range(start_m, N_K, BLOCK_M, BLOCK_N, IS_CAUSAL)
    acc, l_i, m_i = _fwd_inner_tma(acc, l_i, m_i, q, desc_k, desc_v, b, h, offs_m, 0, hi_full, N_K, qk_scale,
                                   HEAD_DIM, BLOCK_N, False, IS_CAUSAL, DOT_PRECISION)
    acc, l_i, m_i = _fwd_inner_tma(acc, l_i, m_i, q, desc_k, desc_v, b, h, offs_m, hi_full, hi, N_K, qk_scale,
                                   HEAD_DIM, BLOCK_N, True, IS_CAUSAL, DOT_PRECISION)

    o, lse = finish_rows(acc, l_i, m_i)
    desc_o.store([b, h, start_m, 0], o.to(q.dtype).reshape(1, 1, BLOCK_M, HEAD_DIM))   # rows past N_Q dropped
    tl.store(LSE + offs_m, lse, mask=offs_m < N_Q)


# %% Tile sizes -------------------------------------------------------------------
#
# A tuned table, not @triton.autotune. Autotuning compiles and times every
# candidate the first time it sees a new key (a few seconds per shape on a GPU,
# meaningless in the interpreter) and keeps its choice in memory only. Instead,
# `python bench/triton_gpu.py --tune` sweeps the candidates on an H200 once
# (results/h200/triton_gpu_tuning.json, plotted in notebook 05) and the winners
# are written down here, with the reasons they win:
#   * The fp32 accumulator, BLOCK_M x BLOCK_D, lives in registers. 128 x 128 over
#     4 warps is 128 registers a thread before anything else: D=128 needs 8 warps.
#   * The S tile, BLOCK_M x BLOCK_N fp32, lives in registers too: BLOCK_N = 64 is
#     the sweet spot; 128 was 4-28% slower (more registers, fewer programs per SM).
#   * num_stages: K/V tiles in flight (cp.async pipelining). 3 hides the memory
#     latency; 2 was 16-27% slower, 4 no better.
#   * 128 x 64 tiles on 8 warps (two warpgroups of 64 query rows) beat 4 warps by
#     8-11% at D=64 as well, most likely because one warpgroup's exp2 work overlaps
#     the other's matrix products (the special-function unit and the tensor cores
#     run side by side).
#   * Few programs (short sequences, small batch): 64-row tiles give more of them
#     to fill the 132 SMs.
# Measured on an H200: 1.04-1.45x SDPA-FLASH forward over FlashAttention's grid (1.29x or more
# from N = 2048; results/h200/triton_gpu_NOTES.md).

def _pow2_dim(d):
    return max(16, triton.next_power_of_2(d))


def fwd_config(nq, nk, d, dtype, is_causal, device_type, bh=1):
    """Tile sizes and launch options for the forward kernel: a dict of BLOCK_M, BLOCK_N, num_warps, num_stages."""
    bd = _pow2_dim(d)
    if device_type != "cuda":
        # The interpreter: small tiles so small tests still cross several tiles.
        return dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1)
    if dtype == torch.float32:
        # True-fp32 dots run on the CUDA cores (FMA) with both operands in registers:
        # small tiles, or the compiler spills (and takes minutes to compile D=256).
        t = 32 if bd <= 64 else 16
        return dict(BLOCK_M=t, BLOCK_N=t, num_warps=4 if bd <= 128 else 8, num_stages=2)
    if bd <= 64:
        cfg = dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
    elif bd <= 128:
        # Causal: 64-row tiles were 1-7% faster (less work wasted on the diagonal, more programs).
        cfg = dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3) if is_causal else \
            dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
    else:
        cfg = dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)
    # Too few programs to fill the GPU: halve the query tile.
    if cfg["BLOCK_M"] == 128 and triton.cdiv(nq, 128) * bh < 132:
        cfg = dict(cfg, BLOCK_M=64, num_warps=4)
    return cfg


def _large_shared_memory(device=None) -> bool:
    """Can one block use Hopper's 227 KB of shared memory (H100/H200), not an A100's 163 KB or less?"""
    key = torch.cuda.current_device() if device is None else device
    got = _SMEM.get(key)
    if got is None:
        got = _SMEM[key] = torch.cuda.get_device_properties(key).shared_memory_per_block_optin >= 227 * 1024
    return got


_SMEM: dict = {}


def dense_fwd_config(nq, nk, d, dtype, is_causal, device_type, bh=1):
    """``fwd_config`` for dense attention, the table ``forward`` uses (steps 08 and 09 keep ``fwd_config``).

    One change: on a GPU with Hopper's shared memory, 16-bit, 64 < D <= 128, enough query tiles to
    fill the SMs, 128 x 128 tiles on 8 warps. Three stages of 128-key K and V tiles at D = 128 take
    about 200 KB, more than an A100 has. H200, bf16, N = 4096 (B=4) and 16384 (B=1), H = 16: 1.01-1.04x
    causal and 1.07x not, against the table's 64x64 / 128x64 (results/h200/triton/fwd_tma_d128.log,
    ``bench/experiments/triton_fwd_tma.py --plan d128``). TMA loads at the same tiles gave another
    1.02-1.11x there (``attention(..., tma=True)`` since).
    """
    cfg = fwd_config(nq, nk, d, dtype, is_causal, device_type, bh)
    if (device_type == "cuda" and dtype != torch.float32 and 64 < _pow2_dim(d) <= 128
            and triton.cdiv(nq, 128) * bh >= 132 and _large_shared_memory()):
        cfg = dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3)
    if device_type == "cuda" and dtype != torch.float32 and is_causal:
        # Heaviest query tiles first, heads taken head_group() at a time (program_tile). All heads at
        # once (HEAD_GROUP=0) kept every head's K and V in flight: at FlashAttention's grid, N=4096,
        # D=64, 128 heads of 1 MB against 60 MB of L2, and ncu read an L2 hit rate of 12% against
        # cuDNN's 84% (results/h200/triton/ncu_c4k/); in groups, 85%. The best group ran 1.03-1.13x
        # all heads at once at D=64 N 4096-16384, and 1.04-1.05x one head after another (the order
        # before) at D=128 N=4096 (results/h200/triton/fwd_tile_order_1204/, two runs).
        cfg = dict(cfg, HEADS_FIRST=True, HEAD_GROUP=head_group(nk, d, dtype.itemsize))
    return cfg


L2_GROUP_BYTES = 8 << 20      # the K and V a group of heads may keep in L2 (fwd_tile_order_1204: 8 to 16 MB best)


def head_group(n_keys, d, itemsize):
    """How many heads' tiles a causal forward takes at a time (``program_tile``'s HEAD_GROUP): as many as keep
    their K and V within ``L2_GROUP_BYTES``, at least one. FlashAttention-3's tile scheduler does the same
    with a 32 MB budget; on the H200 groups of 8-16 MB were faster (fwd_tile_order_1204)."""
    return max(1, L2_GROUP_BYTES // (2 * n_keys * d * itemsize))


# %% Launcher --------------------------------------------------------------------

def as_bhnd(t):
    """View ``(..., N, D)`` as ``(B, H, N, D)`` without copying when the strides allow it."""
    lead = t.shape[:-2]
    if len(lead) == 0:
        return t[None, None]
    if len(lead) == 1:
        return t[None]
    if len(lead) == 2:
        return t
    try:
        return t.view(-1, *t.shape[-3:])          # merge the leading dims: free if their strides nest
    except RuntimeError:
        return t.reshape(-1, *t.shape[-3:])       # they don't: one copy


def _dot_precision(dtype):
    return "ieee" if dtype == torch.float32 else "tf32"    # the latter is ignored for 16-bit inputs


def hopper_fwd(q, k, v, is_causal, scale):
    """Where ``forward`` may hand the whole forward to another kernel when not told which to run: here none (None),
    so your Triton kernel runs on every GPU. The course's solution puts a warp-specialized Gluon kernel for Hopper
    here, for long sequences: notebook 06 §11 shows what it adds and what it gains."""
    return None


def hopper_fwd_takes(q, k, v, is_causal) -> bool:
    """Whether ``hopper_fwd`` would take these inputs, asked while ``torch.compile`` traces the call (``run_fwd``
    below then picks an opaque operator, so that the compiled graph calls ``forward`` with real tensors and the other
    kernel runs there too): here never."""
    return False


from .gluon_fwd import launch_if_covered as hopper_fwd  # noqa: E402,F811  # SOLUTION-ONLY
from .gluon_fwd import takes as hopper_fwd_takes  # noqa: E402,F811  # SOLUTION-ONLY


@direct_launches
def forward(q, k, v, is_causal, scale, config=None, tma=None, descriptors=None):
    """Run the kernel: ``(O, LSE)`` with O shaped like q (contiguous) and LSE ``(..., Nq)`` float32.

    With neither ``config`` nor ``tma`` given, ``hopper_fwd`` may take the call first (the solution's Gluon kernel
    on Hopper from N = 4096; your step 05's hook declines).

    ``scale`` must already be resolved (a float). ``config`` overrides ``dense_fwd_config``.
    ``tma``: True, the TMA kernel (``_attn_fwd_tma_kernel``) instead, or a ValueError saying why it
    cannot run here; False, the pointer kernel; None (default), ``tma_by_default``'s choice.
    ``descriptors`` ("host" or "device") picks how the TMA kernel gets its descriptors (default: host
    ones in eager mode, device ones when a compiler traces the call: see ``forward_tma``).
    """
    if tma is None and config is None:
        out = hopper_fwd(q, k, v, is_causal, scale)
        if out is not None:
            return out
    if tma is None:
        tma = tma_by_default(q, k, v)
    if tma:
        return forward_tma(q, k, v, is_causal, scale, config, descriptors)
    raise_if_stubbed(_attn_fwd_kernel)
    q4, k4, v4 = as_bhnd(q), as_bhnd(k), as_bhnd(v)
    B, H, nq, d = q4.shape
    nk = k4.shape[2]
    o = q.new_empty(q.shape)
    lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
    o4 = as_bhnd(o)
    cfg = dict(config or dense_fwd_config(nq, nk, d, q.dtype, is_causal, q.device.type, B * H))
    # Every constexpr passed, defaults too: torch.compile's wrap_triton refuses a call that leaves one out.
    cfg.setdefault("HEADS_FIRST", False)
    cfg.setdefault("HEAD_GROUP", 0)
    grid = (triton.cdiv(nq, cfg["BLOCK_M"]), B * H)
    if cfg["HEADS_FIRST"]:
        grid = grid[::-1]
    kernel = configured(_attn_fwd_kernel, cfg)
    wrap_triton(kernel)[grid](
        q4, k4, v4, o4, lse,
        *q4.stride(), *k4.stride(), *v4.stride(), *o4.stride(),
        H, nq, nk, scale * LOG2E,
        HEAD_DIM=d, BLOCK_D=_pow2_dim(d), IS_CAUSAL=is_causal, DOT_PRECISION=_dot_precision(q.dtype),
        **tiles(cfg))
    return o, lse


TMA_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
TMA_HEAD_DIMS = (16, 32, 64, 128, 256)


TMA_MIN_LEN = 2048      # shorter sequences run the pointer kernel by default (see tma_by_default)


def tma_by_default(q, k, v):
    """Does ``forward`` take the TMA kernel when not told (``tma=None``)? Where it was measured faster.

    On the H200 (bf16, FlashAttention's grid; results/h200/triton/fwd_tma_course_3f626a2.json and
    results/h200/grid_1202/) TMA ran 1.07-1.13x the pointer kernel at D=128 for N 2k-16k, but 0.40-0.77x
    at N 512-1024 (many small programs: each pays the descriptor set-up), and 0.97-1.02x at D=64: so
    16-bit inputs with D=128 and both lengths >= ``TMA_MIN_LEN`` on an sm_90 GPU, where
    ``tma_unsupported`` finds nothing against it. Elsewhere (other GPUs were not measured, a CPU has
    no TMA) the pointer kernel runs.
    """
    if q.device.type != "cuda" or q.dtype not in (torch.float16, torch.bfloat16) or q.shape[-1] != 128:
        return False
    if min(q.shape[-2], k.shape[-2]) < TMA_MIN_LEN:
        return False
    if torch.cuda.get_device_capability(q.device)[0] != 9:
        return False
    return tma_unsupported(q, k, v) is None


def _tma_strides(t4):
    """``t4``'s strides in elements, with any stride of a size-1 dim replaced by a contiguous one
    (it is never stepped over, but TMA still wants it 16-byte aligned)."""
    strides = list(t4.stride())
    for i in range(2, -1, -1):
        if t4.shape[i] == 1:
            strides[i] = strides[i + 1] * t4.shape[i + 1]
    return strides


def tma_unsupported(q, k, v):
    """Why the TMA kernel cannot run on these inputs (a sentence), or None when it can.

    q, k, v as ``attention`` takes them. TMA needs: an sm_90+ GPU (or Triton's interpreter on a CPU);
    fp16, bf16 or fp32; a head dim that is a power of two from 16 to 256 (the descriptor's box is
    D wide and this kernel does not pad it); for each of q, k, v viewed as (B, H, N, D): a last dim
    with stride 1, every other stride a multiple of 16 bytes, and a 16-byte aligned start.
    """
    dev = q.device
    if dev.type == "cuda":
        major, minor = torch.cuda.get_device_capability(dev)
        if major < 9:
            return (f"TMA (tensor descriptors) needs an sm_90 or newer GPU (Hopper); "
                    f"{torch.cuda.get_device_name(dev)} is sm_{major}{minor}")
    elif dev.type == "cpu":
        from attnlib.ops import interpreting
        if not interpreting():
            return "on a CPU the kernel runs only in Triton's interpreter (TRITON_INTERPRET=1 before triton is imported)"
    else:
        return f"TMA needs a CUDA GPU (sm_90+), got a {dev.type} tensor"
    if q.dtype not in TMA_DTYPES:
        return f"the TMA kernel runs fp16, bf16 and fp32, not {q.dtype}"
    d = q.shape[-1]
    if d not in TMA_HEAD_DIMS:
        return f"the TMA kernel needs a head dim D in {TMA_HEAD_DIMS} (its tile is exactly D wide), got D = {d}"
    size = q.element_size()
    for name, t in (("q", q), ("k", k), ("v", v)):
        t4 = as_bhnd(t)
        if t4.stride(-1) != 1:
            return (f"TMA needs {name}'s last dim contiguous (stride 1), got stride {t4.stride(-1)}: "
                    f"pass {name}.contiguous() or tma=False")
        bad = [st for st in _tma_strides(t4)[:3] if (st * size) % 16]
        if bad:
            return (f"TMA needs every stride of {name} (viewed as (B, H, N, D)) to be a multiple of 16 bytes; "
                    f"strides {tuple(t4.stride())} x {size} bytes are not")
        if (t.storage_offset() * size) % 16 if _traced((t,)) else t4.data_ptr() % 16:
            return f"TMA needs {name} to start at a 16-byte aligned address (a slice at an odd offset?)"
    return None


def _ensure_allocator(device):
    """Device-side descriptors live in global scratch that Triton asks ``triton.set_allocator`` for.

    Set one (PyTorch's caching allocator) only if nobody has: Inductor sets its own before its launches.
    """
    from triton.runtime import _allocation
    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=device))


@direct_launches
def forward_tma(q, k, v, is_causal, scale, config=None, descriptors=None):
    """``forward`` through ``_attn_fwd_tma_kernel``: the same ``(O, LSE)`` contract, the same tiles.

    Raises ValueError (``tma_unsupported``'s reason) where TMA cannot be used: never a silent fallback.
    descriptors: "host" (``TensorDescriptor`` built here, passed to the kernel) or "device" (pointers
    passed, ``tl.make_tensor_descriptor`` in the kernel). Default: host in eager mode (6% faster on the
    H200 at D = 64 in bench/experiments/triton_fwd_tma.py), device when a compiler traces the call:
    PyTorch 2.13 traces a host descriptor through ``wrap_triton`` under Dynamo only, not inside a
    ``triton_op``, whose kernels then see plain tensors.
    """
    raise_if_stubbed(_attn_fwd_tma_kernel)
    why = tma_unsupported(q, k, v)
    if why:
        raise ValueError(f"step05 attention(tma=True): {why}")
    if descriptors is None:
        descriptors = "device" if _traced((q, k, v)) else "host"
    if descriptors not in ("host", "device"):
        raise ValueError(f"descriptors must be 'host' or 'device', got {descriptors!r}")
    q4, k4, v4 = as_bhnd(q), as_bhnd(k), as_bhnd(v)
    B, H, nq, d = q4.shape
    nk = k4.shape[2]
    o = q.new_empty(q.shape)
    lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
    o4 = as_bhnd(o)
    cfg = dict(config or dense_fwd_config(nq, nk, d, q.dtype, is_causal, q.device.type, B * H))
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    strides = [_tma_strides(t)[:3] for t in (q4, k4, v4, o4)]
    if descriptors == "host":
        from triton.tools.tensor_descriptor import TensorDescriptor
        args = [TensorDescriptor(t, shape=list(t.shape), strides=st + [1], block_shape=[1, 1, blk, d])
                for t, st, blk in zip((q4, k4, v4, o4), strides, (bm, bn, bn, bm))]
    else:
        if q.is_cuda and not _traced((q,)):
            _ensure_allocator(q.device)
        args = [q4, k4, v4, o4]
    # Every constexpr passed, defaults too: torch.compile's wrap_triton refuses a call that leaves one out.
    cfg.setdefault("HEADS_FIRST", False)
    cfg.setdefault("HEAD_GROUP", 0)
    grid = (triton.cdiv(nq, bm), B * H)
    if cfg["HEADS_FIRST"]:
        grid = grid[::-1]
    kernel = configured(_attn_fwd_tma_kernel, cfg)
    wrap_triton(kernel)[grid](
        *args, lse, *strides[0], *strides[1], *strides[2], *strides[3],
        B, H, nq, nk, scale * LOG2E,
        HEAD_DIM=d, IS_CAUSAL=is_causal, DOT_PRECISION=_dot_precision(q.dtype), **tiles(cfg))
    return o, lse


# %% The operator, autograd and the public API ----------------------------------------
#
# `forward` becomes a PyTorch operator (attnlib/ops.py says why torch.compile needs one):
# torch.ops.<namespace>.step05_fwd(q, k, v, is_causal, scale, tma) -> (O, LSE), with a fake
# implementation for tracing and an autograd formula (step 04's PyTorch backward). The
# autograd.Function is what students, tests and CS336's harness call:
# FlashAttentionTritonFwd.apply(q, k, v, is_causal) -> O.

def _fwd_fake(q, k, v, is_causal, scale, tma=None):
    if tma:
        why = tma_unsupported(q, k, v)          # the same refusal when traced as in eager mode
        if why:
            raise ValueError(f"step05 attention(tma=True): {why}")
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


def _fwd_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
              scale: float, tma: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return forward(q, k, v, is_causal, scale, tma=tma)


def _setup_context(ctx, inputs, output):
    q, k, v, is_causal, scale = inputs[:5]
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.is_causal, ctx.scale = is_causal, scale


def _backward(ctx, do, _dlse=None):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = backward_strips(q, k, v, o, lse, do, ctx.is_causal, ctx.scale, BLOCK_Q, BLOCK_K)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


fwd_op = kernel_op(f"{op_namespace(__name__)}::step05_fwd", _fwd_impl, fake=_fwd_fake,
                   backward=_backward, setup_context=_setup_context)
# The same forward registered opaque, for inputs that ``hopper_fwd`` takes: Inductor traces a triton_op's Python and
# launches the Triton kernels it finds, so a kernel launched any other way (the solution's Gluon kernel) is invisible
# to it, and the compiled graph would run the Triton kernel instead. An opaque operator is called as it is.
fwd_op_opaque = kernel_op(f"{op_namespace(__name__)}::step05_fwd_opaque", _fwd_impl, fake=_fwd_fake,
                          backward=_backward, setup_context=_setup_context, opaque=True)
_RUN_FWD = {False: eager_fast(fwd_op, _fwd_impl), True: eager_fast(fwd_op_opaque, _fwd_impl)}


def run_fwd(q, k, v, is_causal, scale, tma=None):
    """``fwd_op``, or ``fwd_op_opaque`` where ``hopper_fwd`` takes the inputs: the operator when compiled, its
    launcher in eager mode (attnlib/ops.py, ``eager_fast``). The choice is made while Dynamo traces, once per graph."""
    return _RUN_FWD[tma is None and hopper_fwd_takes(q, k, v, is_causal)](q, k, v, is_causal, scale, tma)


class FlashAttentionTritonFwd(torch.autograd.Function):
    """Forward: the Triton kernel above (as ``fwd_op``). Backward: step 04's PyTorch backward.

    ``apply(q, k, v, is_causal=False, scale=None, tma=None)`` -> O; saves q, k, v, O and exactly one
    LSE tensor, float32 ``(..., Nq)``. ``tma=True``: the forward runs the TMA kernel, ``False`` the
    pointer kernel, ``None`` ``tma_by_default``'s choice (the backward is the same either way).
    """

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False, scale=None, tma=None):
        scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale, where="step05 FlashAttentionTritonFwd")
        o, lse = run_fwd(q, k, v, is_causal, scale, _tma_flag(tma))
        _setup_context(ctx, (q, k, v, is_causal, scale), (o, lse))
        return o

    @staticmethod
    def backward(ctx, do):
        return _backward(ctx, do)


def _tma_flag(tma):
    return None if tma is None else bool(tma)


def attention(q, k, v, is_causal=False, scale=None, tma=None):
    """The course contract (attnlib/contract.py) through the Triton forward kernel.

    ``tma=True``: Q, K, V loaded and O stored by TMA (``_attn_fwd_tma_kernel``); a ValueError says
    why where TMA cannot be used (not sm_90+, float64, D not a power of two in 16..256, strides).
    ``tma=False``: the pointer kernel. ``None`` (default): TMA where ``tma_by_default`` says it was
    measured faster (D=128, 16-bit, sm_90), the pointer kernel elsewhere.
    """
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale, where="step05 attention")
    return FlashAttentionTritonFwd.apply(q, k, v, is_causal, scale, _tma_flag(tma))


def attention_with_lse(q, k, v, is_causal=False, scale=None, tma=None):
    """``(O, LSE)``: the forward kernel's two outputs, with no autograd."""
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale, where="step05 attention_with_lse")
    return forward(q, k, v, is_causal, scale, tma=_tma_flag(tma))
