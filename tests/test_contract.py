"""The contract every step shares (attnlib/contract.py), checked for each step present.

Each test first runs the step on a valid input, so a stub fails here as
"not implemented" rather than passing on input checks alone.
"""

import math

import pytest
import torch

from attnlib import make_qkv
from attnlib.contract import STEPS
from attnlib.loader import impl_root
from attnlib.reference import reference_attention


def present_steps():
    try:
        root = impl_root()
    except FileNotFoundError:
        return []
    return [n for n, (mod, _) in STEPS.items() if (root / f"{mod}.py").exists()]


def _cpu_ok(n):
    """Steps 05-07 run on a CPU only through the Triton interpreter, or not at all (CUDA)."""
    return n <= 6 or torch.cuda.is_available()


def _device_dtype(n):
    if torch.cuda.is_available() and n >= 5:
        return "cuda", torch.float16
    return "cpu", torch.float32


STEP_PARAMS = [pytest.param(n, id=f"step{n:02d}", marks=getattr(pytest.mark, f"step{n:02d}"))
               for n in present_steps()]


@pytest.fixture
def working(load, request):
    n = request.param
    if not _cpu_ok(n):
        pytest.skip(f"step {n:02d} needs a CUDA GPU")
    step = load(n)
    device, dtype = _device_dtype(n)
    q, k, v = make_qkv(1, 2, 16, 16, 64, dtype=dtype, device=device)
    out = step.attention(q, k, v)             # a stub fails here: "not implemented"
    assert out.shape == q.shape
    return step, q, k, v


@pytest.mark.parametrize("working", STEP_PARAMS, indirect=True)
def test_output_contract(working):
    step, q, k, v = working
    out = step.attention(q, k, v)
    assert out.dtype == q.dtype and out.device == q.device and out.shape == q.shape
    # Default scale is 1/sqrt(D): the same as passing it explicitly.
    explicit = step.attention(q, k, v, scale=1 / math.sqrt(q.shape[-1]))
    torch.testing.assert_close(out, explicit, rtol=0, atol=0)
    # Causal is top-left aligned: with Nq < Nk, row 0 sees key 0 only, so it equals v[..., 0, :].
    qs, ks, vs = q[..., :4, :], k, v
    out_c = step.attention(qs.contiguous(), ks, vs, is_causal=True)
    ref_c, _ = reference_attention(qs, ks, vs, True)
    assert torch.allclose(out_c[..., 0, :].double(), vs[..., 0, :].double(), atol=2e-3), (
        "causal row 0 must attend to key 0 only (top-left alignment, as SDPA)")
    assert torch.allclose(out_c.double(), ref_c, atol=5e-3, rtol=5e-3)


BAD_INPUTS = {
    "rank 1": lambda q, k, v: (q[0, 0, 0], k, v),
    "rank mismatch": lambda q, k, v: (q[0], k, v),
    "batch mismatch": lambda q, k, v: (q, k[:, :1], v[:, :1]),
    "k/v length mismatch": lambda q, k, v: (q, k, v[..., :-1, :]),
    "head dim mismatch": lambda q, k, v: (q, k[..., :32], v[..., :32]),
    "dtype mismatch": lambda q, k, v: (q, k.to(torch.float64), v),
    "integer dtype": lambda q, k, v: (q.long(), k.long(), v.long()),
    "head dim too large": lambda q, k, v: (q.new_zeros(1, 2, 4, 512).normal_(), k.new_zeros(1, 2, 4, 512).normal_(),
                                           v.new_zeros(1, 2, 4, 512).normal_()),
    "empty sequence": lambda q, k, v: (q[..., :0, :], k, v),
    "not a tensor": lambda q, k, v: (q.tolist(), k, v),
}


@pytest.mark.parametrize("working", STEP_PARAMS, indirect=True)
@pytest.mark.parametrize("bad", list(BAD_INPUTS))
def test_bad_input_is_a_clear_valueerror(working, bad):
    step, q, k, v = working
    args = BAD_INPUTS[bad](q, k, v)
    with pytest.raises(ValueError) as info:
        step.attention(*args)
    assert len(str(info.value)) > 20, "the message must say what is wrong"


@pytest.mark.parametrize("working", STEP_PARAMS, indirect=True)
@pytest.mark.parametrize("kw", [{"scale": -1.0}, {"scale": float("nan")}, {"is_causal": 1}])
def test_bad_arguments(working, kw):
    step, q, k, v = working
    with pytest.raises(ValueError):
        step.attention(q, k, v, **kw)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU to mix devices")
@pytest.mark.parametrize("working", STEP_PARAMS, indirect=True)
def test_device_mismatch(working):
    step, q, k, v = working
    other = "cpu" if q.device.type == "cuda" else "cuda"
    with pytest.raises(ValueError, match="one device"):
        step.attention(q, k.to(other), v)
