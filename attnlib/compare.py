"""Tolerance policy and a comparison whose failures teach.

Policy
------
A result passes when every element satisfies

    |yours - ref| <= atol * max|ref| + rtol * |ref|

against the float64 reference, and it has no NaN or Inf where the reference is
finite. ``atol`` is taken relative to the tensor's largest value so one policy
serves O (values near 1) and gradients (values that grow with N) alike.

===========  ======  ======  =====================================================
dtype        atol    rtol    why
===========  ======  ======  =====================================================
float64      1e-10   1e-8    the reference itself
float32      1e-5    1e-4    true fp32: TF32 off (tests switch it off; Triton dots
                             on fp32 use ``input_precision="ieee"``)
tf32         4e-3    4e-3    fp32 inputs through TF32 matrix units (10-bit mantissa,
                             as fp16): opt in with ``tolerance_for(..., tf32=True)``
float16      4e-3    4e-3    unit roundoff 4.9e-4; PyTorch's own naive fp16
                             attention stays under half of this at test sizes
bfloat16     3e-2    3e-2    unit roundoff 3.9e-3 (8x fp16), same margin
===========  ======  ======  =====================================================

The low-precision rows follow FlashAttention's acceptance rule: a kernel may be
about twice as wrong as PyTorch doing the same computation in the same dtype.
``tests/test_tolerance_policy.py`` measures PyTorch's naive attention in each
dtype and fails if it uses more than half of a bound, so a bound is never set
from a kernel's own error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

_POLICY = {
    torch.float64: (1e-10, 1e-8),
    torch.float32: (1e-5, 1e-4),
    "tf32": (4e-3, 4e-3),
    torch.float16: (4e-3, 4e-3),
    torch.bfloat16: (3e-2, 3e-2),
}


def tolerance_for(dtype: torch.dtype, tf32: bool = False) -> tuple[float, float]:
    """``(atol, rtol)`` for results computed in ``dtype`` (see the module docstring)."""
    if tf32 and dtype == torch.float32:
        return _POLICY["tf32"]
    if dtype not in _POLICY:
        raise ValueError(f"no tolerance policy for {dtype}")
    return _POLICY[dtype]


class CompareError(AssertionError):
    """A comparison failed; ``str(err)`` is the report, ``err.stats`` the numbers."""

    def __init__(self, message, stats):
        super().__init__(message)
        self.stats = stats


@dataclass
class Stats:
    name: str
    n: int
    n_bad: int
    n_nan: int
    n_inf: int
    max_abs: float
    max_rel: float | None       # None when the reference is 0 everywhere
    worst_index: tuple
    bad_rows: list

    @property
    def ok(self):
        return self.n_bad == 0


def format_ranges(indices) -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    idx = sorted(set(int(i) for i in indices))
    if not idx:
        return "none"
    parts, start, prev = [], idx[0], idx[0]
    for i in idx[1:] + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    if len(parts) > 12:
        parts = parts[:12] + [f"... ({len(idx)} in all)"]
    return ", ".join(parts)


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def measure(actual, expected, atol, rtol, extra=0.0):
    """Elementwise check; returns (bad mask, abs err, Stats-ish pieces) in float64 on the CPU.

    ``extra``: an absolute error allowed on top of the tolerance (the grader's large-score allowance)."""
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    finite_ref = torch.isfinite(e)
    scale = e[finite_ref].abs().max().item() if finite_ref.any() else 1.0
    scale = scale if scale > 0 else 1.0
    err = (a - e).abs()
    # Where both are the same infinity (an LSE of -inf, say) the error is 0, not NaN.
    same_inf = torch.isinf(a) & torch.isinf(e) & (a == e)
    err = torch.where(same_inf, torch.zeros_like(err), err)
    bound = atol * scale + rtol * e.abs() + extra
    bad = ~(err <= bound)                       # NaN errors count as bad
    bad &= ~same_inf
    return a, e, err, bad, scale


def assert_close(actual, expected, *, name="output", dtype=None, tf32=False,
                 row_dim=-2, row_label="query rows", tile=None, context="", hint=None):
    """Assert ``actual`` matches the float64 reference ``expected``.

    ``dtype``: the computation's dtype, which picks the tolerance (defaults to
    ``actual.dtype``). ``tile``: the row tile size, to report which tiles hold
    the errors. ``row_dim``: the dimension that indexes rows (-1 for an LSE).
    ``hint``: a callable returning a likely-bug sentence or None,
    called only on failure (it can be slow).
    """
    __tracebackhide__ = True  # pytest shows the report, not this function's code
    if not isinstance(actual, torch.Tensor):
        raise CompareError(f"{name}: expected a tensor, got {type(actual).__name__}", None)
    if tuple(actual.shape) != tuple(expected.shape):
        raise CompareError(
            f"{name}: shape {tuple(actual.shape)} but the reference is {tuple(expected.shape)}"
            + (f" ({context})" if context else ""), None)
    dtype = actual.dtype if dtype is None else dtype
    atol, rtol = tolerance_for(dtype, tf32=tf32)
    a, e, err, bad, scale = measure(actual, expected, atol, rtol)
    n_bad = int(bad.sum())
    if n_bad == 0:
        return None
    n = a.numel()
    n_nan = int(torch.isnan(a).sum())
    n_inf = int((torch.isinf(a) & ~torch.isinf(e)).sum())
    err_nonan = torch.where(torch.isnan(err), torch.full_like(err, math.inf), err)
    flat = int(err_nonan.argmax())
    worst = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape))
    max_abs = float(err_nonan.max())
    # Relative error only where the reference is not (near) 0: |err| / 0 would print nan or inf.
    big = e.abs() > 1e-3 * scale
    max_rel = float((err_nonan[big] / e.abs()[big]).max()) if big.any() else None

    lines = [f"{name} does not match the reference"
             + (f" ({context})" if context else "") + f": dtype {dtype}, shape {tuple(a.shape)}"]
    lines.append(f"  bad elements: {n_bad:,} of {n:,} ({100.0 * n_bad / n:.2f}%) break "
                 f"|err| <= {atol:g}*max|ref| + {rtol:g}*|ref|, with max|ref| = {_fmt(scale)}")
    if n_nan or n_inf:
        lines.append(f"  NaN: {n_nan:,}, Inf: {n_inf:,} in yours (the reference has none there)")
    lines.append(f"  worst element {list(worst)}: yours {_fmt(a[worst].item())}, "
                 f"reference {_fmt(e[worst].item())}, |err| {_fmt(err[worst].item())}")
    if max_rel is None:
        lines.append(f"  max abs err {_fmt(max_abs)} (the reference is 0 everywhere: no relative error)")
    else:
        lines.append(f"  max abs err {_fmt(max_abs)}, max rel err {_fmt(max_rel)} "
                     f"(where |ref| > {_fmt(1e-3 * scale)})")
    bad_rows: list[int] = []
    if a.dim() >= -row_dim:
        row_dim = a.dim() + row_dim
        other = [d for d in range(a.dim()) if d != row_dim]
        per_row = bad.permute(row_dim, *other).reshape(a.shape[row_dim], -1).any(dim=1)
        bad_rows = per_row.nonzero().flatten().tolist()
        nrows = a.shape[row_dim]
        lines.append(f"  {row_label} with bad elements: {format_ranges(bad_rows)} (of 0-{nrows - 1})")
        if tile:
            tiles = sorted({r // tile for r in bad_rows})
            ntiles = -(-nrows // tile)
            note = ""
            if nrows % tile:
                note = f"; the last tile, {ntiles - 1}, is partial (rows {(ntiles - 1) * tile}-{nrows - 1})"
            lines.append(f"  tiles of {tile} rows with bad elements: {format_ranges(tiles)} "
                         f"(of 0-{ntiles - 1}{note})")
        batch_dims = a.shape[:row_dim]
        if len(batch_dims) > 0:
            per_slice = bad.reshape(*batch_dims, -1).any(dim=-1)
            lines.append(f"  batch/head slices with bad elements: {int(per_slice.sum())} of {per_slice.numel()}")
    stats = Stats(name, n, n_bad, n_nan, n_inf, max_abs, max_rel, worst, bad_rows)
    if hint is not None:
        try:
            h = hint()
        except Exception as exc:  # a diagnosis must never hide the failure itself
            h = f"(diagnosis failed: {exc!r})"
        if h:
            lines.append(f"  likely bug: {h}")
    raise CompareError("\n".join(lines), stats)
