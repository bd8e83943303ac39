"""Experiment: where do issue 17's targets stand once run-to-run spread is counted?

Question. Issue 17 sets targets as ratios to cuDNN in the same run, on FlashAttention's grid from N = 4096 (bf16,
B = 16384/N, H = 2048/D, D 64/128, causal and not): step 05's forward >= 0.95x, step 06's forward + backward >= 0.90x,
step 07's CUDA forward (v6 since 64c8cb2) >= 0.90x. One grid run times each cell once, and between runs a cell's ratio
moved by up to 7% (``results/h200/grid_1203f/`` against ``grid_1203e/``: cuDNN's own time at D = 64 causal N = 8192
was 1.200 ms in one and 1.271-1.276 in three others). Which cells meet their target in most of several alternated
rounds, and which only in some?

Method. ``bench.core.measure`` exactly as ``python -m bench grid`` times a row (``do_bench`` median, warm-up 25 ms,
rep 100 ms, fresh inputs), with the solutions as they ship (``ATTN_GLUON_FWD`` and ``ATTN_GLUON_DKDV`` "1"). For each
round, each cell: ours then cuDNN's SDPA backend, back to back, the ratio taken within the pair; ROUNDS rounds (the
cells in the same order each round). Reported per cell: the median of the rounds' ratios, their range, and how many
rounds met the target.

    python bench/experiments/issue17_targets.py --out DIR [--rounds 5] [--cuda]   # an H200: ~2 min (+2 with --cuda)
    python bench/experiments/issue17_targets.py --small                            # a CPU: the script's plumbing

Answer (one H200, 2026-12-03 20:36 UTC, 0fc6341's GPU code, five rounds; results/h200/issue17_targets/): the Triton
forward meets 0.95x in 10 of 12 cells (D=64 causal N=8192 at the median only, 0.966, 3 of 5 rounds), not at causal
N=4096 (0.82x at D=64, 0.89x at D=128); the Triton forward + backward meets 0.90x in 2 of 12 (D=64 without a mask,
N 8192 and 16384; elsewhere 0.80-0.89); step 07 v6's forward meets 0.90x in 11 of 12 (D=128 without a mask N=4096
0.873 at the median, 0.85-0.95: cuDNN's own time moved 0.826-0.907 ms across the rounds, ours 0.944-0.971).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.experiments import gpu_run  # noqa: E402

REC = gpu_run.Record("issue17_targets")
log = REC.log

# (impl as ``bench.core.implementations`` names it, mode, target ratio to cuDNN)
TARGETS = [("step05", "fwd", 0.95), ("step06", "fwd+bwd", 0.90)]
CUDA_TARGET = ("step07-v6", "fwd", 0.90)
LENGTHS = (4096, 8192, 16384)


def cells(lengths=LENGTHS, dims=(64, 128), small=False):
    """(D, causal, N, B, H) of FlashAttention's grid at these lengths: 16k tokens a batch, hidden 2048 (``small``:
    B = 1, H = 2)."""
    return [(d, c, n, *((1, 2) if small else (16384 // n, 2048 // d))) for d in dims for c in (False, True)
            for n in lengths]


def summarize(pairs: list[tuple[float, float]], target: float) -> dict:
    """Per-round (ours ms, cuDNN ms) pairs -> the ratios (cuDNN / ours), their median, range and how many meet
    ``target``. Rounds where either side has no time are left out (and counted)."""
    ratios = [c / o for o, c in pairs if o and c]
    if not ratios:
        return {"ratios": [], "median": None, "min": None, "max": None, "met": 0, "rounds": 0,
                "missing": len(pairs)}
    return {"ratios": [round(r, 4) for r in ratios], "median": round(statistics.median(ratios), 4),
            "min": round(min(ratios), 4), "max": round(max(ratios), 4),
            "met": sum(r >= target for r in ratios), "rounds": len(ratios), "missing": len(pairs) - len(ratios)}


def verdict(s: dict, target: float) -> str:
    if not s["rounds"]:
        return "not measured"
    if s["met"] == s["rounds"]:
        return "met in every round"
    if s["median"] >= target:
        return f"met at the median ({s['met']}/{s['rounds']} rounds)"
    return "not met" + (f" ({s['met']}/{s['rounds']} rounds)" if s["met"] else "")


def run(targets, rounds: int, device: str, dtype, lengths, dims, budget_s: float, small: bool = False) -> dict:
    from bench.core import implementations, measure
    impls = implementations("solutions", device)
    names = sorted({t[0] for t in targets} | {"sdpa-cudnn"})
    missing = {n: impls[n] for n in names if not callable(impls.get(n))}
    if missing:
        raise RuntimeError(f"implementations not available here: {missing}")
    grid = cells(lengths, dims, small)
    raw = {f"{impl} {mode} D{d} {'causal' if c else 'none'} N{n}": [] for impl, mode, _ in targets
           for d, c, n, _, _ in grid}
    t0 = time.time()
    for r in range(rounds):
        if time.time() - t0 > budget_s:
            log(f"budget reached: rounds {r + 1}.. not run")
            break
        for impl, mode, target in targets:
            for d, c, n, b, h in grid:
                key = f"{impl} {mode} D{d} {'causal' if c else 'none'} N{n}"
                ms = {}
                for name in (impl, "sdpa-cudnn"):
                    row = measure(name, impls[name], B=b, H=h, N=n, D=d, causal=c, dtype=dtype, device=device,
                                  modes=(mode,))[0]
                    ms[name] = row.ms if row.status == "ok" else None
                    if row.status != "ok":
                        log(f"  {key}: {name} {row.status}")
                raw[key].append((ms[impl], ms["sdpa-cudnn"]))
                o, cu = ms[impl], ms["sdpa-cudnn"]
                log(f"  round {r + 1} {key:<36} ours {o if o is None else f'{o:.3f}'} ms  cuDNN "
                    f"{cu if cu is None else f'{cu:.3f}'} ms" + (f"  {cu / o:.3f}x" if o and cu else ""))
        REC.result["raw"] = raw
        REC.save()
    table = {}
    for impl, mode, target in targets:
        for d, c, n, _, _ in grid:
            key = f"{impl} {mode} D{d} {'causal' if c else 'none'} N{n}"
            s = summarize(raw[key], target)
            s["target"] = target
            s["verdict"] = verdict(s, target)
            table[key] = s
    REC.result["table"] = table
    return table


def markdown(table: dict) -> str:
    lines = ["| cell | target | median | range | rounds met | verdict |", "|---|---|---|---|---|---|"]
    for key, s in table.items():
        rng = f"{s['min']:.2f}-{s['max']:.2f}" if s["rounds"] else "-"
        med = f"{s['median']:.3f}" if s["rounds"] else "-"
        lines.append(f"| {key} | {s['target']:.2f} | {med} | {rng} | {s['met']}/{s['rounds']} | {s['verdict']} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--cuda", action="store_true", help="also step 07 v6's forward (builds the CUDA extension)")
    ap.add_argument("--budget-s", type=float, default=300, help="start no round after this many seconds")
    ap.add_argument("--small", action="store_true", help="a CPU: step 05 against the math backend, tiny shapes")
    args = ap.parse_args()
    # The solutions as they ship (gpu_run.Record turns the Gluon paths off unless asked).
    os.environ["ATTN_GLUON_FWD"] = "1"
    os.environ["ATTN_GLUON_DKDV"] = "1"
    if args.small:
        global log
        log = print
        import bench.core as core
        impls = core.implementations("solutions", "cpu")
        # The plumbing on a CPU: step 05's forward (the Triton interpreter) against the math backend as "cuDNN".
        core.implementations = lambda *a, **k: {**impls, "sdpa-cudnn": impls["sdpa-math"]}
        table = run([("step05", "fwd", 0.95)], 2, "cpu", torch.float32, (64,), (16,), 60, small=True)
        print(markdown(table))
        return 0
    if not torch.cuda.is_available():
        ap.error("an H200 (or --small on a CPU)")
    if args.out is None:
        ap.error("--out DIR")
    REC.open(args.out, ROOT)
    REC.result["gpu"] = torch.cuda.get_device_name()
    targets = TARGETS + ([CUDA_TARGET] if args.cuda else [])

    @REC.part("1 rounds")
    def part1():
        table = run(targets, args.rounds, "cuda", torch.bfloat16, LENGTHS, (64, 128), args.budget_s)
        log(markdown(table))
        return {"cells": len(table)}
    part1()
    REC.save()
    log(f"wrote {REC.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
