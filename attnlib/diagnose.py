"""Name the classic bug that a wrong result looks like.

Each candidate below is the exact result of one well-known mistake, computed in
float64. If a student's result lies far closer to one of them than to the
truth, that mistake is named in the failure message. Candidates that depend on
a tile size are tried for the usual ones (16, 32, 64, 128) unless the caller
knows the tile.
"""

from __future__ import annotations

import math
import re

import torch

from .contract import causal_mask
from .reference import reference_attention, reference_backward

TILES = (16, 32, 64, 128)


def _f64(*ts):
    return [t.detach().to("cpu", torch.float64) for t in ts]


def _scores(q, k, scale, mask):
    s = (q @ k.transpose(-2, -1)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return s


def _attn_with_mask(q, k, v, scale, mask):
    s = _scores(q, k, scale, mask)
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse[..., None]) @ v, lse


def flash_sim(q, k, v, scale, is_causal, bk, *, rescale_acc=True, rescale_l=True,
              normalize=True, drop_partial_k=False):
    """FlashAttention-2's forward loop over key tiles, with switches for its classic mistakes."""
    nq, nk = q.shape[-2], k.shape[-2]
    mask = causal_mask(nq, nk) if is_causal else None
    m = torch.full(q.shape[:-1], -math.inf, dtype=q.dtype)
    l = torch.zeros(q.shape[:-1], dtype=q.dtype)
    acc = torch.zeros(q.shape, dtype=q.dtype)
    stop = (nk // bk) * bk if drop_partial_k else nk
    for j in range(0, stop, bk):
        s = (q @ k[..., j:j + bk, :].transpose(-2, -1)) * scale
        if mask is not None:
            s = s.masked_fill(~mask[:, j:j + bk], -math.inf)
        m_new = torch.maximum(m, s.amax(dim=-1))
        alpha = torch.exp(m - m_new)
        alpha = torch.where(torch.isnan(alpha), torch.zeros_like(alpha), alpha)
        p = torch.exp(s - m_new[..., None])
        p = torch.where(torch.isnan(p), torch.zeros_like(p), p)
        l = (alpha * l if rescale_l else l) + p.sum(dim=-1)
        acc = (alpha[..., None] * acc if rescale_acc else acc) + p @ v[..., j:j + bk, :]
        m = m_new
    o = acc / l[..., None] if normalize else acc
    return o, m + torch.log(l)


LN2 = math.log(2)


def lse_bugs(s):
    """``(description, wrong LSE)`` for the classic LSE mistakes, from float64 scores ``s``.

    The right LSE is ``m + log(l)``: m the row's max score, l = sum_j exp(s_j - m). A Triton kernel
    works in base 2 (m2 = m / ln 2, the same l) and must store ``(m2 + log2(l)) * ln 2``.
    """
    m = s.amax(dim=-1)
    lse = torch.logsumexp(s, dim=-1)
    log_l = lse - m
    return [
        ("the LSE is the running max m only: + log(l) is missing", m),
        ("the LSE is log(l) only: + m is missing", log_l),
        ("the LSE is in base 2 (log2-sum-exp2): convert with * ln(2) before storing", lse / LN2),
        ("the LSE is log2(l) only: the running max is missing, and the base-2 log is not converted "
         "(LSE = (m2 + log2(l)) * ln 2)", log_l / LN2),
        ("the LSE is the base-2 running max m2 only: + log2(l) is missing, and * ln(2) "
         "(LSE = (m2 + log2(l)) * ln 2)", m / LN2),
        ("the LSE mixes bases: m + log2(l); both terms must be natural ((m2 + log2(l)) * ln 2)",
         m + log_l / LN2),
        ("the LSE mixes bases: the base-2 max m2 + a natural log(l); convert the sum, "
         "(m2 + log2(l)) * ln 2", m / LN2 + log_l),
    ]


def _grads_from_p(p, q, k, v, do, o, scale, use_D=True):
    dv = p.transpose(-2, -1) @ do
    dp = do @ v.transpose(-2, -1)
    D = (do * o).sum(dim=-1, keepdim=True)
    ds = p * (dp - D) if use_D else p * dp
    return scale * ds @ k, scale * ds.transpose(-2, -1) @ q, dv


def candidates(quantity, q, k, v, *, is_causal, scale, dout=None, tiles=TILES, tiles_q=None):
    """Yield ``(description, tensor)`` for each classic mistake that applies to ``quantity``.

    ``tiles``: key-tile sizes (Bk) to simulate; ``tiles_q``: query-tile sizes (Bq), default ``tiles``.
    """
    tiles_q = tiles if tiles_q is None else tiles_q
    q, k, v = _f64(q, k, v)
    nq, nk = q.shape[-2], k.shape[-2]
    fwd = quantity in ("o", "lse")
    pick = 0 if quantity == "o" else 1

    if fwd:
        yield "the scale is applied twice (scores multiplied by scale**2)", \
            reference_attention(q, k, v, is_causal, scale * scale)[pick]
        yield "the scale is not applied (scores are q @ k.T, not q @ k.T * scale)", \
            reference_attention(q, k, v, is_causal, 1.0)[pick]
        if is_causal:
            yield "the causal mask is missing", reference_attention(q, k, v, False, scale)[pick]
            rows = torch.arange(nq)[:, None]
            cols = torch.arange(nk)[None, :]
            yield "the causal mask is off by one: it hides the diagonal (j < i instead of j <= i)", \
                _attn_with_mask(q, k, v, scale, cols < rows)[pick]
            yield "the causal mask is off by one: it shows one key too many (j <= i + 1)", \
                _attn_with_mask(q, k, v, scale, cols <= rows + 1)[pick]
            if nq != nk:
                yield ("the causal mask is aligned bottom-right (j <= i + Nk - Nq); "
                       "this course aligns it top-left, as SDPA does"), \
                    _attn_with_mask(q, k, v, scale, cols <= rows + (nk - nq))[pick]
        else:
            yield "a causal mask is applied although is_causal=False", \
                reference_attention(q, k, v, True, scale)[pick]
        if quantity == "o":
            mask = causal_mask(nq, nk) if is_causal else None
            s_ = _scores(q, k, scale, mask)
            p_ = torch.softmax(s_, dim=-2)
            yield "the softmax is taken over the queries (dim=-2); it must run over the keys (dim=-1)", \
                torch.where(torch.isnan(p_), torch.zeros_like(p_), p_) @ v
        if nk > 1:
            # One key short of the end: an off-by-one in a length (a varlen sequence's end read as
            # cu_seqlens[b + 1] - 1, one past the last row taken for the last row) or a loop's bound.
            last = torch.arange(nk)[None, :] < nk - 1
            yield (f"the last key (j = Nk - 1 = {nk - 1}) is never seen: a length or a loop bound one short "
                   "(in a packed batch sequence b's keys are rows cu_seqlens_k[b] to cu_seqlens_k[b + 1] - 1: "
                   "its length is cu_seqlens_k[b + 1] - cu_seqlens_k[b])"), \
                _attn_with_mask(q, k, v, scale, last & causal_mask(nq, nk) if is_causal else last)[pick]
        for bk in tiles:
            if bk >= nk:
                continue
            yield f"the output accumulator is not rescaled by exp(m_old - m_new) when the running max grows (Bk={bk})", \
                flash_sim(q, k, v, scale, is_causal, bk, rescale_acc=False)[pick]
            yield f"the running sum l is not rescaled by exp(m_old - m_new) (Bk={bk})", \
                flash_sim(q, k, v, scale, is_causal, bk, rescale_l=False)[pick]
            if nk % bk:
                if nk % bk > 1:      # (a partial tile of one key: the last key never seen, above)
                    yield f"the last, partial key tile is dropped (keys {(nk // bk) * bk}-{nk - 1}, Bk={bk})", \
                        flash_sim(q, k, v, scale, is_causal, bk, drop_partial_k=True)[pick]
                pad = -(-nk // bk) * bk - nk
                kp = torch.cat([k, k.new_zeros(*k.shape[:-2], pad, k.shape[-1])], dim=-2)
                vp = torch.cat([v, v.new_zeros(*v.shape[:-2], pad, v.shape[-1])], dim=-2)
                mask = None
                if is_causal:
                    mask = torch.cat([causal_mask(nq, nk), torch.ones(nq, pad, dtype=torch.bool)], dim=1)
                yield (f"keys past Nk are not masked in the last tile: {pad} zero-padded keys take part in "
                       f"the softmax (Bk={bk}); mask scores with key index >= Nk to -inf"), \
                    _attn_with_mask(q, kp, vp, scale, mask)[pick]
        if quantity == "o":
            # Unnormalized, the accumulator is the same for every tile size: one tile suffices.
            yield "the output is not divided by the running sum l at the end", \
                flash_sim(q, k, v, scale, is_causal, nk, normalize=False)[0]
        else:
            s = _scores(q, k, scale, causal_mask(nq, nk) if is_causal else None)
            for desc, wrong in lse_bugs(s):
                yield desc, wrong
        return

    do = _f64(dout)[0]
    dq, dk, dv = reference_backward(q, k, v, do, is_causal, scale)
    ref = {"dq": dq, "dk": dk, "dv": dv}[quantity]
    if quantity == "dk":
        yield "dK and dV are swapped", dv
    if quantity == "dv":
        yield "dK and dV are swapped", dk
    if quantity in ("dq", "dk"):
        yield f"{quantity} is missing the softmax scale", ref / scale
        yield f"{quantity} has the softmax scale twice", ref * scale
    mask = causal_mask(nq, nk) if is_causal else None
    s = _scores(q, k, scale, mask)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])
    o = p @ v
    idx = {"dq": 0, "dk": 1, "dv": 2}[quantity]
    yield "the D = rowsum(dO * O) term is missing from dS (dS = P * dP instead of P * (dP - D))", \
        _grads_from_p(p, q, k, v, do, o, scale, use_D=False)[idx]
    # Overwriting instead of accumulating: only one tile's share survives.
    dp = do @ v.transpose(-2, -1)
    ds = p * (dp - (do * o).sum(dim=-1, keepdim=True))
    for b in tiles:
        if quantity == "dq" and b < nk:
            # dQ of row i keeps only the last key tile that row i sees.
            last = torch.arange(nq).clamp(max=nk - 1) if is_causal else torch.full((nq,), nk - 1)
            keep = (torch.arange(nk)[None, :] // b) == (last[:, None] // b)
            yield (f"dQ is overwritten instead of accumulated across key tiles (dq = ... instead of "
                   f"dq += ...): only the last key tile's share survives (Bk={b})"), \
                scale * (ds * keep) @ k
    for b in tiles_q:
        if quantity in ("dk", "dv") and b < nq:
            keep = ((torch.arange(nq) // b) == ((nq - 1) // b))[:, None]      # the last query tile
            part = (scale * (ds * keep).transpose(-2, -1) @ q) if quantity == "dk" else (p * keep).transpose(-2, -1) @ do
            yield (f"{quantity} is overwritten instead of accumulated across query tiles: only the last "
                   f"query tile's share survives (Bq={b})"), part
    # The backward rebuilds P = exp(S - L) from the forward's LSE: a wrong LSE makes every
    # gradient wrong while O is right. Name the LSE, the error's source, not the backward.
    for desc, wrong in lse_bugs(s):
        p_bug = torch.exp(s - wrong[..., None])
        yield (f"the backward rebuilt P = exp(S - LSE) from a wrong LSE: {desc}. "
               "The LSE is wrong; fix it (the forward's epilogue) before the backward"), \
            _grads_from_p(p_bug, q, k, v, do, o, scale)[idx]
    if is_causal:
        p_unmasked = torch.exp(_scores(q, k, scale, None) - lse[..., None])
        yield "the causal mask is missing when P is recomputed in the backward", \
            _grads_from_p(p_unmasked, q, k, v, do, o, scale)[idx]
        rows = torch.arange(nq)[:, None]
        cols = torch.arange(nk)[None, :]
        for desc, m in (("hides the diagonal (j < i)", cols < rows), ("shows one key too many (j <= i + 1)",
                                                                      cols <= rows + 1)):
            p_bug = torch.exp(_scores(q, k, scale, m) - lse[..., None])
            yield f"the causal mask in the backward's recomputation of P is off by one: it {desc}", \
                _grads_from_p(p_bug, q, k, v, do, o, scale)[idx]


def _distance(a, b):
    # A kernel writes NaN where the float64 candidate has -inf (a fully masked row): the same mistake.
    both_nan = ~torch.isfinite(a) & ~torch.isfinite(b)
    d = (a - b).abs()
    d = torch.where(both_nan, torch.zeros_like(d), d)
    d = torch.where(torch.isnan(d), torch.full_like(d, math.inf), d)
    finite = torch.isfinite(b)
    s = b[finite].abs().max().item() if finite.any() else 1.0
    return d.max().item() / max(s, 1e-30)


_TILE = re.compile(r"B([kq])=(\d+)")


def _name_tiles(best, scored, tile):
    """The best description; when the tile size was guessed, every tried size that fits as well."""
    d, desc = best
    m = _TILE.search(desc)
    if tile or not m:
        return desc
    key = _TILE.sub("B?", desc)
    sizes = sorted({int(_TILE.search(x).group(2)) for dx, x in scored
                    if _TILE.search(x) and _TILE.sub("B?", x) == key and dx <= 2 * d + 1e-12})
    if len(sizes) <= 1:
        return desc                  # the one size whose simulation reproduces the result
    alts = " or ".join(str(x) for x in sizes)
    return desc.replace(m.group(0), f"B{m.group(1)}={alts}: each reproduces it; yours is one of them")


def likely_bug(quantity, actual, q, k, v, *, is_causal, scale, dout=None, tile=None,
               row_dim=-2, tile_q=None):
    """Return a sentence naming the likely mistake behind a wrong ``quantity``, or None.

    ``quantity`` is one of "o", "lse", "dq", "dk", "dv". ``tile``: the implementation's key-tile
    size (Bk), ``tile_q`` its query-tile size (Bq, default ``tile``); unknown sizes are simulated
    from (16, 32, 64, 128) and named only when they alone reproduce the result.
    """
    actual = actual.detach().to("cpu", torch.float64)
    tile_q = tile if tile_q is None else tile_q
    tiles = (tile,) if tile else TILES
    tiles_q = (tile_q,) if tile_q else TILES
    truth = {"o": 0, "lse": 1}
    if quantity in truth:
        ref = reference_attention(*_f64(q, k, v), is_causal, scale)[truth[quantity]]
    else:
        ref = dict(zip(("dq", "dk", "dv"),
                       reference_backward(*_f64(q, k, v), _f64(dout)[0], is_causal, scale)))[quantity]
    d_true = _distance(actual, ref)
    scored = []
    for desc, cand in candidates(quantity, q, k, v, is_causal=is_causal, scale=scale,
                                 dout=dout, tiles=tiles, tiles_q=tiles_q):
        if cand.shape != actual.shape:
            continue
        if not (torch.isfinite(cand) & (cand != 0)).any():
            continue                      # an all-zero candidate would match any zeroed output
        scored.append((_distance(actual, cand), desc))
    best = min(scored, key=lambda t: t[0]) if scored else None
    if best is not None and best[0] < 0.1 * d_true and best[0] < 5e-2:
        return f"{_name_tiles(best, scored, tile if 'Bk=' in best[1] else tile_q)} (yours matches that mistake to {best[0]:.1e} of max|ref|)"

    # Errors confined to the last partial query tile point at its boundary mask. Only with the
    # caller's tile: a guessed tile size would send the student after a boundary they do not have.
    if quantity in ("o", "lse", "dq") and tile_q:
        n = actual.shape[row_dim]
        bad = ((actual - ref).abs() > 1e-3 * max(ref.abs().max().item(), 1e-30)) | torch.isnan(actual)
        other = [d for d in range(actual.dim()) if d != actual.dim() + row_dim]
        rows = bad.permute(actual.dim() + row_dim, *other).reshape(n, -1).any(dim=1).nonzero().flatten()
        for bq in tiles_q:
            start = (n // bq) * bq
            if start > 0 and n % bq and rows.numel() and rows.min().item() >= start:
                return (f"only rows {start}-{n - 1}, the last, partial query tile of {bq} rows, are wrong: "
                        "that tile is skipped or its loads/stores are not masked")
    return None


# Triton errors whose cause a student can fix in one line, and that line (each one seen and tested:
# tests/test_attnlib.py::test_triton_error_report_is_short_and_names_the_fix).
TRITON_FIXES = {
    "Both operands must be same dtype": "tl.dot takes two operands of one dtype: cast the fp32 one "
                                        "(p.to(v.dtype), ds.to(k.dtype)) before the product",
}


def triton_report(exc):
    """A short report for an exception raised by a Triton kernel (interpreter or compiler), or None:
    the innermost message, the frames in the implementation under test, and a fix when known."""
    import traceback
    chain, e = [], exc
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    if not any(type(x).__name__ in ("InterpreterError", "CompilationError") for x in chain):
        return None
    import os
    try:
        from .loader import impl_root
        root = str(impl_root())
    except Exception:
        root = os.environ.get("ATTN_IMPL", "steps")
    frames, seen = [], set()
    for x in chain:                      # the outermost call first, the failing line last
        for f in traceback.extract_tb(x.__traceback__):
            if f.filename.startswith(root) and (f.filename, f.lineno) not in seen:
                seen.add((f.filename, f.lineno))
                frames.append(f"    {os.path.relpath(f.filename, root)}:{f.lineno} in {f.name}: {(f.line or '').strip()}")
    inner = chain[-1]
    msg = f"{type(inner).__name__}: {inner}"
    lines = ["TRITON ERROR in your kernel (pytest --tb=long shows the interpreter's whole traceback)",
             f"  {msg}"]
    if frames:
        lines += ["  where, in your code (the failing line last):"] + frames
    for needle, fix in TRITON_FIXES.items():
        if needle in msg:
            lines.append(f"  likely fix: {fix}")
    return "\n".join(lines)


class launched_tiles:
    """Record the tile sizes of every Triton kernel launched inside the ``with`` block.

        with launched_tiles() as tiles:
            step.attention(q, k, v)
        tiles.get("BLOCK_M"), tiles.get("BLOCK_N")   # the implementation's own query and key tiles

    ``tiles`` maps each ``BLOCK_*`` constexpr to its value when every launch agreed on it (a
    name launched with two values is left out), so a diagnosis can name the student's tile sizes
    instead of guessing. ``tiles.kernels`` keeps each kernel's own ``{name: value}``. Works in
    Triton's interpreter and on a GPU (autotuned configs arrive as keyword arguments too).
    """

    def __init__(self):
        self.tiles: dict[str, int] = {}
        self.kernels: dict[str, dict[str, int]] = {}
        self._conflicts: set[str] = set()
        self._saved: list = []

    def __enter__(self):
        try:
            import triton.runtime.jit as jit
        except ImportError:                    # no Triton: nothing is launched, nothing recorded
            return self
        classes = [jit.JITFunction]
        try:
            from triton.runtime.interpreter import InterpretedFunction
            classes.append(InterpretedFunction)
        except ImportError:
            pass
        for cls in classes:
            orig = cls.__dict__["run"]
            self._saved.append((cls, orig))
            cls.run = self._wrap(orig)
        return self

    def __exit__(self, *exc):
        for cls, orig in self._saved:
            cls.run = orig
        self._saved.clear()
        return False

    def _wrap(self, orig):
        rec = self

        def run(fn_self, *args, grid, warmup, **kwargs):
            bound = dict(zip(getattr(fn_self, "arg_names", ()), args))
            bound.update(kwargs)
            found = {k: int(v) for k, v in bound.items()
                     if k.startswith("BLOCK_") and isinstance(v, int) and not isinstance(v, bool)}
            name = getattr(getattr(fn_self, "fn", None), "__name__", "kernel")
            rec.kernels.setdefault(name, found)
            for k, v in found.items():
                if rec.tiles.setdefault(k, v) != v:
                    rec._conflicts.add(k)
            for k in rec._conflicts:
                rec.tiles.pop(k, None)
            return orig(fn_self, *args, grid=grid, warmup=warmup, **kwargs)
        return run

    def get(self, name, default=None):
        return self.tiles.get(name, default)
