"""Step 04's figures: peak memory and time against N, naive attention against FlashAttention-2 in PyTorch.

Measured at B=1, H=16, D=64, N in {1024, 4096, 16384}, fp32 and bf16, causal (``--mask``),
forward (inference, under ``no_grad``) and forward + backward, for

    naive            step 01: S and P are N x N
    naive-compiled   step 02: step 01 through torch.compile (still N x N)
    step04           step 04: FlashAttention-2 in PyTorch, Nq x Bk strips
    step04-compiled  step 04 with its strip steps compiled

How, on CUDA:
  - time: median of ``triton.testing.do_bench`` (warm-up, L2 flushed between repeats);
    the first call, compile included, is timed on its own (``first_call_s``);
  - memory: ``torch.cuda.max_memory_allocated()`` during one call, after
    ``reset_peak_memory_stats()``, minus what was allocated before the call (q, k, v, dO):
    ``peak_mib`` is what the call itself needs on top of its inputs;
  - an out-of-memory error is recorded as ``oom`` and the run goes on.
On a CPU (``--small``, to check the script anywhere): N in {128, 256, 512}, H=2, fp32; time by
perf_counter (the fastest of a few runs); memory by watching live storages with a dispatch mode, which sees eager
code only, so the compiled rows carry no memory on a CPU.

Expected (issue 3): step 04's peak memory grows linearly in N, and at N=16k is at least 10x
below naive's. The script prints both ratios after the table; it does not assert them.

    python bench/step04_figures.py --out results/step04_h200           # on the GPU, a few minutes
    python bench/step04_figures.py --small --out /tmp/step04_cpu       # on a CPU, about 2 minutes
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, Python puts bench/ first on sys.path, where bench/profile.py would hide the
# standard library's ``profile`` (which torch imports). Put the repository root there instead.
HERE, REPO = Path(__file__).resolve().parent, Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import argparse  # noqa: E402
import datetime as dt  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

from attnlib import make_dout, make_qkv  # noqa: E402
from attnlib.loader import load_step  # noqa: E402
from attnlib.memory import LiveBytes  # noqa: E402
from bench.core import no_silent_eager  # noqa: E402

IMPLS = {                      # name -> (step, function name, takes tile sizes)
    "naive": (1, "attention", False),
    "naive-compiled": (2, "attention", False),
    "step04": (4, "attention", True),
    "step04-compiled": (4, "attention_compiled", True),
}
MODES = ("fwd", "fwd+bwd")


# --- measuring ---------------------------------------------------------------------------------
# On a CPU, peak memory comes from attnlib.memory.LiveBytes.

def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def _is_oom(err):
    return isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err).lower()


def measure(fn, q, k, v, do, mode, device, compiled):
    """One row's numbers: first call (s), peak above the inputs (MiB), time (ms)."""
    def call():
        if mode == "fwd":
            with torch.no_grad():
                fn(q, k, v)
        else:
            q.grad = k.grad = v.grad = None
            fn(q, k, v).backward(do)

    t0 = time.perf_counter()
    call()                                          # compiles, for the compiled variants
    _sync(device)
    first_s = time.perf_counter() - t0

    peak = None
    if device == "cuda":
        q.grad = k.grad = v.grad = None
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        call()
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - before) / 2**20
    elif not compiled:                              # compiled code allocates below the dispatcher
        q.grad = k.grad = v.grad = None
        with LiveBytes() as w:
            call()
        peak = w.peak / 2**20

    if device == "cuda":
        from triton.testing import do_bench
        ms = float(do_bench(call, warmup=25, rep=100, return_mode="median"))
    else:
        # A shared CPU only ever adds time: the fastest of a few runs is the least disturbed.
        ts, budget = [], time.perf_counter() + 1.0
        while len(ts) < 3 or (len(ts) < 10 and time.perf_counter() < budget):
            t = time.perf_counter()
            call()
            ts.append((time.perf_counter() - t) * 1e3)
        ms = min(ts)
    return first_s, peak, ms


def run(args, device):
    no_silent_eager()                   # a compiled row is compiled, or it says error
    steps = {n: load_step(n, "solutions") for n in sorted({s for s, _, _ in IMPLS.values()})}
    fns = {}
    for name in args.impls:
        step, attr, tiled = IMPLS[name]
        f = getattr(steps[step], attr)
        kw = dict(block_q=args.block_q, block_k=args.block_k) if tiled else {}
        fns[name] = lambda q, k, v, c, _f=f, _kw=kw: _f(q, k, v, is_causal=c, **_kw)

    configs = [(dtype, causal, N, name, mode)
               for dtype in args.dtypes for causal in args.causal for N in args.N
               for name in args.impls for mode in MODES]
    rows = []
    try:
        from tqdm import tqdm
        bar = tqdm(configs, desc="step04 figures", file=sys.stderr)
    except ImportError:
        bar = configs
    inputs = {}
    for dtype, causal, N, name, mode in bar:
        if hasattr(bar, "set_postfix_str"):
            bar.set_postfix_str(f"{name} {mode} {dtype} N={N}")
        row = dict(impl=name, mode=mode, dtype=dtype, causal=causal, B=args.B, H=args.H, N=N, D=args.D,
                   block_q=args.block_q if IMPLS[name][2] else None,
                   block_k=args.block_k if IMPLS[name][2] else None,
                   ms=None, peak_mib=None, first_call_s=None, status="ok")
        status = "ok"
        try:
            key = (dtype, N)
            if key not in inputs:
                inputs.clear()
                gc.collect()
                if device == "cuda":
                    torch.cuda.empty_cache()
                q, k, v = make_qkv(args.B, args.H, N, N, args.D, dtype=getattr(torch, dtype),
                                   device=device, requires_grad=True)
                inputs[key] = (q, k, v, make_dout(q))
            q, k, v, do = inputs[key]
            first, peak, ms = measure(lambda a, b, c: fns[name](a, b, c, causal), q, k, v, do, mode,
                                      device, compiled=name.endswith("compiled"))
            row.update(ms=ms, peak_mib=peak, first_call_s=first)
        except Exception as err:                    # noqa: BLE001 -- every failure becomes a row
            status = "oom" if _is_oom(err) else f"error: {type(err).__name__}: {str(err).splitlines()[0][:160]}"
        row["status"] = status
        if status != "ok":
            q = k = v = do = None
            for t in inputs.get((dtype, N), ()):
                t.grad = None
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
        rows.append(row)
    return rows


# --- reporting ---------------------------------------------------------------------------------

def table(rows):
    head = (f"{'impl':16} {'mode':8} {'dtype':9} {'mask':6} {'N':>6} {'ms':>10} {'peak MiB':>10} "
            f"{'first s':>8}  status")
    lines = [head, "-" * len(head)]
    f = lambda x, p: "" if x is None else f"{x:.{p}f}"   # noqa: E731
    for r in rows:
        lines.append(f"{r['impl']:16} {r['mode']:8} {r['dtype']:9} {'causal' if r['causal'] else 'full':6} "
                     f"{r['N']:6d} {f(r['ms'], 3):>10} {f(r['peak_mib'], 1):>10} {f(r['first_call_s'], 1):>8}  "
                     f"{'' if r['status'] == 'ok' else r['status']}")
    return "\n".join(lines)


def claims(rows):
    """The issue's two expectations, as measured (printed, not asserted)."""
    out = []
    get = {(r["impl"], r["mode"], r["dtype"], r["causal"], r["N"]): r for r in rows}
    for (impl, mode, dtype, causal, N), r in sorted(get.items(), key=lambda x: str(x[0])):
        if impl != "step04" or r["peak_mib"] is None:
            continue
        Ns = sorted(n for (i, m, d, c, n) in get if (i, m, d, c) == (impl, mode, dtype, causal))
        if N != Ns[-1] or len(Ns) < 2:
            continue
        lo = get[(impl, mode, dtype, causal, Ns[0])]
        mask = "causal" if causal else "full"
        if lo["peak_mib"]:
            out.append(f"step04 {mode} {dtype} {mask}: peak grows {r['peak_mib'] / lo['peak_mib']:.1f}x "
                       f"from N={Ns[0]} to N={N} (N grows {N / Ns[0]:.0f}x; linear would be the same)")
        naive = get.get(("naive", mode, dtype, causal, N))
        if naive and naive["peak_mib"]:
            out.append(f"  at N={N}: naive {naive['peak_mib']:.0f} MiB / step04 {r['peak_mib']:.0f} MiB "
                       f"= {naive['peak_mib'] / r['peak_mib']:.1f}x (expected >= 10x at 16k)")
        elif naive:
            out.append(f"  at N={N}: naive {naive['status']}")
    return "\n".join(out)


def plot(rows, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {n: f"C{i}" for i, n in enumerate(IMPLS)}
    styles = {"float32": "-", "bfloat16": "--", "float16": ":"}
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), squeeze=False)
    ooms = []
    for col, mode in enumerate(MODES):
        for row_i, (key, label) in enumerate((("peak_mib", "peak memory above the inputs (MiB)"),
                                              ("ms", "time (ms)"))):
            ax = axes[row_i][col]
            series = {}
            for r in rows:
                if r["mode"] != mode:
                    continue
                if r["status"] == "oom" and row_i == 0:
                    ooms.append(f"{r['impl']} {r['dtype']} {mode} N={r['N']}")
                if r[key] is None:
                    continue
                series.setdefault((r["impl"], r["dtype"], r["causal"]), []).append((r["N"], r[key]))
            for (impl, dtype, causal), pts in sorted(series.items()):
                pts.sort()
                ax.plot([p[0] for p in pts], [p[1] for p in pts], styles.get(dtype, "-"), marker="o",
                        color=colors[impl], label=f"{impl} {dtype}" + ("" if causal else " full"))
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("N")
            ax.set_title(f"{mode}: {label}", fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
    legend = {}                                     # one legend for all panels: label -> line
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(lab, h)
    fig.legend(list(legend.values()), list(legend.keys()), loc="lower center", ncol=4, fontsize=8)
    note = ("out of memory: " + "; ".join(sorted(set(ooms)))) if ooms else ""
    fig.suptitle(title + ("\n" + note if note else ""), fontsize=10)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def machine(device):
    info = {"host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "device": device,
            "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
            "tf32": torch.backends.cuda.matmul.allow_tf32,
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    try:
        import triton
        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    return info


def merge(paths, out):
    """One figure from several runs of this script (each row keeps its run's date)."""
    merged, runs = {}, []
    for path in paths:
        data = json.loads(Path(path).read_text())
        runs.append({"file": str(path), **data["machine"], "settings": data["settings"]})
        for r in data["rows"]:
            r.setdefault("date", data["machine"]["date"])
            key = (r["impl"], r["mode"], r["dtype"], r["causal"], r["N"])
            old = merged.get(key)
            if old is None or r["status"] == "ok" or old["status"] != "ok":   # a failure never hides a measurement
                merged[key] = r
    order = {n: i for i, n in enumerate(IMPLS)}
    rows = sorted(merged.values(), key=lambda r: (r["dtype"] != "float32", r["causal"], r["N"],
                                                  order.get(r["impl"], 99), r["mode"]))
    gpus = sorted({str(r.get("gpu")) for r in runs})
    if len(gpus) > 1:
        raise SystemExit(f"refusing to merge runs from different machines: {gpus}")
    first = runs[0]
    s = first["settings"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "step04_figures.json").write_text(json.dumps(
        {"machine": {k: v for k, v in first.items() if k not in ("file", "settings")}, "settings": s,
         "runs": runs, "rows": rows}, indent=1, default=str))
    dates = sorted({r["date"] for r in rows})
    title = (f"{first['gpu'] or 'CPU'}, torch {first['torch']}, runs of {', '.join(dates)}\nB={s['B']}, H={s['H']}, "
             f"D={s['D']}, {s['mask']}; step 04 tiles {s['block_q']}x{s['block_k']}")
    plot(rows, out / "step04_figures.png", title)
    print(table(rows))
    print()
    print(claims(rows))
    print(f"\nwrote {out / 'step04_figures.json'} and {out / 'step04_figures.png'} from {len(paths)} runs")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder for step04_figures.json and .png")
    ap.add_argument("--merge", type=Path, nargs="+", metavar="JSON",
                    help="measure nothing: merge these step04_figures.json files (a later file's row replaces "
                         "an earlier one of the same impl, mode, dtype, mask and N, unless it failed where "
                         "the earlier was measured), redraw the plot")
    ap.add_argument("--small", action="store_true", help="CPU sizes: N in {128, 256, 512}, H=2, fp32")
    ap.add_argument("--N", type=int, nargs="+", help="sequence lengths (default 1024 4096 16384)")
    ap.add_argument("--dtypes", nargs="+", choices=["float32", "bfloat16", "float16"],
                    help="default float32 bfloat16 (float32 only with --small)")
    ap.add_argument("--mask", choices=["causal", "full", "both"], default="causal")
    ap.add_argument("--impls", nargs="+", choices=list(IMPLS), default=list(IMPLS))
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--H", type=int, help="heads (default 16; 2 with --small)")
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--block-q", type=int, help="step 04's Bq (default 128 on CUDA, 64 on a CPU)")
    ap.add_argument("--block-k", type=int, help="step 04's Bk (default 128 on CUDA, 64 on a CPU)")
    args = ap.parse_args(argv)
    if args.merge:
        return merge(args.merge, args.out)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and not args.small:
        print("no GPU: running the --small sizes on the CPU", file=sys.stderr)
        args.small = True
    args.N = args.N or ([128, 256, 512] if args.small else [1024, 4096, 16384])
    args.dtypes = args.dtypes or (["float32"] if args.small else ["float32", "bfloat16"])
    args.H = args.H or (2 if args.small else 16)
    tile = 128 if device == "cuda" else 64
    args.block_q, args.block_k = args.block_q or tile, args.block_k or tile
    args.causal = {"causal": [True], "full": [False], "both": [False, True]}[args.mask]
    torch.backends.cuda.matmul.allow_tf32 = False   # fp32 means fp32, as in the tests

    rows = run(args, device)
    info = machine(device)
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "step04_figures.json").write_text(json.dumps(
        {"machine": info, "settings": settings, "rows": rows}, indent=1, default=str))
    title = (f"{info['gpu'] or 'CPU'}, torch {info['torch']}, {info['date']}: B={args.B}, H={args.H}, "
             f"D={args.D}, {args.mask}; step 04 tiles {args.block_q}x{args.block_k}")
    plot(rows, args.out / "step04_figures.png", title)
    print(table(rows))
    print()
    print(claims(rows))
    print(f"\nwrote {args.out / 'step04_figures.json'} and {args.out / 'step04_figures.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
