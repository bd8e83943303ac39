"""Step 05's warm-ups in plain PyTorch: what each piece of the kernel must compute, and checks that teach.

Each piece of step 05's forward kernel is a ``@triton.jit`` helper that a warm-up launches alone
(``steps/step05_triton_fwd.py``), so it can be written and tested before the kernel exists, the way
Triton-Puzzles puts a PyTorch *spec* beside each puzzle:

    helper               its warm-up                   spec here             check here
    load_tile            warmup_load_tile              spec_load_tile        check_load_tile
    online_softmax_tile  warmup_online_softmax_tile    spec_online_softmax   check_online_softmax
    key_range            warmup_causal_key_range       spec_key_range        check_key_range

The specs compute in float64 from first principles (the key range from the visibility mask, not
from the kernel's formula). A check raises ``WarmupError``: where the result is wrong, the likely
bug, what to fix first. tests/test_step05_warmups.py and the grader's ``warmup`` group use the same
checks, the grader on the inputs of ``grader_calls``.
"""

from __future__ import annotations

import math

import torch

from .compare import CompareError, assert_close, measure, tolerance_for

LOG2E = 1 / math.log(2)


class WarmupError(AssertionError):
    """A warm-up's result is wrong; ``str(err)`` says where, the likely bug and what to fix first."""


def _ranges(idx) -> str:
    from .compare import format_ranges
    return format_ranges(list(idx))


# ---------------------------------------------------------------------------
# load_tile
# ---------------------------------------------------------------------------

def spec_load_tile(x, row0, col0, block_rows, block_cols):
    """The tile of ``x`` at ``[row0:row0 + block_rows, col0:col0 + block_cols]``, 0 past x's edges."""
    out = torch.zeros(block_rows, block_cols, dtype=x.dtype)
    r = min(x.shape[0], row0 + block_rows) - row0
    c = min(x.shape[1], col0 + block_cols) - col0
    if r > 0 and c > 0:
        out[:r, :c] = x[row0:row0 + r, col0:col0 + c].cpu()
    return out


def _load_with_strides(x, row0, col0, block_rows, block_cols, stride_row, stride_col):
    """What a load with these strides reads inside x's edges (NaN where it leaves x's storage)."""
    n = x.untyped_storage().nbytes() // x.element_size()
    flat = x.detach().cpu().as_strided((n,), (1,), 0).double()
    i = torch.arange(block_rows)[:, None] + row0
    j = torch.arange(block_cols)[None, :] + col0
    idx = x.storage_offset() + i * stride_row + j * stride_col
    ok = (idx >= 0) & (idx < n)
    return torch.where(ok, flat[idx.clamp(0, n - 1)], torch.full(idx.shape, math.nan, dtype=torch.float64))


def check_load_tile(out, x, row0, col0, block_rows, block_cols):
    """Raise WarmupError unless ``out`` is ``spec_load_tile(x, ...)``, exactly (a load does no arithmetic)."""
    __tracebackhide__ = True
    n_rows, n_cols = x.shape
    check_rows, check_cols = row0 + block_rows > n_rows, col0 + block_cols > n_cols
    where = (f"load_tile: tile rows {row0}-{row0 + block_rows - 1} of x's {n_rows}, cols {col0}-{col0 + block_cols - 1} "
             f"of {n_cols}, strides {tuple(x.stride())}, CHECK_ROWS={check_rows}, CHECK_COLS={check_cols}, {x.dtype}")
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (block_rows, block_cols):
        raise WarmupError(f"{where}\n  expected a ({block_rows}, {block_cols}) tensor, got "
                          f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}")
    if out.dtype != x.dtype:
        raise WarmupError(f"{where}\n  the tile must keep x's dtype {x.dtype}, got {out.dtype}")
    want = spec_load_tile(x, row0, col0, block_rows, block_cols).double()
    got = out.detach().cpu().double()
    bad = ~(got == want)
    if not bad.any():
        return
    rows_out = (torch.arange(block_rows) + row0 >= n_rows)[:, None].expand(block_rows, block_cols)
    cols_out = (torch.arange(block_cols) + col0 >= n_cols)[None, :].expand(block_rows, block_cols)
    outside = rows_out | cols_out
    lines = [where, f"  {int(bad.sum())} of {bad.numel()} elements wrong: {int((bad & ~outside).sum())} inside x, "
             f"{int((bad & rows_out).sum())} in rows past its last row, {int((bad & cols_out & ~rows_out).sum())} "
             "in columns past its last column"]
    i, j = (int(t) for t in bad.nonzero()[0])
    lines.append(f"  first wrong element [{i}, {j}] (x[{row0 + i}, {col0 + j}]"
                 f"{', outside x' if outside[i, j] else ''}): yours {got[i, j].item():.4g}, expected {want[i, j].item():.4g}")
    nan_rows = bool((bad & rows_out & torch.isnan(got)).any())
    nan_cols = bool((bad & cols_out & ~rows_out & torch.isnan(got)).any())
    if bad[~outside].any():
        swapped = _load_with_strides(x, row0, col0, block_rows, block_cols, x.stride(1), x.stride(0))
        if torch.equal(torch.where(outside, got, swapped)[~outside], got[~outside]) and x.stride(0) != x.stride(1):
            bug = "rows and columns use each other's stride: rows[:, None] * stride_row + cols[None, :] * stride_col"
        elif (got[~outside & bad] == 0).all():
            bug = ("elements inside x read 0: the mask hides elements that exist (an off-by-one? rows < n_rows "
                   "and cols < n_cols, or a row mask used for the columns)")
        else:
            bug = "the pointers are wrong: element (i, j) lives at base + rows[i] * stride_row + cols[j] * stride_col"
        fix = "the pointers (and the mask) for elements inside x, before anything past its edges"
    elif nan_rows or nan_cols:
        edge, flag, bound = ("rows", "CHECK_ROWS", "rows < n_rows") if nan_rows else \
            ("columns", "CHECK_COLS", "cols < n_cols")
        past = rows_out if nan_rows else cols_out & ~rows_out
        first_past = (torch.arange(block_rows)[:, None] + row0 == n_rows) if nan_rows else \
            (torch.arange(block_cols)[None, :] + col0 == n_cols)
        read = bad & past & torch.isnan(got)
        if torch.equal(read, (past & first_past.expand_as(past)) & ~outside.logical_and(~past)):
            bug = (f"the mask on the {edge} is off by one: it lets through the first {edge[:-1]} past the end "
                   f"({bound}, not <=)")
        else:
            bug = f"the tile reads past x's last {edge[:-1]} (NaN planted there): no mask on the {edge} when {flag} is True ({bound})"
            if check_rows != check_cols and bool((past & ~read).sum() == 0):
                bug += "; only one flag is True on this tile: are CHECK_ROWS and CHECK_COLS swapped?"
        fix = f"the mask on the {edge}"
    else:
        bug = "elements past x's edges must read 0: tl.load(..., mask=..., other=0.0)"
        fix = "other=0.0"
    lines += [f"  likely bug: {bug}", f"  fix first: {fix}"]
    raise WarmupError("\n".join(lines))


# ---------------------------------------------------------------------------
# online_softmax_tile
# ---------------------------------------------------------------------------

BUGS = {
    "no_scale": "the scores are not multiplied by qk_scale (scale * log2 e)",
    "exp": "exp instead of exp2: the scores are in base-2 units (qk_scale holds log2 e), so p and alpha need exp2",
    "max_not_carried": "m_new is the max of this tile only: it must be max(m_i, rowmax(s)), the max of every tile so far",
    "l_not_rescaled": "l_i is not rescaled when the max grows: l_i = alpha * l_i + rowsum(p), alpha = exp2(m_i - m_new)",
    "acc_not_rescaled": "the accumulator is not rescaled when the max grows: acc = alpha * acc + p @ v",
    "normalized": "acc is divided by l_i here: the division belongs to the epilogue, once, after the last tile",
    "no_key_bound": "keys >= N_K (padding, loaded as 0) are not masked: their score 0 gets a share of the softmax",
    "no_mask": "a MASKED tile is not masked: scores of keys a row must not see are not set to -inf",
    "causal_ignored": "the causal mask is missing: with IS_CAUSAL, keys past the row (key > query) must be -inf",
    "causal_off_by_one": "the causal mask is off by one: it hides the diagonal (key == query stays visible: <=, not <)",
    "causal_transposed": "the causal mask is transposed: a row sees keys at or after itself (key >= query) instead of before",
}


def spec_online_softmax(q, k, v, state=None, *, start_m=0, start_n=0, n_keys=None, is_causal=False,
                        masked=None, scale=None, bug=None):
    """``(m, l, acc)`` after one key tile, float64, as ``online_softmax_tile`` computes them (base 2).

    ``bug``: one of ``BUGS``, to compute what a classic mistake gives instead (for the diagnosis).
    """
    qd, kd, vd = (t.detach().cpu().double() for t in (q, k, v))
    bm, bn, d = qd.shape[0], kd.shape[0], qd.shape[1]
    n_keys = start_n + bn if n_keys is None else n_keys
    scale = d ** -0.5 if scale is None else scale
    if masked is None:
        masked = start_n + bn > n_keys or (is_causal and start_n + bn - 1 > start_m)
    s = qd @ kd.T * (1.0 if bug == "no_scale" else scale * LOG2E)
    if masked and bug != "no_mask":
        keys = torch.arange(bn)[None, :] + start_n
        rows = torch.arange(bm)[:, None] + start_m
        visible = keys < n_keys if bug != "no_key_bound" else torch.ones(bm, bn, dtype=torch.bool)
        if is_causal and bug != "causal_ignored":
            visible = visible & {"causal_off_by_one": keys < rows, "causal_transposed": keys >= rows}.get(bug, keys <= rows)
        s = s.masked_fill(~visible, -math.inf)
    if state is None:
        m0, l0, acc0 = torch.full((bm,), -math.inf, dtype=torch.float64), torch.zeros(bm, dtype=torch.float64), \
            torch.zeros(bm, d, dtype=torch.float64)
    else:
        m0, l0, acc0 = (t.detach().cpu().double() for t in state)
    m = s.amax(-1) if bug == "max_not_carried" else torch.maximum(m0, s.amax(-1))
    ex = torch.exp if bug == "exp" else torch.exp2
    p = ex(s - m[:, None])
    alpha = ex(m0 - m)
    l = (l0 if bug == "l_not_rescaled" else alpha * l0) + p.sum(-1)
    acc = (acc0 if bug == "acc_not_rescaled" else alpha[:, None] * acc0) + p @ vd
    if bug == "normalized":
        acc = acc / l[:, None]
    return m, l, acc


def check_online_softmax(result, q, k, v, state=None, *, start_m=0, start_n=0, n_keys=None, is_causal=False,
                         masked=None, scale=None):
    """Raise WarmupError unless ``result = (m, l, acc)`` matches ``spec_online_softmax`` (same arguments).

    m is checked first, then l, then acc: each is built from the one before. Tolerances: the
    course's policy (attnlib/compare.py) for q's dtype.
    """
    __tracebackhide__ = True
    bm, bn = q.shape[0], k.shape[0]
    n_keys_ = start_n + bn if n_keys is None else n_keys
    masked_ = masked if masked is not None else (start_n + bn > n_keys_ or (is_causal and start_n + bn - 1 > start_m))
    kw = dict(start_m=start_m, start_n=start_n, n_keys=n_keys, is_causal=is_causal, masked=masked, scale=scale)
    context = (f"online_softmax_tile: query rows {start_m}-{start_m + bm - 1}, keys {start_n}-{start_n + bn - 1} "
               f"(N_K = {n_keys_}), {'causal' if is_causal else 'not causal'}, "
               f"{'MASKED' if masked_ else 'unmasked'} tile, {'fresh' if state is None else 'carried'} state, {q.dtype}")
    if not (isinstance(result, (tuple, list)) and len(result) == 3 and all(isinstance(t, torch.Tensor) for t in result)):
        raise WarmupError(f"{context}\n  expected (m, l, acc), three tensors, got {type(result).__name__}")
    want = spec_online_softmax(q, k, v, state, **kw)
    atol, rtol = tolerance_for(q.dtype)

    def close(a, b):
        _, _, _, bad, _ = measure(a, b, atol, rtol)
        return not bad.any()

    def hint():
        for bug, sentence in BUGS.items():
            cand = spec_online_softmax(q, k, v, state, bug=bug, **kw)
            if all(c.shape == r.shape for c, r in zip(cand, result)) and \
                    all(close(r, c) for r, c in zip(result, cand)) and not all(close(c, w) for c, w in zip(cand, want)):
                return sentence
        return None
    names = (("m", "m (the running max, base 2)", (bm,)), ("l", "l (the running sum)", (bm,)),
             ("acc", "acc (the running P V)", (bm, v.shape[1])))     # rows: dim -1 of m and l, -2 of acc
    for (short, name, shape), got, ref in zip(names, result, want):
        if tuple(got.shape) != shape:
            raise WarmupError(f"{context}\n  {name} must be shaped {shape}, got {tuple(got.shape)}")
        if got.dtype != torch.float32:
            raise WarmupError(f"{context}\n  {name} must stay float32 (the running state lives on chip in fp32), "
                              f"got {got.dtype}")
        try:
            assert_close(got.cpu(), ref, name=name, dtype=q.dtype, row_dim=-len(shape), row_label="query rows of the tile",
                         context=context, hint=hint)
        except CompareError as exc:
            fix = {"m": "the scores, their mask, then m_new (l and acc are built on m)",
                   "l": "p, alpha and l_i (m is right)", "acc": "acc = alpha * acc + p @ v (m and l are right)"}[short]
            raise WarmupError(f"{exc}\n  fix first: {fix}") from None


# ---------------------------------------------------------------------------
# key_range
# ---------------------------------------------------------------------------

def spec_key_range(n_q, n_k, block_m, block_n, is_causal=True):
    """``(hi_full, hi)`` per query tile, int64 ``(cdiv(n_q, block_m), 2)``, from the visibility mask:
    ``hi`` is one past the last key any row of the tile sees; ``hi_full`` the largest multiple of
    block_n such that every row of the tile sees every key below it."""
    out = []
    keys = torch.arange(n_k)
    for t in range(-(-n_q // block_m)):
        rows = torch.arange(block_m)[:, None] + t * block_m
        visible = keys[None, :] <= rows if is_causal else torch.ones(block_m, n_k, dtype=torch.bool)
        seen = visible.any(0).nonzero()
        hi = int(seen.max()) + 1 if len(seen) else 0
        whole = int(visible.all(0).int().cumprod(0).sum())        # leading keys every row sees
        out.append((whole // block_n * block_n, hi))
    return torch.tensor(out, dtype=torch.int64).reshape(-1, 2)


def check_key_range(out, n_q, n_k, block_m, block_n, is_causal=True):
    """Raise WarmupError unless ``out`` equals ``spec_key_range`` (same arguments)."""
    __tracebackhide__ = True
    where = (f"key_range: N_Q = {n_q}, N_K = {n_k}, BLOCK_M = {block_m}, BLOCK_N = {block_n}, "
             f"{'causal' if is_causal else 'not causal'}")
    want = spec_key_range(n_q, n_k, block_m, block_n, is_causal)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(want.shape):
        raise WarmupError(f"{where}\n  expected a {tuple(want.shape)} tensor of (hi_full, hi) per query tile, got "
                          f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}")
    got = out.detach().cpu().long()
    wrong = (got != want).any(1).nonzero().flatten().tolist()
    if not wrong:
        return
    t = wrong[0]
    (gf, gh), (wf, wh) = got[t].tolist(), want[t].tolist()
    lines = [where, f"  query tiles with a wrong range: {_ranges(wrong)} (of 0-{len(want) - 1})",
             f"  query tile {t} (rows {t * block_m}-{t * block_m + block_m - 1}): yours (hi_full, hi) = ({gf}, {gh}), "
             f"expected ({wf}, {wh})"]
    if gh != wh:
        lines.append("  hi: " + ("it stops before keys a row of this tile sees: O will be wrong" if gh < wh else
                                 "it visits keys no row of this tile sees (above the diagonal, or past N_K): "
                                 "wasted tiles, read for nothing"))
    if gf != wf:
        if gf % block_n:
            lines.append("  hi_full: not a multiple of BLOCK_N, and the unmasked stage steps from 0 by BLOCK_N: "
                         "its last step would run a partial tile unmasked")
        lines.append("  hi_full: " + ("a tile that needs the mask (the diagonal, the last partial tile) would run "
                                      "without it: O will be wrong" if gf > wf else
                                      "tiles every row sees whole are run masked: right, but slower"))
    starts = torch.arange(len(want)) * block_m
    mins = torch.minimum(starts, torch.tensor(n_k))
    candidates = {
        "the causal split is ignored (hi_full, hi as when not causal)": spec_key_range(n_q, n_k, block_m, block_n, False),
        "hi is not clamped to N_K (a query tile can end past the last key when N_Q > N_K)":
            torch.stack([want[:, 0], starts + block_m], 1),
        "hi_full is not clamped to N_K: the whole tiles must also be below N_K":
            torch.stack([starts // block_n * block_n, want[:, 1]], 1),
        "hi_full is rounded down to a multiple of BLOCK_M; the key tiles are BLOCK_N wide":
            torch.stack([mins // block_m * block_m, want[:, 1]], 1),
        "hi_full is not rounded down to whole key tiles (a multiple of BLOCK_N)": torch.stack([mins, want[:, 1]], 1),
    }
    for sentence, cand in candidates.items():
        if not torch.equal(cand, want) and torch.equal(cand, got):
            lines.append(f"  likely bug: {sentence}")
            break
    lines.append("  fix first: " + ("hi" if gh != wh else "hi_full"))
    raise WarmupError("\n".join(lines))


# ---------------------------------------------------------------------------
# The inputs the grader draws (and the tests reuse)
# ---------------------------------------------------------------------------

def _poisoned(shape, dtype, g, rows=slice(3, 40), cols=slice(5, 45)):
    """A NaN buffer with random values in [rows, cols]: reading outside the view reads NaN."""
    buf = torch.full(shape, math.nan, dtype=torch.float32)
    r, c = rows.stop - rows.start, cols.stop - cols.start
    buf[rows, cols] = torch.randn(r, c, generator=g)
    return buf.to(dtype)


def view_arg(buf, shape, stride, offset) -> dict:
    """A strided view as plain data (the grader ships tensors and values only); ``materialize`` rebuilds it."""
    return {"view_of": buf, "shape": list(shape), "stride": list(stride), "offset": int(offset)}


def materialize(obj, device="cpu"):
    """Tensors moved to ``device`` and view dicts rebuilt, in any nesting of lists, tuples and dicts."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict) and "view_of" in obj:
        return obj["view_of"].to(device).as_strided(obj["shape"], obj["stride"], obj["offset"])
    if isinstance(obj, (list, tuple)):
        return type(obj)(materialize(o, device) for o in obj)
    if isinstance(obj, dict):
        return {key: materialize(val, device) for key, val in obj.items()}
    return obj


def load_tile_calls(dtype, seed=0):
    """(name, args) for ``warmup_load_tile``: a (37, 40) matrix inside a NaN-poisoned buffer, seen
    plainly and transposed, with tiles that run past its rows only, its columns only, both, neither."""
    g = torch.Generator().manual_seed(seed)
    buf = _poisoned((50, 70), dtype, g)
    x = view_arg(buf, (37, 40), (70, 1), 3 * 70 + 5)               # buf[3:40, 5:45]
    xt = view_arg(buf, (40, 37), (1, 70), 3 * 70 + 5)              # its transpose
    return [("in range, transposed x", (xt, 8, 16, 16, 16)),
            ("past the last row", (x, 32, 8, 8, 32)),
            ("past the last column", (x, 0, 32, 16, 16)),
            ("past both edges", (x, 24, 32, 16, 16))]


def online_softmax_calls(dtype, seed=0):
    """(name, args, kwargs) for ``warmup_online_softmax_tile``: BLOCK_M 16, BLOCK_N 32, D 24 (padded
    to 32); fresh and carried state, unmasked, past N_K, and the causal diagonal. A carried state is
    the spec's own result on an earlier key tile, in fp32, as the kernel would hold it."""
    g = torch.Generator().manual_seed(seed + 1)

    def r(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    def carried(q, start_m, is_causal):
        k0, v0 = r(32, 24), r(32, 24)
        return tuple(t.float() for t in spec_online_softmax(q, k0, v0, start_m=start_m, start_n=0,
                                                            is_causal=is_causal))

    def padded_keys(k, v, start_n, n_keys):       # keys >= N_K read as 0, as load_tile gives them
        k, v = k.clone(), v.clone()
        k[max(0, n_keys - start_n):] = 0
        v[max(0, n_keys - start_n):] = 0
        return k, v
    calls = []
    q, k, v = r(16, 24), r(32, 24), r(32, 24)
    calls.append(("fresh state, unmasked tile", (q, k, v, None), dict(start_m=64, start_n=0)))
    q, k, v = r(16, 24), r(32, 24), r(32, 24)
    calls.append(("carried state, unmasked tile", (q, k, v, carried(q, 64, True)),
                  dict(start_m=64, start_n=32, n_keys=100, is_causal=True)))
    q, (k, v) = r(16, 24), padded_keys(r(32, 24), r(32, 24), 0, 21)
    calls.append(("fresh state, keys past N_K", (q, k, v, None), dict(start_m=0, start_n=0, n_keys=21)))
    q, (k, v) = r(16, 24), padded_keys(r(32, 24), r(32, 24), 32, 40)
    calls.append(("carried state, causal diagonal", (q, k, v, carried(q, 32, True)),
                  dict(start_m=32, start_n=32, n_keys=40, is_causal=True)))
    return calls


KEY_RANGE_CALLS = [                      # (name, (n_q, n_k, block_m, block_n, is_causal))
    ("causal, BLOCK_M > BLOCK_N", (100, 100, 32, 16, True)),
    ("causal, BLOCK_M < BLOCK_N, N_Q > N_K", (100, 40, 16, 32, True)),
    ("causal, N_Q < N_K", (20, 90, 16, 16, True)),
    ("not causal", (50, 75, 32, 16, False)),
]


def grader_calls(dtypes, device, seed=0) -> list[dict]:
    """Every warm-up check for these dtypes on ``device``: dicts of name, fn, args, kwargs (plain data).
    load_tile and online_softmax_tile run in each dtype; key_range, which has none, once."""
    calls = []
    for dtype in dtypes:
        dt = str(dtype).replace("torch.", "")
        for name, args in load_tile_calls(dtype, seed):
            calls.append(dict(name=f"load_tile: {name} ({dt} {device})", fn="warmup_load_tile", args=list(args),
                              kwargs={}))
        for name, args, kw in online_softmax_calls(dtype, seed):
            calls.append(dict(name=f"online_softmax_tile: {name} ({dt} {device})", fn="warmup_online_softmax_tile",
                              args=list(args), kwargs=kw))
    for name, args in KEY_RANGE_CALLS:
        calls.append(dict(name=f"key_range: {name}", fn="warmup_causal_key_range", args=list(args),
                          kwargs={"device": device}))
    return calls


CHECKS = {"warmup_load_tile": check_load_tile, "warmup_online_softmax_tile": check_online_softmax,
          "warmup_causal_key_range": check_key_range}


def check_call(fn: str, args, kwargs, result) -> None:
    """Check what the warm-up ``fn`` returned on ``args``/``kwargs`` (as ``grader_calls`` made them)."""
    args = materialize(list(args), "cpu")
    kwargs = {key: val for key, val in materialize(dict(kwargs), "cpu").items() if key != "device"}
    if isinstance(result, (list, tuple)) and fn != "warmup_online_softmax_tile" and len(result) == 1:
        result = result[0]
    CHECKS[fn](result, *args, **kwargs)
