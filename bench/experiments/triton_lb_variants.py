"""Experiment: step 06's backward at the CS336 leaderboard shape -- which dq_mode and tiles, and which kernel holds the time?

Question. B=1, H=16, N=16384, D=64, bf16, causal, forward + backward took step 06 5.74 ms on the
H200, against the leaderboard's best 5.36 ms (an H100). Which ``dq_mode`` ("separate", "atomic",
"fused") and which tiles make its backward fastest, and how is the backward split between kernels?

Answer (one H200 run, 2026-11-30 01:02 UTC: results/h200/triton/lb_variants.json and lb.log; told
in results/h200/triton/README.md, "What they say", and read by notebook 06, section 7).
Forward + backward with the best backward of each mode: separate 5.60 ms, atomic 5.83, fused 5.97
(SDPA-FLASH 7.01, cuDNN 4.35); the backward alone 4.29 / 4.54 / 4.66 ms. Fusing the two launches
costs more (one num_warps / num_stages for both phases) than the balanced causal work saves. The
separate backward: preprocess 0.03 ms, dK/dV kernel 3.04 (about 360 TFLOP/s on its four
products), dQ kernel 1.44 (about 570 on its three): the dK/dV kernel is the one to speed up, which
triton_dkdv_variants.py then did. Step 06's table took the better dK/dV tiles; "separate" stayed
its default.

Kernels: step 06's and step 05's own (solutions/, through attnlib.loader), no copies. The tile
candidates below are those of the morning of 11-30; step 06's table has moved since (causal
D <= 64: 32x128 on 8 warps, maxnreg=128), and each run times the table's current config of each
mode first. Changed since the run: step 06 now launches its kernels as
``wrap_triton(configured(kernel, config))[grid](...)``, so the per-kernel rows record those launches
(``record_launches``) instead of replacing the kernels in step 06's module.


    python bench/experiments/triton_lb_variants.py --out DIR          # an H200: about 60-100 s; no timing starts after 120 s
    python bench/experiments/triton_lb_variants.py --small --out DIR  # a CPU, Triton's interpreter, tiny fp32 sizes

Shape: B=1, H=16, N=16384, D=64, bf16, causal, forward + backward (target 5.36 ms).

1. Check (a pool of processes, one variant each, which also compiles the kernels
   into Triton's on-disk cache for the timing process): every variant at
   B=2, H=16, N=1008, D=64 bf16, causal and not, against the float64 reference
   (attnlib.reference_attention / reference_backward), with the tile tables of
   the leaderboard shape pinned. N=1008 leaves a partial last tile for every tile
   size (1008 = 7*128 + 112) yet gives the kernels the same Triton specialization
   as N=16384 (every length and stride a multiple of 16), so one compile serves
   both; B=2 gives step 05's table enough programs to pick its leaderboard tiles.
   A variant passes when every output is inside attnlib.compare's policy for its
   dtype or no more than 2x SDPA-FLASH's error on the same input; a variant that
   fails is reported and not timed (nor is one whose check did not finish within
   60% of the budget).
2. Time (``triton.testing.do_bench(warmup=25, rep=100, return_mode="median")``):
   SDPA FLASH and cuDNN (forward, backward, both); step 05's forward; the whole
   backward of each dq_mode ("separate", "atomic", "fused") over a few tile
   configs, the tuned table's included; each backward kernel alone (D, dK/dV, dQ,
   fused, atomic dK/dV), relaunched with the arguments ``backward`` gave it; and
   forward + backward through the autograd Function with the best config of each
   mode (``fwd_config`` / ``bwd_config`` swapped for the duration) and with the
   tables as they are. Each kernel row is a share of the backward: its "x flash"
   compares it with SDPA-FLASH's whole backward.
   "x flash" = SDPA-FLASH's time for the same mode / this row's time (> 1: faster).
   Rows are timed in order of importance; after ``--budget-s`` seconds from the
   start no new timing starts (the skipped ones are listed).

Writes DIR/lb_variants.json after every row (machine, checks, rows, skipped, best)
and prints a table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]    # the repository root: bench/experiments/../..
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

if "--small" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")     # before anything imports triton

import torch  # noqa: E402

from bench.core import machine_info  # noqa: E402
from bench.core import time_ms as bench_ms  # noqa: E402  (do_bench median on a GPU)

TARGET_MS = 5.36                       # best CS336 2025 leaderboard time (an H100)
GPU_SHAPE = dict(B=1, H=16, N=16384, D=64)
GPU_CHECK = dict(B=2, H=16, N=1008, D=64)
SMALL_SHAPE = dict(B=1, H=2, N=160, D=64)
SMALL_CHECK = dict(B=1, H=2, N=72, D=64)

# Tile candidates, bf16, D=64, sm_90. (BLOCK_M, BLOCK_N, num_warps, num_stages) per kernel.
SEPARATE = [                           # (dK/dV kernel, dQ kernel); the table's own comes first, added at run time
    ((64, 128, 8, 4), (128, 64, 8, 3)),    # best dK/dV of the 38-candidate sweep (results/h200)
    ((32, 64, 4, 4), (128, 64, 4, 3)),
]
ATOMIC = [(64, 128, 8, 3), (64, 128, 8, 4)]  # the sweep's best atomic dK/dV (+dQ) kernels
FUSED = [                              # (BLOCK_M1, BLOCK_N1, BLOCK_M2, BLOCK_N2, num_warps, num_stages)
    (32, 128, 128, 32, 4, 5),          # the Triton tutorial's (06-fused-attention)
    (32, 128, 128, 32, 4, 4),
    (32, 128, 128, 32, 4, 3),
    (32, 128, 128, 64, 4, 4),
    (32, 128, 128, 64, 8, 3),
    (64, 128, 128, 32, 8, 3),
    (64, 128, 128, 64, 8, 3),
    (64, 128, 128, 64, 8, 4),
    (32, 64, 64, 64, 4, 4),
    (64, 64, 64, 64, 4, 3),
]
KERNEL_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
FUSED_KEYS = ("BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2", "num_warps", "num_stages")


def steps():
    from attnlib.loader import load_step
    return load_step(5, "solutions"), load_step(6, "solutions")


def cfg_label(c):
    return f"{c['BLOCK_M']}x{c['BLOCK_N']} w{c['num_warps']} s{c['num_stages']}"


def kcfg(t):
    return dict(zip(KERNEL_KEYS, t))


def fcfg(t):
    return dict(zip(FUSED_KEYS, t))


def cfg_name(mode, cfg):
    """A short label: 'dkdv 32x128 w4 s4 | dq 128x64 w8 s3', 'fused 32x128/128x32 w4 s5'."""
    k = cfg_label
    if mode == "fused":
        f = cfg.get("fused")
        if f is None:
            return "fused (from dkdv, dq)"
        return (f"fused {f['BLOCK_M1']}x{f['BLOCK_N1']}/{f['BLOCK_M2']}x{f['BLOCK_N2']} "
                f"w{f['num_warps']} s{f['num_stages']}")
    if mode == "atomic":
        return f"dkdv+dq {k(cfg['dkdv'])}"
    return f"dkdv {k(cfg['dkdv'])} | dq {k(cfg['dq'])}"


def backward_variants(table):
    """[(name, dq_mode, config)]: the table's config of each mode first, then the candidates (no repeats)."""
    out, seen = [], set()

    def add(mode, cfg, tag=""):
        keys = ("fused",) if mode == "fused" else ("dkdv",) if mode == "atomic" else ("dkdv", "dq")
        key = (mode, json.dumps({k: cfg.get(k) for k in keys}, sort_keys=True))
        if key in seen:
            return
        seen.add(key)
        out.append((f"bwd {mode}: {cfg_name(mode, cfg)}{tag}", mode, cfg))
    pre = table["pre"]
    add("separate", table, " (table)")
    add("fused", table, " (table)")
    for dk, dq in SEPARATE:
        add("separate", dict(pre=pre, dkdv=kcfg(dk), dq=kcfg(dq)))
    for a in ATOMIC:
        add("atomic", dict(pre=pre, dkdv=kcfg(a), dq=table["dq"]))
    for f in FUSED:
        add("fused", dict(pre=pre, fused=fcfg(f)))
    return out


# %% Inputs, reference, errors ----------------------------------------------------------------------

def make_inputs(shape, dtype, device, grad=False):
    from attnlib import make_dout, make_qkv
    q, k, v = make_qkv(shape["B"], shape["H"], shape["N"], shape["N"], shape["D"], dtype=dtype, device=device,
                       seed=0, requires_grad=grad)
    return q, k, v, make_dout(q, seed=1)


_REF = {}


def reference(shape, dtype, device, causal):
    """(q, k, v, do, O, LSE, dQ, dK, dV): the check input and its float64 results (cached per process)."""
    key = (tuple(shape.values()), str(dtype), device, causal)
    if key not in _REF:
        from attnlib import reference_attention, reference_backward
        q, k, v, do = make_inputs(shape, dtype, device)
        o, lse = reference_attention(q, k, v, causal)
        _REF[key] = (q, k, v, do, o, lse, *reference_backward(q, k, v, do, causal))
    return _REF[key]


def errors(outs, refs, dtype):
    """{name: {"err": max|x - ref| / max|ref|, "bad": elements outside attnlib's policy for dtype}}."""
    from attnlib.compare import measure, tolerance_for
    atol, rtol = tolerance_for(dtype)
    res = {}
    for name, x in outs.items():
        _, _, err, bad, scale = measure(x, refs[name], atol, rtol)
        e = err.max().item() / scale
        res[name] = {"err": e if math.isfinite(e) else float("inf"), "bad": int(bad.sum())}
    return res


def run_variant(kind, mode, cfg, q, k, v, do, causal, o=None, lse=None, fwd_cfg=None):
    """Outputs of one variant on one input: {"O"} for the forward, {"dQ", "dK", "dV"} for the backward,
    all four for "autograd" (forward + backward through FlashAttentionTriton with the tables pinned)."""
    s5, s6 = steps()
    scale = q.shape[-1] ** -0.5
    if kind == "fwd":
        return {"O": s5.forward(q, k, v, causal, scale, config=cfg)[0]}
    if kind == "bwd":
        dq, dk, dv = s6.backward(q, k, v, o, lse, do, causal, scale, config=cfg, dq_mode=mode)
        return {"dQ": dq, "dK": dk, "dV": dv}
    qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    with tables_say(s5, s6, fwd_cfg, cfg, mode):
        out = s6.attention(qg, kg, vg, is_causal=causal, dq_mode=mode)
        dq, dk, dv = torch.autograd.grad(out, (qg, kg, vg), do)
    return {"O": out.detach(), "dQ": dq, "dK": dk, "dV": dv}


def check_job(job):
    """One variant at the check shape: compiles its kernels, returns its errors (run in a pool worker)."""
    t = time.time()
    try:
        dtype = getattr(torch, job["dtype"])
        q, k, v, do, o, lse, dq, dk, dv = reference(job["shape"], dtype, job["device"], job["causal"])
        refs = {"O": o, "dQ": dq, "dK": dk, "dV": dv}
        # The backward is checked from the exact O and LSE: no forward kernel compiled per worker.
        outs = run_variant(job["kind"], job["mode"], job["cfg"], q, k, v, do, job["causal"],
                           o.to(dtype), lse.to(torch.float32))
        if job["device"] == "cuda":
            torch.cuda.synchronize()
        res = errors(outs, refs, dtype)
    except Exception as e:
        res = f"{type(e).__name__}: {first_line(e)}"
    return job["name"], job["causal"], res, time.time() - t


def first_line(e, n=300):
    lines = str(e).strip().splitlines()
    return lines[0][:n] if lines else type(e).__name__


@contextlib.contextmanager
def tables_say(s5, s6, fwd_cfg, bwd_cfg, mode):
    """Make ``s5.fwd_config`` return ``fwd_cfg`` and ``s6.bwd_config`` return ``bwd_cfg`` (with dq_mode
    ``mode``): what the autograd Function would run if the tables held these tiles."""
    orig = s5.fwd_config, s6.bwd_config
    s5.fwd_config = lambda *a, **kw: dict(fwd_cfg)
    s6.bwd_config = lambda *a, **kw: dict(bwd_cfg, dq_mode=mode)
    try:
        yield
    finally:
        s5.fwd_config, s6.bwd_config = orig


def sdpa_call(backend, q, k, v, causal):
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel
    with sdpa_kernel([backend]):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def sdpa_backends(device):
    from torch.nn.attention import SDPBackend
    if device == "cuda":
        return {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}
    # --small: no FLASH or cuDNN on a CPU; the same code paths through the MATH backend.
    return {"sdpa_flash": SDPBackend.MATH, "sdpa_cudnn": SDPBackend.MATH}


def sdpa_errors(backend, shape, dtype, device, causal):
    q, k, v, do, o, lse, dq, dk, dv = reference(shape, dtype, device, causal)
    qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = sdpa_call(backend, qg, kg, vg, causal)
    g = torch.autograd.grad(out, (qg, kg, vg), do)
    return errors({"O": out.detach(), "dQ": g[0], "dK": g[1], "dV": g[2]},
                  {"O": o, "dQ": dq, "dK": dk, "dV": dv}, dtype)


# %% Launch capture: each backward kernel alone --------------------------------------------------------

def record_launches(s6, fn, run=True):
    """Run ``fn()`` (a call of ``s6.backward``) with step 06's kernel launches recorded; return
    ``([(kernel name, kernel, grid, args, kwargs)], fn's result)`` in launch order. ``kwargs`` holds the
    launch options (num_warps, num_stages, maxnreg) of the config step 06 launched with, so that
    ``kernel[grid](*args, **kwargs)`` is that launch again; ``run=False`` records without launching.

    Step 06 launches every kernel as ``wrap_triton(configured(kernel, config))[grid](...)``
    (attnlib.ops.configured: a one-config autotuner carrying the launch options), so the recorder
    stands in for ``wrap_triton`` in step 06's module while ``fn()`` runs. (Until step 06 became a
    PyTorch operator it launched ``kernel[grid](..., num_warps=...)`` itself, and this function
    replaced the kernels instead; ``configured`` cannot wrap such a stand-in.)"""
    log, real = [], s6.wrap_triton

    def recording_wrap(tuned):
        configs = getattr(tuned, "configs", None)            # an autotuner from ``configured``, or a kernel
        kernel = tuned.fn if configs is not None else tuned
        opts = configs[0].all_kwargs() if configs else {}

        class Launcher:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    log.append((kernel.fn.__name__, kernel, grid, args, dict(kwargs, **opts)))
                    return real(tuned)[grid](*args, **kwargs) if run else None
                return launch
        return Launcher()
    s6.wrap_triton = recording_wrap
    try:
        out = fn()
    finally:
        s6.wrap_triton = real
    return log, out


def capture_launches(s6, fn):
    """Run ``fn()`` with step 06's launches recorded; return ``[(kernel name, relaunch)]`` in launch order,
    each relaunch a closure that runs that kernel again with the same grid, arguments and launch options."""
    log, _ = record_launches(s6, fn)
    return [(name, lambda kern=kern, g=g, a=a, kw=kw: kern[g](*a, **kw)) for name, kern, g, a, kw in log]


# %% Timing ---------------------------------------------------------------------------------------------


class Progress:
    """A tqdm bar on a terminal; elsewhere (a captured log) each printed line starts with [done/total, s]."""

    def __init__(self, total, desc, t0):
        self.total, self.n, self.t0, self.bar = total, 0, t0, None
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, desc=desc, file=sys.stderr, ncols=100)
            except Exception:
                pass

    def update(self, n=1):
        self.n += n
        if self.bar is not None:
            self.bar.update(n)

    def write(self, line):
        if self.bar is not None:
            self.bar.write(line)
        else:
            print(f"[{self.n}/{self.total} {time.time() - self.t0:4.0f}s] {line}", flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


# %% The run -------------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "out" / "lb_variants")
    ap.add_argument("--budget-s", type=float, default=120.0,
                    help="start no new timing after this many seconds from the start (default 120)")
    ap.add_argument("--workers", type=int, default=None, help="check/compile processes (default: CPUs - 2)")
    ap.add_argument("--small", action="store_true", help="a CPU, Triton's interpreter, tiny fp32 sizes")
    args = ap.parse_args(argv)
    t0 = time.time()
    small = args.small
    if not small and not torch.cuda.is_available():
        print("bench/experiments/triton_lb_variants.py needs a CUDA GPU (or --small for the CPU interpreter)")
        return 1
    device, dtype = ("cpu", torch.float32) if small else ("cuda", torch.bfloat16)
    shape, check_shape = (SMALL_SHAPE, SMALL_CHECK) if small else (GPU_SHAPE, GPU_CHECK)
    causal = True
    args.out.mkdir(parents=True, exist_ok=True)
    out_path = args.out / "lb_variants.json"
    info = machine_info()
    print(json.dumps(info), flush=True)
    s5, s6 = steps()
    B, H, N, D = (shape[x] for x in "BHND")
    table = s6.bwd_config(N, N, D, dtype, causal, device, B * H)
    fwd_table = s5.fwd_config(N, N, D, dtype, causal, device, B * H)
    variants = backward_variants(table)
    doc = {"machine": info, "shape": dict(shape, dtype=str(dtype)[6:], causal=causal), "check_shape": check_shape,
           "target_ms": TARGET_MS, "budget_s": args.budget_s, "table": table, "fwd_table": fwd_table,
           "checks": [], "rows": [],
           "skipped": [], "best": {}}

    def save():
        out_path.write_text(json.dumps(doc, indent=1, default=str))

    # ---- 1. check every variant (and compile it) in a pool of processes --------------------------------
    jobs = []
    for c in (True, False):
        base = dict(shape=check_shape, dtype=str(dtype)[6:], device=device, causal=c)
        jobs.append(dict(base, name="fwd step05 (table)", kind="fwd", mode=None, cfg=fwd_table))
        jobs += [dict(base, name=name, kind="bwd", mode=mode, cfg=cfg) for name, mode, cfg in variants]
    results, pooled = {}, True
    workers = args.workers or (2 if small else max(1, min(len(jobs), (os.cpu_count() or 2) - 2)))
    deadline = t0 + 0.6 * args.budget_s
    t = time.time()
    bar = Progress(len(jobs), "check+compile", t0)
    try:
        import multiprocessing as mp
        with mp.get_context("spawn").Pool(workers) as pool:
            it = pool.imap_unordered(check_job, jobs, chunksize=1)
            for _ in jobs:
                name, c, res, secs = it.next(timeout=max(1.0, deadline - time.time()))
                results[(name, c)] = res
                bar.update()
                if bar.bar is None and (bar.n % 8 == 0 or bar.n == len(jobs) or not isinstance(res, dict)):
                    bar.write(f"checked {name} ({'causal' if c else 'full'}) in {secs:.0f} s"
                              + ("" if isinstance(res, dict) else f": {res}"))
    except mp.TimeoutError:
        bar.write(f"check phase stopped at {0.6 * args.budget_s:.0f} s (60% of the budget): "
                  f"{len(jobs) - len(results)} checks unfinished, their variants are not timed")
    except Exception as e:                            # no pool: the checks in this process
        bar.write(f"process pool failed ({type(e).__name__}: {e}); checking in this process")
        pooled = False
        for j in jobs:
            if (j["name"], j["causal"]) not in results and time.time() < deadline:
                name, c, res, secs = check_job(j)
                results[(name, c)] = res
                bar.update()
    bar.close()
    print(f"checked {len(results)} of {len(jobs)} (variant, causal) pairs in {time.time() - t:.0f} s "
          + (f"with {workers} processes" if pooled else "in this process"), flush=True)

    flash = {c: sdpa_errors(sdpa_backends(device)["sdpa_flash"], check_shape, dtype, device, c) for c in (True, False)}
    cudnn = {}
    for c in (True, False):
        try:
            cudnn[c] = sdpa_errors(sdpa_backends(device)["sdpa_cudnn"], check_shape, dtype, device, c)
        except Exception as e:
            cudnn[c] = f"{type(e).__name__}: {first_line(e, 200)}"

    def verdict(res, c):
        if not isinstance(res, dict):
            return False, res or "not checked (time)"
        bad = [n for n, r in res.items()
               if r["bad"] and not r["err"] <= 2 * flash[c][n]["err"]]
        return (not bad), ("ok" if not bad else "WRONG: " + ", ".join(bad))

    def worst(name):
        """(max over outputs and causal/full of error / SDPA-FLASH's error, where)."""
        w = (0.0, "")
        for c in (True, False):
            res = results.get((name, c))
            if isinstance(res, dict):
                for n, r in res.items():
                    x = r["err"] / max(flash[c][n]["err"], 1e-30)
                    w = max(w, (x, f"{n} {'causal' if c else 'full'}"))
        return w

    ok, chk = {}, {}
    # The autograd Function as it is (the tables' configs): the row the leaderboard number comes from.
    as_is = "fwd+bwd autograd (table as is)"
    for c in (True, False):
        results[(as_is, c)] = errors_of_autograd(table["dq_mode"], table, fwd_table, check_shape, dtype, device, c)
    names = ["fwd step05 (table)", as_is] + [v[0] for v in variants]
    print(f"\nCheck at B={check_shape['B']} H={check_shape['H']} N={check_shape['N']} D={check_shape['D']} "
          f"{str(dtype)[6:]}: max |x - ref| / max|ref| per output against the float64 reference"
          + ("; --small: both SDPA rows run the MATH backend" if small else ""))
    for c in (True, False):
        fl = flash[c]
        cu = cudnn[c]
        print(f"  {'causal' if c else 'not causal'}:  sdpa_flash " +
              " ".join(f"{n} {r['err']:.2e}" for n, r in fl.items()) + "  |  sdpa_cudnn " +
              (" ".join(f"{n} {r['err']:.2e}" for n, r in cu.items()) if isinstance(cu, dict) else cu))
        doc["checks"].append(dict(variant="sdpa_flash", causal=c, errors=fl, verdict="reference"))
        doc["checks"].append(dict(variant="sdpa_cudnn", causal=c, errors=cu, verdict="reference"))
    print("  each variant: the worst error / SDPA-FLASH's error over its outputs, causal and full (all: the JSON);\n"
          "  WRONG: outside attnlib's policy for the dtype and over 2x FLASH's error; ERROR: raised;\n"
          "  unchk: not checked in time")
    for name in names:
        good, whys = True, []
        for c in (True, False):
            res = results.get((name, c))
            g, why = verdict(res, c)
            good &= g
            if not g:
                whys.append(f"{'causal' if c else 'full'}: {why}")
            doc["checks"].append(dict(variant=name, causal=c, errors=res, verdict=why))
        ok[name] = good
        x, where = worst(name)
        chk[name] = x
        ratio = f"{x:8.3g}x ({where})" if where else "        -"
        res = [results.get((name, c)) for c in (True, False)]
        label = "ok   " if good else "WRONG" if any(isinstance(r, dict) for r in res) else \
            "ERROR" if any(r for r in res) else "unchk"
        print(f"  {label} {name[:60]:<61} {ratio}"
              + ("  " + "; ".join(whys)[:120] if whys else ""))
    save()

    # ---- 2. time, most important first -------------------------------------------------------------------
    q, k, v, do = make_inputs(shape, dtype, device)
    qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    scale = D ** -0.5
    o, lse = s5.forward(q, k, v, causal, scale)
    backends = sdpa_backends(device)
    flash_ms = {}
    skipped = doc["skipped"]

    def sdpa_fn(name, mode):
        b = backends[name]
        if mode == "fwd":
            return lambda: sdpa_call(b, qg, kg, vg, causal)
        if mode == "bwd":
            held = sdpa_call(b, qg, kg, vg, causal)
            return lambda: torch.autograd.grad(held, (qg, kg, vg), do, retain_graph=True)
        return lambda: torch.autograd.grad(sdpa_call(b, qg, kg, vg, causal), (qg, kg, vg), do)

    def autograd_fn(mode, cfg):
        def run():
            out = s6.attention(qg, kg, vg, is_causal=causal, dq_mode=mode)
            return torch.autograd.grad(out, (qg, kg, vg), do)
        if cfg is None:
            return run
        return lambda: _with_tables(s5, s6, fwd_table, cfg, mode, run)

    def bwd_fn(mode, cfg):
        return lambda: s6.backward(q, k, v, o, lse, do, causal, scale, config=cfg, dq_mode=mode)

    # (variant, mode for the ratio, config label, make_fn) -- make_fn builds the closure right before timing
    plan = [("sdpa_flash fwd+bwd", "fwd+bwd", "", lambda: sdpa_fn("sdpa_flash", "fwd+bwd")),
            ("sdpa_cudnn fwd+bwd", "fwd+bwd", "", lambda: sdpa_fn("sdpa_cudnn", "fwd+bwd")),
            ("sdpa_flash fwd", "fwd", "", lambda: sdpa_fn("sdpa_flash", "fwd")),
            ("sdpa_flash bwd", "bwd", "", lambda: sdpa_fn("sdpa_flash", "bwd")),
            ("fwd step05 (table)", "fwd", cfg_label(fwd_table), lambda: (lambda: s5.forward(q, k, v, causal, scale))),
            (as_is, "fwd+bwd", "table: " + table["dq_mode"], lambda: autograd_fn(None, None))]
    plan += [(name, "bwd", cfg_name(mode, cfg), (lambda mode=mode, cfg=cfg: bwd_fn(mode, cfg)))
             for name, mode, cfg in variants]
    plan.append(("BEST", None, None, None))           # marker: the autograd rows with the best of each mode
    # Each kernel alone, relaunched with the arguments backward() gave it (the table's configs).
    kernel_sources = [("separate", table), ("fused", table)] + \
        [(mode, cfg) for _, mode, cfg in variants if mode == "atomic"][:1]
    plan.append(("KERNELS", kernel_sources, None, None))
    plan += [("sdpa_cudnn fwd", "fwd", "", lambda: sdpa_fn("sdpa_cudnn", "fwd")),
             ("sdpa_cudnn bwd", "bwd", "", lambda: sdpa_fn("sdpa_cudnn", "bwd"))]

    tiles = {name: cfg for name, _, cfg in variants}
    tiles["fwd step05 (table)"] = fwd_table

    def timed(variant, mode, label, make_fn, check_name=None, cfg=None):
        if check_name is not None and not ok.get(check_name, False):
            skipped.append(f"{variant}: failed or missed its check")
            bar.write(f"  not timed (check): {variant}")
            return None
        if time.time() - t0 > args.budget_s:
            skipped.append(f"{variant}: budget ({args.budget_s:.0f} s) spent")
            bar.write(f"  skipped (budget): {variant}")
            return None
        row = dict(variant=variant, mode=mode, config=label, check=chk.get(check_name),
                   tiles=cfg if cfg is not None else tiles.get(variant))
        try:
            fn = make_fn()
            row["ms"] = bench_ms(fn, device)
            row["status"] = "ok"
        except Exception as e:
            row.update(ms=None, status=f"error: {type(e).__name__}: {first_line(e, 200)}")
        if variant.startswith("sdpa_flash") and row["ms"]:
            flash_ms[mode] = row["ms"]
        f = flash_ms.get(mode)
        row["ratio"] = f / row["ms"] if (f and row["ms"]) else None
        doc["rows"].append(row)
        save()
        bar.write(fmt_row(row))
        return row["ms"]

    n_tasks = len(plan) - 2 + 3 + 5            # the two markers become 3 autograd rows and 5 kernel rows
    bar = Progress(n_tasks, "timing", t0)
    print("\n" + HEADER, flush=True)
    bwd_ms = {}
    for variant, mode, label, make_fn in plan:
        if variant == "BEST":
            for m in ("separate", "atomic", "fused"):
                cands = [(ms, name, cfg) for name, mm, cfg in variants if mm == m
                         for ms in [bwd_ms.get(name)] if ms]
                if not cands:
                    skipped.append(f"fwd+bwd autograd {m} (best): no timed {m} backward")
                    bar.update()
                    continue
                ms, name, cfg = min(cands, key=lambda x: x[0])
                doc["best"][m] = dict(variant=name, bwd_ms=ms, config=cfg)
                tag = f"fwd+bwd autograd {m} (best bwd)"      # its tiles: the "best" lines and the JSON
                if time.time() - t0 > args.budget_s:
                    timed(tag, "fwd+bwd", "", None)          # records the skip
                    bar.update()
                    continue
                # The autograd path itself checked first (its kernels are the ones checked above).
                for c in (True, False):
                    results[(tag, c)] = errors_of_autograd(m, cfg, fwd_table, check_shape, dtype, device, c)
                    doc["checks"].append(dict(variant=tag, causal=c, errors=results[(tag, c)],
                                              verdict=verdict(results[(tag, c)], c)[1]))
                ok[tag] = all(verdict(results[(tag, c)], c)[0] for c in (True, False))
                chk[tag] = worst(tag)[0]
                timed(tag, "fwd+bwd", cfg_name(m, cfg), lambda m=m, cfg=cfg: autograd_fn(m, cfg), check_name=tag,
                      cfg=dict(fwd=fwd_table, bwd=cfg))
                bar.update()
            continue
        if variant == "KERNELS":
            for m, cfg in mode:
                parent = next((n for n, mm, cc in variants if mm == m and cc is cfg), None)
                if parent is None or not ok.get(parent):
                    skipped.append(f"kernels of {m}: its backward failed or missed its check")
                    continue
                if time.time() - t0 > args.budget_s:
                    skipped.append(f"kernels of {m}: budget spent")
                    continue
                launches = capture_launches(s6, bwd_fn(m, cfg))
                for kname, relaunch in launches:
                    if m != "separate" and kname == "_bwd_preprocess":
                        continue                      # the same D kernel in every mode: timed once
                    timed(f"  kernel {kname} ({m})", "bwd", cfg_name(m, cfg), lambda r=relaunch: r,
                          check_name=parent, cfg=cfg)
                    bar.update()
            continue
        check_name = variant if variant in ok else None
        ms = timed(variant, mode, label, make_fn, check_name=check_name)
        if variant.startswith("bwd ") and ms:
            bwd_ms[variant] = ms
        bar.update()
    bar.close()

    # ---- 3. the table ------------------------------------------------------------------------------------
    print(f"\nB={B} H={H} N={N} D={D} {str(dtype)[6:]} causal; {info.get('gpu')}, torch {info.get('torch')}, "
          f"triton {info.get('triton')}, {info.get('date')}")
    print("x flash: SDPA-FLASH's time / this one (same mode); vs 5.36: ms / 5.36; check: worst error / FLASH's")
    print(HEADER)
    for row in doc["rows"]:
        print(fmt_row(row))
    for m, b in doc["best"].items():
        print(f"best {m} backward: {b['bwd_ms']:.3f} ms, {cfg_name(m, b['config'])}")
    if skipped:
        print(f"skipped ({len(skipped)}):\n  " + "\n  ".join(x[:110] for x in skipped[:25])
              + ("\n  ..." if len(skipped) > 25 else ""))
    doc["total_s"] = time.time() - t0
    save()
    print(f"wrote {out_path}; total {time.time() - t0:.0f} s")
    return 0


def _with_tables(s5, s6, fwd_cfg, cfg, mode, run):
    with tables_say(s5, s6, fwd_cfg, cfg, mode):
        return run()


def errors_of_autograd(mode, cfg, fwd_cfg, shape, dtype, device, causal):
    q, k, v, do, o, lse, dq, dk, dv = reference(shape, dtype, device, causal)
    try:
        outs = run_variant("autograd", mode, cfg, q, k, v, do, causal, fwd_cfg=fwd_cfg)
    except Exception as e:
        return f"{type(e).__name__}: {first_line(e)}"
    return errors(outs, {"O": o, "dQ": dq, "dK": dk, "dV": dv}, dtype)


HEADER = f"{'variant':<58}{'mode':<9}{'ms':>8}{'x flash':>9}{'vs 5.36':>9}{'check':>7}"


def fmt_row(r):
    ms = f"{r['ms']:.3f}" if r.get("ms") else "-"
    ra = f"{r['ratio']:.2f}" if r.get("ratio") else "-"
    vs = f"{r['ms'] / TARGET_MS:.3f}" if r.get("ms") and r["mode"] == "fwd+bwd" else ""
    ck = f"{r['check']:.3g}" if r.get("check") is not None else ""
    s = f"{r['variant'][:57]:<58}{r['mode']:<9}{ms:>8}{ra:>9}{vs:>9}{ck:>7}"
    return s + ("" if r.get("status") == "ok" else "  " + str(r.get("status"))[:80])


if __name__ == "__main__":
    sys.exit(main())
