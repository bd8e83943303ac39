"""What each step is graded on: the per-step table, and the calls ("items") it turns into.

``STEP_SPECS`` is the one table to extend when a step lands or changes: which
group kinds a step supports, which rules it must obey (checked in the worker,
and a broken rule zeroes the step), and where it runs. Points live in
config.toml, not here.

An ``Item`` is one call into the submission, run by the worker (grading/worker.py)
on inputs the grader drew here; each item feeds one or more ``checks``
(group name, what to compare), which grading/evaluate.py scores in the grader.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import torch

from attnlib.cases import Case
from attnlib.contract import STEPS
from attnlib.inputs import make_dout, make_qkv

from .config import Group

# ---------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------

RULES = {
    "no_reference": "must not call the course's reference (attnlib.reference_attention / reference_backward)",
    "compiled": "must run through torch.compile (Dynamo must compile at least one graph while attention runs, and "
                "the attention itself must run in the code Inductor generated, not eagerly beside it)",
    "no_sdpa": "must not call F.scaled_dot_product_attention (forward or backward)",
    "no_nxn": "must not build an Nq x Nk tensor (checked at Nq = Nk = 512, forward and backward; and on a CPU "
              "at Nq = Nk = 8192, on a GPU at 16384, under a memory cap an Nq x Nk matrix does not fit in)",
    "triton_fwd": "the forward must launch a Triton kernel",
    "triton_bwd": "the backward must launch a Triton kernel",
    "extension": "must call its compiled CUDA extension",
}


@dataclass(frozen=True)
class StepSpec:
    kinds: tuple[str, ...]           # group kinds the step supports
    rules: tuple[str, ...]           # keys of RULES; any broken rule scores the whole step 0
    runs_on: str = "cpu"             # "cpu": fp32 on the CPU (lowp: fp16 on the CPU, fp16 + bf16 on a GPU if any);
                                     # "triton": a GPU if any, else the Triton interpreter on the CPU;
                                     # "cuda": a GPU only (the step is not graded without one)
    lse_fn: str = "attention_with_lse"


_BASE = ("forward", "backward", "contract", "lowp")
_FLASH = _BASE + ("lse", "autograd", "speed")

STEP_SPECS: dict[int, StepSpec] = {
    1: StepSpec(_BASE, ("no_reference",)),
    2: StepSpec(_BASE, ("no_reference", "compiled")),
    3: StepSpec(_BASE + ("backend",), ("no_reference",)),
    # 04, 06: the capstone too -- the dispatcher takes the step, and the tiny GPT trains with it along
    # the SDPA-math curve (CAPSTONE below). Step 04 on a CPU (where the dispatcher picks it), step 06
    # where it runs: a GPU, or Triton's interpreter.
    4: StepSpec(_FLASH + ("capstone",), ("no_reference", "no_sdpa", "no_nxn")),
    5: StepSpec(_FLASH + ("warmup",), ("no_reference", "no_sdpa", "triton_fwd"), runs_on="triton"),
    6: StepSpec(_FLASH + ("capstone",), ("no_reference", "no_sdpa", "triton_fwd", "triton_bwd"), runs_on="triton"),
    7: StepSpec(_FLASH, ("no_reference", "no_sdpa", "extension"), runs_on="cuda"),
    # 08, 09: graded through their dense `attention` (every (batch, head) a packed sequence; a window
    # wider than the sequence); step 08's Function saves its LSE as (H, total_q), so no autograd group.
    8: StepSpec(_BASE + ("lse",), ("no_reference", "no_sdpa", "no_nxn", "triton_fwd", "triton_bwd"), runs_on="triton"),
    # 09 also through `attention_sparse` on real patterns (SPARSE_PATTERNS: a window narrower than the
    # sequence, global tokens): the dense `attention` runs every pair visible, where neither shows.
    9: StepSpec(_FLASH + ("sparse", "sparse_backward"), ("no_reference", "no_sdpa", "no_nxn", "triton_fwd",
                                                          "triton_bwd"), runs_on="triton"),
    # 10: `attention` in one process (a ring of one: the per-block kernel alone), and the ring itself:
    # `ring_attention` on RING_WORLD gloo processes the worker starts (grading/worker.py, run_ring),
    # every rank's O and LSE (ring) and dQ, dK, dV (ring_backward) against its rows of the float64
    # reference, and `shard` / `unshard` (ring). The rules are watched inside every rank too.
    10: StepSpec(_BASE + ("ring", "ring_backward"), ("no_reference", "no_sdpa")),
}
assert set(STEP_SPECS) == set(STEPS)

RING_WORLD = 2                            # ranks of the ring groups (grading/worker.py starts them)
NXN_PROBE = Case((1, 1), 512, 512, 32)    # larger than any sensible tile, so only a full matrix reaches Nq*Nk/2
NXN_FRACTION = 0.5
# A CPU memory probe's call may grow the worker's resident memory (measured from outside) by its headroom
# plus this before no_nxn breaks: room for what the address-space cap does not see grow (pages the worker
# mapped before the call and touches first in it). An N x N float32 matrix at the probe's N = 8192 is 256 MiB.
RSS_SLACK_MB = 64
# The memory probe of no_nxn: the same call at a size where an Nq x Nk float32 matrix (256 MiB) does not fit
# in what the worker may take on top of what it holds (its address-space cap lowered for the call, so the OS
# refuses the allocation), while O(N) memory does: the right step 04 grows its address space by 1-55 MiB
# here (strips of 8192 x 64, measured on the 2-core CI machine), 2 s for both calls on one core. Catches
# what the largest tensor at 512 does not: N x N everywhere but at 512, or 255-row chunks kept alive
# together by autograd (hostile/nxn_except_at_probe, hostile/nxn_chunks_kept: 9/10 with the 512 probe
# alone). Steps whose forward runs on a CPU in PyTorch only (step 04): Triton's interpreter would take
# minutes at this size, and a GPU worker's cap is not an address-space cap (grading/README.md).
NXN_MEMORY_PROBE = Case((1, 1), 8192, 8192, 16)
NXN_MEMORY_HEADROOM_MB = 128
# On a GPU (steps 08 and 09, whose forward runs there): the same probe at N = 16384 in the step's fp16,
# where an Nq x Nk matrix takes 512 MiB (fp32: 1 GiB), under a cap on the worker's CUDA memory of what its
# caching allocator holds plus 128 MiB (torch.cuda.set_per_process_memory_fraction, set back after), and
# with the call's peak CUDA memory measured besides (a submission that lifts the cap still shows its peak).
NXN_GPU_MEMORY_PROBE = Case((1, 1), 16384, 16384, 64)
SPEED_CASE = Case((4, 16), 4096, 4096, 64)
# Step 09's sparse groups: `attention_sparse(q, k, v, window, n_global, is_causal)` on each case (Nq = Nk)
# with each (window, n_global), against the float64 reference under the grader's own mask of the pattern
# (sparse_mask: |i - j| < window or j < n_global or i < n_global, and j <= i if causal; never the step's
# `visible`). A window that crosses tiles, without and with global tokens: an off-by-one at the window's
# edge shows in both, global tokens forgotten (forward or backward) in the second.
SPARSE_PATTERNS = ((20, 0), (9, 5))

# The backward at large scores (q x q_factor, fp32). With scores of a few hundred, float32 itself rounds
# S = q k^T * scale and the LSE by |S| * 6e-8 (about 2e-5 at 300), and with nearly one-hot rows
# dS = P * (dP - D) cancels: a right fp32 backward misses the float64 dQ, dK by far more than the base
# tolerance (solutions/step04, 17 x 40 causal: 83% of dQ bad; step 01's naive autograd too). So the grader
# measures, on the same inputs, how far honest float32 computations are from the float64 reference:
# the reference's maths in fp32 (softmax and autograd) and FlashAttention's (P = exp(S - L) from the fp32
# LSE, D = rowsum(dO * O)); the larger of the two maximum errors per tensor is the "drift", and a result
# passes when |err| <= base tolerance + LARGE_SCORE_DRIFT_MULTIPLE * drift. Measured (17 x 17, 17 x 40,
# 17 x 200, 100 x 33, q x 100, 20 seeds, full and causal): the course's steps 01, 04 need at most 0.43 x
# the drift beyond the base tolerance, its Triton steps 05, 06, 08, 09, 10 (interpreter) at most the
# multiple recorded in grading/README.md; a backward that rebuilds P unshifted returns NaN there, and one that
# is wrong by more than a few ulps of the LSE fails. Step 03 has no large-score backward checks: its backward
# is PyTorch's SDPA (the CPU flash kernel is 28 x the drift off in dV; nothing the student wrote).
LARGE_SCORE_DRIFT_MULTIPLE = 4.0

# Bad inputs for the contract group, made from a valid (q, k, v) of any shape: each must raise ValueError.
BAD_INPUTS = {
    "rank mismatch": lambda q, k, v: (q.unsqueeze(0), k, v),
    "batch mismatch": lambda q, k, v: (q, torch.cat([k, k]), torch.cat([v, v])),
    "k/v length mismatch": lambda q, k, v: (q, k, torch.cat([v, v], dim=-2)),
    "head dim mismatch": lambda q, k, v: (q, k[..., :-1], v[..., :-1]),
    "dtype mismatch": lambda q, k, v: (q, k.to(torch.float64 if k.dtype != torch.float64 else torch.float32), v),
}

# The capstone group: capstone.model's GPT, tiny, trained a few steps with the step's attention (the
# dispatcher's impl, pinned), against the same run with SDPA's math backend, computed by the grader.
# Sized for Triton's interpreter: step 06 trains it in about 4 s on one core of the CI machine
# (2 cores, 2026-11-30); one layer at T = 32, d = 16 is enough for causality and the strides of
# the model's q/k/v views (slices of one qkv projection, not contiguous) to matter.
CAPSTONE_MODEL = {"layers": 1, "d_model": 32, "heads": 2, "context": 32}
CAPSTONE_RUN = {"batch": 2, "steps": 6, "lr": 1e-2}
# fp32 losses of the same model, math as SDPA's: 1e-6 apart over 6 steps (step 04 and step 06 in the
# interpreter, measured); 1e-4 is the course's capstone test's bound (tests/test_capstone.py). A model
# whose attention ignores is_causal is 7e-4 off at step 0 and 6e-2 by step 6.
CAPSTONE_ATOL = 1e-4
CAPSTONE_IMPL = {4: "step04", 6: "step06"}

SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")
# The aten op each backend runs (the profiler's names), to tell which one really ran.
SDPA_OPS = {
    "math": ("aten::_scaled_dot_product_attention_math",),
    "flash": ("aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_flash_attention_for_cpu"),
    "efficient": ("aten::_scaled_dot_product_efficient_attention",),
    "cudnn": ("aten::_scaled_dot_product_cudnn_attention",),
}


# ---------------------------------------------------------------------------
# Items
# ---------------------------------------------------------------------------

@dataclass
class Check:
    group: str
    what: str        # "o", "grads", "o+grads", "lse", "saved", "raises", "backend", "chosen", "time", "warmup",
                     # "dispatch", "train", "ring_o", "ring_grads", "ring_layout" (step 10)
    name: str        # shown to the student: the input it ran on


@dataclass
class Item:
    kind: str                      # attn | lse | saved | bad_input | backend | chosen_backend | time | warmup | capstone |
                                   # ring | ring_layout
    id: str
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    is_causal: bool = False
    scale: float | None = None
    device: str = "cpu"
    dout: torch.Tensor | None = None
    grads: bool = False
    nxn_probe: bool = False
    bad: tuple | None = None       # (q, k, v) for bad_input items
    extra: dict = field(default_factory=dict)      # sent to the worker
    expect: dict = field(default_factory=dict)     # the grader's own expectations: never sent
    checks: list[Check] = field(default_factory=list)
    hidden: bool = False           # every check is a hidden group's: sent to the worker last

    @property
    def dtype(self):
        return self.q.dtype

    def task(self) -> dict:
        """What the worker gets: plain tensors and values only."""
        t = {"kind": self.kind, "q": self.q, "k": self.k, "v": self.v,      # no id: it names the seed
             "is_causal": self.is_causal, "scale": self.scale, "device": self.device,
             "grads": self.grads, "nxn_probe": self.nxn_probe, "extra": dict(self.extra)}
        if self.dout is not None:
            t["dout"] = self.dout
        if self.bad is not None:
            t["bad_q"], t["bad_k"], t["bad_v"] = self.bad
        return t


def _seed(base: int, case: Case) -> int:
    return (base * 1_000_003 + zlib.crc32(case.id.encode())) % (2 ** 31)


def _dtname(dt) -> str:
    return str(dt).replace("torch.", "")


def _check_name(case: Case, is_causal, scale, dtype, device) -> str:
    s = f"{case.id} {'causal' if is_causal else 'full'}"
    if scale is not None:
        s += f" scale={scale:g}"
    if dtype != torch.float32 or device != "cpu":
        s += f" {_dtname(dtype)} {device}"
    return s


def _inputs(case: Case, seed: int, dtype, requires_dout=True):
    q, k, v = make_qkv(Nq=case.nq, Nk=case.nk, D=case.d, batch_shape=case.batch, dtype=dtype,
                       seed=_seed(seed, case))
    dout = make_dout(q, seed=_seed(seed, case) + 1) if requires_dout else None
    return q, k, v, dout


def placement(spec: StepSpec, has_gpu: bool, kind: str) -> list[tuple[str, torch.dtype]] | None:
    """(device, dtype) pairs a group kind runs on, or None when it cannot run here."""
    if kind == "lowp":
        if has_gpu:
            return [("cuda", torch.float16), ("cuda", torch.bfloat16)]
        # fp16 on a CPU: PyTorch computes in it, and so does Triton's interpreter; its bf16 tl.dot is
        # wrong (attnlib.cases.INTERPRETER_BF16_SKIP), so bf16 waits for a GPU.
        return [("cpu", torch.float16)] if spec.runs_on in ("cpu", "triton") else None
    if kind == "speed":
        return [("cuda", torch.float16)] if has_gpu else None
    if kind == "capstone":     # fp32: the model's run must follow the fp32 reference curve to CAPSTONE_ATOL
        return [("cuda" if spec.runs_on == "triton" and has_gpu else "cpu", torch.float32)]
    if kind == "warmup":       # step 05's helpers alone (attnlib/warmups.py): fp32 and fp16 wherever the step runs
        return [("cuda" if has_gpu else "cpu", dt) for dt in (torch.float32, torch.float16)]
    if spec.runs_on == "cuda":
        return [("cuda", torch.float16)] if has_gpu else None
    if spec.runs_on == "triton" and has_gpu:
        return [("cuda", torch.float16)]
    return [("cpu", torch.float32)]


def step_needs_gpu(step: int) -> bool:
    return STEP_SPECS[step].runs_on == "cuda"


def build_items(step: int, groups: list[Group], has_gpu: bool) -> tuple[list[Item], list[Group]]:
    """Turn the groups of one step into worker items. Returns (items, groups that cannot run here)."""
    spec = STEP_SPECS[step]
    items: dict[str, Item] = {}
    skipped: list[Group] = []

    def get(key, make):
        if key not in items:
            items[key] = make()
        return items[key]

    for g in groups:
        if g.kind not in spec.kinds:
            raise ValueError(f"step {step}: group {g.name!r} has kind {g.kind!r}, which step {step} "
                             f"does not support (it supports {spec.kinds}; see grading/spec.py)")
        where = placement(spec, has_gpu, g.kind)
        if where is None or (g.needs_gpu and not has_gpu):
            skipped.append(g)
            continue
        for device, dtype in where:
            if g.kind in ("forward", "backward", "lowp"):
                runs = [(c, causal, None, 1.0) for c in g.cases for causal in g.causal]
                # Explicit scales on the first case with more than one key (with one key, any scale is right).
                sc_case = next((c for c in g.cases if c.nk > 1), g.cases[0])
                runs += [(sc_case, causal, s, 1.0) for s in g.scales for causal in g.causal]
                # Large scores on the same case, fp32 only: q x 100 makes scores of a few hundred, where exp()
                # without the running max overflows (forward), or a backward that rebuilds P unshifted
                # (exp(S) / exp(L)) does. The backward's checks there get the large-score allowance
                # (LARGE_SCORE_DRIFT_MULTIPLE below; grading/evaluate.py applies it). Not fp16: the rounding
                # of such scores alone moves a right kernel's softmax past the tolerance.
                if dtype == torch.float32 and g.kind in ("forward", "backward"):
                    runs += [(sc_case, causal, None, f) for f in g.q_factors for causal in g.causal]
                for case, causal, scale, factor in runs:
                    key = f"attn/{case.id}/{causal}/{scale}/{g.seed}/{_dtname(dtype)}/{device}/q*{factor:g}"

                    def make(case=case, causal=causal, scale=scale, key=key, dtype=dtype, device=device,
                             factor=factor):
                        q, k, v, dout = _inputs(case, g.seed, dtype)
                        it = Item("attn", key, q * factor if factor != 1 else q, k, v, causal, scale, device,
                                  dout=dout)
                        it.expect["q_factor"] = factor        # the grader's own: never sent
                        return it
                    it = get(key, make)
                    name = _check_name(case, causal, scale, dtype, device) + (f" q*{factor:g}" if factor != 1 else "")
                    what = {"forward": "o", "backward": "grads", "lowp": "o+grads"}[g.kind]
                    it.checks.append(Check(g.name, what, name))
                    it.grads = it.grads or what != "o"
            elif g.kind in ("ring", "ring_backward"):
                if (device, dtype) != ("cpu", torch.float32):
                    continue
                # The whole sequence is one case with Nq = Nk = N; each of the ranks holds N / W rows
                # (causal: two zigzag chunks of N / 2W).
                for case in g.cases:
                    for causal in g.causal:
                        parts = 2 * RING_WORLD if causal else RING_WORLD
                        if case.nq != case.nk or case.nq % parts:
                            raise ValueError(f"step {step}: group {g.name!r}, case {case.id}: a ring case needs "
                                             f"nq = nk and nq a multiple of {parts} ({'2 x ' if causal else ''}"
                                             f"{RING_WORLD} ranks{', causal: zigzag' if causal else ''})")
                runs = [(c, causal, None, 1.0) for c in g.cases for causal in g.causal]
                runs += [(g.cases[0], causal, s, 1.0) for s in g.scales for causal in g.causal]
                # Large scores: the merge's LSEs reach a few hundred; the backward's checks there get the
                # large-score allowance, as single-process backwards do (LARGE_SCORE_DRIFT_MULTIPLE).
                runs += [(g.cases[0], causal, None, f) for f in g.q_factors for causal in g.causal]
                for case, causal, scale, factor in runs:
                    key = f"ring/{case.id}/{causal}/{scale}/{g.seed}/q*{factor:g}"

                    def make(case=case, causal=causal, scale=scale, key=key, factor=factor):
                        q, k, v, dout = _inputs(case, g.seed, torch.float32)
                        it = Item("ring", key, q * factor if factor != 1 else q, k, v, causal, scale, "cpu",
                                  dout=dout, extra={"world": RING_WORLD})
                        it.expect["q_factor"] = factor        # the grader's own: never sent
                        return it
                    it = get(key, make)
                    name = (_check_name(case, causal, scale, torch.float32, "cpu")
                            + (f" q*{factor:g}" if factor != 1 else "") + f" on {RING_WORLD} ranks")
                    it.checks.append(Check(g.name, "ring_o" if g.kind == "ring" else "ring_grads", name))
                    it.grads = it.grads or g.kind == "ring_backward"
                if g.kind == "ring":       # the layout: the student's shard and unshard
                    for world in (RING_WORLD, 4):
                        for causal in g.causal:
                            key = f"ring_layout/{world}/{causal}"
                            n = 8 * world
                            it = get(key, lambda: Item("ring_layout", key, *(torch.empty(0),) * 3, causal,
                                                       extra={"world": world, "n": n}))
                            it.checks.append(Check(g.name, "ring_layout",
                                                   f"shard/unshard of {n} rows on {world} ranks "
                                                   f"{'causal (zigzag)' if causal else 'full (contiguous)'}"))
            elif g.kind in ("sparse", "sparse_backward"):
                for case in g.cases:
                    if case.nq != case.nk:
                        raise ValueError(f"step {step}: group {g.name!r}, case {case.id}: a sparse pattern needs "
                                         "nq = nk")
                for case in g.cases:
                    for window, n_global in SPARSE_PATTERNS:
                        for causal in g.causal:
                            key = (f"sparse/{case.id}/{causal}/{window}/{n_global}/{g.seed}/{_dtname(dtype)}/"
                                   f"{device}")

                            def make(case=case, causal=causal, key=key, dtype=dtype, device=device,
                                     window=window, n_global=n_global):
                                q, k, v, dout = _inputs(case, g.seed, dtype)
                                return Item("attn", key, q, k, v, causal, None, device, dout=dout,
                                            extra={"sparse": [window, n_global]})
                            it = get(key, make)
                            name = (_check_name(case, causal, None, dtype, device)
                                    + f" window={window} n_global={n_global}")
                            it.checks.append(Check(g.name, "o" if g.kind == "sparse" else "grads", name))
                            it.grads = it.grads or g.kind == "sparse_backward"
            elif g.kind == "lse":
                for case in g.cases:
                    for causal in g.causal:
                        key = f"lse/{case.id}/{causal}/{g.seed}/{_dtname(dtype)}/{device}"
                        q, k, v, _ = _inputs(case, g.seed, dtype, requires_dout=False)
                        it = get(key, lambda: Item("lse", key, q, k, v, causal, None, device,
                                                   extra={"fn": spec.lse_fn}))
                        it.checks.append(Check(g.name, "lse", _check_name(case, causal, None, dtype, device)))
            elif g.kind == "autograd":
                case = max(g.cases, key=lambda c: c.nq * c.nk)
                for causal in g.causal:
                    key = f"saved/{case.id}/{causal}/{g.seed}/{_dtname(dtype)}/{device}"
                    q, k, v, dout = _inputs(case, g.seed, dtype)
                    it = get(key, lambda: Item("saved", key, q, k, v, causal, None, device, dout=dout, grads=True))
                    it.checks.append(Check(g.name, "saved", _check_name(case, causal, None, dtype, device)))
            elif g.kind == "contract":
                q, k, v, _ = _inputs(g.cases[0], g.seed, dtype, requires_dout=False)
                for bad_name, make_bad in BAD_INPUTS.items():
                    key = f"bad/{bad_name}/{_dtname(dtype)}/{device}"
                    it = get(key, lambda: Item("bad_input", key, q, k, v, False, None, device,
                                               bad=tuple(t.contiguous() for t in make_bad(q, k, v)),
                                               extra={"what": bad_name}))
                    it.checks.append(Check(g.name, "raises", bad_name))
            elif g.kind == "backend":
                case = g.cases[0]
                q, k, v, _ = _inputs(case, g.seed, dtype, requires_dout=False)
                for causal in g.causal:
                    for b in SDPA_BACKENDS:
                        key = f"backend/{b}/{case.id}/{causal}/{_dtname(dtype)}/{device}"
                        it = get(key, lambda: Item("backend", key, q, k, v, causal, None, device,
                                                   extra={"backend": b}))
                        it.checks.append(Check(g.name, "backend", f"backend={b} {_check_name(case, causal, None, dtype, device)}"))
                    key = f"chosen/{case.id}/{causal}/{_dtname(dtype)}/{device}"
                    it = get(key, lambda: Item("chosen_backend", key, q, k, v, causal, None, device))
                    it.checks.append(Check(g.name, "chosen", f"chosen_backend {_check_name(case, causal, None, dtype, device)}"))
            elif g.kind == "warmup":
                if (device, dtype) != where[0]:
                    continue                       # one pass builds every dtype's calls (key_range has none)
                from attnlib.warmups import grader_calls
                for n_call, call in enumerate(grader_calls([dt for _, dt in where], device, g.seed)):
                    key = f"warmup/{n_call}/{g.seed}/{device}"
                    it = get(key, lambda: Item("warmup", key, *(torch.empty(0),) * 3, device=device,
                                               extra={"fn": call["fn"], "args": call["args"], "kwargs": call["kwargs"]}))
                    it.checks.append(Check(g.name, "warmup", call["name"]))
            elif g.kind == "capstone":
                key = f"capstone/{g.seed}/{device}"
                it = get(key, lambda: _capstone_item(step, key, g.seed, device))
                impl = CAPSTONE_IMPL[step]
                it.checks.append(Check(g.name, "dispatch", f"the dispatcher takes {impl} ({device})"))
                it.checks.append(Check(g.name, "train", f"tiny GPT, {CAPSTONE_RUN['steps']} steps with {impl} "
                                                        f"({device}) vs SDPA math"))
            elif g.kind == "speed":
                case = SPEED_CASE
                key = f"time/{case.id}/{_dtname(dtype)}"
                it = get(key, lambda: Item("time", key, *_lazy_speed_inputs(case, dtype), True, None, device,
                                           extra={"case": [list(case.batch), case.nq, case.nk, case.d]}))
                it.checks.append(Check(g.name, "time", f"{case.id} causal {_dtname(dtype)} fwd+bwd"))
    out = list(items.values())
    if "no_nxn" in spec.rules and out:
        where = placement(spec, has_gpu, "forward")
        if where:
            device, dtype = where[0]
            q, k, v, dout = _inputs(NXN_PROBE, 7, dtype)
            for causal in (False, True):
                out.append(Item("attn", f"nxn/{causal}", q, k, v, causal, None, device, dout=dout,
                                grads=True, nxn_probe=True))
            if device == "cuda":
                q, k, v, dout = _inputs(NXN_GPU_MEMORY_PROBE, 8, dtype)
                for causal in (False, True):
                    out.append(Item("attn", f"nxn_memory/{causal}", q, k, v, causal, None, device, dout=dout,
                                    grads=True, nxn_probe=True,
                                    extra={"headroom_mb": NXN_MEMORY_HEADROOM_MB, "measure": False, "gpu": True}))
            elif spec.runs_on == "cpu" and device == "cpu":
                q, k, v, dout = _inputs(NXN_MEMORY_PROBE, 8, dtype)
                for causal in (False, True):
                    out.append(Item("attn", f"nxn_memory/{causal}", q, k, v, causal, None, device, dout=dout,
                                    grads=True, nxn_probe=True, extra={"headroom_mb": NXN_MEMORY_HEADROOM_MB, "measure": False}))
    # The hidden groups' items go last: the worker gets items one at a time, so no call it runs
    # before them, and no record it writes before them, can hold anything of their inputs.
    hidden = {g.name for g in groups if g.hidden}
    for it in out:
        it.hidden = bool(it.checks) and all(c.group in hidden for c in it.checks)
    out.sort(key=lambda it: it.hidden)
    return out, skipped


def sparse_mask(nq: int, nk: int, window: int, n_global: int, is_causal: bool) -> torch.Tensor:
    """The grader's own statement of step 09's pattern: True where query i sees key j."""
    i = torch.arange(nq)[:, None]
    j = torch.arange(nk)[None, :]
    seen = ((i - j).abs() < window) | (j < n_global) | (i < n_global)
    return seen & (j <= i) if is_causal else seen


def _capstone_item(step: int, key: str, seed: int, device: str) -> Item:
    """The initial weights and the token batches of one short training run, drawn here (the worker
    builds the same GPT from capstone/model.py, loads these weights, trains on these tokens)."""
    from capstone.model import GPT, GPTConfig
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT(GPTConfig(**CAPSTONE_MODEL, attn="math"))
    state = {k: t.detach().clone() for k, t in model.state_dict().items()}
    c, r = CAPSTONE_MODEL, CAPSTONE_RUN
    gen = torch.Generator().manual_seed(seed + 1)
    # Text-like: a Zipf draw over 32 byte values, so the loss falls visibly in a few steps.
    probs = 1.0 / torch.arange(1, 33, dtype=torch.float64)
    tokens = (97 + torch.multinomial(probs, r["steps"] * r["batch"] * (c["context"] + 1), replacement=True,
                                     generator=gen)).view(r["steps"], r["batch"], c["context"] + 1)
    # The dispatcher's inputs: the model's attention shape (B, H, T, D).
    q, k, v = make_qkv(Nq=c["context"], Nk=c["context"], D=c["d_model"] // c["heads"],
                       batch_shape=(r["batch"], c["heads"]), dtype=torch.float32, seed=seed + 2)
    impl = CAPSTONE_IMPL[step]
    it = Item("capstone", key, q, k, v, True, None, device,
              extra={"impl": impl, "model": dict(c), "lr": r["lr"], "state": state, "tokens": tokens})
    # On a CPU steps 07 and 06 need a GPU, so the dispatcher's first choice is step 04; in fp32 on a GPU
    # step 07 is passed over (its kernels take fp16/bf16), so it is step 06. Step 06 on a CPU (Triton's
    # interpreter) is never the dispatcher's choice: only its trial call is checked.
    it.expect["chosen"] = None if (impl == "step06" and device == "cpu") else impl
    return it


def _lazy_speed_inputs(case: Case, dtype):
    # Timing inputs are big: the worker draws them itself from this seed (no 100 MB task file).
    empty = torch.empty(0)
    return empty, empty, empty


def rules_for(step: int) -> tuple[str, ...]:
    return STEP_SPECS[step].rules
