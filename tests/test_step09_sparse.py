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
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

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


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_window_past_int32_is_the_dense_pattern(load, is_causal):
    """A window of 2**31 - 1 or more sees every key: the kernels add the window to a query index in int32,
    so it must reach them as no wider than the sequence (the same pattern)."""
    step = load(9)
    N = 70
    q, k, v = make_qkv(1, 1, N, N, 16, device=DEVICE, requires_grad=True)
    ref, _ = reference_attention(q, k, v, is_causal=is_causal)
    for w in (2 ** 31 - 1, 2 ** 40):
        o = step.attention_sparse(q, k, v, w, 3, is_causal=is_causal)
        assert_close(o, ref, name="O", context=f"window={w}, n_global=3 on N={N}: every pair is visible")


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


# --- The tile schedule: which tiles run unmasked -----------------------------------------------------------

S9 = None        # the step under test, for the probe kernel below (set before each launch)


@triton.jit
def _schedule_probe(OUT, ROWS, NQ, NK, WIN, GLOB, TILE,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, R: tl.constexpr):
    """For each of ROWS rows (a shape, window, n_global and tile index t; the helpers are elementwise, so
    all at once): what the kernels compute for query tile t (forward, dQ) and key tile t (dK/dV), the two
    ranges, then the unmasked stage of each. OUT is (16, R) int32."""
    r = tl.arange(0, R)
    ok = r < ROWS
    N_Q = tl.load(NQ + r, mask=ok, other=1)
    N_K = tl.load(NK + r, mask=ok, other=1)
    WINDOW = tl.load(WIN + r, mask=ok, other=1)
    N_GLOBAL = tl.load(GLOB + r, mask=ok, other=0)
    t = tl.load(TILE + r, mask=ok, other=0)
    zero = t * 0                                          # a constant 0 as a tensor of R
    m0 = t * BLOCK_M
    lo_a, hi_a, lo_b, hi_b = S9._key_ranges(m0, N_K, WINDOW, N_GLOBAL, BLOCK_M, BLOCK_N, IS_CAUSAL)
    a_hi, b_lo, b_hi = S9._full_keys(m0, N_Q, N_K, WINDOW, N_GLOBAL, BLOCK_M, BLOCK_N, IS_CAUSAL)
    ua_lo, ua_hi = S9._unmasked_part(lo_a + zero, hi_a, zero, a_hi, BLOCK_N)
    ub_lo, ub_hi = S9._unmasked_part(lo_b, hi_b, b_lo, b_hi, BLOCK_N)
    tl.store(OUT + 0 * R + r, lo_a + zero)
    tl.store(OUT + 1 * R + r, hi_a + zero)
    tl.store(OUT + 2 * R + r, lo_b + zero)
    tl.store(OUT + 3 * R + r, hi_b + zero)
    tl.store(OUT + 4 * R + r, ua_lo)
    tl.store(OUT + 5 * R + r, ua_hi)
    tl.store(OUT + 6 * R + r, ub_lo)
    tl.store(OUT + 7 * R + r, ub_hi)
    n0 = t * BLOCK_N
    lo_a, hi_a, lo_b, hi_b = S9._query_ranges(n0, N_Q, WINDOW, N_GLOBAL, BLOCK_M, BLOCK_N, IS_CAUSAL)
    a_lo, a_hi, b_lo, b_hi = S9._full_queries(n0, N_Q, N_K, WINDOW, N_GLOBAL, BLOCK_M, BLOCK_N, IS_CAUSAL)
    ua_lo, ua_hi = S9._unmasked_part(lo_a + zero, hi_a + zero, a_lo + zero, a_hi, BLOCK_M)
    ub_lo, ub_hi = S9._unmasked_part(lo_b, hi_b, b_lo, b_hi, BLOCK_M)
    tl.store(OUT + 8 * R + r, lo_a + zero)
    tl.store(OUT + 9 * R + r, hi_a + zero)
    tl.store(OUT + 10 * R + r, lo_b + zero)
    tl.store(OUT + 11 * R + r, hi_b + zero)
    tl.store(OUT + 12 * R + r, ua_lo)
    tl.store(OUT + 13 * R + r, ua_hi)
    tl.store(OUT + 14 * R + r, ub_lo)
    tl.store(OUT + 15 * R + r, ub_hi)


# Lengths, windows and global counts on and next to multiples of the tiles (16, 32): a bound off by one
# changes which tiles run unmasked only where it meets a tile's edge.
SHAPES = ((127, 127), (131, 131), (100, 64), (64, 100))
WINDOWS = (1, 5, 15, 16, 17, 31, 32, 33, 70)
GLOBALS = (0, 3, 15, 16, 17, 33)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("bm, bn", [(32, 16), (16, 32)], ids=["32x16", "16x32"])
def test_tiles_run_unmasked_are_full_and_every_full_window_tile_is(load, bm, bn, is_causal):
    """The kernels walk each range of tiles masked / unmasked / masked (``_full_keys``, ``_full_queries``,
    ``_unmasked_part``). A tile run unmasked must be inside both lengths and visible in every pair, or
    the output takes in keys it must not see; and among the window's tiles (range b) every full tile is
    run unmasked, or the interior pays for the mask. Checked against the explicit mask, tile by tile, over
    windows narrower and wider than the tiles, global tokens inside one tile and across several, Nq != Nk."""
    global S9
    S9 = load(9)
    cases = [(nq, nk, w, g) for nq, nk in SHAPES for w in WINDOWS for g in GLOBALS if g <= nk]
    rows = [(c, t) for c in cases for t in range(max(triton.cdiv(c[0], bm), triton.cdiv(c[1], bn)))]
    R = triton.next_power_of_2(len(rows))
    cols = [torch.tensor([c[i] for c, _ in rows] if i < 4 else [t for _, t in rows], dtype=torch.int32,
                         device=DEVICE) for i in range(5)]
    out = torch.zeros(16, R, dtype=torch.int32, device=DEVICE)
    _schedule_probe[(1,)](out, len(rows), *cols, BLOCK_M=bm, BLOCK_N=bn, IS_CAUSAL=is_causal, R=R)
    out = out.T.cpu().tolist()
    masks = {c: S9.mask(c[0], c[1], c[2], c[3], is_causal) for c in cases}
    for row, ((nq, nk, w, g), t) in enumerate(rows):
        m = masks[(nq, nk, w, g)]
        where = f"Nq={nq} Nk={nk} window={w} n_global={g} tiles {bm}x{bn} {'causal' if is_causal else 'full'}"

        def full(m0, n0):
            return m0 + bm <= nq and n0 + bn <= nk and bool(m[m0:m0 + bm, n0:n0 + bn].all())

        for kind, tile0, step, first, is_fwd in (("query", t * bm, bn, 0, True), ("key", t * bn, bm, 8, False)):
            if tile0 >= (nq if is_fwd else nk):
                continue
            lo_a, hi_a, lo_b, hi_b, ua_lo, ua_hi, ub_lo, ub_hi = out[row][first:first + 8]
            for lo, hi, u_lo, u_hi, rng in ((lo_a, hi_a, ua_lo, ua_hi, "a"), (lo_b, hi_b, ub_lo, ub_hi, "b")):
                assert lo <= u_lo <= u_hi <= max(hi, lo), (f"{where}, {kind} tile {tile0}, range {rng}: stages "
                                                           f"[{lo}, {u_lo}) [{u_lo}, {u_hi}) [{u_hi}, {hi}) out of order")
                for s0 in range(lo, hi, step):
                    pair = (tile0, s0) if is_fwd else (s0, tile0)
                    if u_lo <= s0 < u_hi:
                        assert full(*pair), (f"{where}: {kind} tile {tile0} runs tile {s0} of range {rng} "
                                             f"unmasked, but not every pair there is visible and in range")
                    elif rng == "b":
                        assert not full(*pair), (f"{where}: {kind} tile {tile0} runs tile {s0} of range b "
                                                 "masked, though every pair there is visible: a bound of "
                                                 "_full_keys / _full_queries is too tight")
