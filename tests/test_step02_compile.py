"""Step 02: torch.compile of the naive attention.

Compiling costs seconds per graph on a CPU, so this file uses the quick cases.
"""

import pytest
import torch

from attnlib import make_qkv
from attnlib.cases import QUICK_CASES, device_dtype_params
from attnlib.checks import check_attention

pytestmark = [pytest.mark.step02, pytest.mark.slow]


@pytest.mark.parametrize("device,dtype", device_dtype_params(), ids=lambda x: str(x).replace("torch.", ""))
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_matches_reference(load, device, dtype, is_causal):
    step = load(2)
    for case in QUICK_CASES:
        q, k, v = make_qkv(Nq=case.nq, Nk=case.nk, D=case.d, batch_shape=case.batch,
                           dtype=dtype, device=device)
        check_attention(step.attention, q, k, v, is_causal=is_causal)


def test_is_compiled_and_dynamic(load):
    """The function really goes through torch.compile, and a new N does not recompile."""
    step = load(2)
    fn = step.compiled_naive()
    assert hasattr(fn, "_torchdynamo_orig_callable") or "Optimized" in type(fn).__name__, (
        "compiled_naive() must return the result of torch.compile(naive_attention, ...)")
    torch._dynamo.reset()              # earlier tests may have filled the recompile cache
    counters = torch._dynamo.utils.counters
    with torch.no_grad():
        q, k, v = make_qkv(1, 2, 24, 24, 16, seed=3)
        step.attention(q, k, v)              # may compile
        before = counters["stats"]["unique_graphs"]
        captured = counters["stats"]["calls_captured"]
        q, k, v = make_qkv(1, 2, 40, 40, 16, seed=4)
        step.attention(q, k, v)
    assert counters["stats"]["calls_captured"] >= captured and before > 0, (
        "no graph was captured: is torch.compile applied to naive_attention?")
    assert counters["stats"]["unique_graphs"] == before, (
        "a new sequence length recompiled the graph: compile with dynamic=True")
