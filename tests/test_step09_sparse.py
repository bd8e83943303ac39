"""Step 09: sliding-window + global-token attention, against the float64 reference with the explicit mask.

The mask comes from the step's own ``visible`` (its plain-Python ``.fn`` on index tensors), so the
pattern is stated once; a second test checks that statement against the definition written out
here. Shapes are awkward (N not a multiple of any tile), windows cross tiles, global tokens cross a
tile boundary, and one window is wider than the sequence. Without a GPU the kernels run in Triton's
interpreter (fp32, fp16); bf16 on a GPU. A cross-check against FlexAttention with the same mask
failed inside PyTorch on the H200 (torch 2.11: "all unwrapped values must be FakeTensor, int, or
SymInt" from flex_attention's autograd path), so it lives in bench/sparse_gpu.py, which records it.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported; conftest does the same

import pytest  # noqa: E402

from attnlib import make_dout, make_qkv  # noqa: E402
from attnlib.checks import check_attention  # noqa: E402
from attnlib.compare import assert_close  # noqa: E402
from attnlib.reference import reference_attention, reference_backward  # noqa: E402

pytestmark = [pytest.mark.step09,
              pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")]  # interpreter

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if GPU else [])
dt = lambda d: str(d).replace("torch.", "")  # noqa: E731

# (B, H, N, D, window, n_global)
PATTERNS = {
    "window-only": (1, 2, 150, 32, 20, 0),
    "window+global": (2, 1, 131, 16, 9, 5),
    "global-crosses-tile": (1, 1, 100, 32, 3, 40),
    "window-wider-than-n": (1, 2, 45, 16, 64, 0),
}


def test_visible_is_the_stated_pattern(load):
    step = load(9)
    n, w, g = 70, 7, 3
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    for causal in (False, True):
        want = ((i - j).abs() < w) | (j < g) | (i < g)
        if causal:
            want = want & (j <= i)
        got = step.mask(n, n, w, g, causal)
        assert torch.equal(got, want), (f"visible() disagrees with |i - j| < window or j < n_global or i < n_global"
                                        f"{' (and j <= i)' if causal else ''} at {(got != want).nonzero()[:4].tolist()}")


# On a CPU (the interpreter, ~2 s a run) fp16 runs on one pattern; on a GPU every dtype on every pattern.
RUNS = [(name, dtype) for name in sorted(PATTERNS) for dtype in DTYPES
        if GPU or dtype == torch.float32 or name == "window+global"]


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name, dtype", RUNS, ids=[f"{n}-{dt(d)}" for n, d in RUNS])
def test_forward_and_backward(load, name, dtype, is_causal):
    step = load(9)
    B, H, N, D, w, g = PATTERNS[name]
    q, k, v = make_qkv(B, H, N, N, D, dtype=dtype, device=DEVICE, requires_grad=True)
    o = step.attention_sparse(q, k, v, w, g, is_causal=is_causal)
    do = make_dout(o)
    o.backward(do)
    m = step.mask(N, N, w, g, is_causal, device=DEVICE)
    ref_o, _ = reference_attention(q, k, v, mask=m)
    refs = reference_backward(q, k, v, do, mask=m)
    ctx = f"{name}: N={N}, window={w}, n_global={g}, {dt(dtype)}, {'causal' if is_causal else 'full'}"
    assert_close(o, ref_o, name="O", context=ctx)
    for gname, t, ref, rows in (("dQ", q, refs[0], "query rows"), ("dK", k, refs[1], "key rows"),
                                ("dV", v, refs[2], "key rows")):
        assert_close(t.grad, ref, name=gname, row_label=rows, context=ctx)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_lse(load, is_causal):
    step = load(9)
    q, k, v = make_qkv(1, 2, 131, 131, 16, device=DEVICE)
    _, lse = step.forward(q, k, v, 9, 5, is_causal, 16 ** -0.5)
    _, ref = reference_attention(q, k, v, mask=step.mask(131, 131, 9, 5, is_causal, device=DEVICE))
    assert_close(lse, ref, name="LSE", dtype=torch.float32, row_dim=-1)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_dense_contract(load, is_causal):
    """attention(q, k, v): a window wider than the sequences, no global token: dense attention, Nq != Nk too."""
    step = load(9)
    q, k, v = make_qkv(2, 1, 40, 33, 32, device=DEVICE)
    check_attention(step.attention, q, k, v, is_causal=is_causal)


def test_far_keys_are_never_read(load):
    """Key tiles no query of a tile sees are skipped: keys 256 and on poisoned with NaN, the rows 0-127 (whose
    windows end by key 137, so no tile of up to 128 keys they visit reaches 256) stay finite and right."""
    step = load(9)
    N, w = 512, 10
    q, k, v = make_qkv(1, 1, N, N, 16, device=DEVICE)
    kp, vp = k.clone(), v.clone()
    kp[..., 256:, :], vp[..., 256:, :] = float("nan"), float("nan")
    o = step.attention_sparse(q, kp, vp, w, 0, is_causal=False)
    ref, _ = reference_attention(q, k, v, mask=step.mask(N, N, w, 0, False, device=DEVICE))
    assert_close(o[..., :128, :], ref[..., :128, :], name="O of the rows whose windows end long before the NaN keys")


@pytest.mark.parametrize("kwargs, match", [
    (dict(window=0), "window must be at least 1"),
    (dict(n_global=-1), "n_global must be in"),
    (dict(window=2.5), "window must be an int"),
])
def test_bad_input_raises(load, kwargs, match):
    step = load(9)
    q, k, v = make_qkv(1, 1, 20, 20, 16, device=DEVICE)
    args = dict(window=4, n_global=0) | kwargs
    with pytest.raises(ValueError, match=match):
        step.attention_sparse(q, k, v, **args)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_tiles_that_see_everything_split_or_not(load, is_causal):
    """The tiles holding a global token run split over chunks (partial sums added up) or whole: both right.

    A chunk of 32 rows splits the global key tiles' dK/dV over 6 programs and, not causal, the global
    query tiles' dQ; split=0 runs every tile as one program. Fails if a chunk is lost or counted twice.
    """
    step = load(9)
    N, D, w, g = 190, 16, 7, 37
    q, k, v = make_qkv(1, 2, N, N, D, device=DEVICE)
    scale = D ** -0.5
    o, lse = step.forward(q, k, v, w, g, is_causal, scale)
    do = make_dout(o)
    m = step.mask(N, N, w, g, is_causal, device=DEVICE)
    refs = reference_backward(q, k, v, do, mask=m)
    for split in (32, 0):
        got = step.backward(q, k, v, o, lse, do, w, g, is_causal, scale, split=split)
        for gname, t, ref, rows in zip(("dQ", "dK", "dV"), got, refs, ("query rows", "key rows", "key rows")):
            assert_close(t, ref, name=gname, row_label=rows, context=f"split={split}, n_global={g}, "
                         f"{'causal' if is_causal else 'full'}")
