"""bench/experiments/triton_fwd_persistent.py on a CPU: the persistent forward (programs looping over query tiles,
dealt in stride or snake order) computes every tile exactly once, in Triton's interpreter, with more tiles than
programs (so the odd rounds' reversed deal runs)."""

import functools
import importlib.util
import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.step05,
              pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@functools.cache
def _experiment():
    """The experiment's module, loaded once a process (cheap: no kernel is built until a test calls one)."""
    spec = importlib.util.spec_from_file_location("triton_fwd_persistent",
                                                  ROOT / "bench" / "experiments" / "triton_fwd_persistent.py")
    mod = importlib.util.module_from_spec(spec)
    argv, sys.argv = sys.argv, ["triton_fwd_persistent.py"]
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.argv = argv
    return mod


@pytest.fixture
def pers():
    return _experiment()


@pytest.mark.parametrize("order", ["stride", "snake"])
@pytest.mark.parametrize("causal", [True, False])
def test_persistent_forward_is_right(pers, order, causal):
    from attnlib.compare import assert_close
    from attnlib.reference import reference_attention
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 3, n, 32, generator=g).to(DEVICE) for n in (77, 130, 130))
    ro, rl = reference_attention(q, k, v, causal)
    o, lse = pers.forward_persistent(q, k, v, causal, 32 ** -0.5, per_sm=1,
                                     order=getattr(pers, order.upper()))
    if DEVICE == "cpu":        # 3 query tiles x 6 heads on 4 programs: two rounds, the second dealt in reverse
        assert pers.S5.dense_fwd_config(77, 130, 32, q.dtype, causal, "cpu")["BLOCK_M"] == 32
    assert_close(o, ro, name=f"{order}: O", dtype=torch.float32)
    assert_close(lse, rl, name=f"{order}: LSE", dtype=torch.float32)
