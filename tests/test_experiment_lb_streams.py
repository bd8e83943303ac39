"""bench/experiments/lb_streams.py on a CPU: its copy of step 06's launch sequence (the dQ kernel meant for a
second stream) must give step 06's own gradients, bit for bit, before its GPU timing means anything."""

import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attnlib.loader import load_step  # noqa: E402
from bench.experiments.lb_streams import backward_two_streams  # noqa: E402

pytestmark = [pytest.mark.step06,
              pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("order,is_causal", [("dkdv-first", True), ("dq-first", False)])
def test_two_streams_is_step06s_backward(order, is_causal):
    s5, s6 = load_step(5, "solutions"), load_step(6, "solutions")
    g = torch.Generator().manual_seed(5)
    q, k, v, do = (torch.randn(1, 2, 70, 32, generator=g).to(DEVICE) for _ in range(4))
    o, lse = s5.forward(q, k, v, is_causal, 32 ** -0.5)
    ref = s6.backward(q, k, v, o, lse, do, is_causal, 32 ** -0.5, dq_mode="separate")
    got = backward_two_streams(q, k, v, o, lse, do, is_causal, 32 ** -0.5, order=order)
    for name, a, b in zip(("dQ", "dK", "dV"), got, ref):
        assert torch.equal(a, b), f"{name}: the experiment's launches differ from step 06's backward"
