"""bench/experiments/triton_fwd_lazy_rescale.py on a CPU: the variant (step 05 with the accumulator rescaled only when
a row's max grew by more than TAU) is step 05's own kernel around another helper, and it is right, in Triton's
interpreter, where rows' maxima keep growing after the first tile (the rescales the skip must not miss)."""

import functools
import importlib.util
import os
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
    spec = importlib.util.spec_from_file_location("triton_fwd_lazy_rescale",
                                                  ROOT / "bench" / "experiments" / "triton_fwd_lazy_rescale.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def lazy():
    return _experiment()


def test_the_variant_is_step05_with_one_helper_replaced(lazy):
    ns = lazy.lazy_step05(8)
    g = ns.globals
    assert g["online_softmax_tile"] is lazy.lazy_tile_tau8
    for name in ("_fwd_inner", "_fwd_inner_tma", "_attn_fwd_kernel", "_attn_fwd_tma_kernel"):
        mine, theirs = g[name].fn, getattr(ns.step05, name).fn
        assert mine.__code__ is theirs.__code__, f"{name}: not step 05's own code"
        assert mine.__globals__ is g, f"{name}: still resolves step 05's helpers"
        assert mine.__annotations__ == theirs.__annotations__, f"{name}: lost its tl.constexpr annotations"
    assert lazy.lazy_step05(0).globals["online_softmax_tile"] is lazy.lazy_tile_tau0


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_lazy_rescale_is_right_when_maxima_keep_growing(lazy, causal, dtype):
    from attnlib.compare import assert_close
    from attnlib.reference import reference_attention
    q, k, v = lazy.inputs(2, 1, 77, 130, 32, dtype, True, DEVICE, seed=1)
    ref_o, ref_lse = reference_attention(q, k, v, causal)
    for tau in (8, 0):
        o, lse = lazy.lazy_step05(tau).forward(q, k, v, causal, 32 ** -0.5)
        assert_close(o, ref_o, name=f"tau {tau}: O", dtype=dtype)
        assert_close(lse, ref_lse, name=f"tau {tau}: LSE", dtype=torch.float32)
