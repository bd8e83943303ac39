"""Step 04 -- FlashAttention-2 in pure PyTorch, forward and backward.

The algorithm before any kernel: the same tiles, the same running statistics and
the same recomputation a GPU kernel uses, written as PyTorch operations on tiles,
so you can step through it with a debugger and print any intermediate.

Three ways to run it, one set of tile math (the functions you write):

  1. ``attention_loops``    the readable double loop: for each query tile, for each
                            key tile, one Bq x Bk tile at a time. Exactly the work of
                            one GPU program per query tile. Slow: Python runs
                            (Nq/Bq) * (Nk/Bk) iterations. For reading and testing.
  2. ``attention``          the same arithmetic with all query tiles processed
                            together (they are independent): one loop over key tiles,
                            the only loop the online softmax needs, on Nq x Bk strips.
  3. ``attention_compiled`` 2. with each strip step (scores + update, and the backward
                            tile) through ``torch.compile``; the key loop stays in Python.

All three go through ``FlashAttention2Torch``, which saves Q, K, V, O and the
log-sum-exp L = m + log(l) (float32, ``(..., Nq)``) and nothing else: the
backward recomputes the probabilities tile by tile from L.

Memory, per (batch, head): the largest intermediate is a Bq x Bk tile (1.) or an
Nq x Bk strip (2., 3.). Never Nq x Nk: that is the point of the step, and
``tests/test_step04_flash_torch.py`` checks it by watching every operation.

What you write (``make stubs`` turns each into a NotImplementedError):
``online_softmax_update`` and ``finalize`` (forward), ``delta`` and
``backward_tile`` (backward). The loops, the causal tile bookkeeping and the
autograd plumbing are given: read them, they are half of the lesson.

Known limits: the tile math runs in float32 whatever the input dtype (inputs are
upcast tile by tile, as a kernel does in registers), so fp16/bf16 inputs do not
use low-precision matrix units here; that is steps 05-07's job.
"""

import math

import torch

from attnlib import check_inputs

BLOCK_Q = 64   # query rows per tile (Bq)
BLOCK_K = 64   # key rows per tile (Bk)


# ---------------------------------------------------------------------------
# Causal bookkeeping: which tiles are skipped, which are masked
# ---------------------------------------------------------------------------
# Query i sees key j iff j <= i (top-left). For a tile of query rows [q0, q1) and
# key rows [k0, k1):
#   - every key is after every query (k0 > q1 - 1): the tile is all -inf: SKIP it;
#   - every key is at or before every query (k1 - 1 <= q0): nothing to mask: FULL;
#   - otherwise the diagonal crosses the tile: build its small mask: MASK.

def causal_tile(q0, q1, k0, k1):
    """``"skip"``, ``"full"`` or ``"mask"`` for query rows [q0, q1) x key rows [k0, k1)."""
    if k0 > q1 - 1:
        return "skip"
    if k1 - 1 <= q0:
        return "full"
    return "mask"


def tile_mask(q0, q1, k0, k1, device):
    """``(q1 - q0, k1 - k0)`` booleans, True where query i may see key j (j <= i)."""
    rows = torch.arange(q0, q1, device=device)[:, None]
    cols = torch.arange(k0, k1, device=device)[None, :]
    return cols <= rows


def strip_rows(k0, k1, nq, block_q, is_causal, device):
    """For key tile [k0, k1), the query rows the strip version processes.

    Returns ``(r0, mask)``: rows ``r0..nq-1`` meet this key tile (the query tiles
    before row r0 lie entirely above the diagonal and are skipped); ``mask`` (or
    None) covers the first ``mask.shape[0]`` of those rows, the query tiles the
    diagonal crosses. The rows after them are entirely below it: no mask.
    """
    if not is_causal:
        return 0, None
    r0 = (k0 // block_q) * block_q                               # first query tile not skipped
    band_end = min(nq, -(-(k1 - 1) // block_q) * block_q)        # first query tile that is FULL
    mask = tile_mask(r0, band_end, k0, k1, device) if band_end > r0 else None
    return r0, mask


def scores(q, k, scale, mask=None):
    """``S = q @ k^T * scale`` in float32, ``(..., R, C)``; ``-inf`` where ``mask`` is False.

    ``mask`` (R', C) with R' <= R applies to the first R' rows (the diagonal band);
    the rows after it need no mask.
    """
    s = (q.float() @ k.float().transpose(-2, -1)) * scale        # (..., R, C)
    if mask is not None:
        s[..., : mask.shape[0], :].masked_fill_(~mask, float("-inf"))
    return s


# ---------------------------------------------------------------------------
# The tile math (what you write)
# ---------------------------------------------------------------------------

def online_softmax_update(m, l, acc, s, v):
    """Fold one key tile's scores into the running softmax of its query rows.

    m:   (..., R)     running max of the scores seen so far (starts at -inf), float32
    l:   (..., R)     running sum of exp(score - m) (starts at 0), float32
    acc: (..., R, D)  running sum of exp(score - m) * v (starts at 0), float32
    s:   (..., R, C)  this key tile's scores, float32, -inf where masked
    v:   (..., C, D)  this key tile's values
    Returns the new ``(m, l, acc)``.

    Code plan:
      1. the new max: m_new = max(m, max of s over the keys)
      2. alpha = exp(m - m_new): how much every old term shrinks when the max grows
         (exactly 0 on the first tile, where m = -inf)
      3. p = exp(s - m_new): this tile's unnormalized probabilities (0 where masked)
      4. l_new = alpha * l + rowsum(p); acc_new = alpha * acc + p @ v
    No row is ever fully masked on its first tile (every query sees key 0), so
    m_new is finite and nothing here is -inf - (-inf).
    """
    # >>> STUDENT: new max m_new; rescale the old l and acc by exp(m - m_new); add this tile's p = exp(s - m_new)
    m_new = torch.maximum(m, s.amax(dim=-1))                     # (..., R)
    alpha = torch.exp(m - m_new)                                 # (..., R)
    p = torch.exp(s - m_new[..., None])                          # (..., R, C)
    l_new = alpha * l + p.sum(dim=-1)                            # (..., R)
    acc_new = alpha[..., None] * acc + p @ v.float()             # (..., R, D)
    return m_new, l_new, acc_new
    # <<< STUDENT


def finalize(m, l, acc):
    """After the last key tile: ``(O, L)`` with O = acc / l (float32) and L = m + log(l).

    L is the natural-log log-sum-exp of each row's scores: the one number per
    row the backward needs to rebuild any probability, P = exp(S - L).
    """
    # >>> STUDENT: normalize the accumulator by the running sum; the log-sum-exp is m + log(l)
    return acc / l[..., None], m + torch.log(l)
    # <<< STUDENT


def delta(o, do):
    """``D = rowsum(dO * O)``, float32, ``(..., Nq)``.

    It equals rowsum(P * dP) (since O = P V and dP = dO V^T), the term the softmax
    backward subtracts; computed once from O instead of from P, which we never keep.
    """
    # >>> STUDENT: D = sum over the head dim of dO * O, in float32
    return (do.float() * o.float()).sum(dim=-1)
    # <<< STUDENT


def backward_tile(q, k, v, do, lse, d, scale, mask=None):
    """The gradients that one tile (query rows x key rows) contributes.

    q: (..., R, D), do: (..., R, D), lse and d: (..., R)   -- the tile's query rows
    k, v: (..., C, D)                                      -- the tile's key rows
    Returns float32 ``(dq, dk, dv)`` shaped like q, k, v: dq is this key tile's share
    of the rows' dQ; dk and dv are these query rows' share of the keys' dK, dV.

    Code plan (S = q k^T * scale, recomputed below; nothing R x C was saved):
      1. P  = exp(S - L)             the probabilities, exact, from the saved LSE
      2. dV = P^T dO
      3. dP = dO V^T
      4. dS = P * (dP - D)           the softmax backward, with D from ``delta``
      5. dQ = dS K * scale,  dK = dS^T Q * scale
    """
    s = scores(q, k, scale, mask)                                # (..., R, C) recomputed
    q, k, v, do = q.float(), k.float(), v.float(), do.float()
    # >>> STUDENT: P = exp(S - L); dV = P^T dO; dP = dO V^T; dS = P * (dP - D); dQ = dS K * scale; dK = dS^T Q * scale
    p = torch.exp(s - lse[..., None])                            # (..., R, C)
    dv = p.transpose(-2, -1) @ do                                # (..., C, D)
    dp = do @ v.transpose(-2, -1)                                # (..., R, C)
    ds = p * (dp - d[..., None])                                 # (..., R, C)
    dq = (ds @ k) * scale                                        # (..., R, D)
    dk = (ds.transpose(-2, -1) @ q) * scale                      # (..., C, D)
    return dq, dk, dv
    # <<< STUDENT


# ---------------------------------------------------------------------------
# 1. The double loop: one tile at a time
# ---------------------------------------------------------------------------

def forward_loops(q, k, v, is_causal, scale, block_q, block_k):
    """FlashAttention-2's forward, one (Bq x Bk) tile at a time. Returns O (q's dtype), L."""
    *batch, nq, d = q.shape
    nk = k.shape[-2]
    o = torch.empty_like(q)                                      # (..., Nq, D)
    lse = torch.empty(*batch, nq, dtype=torch.float32, device=q.device)
    for q0 in range(0, nq, block_q):                             # independent: one GPU program each
        q1 = min(q0 + block_q, nq)
        q_i = q[..., q0:q1, :]                                   # (..., Bq, D)
        m = torch.full((*batch, q1 - q0), -math.inf, device=q.device)
        l = torch.zeros(*batch, q1 - q0, device=q.device)
        acc = torch.zeros(*batch, q1 - q0, d, device=q.device)
        for k0 in range(0, nk, block_k):                         # sequential: the running max
            k1 = min(k0 + block_k, nk)
            kind = causal_tile(q0, q1, k0, k1) if is_causal else "full"
            if kind == "skip":
                break                                            # every later key tile is skipped too
            mask = tile_mask(q0, q1, k0, k1, q.device) if kind == "mask" else None
            s = scores(q_i, k[..., k0:k1, :], scale, mask)       # (..., Bq, Bk)
            m, l, acc = online_softmax_update(m, l, acc, s, v[..., k0:k1, :])
        o_i, lse_i = finalize(m, l, acc)
        o[..., q0:q1, :] = o_i.to(q.dtype)
        lse[..., q0:q1] = lse_i
    return o, lse


def backward_loops(q, k, v, o, lse, do, is_causal, scale, block_q, block_k):
    """FlashAttention-2's backward (its Algorithm 2): key tiles outside, query tiles inside.

    dK and dV of a key tile are finished when its inner loop ends; dQ gathers a
    share from every key tile (on a GPU: atomic adds, or a second pass).
    """
    nq, nk = q.shape[-2], k.shape[-2]
    d = delta(o, do)                                             # (..., Nq)
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dk = torch.zeros(k.shape, dtype=torch.float32, device=q.device)
    dv = torch.zeros(v.shape, dtype=torch.float32, device=q.device)
    for k0 in range(0, nk, block_k):
        k1 = min(k0 + block_k, nk)
        k_j, v_j = k[..., k0:k1, :], v[..., k0:k1, :]
        first = (k0 // block_q) * block_q if is_causal else 0    # query tiles above the diagonal: skipped
        for q0 in range(first, nq, block_q):
            q1 = min(q0 + block_q, nq)
            kind = causal_tile(q0, q1, k0, k1) if is_causal else "full"
            if kind == "skip":
                continue                                         # only a partial last query tile gets here
            mask = tile_mask(q0, q1, k0, k1, q.device) if kind == "mask" else None
            dq_i, dk_j, dv_j = backward_tile(q[..., q0:q1, :], k_j, v_j, do[..., q0:q1, :],
                                             lse[..., q0:q1], d[..., q0:q1], scale, mask)
            dq[..., q0:q1, :] += dq_i
            dk[..., k0:k1, :] += dk_j
            dv[..., k0:k1, :] += dv_j
    return dq, dk, dv


# ---------------------------------------------------------------------------
# 2. Query tiles together: one loop over key tiles, on Nq x Bk strips
# ---------------------------------------------------------------------------

def forward_step(q, k, v, m, l, acc, scale, mask=None):
    """One key tile against a strip of query rows: the strip's new ``(m, l, acc)``.

    A pure function of its inputs (views of the strip and of the tile); the caller
    writes the result back. That keeps it easy to compile (version 3).
    """
    return online_softmax_update(m, l, acc, scores(q, k, scale, mask), v)


def backward_step(q, k, v, do, lse, d, scale, mask=None):
    """One key tile against a strip of query rows: ``(dq, dk, dv)`` of ``backward_tile``."""
    return backward_tile(q, k, v, do, lse, d, scale, mask)


def forward_strips(q, k, v, is_causal, scale, block_q, block_k, step=forward_step):
    """The same forward with all query tiles at once. Returns O (q's dtype), L.

    ``step`` is ``forward_step`` or its compiled twin (version 3).
    """
    *batch, nq, d = q.shape
    nk = k.shape[-2]
    dtype = q.dtype
    q, k, v = (t.detach().float() for t in (q, k, v))           # float32: free in fp32, O(N D) else
    m = torch.full((*batch, nq), -math.inf, device=q.device)    # (..., Nq)
    l = torch.zeros(*batch, nq, device=q.device)                # (..., Nq)
    acc = torch.zeros(*batch, nq, d, device=q.device)           # (..., Nq, D)
    for k0 in range(0, nk, block_k):
        if is_causal and k0 >= nq:
            break                                                # no query sees these keys
        k1 = min(k0 + block_k, nk)
        r0, mask = strip_rows(k0, k1, nq, block_q, is_causal, q.device)
        m[..., r0:], l[..., r0:], acc[..., r0:, :] = step(
            q[..., r0:, :], k[..., k0:k1, :], v[..., k0:k1, :], m[..., r0:], l[..., r0:], acc[..., r0:, :],
            scale, mask)
    o, lse = finalize(m, l, acc)
    return o.to(dtype), lse


def backward_strips(q, k, v, o, lse, do, is_causal, scale, block_q, block_k, step=backward_step):
    """The same backward with all query tiles at once: dK, dV of a key tile in one step.

    ``step`` is ``backward_step`` or its compiled twin (version 3).
    """
    nq, nk = q.shape[-2], k.shape[-2]
    d = delta(o, do)                                             # (..., Nq)
    q, k, v, do = (t.detach().float() for t in (q, k, v, do))
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dk = torch.zeros(k.shape, dtype=torch.float32, device=q.device)
    dv = torch.zeros(v.shape, dtype=torch.float32, device=q.device)
    for k0 in range(0, nk, block_k):
        if is_causal and k0 >= nq:
            break                                                # these keys get no gradient: 0
        k1 = min(k0 + block_k, nk)
        r0, mask = strip_rows(k0, k1, nq, block_q, is_causal, q.device)
        dq_r, dk[..., k0:k1, :], dv[..., k0:k1, :] = step(
            q[..., r0:, :], k[..., k0:k1, :], v[..., k0:k1, :], do[..., r0:, :], lse[..., r0:], d[..., r0:],
            scale, mask)
        dq[..., r0:, :] += dq_r
    return dq, dk, dv


# ---------------------------------------------------------------------------
# 3. The strip steps through torch.compile
# ---------------------------------------------------------------------------
# Compiling the whole forward would unroll the key loop into the graph: the graph
# grows with Nk / Bk and so does the compile time (on a 2-core CPU, 8, 16 and 32
# key tiles took 54, 125 and 212 s for forward + backward), and every new N compiles
# again. Compiling one step instead gives a few small graphs shared by every N.
# The steps are pure functions of the strip: they take views and return new
# tensors, and the eager loop above writes them back. (A first version compiled
# the in-place writes ``m[..., r0:] = ...`` with a symbolic r0 too: on a CPU that
# worked, on the H200 Inductor's GPU code generator failed on it with an
# AssertionError in its tiling analysis, torch 2.11, for every dtype.)
# ``dynamic=True`` keeps the strip's length and offset symbolic. A handful of
# variants remain per step (no mask, r0 == 0, a band that covers every remaining
# row), all float32, since the strips upcast once.

_compiled_steps = None


def compiled_steps():
    """``(forward_step, backward_step)`` compiled once per process, lazily."""
    global _compiled_steps
    if _compiled_steps is None:
        _compiled_steps = (torch.compile(forward_step, dynamic=True),
                           torch.compile(backward_step, dynamic=True))
    return _compiled_steps


# ---------------------------------------------------------------------------
# The autograd.Function and the public functions
# ---------------------------------------------------------------------------

VERSIONS = ("loops", "strips", "compiled")


def _forward(version, q, k, v, is_causal, scale, block_q, block_k):
    if version == "loops":
        return forward_loops(q, k, v, is_causal, scale, block_q, block_k)
    step = compiled_steps()[0] if version == "compiled" else forward_step
    return forward_strips(q, k, v, is_causal, scale, block_q, block_k, step)


def _backward(version, q, k, v, o, lse, do, is_causal, scale, block_q, block_k):
    if version == "loops":
        return backward_loops(q, k, v, o, lse, do, is_causal, scale, block_q, block_k)
    step = compiled_steps()[1] if version == "compiled" else backward_step
    return backward_strips(q, k, v, o, lse, do, is_causal, scale, block_q, block_k, step)


class FlashAttention2Torch(torch.autograd.Function):
    """FlashAttention-2 in PyTorch. ``apply(q, k, v, is_causal=False, scale=None)`` returns O.

    More arguments, all optional: ``block_q``, ``block_k`` (tile sizes) and ``version``
    (one of ``VERSIONS``). Saves q, k, v, O and the float32 LSE ``(..., Nq)``: nothing else.
    """

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False, scale=None, block_q=BLOCK_Q, block_k=BLOCK_K, version="strips"):
        where = "step04 FlashAttention2Torch"
        scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale, where=where)
        _check_args(block_q, block_k, version, where)
        o, lse = _forward(version, q, k, v, is_causal, scale, block_q, block_k)
        ctx.save_for_backward(q, k, v, o, lse)                   # no N x N tensor, no P
        ctx.args = (is_causal, scale, block_q, block_k)
        ctx.version = version
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _backward(ctx.version, q, k, v, o, lse, do, *ctx.args)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None


def _check_args(block_q, block_k, version, where):
    for name, b in (("block_q", block_q), ("block_k", block_k)):
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ValueError(f"{where}: {name} must be a positive int, got {b!r}")
    if version not in VERSIONS:
        raise ValueError(f"{where}: version must be one of {VERSIONS}, got {version!r}")


def attention_with_lse(q, k, v, is_causal=False, scale=None, block_q=BLOCK_Q, block_k=BLOCK_K,
                       version="strips"):
    """``(O, L)``: the output in q's dtype and the float32 log-sum-exp ``(..., Nq)``, with no autograd."""
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale, where="step04 attention_with_lse")
    _check_args(block_q, block_k, version, "step04 attention_with_lse")
    with torch.no_grad():
        return _forward(version, q, k, v, is_causal, scale, block_q, block_k)


def attention(q, k, v, is_causal=False, scale=None, block_q=BLOCK_Q, block_k=BLOCK_K):
    """The course contract, through FlashAttention-2 on strips (query tiles together)."""
    return FlashAttention2Torch.apply(q, k, v, is_causal, scale, block_q, block_k, "strips")


def attention_loops(q, k, v, is_causal=False, scale=None, block_q=BLOCK_Q, block_k=BLOCK_K):
    """The course contract, through the readable double loop (slow; for teaching)."""
    return FlashAttention2Torch.apply(q, k, v, is_causal, scale, block_q, block_k, "loops")


def attention_compiled(q, k, v, is_causal=False, scale=None, block_q=BLOCK_Q, block_k=BLOCK_K):
    """The course contract, through the strips with compiled steps (first call compiles)."""
    return FlashAttention2Torch.apply(q, k, v, is_causal, scale, block_q, block_k, "compiled")
