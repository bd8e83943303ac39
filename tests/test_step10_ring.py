"""Step 10: ring attention across processes (gloo on a CPU), against single-process attention.

The distributed tests start 2 gloo processes once per module (``attnlib.dist.RankGroup``, about 6 s
on 2 cores) and 4 once for one test; every job runs ``ring_attention`` on every rank, and each
rank's O, dQ, dK, dV are compared with its rows of the float64 reference (``attnlib.ringcheck``).
On a CPU the ring's per-block kernel is step 04's strips: step 06 in Triton's interpreter took 0.3 s
forward and 0.76 s backward for one 64-row block (B=1, H=2, D=16) against 0.1-0.2 ms for the
strips, so only ``test_ring_through_the_triton_kernels`` runs it, at 16 rows a shard.
"""

import pytest
import torch

from attnlib.compare import assert_close
from attnlib.contract import STEPS
from attnlib.dist import RankGroup
from attnlib.inputs import make_qkv
from attnlib.reference import reference_attention
from attnlib.ringcheck import RingCase, check_ring, load_ring, positions

pytestmark = pytest.mark.step10


@pytest.fixture
def step10(load):
    # load(10) once attnlib.contract.STEPS lists step 10; until then the same import by name.
    return load(10) if 10 in STEPS else load_ring()


# ---------------------------------------------------------------------------
# The merge primitive, in one process
# ---------------------------------------------------------------------------

def _block_results(q, k, v, split):
    """O and LSE (float64) of the queries against keys [0, split) and [split, N), and against all."""
    a = reference_attention(q, k[..., :split, :], v[..., :split, :])
    b = reference_attention(q, k[..., split:, :], v[..., split:, :])
    return a, b, reference_attention(q, k, v)


@pytest.mark.parametrize("shift", [0.0, 120.0, -120.0], ids=["lse-near-3", "lse-near+120", "lse-near-120"])
def test_merge_of_two_blocks_is_attention_over_both(step10, shift):
    """Two blocks' (O, LSE) merged = attention over all their keys. Shifting both LSEs by +-120 must
    shift the merged LSE alike and leave O alone: e^120 overflows float32, e^-120 underflows."""
    q, k, v = make_qkv(2, 3, 17, 40, 16)
    (oa, la), (ob, lb), (o, lse) = _block_results(q, k, v, split=13)
    out, new_lse = step10.merge(oa.float(), (la + shift).float(), ob.float(), (lb + shift).float())
    ctx = f"two blocks of 13 and 27 keys, both LSEs shifted by {shift:+g}"
    assert_close(new_lse, lse + shift, name="merged LSE", dtype=torch.float32, row_dim=-1, context=ctx,
                 hint=lambda: "NaN/Inf: take the larger LSE out before the exponentials" if not
                 torch.isfinite(new_lse).all() else None)
    assert_close(out, o, name="merged O", dtype=torch.float32, context=ctx)


def test_merge_is_order_free_and_chains(step10):
    """Merging three blocks in any order gives attention over all keys: the ring's W-1 merges."""
    q, k, v = make_qkv(1, 2, 9, 30, 8, seed=3)
    parts = [reference_attention(q, k[..., a:b, :], v[..., a:b, :]) for a, b in ((0, 7), (7, 19), (19, 30))]
    o, lse = reference_attention(q, k, v)
    for order in ((0, 1, 2), (2, 0, 1), (1, 2, 0)):
        out, l = parts[order[0]][0].float(), parts[order[0]][1].float()
        for i in order[1:]:
            out, l = step10.merge(out, l, parts[i][0], parts[i][1].float())
        assert_close(out, o, name="O after merging blocks in order " + str(order), dtype=torch.float32)
        assert_close(l, lse, name="LSE after merging blocks in order " + str(order), dtype=torch.float32,
                     row_dim=-1)


# ---------------------------------------------------------------------------
# Shards: contiguous and zigzag
# ---------------------------------------------------------------------------

def _rows(x):
    return x[0, 0, :, 0].tolist()


def test_zigzag_shards_hold_one_early_and_one_late_chunk(step10):
    x = torch.arange(8.0)[None, None, :, None].expand(1, 2, 8, 3)          # (B, H, N, D): row i holds i
    got = [_rows(step10.shard(x, 2, r, is_causal=True)) for r in range(2)]
    assert got == [[0, 1, 6, 7], [2, 3, 4, 5]], (
        f"zigzag shards of 8 rows on 2 ranks: got {got}, expected rank 0 [0, 1, 6, 7] (chunks 0 and 3) "
        "and rank 1 [2, 3, 4, 5] (chunks 1 and 2): rank r holds chunk r, then chunk 2W-1-r")
    n, world = 24, 4
    x = torch.arange(float(n))[None, None, :, None].expand(2, 1, n, 5)
    shards = [step10.shard(x, world, r, is_causal=True) for r in range(world)]
    for r, s in enumerate(shards):
        want = positions(n, world, r, True).tolist()
        assert _rows(s) == want, f"rank {r} of {world}: rows {_rows(s)}, expected {want} (chunks {r}, {7 - r})"
        assert s.shape == (2, 1, n // world, 5)
    back = step10.unshard(shards, is_causal=True)
    assert torch.equal(back, x), (f"unshard(zigzag shards) gives rows {_rows(back)}, not 0..{n - 1}: the first "
                                  "chunks go in rank order, then the second chunks in reverse rank order")
    # unshard on its own (not only as shard's inverse): rank 0 = [0 1 | 6 7], rank 1 = [2 3 | 4 5]
    lit = [torch.tensor([0.0, 1, 6, 7])[None, None, :, None], torch.tensor([2.0, 3, 4, 5])[None, None, :, None]]
    assert _rows(step10.unshard(lit, is_causal=True)) == list(range(8))


def test_contiguous_shards_and_bad_lengths(step10):
    x = torch.arange(12.0)[None, None, :, None]
    shards = [step10.shard(x, 3, r) for r in range(3)]
    assert [_rows(s) for s in shards] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert torch.equal(step10.unshard(shards), x)
    with pytest.raises(ValueError, match="multiple"):
        step10.shard(x, 4, 0, is_causal=True)                  # 12 rows are not 8 chunks
    with pytest.raises(ValueError, match="multiple"):
        step10.shard(x, 5, 0)


# ---------------------------------------------------------------------------
# One process: a ring of one is the kernel alone
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_ring_of_one_is_attention(step10, is_causal):
    from attnlib.checks import check_attention, check_saved_lse
    q, k, v = make_qkv(1, 2, 20, 20, 16)
    check_attention(step10.attention, q, k, v, is_causal=is_causal)
    out = step10.ring_attention(q.clone().requires_grad_(), k, v, is_causal=is_causal)
    check_saved_lse(out, q, k, v, is_causal=is_causal, function_name="RingAttention")


# ---------------------------------------------------------------------------
# Several processes
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def group2():
    # interpret: on a GPU machine too, the Triton path below runs in the interpreter on the ranks' CPU tensors
    with RankGroup(world=2, timeout_s=60, interpret=True) as g:
        yield g


CASES_2 = [
    RingCase(batch=(1, 2), n=32, d=16, is_causal=False),
    RingCase(batch=(1, 2), n=32, d=16, is_causal=True),
    RingCase(batch=(2, 1), n=200, d=24, is_causal=False, scale=0.5, seed=4),   # 100-row shards: 2 strips of 64
    RingCase(batch=(2, 1), n=200, d=24, is_causal=True, seed=5),               # 50-row chunks
    RingCase(batch=(1, 2), n=40, d=16, is_causal=True, gain=25.0, seed=6),     # LSEs up to ~110
]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES_2, ids=lambda c: c.id)
def test_ring_on_2_ranks(group2, case):
    check_ring(group2, case)


@pytest.mark.slow
def test_ring_on_4_ranks():
    with RankGroup(world=4, timeout_s=90) as g:
        check_ring(g, RingCase(batch=(1, 2), n=48, d=16, is_causal=True, seed=7))


@pytest.mark.slow
def test_ring_through_the_triton_kernels(group2):
    """The GPU path (step 05's forward and step 06's backward launchers) in Triton's interpreter, on a GPU
    machine too (the gloo ranks hold CPU tensors; compiled, it runs in bench/ring_gpu.py under torchrun)."""
    check_ring(group2, RingCase(batch=(1, 2), n=32, d=16, is_causal=True, kernel="triton", seed=9))   # two heads: a head stride the kernels get wrong shows only past the first


def trace_job(rank, world, is_causal):
    """On every rank: the order of ring events and kernel calls, forward and backward."""
    import os
    step = load_ring(os.environ.get("ATTN_IMPL"))
    events = []
    send_recv, wait = step.Ring.send_recv, step.Ring.wait
    fwd, bwd = step.block_forward, step.block_backward

    def traced(name, fn):
        def f(*a, **kw):
            events.append(name)
            return fn(*a, **kw)
        return f

    step.Ring.send_recv = traced("post", send_recv)
    step.Ring.wait = traced("wait", wait)
    step.block_forward, step.block_backward = traced("fwd", fwd), traced("bwd", bwd)
    try:
        q, k, v = make_qkv(1, 1, 8, 8, 4, seed=rank, requires_grad=True)
        o = step.ring_attention(q, k, v, is_causal=is_causal)
        o.sum().backward()
    finally:
        step.Ring.send_recv, step.Ring.wait = send_recv, wait
        step.block_forward, step.block_backward = fwd, bwd
    return events


@pytest.mark.slow
def test_each_hop_is_posted_before_the_block_is_computed(group2):
    """Overlap: the next K/V hop is in flight (posted, not waited for) while the kernel runs."""
    for is_causal in (False, True):
        for rank, ev in enumerate(group2.run(trace_job, is_causal)):
            fwd = ev[:ev.index("fwd", ev.index("fwd") + 1) + 1]   # up to the second block's forward
            assert fwd == ["post", "fwd", "wait", "fwd"], (
                f"rank {rank}, forward on 2 ranks: events {fwd}; expected post (send K/V on, receive the next), "
                "fwd (this block, while the hop is in flight), wait, fwd (the received block)")
            bwd = ev[len(fwd):]
            # step 0: post K/V, compute, wait K/V, post dK/dV; step 1: compute, wait dK/dV, post the last
            # hop home, wait it (the order of the waits inside a step may differ)
            assert bwd[:2] == ["post", "bwd"] and bwd.count("bwd") == 2 and bwd.count("post") == 3, (
                f"rank {rank}, backward on 2 ranks: events {bwd}; expected the K/V hop posted before the first "
                "block's backward, two block backwards, and three hops (K/V once, dK/dV twice: on, then home)")
            assert bwd.index("post", 2) > bwd.index("bwd"), f"rank {rank}: dK/dV sent before being computed: {bwd}"


def stuck_job(rank, world):
    """Rank 0 waits for a message no rank sends: the classic ring deadlock."""
    import torch.distributed as dist
    if rank == 0:
        dist.recv(torch.zeros(1), src=1)
    return rank


@pytest.mark.slow
def test_a_rank_stuck_in_a_receive_is_named_and_the_group_restarts():
    with RankGroup(world=2, timeout_s=3) as g:
        with pytest.raises(AssertionError) as info:
            g.run(stuck_job)
        report = str(info.value)
        assert "rank 0:" in report and "rank 1:" not in report and "no rank sent" in report, report
        assert g.run(trace_job, False), "the group must start again after a failure"
        assert g.starts == 2


def test_forkserver_preloads_triton_only_where_the_interpreter_is_already_chosen():
    """torch._dynamo imports triton, and triton.language's @jit helpers are compiled or interpreted as
    TRITON_INTERPRET says at import: preloaded where the ranks turn the interpreter on themselves (a GPU
    machine), every interpreted kernel in a rank failed (the H200 at c3669d0)."""
    from attnlib.dist import DYNAMO, PRELOAD, PRELOAD_TORCH_ONLY, forkserver_preload
    for mods in (PRELOAD, PRELOAD_TORCH_ONLY):
        assert DYNAMO not in forkserver_preload(mods, {}), "triton preloaded before the ranks choose the interpreter"
        assert DYNAMO not in forkserver_preload(mods, {"TRITON_INTERPRET": "0"})
        assert forkserver_preload(mods, {"TRITON_INTERPRET": "1"}) == list(mods)
