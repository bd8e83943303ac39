"""Step 05's warm-ups: each piece of the forward kernel, launched alone, against plain PyTorch.

Write the helpers in this order and run this file after each (it takes a few seconds):

    pytest -m step05 tests/test_step05_warmups.py -k load_tile         # 1. load_tile
    pytest -m step05 tests/test_step05_warmups.py -k online_softmax    # 2. online_softmax_tile
    pytest -m step05 tests/test_step05_warmups.py -k key_range         # 3. key_range

Each test calls one warm-up of step05_triton_fwd.py (a tiny kernel that calls one helper) and
compares with attnlib/warmups.py, the helper's spec in float64 PyTorch; a failure says where, the
likely bug and what to fix first. Then the kernel: tests/test_step05_triton_fwd.py. fp32 and fp16
run in Triton's interpreter on a CPU; bf16 only on a GPU (the interpreter's bf16 tl.dot is wrong).
The grader's ``warmups`` group runs the same checks on the same inputs.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # conftest does the same; kept so this file runs alone

import pytest  # noqa: E402

from attnlib import warmups  # noqa: E402

pytestmark = [pytest.mark.step05,
              pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")]  # interpreter

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if GPU else [])
dt_id = lambda d: str(d).replace("torch.", "")  # noqa: E731


@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
@pytest.mark.parametrize("which", range(len(warmups.load_tile_calls(torch.float32))),
                         ids=[name.replace(" ", "-").replace(",", "") for name, _ in warmups.load_tile_calls(torch.float32)])
def test_load_tile(load, which, dtype):
    """load_tile: a tile of a strided matrix, zeros past its edges (NaN is planted there to be seen)."""
    step = load(5)
    _, args = warmups.load_tile_calls(dtype)[which]
    x, *rest = warmups.materialize(args, DEVICE)
    warmups.check_load_tile(step.warmup_load_tile(x, *rest), x.cpu(), *rest)


@pytest.mark.parametrize("dtype", DTYPES, ids=dt_id)
@pytest.mark.parametrize("which", range(len(warmups.online_softmax_calls(torch.float32))),
                         ids=[n.replace(" ", "-").replace(",", "") for n, _, _ in warmups.online_softmax_calls(torch.float32)])
def test_online_softmax_tile(load, which, dtype):
    """online_softmax_tile: (m, l, acc) after one key tile, from a fresh or a carried state, masked or not."""
    step = load(5)
    _, args, kw = warmups.online_softmax_calls(dtype)[which]
    got = step.warmup_online_softmax_tile(*warmups.materialize(args, DEVICE), **kw)
    warmups.check_online_softmax(tuple(t.cpu() for t in got), *args, **kw)


def test_online_softmax_tiles_make_attention(load):
    """Two key tiles through the warm-up, then the epilogue by hand: softmax(q k^T * scale) v."""
    step = load(5)
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(n, 16, generator=g) for n in (16, 64, 64))
    state = None
    for start_n in (0, 32):
        state = step.warmup_online_softmax_tile(*(t.to(DEVICE) for t in (q, k[start_n:start_n + 32],
                                                                       v[start_n:start_n + 32])),
                                                state, start_n=start_n, n_keys=64)
    m, l, acc = (t.cpu().double() for t in state)
    ref = torch.softmax(q.double() @ k.double().T * 16 ** -0.5, -1) @ v.double()
    err = (acc / l[:, None] - ref).abs().max().item()
    assert err < 1e-4, (f"acc / l after two key tiles is off by {err:.3g} from softmax(q k^T * scale) v. If "
                        "test_online_softmax_tile fails too, fix that first (its message names the bug); if it "
                        "passes, the state carried from the first tile is not used right (alpha = exp2(m_i - m_new) "
                        "must rescale both l_i and acc)")


@pytest.mark.parametrize("which", range(len(warmups.KEY_RANGE_CALLS)),
                         ids=[n.replace(" ", "-").replace(",", "") for n, _ in warmups.KEY_RANGE_CALLS])
def test_key_range(load, which):
    """key_range: (hi_full, hi) of every query tile, against the visibility mask."""
    step = load(5)
    _, args = warmups.KEY_RANGE_CALLS[which]
    warmups.check_key_range(step.warmup_causal_key_range(*args, device=DEVICE), *args)


def test_key_range_sweep(load):
    """Many shapes and both tile orders: N_Q < N_K, N_Q > N_K, sizes that are and are not multiples of a tile."""
    step = load(5)
    for n_q, n_k in ((1, 1), (16, 16), (17, 100), (100, 17), (64, 63), (65, 64)):
        for bm, bn in ((16, 16), (16, 32), (32, 16), (64, 16)):
            for causal in (False, True):
                warmups.check_key_range(step.warmup_causal_key_range(n_q, n_k, bm, bn, causal, device=DEVICE),
                                        n_q, n_k, bm, bn, causal)


def test_the_kernel_calls_the_warmed_up_helpers(load):
    """One source of truth: the forward kernel runs the very helpers the warm-ups test."""
    from attnlib.ops import _jit_functions
    step = load(5)
    called = {f.__name__ for f in _jit_functions(step._attn_fwd_kernel, whole_module=False)}
    missing = {"load_tile", "online_softmax_tile", "key_range"} - called
    assert not missing, (f"_attn_fwd_kernel never calls {sorted(missing)}: the warm-ups test those helpers, so "
                         "the kernel must use them rather than a copy of their code")
