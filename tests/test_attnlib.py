"""The shared pieces test themselves: reference, comparison, diagnosis, tolerance policy."""

import math

import pytest
import torch
import torch.nn.functional as F

from attnlib import assert_close, make_dout, make_qkv, reference_attention, reference_backward
from attnlib.cases import device_dtype_params
from attnlib.compare import CompareError, format_ranges, tolerance_for
from attnlib.contract import causal_mask
from attnlib.diagnose import flash_sim, likely_bug


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("nq,nk", [(17, 17), (5, 31), (31, 5)])
def test_reference_agrees_with_pytorch_math(nq, nk, is_causal):
    q, k, v = make_qkv(2, 2, nq, nk, 24, dtype=torch.float64)
    o, lse = reference_attention(q, k, v, is_causal)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.MATH]):
        o2 = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    torch.testing.assert_close(o, o2, rtol=1e-12, atol=1e-12)
    assert lse.shape == q.shape[:-1]
    s = (q @ k.transpose(-2, -1)) / math.sqrt(24)
    if is_causal:
        s = s.masked_fill(torch.ones(nq, nk, dtype=torch.bool).tril().logical_not(), -math.inf)
    torch.testing.assert_close(lse, torch.log(torch.exp(s).sum(-1)), rtol=1e-12, atol=1e-12)


def test_reference_backward_matches_finite_differences():
    q, k, v = make_qkv(1, 2, 9, 13, 8, dtype=torch.float64)
    do = make_dout(q)
    grads = reference_backward(q, k, v, do, True)
    g = torch.Generator().manual_seed(0)
    eps = 1e-6
    for which, grad in enumerate(grads):
        for _ in range(5):
            idx = tuple(int(torch.randint(n, (1,), generator=g)) for n in (q, k, v)[which].shape)
            plus, minus = [t.clone() for t in (q, k, v)], [t.clone() for t in (q, k, v)]
            plus[which][idx] += eps
            minus[which][idx] -= eps
            fd = ((reference_attention(*plus, True)[0] - reference_attention(*minus, True)[0]) * do).sum() / (2 * eps)
            assert abs(fd.item() - grad[idx].item()) < 1e-6, (which, idx, fd.item(), grad[idx].item())


def test_assert_close_catches_nan_shape_and_small_errors():
    ref = torch.randn(2, 40, 8, dtype=torch.float64)
    assert_close(ref.float(), ref)                           # fp32 rounding passes
    bad = ref.float().clone()
    bad[1, 33, 2] = float("nan")
    with pytest.raises(CompareError, match=r"NaN: 1") as e:
        assert_close(bad, ref, tile=16)
    assert "query rows with bad elements: 33" in str(e.value)
    assert "tiles of 16 rows with bad elements: 2" in str(e.value)
    with pytest.raises(CompareError, match="shape"):
        assert_close(ref[:, :-1].float(), ref)
    off = ref.float().clone()
    off[0, 5, 0] += 1e-3 * ref.abs().max().item()            # one element, 0.1% of the scale
    with pytest.raises(CompareError, match=r"\[0, 5, 0\]"):
        assert_close(off, ref)


def test_format_ranges():
    assert format_ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"
    assert format_ranges([]) == "none"


def test_flash_sim_is_exact_when_correct():
    q, k, v = make_qkv(1, 2, 37, 45, 16, dtype=torch.float64)
    for causal in (False, True):
        o, lse = flash_sim(q, k, v, 0.25, causal, 16)
        ro, rl = reference_attention(q, k, v, causal, 0.25)
        torch.testing.assert_close(o, ro)
        torch.testing.assert_close(lse, rl)


@pytest.mark.parametrize("bug,expect", [
    ("rescale", "not rescaled"),
    ("partial", "partial key tile"),
    ("scale2", "scale is applied twice"),
])
def test_diagnosis_names_the_bug(bug, expect):
    q, k, v = make_qkv(1, 2, 37, 45, 16, dtype=torch.float64)
    if bug == "rescale":
        out = flash_sim(q, k, v, 0.25, True, 16, rescale_acc=False)[0]
    elif bug == "partial":
        out = flash_sim(q, k, v, 0.25, False, 16, drop_partial_k=True)[0]
    else:
        out = reference_attention(q, k, v, True, 0.0625)[0]
    assert expect in likely_bug("o", out, q, k, v, is_causal=bug != "partial", scale=0.25)
    # ...and names nothing for a right answer.
    assert likely_bug("o", reference_attention(q, k, v, True, 0.25)[0], q, k, v, is_causal=True, scale=0.25) is None


@pytest.mark.parametrize("device,dtype", device_dtype_params(), ids=lambda x: str(x).replace("torch.", ""))
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_tolerance_policy_leaves_pytorch_a_2x_margin(device, dtype, is_causal):
    """PyTorch's own naive attention in ``dtype`` uses at most half of each bound.

    This is how the bounds in attnlib/compare.py were set (FlashAttention's rule:
    a kernel may be about twice as wrong as PyTorch in the same dtype). If this
    fails on new hardware, the policy needs a new look, not a quiet bump.
    """
    atol, rtol = tolerance_for(dtype)
    for nq, nk, d in [(257, 257, 64), (100, 33, 128), (17, 40, 32)]:
        q, k, v = make_qkv(2, 2, nq, nk, d, dtype=dtype, device=device, requires_grad=True)
        s = (q @ k.transpose(-2, -1)) / math.sqrt(d)
        if is_causal:
            s = s.masked_fill(torch.ones(nq, nk, dtype=torch.bool, device=device).tril().logical_not(), -math.inf)
        o = torch.softmax(s, dim=-1) @ v
        do = make_dout(o)
        o.backward(do)
        refs = (reference_attention(q, k, v, is_causal)[0],) + reference_backward(q, k, v, do, is_causal)
        for name, mine, ref in zip(("O", "dQ", "dK", "dV"), (o, q.grad, k.grad, v.grad), refs):
            assert_close(mine, ref, name=f"PyTorch naive {name} at half the bound", dtype=dtype)
            err = (mine.double() - ref).abs()
            bound = atol * ref.abs().max() + rtol * ref.abs()
            assert (err <= bound / 2).all(), (
                f"{name}: PyTorch's own {dtype} attention uses {float((err / bound).max()):.2f} of the bound")


def test_diagnosis_names_unmasked_padding_keys():
    q, k, v = make_qkv(1, 2, 20, 45, 16, dtype=torch.float64)
    kp = torch.cat([k, k.new_zeros(1, 2, 3, 16)], dim=-2)
    vp = torch.cat([v, v.new_zeros(1, 2, 3, 16)], dim=-2)
    out = reference_attention(q, kp, vp, False, 0.25)[0]             # 45 keys padded to 48
    assert "zero-padded keys" in likely_bug("o", out, q, k, v, is_causal=False, scale=0.25)


def test_diagnosis_skips_all_zero_candidates():
    q, k, v = make_qkv(1, 1, 5, 1, 16, dtype=torch.float64)          # Nk=1: dK is exactly zero
    do = make_dout(q)
    zeros_dv = torch.zeros_like(v)
    hint = likely_bug("dv", zeros_dv, q, k, v, is_causal=False, scale=0.25, dout=do)
    assert hint is None or "swapped" not in hint


@pytest.mark.parametrize("is_causal", [False, True])
def test_diagnosis_names_overwritten_gradients(is_causal):
    """A backward that assigns where it should accumulate keeps only one tile's share."""
    q, k, v = make_qkv(1, 2, 40, 40, 16, dtype=torch.float64)
    do = make_dout(q)
    s = (q @ k.transpose(-2, -1)) * 0.25
    if is_causal:
        s = s.masked_fill(torch.ones(40, 40, dtype=torch.bool).tril().logical_not(), -math.inf)
    p = torch.softmax(s, -1)
    o = p @ v
    ds = p * (do @ v.transpose(-2, -1) - (do * o).sum(-1, keepdim=True))
    dq = torch.zeros_like(q)
    dk = torch.zeros_like(k)
    for k0 in range(0, 40, 16):                      # strips: dq[rows] = share of this key tile
        rows = slice(k0 if is_causal else 0, 40)
        dq[..., rows, :] = 0.25 * ds[..., rows, k0:k0 + 16] @ k[..., k0:k0 + 16, :]
    for q0 in range(0, 40, 16):                      # loops: dk = share of this query tile
        dk = 0.25 * ds[..., q0:q0 + 16, :].transpose(-2, -1) @ q[..., q0:q0 + 16, :]
    assert "dQ is overwritten" in likely_bug("dq", dq, q, k, v, is_causal=is_causal, scale=0.25, dout=do, tile=16)
    assert "dk is overwritten" in likely_bug("dk", dk, q, k, v, is_causal=is_causal, scale=0.25, dout=do, tile=16)


def test_live_bytes_sees_the_score_matrix_and_its_release():
    from attnlib.memory import LiveBytes
    q, k, v = make_qkv(1, 2, 256, 256, 16)
    with LiveBytes() as w:
        s = q @ k.transpose(-2, -1)                  # (1, 2, 256, 256) fp32: 512 KiB
        o = torch.softmax(s, -1) @ v
        del s
    assert w.largest == 2 * 256 * 256 * 4
    assert w.peak >= 2 * w.largest                   # S and softmax(S) alive together
    assert w.live == o.untyped_storage().nbytes()    # only O is still alive


# ---------------------------------------------------------------------------
# Diagnosis order: forward, then the LSE, then the backward
# ---------------------------------------------------------------------------

def _scores64(q, k, scale, is_causal):
    s = (q @ k.transpose(-2, -1)) * scale
    if is_causal:
        s = s.masked_fill(torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril().logical_not(), -math.inf)
    return s


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_diagnosis_names_every_lse_bug(is_causal):
    from attnlib.diagnose import lse_bugs
    q, k, v = make_qkv(1, 2, 37, 45, 16, dtype=torch.float64)
    s = _scores64(q, k, 0.25, is_causal)
    bugs = lse_bugs(s)
    assert len({d for d, _ in bugs}) == len(bugs) >= 7
    for desc, wrong in bugs:
        hint = likely_bug("lse", wrong.float(), q, k, v, is_causal=is_causal, scale=0.25, row_dim=-1, tile=16)
        assert hint is not None and hint.startswith(desc), f"{desc!r} was diagnosed as {hint!r}"


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("which", ["dq", "dk", "dv"])
def test_backward_from_a_wrong_lse_blames_the_lse(which, is_causal):
    """O is right, the LSE is not: the backward's gradients are wrong, and the hint says the LSE."""
    from attnlib.diagnose import _grads_from_p, lse_bugs
    q, k, v = make_qkv(1, 2, 24, 20, 16, dtype=torch.float64)
    do = make_dout(q)
    s = _scores64(q, k, 0.25, is_causal)
    o = torch.softmax(s, -1) @ v
    for desc, wrong in lse_bugs(s):
        grads = _grads_from_p(torch.exp(s - wrong[..., None]), q, k, v, do, o, 0.25)
        g = grads[("dq", "dk", "dv").index(which)]
        hint = likely_bug(which, g.float(), q, k, v, is_causal=is_causal, scale=0.25, dout=do, tile=16)
        assert hint is not None and "The LSE is wrong; fix it" in hint and desc in hint, (desc, hint)


def test_relative_error_is_never_nan():
    """A reference that is 0 everywhere (dK with one key) has no relative error to print."""
    ref = torch.zeros(2, 5, 8, dtype=torch.float64)
    with pytest.raises(CompareError) as e:
        assert_close(torch.ones(2, 5, 8), ref, name="dK")
    assert "nan" not in str(e.value).lower() and "no relative error" in str(e.value)
    assert e.value.stats.max_rel is None
    ref = torch.randn(2, 5, 8, dtype=torch.float64)
    ref[0, 0, 0] = 0.0
    bad = ref.float() + 1.0
    with pytest.raises(CompareError) as e:
        assert_close(bad, ref)
    assert "nan" not in str(e.value).lower() and "inf" not in str(e.value).lower()


def test_tile_in_a_hint_is_the_one_that_reproduces_the_bug():
    """With the tile unknown, the hint names the size whose simulation matches, never the first one tried."""
    q, k, v = make_qkv(1, 2, 100, 100, 16, dtype=torch.float64)
    out = flash_sim(q, k, v, 0.25, False, 32, rescale_acc=False)[0]
    hint = likely_bug("o", out.float(), q, k, v, is_causal=False, scale=0.25)
    assert "not rescaled" in hint and "Bk=32" in hint and "16" not in hint, hint
    # Nk = 40: dropping keys 32-39 is what Bk=16 and Bk=32 both do; the hint must not pick 16 for
    # a kernel with 32-wide tiles, so it names both.
    q, k, v = make_qkv(1, 2, 30, 40, 16, dtype=torch.float64)
    out = flash_sim(q, k, v, 0.25, False, 32, drop_partial_k=True)[0]
    hint = likely_bug("o", out.float(), q, k, v, is_causal=False, scale=0.25)
    assert "partial key tile" in hint and "Bk=16 or 32" in hint, hint


def test_no_partial_tile_guess_without_the_tile():
    """Errors only in rows 64-99 of 100 are reported as rows, not blamed on a guessed 64-row tile."""
    q, k, v = make_qkv(1, 2, 100, 100, 16, dtype=torch.float64)
    out = reference_attention(q, k, v, False, 0.25)[0].clone()
    out[..., 64:, :] += 0.5 * torch.randn(out[..., 64:, :].shape, dtype=out.dtype)
    assert likely_bug("o", out.float(), q, k, v, is_causal=False, scale=0.25) is None
    hint = likely_bug("o", out.float(), q, k, v, is_causal=False, scale=0.25, tile=64)
    assert hint and "rows 64-99" in hint


def test_query_and_key_tiles_are_told_apart():
    """Bq = 32, Bk = 16: a dK that keeps only the last query tile is named with the caller's Bq."""
    q, k, v = make_qkv(1, 2, 70, 40, 16, dtype=torch.float64)
    do = make_dout(q)
    p = torch.softmax(q @ k.transpose(-2, -1) * 0.25, -1)
    o = p @ v
    ds = p * (do @ v.transpose(-2, -1) - (do * o).sum(-1, keepdim=True))
    keep = ((torch.arange(70) // 32) == (69 // 32))[:, None]          # rows 64-69, the last tile of 32
    dk = 0.25 * (ds * keep).transpose(-2, -1) @ q
    hint = likely_bug("dk", dk.float(), q, k, v, is_causal=False, scale=0.25, dout=do, tile=16, tile_q=32)
    assert hint and "Bq=32" in hint, hint
    wrong = likely_bug("dk", dk.float(), q, k, v, is_causal=False, scale=0.25, dout=do, tile=16)
    assert wrong is None or "Bq=32" not in wrong          # with Bq taken to be 16 it cannot name 32


@pytest.mark.skipif(torch.cuda.is_available(), reason="the report is checked on the interpreter's errors")
def test_triton_error_report_is_short_and_names_the_fix(tmp_path):
    """A Triton kernel error: the message, the failing line of the implementation, the one-line fix."""
    import importlib.util
    from attnlib.diagnose import triton_report
    src = tmp_path / "kern.py"
    src.write_text(
        "import triton, triton.language as tl\n"
        "@triton.jit\n"
        "def k(A, B, O, N: tl.constexpr):\n"
        "    r = tl.arange(0, N)\n"
        "    a = tl.load(A + r[:, None] * N + r[None, :])\n"
        "    b = tl.load(B + r[:, None] * N + r[None, :])\n"
        "    tl.store(O + r[:, None] * N + r[None, :], tl.dot(a, b))\n")
    spec = importlib.util.spec_from_file_location("kern_under_test", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    a, b = torch.randn(16, 16), torch.randn(16, 16).half()
    with pytest.raises(Exception) as e:
        mod.k[(1,)](a, b, torch.empty(16, 16), N=16)
    import os
    old = os.environ.get("ATTN_IMPL")
    os.environ["ATTN_IMPL"] = str(tmp_path)
    try:
        text = triton_report(e.value)
    finally:
        os.environ["ATTN_IMPL"] = old or "steps"
    assert text is not None and len(text.splitlines()) <= 8, text
    assert "Both operands must be same dtype" in text
    assert "kern.py:7 in k: tl.store(O + r[:, None] * N + r[None, :], tl.dot(a, b))" in text
    assert "likely fix: tl.dot takes two operands of one dtype" in text
    assert triton_report(ValueError("not a kernel")) is None


def test_launched_tiles_records_the_kernels_own_tile_sizes():
    """attnlib.diagnose.launched_tiles: the BLOCK_* of each launch, agreed values only, run restored."""
    import triton
    import triton.language as tl
    from attnlib.diagnose import launched_tiles

    @triton.jit
    def copy(X, Y, N, BLOCK_N: tl.constexpr):
        r = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(Y + r, tl.load(X + r, mask=r < N), mask=r < N)

    dev = "cuda" if torch.cuda.is_available() else "cpu"     # compiled Triton takes CUDA tensors only
    x, y = torch.arange(40.0, device=dev), torch.empty(40, device=dev)
    run_before = type(copy).run
    with launched_tiles() as t:
        copy[(3,)](x, y, 40, BLOCK_N=16)
        copy[(2,)](x, y, 40, 32)                            # positional: bound by the kernel's arg names
    assert type(copy).run is run_before
    assert torch.equal(x, y)
    assert t.kernels == {"copy": {"BLOCK_N": 16}} and t.get("BLOCK_N") is None   # 16 then 32: no single tile
    with launched_tiles() as t:
        copy[(2,)](x, y, 40, BLOCK_N=32)
    assert t.get("BLOCK_N") == 32


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_diagnosis_names_the_last_key_dropped(is_causal):
    """Every row one key short of the end (step 08: a sequence's end read as cu_seqlens[b + 1] - 1), named
    for O and the LSE; with 33 keys and tiles of 32 it is also the last tile of one key, named once, as this."""
    for nq, nk in ((50, 45), (100, 33)):
        q, k, v = make_qkv(1, 2, nq, nk, 16, dtype=torch.float64)
        mask = torch.arange(nk)[None, :] < nk - 1
        mask = mask & causal_mask(nq, nk) if is_causal else mask.expand(nq, nk)
        o, lse = reference_attention(q, k, v, False, 0.25, mask=mask)
        for quantity, got, kw in (("o", o, {}), ("lse", lse, {"row_dim": -1})):
            hint = likely_bug(quantity, got, q, k, v, is_causal=is_causal, scale=0.25, tile=32, **kw)
            assert hint and hint.startswith(f"the last key (j = Nk - 1 = {nk - 1}) is never seen"), (nq, nk, hint)
