"""bench/experiments/lb_power.py's round 2 on a CPU: every dK/dV register-cap variant it will time in CS336's
harness must give right gradients through step 06's own backward first (the GPU run checks them again at
bf16 before timing; here Triton's interpreter, float32, runs the same tiles)."""

import importlib.util
import os
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from attnlib.compare import assert_close  # noqa: E402
from attnlib.loader import load_step  # noqa: E402
from attnlib.reference import reference_backward  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.step06,
              pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _lb_power():
    spec = importlib.util.spec_from_file_location("lb_power", ROOT / "bench" / "experiments" / "lb_power.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _round2():
    s6 = load_step(6, "solutions")
    table = s6.bwd_config(16384, 16384, 64, torch.bfloat16, True, "cuda", 16)    # the leaderboard's table
    return s6, _lb_power().variants({}, table, 2)


def test_round_2_is_the_register_caps_of_its_header():
    _, v = _round2()
    assert set(v) == {"dkdv 64x64 w4 s3 r168", "dkdv 64x64 w4 s2 r168", "dkdv 64x64 w4 s3 uncapped",
                      "dkdv 32x64 w4 s4 r168"}
    assert "maxnreg" not in v["dkdv 64x64 w4 s3 uncapped"][1]["dkdv"], "uncapped must drop the table's cap"
    assert all(b["dkdv"]["BLOCK_M"] == int(n.split()[1].split("x")[0]) for n, (_, b) in v.items())


@pytest.mark.parametrize("name", ["dkdv 64x64 w4 s3 r168", "dkdv 64x64 w4 s3 uncapped"])
def test_round_2_variant_gives_right_gradients(name):
    s6, v = _round2()
    s5 = load_step(5, "solutions")
    cfg = v[name][1]
    g = torch.Generator().manual_seed(3)
    q, k, v_, do = (torch.randn(1, 2, 150, 64, generator=g).to(DEVICE) for _ in range(4))
    o, lse = s5.forward(q, k, v_, True, 64 ** -0.5)
    got = s6.backward(q, k, v_, o, lse, do, True, 64 ** -0.5, config=cfg, dq_mode="separate")
    ref = reference_backward(q, k, v_, do, True)
    for nm, a, b in zip(("dQ", "dK", "dV"), got, ref):
        assert_close(a, b, name=f"{name}: {nm}", dtype=torch.float32)
