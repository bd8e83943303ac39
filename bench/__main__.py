"""Benchmark every step side by side.

    python -m bench                      # CPU: a small sweep (~1 min); GPU: all three suites
    python -m bench sweep|grid|leaderboard [--impls naive,step04] [--out results/run]
    python -m bench plot results/h200    # redraw the PNGs from the JSON, no GPU needed
    python -m bench merge OUT A/results.json B/results.json   # runs cut short by their budget, as one
    python -m bench grid --missing-from A/results.json        # measure only the rows A lacks
    python -m bench profile --impl step04 --N 1024 [--causal] [--bwd]
    python -m bench varlen [--out DIR]   # step 08: packed ragged batch vs padded SDPA-FLASH and dense step 06
    python -m bench sparse [--out DIR]   # step 09 vs FlexAttention with the same block mask
    python -m bench varlen|sparse --plot results/h200/varlen|sparse     # redraw their PNG, no GPU needed

Suites
  sweep        the CS336 sweep: batch 8, one head, D in {16,32,64,128}, N in {256..16384}, fp32;
               forward and backward time, memory before the backward, OOM recorded
  grid         FlashAttention's grid: bf16, 16k tokens per batch (B = 16384/N), hidden 2048
               (H = 2048/D), D in {64,128}, N in {512..16384}, causal and not; TFLOP/s and the
               ratio to SDPA's FLASH backend measured in the same run
  leaderboard  the CS336 2025 leaderboard shape: B=1, H=16, N=16384, D=64, bf16, causal, fwd+bwd
  varlen       step 08 (bench/varlen_gpu.py): a 16k-token ragged batch, packed, against SDPA-FLASH on it
               padded and dense step 06 on as many tokens, in the same run (GPU)
  sparse       step 09 (bench/sparse_gpu.py): window + global tokens against FlexAttention with the same
               block mask, N 8k-64k, forward and forward + backward, in the same run (GPU)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from . import core, plots

# fp32 sweep: SDPA's flash and cuDNN backends refuse fp32, so they are left out there.
SWEEP_IMPLS = ["naive", "compiled", "step04", "step05", "step06", "sdpa-efficient", "sdpa-math",
               "step04-compiled", "step07"]
# In order of importance: a time budget cuts from the end.
GRID_IMPLS = ["sdpa-flash", "step05", "step06", "step07", "sdpa-cudnn", "naive", "compiled", "step04",
              "sdpa-efficient", "sdpa-math", "step04-compiled"]


def _progress(items, desc):
    try:
        from tqdm import tqdm
        return tqdm(items, desc=desc, file=sys.stderr, leave=False)
    except ImportError:
        return items


def row_key(r):
    """What one row measures: two rows with this key are the same measurement (of different runs)."""
    return (r.suite, r.impl, r.mode, r.dtype, r.B, r.H, r.N, r.D, r.causal)


def measured_keys(rows):
    """The measurements a previous run already has (status ok)."""
    return {row_key(r) for r in rows if r.status == "ok"}


def run_suite(suite, impls, device, small, machine, default_impls=False, deadline=None, have=frozenset()):
    configs = []
    if suite == "sweep":
        Ds = [64] if small else [16, 32, 64, 128]
        Ns = [256, 1024] if small else [256, 1024, 4096, 8192, 16384]
        for D in Ds:
            for N in Ns:
                configs.append(dict(B=8, H=1, N=N, D=D, causal=False, dtype=torch.float32, modes=("fwd", "bwd")))
    elif suite == "grid":
        dtype = torch.float32 if small else torch.bfloat16
        Ds = [64] if small else [64, 128]
        Ns = [256, 512] if small else [512, 1024, 2048, 4096, 8192, 16384]
        tokens, hidden = (1024, 256) if small else (16384, 2048)
        for D in Ds:
            for N in Ns:
                for causal in (False, True):
                    configs.append(dict(B=max(1, tokens // N), H=hidden // D, N=N, D=D, causal=causal,
                                        dtype=dtype, modes=("fwd", "fwd+bwd")))
    elif suite == "leaderboard":
        N = 512 if small else 16384
        configs.append(dict(B=1, H=16, N=N, D=64, causal=True, dtype=torch.float32 if small else torch.bfloat16,
                            modes=("fwd+bwd",)))
    rows = []
    if suite == "sweep" and device == "cuda" and default_impls:
        impls = {n: f for n, f in impls.items() if n in SWEEP_IMPLS}
    # Implementations outer, in the order given (SDPA-FLASH first): if the time budget runs
    # out, the least important implementations are the ones left unmeasured, not the large N.
    order = sorted(impls, key=lambda n: (n != "sdpa-flash", list(impls).index(n)))
    work = [(c, name) for name in order for c in configs]
    for c, name in _progress(work, suite):
        fn = impls[name]
        modes = c["modes"]
        dt = str(c["dtype"]).replace("torch.", "")
        if name != "sdpa-flash" and all((suite, name, m, dt, c["B"], c["H"], c["N"], c["D"], c["causal"]) in have
                                        for m in modes):
            continue        # --missing-from: measured before; SDPA-FLASH always runs (the ratios need it)
        if deadline is not None and time.monotonic() > deadline:
            fn = "skipped: the run's time budget (--budget-s) was spent"
        if isinstance(fn, str):
            rows += [core.Row(impl=name, mode=m, dtype=str(c["dtype"]).replace("torch.", ""), B=c["B"], H=c["H"],
                              N=c["N"], D=c["D"], causal=c["causal"], status=fn[:160], machine=machine,
                              suite=suite)
                     for m in modes]
            continue
        measured = core.measure(name, fn, B=c["B"], H=c["H"], N=c["N"], D=c["D"], causal=c["causal"],
                                dtype=c["dtype"], device=device, modes=tuple(m if m != "bwd" else "fwd+bwd"
                                                                              for m in modes), machine=machine,
                                suite=suite)
        if "bwd" in modes:   # the sweep reports the backward alone: fwd+bwd minus fwd
            fwd = next((r for r in measured if r.mode == "fwd"), None)
            for r in measured:
                if r.mode == "fwd+bwd" and r.ms and fwd and fwd.ms:
                    r.mode, r.ms = "bwd", max(r.ms - fwd.ms, 0.0)
                    r.tflops = core.flops(r.B, r.H, r.N, r.D, r.causal, "bwd") / (r.ms * 1e-3) / 1e12 if r.ms else None
                elif r.mode == "fwd+bwd":
                    r.mode = "bwd"
        rows += measured
    return core.add_ratios(rows)


def draw(rows, out: Path, ceilings=None):
    made = []
    sweep = [r for r in rows if r.suite == "sweep"]
    if sweep:
        Ds = sorted({r.D for r in sweep})
        for mode in ("fwd", "bwd"):
            made.append(plots.plot_lines(sweep, "ms", out / f"sweep_{mode}_ms.png", ylabel=f"{mode} ms",
                                         panels=[(f"D={d}, {mode}", dict(D=d, mode=mode)) for d in Ds]))
        made.append(plots.plot_lines(sweep, "mem_before_bwd_mib", out / "sweep_memory.png",
                                     ylabel="MiB in use before the backward",
                                     panels=[(f"D={d}", dict(D=d, mode="bwd")) for d in Ds]))
    grid = [r for r in rows if r.suite == "grid"]
    if grid:
        Ds = sorted({r.D for r in grid})
        for mode in ("fwd", "fwd+bwd"):
            made.append(plots.plot_lines(grid, "tflops", out / f"grid_{mode.replace('+', '_')}_tflops.png",
                                         ylabel=f"{mode} TFLOP/s", logy=False,
                                         panels=[(f"D={d}, {'causal' if c else 'full'}, {mode}",
                                                  dict(D=d, causal=c, mode=mode)) for d in Ds for c in (False, True)]))
        if ceilings:
            made.append(plots.plot_roofline(grid, ceilings, out / "roofline.png",
                                            match=dict(D=max(Ds), causal=False, mode="fwd")))
    return [m for m in made if m]


def merge_rows(runs):
    """Rows of several runs of one suite on one machine as one table, oldest run first.

    A measured row replaces a row of the same measurement that was skipped or failed; between
    two measured rows the later run wins. Each row keeps its own machine block (its date) and
    its ratio to SDPA-FLASH, which was computed against SDPA-FLASH in *its* run. Runs on
    different GPUs are refused: their times are not comparable.
    """
    gpus = {r.machine.get("gpu") for rows in runs for r in rows}
    if len(gpus) > 1:
        raise SystemExit(f"refusing to merge runs from different machines: {sorted(map(str, gpus))}")
    out = {}
    for rows in runs:
        for r in rows:
            key = row_key(r)
            old = out.get(key)
            if old is None or r.status == "ok" or old.status != "ok":
                out[key] = r
    return list(out.values())


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("varlen", "sparse"):         # their own scripts, their own options
        import importlib
        return importlib.import_module(f"bench.{argv[0]}_gpu").main(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("suite", nargs="?", default="default",
                    choices=["default", "sweep", "grid", "leaderboard", "plot", "profile", "merge", "varlen", "sparse"])
    ap.add_argument("path", nargs="?", help="for `plot`: the folder holding results.json; for `merge`: the output folder")
    ap.add_argument("inputs", nargs="*", type=Path, help="for `merge`: the results.json files, oldest first")
    ap.add_argument("--impls", help="comma-separated implementations (default: all that run here)")
    ap.add_argument("--impl", default=None, help="for `profile`: one implementation")
    ap.add_argument("--code", default="solutions", help="steps, solutions or a folder (default: solutions)")
    ap.add_argument("--out", type=Path, default=None, help="output folder (default: out/bench-<device>)")
    ap.add_argument("--full", action="store_true", help="on a CPU, the real sizes (slow)")
    ap.add_argument("--N", type=int, default=1024)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--bwd", action="store_true")
    ap.add_argument("--missing-from", type=Path, default=None,
                    help="a results.json: measure only what it lacks (SDPA-FLASH always, for the ratios); "
                         "join the two with `merge`")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="stop starting measurements after this many seconds (rows left say so)")
    args = ap.parse_args(argv)

    if args.suite == "merge":
        if not args.path or len(args.inputs) < 2:
            ap.error("merge needs an output folder and at least two results.json files")
        folder = Path(args.path)
        rows = merge_rows([core.load_rows(p) for p in args.inputs])
        core.save(rows, folder / "results.json", folder / "results.csv")
        print(core.table(rows))
        for p in draw(rows, folder):
            print("wrote", p)
        print(f"wrote {folder / 'results.json'}: {len(rows)} rows from {len(args.inputs)} runs")
        return 0

    if args.suite == "plot":
        folder = Path(args.path or "results/h200")
        rows = core.load_rows(folder / "results.json")
        ceil = folder / "ceilings.json"
        import json
        ceilings = json.loads(ceil.read_text()) if ceil.exists() else None
        for p in draw(rows, folder, ceilings):
            print("wrote", p)
        return 0

    device = "cuda" if torch.cuda.is_available() else "cpu"
    small = device == "cpu" and not args.full
    impls = core.implementations(args.code, device)

    if args.suite == "profile":
        from .profiling import profile
        return profile(impls, args.impl or "step04", device=device, N=args.N, D=args.D,
                       causal=args.causal, bwd=args.bwd, out=args.out or Path("out/profile"))

    if args.impls:
        names = args.impls.split(",")
        unknown = [n for n in names if n not in impls]
        if unknown:
            ap.error(f"unknown implementation(s) {unknown}; known: {sorted(impls)}")
    else:
        names = core.CPU_DEFAULT if device == "cpu" else GRID_IMPLS
    impls = {n: impls[n] for n in names}
    suites = ["sweep", "grid", "leaderboard"] if args.suite == "default" else [args.suite]
    out = args.out or Path(f"out/bench-{device}")
    out.mkdir(parents=True, exist_ok=True)
    machine = core.machine_info()
    ceilings = core.measure_ceilings(device)
    rows = []
    deadline = time.monotonic() + args.budget_s if args.budget_s else None
    have = measured_keys(core.load_rows(args.missing_from)) if args.missing_from else frozenset()
    for suite in suites:
        rows += run_suite(suite, impls, device, small, machine, default_impls=not args.impls, deadline=deadline,
                          have=have)
        core.save(rows, out / "results.json", out / "results.csv")      # keep what is done
    if ceilings:
        import json
        (out / "ceilings.json").write_text(json.dumps(ceilings, indent=1))
        print(f"ceilings measured now: bf16 matmul {ceilings['bf16_matmul_tflops']:.0f} TFLOP/s, "
              f"copy {ceilings['copy_gbps']:.0f} GB/s")
    print(core.table(rows))
    for p in draw(rows, out, ceilings):
        print("wrote", p)
    print(f"wrote {out / 'results.json'} and {out / 'results.csv'}  ({machine['gpu'] or 'CPU'}, {machine['date']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
