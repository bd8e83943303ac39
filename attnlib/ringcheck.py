"""Step 10's check: ring attention on every rank of a group against single-process attention.

Every rank draws the same whole-sequence q, k, v, dO from one seed, takes its own rows (the course's
layout, ``positions``: contiguous, or zigzag when causal; never the student's ``shard``, which has
its own test), runs ``ring_attention`` forward and backward, and sends back its O, dQ, dK, dV. Here,
in one process, each rank's tensors are compared with the float64 reference's rows of that rank
(``attnlib.compare.assert_close``, the course's one tolerance policy). On a failure the report says
which rank and which rows (as sequence positions and zigzag chunks) are wrong, and, when it can tell,
which ring bug it looks like: a K/V block missing or counted twice, the LSE merge overflowing, dK/dV
not brought home.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch

from .compare import CompareError, assert_close, format_ranges, measure, tolerance_for
from .contract import STEPS, check_inputs
from .inputs import make_dout, make_qkv
from .reference import reference_attention, reference_backward

RING_STEP = 10
RING_MODULE = "step10_ring"


def load_ring(impl=None):
    """Step 10's module from the implementation folder (``$ATTN_IMPL``)."""
    from .loader import load_step
    if RING_STEP in STEPS:
        return load_step(RING_STEP, impl)
    # Until STEPS lists step 10 (the lead adds it when merging), import it by name the same way.
    import importlib
    from .loader import _package_for, impl_root
    root = impl_root(impl)
    if not (root / f"{RING_MODULE}.py").exists():
        raise FileNotFoundError(f"{root / RING_MODULE}.py is missing")
    return importlib.import_module(f"{_package_for(root)}.{RING_MODULE}")


def positions(n, world, rank, is_causal):
    """The sequence positions rank ``rank`` holds: contiguous, or zigzag chunks (rank, 2W-1-rank)."""
    if not is_causal:
        c = n // world
        return torch.arange(rank * c, (rank + 1) * c)
    c = n // (2 * world)
    return torch.cat([torch.arange(rank * c, (rank + 1) * c),
                      torch.arange((2 * world - 1 - rank) * c, (2 * world - rank) * c)])


def describe_rows(n, world, rank, is_causal):
    """'sequence rows 4-7, 8-11 (zigzag chunks 1 and 2 of 4)' for rank ``rank``."""
    rows = format_ranges(positions(n, world, rank, is_causal).tolist())
    if is_causal:
        return f"sequence rows {rows} (zigzag chunks {rank} and {2 * world - 1 - rank} of 0-{2 * world - 1})"
    return f"sequence rows {rows} (contiguous)"


@dataclass(frozen=True)
class RingCase:
    batch: tuple = (1, 2)
    n: int = 32                 # the whole sequence; each of W ranks holds n / W rows
    d: int = 16
    is_causal: bool = False
    scale: float | None = None
    gain: float = 1.0           # q is multiplied by it: gain 40 puts LSEs near 100 (the merge's overflow)
    seed: int = 0
    kernel: str = "auto"
    dtype: str = "float32"
    device: str = "cpu"         # where the ranks compute (bench/ring_gpu.py: "cuda"); checks run on the CPU

    @property
    def id(self):
        b = "x".join(map(str, self.batch))
        return (f"{b}-n{self.n}-d{self.d}-{'causal' if self.is_causal else 'full'}"
                + (f"-gain{self.gain:g}" if self.gain != 1 else "")
                + (f"-scale{self.scale:g}" if self.scale is not None else "")
                + (f"-{self.kernel}" if self.kernel != "auto" else ""))


def make_inputs(case: RingCase):
    """The whole sequence's q, k, v and dO on the CPU (every rank draws the same ones)."""
    dtype = getattr(torch, case.dtype)
    q, k, v = make_qkv(batch_shape=case.batch, Nq=case.n, D=case.d, seed=case.seed)
    q = q * case.gain
    q, k, v = (t.to(dtype) for t in (q, k, v))
    return q, k, v, make_dout(q, seed=case.seed + 1)


def ring_job(rank, world, case: RingCase, grads=True):
    """Runs on every rank: this rank's rows through ``ring_attention``; returns its O (and grads)."""
    step = load_ring(os.environ.get("ATTN_IMPL"))
    q, k, v, dout = make_inputs(case)
    idx = positions(case.n, world, rank, case.is_causal)
    qs, ks, vs = (t[..., idx, :].to(case.device).requires_grad_(grads) for t in (q, k, v))
    kw = {} if case.kernel == "auto" else {"kernel": case.kernel}
    o = step.ring_attention(qs, ks, vs, is_causal=case.is_causal, scale=case.scale, **kw)
    _, lse = step.ring_attention_with_lse(qs.detach(), ks.detach(), vs.detach(), is_causal=case.is_causal,
                                          scale=case.scale, **kw)
    out = {"o": o.detach(), "lse": lse}
    if grads:
        o.backward(dout[..., idx, :].to(case.device))
        out.update(dq=qs.grad, dk=ks.grad, dv=vs.grad)
    return {key: (t.cpu() if t is not None else None) for key, t in out.items()}


# ---------------------------------------------------------------------------
# The diagnosis: what a wrong rank's tensor looks like
# ---------------------------------------------------------------------------

def _close(a, b, dtype):
    atol, rtol = tolerance_for(dtype)
    *_, bad, _ = measure(a, b, 10 * atol, 10 * rtol)
    return not bool(bad.any())


def _what_if(q, k, v, dout, is_causal, scale, key_weight):
    """O, dQ, dK, dV, LSE (float64) of attention where key j's weight is multiplied by ``key_weight[j]``."""
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    s = q64 @ k64.transpose(-2, -1) * scale
    if is_causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    s = s + torch.log(key_weight.double())                  # weight 0 -> -inf: the key is left out
    o = torch.softmax(s, -1) @ v64
    o.backward(dout.double())
    return o.detach(), q64.grad, k64.grad, v64.grad, torch.logsumexp(s.detach(), -1)[..., None]


def _dq_shares(q, k, v, dout, is_causal, scale, world):
    """dQ's share from each rank's K/V block (float64, whole sequence): they add up to dQ."""
    q64, k64, v64, do64 = (t.detach().double() for t in (q, k, v, dout))
    n = k.shape[-2]
    s = q64 @ k64.transpose(-2, -1) * scale
    if is_causal:
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    p = torch.softmax(s, -1)
    o = p @ v64
    ds = p * (do64 @ v64.transpose(-2, -1) - (do64 * o).sum(-1, keepdim=True))
    shares = []
    for r in range(world):
        cols = torch.zeros(n, dtype=torch.float64)
        cols[positions(n, world, r, is_causal)] = 1.0
        shares.append((ds * cols) @ k64 * scale)
    return shares


def _lse_hint(actual, rank, ref_lse_rows):
    if not torch.isfinite(actual).all():
        return (f"Inf or NaN in rank {rank}'s LSE: the merge computed e^lse without taking the larger "
                f"LSE out first (its LSEs reach {float(ref_lse_rows.max()):.0f}; e^x overflows float32 "
                "past 88.7)")
    return None


def diagnose(name, actual, rank, world, case, q, k, v, dout, scale, refs):
    """A likely-bug sentence for rank ``rank``'s wrong ``name`` (O, LSE, dQ, dK, dV), or None."""
    n, causal = case.n, case.is_causal
    idx = positions(n, world, rank, causal)
    dtype = actual.dtype
    ref_lse = reference_attention(q, k, v, causal, scale)[1]
    if name == "LSE" and not torch.isfinite(actual).all():
        return _lse_hint(actual, rank, ref_lse[..., idx])
    if not torch.isfinite(actual).all():
        return (f"NaN or Inf on rank {rank}: the LSE merge overflowed or took -inf - (-inf): subtract the "
                "larger LSE before the exponentials (merge), and start from the first block's (out, lse)")
    which = {"O": 0, "dQ": 1, "dK": 2, "dV": 3, "LSE": 4}[name]
    rows_of = (lambda t: t[..., idx, :])
    if name in ("O", "LSE"):
        for s in range(world):
            step = (rank - s) % world
            for w, what in ((0.0, "is missing from"), (2.0, "is counted twice in")):
                weight = torch.ones(n)
                weight[positions(n, world, s, causal)] = w
                alt = _what_if(q, k, v, dout, causal, scale, weight)[which]
                if _close(actual, rows_of(alt), dtype):
                    fix = ("that step was skipped or its result never merged" if w == 0 else
                           "the same block was merged twice (after the wait, take the received buffers)")
                    return (f"the K/V block of rank {s} (it reaches rank {rank} at ring step {step}) {what} "
                            f"rank {rank}'s {name}: {fix}")
        # One block merged twice and another never: the loop kept the block it had instead of taking
        # the one received (the same buffers sent on, and merged, again).
        for s in range(world):
            for t in range(world):
                if t == s:
                    continue
                weight = torch.ones(n)
                weight[positions(n, world, s, causal)] = 0.0
                weight[positions(n, world, t, causal)] = 2.0
                alt = _what_if(q, k, v, dout, causal, scale, weight)[which]
                if _close(actual, rows_of(alt), dtype):
                    return (f"the K/V block of rank {t} is counted twice in rank {rank}'s {name} and the block of "
                            f"rank {s} is missing: after the wait, take the received buffers for the next step "
                            "(k, v = the ones send_recv returned), not the block already merged")
        if not causal and name == "O":
            # Every block weighted alike: out = (out + block_out) / 2 at each step, the LSEs unused.
            parts = []
            for s in range(world):
                weight = torch.zeros(n)
                weight[positions(n, world, s, causal)] = 1.0
                parts.append(rows_of(_what_if(q, k, v, dout, causal, scale, weight)[0]))
            avg = parts[rank]
            for step in range(1, world):
                avg = 0.5 * avg + 0.5 * parts[(rank - step) % world]
            if _close(actual, avg, dtype):
                return (f"rank {rank}'s O is the blocks' outputs averaged with equal weights: the merge must weight "
                        "each block by its share of the softmax, w = e^(block_lse - new_lse) = "
                        "sigmoid(block_lse - lse), so a block whose keys score higher counts more")
    if name == "dQ":
        shares = [rows_of(t) for t in _dq_shares(q, k, v, dout, causal, scale, world)]
        total = sum(shares)
        for s in range(world):
            if _close(actual, shares[s], dtype):
                return (f"rank {rank}'s dQ holds only the share of rank {s}'s K/V block: add (+=) every "
                        "block's dQ share instead of overwriting it")
        for s in range(world):
            for t in range(world):
                if t != s and _close(actual, total - shares[s] + shares[t], dtype):
                    return (f"rank {rank}'s dQ lacks the share of rank {s}'s K/V block and has rank {t}'s "
                            "twice: in the backward, after the K/V wait, take the received block for the "
                            "next step")
            if _close(actual, total - shares[s], dtype):
                return f"rank {rank}'s dQ lacks the share of rank {s}'s K/V block: a backward step was skipped"
    if name in ("dK", "dV"):
        for s in range(world):
            if s != rank and _close(actual, refs[which][..., positions(n, world, s, causal), :], dtype):
                return (f"rank {rank} holds the {name} of rank {s}'s keys: after the last ring step, dK/dV "
                        f"must take one more hop to get back to the rank that owns the keys")
        mask = torch.zeros(n, 1, dtype=torch.float64)
        mask[idx] = 1.0
        own = _what_if(q, k, v, dout.double() * mask, causal, scale, torch.ones(n))[which]
        if _close(actual, rows_of(own), dtype):
            return (f"rank {rank}'s {name} holds only its own queries' share: the shares the other ranks "
                    "computed for these keys never came back (d_ring)")
    if causal and name in ("O", "LSE"):
        return (f"causal, zigzag: rank {rank}'s chunk {rank} must see chunks 0-{rank} and its chunk "
                f"{2 * world - 1 - rank} chunks 0-{2 * world - 1 - rank}; check _block_plan's three cases "
                "(own block: causal; src < rank: all rows, first half of the keys; src > rank: second half "
                "of the rows, all keys)")
    return None


# ---------------------------------------------------------------------------
# The check
# ---------------------------------------------------------------------------

def _references(case, grads):
    q, k, v, dout = make_inputs(case)
    scale = check_inputs(q, k, v, is_causal=case.is_causal, scale=case.scale)
    ref_o, ref_lse = reference_attention(q, k, v, case.is_causal, scale)
    refs = (ref_o, *reference_backward(q, k, v, dout, case.is_causal, scale)) if grads else (ref_o,)
    return (q, k, v, dout, scale), ref_lse, refs


def rank_failures(result, rank, world, case, inputs, ref_lse, refs, allowance=None):
    """``[(tensor name, rank, report)]`` for each of this rank's LSE, O (dQ, dK, dV) that is wrong.

    ``allowance``: ``{name: (extra absolute error allowed, the fp32 drift it is made of, q's factor)}`` for
    gradients at large scores (the grader's large-score policy, grading/spec.py): an element passes within
    the base tolerance plus that much.
    """
    q, k, v, dout, scale = inputs
    names = ("O", "dQ", "dK", "dV")[:len(refs)]
    idx = positions(case.n, world, rank, case.is_causal)
    ctx = f"rank {rank} of {world}, {describe_rows(case.n, world, rank, case.is_causal)}; case {case.id}"
    failures = []
    for name, key, ref in zip(("LSE", *names), ("lse", "o", "dq", "dk", "dv"), (ref_lse[..., None], *refs)):
        got = result[key]
        if got is None:
            failures.append((name, rank, f"{name} on rank {rank} is None: the backward returned no gradient ({ctx})"))
            continue
        if name == "LSE":
            got = got[..., None]                             # (..., R) -> (..., R, 1): rows on dim -2
        want_dtype = torch.float32 if name == "LSE" else getattr(torch, case.dtype)
        if tuple(got.shape) != tuple(ref[..., idx, :].shape) or got.dtype != want_dtype:
            failures.append((name, rank, f"{name} on rank {rank}: shape {tuple(got.shape)} {got.dtype}, expected "
                                         f"{tuple(ref[..., idx, :].shape)} {want_dtype} ({ctx})"))
            continue
        # This rank's rows in place, every other row the reference's own: the policy's scale is the
        # whole tensor's max|ref|, as for single-process attention, and only this rank's rows can be
        # wrong. Rows are reported as sequence positions.
        whole = ref.clone()
        whole[..., idx, :] = got.detach().to(ref.dtype)
        extra = (allowance or {}).get(name)
        note = ""
        if extra is not None:
            if not bool(measure(whole, ref, *tolerance_for(want_dtype), extra=extra[0])[3].any()):
                continue
            note = (f"\n  large scores (q x {extra[2]:g}): an honest float32 computation of these inputs is off by up "
                    f"to {extra[1]:.3g} in {name}, so this check allows {extra[0]:.3g} on top of the tolerance; "
                    "elements are past even that. What to check first: each block's P = exp(S - L) with the "
                    "float32 LSE of the whole row (the merged one), never exp(S) alone")
        try:
            assert_close(whole, ref, name=f"{name} on rank {rank}", context=ctx, row_label="sequence rows",
                         dtype=want_dtype,
                         hint=lambda got=got, name=name: diagnose(name, got, rank, world, case, q, k, v, dout,
                                                                  scale, refs))
        except CompareError as e:
            failures.append((name, rank, str(e) + note))
    return failures


def _raise(failures, world, case):
    if failures:
        summary = ", ".join(f"{n} on rank {r}" for n, r, _ in failures)
        raise CompareError(f"ring attention on {world} ranks, case {case.id}: wrong {summary}\n"
                           + failures[0][2], None)


def check_rank(result, rank, world, case: RingCase, grads=True):
    """One rank's ``ring_job`` result against its rows of the reference (what bench/ring_gpu.py runs
    on each GPU before it times anything)."""
    __tracebackhide__ = True
    inputs, ref_lse, refs = _references(case, grads)
    _raise(rank_failures(result, rank, world, case, inputs, ref_lse, refs), world, case)


def check_ring(group, case: RingCase, grads=True):
    """Run ``case`` on every rank of ``group`` (a ``RankGroup``) and compare each rank's tensors.

    Raises ``CompareError`` with the first wrong tensor's report, preceded by a summary of every
    (rank, tensor) that is wrong.
    """
    __tracebackhide__ = True
    results = group.run(ring_job, case, grads)
    inputs, ref_lse, refs = _references(case, grads)
    failures = []
    for r in range(group.world):
        failures += rank_failures(results[r], r, group.world, case, inputs, ref_lse, refs)
    # Reported tensor by tensor (every rank's LSE first, then O, ...): the earliest wrong quantity
    # is where the bug is.
    order = {"LSE": 0, "O": 1, "dQ": 2, "dK": 3, "dV": 4}
    _raise(sorted(failures, key=lambda f: (order[f[0]], f[1])), group.world, case)
    return results


# ---------------------------------------------------------------------------
# PyTorch's own context parallelism, on the same inputs (notebook 10)
# ---------------------------------------------------------------------------

def torch_cp_job(rank, world, case: RingCase):
    """On every rank: ``F.scaled_dot_product_attention`` inside PyTorch's ``context_parallel``.

    Returns the sequence rows this rank held inside the context (its load balancer's layout), its
    output rows, and the error text if the call raised. On a CPU (torch 2.13, gloo) full attention
    runs and causal raises NotImplementedError: the ring handlers are registered for the CUDA SDPA
    operators (flash, efficient, cuDNN) only, and the CPU flash operator has no sharding strategy.
    """
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    q, k, v, _ = make_inputs(case)
    mesh = init_device_mesh(q.device.type, (world,))
    qs, ks, vs = q.clone(), k.clone(), v.clone()
    try:
        with context_parallel(mesh, buffers=[qs, ks, vs], buffer_seq_dims=[2, 2, 2]):
            # Which rows landed here: row i of q is unique (random), so find it.
            held = [int((q[0, 0] - qs[0, 0, i]).abs().sum(-1).argmin()) for i in range(qs.shape[-2])]
            o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=case.is_causal, scale=case.scale)
        return {"rows": held, "o": o.detach(), "error": None}
    except Exception as e:   # noqa: BLE001 -- what fails is the finding
        return {"rows": None, "o": None, "error": f"{type(e).__name__}: {str(e)[:300]}"}


def _torch_cp_main():
    """``torchrun --nproc-per-node 2 -m attnlib.ringcheck``: PyTorch's context_parallel, full and causal,
    each rank's rows against the float64 reference. (Run by torchrun, not RankGroup: inside RankGroup's
    workers the context_parallel call hung on gloo, torch 2.13, while the ring's own jobs and plain
    collectives ran; not investigated further.)"""
    from datetime import timedelta

    import torch.distributed as dist
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()

    def say(msg):                                # one write per line: the ranks share one stdout
        sys.stdout.write(msg + "\n")
        sys.stdout.flush()

    for causal in (False, True):
        case = RingCase(batch=(1, 2), n=32, d=16, is_causal=causal)
        res = torch_cp_job(rank, world, case)
        if res["error"]:
            say(f"rank {rank}, {case.id}: raised {res['error']}")
            continue
        q, k, v, _ = make_inputs(case)
        ref, _ = reference_attention(q, k, v, causal)
        try:
            assert_close(res["o"], ref[..., res["rows"], :], name=f"context_parallel O on rank {rank}",
                         dtype=torch.float32)
            say(f"rank {rank}, {case.id}: held rows {format_ranges(res['rows'])}; its output matches")
        except CompareError as e:
            say(f"rank {rank}, {case.id}: held rows {format_ranges(res['rows'])}; WRONG\n{e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    _torch_cp_main()
