"""Step 03: F.scaled_dot_product_attention with an explicit backend."""

import pytest
import torch

from attnlib import make_qkv
from attnlib.cases import CASES, QUICK_CASES, device_dtype_params
from attnlib.checks import check_attention

pytestmark = pytest.mark.step03

BACKENDS = ["flash", "efficient", "cudnn", "math"]
# The aten op each backend runs, to check which one really ran.
OPS = {
    "math": ("aten::_scaled_dot_product_attention_math",),
    "flash": ("aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_flash_attention_for_cpu"),
    "efficient": ("aten::_scaled_dot_product_efficient_attention",),
    "cudnn": ("aten::_scaled_dot_product_cudnn_attention",),
}


def ran_ops(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.key for e in prof.key_averages()}


@pytest.mark.parametrize("device,dtype", device_dtype_params(), ids=lambda x: str(x).replace("torch.", ""))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_default_backend_matches_reference(load, case, device, dtype, is_causal):
    step = load(3)
    q, k, v = make_qkv(Nq=case.nq, Nk=case.nk, D=case.d, batch_shape=case.batch, dtype=dtype, device=device)
    check_attention(step.attention, q, k, v, is_causal=is_causal)


@pytest.mark.parametrize("device,dtype", device_dtype_params(), ids=lambda x: str(x).replace("torch.", ""))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_each_backend(load, backend, device, dtype, is_causal):
    """A forced backend either runs, correctly and really that backend, or refuses with reasons."""
    step = load(3)
    for case in QUICK_CASES:
        q, k, v = make_qkv(Nq=case.nq, Nk=case.nk, D=case.d, batch_shape=case.batch, dtype=dtype, device=device)
        reasons = step.refusal_reasons(backend, q, k, v, is_causal=is_causal)
        if reasons:
            with pytest.raises(RuntimeError):
                step.attention(q, k, v, is_causal=is_causal, backend=backend)
            continue
        ops = ran_ops(lambda: step.attention(q, k, v, is_causal=is_causal, backend=backend))
        assert ops & set(OPS[backend]), (
            f"backend={backend!r} was asked for but {sorted(o for o in ops if 'scaled_dot' in o)} ran: "
            "wrap the call in `with sdpa_kernel([BACKENDS[backend]])`")

        def attn(q, k, v, is_causal, scale):
            return step.attention(q, k, v, is_causal=is_causal, scale=scale, backend=backend)
        check_attention(attn, q, k, v, is_causal=is_causal)


def test_cpu_refusals_explained(load):
    step = load(3)
    q, k, v = make_qkv(1, 2, 17, 17, 32)
    for backend in ("efficient", "cudnn"):
        reasons = step.refusal_reasons(backend, q, k, v)
        assert reasons and all(isinstance(r, str) and r for r in reasons)
        with pytest.raises(RuntimeError):
            step.attention(q, k, v, backend=backend)
    assert step.refusal_reasons("math", q, k, v) == []


@pytest.mark.parametrize("device,dtype", device_dtype_params(), ids=lambda x: str(x).replace("torch.", ""))
def test_chosen_backend_is_the_one_that_runs(load, device, dtype):
    step = load(3)
    q, k, v = make_qkv(2, 2, 64, 64, 64, dtype=dtype, device=device)
    name = step.chosen_backend(q, k, v, is_causal=True)
    assert name in BACKENDS, f"chosen_backend returned {name!r}; expected one of {BACKENDS}"
    ops = ran_ops(lambda: step.attention(q, k, v, is_causal=True))
    assert ops & set(OPS[name]), f"chosen_backend says {name!r} but {sorted(o for o in ops if 'scaled_dot' in o)} ran"


def test_unknown_backend(load):
    step = load(3)
    q, k, v = make_qkv(1, 1, 8, 8, 16)
    with pytest.raises(ValueError, match="unknown SDPA backend"):
        step.attention(q, k, v, backend="fastest")
