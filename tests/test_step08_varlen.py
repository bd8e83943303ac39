"""Step 08: packed ragged batches with grouped-query attention, against the float64 reference.

The reference is the per-sequence loop: each sequence's rows of q, k, v cut out of the packed
tensors, K/V heads repeated for their query heads, ``attnlib.reference`` in float64. Batches hold
a sequence of length 1, an empty one, one much longer than the rest, and Nq != Nk per sequence.
Without a GPU the kernels run in Triton's interpreter (fp32 and fp16); bf16 on a GPU.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported; conftest does the same

import pytest  # noqa: E402

from attnlib.checks import check_attention  # noqa: E402
from attnlib.compare import assert_close  # noqa: E402
from attnlib.reference import reference_attention, reference_backward  # noqa: E402

pytestmark = [pytest.mark.step08,
              pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")]  # interpreter

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if GPU else [])
dt = lambda d: str(d).replace("torch.", "")  # noqa: E731

# (query lengths, key lengths, query heads, K/V heads, D)
BATCHES = {
    "ragged": ([5, 1, 0, 70, 33], [5, 1, 0, 70, 33], 2, 2, 32),          # length 1, empty, one long
    "nq-ne-nk": ([17, 40, 3], [40, 9, 3], 2, 2, 32),                    # Nq < Nk and Nq > Nk per sequence
    "gqa": ([20, 45], [20, 45], 4, 2, 16),                              # 2 query heads per K/V head
    "mqa": ([33, 7], [33, 7], 3, 1, 16),                                # one K/V head
}


def packed(name, dtype, seed=0):
    lq, lk, h, hkv, d = BATCHES[name]
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lq), h, d, generator=g).to(DEVICE, dtype)
    k = torch.randn(sum(lk), hkv, d, generator=g).to(DEVICE, dtype)
    v = torch.randn(sum(lk), hkv, d, generator=g).to(DEVICE, dtype)
    cu = lambda ls: torch.tensor([0] + torch.tensor(ls).cumsum(0).tolist(), dtype=torch.int32, device=DEVICE)  # noqa: E731
    return q, k, v, cu(lq), cu(lk), max(lq), max(lk)


def reference(q, k, v, cu_q, cu_k, is_causal, do=None):
    """Per sequence, in float64: O (and dQ, dK, dV when ``do`` is given), packed like the inputs."""
    group = q.shape[1] // k.shape[1]
    outs = [torch.zeros_like(t, dtype=torch.float64) for t in ((q,) if do is None else (q, q, k, v))]
    for (a, b), (c, e) in zip(zip(cu_q.tolist(), cu_q.tolist()[1:]), zip(cu_k.tolist(), cu_k.tolist()[1:])):
        if b == a:
            continue
        qs = q[a:b].transpose(0, 1)                                        # (H, n, D)
        ks = k[c:e].transpose(0, 1).repeat_interleave(group, 0)            # (H, m, D): K/V head h // G
        vs = v[c:e].transpose(0, 1).repeat_interleave(group, 0)
        outs[0][a:b] = reference_attention(qs, ks, vs, is_causal)[0].transpose(0, 1)
        if do is not None:
            dq, dk, dv = reference_backward(qs, ks, vs, do[a:b].transpose(0, 1), is_causal)
            outs[1][a:b] = dq.transpose(0, 1)
            outs[2][c:e] = dk.view(k.shape[1], group, e - c, -1).sum(1).transpose(0, 1)   # sum over the group
            outs[3][c:e] = dv.view(k.shape[1], group, e - c, -1).sum(1).transpose(0, 1)
    return outs


# On a CPU (the interpreter) fp16 runs on one batch; on a GPU every dtype on every batch.
RUNS = [(name, dtype) for name in sorted(BATCHES) for dtype in DTYPES
        if GPU or dtype == torch.float32 or name == "gqa"]


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name, dtype", RUNS, ids=[f"{n}-{dt(d)}" for n, d in RUNS])
def test_forward_and_backward(load, name, dtype, is_causal):
    step = load(8)
    q, k, v, cu_q, cu_k, mq, mk = packed(name, dtype)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    o = step.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, is_causal=is_causal)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE, dtype)
    o.backward(do)
    ref_o, ref_dq, ref_dk, ref_dv = reference(q, k, v, cu_q, cu_k, is_causal, do)
    ctx = f"{name}: q lengths {BATCHES[name][0]}, k lengths {BATCHES[name][1]}, heads {BATCHES[name][2]}/{BATCHES[name][3]}, {dt(dtype)}, {'causal' if is_causal else 'full'}"
    assert_close(o, ref_o, name="O", row_dim=0, row_label="packed query rows", context=ctx)
    assert_close(q.grad, ref_dq, name="dQ", row_dim=0, row_label="packed query rows", context=ctx)
    assert_close(k.grad, ref_dk, name="dK", row_dim=0, row_label="packed key rows", context=ctx)
    assert_close(v.grad, ref_dv, name="dV", row_dim=0, row_label="packed key rows", context=ctx)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_lse(load, is_causal):
    step = load(8)
    q, k, v, cu_q, cu_k, mq, mk = packed("ragged", torch.float32)
    o, lse = step.attention_varlen_with_lse(q, k, v, cu_q, cu_k, mq, mk, is_causal=is_causal)
    assert lse.shape == (q.shape[1], q.shape[0]) and lse.dtype == torch.float32, (
        f"the LSE is (H, total_q) float32 = {(q.shape[1], q.shape[0])}, got {tuple(lse.shape)} {lse.dtype}")
    oq, ok = cu_q.tolist(), cu_k.tolist()
    for a, b, c, e in zip(oq, oq[1:], ok, ok[1:]):
        if b > a:
            _, ref = reference_attention(q[a:b].transpose(0, 1), k[c:e].transpose(0, 1), v[c:e].transpose(0, 1),
                                         is_causal)
            assert_close(lse[:, a:b], ref, name="LSE", dtype=torch.float32, row_dim=-1,
                         context=f"sequence rows {a}:{b}")


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_gqa_matches_sdpa_enable_gqa(load, is_causal):
    """One sequence, 4 query heads on 2 K/V heads: SDPA's own GQA (enable_gqa=True) agrees."""
    step = load(8)
    q, k, v, cu_q, cu_k, mq, mk = packed("gqa", torch.float32)
    a, b = cu_q.tolist()[1:3]
    o = step.attention_varlen(q, k, v, cu_q, cu_k, mq, mk, is_causal=is_causal)[a:b]
    ref = torch.nn.functional.scaled_dot_product_attention(
        q[a:b].transpose(0, 1).double(), k[a:b].transpose(0, 1).double(), v[a:b].transpose(0, 1).double(),
        is_causal=is_causal, enable_gqa=True).transpose(0, 1)
    assert_close(o, ref, name="O (against SDPA enable_gqa=True)", row_dim=0)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_dense_contract(load, is_causal):
    """attention(q, k, v) on (..., N, D): every (batch, head) as its own sequence."""
    from attnlib import make_qkv
    step = load(8)
    q, k, v = make_qkv(2, 2, 40, 33, 32, device=DEVICE)
    check_attention(step.attention, q, k, v, is_causal=is_causal)


def test_no_padding_is_touched(load):
    """Rows outside every sequence do not exist: poison the K/V rows of one sequence with NaN and the
    others stay finite and right (a kernel reading across a sequence boundary picks up the NaN)."""
    step = load(8)
    q, k, v, cu_q, cu_k, mq, mk = packed("ragged", torch.float32)
    a, b = cu_k.tolist()[3:5]               # the long sequence
    kp, vp = k.clone(), v.clone()
    kp[a:b], vp[a:b] = float("nan"), float("nan")
    o = step.attention_varlen(q, kp, vp, cu_q, cu_k, mq, mk, is_causal=True)
    keep = torch.ones(q.shape[0], dtype=torch.bool)
    keep[cu_q.tolist()[3]:cu_q.tolist()[4]] = False
    ref = reference(q, k, v, cu_q, cu_k, True)[0]
    assert_close(o[keep.to(DEVICE)], ref[keep], name="O outside the poisoned sequence", row_dim=0)


@pytest.mark.parametrize("bad, match", [
    (lambda a: dict(a, cu_seqlens_q=a["cu_seqlens_q"].long()), "int32"),
    (lambda a: dict(a, cu_seqlens_q=a["cu_seqlens_q"].flip(0)), "start at 0"),
    (lambda a: dict(a, max_seqlen_q=3), "max_seqlen_q=3"),
    (lambda a: dict(a, k=a["k"][:, :1].repeat(1, 3, 1), v=a["v"][:, :1].repeat(1, 3, 1)), "multiple of the K/V heads"),
    (lambda a: dict(a, q=a["q"][None]), "packed"),
    (lambda a: dict(a, q=a["q"][:-1]), "end at the 59 rows of q"),
    (lambda a: dict(a, cu_seqlens_k=torch.tensor([0, 40, 40, 52], dtype=torch.int32, device=DEVICE)),
     "sequence 1 has 40 queries and no key"),
])
def test_bad_input_raises(load, bad, match):
    step = load(8)
    q, k, v, cu_q, cu_k, mq, mk = packed("nq-ne-nk", torch.float32)
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=mq, max_seqlen_k=mk)
    with pytest.raises(ValueError, match=match):
        step.attention_varlen(**bad(args))


def test_dq_tile_is_step08s_own_where_step06s_runs_one_program_per_sm(load):
    """At D <= 64 in 16 bits on a GPU step 08's dQ kernel takes 64x64 tiles on 4 warps (step 06's 128x64 on
    8 warps needs 136-139 registers there: one program per SM, 5-9% slower, results/h200/triton/bwd_tiles.json);
    causal, the dK/dV tiles step 08 was measured with (step 06's until it moved to 32x64 on 4 warps); every
    other entry is step 06's table without its two launch switches (step 06's kernels only take them). A pure
    function of the shape: checked without a GPU."""
    s6, s8 = load(6), load(8)
    for dtype in (torch.float16, torch.bfloat16):
        for causal in (False, True):
            got = s8.varlen_bwd_config(4096, 4096, 64, dtype, causal, "cuda", 16)
            want = s6.tiles_only(s6.bwd_config(4096, 4096, 64, dtype, causal, "cuda", 16))
            if causal:
                want["dkdv"] = dict(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=4, maxnreg=128)
            assert got["dq"] == dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)
            assert {k: v for k, v in got.items() if k != "dq"} == {k: v for k, v in want.items() if k != "dq"}
    for args in ((4096, 4096, 128, torch.bfloat16, True, "cuda", 16), (64, 64, 64, torch.float32, True, "cuda", 1),
                 (64, 64, 64, torch.bfloat16, True, "cpu", 1)):
        assert s8.varlen_bwd_config(*args) == s6.tiles_only(s6.bwd_config(*args)), args


def test_cu_seqlens_are_read_once_per_tensor_and_again_after_a_write(load, monkeypatch):
    """Reading cu_seqlens is a device sync; a model's layers pass the same tensors, so their values are
    checked once, and again only when the tensors change (in place: the version counter) or are new."""
    step = load(8)
    calls = []
    real = step._check_values
    monkeypatch.setattr(step, "_check_values", lambda *a: (calls.append(1), real(*a))[1])
    q, k, v, cu_q, cu_k, mq, mk = packed("nq-ne-nk", torch.float32)
    for _ in range(3):
        step.attention_varlen(q, k, v, cu_q, cu_k, mq, mk)
    assert len(calls) == 1, f"the same cu_seqlens were read {len(calls)} times"
    step.attention_varlen(q, k, v, cu_q.clone(), cu_k, mq, mk)                 # a new tensor: read
    assert len(calls) == 2
    cu_k[2] = cu_k[1]                                                          # in place: sequence 1 loses its keys
    with pytest.raises(ValueError, match="no key to attend to"):
        step.attention_varlen(q, k, v, cu_q, cu_k, mq, mk)
    step.attention(q[None, :17].transpose(1, 2), k[None, :40].transpose(1, 2), v[None, :40].transpose(1, 2))
    assert len(calls) == 3, "the dense contract builds its own cu_seqlens: nothing to read back"
