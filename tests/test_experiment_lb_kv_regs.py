"""bench/experiments/lb_kv_regs.py on a CPU: step 06's backward rebuilt with K and V passed through a select (so that
on a GPU wgmma reads them from registers) computes exactly what step 06 computes, in Triton's interpreter."""

import functools
import importlib.util
import os
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.step06,
              pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@functools.cache
def _experiment():
    """The experiment's module, loaded once a process (cheap: no kernel is built until a test calls one)."""
    spec = importlib.util.spec_from_file_location("lb_kv_regs", ROOT / "bench" / "experiments" / "lb_kv_regs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("causal", [True, False])
def test_kv_regs_backward_is_step06_bitwise(causal):
    from attnlib.loader import load_step
    s5, s6 = load_step(5, "solutions"), load_step(6, "solutions")
    g = torch.Generator().manual_seed(7)
    # 70 keys: the last key tile is partial, where the select and the load's own mask both act
    q, k, v, do = (torch.randn(1, 2, 70, 32, generator=g).to(DEVICE) for _ in range(4))
    sc = 32 ** -0.5
    o, lse = s5.forward(q, k, v, causal, sc)
    want = s6.backward(q, k, v, o, lse, do, causal, sc, dq_mode="separate")
    got = _experiment().kv_regs_backward()(q, k, v, o, lse, do, causal, sc, dq_mode="separate")
    for name, a, b in zip(("dQ", "dK", "dV"), got, want):
        assert torch.equal(a, b), (f"{name}: the K/V-in-registers rebuild of step 06's dK/dV kernel differs from step "
                                   f"06 (max |diff| {float((a - b).abs().max()):.2e}); look at load_tile_in_registers "
                                   f"in bench/experiments/lb_kv_regs.py: it must change no value")
