"""bench/experiments/lb_groups.py on a CPU: step 05's and step 06's heads-first kernels rebuilt to launch the heads in
groups of G (their ``tl.program_id`` remapped) still cover every (head, tile) exactly once, in Triton's interpreter:
output and gradients as the tables' kernels give them."""

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
    spec = importlib.util.spec_from_file_location("lb_groups", ROOT / "bench" / "experiments" / "lb_groups.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def lbg():
    return _experiment()


def test_grouped_launch_order_is_a_permutation_with_groups_outermost():
    """The mapping itself, in plain Python: (group, tile, head in group) from the launch order."""
    n_bh, n_t, G = 8, 5, 4
    seen = []
    for lin in range(n_bh * n_t):
        grp, rem = divmod(lin, G * n_t)
        seen.append((grp * G + rem % G, rem // G))
    assert sorted(seen) == [(b, t) for b in range(n_bh) for t in range(n_t)]
    assert {b for b, _ in seen[:G * n_t]} == set(range(G))         # the first group's heads only, all tiles


@pytest.mark.parametrize("G", [1, 2, 4])
def test_grouped_kernels_match_the_tables(lbg, G):
    from attnlib.compare import assert_close
    from attnlib.loader import load_step
    s5, s6 = load_step(5, "solutions"), load_step(6, "solutions")
    g = torch.Generator().manual_seed(4)
    q, k, v, do = (torch.randn(1, 4, 70, 32, generator=g).to(DEVICE) for _ in range(4))
    cfg5, cfg6 = lbg.heads_first(s5.dense_fwd_config(70, 70, 32, q.dtype, True, DEVICE, 4),
                                 s6.bwd_config(70, 70, 32, q.dtype, True, DEVICE, 4))
    o, lse = s5.forward(q, k, v, True, 32 ** -0.5, config=cfg5, tma=False)
    want = s6.backward(q, k, v, o, lse, do, True, 32 ** -0.5, config=cfg6, dq_mode="separate")
    fwd, bwd = lbg.grouped(G)
    o2, lse2 = fwd(q, k, v, True, 32 ** -0.5, config=cfg5, tma=False)
    got = bwd(q, k, v, o, lse, do, True, 32 ** -0.5, config=cfg6, dq_mode="separate")
    assert_close(o2, o, name=f"G={G}: O", dtype=torch.float32)
    assert_close(lse2, lse, name=f"G={G}: LSE", dtype=torch.float32)
    for name, a, b in zip(("dQ", "dK", "dV"), got, want):
        assert_close(a, b, name=f"G={G}: {name}", dtype=torch.float32)
