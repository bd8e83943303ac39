"""Steps 05-06 on a GPU, in one call: check, (tune,) time against SDPA, write JSON.

    python bench/triton_gpu.py --out results/h200/triton_gpu.json            # tests + benchmark
    python bench/triton_gpu.py --tune --out ...                              # + tile sweep first
    python bench/triton_gpu.py --plot results/h200/triton_gpu.json           # PNGs, no GPU needed

Order, as llm.c's dev/cuda does it: the GPU test cases first (bf16 and the
rest that a CPU cannot run), then a check of each benchmark shape against
SDPA-FLASH, and only then the timings. Every timing is the median of
``triton.testing.do_bench`` (CUDA events, L2 flushed between repeats), and
SDPA's FLASH and cuDNN backends are timed in the same run, on the same inputs.

FLOPs as FlashAttention counts them: forward 4*B*H*N^2*D (two products of
2*N^2*D), halved when causal; backward 2.5x forward (four products + S
recomputed); fwd+bwd 3.5x forward. The grid is FlashAttention's: 16k tokens
per batch (B = 16384 / N), hidden 2048 (H = 2048 / D), bf16.

Compiling a Triton kernel costs about a second; the dozens this script needs
are compiled first by a pool of processes (one per CPU core, each launching
the kernels once on a tiny input of the same specialization), so the timed
process finds them in Triton's on-disk cache.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

if "--dry-run" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")     # before anything imports triton

import torch  # noqa: E402

GRID_N = [512, 1024, 2048, 4096, 8192, 16384]
GRID_D = [64, 128]
TOKENS, HIDDEN = 16384, 2048
LEADERBOARD = dict(B=1, H=16, N=16384, D=64, causal=True)
LEADERBOARD_MS = 5.36        # best CS336 2025 leaderboard time (an H100)
TUNE_N = [2048, 8192]
DEVICE, DTYPE = "cuda", torch.bfloat16


def dry_run_sizes():
    """--dry-run: the whole script on a CPU, through the interpreter, at toy sizes (fp16)."""
    global GRID_N, TOKENS, HIDDEN, LEADERBOARD, TUNE_N, DEVICE, DTYPE
    GRID_N, TOKENS, HIDDEN, TUNE_N = [64, 128], 256, 128, [128]
    LEADERBOARD = dict(B=1, H=2, N=128, D=64, causal=True)
    DEVICE, DTYPE = "cpu", torch.float16
    for cands in (FWD_CANDIDATES, DKDV_CANDIDATES, DQ_CANDIDATES, ATOMIC_CANDIDATES):
        for d in cands:
            del cands[d][2:]

# Tile candidates for --tune (bf16/fp16 on sm_90). Each was compiled for sm_90 beforehand
# and has no register spills (see the notes in step 05 / 06).
FWD_CANDIDATES = {
    64: [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 4, 4), (64, 64, 4, 3), (128, 32, 4, 4)],
    128: [(128, 64, 8, 3), (128, 64, 8, 2), (128, 128, 8, 2), (128, 64, 8, 4), (64, 64, 4, 3), (128, 32, 8, 4)],
}
DKDV_CANDIDATES = {      # (BLOCK_M queries per step, BLOCK_N keys per program, warps, stages)
    64: [(32, 128, 4, 4), (64, 128, 8, 3), (64, 64, 4, 3), (32, 64, 4, 4), (64, 128, 8, 2), (32, 128, 8, 3)],
    128: [(32, 128, 8, 3), (64, 128, 8, 2), (32, 64, 4, 3), (16, 128, 8, 3), (32, 128, 8, 2), (64, 64, 8, 2)],
}
DQ_CANDIDATES = {        # (BLOCK_M queries per program, BLOCK_N keys per step, warps, stages)
    64: [(128, 32, 4, 4), (128, 64, 8, 3), (64, 64, 4, 3), (128, 64, 4, 3), (64, 32, 4, 4)],
    128: [(128, 32, 8, 3), (128, 64, 8, 2), (64, 64, 4, 3), (64, 32, 4, 3), (128, 32, 8, 4)],
}
ATOMIC_CANDIDATES = {
    64: [(64, 128, 8, 3), (32, 128, 4, 4), (64, 64, 4, 3)],
    128: [(32, 128, 8, 3), (64, 128, 8, 2), (32, 64, 4, 3)],
}


# --sweep-leaderboard: the candidates above for D=64 plus these (all compiled for sm_90 first: none spills).
LEADERBOARD_EXTRA = {
    "fwd": [(128, 64, 8, 2), (128, 64, 8, 4), (128, 128, 8, 2), (64, 64, 4, 4), (64, 128, 4, 3), (256, 64, 8, 2),
            (256, 64, 8, 3)],
    "dkdv": [(32, 128, 4, 3), (32, 128, 4, 5), (64, 128, 8, 4), (64, 64, 4, 4), (16, 128, 4, 4), (32, 256, 8, 3)],
    "dq": [(128, 64, 8, 4), (128, 64, 8, 2), (128, 128, 8, 2), (128, 128, 8, 3), (64, 64, 4, 4), (256, 32, 8, 3),
           (64, 128, 4, 3)],
    "atomic": [(64, 128, 8, 4), (32, 256, 8, 3)],
}


def cfg_of(t, keys=("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")):
    return dict(zip(keys, t))


def machine_info():
    import triton
    return {
        "host": platform.node(), "python": platform.python_version(),
        "torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def flops(B, H, N, D, causal, mode):
    f = 4.0 * B * H * N * N * D / (2 if causal else 1)
    return {"fwd": f, "bwd": 2.5 * f, "fwd+bwd": 3.5 * f}[mode]


def steps():
    from attnlib.loader import load_step
    return load_step(5, "solutions"), load_step(6, "solutions")


def inputs(B, H, N, D, grad=False, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    q, k, v, do = (torch.randn(B, H, N, D, device=DEVICE, dtype=DTYPE, generator=g) for _ in range(4))
    if grad:
        for t in (q, k, v):
            t.requires_grad_(True)
    return q, k, v, do


# %% Precompiling in parallel --------------------------------------------------------------

def _compile_job(job):
    """Run one kernel configuration once on a tiny input with the benchmark's specialization."""
    torch.cuda.init()
    s5, s6 = steps()
    D, causal, kind, cfg = job
    q, k, v, do = inputs(8, 16, 256, D)         # N, H, strides divisible by 16, as in the grid
    scale = D ** -0.5
    try:
        if kind == "fwd":
            s5.forward(q, k, v, causal, scale, config=cfg)
        else:
            o, lse = s5.forward(q, k, v, causal, scale)
            s6.backward(q, k, v, o, lse, do, causal, scale, config=cfg["config"], dq_mode=cfg["mode"])
        torch.cuda.synchronize()
        return None
    except Exception as e:                        # reported, and the config is dropped from the sweep
        return f"{job}: {type(e).__name__}: {str(e).splitlines()[0][:200]}"


def precompile(jobs, workers):
    import multiprocessing as mp
    t = time.time()
    ctx = mp.get_context("spawn")
    with ctx.Pool(workers) as pool:
        errors = [e for e in pool.map(_compile_job, jobs, chunksize=1) if e]
    print(f"precompiled {len(jobs)} configurations in {time.time() - t:.0f} s with {workers} processes"
          + (f"; {len(errors)} failed" if errors else ""), flush=True)
    for e in errors:
        print("  compile failure:", e, flush=True)
    return errors


def bwd_cfg(dkdv, dq, mode):
    return {"config": dict(dkdv=cfg_of(dkdv), dq=cfg_of(dq), pre=dict(BLOCK_M=128), dq_mode=mode), "mode": mode}


# %% Timing ---------------------------------------------------------------------------------

def bench_ms(fn, rep=100):
    if DEVICE != "cuda":
        fn()
        ts = []
        for _ in range(2):
            t = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t) * 1e3)
        return sorted(ts)[len(ts) // 2]
    from triton.testing import do_bench
    return float(do_bench(fn, warmup=25, rep=rep, return_mode="median"))


def sdpa_fn(backend, q, k, v, causal, mode, do):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    b = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}[backend]

    def fwd():
        with sdpa_kernel([b]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if mode == "fwd":
        return fwd
    return lambda: torch.autograd.grad(fwd(), (q, k, v), do)


def triton_fn(q, k, v, causal, mode, do, fcfg=None, bcfg=None, dq_mode=None):
    """Through the public autograd Function when no configs are given (the tuned table)."""
    s5, s6 = steps()
    scale = q.shape[-1] ** -0.5
    if fcfg is None and bcfg is None:
        if mode == "fwd":
            return lambda: s5.attention_with_lse(q, k, v, is_causal=causal)
        return lambda: torch.autograd.grad(s6.attention(q, k, v, is_causal=causal, dq_mode=dq_mode), (q, k, v), do)
    if mode == "fwd":
        return lambda: s5.forward(q, k, v, causal, scale, config=fcfg)

    def run():
        o, lse = s5.forward(q, k, v, causal, scale, config=fcfg)
        return s6.backward(q, k, v, o, lse, do, causal, scale, config=bcfg, dq_mode=dq_mode)
    return run


# %% Tuning -------------------------------------------------------------------------------------

def tune(info):
    """Sweep the candidates at TUNE_N; returns (best configs per (D, causal), sweep rows)."""
    os.environ["ATTN_GLUON_DKDV"] = "0"     # the Triton dK/dV tiles, not step 06's Gluon kernel (its Hopper path)
    os.environ["ATTN_GLUON_FWD"] = "0"      # and the Triton forward's, not step 05's Gluon kernel
    s5, s6 = steps()
    rows, best = [], {}
    for D in GRID_D:
        for causal in (False, True):
            key = f"d{D}-{'causal' if causal else 'full'}"
            res = {"fwd": {}, "dkdv": {}, "dq": {}, "atomic": {}}
            for N in TUNE_N:
                B, H = TOKENS // N, HIDDEN // D
                q, k, v, do = inputs(B, H, N, D)
                scale = D ** -0.5
                o, lse = s5.forward(q, k, v, causal, scale)
                base_dq = DQ_CANDIDATES[D][0]
                base_dkdv = DKDV_CANDIDATES[D][0]
                plan = ([("fwd", c) for c in FWD_CANDIDATES[D]] + [("dkdv", c) for c in DKDV_CANDIDATES[D]]
                        + [("dq", c) for c in DQ_CANDIDATES[D]] + [("atomic", c) for c in ATOMIC_CANDIDATES[D]])
                for kind, c in plan:
                    try:
                        if kind == "fwd":
                            ms = bench_ms(lambda: s5.forward(q, k, v, causal, scale, config=cfg_of(c)), rep=50)
                        else:
                            if kind == "dkdv":
                                b = bwd_cfg(c, base_dq, "separate")
                            elif kind == "dq":
                                b = bwd_cfg(base_dkdv, c, "separate")
                            else:
                                b = bwd_cfg(c, base_dq, "atomic")
                            ms = bench_ms(lambda: s6.backward(q, k, v, o, lse, do, causal, scale,
                                                              config=b["config"], dq_mode=b["mode"]), rep=50)
                    except Exception as e:
                        print(f"  tune {key} N={N} {kind} {c}: {type(e).__name__} {str(e)[:120]}", flush=True)
                        continue
                    res[kind].setdefault(c, []).append(ms)
                    rows.append(dict(kind=kind, config=list(c), B=B, H=H, N=N, D=D, causal=causal, ms=ms,
                                     machine=info))
            # Best = smallest total time over the tuning lengths.
            pick = {kind: min(r, key=lambda c: sum(r[c])) for kind, r in res.items() if r}
            best[(D, causal)] = pick
            print(f"tuned {key}: {pick}", flush=True)
    return best, rows


def sweep_leaderboard(info, workers):
    """Every candidate on the leaderboard shape itself, each kernel varied with the others at their best."""
    os.environ["ATTN_GLUON_DKDV"] = "0"     # the Triton dK/dV tiles, not step 06's Gluon kernel (its Hopper path)
    os.environ["ATTN_GLUON_FWD"] = "0"      # and the Triton forward's, not step 05's Gluon kernel
    s5, s6 = steps()
    B, H, N, D, causal = LEADERBOARD["B"], LEADERBOARD["H"], LEADERBOARD["N"], LEADERBOARD["D"], True
    cands = {k: list(dict.fromkeys(base[D] + LEADERBOARD_EXTRA[k]))
             for k, base in (("fwd", FWD_CANDIDATES), ("dkdv", DKDV_CANDIDATES), ("dq", DQ_CANDIDATES),
                             ("atomic", ATOMIC_CANDIDATES))}
    d0, q0 = DKDV_CANDIDATES[D][0], DQ_CANDIDATES[D][0]
    jobs = [(D, causal, "fwd", cfg_of(c)) for c in cands["fwd"]]
    jobs += [(D, causal, "bwd", bwd_cfg(c, q0, "separate")) for c in cands["dkdv"]]
    jobs += [(D, causal, "bwd", bwd_cfg(d0, c, "separate")) for c in cands["dq"]]
    jobs += [(D, causal, "bwd", bwd_cfg(c, q0, "atomic")) for c in cands["atomic"]]
    if DEVICE == "cuda":
        precompile(jobs, workers)
    q, k, v, do = inputs(B, H, N, D)
    scale = D ** -0.5
    o, lse = s5.forward(q, k, v, causal, scale)
    rows, best = [], {}

    def run(kind, c, fn):
        try:
            ms = bench_ms(fn)
        except Exception as e:
            print(f"  {kind} {c}: {type(e).__name__} {str(e)[:100]}", flush=True)
            return None
        rows.append(dict(kind=kind, config=list(c), B=B, H=H, N=N, D=D, causal=causal, ms=ms, machine=info))
        return ms
    res = {c: run("fwd", c, lambda c=c: s5.forward(q, k, v, causal, scale, config=cfg_of(c))) for c in cands["fwd"]}
    best["fwd"] = min((c for c in res if res[c]), key=res.get)
    res = {c: run("dkdv", c, lambda c=c: s6.backward(q, k, v, o, lse, do, causal, scale,
                                                     config=bwd_cfg(c, q0, "separate")["config"]))
           for c in cands["dkdv"]}
    best["dkdv"] = min((c for c in res if res[c]), key=res.get)
    res = {c: run("dq", c, lambda c=c: s6.backward(q, k, v, o, lse, do, causal, scale,
                                                   config=bwd_cfg(best["dkdv"], c, "separate")["config"]))
           for c in cands["dq"]}
    best["dq"] = min((c for c in res if res[c]), key=res.get)
    res = {c: run("atomic", c, lambda c=c: s6.backward(q, k, v, o, lse, do, causal, scale,
                                                       config=bwd_cfg(c, q0, "atomic")["config"], dq_mode="atomic"))
           for c in cands["atomic"]}
    best["atomic"] = min((c for c in res if res[c]), key=res.get)
    for kind, c in best.items():
        print(f"leaderboard best {kind}: {c} {min(r['ms'] for r in rows if r['kind'] == kind and tuple(r['config']) == c):.3f} ms", flush=True)
    # The whole step, forward + backward, with the best of each, through autograd's entry points.
    qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    for m in ("separate", "atomic"):
        bc = bwd_cfg(best["dkdv" if m == "separate" else "atomic"], best["dq"], m)["config"]
        ms = run(f"fwd+bwd {m}", (), triton_fn(qg, kg, vg, causal, "fwd+bwd", do, cfg_of(best["fwd"]), bc, m))
        print(f"leaderboard fwd+bwd ({m}) with the best tiles: {ms} ms (target {LEADERBOARD_MS})", flush=True)
    for name in ("sdpa_flash", "sdpa_cudnn"):
        ms = run(name, (), sdpa_fn(name, qg, kg, vg, causal, "fwd+bwd", do))
        print(f"leaderboard fwd+bwd {name}: {ms} ms", flush=True)
    return best, rows


# %% Benchmark ------------------------------------------------------------------------------------

def check_against_flash(q, k, v, causal, do, fcfg, bcfg, dq_mode):
    """Max |triton - flash| / max|flash| for O, dQ, dK, dV (bf16 both): printed and stored."""
    out = {}
    for mode in ("fwd", "fwd+bwd"):
        t = triton_fn(q, k, v, causal, mode, do, fcfg, bcfg, dq_mode)()
        f = sdpa_fn("sdpa_flash", q, k, v, causal, mode, do)()
        t = [t[0]] if mode == "fwd" else list(t)
        f = [f] if mode == "fwd" else list(f)
        names = ["O"] if mode == "fwd" else ["dQ", "dK", "dV"]
        for n, a, b in zip(names, t, f):
            a, b = a.detach().float(), b.detach().float()
            out[n] = float((a - b).abs().max() / b.abs().max())
    return out


def run_benchmark(info, best, dq_modes=("separate", "atomic"), save=None):
    rows = []
    shapes = [(TOKENS // N, HIDDEN // D, N, D, c) for D in GRID_D for c in (False, True) for N in GRID_N]
    shapes.append((LEADERBOARD["B"], LEADERBOARD["H"], LEADERBOARD["N"], LEADERBOARD["D"], True))
    for B, H, N, D, causal in shapes:
        q, k, v, do = inputs(B, H, N, D, grad=True)
        pick = best.get((D, causal)) if best else None
        fcfg = cfg_of(pick["fwd"]) if pick else None
        tag = "leaderboard" if (B, H, N, D, causal) == tuple(LEADERBOARD.values()) else "grid"
        base = dict(dtype=str(DTYPE).replace("torch.", ""), B=B, H=H, N=N, D=D, causal=causal, machine=info, suite=tag)
        # Check before timing: the Triton result against SDPA-FLASH on this very input.
        pk = dict(pick or {})
        bcfg_sep = bwd_cfg(pk["dkdv"], pk["dq"], "separate")["config"] if pick else None
        try:
            err = check_against_flash(q, k, v, causal, do, fcfg, bcfg_sep, "separate" if pick else None)
        except Exception as e:
            err = {"error": f"{type(e).__name__}: {e}"[:300]}
        bad = [n for n, x in err.items() if not isinstance(x, float) or not x < 3e-2]
        status = "ok" if not bad else f"mismatch vs flash: {err}"
        for mode in ("fwd", "fwd+bwd"):
            impls = [("sdpa_flash", sdpa_fn("sdpa_flash", q, k, v, causal, mode, do), None),
                     ("sdpa_cudnn", sdpa_fn("sdpa_cudnn", q, k, v, causal, mode, do), None)]
            if mode == "fwd":
                impls.append(("triton_step05", triton_fn(q, k, v, causal, mode, do, fcfg), fcfg))
            else:
                for m in dq_modes:
                    if pick:
                        key = "dkdv" if m == "separate" else "atomic"
                        bc = bwd_cfg(pk.get(key) or DKDV_CANDIDATES[D][0], pk["dq"], m)["config"]
                    else:
                        bc = None
                    impls.append((f"triton_step06_{m}", triton_fn(q, k, v, causal, mode, do, fcfg, bc, m),
                                  dict(fwd=fcfg, bwd=bc)))
            for name, fn, cfg in impls:
                row = dict(impl=name, mode=mode, **base)
                try:
                    ms = bench_ms(fn)
                    row.update(ms=ms, tflops=flops(B, H, N, D, causal, mode) / ms * 1e-9, status="ok")
                except Exception as e:
                    row.update(ms=None, tflops=None, status=f"error: {type(e).__name__}: {str(e)[:200]}")
                if name.startswith("triton"):
                    row.update(config=cfg, check=err)
                    if row["status"] == "ok" and status != "ok":
                        row["status"] = status
                rows.append(row)
        del q, k, v, do
        here = [r for r in rows if (r["B"], r["H"], r["N"], r["D"], r["causal"]) == (B, H, N, D, causal)]
        print(f"  B={B:<3} H={H:<3} N={N:<6} D={D:<4} {'causal' if causal else 'full  '} TFLOP/s: "
              + "  ".join(f"{r['impl'].replace('triton_', '')}/{r['mode']} {r['tflops']:.0f}"
                          for r in here if r.get("tflops")) + ("" if status == "ok" else "  " + status), flush=True)
        if save:
            save(rows)
    add_ratios(rows)
    return rows


def add_ratios(rows):
    ref = {(r["mode"], r["B"], r["H"], r["N"], r["D"], r["causal"]): r["ms"]
           for r in rows if r["impl"] == "sdpa_flash" and r.get("ms")}
    for r in rows:
        f = ref.get((r["mode"], r["B"], r["H"], r["N"], r["D"], r["causal"]))
        r["ratio_to_sdpa_flash"] = (f / r["ms"]) if (f and r.get("ms")) else None


def summary(rows):
    """One line per shape: TFLOP/s of each implementation and Triton's ratio to SDPA-FLASH."""
    by = {}
    for r in rows:
        by.setdefault((r["D"], r["causal"], r["B"], r["H"], r["N"]), {})[(r["impl"], r["mode"])] = r
    out = [f"{'D':>4} {'causal':<6}{'B':>4}{'H':>4}{'N':>7} | fwd TFLOP/s: triton flash cudnn  x flash | "
           f"fwd+bwd TFLOP/s: sep atomic flash cudnn  x flash(sep) x flash(atomic)   ms(sep)"]
    f = lambda r: f"{r['tflops']:6.0f}" if r and r.get("tflops") else "     -"  # noqa: E731
    x = lambda r: f"{r['ratio_to_sdpa_flash']:5.2f}" if r and r.get("ratio_to_sdpa_flash") else "    -"  # noqa: E731
    for (D, c, B, H, N), d in sorted(by.items()):
        g = lambda i, m: d.get((i, m))  # noqa: E731
        sep = g("triton_step06_separate", "fwd+bwd")
        out.append(f"{D:>4} {str(c):<6}{B:>4}{H:>4}{N:>7} |             {f(g('triton_step05', 'fwd'))} "
                   f"{f(g('sdpa_flash', 'fwd'))} {f(g('sdpa_cudnn', 'fwd'))}   {x(g('triton_step05', 'fwd'))} | "
                   f"                {f(sep)} {f(g('triton_step06_atomic', 'fwd+bwd'))} "
                   f"{f(g('sdpa_flash', 'fwd+bwd'))} {f(g('sdpa_cudnn', 'fwd+bwd'))}        {x(sep)}          "
                   f"{x(g('triton_step06_atomic', 'fwd+bwd'))}   {sep['ms'] if sep and sep.get('ms') else float('nan'):8.3f}")
    return "\n".join(out)


def table(rows):
    out = [f"{'impl':<24}{'mode':<9}{'B':>4}{'H':>4}{'N':>7}{'D':>5} {'causal':<7}{'ms':>9}{'TFLOP/s':>9}{'x flash':>9}"]
    for r in rows:
        ms = f"{r['ms']:.3f}" if r.get("ms") else "-"
        tf = f"{r['tflops']:.0f}" if r.get("tflops") else "-"
        ra = f"{r['ratio_to_sdpa_flash']:.2f}" if r.get("ratio_to_sdpa_flash") else "-"
        out.append(f"{r['impl']:<24}{r['mode']:<9}{r['B']:>4}{r['H']:>4}{r['N']:>7}{r['D']:>5} "
                   f"{str(r['causal']):<7}{ms:>9}{tf:>9}{ra:>9}" + ("" if r["status"] == "ok" else "  " + r["status"][:60]))
    return "\n".join(out)


# %% Plots (no GPU needed) ------------------------------------------------------------------------

def plot(path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    data = json.loads(Path(path).read_text())
    rows = [r for r in data["rows"] if r.get("suite", "grid") == "grid"]
    info = data["machine"]
    fig, axes = plt.subplots(2, 4, figsize=(18, 8), sharex=True)
    for i, mode in enumerate(("fwd", "fwd+bwd")):
        for j, (D, causal) in enumerate([(64, False), (64, True), (128, False), (128, True)]):
            ax = axes[i, j]
            sel = [r for r in rows if r["mode"] == mode and r["D"] == D and r["causal"] == causal and r.get("tflops")]
            for impl in sorted({r["impl"] for r in sel}):
                pts = sorted((r["N"], r["tflops"]) for r in sel if r["impl"] == impl)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl,
                        linestyle="--" if impl.startswith("sdpa") else "-")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{mode}, D={D}, {'causal' if causal else 'not causal'}")
            ax.set_xlabel("N")
            ax.set_ylabel("TFLOP/s")
            ax.grid(alpha=0.3)
            if j == 0:
                ax.legend(fontsize=7)
    fig.suptitle(f"Triton steps 05-06 vs SDPA, bf16, B=16384/N, H=2048/D: {info.get('gpu')}, "
                 f"torch {info.get('torch')}, triton {info.get('triton')}, {info.get('date')}")
    fig.tight_layout()
    out = Path(path).with_suffix(".png")
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
    tune_path = Path(path).with_name(Path(path).stem + "_tuning.json")
    if tune_path.exists():
        plot_tuning(tune_path)


def plot_tuning(path):
    import matplotlib.pyplot as plt
    data = json.loads(Path(path).read_text())
    rows = data["rows"]
    kinds = ["fwd", "dkdv", "dq", "atomic"]
    fig, axes = plt.subplots(1, 4, figsize=(20, 5))
    for ax, kind in zip(axes, kinds):
        sel = [r for r in rows if r["kind"] == kind]
        labels = sorted({tuple(r["config"]) for r in sel})
        for D, causal, mk in [(64, False, "o"), (64, True, "s"), (128, False, "^"), (128, True, "v")]:
            ys = []
            for c in labels:
                ms = [r["ms"] for r in sel if tuple(r["config"]) == c and r["D"] == D and r["causal"] == causal
                      and r["N"] == max(TUNE_N)]
                ys.append(ms[0] if ms else float("nan"))
            ax.plot(range(len(labels)), ys, marker=mk, linestyle="", label=f"D={D} {'causal' if causal else 'full'}")
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(["x".join(map(str, c[:2])) + f"\nw{c[2]} s{c[3]}" for c in labels], fontsize=7)
        what = {"fwd": "forward", "dkdv": "backward, dQ kernel fixed", "dq": "backward, dK/dV kernel fixed",
                "atomic": "backward with atomic dQ"}[kind]
        ax.set_title(f"{kind}: {what}, ms at N={max(TUNE_N)}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Tile sizes (BLOCK_M x BLOCK_N), warps and stages, bf16, " + str(data["machine"].get("gpu")))
    fig.tight_layout()
    out = Path(path).with_suffix(".png")
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


def _has(module):
    import importlib.util
    return importlib.util.find_spec(module) is not None


# %% main -------------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "out" / "triton_gpu.json")
    ap.add_argument("--tune", action="store_true", help="sweep tile sizes first and benchmark with the best")
    ap.add_argument("--no-tests", action="store_true")
    ap.add_argument("--plot", type=Path, help="only draw the PNGs from a JSON written earlier")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 6))
    ap.add_argument("--dry-run", action="store_true", help="on a CPU, through the interpreter, toy sizes")
    ap.add_argument("--sweep-leaderboard", action="store_true",
                    help="only sweep tiles on the CS336 leaderboard shape (more candidates)")
    args = ap.parse_args(argv)
    if args.plot:
        plot(args.plot)
        return 0
    if args.dry_run:
        dry_run_sizes()
    elif not torch.cuda.is_available():
        print("bench/triton_gpu.py needs a CUDA GPU (use --plot to draw recorded results)")
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    info = machine_info()
    print(json.dumps(info), flush=True)
    if args.sweep_leaderboard:
        best, rows = sweep_leaderboard(info, args.workers)
        args.out.write_text(json.dumps({"machine": info, "rows": rows,
                                        "best": {k: list(v) for k, v in best.items()}}, indent=1))
        print(f"total {time.time() - t0:.0f} s")
        return 0
    tests = None
    if not args.no_tests and DEVICE == "cuda":
        log = open(args.out.with_name("pytest_gpu.log"), "w")
        xdist = ["-n", "6"] if _has("xdist") else []
        tests = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-rs", *xdist, "--impl", "solutions", "-m", "gpu",
                                  "tests/test_step05_triton_fwd.py", "tests/test_step06_triton_bwd.py"],
                                 cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    jobs = []
    for D in GRID_D:
        for causal in (False, True):
            if args.tune:
                jobs += [(D, causal, "fwd", cfg_of(c)) for c in FWD_CANDIDATES[D]]
                jobs += [(D, causal, "bwd", bwd_cfg(c, DQ_CANDIDATES[D][0], "separate")) for c in DKDV_CANDIDATES[D]]
                jobs += [(D, causal, "bwd", bwd_cfg(DKDV_CANDIDATES[D][0], c, "separate")) for c in DQ_CANDIDATES[D][1:]]
                jobs += [(D, causal, "bwd", bwd_cfg(c, DQ_CANDIDATES[D][0], "atomic")) for c in ATOMIC_CANDIDATES[D]]
            jobs += [(D, causal, "bwd", {"config": None, "mode": m}) for m in ("separate", "atomic")]
    if DEVICE == "cuda":
        precompile(jobs, args.workers)
    if tests is not None:
        rc = tests.wait()
        log.close()
        tail = args.out.with_name("pytest_gpu.log").read_text().strip().splitlines()[-15:]
        print(f"GPU tests: exit {rc} after {time.time() - t0:.0f} s\n  " + "\n  ".join(tail), flush=True)
    best = None
    if args.tune:
        t = time.time()
        best, trows = tune(info)
        args.out.with_name(args.out.stem + "_tuning.json").write_text(json.dumps(
            {"machine": info, "rows": trows, "best": {f"{d}-{c}": v for (d, c), v in best.items()}}, indent=1))
        print(f"tuning took {time.time() - t:.0f} s", flush=True)
        # Compile the picked combinations not already compiled (atomic dkdv with the best dq, etc.).
        extra = []
        for (D, causal), p in best.items():
            extra.append((D, causal, "bwd", bwd_cfg(p["dkdv"], p["dq"], "separate")))
            extra.append((D, causal, "bwd", bwd_cfg(p["atomic"], p["dq"], "atomic")))
        if DEVICE == "cuda":
            precompile(extra, args.workers)
    t = time.time()
    def save(rows):
        args.out.write_text(json.dumps({"machine": info, "tuned": bool(best), "rows": rows}, indent=1))
    rows = run_benchmark(info, best, save=save)
    print(f"benchmark took {time.time() - t:.0f} s", flush=True)
    save(rows)
    args.out.with_name(args.out.stem + "_table.txt").write_text(table(rows) + "\n")
    print(summary(rows))
    lb = [r for r in rows if r.get("suite") == "leaderboard" and r["mode"] == "fwd+bwd"]
    for r in lb:
        print(f"leaderboard shape (B=1 H=16 N=16384 D=64 bf16 causal fwd+bwd): {r['impl']}: "
              f"{r['ms']:.2f} ms (target <= {LEADERBOARD_MS} ms)" if r.get("ms") else f"{r['impl']}: {r['status']}")
    print(f"total {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
