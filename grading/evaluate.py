"""Score what a worker sent back: every comparison runs here, in the grader's process.

The worker returns tensors; this module computes the float64 reference from
the inputs the grader itself drew, compares with ``attnlib.compare.assert_close``
(the course's one tolerance policy and its teaching report) and asks
``attnlib.diagnose.likely_bug`` to name the classic mistake a wrong result
looks like -- the same words a student sees from ``make test``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from attnlib.checks import describe
from attnlib.compare import CompareError, assert_close, format_ranges, measure, tolerance_for
from attnlib.contract import causal_mask
from attnlib.diagnose import _distance, likely_bug
from attnlib.reference import reference_attention, reference_backward

from .spec import CAPSTONE_ATOL, LARGE_SCORE_DRIFT_MULTIPLE, NXN_FRACTION, RSS_SLACK_MB, SDPA_OPS, Check, Item, sparse_mask

# Statuses of one check
PASSED, FAILED, NOT_IMPLEMENTED, ERROR, LOST, SKIPPED = (
    "passed", "failed", "not implemented", "error", "lost", "skipped")


@dataclass
class CheckResult:
    group: str
    name: str
    status: str
    message: str = ""
    seconds: float = 0.0

    @property
    def passed(self):
        return self.status == PASSED

    @property
    def likely_bug(self) -> str:
        return next((ln.strip()[len("likely bug: "):] for ln in self.message.splitlines()
                     if ln.strip().startswith("likely bug:")), "")

    @property
    def summary(self) -> str:
        """One line: what failed (without the long context), and the likely bug if one was named."""
        if not self.message:
            return self.status
        first = self.message.splitlines()[0]
        if " does not match the reference" in first:
            first = first[: first.index(" does not match the reference")] + " is wrong"
            pct = re.search(r"\(([\d.]+%)\) break", self.message)
            if pct:
                first += f" ({pct.group(1)} bad)"
        bug = self.likely_bug
        return first + (f": likely bug: {bug}" if bug else "")


@dataclass
class Refs:
    o: torch.Tensor | None = None
    lse: torch.Tensor | None = None
    grads: tuple | None = None
    drift: tuple | None = None     # large scores: how far honest fp32 gradients are from the float64 ones


def fp32_backwards(q, k, v, dout, is_causal, scale):
    """(dQ, dK, dV) three times, by honest float32 computations of the same inputs: the reference's maths
    (softmax, then autograd); FlashAttention's (P = exp(S - L) from the float32 LSE, D = rowsum(dO * O),
    dS = P * (dP - D)); and the same with the forward in base 2, as the Triton tutorial and step 05 write
    it (S * log2(e), L = (m + log2 l) * ln 2), so the forward and the backward round S differently. What
    float32 itself costs at these scores: the yardstick of the large-score allowance (grading/spec.py,
    LARGE_SCORE_DRIFT_MULTIPLE)."""
    q, k, v, do = (t.detach().to(torch.float32) for t in (q, k, v, dout))
    mask = causal_mask(q.shape[-2], k.shape[-2], q.device) if is_causal else None

    def scores(q, k, c=1.0):
        s = (q @ k.transpose(-2, -1)) * (scale * c)
        return s.masked_fill(~mask, float("-inf")) if mask is not None else s

    def flash(lse, o):
        s = scores(q, k)
        p_b = torch.exp(s - lse)                               # the backward's P, from the saved LSE
        ds = p_b * (do @ v.transpose(-2, -1) - (do * o).sum(-1, keepdim=True))
        return (ds @ k) * scale, (ds.transpose(-2, -1) @ q) * scale, p_b.transpose(-2, -1) @ do

    q1, k1, v1 = (t.clone().requires_grad_(True) for t in (q, k, v))
    (torch.softmax(scores(q1, k1), dim=-1) @ v1).backward(do)
    s = scores(q, k)
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    base_e = flash(lse, torch.exp(s - lse) @ v)
    s2 = scores(q, k, 1.4426950408889634)                      # log2(e)
    m2 = s2.amax(dim=-1, keepdim=True)
    l2 = torch.exp2(s2 - m2).sum(dim=-1, keepdim=True)
    base_2 = flash((m2 + torch.log2(l2)) * 0.6931471805599453, (torch.exp2(s2 - m2) / l2) @ v)
    return (q1.grad, k1.grad, v1.grad), base_e, base_2


def _pattern(it: Item):
    """The grader's mask of step 09's pattern for a sparse item (spec.sparse_mask), else None."""
    if not it.extra.get("sparse"):
        return None
    window, n_global = it.extra["sparse"]
    return sparse_mask(it.q.shape[-2], it.k.shape[-2], window, n_global, it.is_causal)


def sparse_bug(quantity, actual, ref, it: Item, scale, dout, row_dim=-2) -> str | None:
    """A likely-bug sentence for step 09's pattern: the result of a mistaken pattern (the window's edge off
    by one, the global terms missing), or wrong rows confined to the global tokens."""
    window, n_global = it.extra["sparse"]
    nq, nk = it.q.shape[-2], it.k.shape[-2]
    i = torch.arange(nq)[:, None]
    j = torch.arange(nk)[None, :]
    near = (i - j).abs() < window
    glob_k, glob_q = j < n_global, i < n_global
    variants = [
        ("the window is off by one: key j = i + window is seen (j - i <= window instead of j - i < window)",
         near | (j - i == window) | glob_k | glob_q),
        ("the window is off by one: key j = i - window is seen (i - j <= window instead of i - j < window)",
         near | (i - j == window) | glob_k | glob_q),
        ("the window is off by one on both sides (|i - j| <= window instead of |i - j| < window)",
         ((i - j).abs() <= window) | glob_k | glob_q),
        ("the window is one key too narrow (|i - j| < window - 1)", ((i - j).abs() < window - 1) | glob_k | glob_q),
    ]
    if n_global:
        variants += [("the global keys are not seen by every query (the j < n_global term is missing)",
                      near | glob_q),
                     ("the global queries do not see every key (the i < n_global term is missing)", near | glob_k)]
    actual = actual.detach().to("cpu", torch.float64)
    d_true = _distance(actual, ref)
    scored = []
    for desc, m in variants:
        m = m & (j <= i) if it.is_causal else m
        if torch.equal(m, _pattern(it)):
            continue
        if quantity in ("o", "lse"):
            cand = reference_attention(it.q, it.k, it.v, it.is_causal, it.scale, mask=m)[quantity == "lse"]
        else:
            cand = reference_backward(it.q, it.k, it.v, dout, it.is_causal, it.scale, mask=m)[
                ("dq", "dk", "dv").index(quantity)]
        scored.append((_distance(actual, cand), desc))
    best = min(scored) if scored else None
    if best is not None and best[0] < 0.1 * d_true and best[0] < 5e-2:
        return f"{best[1]} (yours matches that mistake to {best[0]:.1e} of max|ref|)"
    # Wrong only in the tiles that hold the global tokens (whatever their size, up to 128 and short of the
    # sequence): those tiles visit too few tiles.
    n = actual.shape[row_dim]
    bad = ((actual - ref).abs() > 1e-3 * max(float(ref.abs().max()), 1e-30)) | torch.isnan(actual)
    other = [d for d in range(actual.dim()) if d != actual.dim() + row_dim]
    rows = bad.permute(actual.dim() + row_dim, *other).reshape(n, -1).any(dim=1).nonzero().flatten()
    ends = [-(-n_global // b) * b for b in (16, 32, 64, 128)]
    if n_global and rows.numel() and any(int(rows.max()) < e < n for e in ends):
        which = format_ranges(rows.tolist())
        if quantity in ("dk", "dv"):
            return (f"only key rows {which} are wrong, in the first key tile(s), which hold the global keys "
                    f"(0-{n_global - 1}): every query sees a global key, so the dK/dV of a key tile that holds one "
                    "must take every query tile (_query_ranges), not only the window's")
        return (f"only query rows {which} are wrong, in the first query tile(s), which hold the global queries "
                f"(0-{n_global - 1}): a global query sees every key, so a query tile that holds one must visit "
                "every key tile (_key_ranges)")
    return None


_CAPSTONE_FN = {"step04": "FlashAttention2Torch", "step06": "FlashAttentionTriton"}   # capstone.dispatch.FUNCTIONS


class Fail(Exception):
    def __init__(self, message, status=FAILED):
        super().__init__(message)
        self.status = status


def _error_text(err: dict) -> str:
    where = {"import": "importing the step", "forward": "the forward", "backward": "the backward",
             "valid": "a valid input", "warmup": "the warm-up", "dispatch": "the capstone's dispatcher",
             "training": "the capstone's training run", "ring": "the ring (on its ranks)"}.get(err.get("phase"), err.get("phase", "?"))
    text = f"{err.get('type', 'Error')} in {where}: {err.get('message', '')}".rstrip()
    if err.get("traceback"):
        text += "\n" + err["traceback"]
    return text


def _from_error(err: dict):
    status = NOT_IMPLEMENTED if err.get("type") == "NotImplementedError" else ERROR
    if status == NOT_IMPLEMENTED:
        raise Fail(f"not implemented: {err.get('message', '')}", status)
    raise Fail(_error_text(err), status)


class Evaluator:
    """Scores the checks of one step's items against the reference."""

    def __init__(self, diagnose_first: int = 3):
        self.diagnose_first = diagnose_first
        self.failures_in: dict[str, int] = {}
        self.refs: dict[int, Refs] = {}

    # -- references, computed once per item ---------------------------------
    def _refs(self, it: Item) -> Refs:
        r = self.refs.setdefault(id(it), Refs())
        if r.o is None:
            r.o, r.lse = reference_attention(it.q, it.k, it.v, it.is_causal, it.scale, mask=_pattern(it))
        return r

    def _grads(self, it: Item):
        r = self._refs(it)
        if r.grads is None:
            r.grads = reference_backward(it.q, it.k, it.v, it.dout, it.is_causal, it.scale, mask=_pattern(it))
        return r.grads

    def _drift(self, it: Item, scale: float):
        """Per gradient, the larger max|fp32 - float64| of the two honest fp32 computations."""
        r = self._refs(it)
        if r.drift is None:
            refs = self._grads(it)
            runs = fp32_backwards(it.q, it.k, it.v, it.dout, it.is_causal, scale)
            r.drift = tuple(max(float((run[i].double() - refs[i]).abs().max()) for run in runs)
                            for i in range(3))
        return r.drift

    def _hint(self, group, fn):
        """A likely-bug diagnosis for the first few failures of a group only (it is slow)."""
        n = self.failures_in.get(group, 0)
        if n >= self.diagnose_first:
            return None
        return fn

    def _close(self, group, actual, expected, *, name, it: Item, quantity, dtype=None, row_dim=-2,
               row_label="query rows", dout=None, tiles=None):
        ctx = describe(it.q, it.k, it.is_causal, it.scale).replace(", cpu,", f", {it.device},")
        scale = it.scale if it.scale is not None else 1 / math.sqrt(it.q.shape[-1])
        # tiles: the forward's own (Bq, Bk) as its Triton launches gave them (worker._forward_tiles);
        # without them the diagnosis simulates the usual sizes.
        sizes = {"tile": tiles["k"], "tile_q": tiles["q"]} if tiles and quantity in ("o", "lse") else {}
        if it.extra.get("sparse"):
            # Step 09's pattern: the dense mistakes of likely_bug are measured against the dense truth;
            # this one names the pattern's own.
            window, n_global = it.extra["sparse"]
            ctx += f", window={window}, n_global={n_global}"
            hint = self._hint(group, lambda: sparse_bug(quantity, actual, expected, it, scale, dout, row_dim))
        else:
            hint = self._hint(group, lambda: likely_bug(quantity, actual, it.q, it.k, it.v, is_causal=it.is_causal,
                                                        scale=scale, dout=dout, row_dim=row_dim, **sizes))
        try:
            assert_close(actual, expected, name=name, dtype=dtype or it.dtype, row_dim=row_dim,
                         row_label=row_label, context=ctx, hint=hint)
        except CompareError as exc:
            raise Fail(str(exc)) from None

    # -- the checks ------------------------------------------------------------
    def _output(self, it: Item, rec: dict, key="o", what="attention"):
        t = rec["tensors"].get(key)
        if t is None:
            raise Fail(f"{what} must return one tensor, got {rec['meta'].get('o_type', 'nothing')}")
        if t.dtype != it.dtype:
            raise Fail(f"the output's dtype is wrong: {what} returned {t.dtype} for {it.dtype} inputs; return it in "
                       f"the input dtype, {it.dtype} (this course never casts silently). Accumulate in float32 "
                       f"inside if you like, then cast the result back (o.to(q.dtype)) before returning it"
                       + (" -- an fp32 output is what a low-precision kernel that never casts back returns"
                          if t.dtype == torch.float32 and it.dtype in (torch.float16, torch.bfloat16) else ""))
        dev = str(rec["meta"].get("o_device", ""))
        if dev.split(":")[0] != it.device:
            raise Fail(f"the output must be on {it.device}, like the inputs, got {dev}")
        return t

    def check_o(self, c: Check, it: Item, rec: dict):
        err = rec.get("error")
        if err and err.get("phase") == "forward":
            _from_error(err)
        o = self._output(it, rec)
        self._close(c.group, o, self._refs(it).o, name="O", it=it, quantity="o", tiles=rec["meta"].get("tiles"))

    def check_grads(self, c: Check, it: Item, rec: dict):
        if rec.get("error"):
            _from_error(rec["error"])
        self._output(it, rec)
        if not rec["meta"].get("requires_grad"):
            raise Fail("the output does not require grad: the autograd graph is cut "
                       "(a .detach(), a torch.no_grad() or a tensor made from .data?)")
        refs = self._grads(it)
        factor = it.expect.get("q_factor", 1.0)
        large = factor != 1.0 and it.dtype == torch.float32
        for i, ((name, key, rows), ref) in enumerate(zip((("dQ", "dq", "query rows"), ("dK", "dk", "key rows"),
                                                         ("dV", "dv", "key rows")), refs)):
            g = rec["tensors"].get(key)
            if g is None:
                raise Fail(f"{name} is None: the backward returned no gradient for {key[1]}")
            if g.dtype != it.dtype:
                raise Fail(f"{name} must be in the input dtype {it.dtype}, got {g.dtype}")
            if large:
                self._close_large(c.group, g, ref, i, name=name, it=it, quantity=key, rows=rows, factor=factor)
            else:
                self._close(c.group, g, ref, name=name, it=it, quantity=key, row_label=rows, dout=it.dout)

    def _close_large(self, group, g, ref, i, *, name, it: Item, quantity, rows, factor):
        """A gradient at large scores: the base tolerance plus LARGE_SCORE_DRIFT_MULTIPLE times what an
        honest float32 computation of the same inputs misses by (spec.py says why, README how)."""
        scale = it.scale if it.scale is not None else 1 / math.sqrt(it.q.shape[-1])
        drift = self._drift(it, scale)[i]
        allowance = LARGE_SCORE_DRIFT_MULTIPLE * drift
        atol, rtol = tolerance_for(torch.float32)
        _, _, err, bad, _ = measure(g, ref, atol, rtol, extra=allowance)
        if not bool(bad.any()):
            return
        n_bad = int(bad.sum())
        worst = float(torch.where(torch.isnan(err), torch.full_like(err, math.inf), err).max())
        note = (f"  large scores (q x {factor:g}: scores of a few hundred): float32 itself misses here -- an honest "
                f"fp32 computation of these inputs (softmax + autograd; or P = exp(S - L) from the fp32 LSE, its forward in base e "
                f"or base 2) is off "
                f"by up to {drift:.3g} in {name} -- so this check allows {LARGE_SCORE_DRIFT_MULTIPLE:g} x that "
                f"({allowance:.3g}) on top of the tolerance above; {n_bad:,} of {err.numel():,} elements are past "
                f"even that (worst |err| {worst:.4g}).\n"
                f"  what to check first: every exp() of the backward takes S minus the row's LSE (P = exp(S - L)), "
                f"never exp(S) alone or exp(S) / exp(L) -- at these scores exp(S) overflows -- and L is the float32 "
                f"LSE the forward saved (m + log(l), with the running max m), not recomputed or rounded to a lower "
                f"precision")
        try:
            self._close(group, g, ref, name=name, it=it, quantity=quantity, row_label=rows, dout=it.dout)
        except Fail as exc:
            raise Fail(f"{exc}\n{note}") from None
        raise Fail(f"{name} does not match the reference at large scores\n{note}")    # (not reached: past both bounds)

    def check_o_grads(self, c, it, rec):
        self.check_o(c, it, rec)
        self.check_grads(c, it, rec)

    def check_lse(self, c: Check, it: Item, rec: dict):
        if rec.get("error"):
            _from_error(rec["error"])
        if "lse" not in rec["tensors"]:
            raise Fail(f"{it.extra['fn']} must return a pair (O, LSE) of tensors, "
                       f"got {rec['meta'].get('o_type')} of length {rec['meta'].get('len')}")
        o = self._output(it, rec, what=it.extra["fn"])
        r = self._refs(it)
        tiles = rec["meta"].get("tiles")
        self._close(c.group, o, r.o, name="O", it=it, quantity="o", tiles=tiles)
        self._lse(c.group, rec["tensors"]["lse"], it, tiles=tiles)

    def _lse(self, group, lse, it: Item, what="the LSE", tiles=None):
        want = tuple(it.q.shape[:-1])
        if tuple(lse.shape) != want:
            raise Fail(f"{what} must be shaped (..., Nq) = {want}, got {tuple(lse.shape)}")
        if lse.dtype != torch.float32:
            raise Fail(f"{what} must be float32 whatever the input dtype, got {lse.dtype}")
        self._close(group, lse, self._refs(it).lse, name="LSE", it=it, quantity="lse",
                    dtype=torch.float32, row_dim=-1, tiles=tiles)

    def check_saved(self, c: Check, it: Item, rec: dict):
        if rec.get("error"):
            _from_error(rec["error"])
        meta = rec["meta"]
        flash = [n for n in meta.get("module_functions", []) if n.startswith("FlashAttention")]
        if not flash:
            raise Fail("the step exposes no torch.autograd.Function named FlashAttention<Something> "
                       f"(found: {meta.get('module_functions') or 'none'})")
        if not meta.get("functions"):
            raise Fail("attention's output was not made by a custom autograd.Function: "
                       f"route it through {flash[0]}.apply")
        saved = [rec["tensors"][k] for k in sorted(rec["tensors"], key=lambda s: int(s.split("_")[1]))]
        batch, nq, nk = tuple(it.q.shape[:-2]), it.q.shape[-2], it.k.shape[-2]
        big = [t for t in saved if t.numel() >= math.prod(batch) * nq * nk]
        if big:
            raise Fail(f"{meta.get('function')} saves a tensor of shape {tuple(big[0].shape)}, as large as the "
                       f"Nq x Nk score matrix: save only Q, K, V, O and the LSE, and recompute P in the backward")
        want = tuple(it.q.shape[:-1])
        lse_like = [t for t in saved if tuple(t.shape) == want]
        if len(lse_like) != 1:
            shapes = [tuple(t.shape) for t in saved]
            raise Fail(f"{meta.get('function')} must save exactly one log-sum-exp tensor shaped (..., Nq) = "
                       f"{want}; it saves {len(lse_like)} (all saved shapes: {shapes})"
                       + (": save L = m + log(l), not m and l" if len(lse_like) > 1 else ""))
        self._lse(c.group, lse_like[0], it, what=f"the LSE {meta.get('function')} saves")

    def check_raises(self, c: Check, it: Item, rec: dict):
        if rec.get("error"):
            _from_error(rec["error"])
        raised = rec["meta"].get("raised")
        if raised == "ValueError":
            return
        what = it.extra["what"]
        if raised is None:
            raise Fail(f"attention accepted a bad input ({what}) without raising: call check_inputs(...) first")
        raise Fail(f"a bad input ({what}) raised {raised}, not ValueError: {rec['meta'].get('message', '')}")

    def check_backend(self, c: Check, it: Item, rec: dict):
        b = it.extra["backend"]
        if it.expect["accepts"]:
            if rec.get("error"):
                _from_error(rec["error"])
            ran = rec["meta"].get("ops", [])
            if not set(ran) & set(SDPA_OPS[b]):
                raise Fail(f"backend={b!r} was asked for but {ran or 'no SDPA kernel'} ran: "
                           "wrap the call in `with sdpa_kernel([BACKENDS[backend]])`")
            self._close(c.group, self._output(it, rec), self._refs(it).o, name="O", it=it, quantity="o")
            return
        err = rec.get("error")
        if err is None:
            raise Fail(f"backend={b!r} refuses these inputs (PyTorch raises RuntimeError) but attention returned "
                       "a result: is the backend argument ignored? Run the call inside "
                       "`with sdpa_kernel([BACKENDS[backend]])`")
        if err.get("type") != "RuntimeError":
            _from_error(err)

    def check_chosen(self, c: Check, it: Item, rec: dict):
        if rec.get("error"):
            _from_error(rec["error"])
        got, want = rec["meta"].get("chosen"), it.expect["chosen"]
        if got != want:
            raise Fail(f"chosen_backend returned {got!r}, but PyTorch's dispatcher picks {want!r} for these inputs")

    def check_time(self, c: Check, it: Item, rec: dict):
        if rec.get("error"):
            _from_error(rec["error"])
        ms = rec["meta"].get("ms")
        if not isinstance(ms, float) or not math.isfinite(ms) or ms <= 0:
            raise Fail(f"no time measured (got {ms!r})")

    def check_warmup(self, c: Check, it: Item, rec: dict):
        """Step 05's warm-ups: the helper's result against its PyTorch spec (attnlib/warmups.py)."""
        from attnlib.warmups import WarmupError, check_call
        if rec.get("error"):
            _from_error(rec["error"])
        if not int(rec.get("guard", {}).get("triton_warmup", 0)):
            raise Fail(f"{it.extra['fn']} launched no Triton kernel: the warm-up must run its kernel, which calls "
                       "your helper")
        n = int(rec["meta"].get("n_out", 0))
        outs = [rec["tensors"].get(f"out{i}") for i in range(n)]
        if not outs or any(t is None for t in outs):
            raise Fail(f"{it.extra['fn']} must return tensors, got {rec['meta'].get('o_type', 'nothing')}")
        try:
            check_call(it.extra["fn"], it.extra["args"], it.extra["kwargs"], outs if n > 1 else outs[0])
        except WarmupError as exc:
            raise Fail(str(exc)) from None

    # -- the capstone ------------------------------------------------------------
    def check_dispatch(self, c: Check, it: Item, rec: dict):
        """capstone.dispatch takes the step: its trial call runs, and ``auto`` picks it where it should."""
        err = rec.get("error")
        if err and err.get("phase") == "dispatch":
            _from_error(err)
        impl, meta = it.extra["impl"], rec["meta"]
        trial = meta.get("trial")
        if trial is not None:
            status = NOT_IMPLEMENTED if str(trial).startswith("not implemented yet") else FAILED
            raise Fail(f"the capstone's dispatcher passes over your {impl}: {trial}\n  It calls "
                       f"{_CAPSTONE_FN[impl]}.apply(q, k, v, is_causal, scale) on a slice of the model's inputs, "
                       "forward and backward (capstone/dispatch.py, _probe); whatever fails there, the model "
                       "falls back to a slower attention. `python -m capstone explain --code steps` shows it.",
                       status)
        want, got = it.expect.get("chosen"), meta.get("chosen")
        if want and got != want:
            why = dict(meta.get("passed_over") or []).get(impl, "its trial call ran")
            raise Fail(f"the capstone's dispatcher picks {got!r} on these inputs ({it.device}, float32, "
                       f"D = {it.q.shape[-1]}, causal), not your {impl}: {why}")

    def _capstone_reference(self, it: Item) -> torch.Tensor:
        """The same run with SDPA's math backend, here in the grader, on the CPU: its losses."""
        r = self.refs.setdefault(id(it), Refs())
        if r.o is None:
            from capstone.model import GPT, GPTConfig
            ex = it.extra
            model = GPT(GPTConfig(**ex["model"], attn="math"))
            model.load_state_dict(ex["state"])
            opt = torch.optim.AdamW(model.parameters(), lr=float(ex["lr"]), weight_decay=0.0)
            losses = []
            for i in range(ex["tokens"].shape[0]):
                _, loss = model(ex["tokens"][i, :, :-1], ex["tokens"][i, :, 1:])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                losses.append(float(loss.detach()))
            r.o = torch.tensor(losses, dtype=torch.float64)
        return r.o

    def check_train(self, c: Check, it: Item, rec: dict):
        """The tiny GPT trained with the step follows the SDPA-math run's losses to CAPSTONE_ATOL."""
        impl = it.extra["impl"]
        err = rec.get("error")
        losses = rec["tensors"].get("losses")
        done = 0 if losses is None else losses.numel()
        if err:
            if err.get("phase") == "training" and err.get("type") != "NotImplementedError":
                err = dict(err, message=f"{err.get('message', '')} (after {done} training step(s))")
            _from_error(err)
        ref = self._capstone_reference(it)
        if losses is None or losses.shape != ref.shape:
            raise Fail(f"the training run sent back {done} losses, expected {ref.numel()}")
        if not torch.isfinite(losses).all():
            bad = int((~torch.isfinite(losses)).nonzero()[0])
            raise Fail(f"the loss is {float(losses[bad])} at training step {bad} with your {impl}: the attention "
                       "made a NaN or an inf in the model (a row whose softmax sum is 0? an exp without the "
                       "running max?)")
        diff = (losses - ref).abs()
        if float(diff.max()) <= CAPSTONE_ATOL:
            return
        first = int((diff > CAPSTONE_ATOL).nonzero()[0])
        show = lambda t: "[" + ", ".join(f"{float(x):.5f}" for x in t) + "]"       # noqa: E731
        text = (f"the tiny GPT's loss with your {impl} leaves the SDPA-math run's at training step {first} "
                f"(by {float(diff[first]):.2e}; the tolerance is {CAPSTONE_ATOL:g}, worst {float(diff.max()):.2e})\n"
                f"  yours:     {show(losses)}\n  reference: {show(ref)}\n")
        if first == 0:
            text += ("  likely bug: step 0's loss is the forward alone, on the initial weights: your attention's "
                     "output is wrong in the model although the forward group passes. The model's q, k, v are "
                     "views of one qkv projection, (B, H, T, D) and not contiguous (stride 3*C along T), and "
                     "it always asks for is_causal=True: read every stride of every input, and check the mask")
        else:
            text += ("  likely bug: step 0 matches (the forward is right), so the gradients are wrong in the "
                     "model although the backward group passes: there q, k, v are strided views of one "
                     "projection and dO arrives as a view too (not contiguous, other strides than Q's): "
                     "check that each tensor's loads use that tensor's own strides")
        raise Fail(text)

    # -- step 10: the ring on several ranks ----------------------------------------
    def _ring_failures(self, it: Item, rec: dict) -> list:
        """``[(tensor name, rank, report)]`` for every wrong tensor of every rank (attnlib.ringcheck),
        computed once per item: the forward and the backward check share it."""
        from attnlib.ringcheck import RingCase, rank_failures
        r = self.refs.setdefault(id(it), Refs())
        if getattr(r, "ring", None) is None:
            world = int(rec["meta"].get("world", it.extra["world"]))
            case = RingCase(batch=tuple(it.q.shape[:-2]), n=it.q.shape[-2], d=it.q.shape[-1],
                            is_causal=it.is_causal, scale=it.scale)
            scale = it.scale if it.scale is not None else 1 / math.sqrt(it.q.shape[-1])
            ref_o, ref_lse = reference_attention(it.q, it.k, it.v, it.is_causal, it.scale)
            refs = (ref_o, *self._grads(it)) if it.grads else (ref_o,)
            factor = it.expect.get("q_factor", 1.0)
            allowance = None
            if it.grads and factor != 1.0:      # large scores: what honest fp32 misses by, as in check_grads
                drift = self._drift(it, scale)
                allowance = {name: (LARGE_SCORE_DRIFT_MULTIPLE * d, d, factor)
                             for name, d in zip(("dQ", "dK", "dV"), drift)}
            failures = []
            for rank in range(world):
                got = {key: rec["tensors"].get(f"{key}{rank}") for key in ("o", "lse", "dq", "dk", "dv")}
                missing = [k for k in (("o", "lse", "dq", "dk", "dv") if it.grads else ("o", "lse")) if got[k] is None]
                names = {"o": "O", "lse": "LSE", "dq": "dQ", "dk": "dK", "dv": "dV"}
                if "o" in missing or "lse" in missing:
                    failures += [(names[k], rank, f"rank {rank} returned no {names[k]}: ring_attention must return "
                                  "this rank's O, ring_attention_with_lse the pair (O, LSE)") for k in missing]
                    continue
                failures += rank_failures(got, rank, world, case, (it.q, it.k, it.v, it.dout, scale), ref_lse, refs,
                                          allowance=allowance)
            order = {"LSE": 0, "O": 1, "dQ": 2, "dK": 3, "dV": 4}
            r.ring = (case, world, sorted(failures, key=lambda f: (order[f[0]], f[1])))
        return r.ring

    def _ring_check(self, it: Item, rec: dict, names: tuple, where: str):
        from attnlib.ringcheck import describe_rows
        err = rec.get("error")
        if err:
            _from_error(err)
        case, world, failures = self._ring_failures(it, rec)
        mine = [f for f in failures if f[0] in names]
        if not mine:
            return
        summary = ", ".join(f"{n} on rank {r}" for n, r, _ in mine)
        layout = "; ".join(f"rank {r} holds {describe_rows(case.n, world, r, case.is_causal)}" for r in range(world))
        raise Fail(f"ring attention on {world} ranks ({where}), case {case.id}: wrong {summary}\n"
                   f"  ({layout})\n" + mine[0][2])

    def check_ring_o(self, c: Check, it: Item, rec: dict):
        self._ring_check(it, rec, ("LSE", "O"), "forward")

    def check_ring_grads(self, c: Check, it: Item, rec: dict):
        self._ring_check(it, rec, ("dQ", "dK", "dV"), "backward")

    def check_ring_layout(self, c: Check, it: Item, rec: dict):
        from attnlib.ringcheck import positions
        if rec.get("error"):
            _from_error(rec["error"])
        world, n, causal = it.extra["world"], it.extra["n"], it.is_causal
        how = (f"rank r holds chunk r, then chunk 2W-1-r, of 2W = {2 * world} chunks" if causal else
               f"rank r holds rows [r N/W, (r+1) N/W)")
        for r in range(world):
            got = rec["tensors"].get(f"shard{r}")
            want = positions(n, world, r, causal).tolist()
            rows = got[0, 0, :, 0].long().tolist() if got is not None and got.dim() == 4 and got.shape[:2] == (1, 2) else None
            if rows != want or tuple(got.shape) != (1, 2, len(want), 3):
                raise Fail(f"shard(x, {world}, {r}, is_causal={causal}) of a sequence of {n} rows (row i holds i) "
                           f"gives {('rows ' + str(rows)) if rows is not None else 'a tensor of shape ' + str(tuple(got.shape)) if got is not None else 'nothing'}, "
                           f"expected rows {want}: {how}")
        got = rec["tensors"].get("unshard")
        rows = got[0, 0, :, 0].long().tolist() if got is not None and got.dim() == 4 else None
        if rows != list(range(n)) or tuple(got.shape) != (1, 2, n, 3):
            raise Fail(f"unshard of the {world} ranks' {'zigzag' if causal else 'contiguous'} shards gives "
                       f"{('rows ' + str(rows)) if rows is not None else 'no sequence'}, not 0..{n - 1}: "
                       + ("the first chunks go in rank order, then the second chunks in reverse rank order"
                          if causal else "the shards go back in rank order"))

    CHECKS = {"o": check_o, "grads": check_grads, "o+grads": check_o_grads, "lse": check_lse,
              "saved": check_saved, "raises": check_raises, "backend": check_backend,
              "chosen": check_chosen, "time": check_time, "warmup": check_warmup,
              "dispatch": check_dispatch, "train": check_train,
              "ring_o": check_ring_o, "ring_grads": check_ring_grads, "ring_layout": check_ring_layout}

    def evaluate(self, c: Check, it: Item, rec: dict) -> CheckResult:
        try:
            self.CHECKS[c.what](self, c, it, rec)
        except Fail as f:
            self.failures_in[c.group] = self.failures_in.get(c.group, 0) + 1
            return CheckResult(c.group, c.name, f.status, str(f), rec.get("seconds", 0.0))
        return CheckResult(c.group, c.name, PASSED, "", rec.get("seconds", 0.0))


# ---------------------------------------------------------------------------
# Rules
# ---------------------------------------------------------------------------

@dataclass
class RuleResult:
    rule: str
    ok: bool
    message: str = ""
    evaluated: bool = True


def evaluate_rules(rules, items: list[Item], records: dict, ran_ok: set,
                   observed: dict | None = None, import_guard: dict | None = None) -> list[RuleResult]:
    """Decide each rule from the worker's counters. ``ran_ok``: indices of items whose call succeeded.

    ``observed``: what the grader saw itself, to cross-check the counters where it can:
    ``inductor_files`` / ``triton_files``, the files in the worker's compile caches (None: not
    checkable here, e.g. Triton's interpreter compiles nothing). ``import_guard``: the counters
    while the step was imported (the instruments watch the import too): the reference or SDPA
    called there breaks its rule like a call made while a check runs.
    """
    observed = observed or {}
    out = []
    guards = {i: records[i].get("guard", {}) for i in records}
    at_import = import_guard or {}

    def total(key, only=None):
        return sum(int(g.get(key, 0)) for i, g in guards.items() if only is None or i in only)

    for rule in rules:
        # SDPA blocked at the dispatcher, or the worker's absent reference, makes the call fail: nothing
        # ran, but the rule was broken.
        tried = ((rule == "no_sdpa" and total("sdpa_fwd") + total("sdpa_bwd") + int(at_import.get("sdpa_import", 0)))
                 or (rule == "no_reference" and total("reference") + int(at_import.get("reference", 0))))
        if not ran_ok and not tried:
            out.append(RuleResult(rule, True, "not checked: nothing ran", evaluated=False))
            continue
        if rule == "no_reference":
            n, i = total("reference"), int(at_import.get("reference", 0))
            out.append(RuleResult(rule, n + i == 0, f"the submission called attnlib's reference_attention/"
                                  f"reference_backward {n} time(s) while it ran" + (f" (and {i} at import)" if i else "")
                                  + ": the grade compares against that reference, so a step must compute "
                                  "attention itself" if n + i else ""))
        elif rule == "compiled":
            # Graphs compiled while a graded call ran (not at import: a decoy compiled there, with attention
            # run eagerly, must not pass); ``dynamo_graphs`` is every graph compiled in the worker.
            n = total("dynamo_graphs_call")
            ever = max([int(g.get("dynamo_graphs", 0)) for g in guards.values()]
                       + [int(at_import.get("dynamo_graphs", 0))])
            files = observed.get("inductor_files")
            if n == 0:
                out.append(RuleResult(rule, False, "torch.compile never compiled a graph while attention ran"
                                      + (f" ({ever} graph(s) were compiled, all outside the graded calls: at "
                                         "import or before)" if ever else "")
                                      + ": compiled_naive() must return torch.compile(naive_attention, ...) and "
                                      "attention must call it"))
            elif files == 0:     # the grader's own look: Inductor writes the code it generates to the cache
                out.append(RuleResult(rule, False, f"the worker reports {n} compiled graph(s), but Inductor generated "
                                      "no code (compile caches are empty): torch.compile with the default "
                                      "backend (Inductor) is the point of this step"))
            elif total("eager_attention_ops"):
                # Graphs were compiled, but the attention's own work ran outside them: a decoy compiled inside
                # attention (hostile/compile_decoy_inside), or a graph break / a fallback to eager around the softmax.
                calls = sum(1 for g in guards.values() if int(g.get("eager_attention_ops", 0)))
                what = next((g["eager_desc"] for g in guards.values() if g.get("eager_desc")), "")
                out.append(RuleResult(rule, False, f"torch.compile compiled {n} graph(s) while attention ran, but "
                                      f"the attention itself ran eagerly in {calls} call(s): "
                                      f"{total('eager_attention_ops')} aten op(s) as large as the score matrix ran "
                                      f"outside the code Inductor generated (first: {what}). Compiling something "
                                      "else does not count: attention must return compiled_naive()(q, k, v, ...), "
                                      "torch.compile(naive_attention, ...) with no graph break in it (a print, "
                                      ".item(), a call Dynamo skips) and no torch._dynamo.disable around it"))
            else:
                out.append(RuleResult(rule, True))
        elif rule == "no_sdpa":
            f, b, i = total("sdpa_fwd"), total("sdpa_bwd"), int(at_import.get("sdpa_import", 0))
            out.append(RuleResult(rule, f + b + i == 0, f"F.scaled_dot_product_attention ran {f} time(s) in the "
                                  f"forward and {b} in the backward" + (f" (and {i} at import)" if i else "")
                                  + ": this step must compute attention without it" if f + b + i else ""))
        elif rule == "no_nxn":
            probes = [i for i, it in enumerate(items) if it.nxn_probe]
            bad, msg = False, ""
            for i in probes:
                it = items[i]
                limit = NXN_FRACTION * math.prod(it.q.shape[:-2]) * it.q.shape[-2] * it.k.shape[-2]
                rec = records.get(i)
                n = it.q.shape[-2]
                headroom = it.extra.get("headroom_mb")
                if rec is None or rec.get("error"):
                    err = rec.get("error") if rec else None
                    if headroom:     # the memory probe: the OS refused what the call asked for, or it broke
                        nxn_mb = math.prod(it.q.shape[:-2]) * n * it.k.shape[-2] * 4 / 2 ** 20
                        bad, msg = True, (f"at Nq = Nk = {n} ({'causal' if it.is_causal else 'full'}), run with "
                                          f"{headroom} MiB of {'GPU ' if it.extra.get('gpu') else ''}memory on top "
                                          f"of what the worker held (an Nq x Nk float32 matrix takes {nxn_mb:.0f} "
                                          "MiB; Bq x Bk tiles or Nq x Bk strips a few MiB), the "
                                          + (f"{err.get('phase', 'call')} failed ({err.get('type')}: "
                                             f"{err.get('message', '')[:200]})" if err else "call never came back")
                                          + ": an Nq x Nk tensor, or Nq x Nk worth of smaller ones kept alive "
                                          "(by autograd?). Keep only the running max, sum and accumulator, and "
                                          "save only O and the LSE for the backward")
                        break
                    bad, msg = True, (f"the Nq = Nk = {n} probe of the N x N rule did not run"
                                      + (f" ({err.get('type')}: {err.get('message', '')[:200]})" if err else "")
                                      + ": the rule cannot be checked, so it counts as broken")
                    break
                out_ = rec.get("outside") or {}
                grew = out_.get("rss_peak_mb", 0.0) - out_.get("rss_start_mb", 0.0)
                if headroom and not it.extra.get("gpu") and grew > headroom + RSS_SLACK_MB:
                    bad, msg = True, (f"at Nq = Nk = {n} ({'causal' if it.is_causal else 'full'}), the worker's "
                                      f"resident memory rose {grew:.0f} MiB during the call (measured by the grader "
                                      f"from outside), past the {headroom} MiB it was given (the cap was lifted?): "
                                      "an Nq x Nk tensor, or Nq x Nk worth of smaller ones kept alive. Keep only "
                                      "the running max, sum and accumulator")
                    break
                peak = rec.get("meta", {}).get("gpu_peak_mb")
                if headroom and peak is not None and peak > headroom:
                    bad, msg = True, (f"at Nq = Nk = {n} ({'causal' if it.is_causal else 'full'}), the call's peak "
                                      f"CUDA memory rose {peak:.0f} MiB over its start, past the {headroom} MiB it was "
                                      "given (the cap was lifted?): an Nq x Nk tensor, or Nq x Nk worth of smaller "
                                      "ones kept alive. Keep only the running max, sum and accumulator")
                    break
                g = rec.get("guard", {})
                if int(g.get("max_numel", 0)) >= limit:
                    bad, msg = True, (f"at Nq = Nk = {it.q.shape[-2]}, {g.get('max_desc', '?')}: an Nq x Nk tensor. "
                                      "Work on Bq x Bk tiles (or Nq x Bk strips) and keep only the running "
                                      "max, sum and accumulator")
                    break
            out.append(RuleResult(rule, not bad, msg))
        elif rule in ("triton_fwd", "triton_bwd"):
            phase = rule[-3:]
            n = total(f"triton_{phase}", ran_ok)
            where = "forward" if phase == "fwd" else "backward"
            if n == 0:
                out.append(RuleResult(rule, False, f"no Triton kernel was launched in the {where}: this step's "
                                      f"{where} must run your @triton.jit kernel"))
            elif observed.get("triton_files") == 0:
                out.append(RuleResult(rule, False, f"the worker reports {n} Triton launch(es) in the {where}, but "
                                      "no Triton kernel was compiled (the Triton cache is empty)"))
            else:
                out.append(RuleResult(rule, True))
        elif rule == "extension":
            n = total("extension", ran_ok)
            out.append(RuleResult(rule, n > 0, "the compiled extension was never called: attention must run "
                                  "your CUDA kernels (through the module torch.utils.cpp_extension built)" if n == 0 else ""))
        else:  # pragma: no cover - the table and this function go together
            raise ValueError(rule)
    return out
