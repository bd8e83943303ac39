"""Step 10 -- attention across GPUs: ring attention on torch.distributed.

When one sequence no longer fits one GPU (its activations, not the weights), the sequence itself is
split: each of W ranks holds N/W of the rows of Q, K and V (context parallelism). Queries stay home;
the K/V blocks travel around the ring, rank r sending to r+1 and receiving from r-1, so after W-1
hops every rank has met every block. Each hop is overlapped with the attention of the block already
there, and the partial outputs are merged through their log-sum-exps: the same online softmax as
step 04, one level up (a whole block instead of a tile).

    forward, rank r, step s = 0 .. W-1:  the block of rank (r - s) mod W is here
        post  isend(K, V -> r+1), irecv(K', V' <- r-1)       # batch_isend_irecv, in flight ...
        O_s, L_s = attention(Q_r, K, V)                      # ... while the course's kernel runs
        O, L = merge(O, L, O_s, L_s)                         # the one merge primitive
        wait; K, V = K', V'

    backward: the blocks travel again; each step gives dQ_r a share (kept home) and dK, dV of the
    block a share (dK, dV travel with the block, one hop behind it, and a last hop brings them home).

Causal attention and load balance: with contiguous shards rank W-1 sees every block and rank 0 only
its own, so the slowest rank does W times the work of the fastest. Zigzag shards fix it: the sequence
is cut into 2W chunks and rank r holds chunks r and 2W-1-r (one early, one late). Then every step
after the first is exactly half a block of work on every rank (section 5, ``_block_plan``).

The per-block kernel is the course's own: on a GPU step 06 (step 05's forward launcher, step 06's
backward launcher, NCCL between ranks); on a CPU step 04's strips (gloo between ranks). Not step 06
in Triton's interpreter on a CPU: there every program instance runs as Python, and one block of 64
rows (B=1, H=2, D=16) took 0.3 s forward and 0.76 s backward against 0.1-0.2 ms for the strips,
times W steps, on each of W processes sharing two cores. ``kernel="triton"`` forces it (one test
does, at 16 rows a shard).

What you write (``make stubs`` turns each into a NotImplementedError): ``shard`` and ``unshard``
(the zigzag layout), ``merge`` (the one merge primitive), the causal block choice in
``_block_plan``, and the two ring loops. ``Ring`` (the communication) is given: read it.

Known limits: every rank must hold the same number of rows (the ring swaps equal buffers); causal
needs an even shard (two chunks) and Nq = Nk per shard; dK/dV travel in float32 for accuracy (twice
the bytes of a bf16 K/V hop: a backward step moves 3x a forward step's bytes). Not here: striped layouts, DeepSpeed-Ulysses (all-to-all
over heads), and PyTorch's own ``context_parallel`` (notebook 10 compares them).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from attnlib import check_inputs

KERNELS = ("auto", "strips", "triton")


# ---------------------------------------------------------------------------
# 1. Who holds which rows: contiguous and zigzag shards
# ---------------------------------------------------------------------------
# Contiguous (full attention): rank r holds rows [r N/W, (r+1) N/W).
# Zigzag (causal): the sequence is 2W chunks of c = N / (2W) rows; rank r holds chunk r then chunk
# 2W-1-r. W = 2, N = 8: rank 0 holds rows 0 1 6 7, rank 1 rows 2 3 4 5.

def shard(x, world, rank, is_causal=False, dim=-2):
    """Rank ``rank``'s shard of the sequence ``x`` (rows along ``dim``): contiguous, or zigzag if causal."""
    n = x.shape[dim]
    parts = 2 * world if is_causal else world
    if n % parts:
        raise ValueError(f"step10 shard: the sequence length {n} must be a multiple of "
                         f"{'2 x world = ' if is_causal else 'world = '}{parts}")
    if not is_causal:
        return x.chunk(world, dim)[rank]
    # >>> STUDENT: cut x into 2*world equal chunks along dim; rank's shard is chunk `rank` followed by chunk 2*world-1-rank
    chunks = x.chunk(2 * world, dim)
    return torch.cat([chunks[rank], chunks[2 * world - 1 - rank]], dim)
    # <<< STUDENT


def unshard(shards, is_causal=False, dim=-2):
    """The whole sequence from the list of every rank's shard (rank order): ``shard``'s inverse."""
    world = len(shards)
    if not is_causal:
        return torch.cat(list(shards), dim)
    # >>> STUDENT: split each shard in its two chunks; the sequence is the first chunks in rank order, then the second chunks in reverse rank order
    halves = [s.chunk(2, dim) for s in shards]
    chunks = [halves[r][0] for r in range(world)] + [halves[r][1] for r in reversed(range(world))]
    return torch.cat(chunks, dim)
    # <<< STUDENT


# ---------------------------------------------------------------------------
# 2. The one merge primitive
# ---------------------------------------------------------------------------

def merge(out, lse, block_out, block_lse):
    """Fold one block's partial result into the running one; returns the new ``(out, lse)``.

    out: (..., R, D) float32, lse: (..., R) float32   -- attention over the keys seen so far
    block_out (..., R, D), block_lse (..., R)         -- attention over one more block of keys
    Both are normalized (each is a softmax average), so with L = log(e^lse + e^block_lse):
        out_new = e^(lse - L) out + e^(block_lse - L) block_out = (1 - w) out + w block_out,
        w = e^(block_lse - L) = sigmoid(block_lse - lse)
    Take the larger of the two LSEs out before the exponentials, as step 04 does with the running
    max: an LSE near 100 (large scores) overflows e^lse in float32, one near -100 underflows it to 0
    and log(0) = -inf. Compute the weight from the difference of the two LSEs (sigmoid), not from
    the rounded L: at LSEs near 175, e^(block_lse - L) carries L's rounding (1.5e-5, one float32 ulp)
    into every output, and the ring's dQ then misses the float32 tolerance on 2 ranks.
    Every row needs a finite ``lse`` or ``block_lse``: the ring merges its own block first, where
    every row sees at least one key.
    """
    block_out, block_lse = block_out.float(), block_lse.float()
    # >>> STUDENT: m = max(lse, block_lse); new_lse = m + log(exp(lse - m) + exp(block_lse - m)); the block's weight w = exp(block_lse - new_lse) = sigmoid(block_lse - lse); out_new = (1 - w) * out + w * block_out
    m = torch.maximum(lse, block_lse)                                       # (..., R)
    new_lse = m + torch.log(torch.exp(lse - m) + torch.exp(block_lse - m))  # (..., R)
    w = torch.sigmoid(block_lse - lse)[..., None]                           # (..., R, 1)
    return out + w * (block_out - out), new_lse
    # <<< STUDENT


# ---------------------------------------------------------------------------
# 3. The ring: send to the next rank, receive from the previous one
# ---------------------------------------------------------------------------

class Ring:
    """Point-to-point hops around the ranks of ``group`` (None: every rank).

    ``send_recv(*tensors)`` posts, in one ``batch_isend_irecv``, the sends of ``tensors`` to the next
    rank and the receives of as many tensors shaped alike from the previous one, and returns the
    receive buffers at once: they are filled only after ``wait()``. Between the two, compute.
    ``tag`` keeps two rings of the same ranks apart (gloo matches messages by peer and tag;
    NCCL ignores tags and matches in order, which the ring keeps).
    """

    def __init__(self, group=None, tag=0):
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        g = group if group is not None else dist.group.WORLD
        self.next = dist.get_global_rank(g, (self.rank + 1) % self.world)   # P2POp takes global ranks
        self.prev = dist.get_global_rank(g, (self.rank - 1) % self.world)
        self.tag = tag
        self._reqs, self._sent = [], []

    def send_recv(self, *tensors):
        if self._reqs:
            raise RuntimeError("Ring.send_recv: wait() for the previous hop first")
        self._sent = [t.contiguous() for t in tensors]          # kept alive until wait()
        bufs = [torch.empty_like(t) for t in self._sent]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group, self.tag + i) for i, t in enumerate(self._sent)]
        ops += [dist.P2POp(dist.irecv, b, self.prev, self.group, self.tag + i) for i, b in enumerate(bufs)]
        self._reqs = dist.batch_isend_irecv(ops)
        return bufs

    def wait(self):
        for r in self._reqs:
            r.wait()
        self._reqs, self._sent = [], []


def ring_world(group=None):
    """``(world, rank)`` of ``group``; ``(1, 0)`` without torch.distributed (one process: no ring)."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1, 0
    return dist.get_world_size(group), dist.get_rank(group)


# ---------------------------------------------------------------------------
# 4. The per-block kernel: the course's own
# ---------------------------------------------------------------------------

def _kernel_for(q, kernel):
    if kernel not in KERNELS:
        raise ValueError(f"step10 ring_attention: kernel must be one of {KERNELS}, got {kernel!r}")
    if kernel == "auto":
        return "triton" if q.device.type == "cuda" else "strips"
    return kernel


def block_forward(q, k, v, is_causal, scale, kernel):
    """``(O, LSE)`` of one block: O in q's dtype, LSE float32 ``(..., R)``."""
    if kernel == "triton":
        from .step05_triton_fwd import forward
        return forward(q, k, v, is_causal, scale)
    from .step04_flash_torch import BLOCK_K, BLOCK_Q, forward_strips
    return forward_strips(q, k, v, is_causal, scale, BLOCK_Q, BLOCK_K)


def block_backward(q, k, v, o, lse, do, is_causal, scale, kernel):
    """``(dQ, dK, dV)`` of one block, given the *final* O and LSE of these query rows.

    With the final O and LSE, P = exp(S - LSE) is the true probability of these keys among all keys,
    and D = rowsum(dO * O) the true row term: each block's share is then exactly its part of the
    whole gradient, and the shares add up.
    """
    if kernel == "triton":
        from .step06_triton_bwd import backward
        return backward(q, k, v, o, lse, do, is_causal, scale)
    from .step04_flash_torch import BLOCK_K, BLOCK_Q, backward_strips
    return backward_strips(q, k, v, o, lse, do, is_causal, scale, BLOCK_Q, BLOCK_K)


# ---------------------------------------------------------------------------
# 5. Which part of each block a rank computes
# ---------------------------------------------------------------------------
# At step s, rank r holds the K/V block of rank src = (r - s) mod W. A plan is (rows, keys, causal):
# the query rows of the shard and the key rows of the block that meet, as slices, and whether the
# causal mask applies inside them.
#   full attention: every step, all rows against all keys, no mask.
#   causal, zigzag: rank r's rows are chunks (r, 2W-1-r); the block's keys are chunks (src, 2W-1-src).
#     s = 0    the shard's own block: top-left causal on the shard is exactly the right mask
#              (chunk r sees itself causally, not its later chunk; chunk 2W-1-r sees chunk r whole
#              and itself causally);
#     src < r  chunk src comes before both of rank r's chunks, chunk 2W-1-src after both: all rows
#              against the first half of the keys, no mask;
#     src > r  both of src's chunks come after chunk r and before chunk 2W-1-r: the second half of
#              the rows against all keys, no mask.
#   Every step after the first is half a block on every rank: balanced.

ALL = slice(None)


def _block_plan(rank, src, n, is_causal):
    """``(rows, keys, causal)`` for the block of rank ``src`` on rank ``rank``; ``n`` rows per shard."""
    if not is_causal:
        return ALL, ALL, False
    half = n // 2
    # >>> STUDENT: the three zigzag cases above: own block (causal, everything), src < rank, src > rank
    if src == rank:
        return ALL, ALL, True
    if src < rank:
        return ALL, slice(0, half), False
    return slice(half, n), ALL, False
    # <<< STUDENT


# ---------------------------------------------------------------------------
# 6. The ring loops
# ---------------------------------------------------------------------------

def ring_forward(q, k, v, is_causal, scale, group, kernel):
    """``(O, LSE)`` of this rank's query rows against every rank's keys: O in q's dtype, LSE float32."""
    world, rank = ring_world(group)
    ring = Ring(group) if world > 1 else None
    n = q.shape[-2]
    out = lse = None
    for step in range(world):
        src = (rank - step) % world
        if step + 1 < world:
            next_k, next_v = ring.send_recv(k, v)            # the next block travels ...
        rows, keys, causal = _block_plan(rank, src, n, is_causal)
        # >>> STUDENT: attention of q[..., rows, :] against this block's k, v [..., keys, :] (block_forward); the first step starts (out, lse) in float32, every later one merges into out[..., rows, :], lse[..., rows]
        block_out, block_lse = block_forward(q[..., rows, :], k[..., keys, :], v[..., keys, :],
                                             causal, scale, kernel)       # ... while this one runs
        if out is None:
            out, lse = block_out.float(), block_lse.float()
        else:
            out[..., rows, :], lse[..., rows] = merge(out[..., rows, :], lse[..., rows], block_out, block_lse)
        # <<< STUDENT
        if step + 1 < world:
            ring.wait()
            k, v = next_k, next_v
    return out.to(q.dtype), lse


def ring_backward(q, k, v, o, lse, do, is_causal, scale, group, kernel):
    """``(dQ, dK, dV)`` of this rank's shard: dQ from every block, dK and dV from every rank's queries."""
    world, rank = ring_world(group)
    kv_ring = Ring(group, tag=0) if world > 1 else None
    d_ring = Ring(group, tag=2) if world > 1 else None       # dK/dV: their own tags
    n = q.shape[-2]
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dk = dv = None                                           # the travelling block's dK, dV (float32)
    for step in range(world):
        src = (rank - step) % world
        if step + 1 < world:
            next_k, next_v = kv_ring.send_recv(k, v)
        rows, keys, causal = _block_plan(rank, src, n, is_causal)
        bq, bk, bv = block_backward(q[..., rows, :], k[..., keys, :], v[..., keys, :], o[..., rows, :],
                                    lse[..., rows], do[..., rows, :], causal, scale, kernel)
        # >>> STUDENT: dq[..., rows, :] += bq; dK/dV of block src: step 0 starts float32 zeros shaped like k; later steps wait for d_ring (the previous rank's dK/dV of this same block) and take its buffers; add bk, bv at [..., keys, :]; then wait for kv_ring, take the next block, and send dK/dV on (d_ring.send_recv)
        dq[..., rows, :] += bq
        if step == 0:
            dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
            dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
        else:
            d_ring.wait()                                    # dK, dV of block src from rank r-1
            dk, dv = next_dk, next_dv
        dk[..., keys, :] += bk
        dv[..., keys, :] += bv
        if step + 1 < world:
            kv_ring.wait()
            k, v = next_k, next_v
        if world > 1:
            next_dk, next_dv = d_ring.send_recv(dk, dv)      # on to the next rank; the last hop goes home
        # <<< STUDENT
    if world > 1:
        # >>> STUDENT: the last hop: wait for d_ring; what arrives is the dK, dV of this rank's own keys (every rank's share)
        d_ring.wait()
        dk, dv = next_dk, next_dv
        # <<< STUDENT
    return dq, dk, dv


# ---------------------------------------------------------------------------
# 7. The autograd.Function and the public functions
# ---------------------------------------------------------------------------

def _check(q, k, v, is_causal, scale, group, kernel, where):
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale, where=where)
    kernel = _kernel_for(q, kernel)
    world, _ = ring_world(group)
    if world > 1 and is_causal:
        if q.shape[-2] != k.shape[-2]:
            raise ValueError(f"{where}: causal ring attention needs Nq = Nk per shard (one sequence), "
                             f"got {q.shape[-2]} and {k.shape[-2]}")
        if q.shape[-2] % 2:
            raise ValueError(f"{where}: a causal (zigzag) shard holds two chunks, so its length must be "
                             f"even, got {q.shape[-2]}")
    return scale, kernel


class RingAttention(torch.autograd.Function):
    """``apply(q, k, v, is_causal, scale, group, kernel)`` -> this rank's O.

    Saves this rank's q, k, v, O and one float32 LSE ``(..., N_shard)``; the backward runs the ring
    again (K/V forward, dK/dV one hop behind) and returns dQ, dK, dV of this rank's shard.
    """

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False, scale=None, group=None, kernel="auto"):
        scale, kernel = _check(q, k, v, is_causal, scale, group, kernel, "step10 RingAttention")
        o, lse = ring_forward(q.detach(), k.detach(), v.detach(), is_causal, scale, group, kernel)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.args = (is_causal, scale, group, kernel)
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(q, k, v, o, lse, do.contiguous(), *ctx.args)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


def ring_attention(q_shard, k_shard, v_shard, is_causal=False, scale=None, group=None, kernel="auto"):
    """Attention of this rank's query rows against the whole sequence, held across ``group``'s ranks.

    Every rank calls it with its own shards (``shard(x, world, rank, is_causal)``: contiguous for
    full attention, zigzag for causal) and gets its own rows of O; the gradients flow back to its
    shards. ``kernel``: "auto" (step 06 on CUDA, step 04's strips on a CPU), "strips" or "triton".
    Without torch.distributed initialized it is one rank: the kernel alone.
    """
    return RingAttention.apply(q_shard, k_shard, v_shard, is_causal, scale, group, kernel)


def ring_attention_with_lse(q_shard, k_shard, v_shard, is_causal=False, scale=None, group=None, kernel="auto"):
    """``(O, LSE)`` of this rank's rows, with no autograd."""
    scale, kernel = _check(q_shard, k_shard, v_shard, is_causal, scale, group, kernel,
                           "step10 ring_attention_with_lse")
    with torch.no_grad():
        return ring_forward(q_shard, k_shard, v_shard, is_causal, scale, group, kernel)


def attention(q, k, v, is_causal=False, scale=None):
    """The course contract: ``ring_attention`` over every rank, with the default kernel.

    Without torch.distributed initialized (the contract tests, the grader's single-process checks)
    it is a ring of one: the per-block kernel alone, with the whole sequence as the one shard.
    """
    return RingAttention.apply(q, k, v, is_causal, scale, None, "auto")
