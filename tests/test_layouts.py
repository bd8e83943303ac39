"""Inputs the shape-only tests never make, for the flash steps (04-07): K and V with different
strides, and fp16 O and dO so large that D = rowsum(dO * O) overflows fp16.

Each test here was written against a planted bug that the rest of the suite let through:
  * V addressed with K's strides (step 05's forward, step 06's dQ kernel): harmless while K and V
    share one layout, as every other test's inputs do;
  * D = rowsum(dO * O) summed in fp16: fine for N(0, 1) data, inf (then NaN in dQ and dK) once
    |dO . O| passes 65504. Accumulate D in fp32.
"""

import pytest
import torch

from attnlib import make_dout, reference_attention, reference_backward
from attnlib.compare import assert_close

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
B, H, NQ, NK, D = 1, 2, 40, 33, 64


def _steps():
    for n in (4, 5, 6, 7):
        marks = [getattr(pytest.mark, f"step{n:02d}")]
        if n == 7:
            marks.append(pytest.mark.skipif(not GPU, reason="step 07 runs CUDA kernels: it needs a GPU"))
        yield pytest.param(n, marks=marks, id=f"step{n:02d}")


DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if GPU else [])


def _leaf(t, dtype):
    return t.to(device=DEVICE, dtype=dtype).detach().requires_grad_()


def _check(m, q, k, v, do, is_causal, what):
    ctx = f"{what}; q strides {q.stride()}, k {k.stride()}, v {v.stride()}, {q.dtype}, " \
          f"{'causal' if is_causal else 'not causal'}"
    out = m.attention(q, k, v, is_causal=is_causal)
    assert out.dtype == q.dtype, f"O is {out.dtype} for {q.dtype} inputs ({ctx})"
    ref_o, _ = reference_attention(q, k, v, is_causal)
    assert_close(out, ref_o, name="O", context=ctx)
    out.backward(do)
    refs = reference_backward(q, k, v, do, is_causal)
    for name, t, ref, rows in (("dQ", q, refs[0], "query rows"), ("dK", k, refs[1], "key rows"),
                               ("dV", v, refs[2], "key rows")):
        assert t.grad is not None, f"{name} is None ({ctx})"
        assert_close(t.grad, ref, name=name, row_label=rows, context=ctx)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d)[6:])
@pytest.mark.parametrize("step", list(_steps()))
def test_k_and_v_with_different_strides(load, step, dtype, is_causal):
    """K is (B, H, N, D) contiguous; V is a (B, N, H, 2D) buffer seen through a transpose and a
    step of 2 along D; Q is (B, N, H, D) transposed. No two share a stride."""
    m = load(step)
    if step == 7 and dtype == torch.float32:
        pytest.skip("step 07 takes fp16 and bf16 only")
    g = torch.Generator().manual_seed(5)
    q = torch.randn(B, NQ, H, D, generator=g).to(DEVICE, dtype).transpose(1, 2)
    k = torch.randn(B, H, NK, D, generator=g).to(DEVICE, dtype)
    v = torch.randn(B, NK, H, 2 * D, generator=g).to(DEVICE, dtype)[..., ::2].transpose(1, 2)
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    assert len({q.stride(), k.stride(), v.stride()}) == 3
    _check(m, q, k, v, make_dout(q), is_causal, "K and V with different strides")


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("step", list(_steps()))
def test_delta_does_not_overflow_fp16(load, step, is_causal):
    """V and dO around 40 (+-16) in fp16: |dO . O| reaches 1.2e5 > 65504, the largest fp16.

    The gradients themselves stay in range (|dQ| < 1e3), and a D accumulated in fp32 gets them
    right; PyTorch's own naive fp16 attention gets NaN in dQ and dK here.
    """
    m = load(step)
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(B, H, NQ, D, generator=g), torch.randn(B, H, NK, D, generator=g)
    v = 40 + 16 * torch.randn(B, H, NK, D, generator=g)
    do = 40 + 16 * torch.randn(B, H, NQ, D, generator=g)
    q, k, v = (_leaf(t, torch.float16) for t in (q, k, v))
    do = do.to(DEVICE, torch.float16)
    ref_o, _ = reference_attention(q, k, v, is_causal)
    assert (ref_o * do.double()).sum(-1).abs().max() > 65504          # the data does what it says
    _check(m, q, k, v, do, is_causal, "large |O| and |dO|: D = rowsum(dO * O) exceeds fp16's 65504")


@pytest.mark.parametrize("step", [pytest.param(6, marks=pytest.mark.step06, id="step06"),
                                  pytest.param(9, marks=pytest.mark.step09, id="step09")])
def test_backward_of_row_slices(load, step):
    """The ring (step 10) calls step 06's ``backward`` on half a shard's rows: q, O, dO and the LSE are
    row slices of longer tensors, views whose head stride is not rows x D (nor rows, for the LSE).

    Planted and caught on two H200s (2026-11-30): the LSE flattened with ``reshape`` (a view here)
    and read as if its row stride were Nq, so every head but the first took another row's LSE
    (dQ off by 100x on head 1 only, while a one-head test passed).
    """
    m, fwd = load(step), (load(5).forward if step == 6 else None)
    g = torch.Generator().manual_seed(11)
    q_all, do_all = (torch.randn(B, H, 2 * NQ, D, generator=g).to(DEVICE) for _ in range(2))
    k, v = (torch.randn(B, H, NK, D, generator=g).to(DEVICE) for _ in range(2))
    rows, scale = slice(NQ, 2 * NQ), D ** -0.5
    q, do = q_all[..., rows, :], do_all[..., rows, :]
    extra = () if step == 6 else (NQ + NK, 0)                 # step 09: a window that sees every key
    o, lse = fwd(q.contiguous(), k, v, False, scale) if step == 6 else \
        m.forward(q.contiguous(), k, v, *extra, False, scale)
    o_all, lse_all = torch.zeros_like(q_all), torch.zeros(B, H, 2 * NQ, device=DEVICE)
    o_all[..., rows, :], lse_all[..., rows] = o, lse
    o, lse = o_all[..., rows, :], lse_all[..., rows]
    assert not (q.is_contiguous() or o.is_contiguous() or lse.is_contiguous())
    grads = m.backward(q, k, v, o, lse, do, *extra, False, scale)
    ctx = f"step {step:02d} backward on rows {NQ}-{2 * NQ - 1} of a {2 * NQ}-row q, O, dO and LSE (views), H={H}"
    for name, got, ref, label in zip(("dQ", "dK", "dV"), grads, reference_backward(q, k, v, do, False),
                                     ("query rows", "key rows", "key rows")):
        assert_close(got, ref, name=name, row_label=label, context=ctx)
