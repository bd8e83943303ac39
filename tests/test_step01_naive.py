"""Step 01: naive attention against the float64 reference, forward and backward."""

import pytest

from attnlib import make_qkv
from attnlib.cases import CASES, device_dtype_params
from attnlib.checks import check_attention

pytestmark = pytest.mark.step01


@pytest.mark.parametrize("device,dtype", device_dtype_params(), ids=lambda x: str(x).replace("torch.", ""))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_matches_reference(load, case, device, dtype, is_causal):
    step = load(1)
    q, k, v = make_qkv(Nq=case.nq, Nk=case.nk, D=case.d, batch_shape=case.batch, dtype=dtype, device=device)
    check_attention(step.attention, q, k, v, is_causal=is_causal)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_explicit_scale(load, is_causal):
    step = load(1)
    q, k, v = make_qkv(1, 2, 33, 20, 32, seed=5)
    check_attention(step.attention, q, k, v, is_causal=is_causal, scale=0.3)
