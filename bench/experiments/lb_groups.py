"""Experiment: heads first in groups -- does launching a few heads at a time (the heavy tiles first within each group) keep each kernel's working set in L2 and take step 06 closer to 5.0 ms?

Question. Step 05's and step 06's kernels start every head's heaviest tile before any head's next one
(``HEADS_FIRST``, grid (B*H, tiles)): at the CS336 leaderboard shape (B=1, H=16, N=16384, D=64, causal)
that paid 3-4% in each kernel (``lb_5ms.py``), a shorter tail. But it also puts all 16 heads in flight at
once, and every program streams its head's whole other side: K and V for the forward and the dQ pass, Q and
dO for dK/dV, 4 MB a head, 64 MB for sixteen against the H200's 50 MB of L2. In CS336's harness the GPU runs
at its power limit (``lb_gaps.py``), where bytes fetched again from HBM cost clock. Launching the heads in
groups of G, heaviest tiles first within a group and one group after the other, holds 4G MB in flight and
keeps the tail short (only the last group's light tiles end the launch). Which G is fastest, per kernel and
in the harness?

Method. Step 05's pointer kernel and step 06's dK/dV and dQ kernels, rebuilt from their own code objects with
one name changed in their globals: ``tl`` becomes a module that forwards everything to ``triton.language``
except ``program_id``, which maps the launch order to (group, tile, head in group) with the group outermost
(``_grouped_pid``); ``forward`` and ``backward`` are rebuilt to launch them. Grid, tiles and everything else
are the tables'. G = 16 is the table's own order at the leaderboard shape (one group of all heads): a control
for the rebuild. (1) O, LSE, dQ, dK, dV against the float64 reference beside the table's error (bf16, B=2 H=8
N=1000 and 4096 D=64, causal). (2) the leaderboard shape, do_bench median (rep 300 ms): the forward alone and
the backward alone, the table then each G then the table. (3) CS336's harness (``torch.compile(
FlashAttentionTriton.apply)``, ``o.sum().backward()``, the mean of ``do_bench``) with step 06's backward
replaced (the backward operator is opaque to the compiler and calls ``backward`` at run time; the compiled
forward is the table's: Inductor re-emits a user kernel from its source, which would drop the rebuilt
globals), alternated with the table, nvidia-smi's SM clock over each run.

    python bench/experiments/lb_groups.py --out DIR     # an H200: about 2 minutes
    python bench/experiments/lb_groups.py --small       # CPU: Triton's interpreter, part (1) at small sizes

Answer: no; the tables' order (all heads at once) stays. One H200, 2026-12-02 06:57 UTC, the working tree of 6f6d9d0
with this file (results/h200/triton/lb_groups_1202.json, .log, _smi.csv). Every G right (10 cases, the table's
errors to three digits). Kernels alone at the leaderboard shape: the table 1.253 / 3.756 ms (forward / backward),
every G slower, G=1 the slowest (1.364 / 4.132), G=2-16 within 1% of each other (1.288-1.295 / 3.945-3.984);
the table read again at the end 1.305 / 4.061, so the run drifted by as much as the G's differ, and G=16 -- the
table's own order through the remapped ``program_id`` -- reads like G=2-8: no group size gains over another.
CS336's harness: the table 5.144-5.156 ms in five runs (1831-1838 MHz; cuDNN 4.528 / 4.533), the grouped
backward 5.291 (G=8), 5.308 (G=4), 5.329 (G=2), 5.498 (G=1), each at a higher clock (1880-1918 MHz): fewer
heads in flight draw less power and still take longer. The L2 working set is not what holds step 06 at 5.1 ms.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from bench.experiments import gpu_run  # noqa: E402

REC = gpu_run.Record("lb_groups")
log = REC.log
T0 = time.time()
GROUPS = (1, 2, 4, 8, 16)


@triton.jit
def _grouped_pid(axis: tl.constexpr, G: tl.constexpr):
    """``tl.program_id(axis)`` of a (B*H, tiles) grid launched in groups of G heads: the launch order (axis 0
    fastest) read as (group, tile, head in group), outermost first. B*H must be a multiple of G."""
    n_bh = tl.num_programs(0)
    n_t = tl.num_programs(1)
    lin = tl.program_id(1) * n_bh + tl.program_id(0)
    grp = lin // (G * n_t)
    rem = lin % (G * n_t)
    res = rem // G                                   # axis 1: the tile
    if axis == 0:
        res = grp * G + rem % G                      # axis 0: batch x head
    return res


@triton.jit
def pid_g1(axis: tl.constexpr):
    return _grouped_pid(axis, 1)


@triton.jit
def pid_g2(axis: tl.constexpr):
    return _grouped_pid(axis, 2)


@triton.jit
def pid_g4(axis: tl.constexpr):
    return _grouped_pid(axis, 4)


@triton.jit
def pid_g8(axis: tl.constexpr):
    return _grouped_pid(axis, 8)


@triton.jit
def pid_g16(axis: tl.constexpr):
    return _grouped_pid(axis, 16)


PIDS = {1: pid_g1, 2: pid_g2, 4: pid_g4, 8: pid_g8, 16: pid_g16}


def grouped_tl(G: int) -> types.ModuleType:
    """A module that is ``triton.language`` but for ``program_id`` (a plain module: Triton's code generator
    takes modules as globals; PEP 562's ``__getattr__`` forwards the rest at each use, so the interpreter's
    patched builtins are the ones found)."""
    m = types.ModuleType(f"tl_grouped_{G}")
    m.program_id = PIDS[G]
    m.__getattr__ = lambda name: getattr(tl, name)
    return m


_CACHE: dict = {}


def grouped(G: int):
    """``(forward, backward)``: step 05's and step 06's launchers whose heads-first kernels run in groups of G."""
    if G in _CACHE:
        return _CACHE[G]
    from attnlib.loader import load_step
    s5, s6 = load_step(5, "solutions"), load_step(6, "solutions")
    tlg = grouped_tl(G)
    # _tl: the real triton.language stays visible, which Triton's interpreter requires (it patches that module)
    g5 = dict(vars(s5), tl=tlg, _tl=tl)
    g5["_attn_fwd_kernel"] = triton.jit(gpu_run.rebuild(s5._attn_fwd_kernel.fn, g5))
    g5["forward"] = s5.direct_launches(gpu_run.rebuild(s5.forward.__wrapped__, dict(g5, tl=tl)))
    g6 = dict(vars(s6), tl=tlg, _tl=tl)
    for name in ("_bwd_dkdv_kernel", "_bwd_dq_kernel"):
        g6[name] = triton.jit(gpu_run.rebuild(getattr(s6, name).fn, g6))
    g6["backward"] = s6.direct_launches(gpu_run.rebuild(s6.backward.__wrapped__, dict(g6, tl=tl)))
    # the launchers resolve the rebuilt kernels through their own globals (tl there is the real one)
    g5["forward"].__wrapped__.__globals__.update(_attn_fwd_kernel=g5["_attn_fwd_kernel"])
    g6["backward"].__wrapped__.__globals__.update({n: g6[n] for n in ("_bwd_dkdv_kernel", "_bwd_dq_kernel")})
    _CACHE[G] = (g5["forward"], g6["backward"])
    return _CACHE[G]


def heads_first(cfg5, cfg6):
    """The tables with HEADS_FIRST on in all three kernels (the grouped pid reads a (B*H, tiles) grid)."""
    f = dict(cfg5, HEADS_FIRST=True)
    b = dict(cfg6, dkdv=dict(cfg6["dkdv"], HEADS_FIRST=True), dq=dict(cfg6["dq"], HEADS_FIRST=True),
             dq_mode="separate")
    return f, b


# %% (1) correctness ---------------------------------------------------------------------------------------

def correctness(small: bool, device: str, groups=GROUPS) -> dict:
    from attnlib.loader import load_step
    from attnlib.reference import reference_attention, reference_backward
    s5, s6 = load_step(5, "solutions"), load_step(6, "solutions")
    dt = torch.float32 if small else torch.bfloat16
    shapes = [(1, 4, 100, 64), (2, 2, 70, 32)] if small else [(2, 8, 1000, 64), (2, 8, 4096, 64)]
    rows, wrong = [], 0
    for (b, h, n, d) in shapes:
        g = torch.Generator().manual_seed(0)
        q, k, v, do = (torch.randn(b, h, n, d, generator=g).to(device=device, dtype=dt) for _ in range(4))
        ro, rl = reference_attention(q, k, v, True)
        rg = reference_backward(q, k, v, do, True)
        dev = "cuda" if device == "cuda" else "cpu"
        cfg5, cfg6 = heads_first(s5.dense_fwd_config(n, n, d, dt, True, dev, b * h),
                                 s6.bwd_config(n, n, d, dt, True, dev, b * h))
        sc = d ** -0.5

        def err(fwd, bwd):
            o, lse = fwd(q, k, v, True, sc, config=cfg5, tma=False)
            gr = bwd(q, k, v, o, lse, do, True, sc, config=cfg6, dq_mode="separate")
            return [float((o.double() - ro).abs().max()), float((lse.double() - rl).abs().max())] + \
                [float((x.double() - y).abs().max()) for x, y in zip(gr, rg)]
        base = err(s5.forward, s6.backward)
        row = {"case": f"B{b} H{h} N{n} D{d} causal {str(dt)[6:]}", "table": base}
        for G in groups:
            if (b * h) % G:
                continue
            e = err(*grouped(G))
            ok = all(x <= 1.5 * y + 1e-3 for x, y in zip(e, base))
            wrong += not ok
            row[f"G{G}"] = e
            log(f"  {row['case']:<28} G={G:<3} max error {max(e):.2e} (table {max(base):.2e}) {'ok' if ok else 'WRONG'}")
        rows.append(row)
    return {"rows": rows, "wrong": wrong}


# %% (2)-(3) timing ---------------------------------------------------------------------------------------

def kernels(rep_ms: int) -> dict:
    from attnlib.loader import load_step
    s5, s6 = load_step(5, "solutions"), load_step(6, "solutions")
    B, H, N, D = 1, 16, 16384, 64
    q, k, v, do = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    sc = D ** -0.5
    cfg5, cfg6 = heads_first(s5.dense_fwd_config(N, N, D, q.dtype, True, "cuda", B * H),
                             s6.bwd_config(N, N, D, q.dtype, True, "cuda", B * H))
    o, lse = s5.forward(q, k, v, True, sc)
    rows = {}
    order = [("table", s5.forward, s6.backward)] + [(f"G{G}", *grouped(G)) for G in GROUPS] + \
        [("table again", s5.forward, s6.backward)]
    for name, fwd, bwd in order:
        f = triton.testing.do_bench(lambda: fwd(q, k, v, True, sc, config=cfg5, tma=False), rep=rep_ms)
        bw = triton.testing.do_bench(lambda: bwd(q, k, v, o, lse, do, True, sc, config=cfg6, dq_mode="separate"),
                                     rep=rep_ms)
        rows[name] = {"fwd_ms": round(float(f), 4), "bwd_ms": round(float(bw), 4)}
        log(f"  {name:<12} forward {f:.3f} ms  backward {bw:.3f} ms")
        REC.result["kernels"] = rows
        REC.save()
    return {"rows": rows}


def harness(out: Path, rep_ms: int, budget_s: float) -> dict:
    return gpu_run.cs336_harness(REC, out, [(f"bwd G{G}", grouped(G)[1]) for G in (1, 2, 4, 8)], rep_ms, budget_s, T0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--small", action="store_true", help="CPU: Triton's interpreter, correctness only")
    ap.add_argument("--rep-ms", type=int, default=300)
    ap.add_argument("--harness-rep-ms", type=int, default=3000)
    ap.add_argument("--budget-s", type=float, default=240)
    args = ap.parse_args()
    if args.small or not torch.cuda.is_available():
        r = correctness(True, "cpu", groups=(1, 2, 4))
        print(f"{r['wrong']} wrong")
        return 1 if r["wrong"] else 0
    if args.out is None:
        ap.error("--out DIR on a GPU")
    REC.open(args.out, ROOT)
    REC.result["gpu"] = torch.cuda.get_device_name()

    @REC.part("1 correctness")
    def part1():
        r = correctness(False, "cuda")
        if r["wrong"]:
            raise AssertionError(f"{r['wrong']} wrong: not timed")
        return r
    part1()
    if not REC.result["parts"]["1 correctness"]["ok"]:
        log("not timed: part 1 failed")
        return 1

    @REC.part("2 leaderboard shape, kernels")
    def part2():
        return kernels(args.rep_ms)
    part2()

    @REC.part("3 CS336 harness, backward grouped, alternated with the table")
    def part3():
        return harness(args.out, args.harness_rep_ms, args.budget_s)
    part3()
    REC.save()
    log(f"wrote {REC.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
