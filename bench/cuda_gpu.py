"""Step 07 on a GPU: build, validate every CUDA version, then benchmark them against SDPA-FLASH.

    python bench/cuda_gpu.py --out results/h200/step07_cuda.json      # build, validate, benchmark
    python bench/cuda_gpu.py --mutants /tmp/step07_mutants            # break it on purpose, expect failures
    ncu --clock-control none -k regex:"fwd_v3|flash_fwd" python bench/cuda_gpu.py --profile-once

Order, as in llm.c's dev/cuda: the float64 reference first, every version
validated against it (the run stops at the first mismatch), and only then
"All results match. Starting benchmarks."

The benchmark is FlashAttention's standard grid: bf16, 16k tokens per batch
(B = 16384 / N), hidden 2048 (H = 2048 / D), D in {64, 128}, N in
{512 .. 16384}, causal and not. FLOPs as FlashAttention counts them:

    forward   4 * B * H * N^2 * D      two products of 2 N^2 D each per head
    causal    half of that             only the lower triangle is computed
    backward  2.5 x forward            four products and the recomputation of S

Each time is the median of ``triton.testing.do_bench`` (CUDA events, L2 flushed
between repeats). The ratio is SDPA-FLASH's time over ours at the same shape,
measured in the same run: above 1 we are faster. v1 (scalar fp32) takes
seconds per call at long N, so it runs only up to --slow-n.

``--mutants DIR`` copies solutions/ to DIR, plants classic bugs (v3 forgets
to rescale O by exp(m_old - m_new); v2's causal mask is off by one; both
backwards forget Delta), runs tests/test_step07_cuda.py on the copy and
checks that every planted bug is caught by the tests meant to catch it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from attnlib import make_qkv  # noqa: E402
from attnlib.checks import check_attention, check_lse  # noqa: E402
from attnlib.loader import load_step  # noqa: E402


def flops(B, H, N, D, causal, mode="fwd"):
    f = 4.0 * B * H * N * N * D
    if causal:
        f /= 2
    return {"fwd": f, "bwd": 2.5 * f}[mode]


def machine():
    import triton
    nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    return {"gpu": torch.cuda.get_device_name(), "capability": ".".join(map(str, torch.cuda.get_device_capability())),
            "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton.__version__,
            "nvcc": nvcc[-1] if nvcc else None,
            "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


# ---------------------------------------------------------------- validation

VALIDATE = [  # (batch, Nq, Nk, D)
    ((2, 3), 100, 100, 64), ((1, 2), 257, 257, 128), ((2, 1), 100, 33, 128), ((1, 2), 17, 300, 64),
    ((1, 1), 1000, 1000, 128),
]


def variants(mod, versions, D):
    """(name, version, config) for every forward timed: each version, and each of v3's to v6's configs."""
    out = []
    tables = {3: mod.V3_CONFIGS, 4: mod.V4_CONFIGS, 5: mod.V5_CONFIGS, 6: mod.V6_CONFIGS}
    for version in versions:
        configs = tables[version][D] if version in tables else (0,)
        for c in configs:
            out.append((f"step07-v{version}" + (f"-c{c}" if c else ""), version, c))
    return out


def fwd_fn(mod, version, config):
    def attn(q, k, v, is_causal=False, scale=None):
        s = 1.0 / q.shape[-1] ** 0.5 if scale is None else scale
        return mod.FlashAttentionCUDA.apply(q, k, v, is_causal, s, version, config)
    return attn


def validate_configs(mod):
    """v3's other tile shapes, in bf16 (the default, config 0, is validated with every version)."""
    for D, configs in mod.V3_CONFIGS.items():
        for c in configs[1:]:
            for batch, nq, nk, _ in VALIDATE:
                for causal in (False, True):
                    q, k, v = make_qkv(Nq=nq, Nk=nk, D=D, batch_shape=batch, dtype=torch.bfloat16, device="cuda",
                                       seed=nk + c)
                    check_attention(fwd_fn(mod, 3, c), q, k, v, is_causal=causal, grads=False)
        print(f"  v3 configs {list(configs[1:])} at D={D}: O matches")


def validate(mod, versions):
    for version in versions:
        dtypes = [torch.bfloat16, torch.float16] + ([torch.float32] if version == 1 else [])
        for dtype in dtypes:
            for batch, nq, nk, d in VALIDATE:
                for causal in (False, True):
                    q, k, v = make_qkv(Nq=nq, Nk=nk, D=d, batch_shape=batch, dtype=dtype, device="cuda", seed=nk)
                    attn = lambda q, k, v, is_causal, scale, _v=version: mod.attention(  # noqa: E731
                        q, k, v, is_causal=is_causal, scale=scale, version=_v)
                    check_attention(attn, q, k, v, is_causal=causal, grads=True)
                    _, lse = mod.attention_with_lse(q, k, v, is_causal=causal, version=version)
                    check_lse(lse, q, k, v, is_causal=causal)
        print(f"  v{version}: O, LSE, dQ, dK, dV match the float64 reference "
              f"({len(VALIDATE) * 2 * len(dtypes)} cases)")


# ---------------------------------------------------------------- benchmark

def bench(mod, versions, Ds, Ns, slow_n, bwd_ns, info):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    rows = []

    def row(impl, version, mode, B, H, N, D, causal, ms, sdpa_ms, config=None):
        r = dict(impl=impl, version=version, config=config, mode=mode, dtype="bfloat16", B=B, H=H, N=N, D=D, causal=causal,
                 ms=ms, tflops=flops(B, H, N, D, causal, mode) / (ms * 1e-3) / 1e12,
                 ratio_to_sdpa_flash=sdpa_ms / ms, machine=info)
        rows.append(r)
        print(f"{impl:12s} {mode:4s} D={D:3d} N={N:5d} B={B:2d} H={H:2d} {'causal' if causal else 'full  '} "
              f"{ms:9.3f} ms {r['tflops']:7.1f} TFLOP/s  x{r['ratio_to_sdpa_flash']:.2f} of SDPA-FLASH", flush=True)

    def sdpa(q, k, v, causal):
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    for D in Ds:
        for causal in (False, True):
            for N in Ns:
                B, H = max(1, 16384 // N), 2048 // D
                q, k, v = make_qkv(B, H, N, D=D, dtype=torch.bfloat16, device="cuda", seed=N)
                with torch.no_grad():
                    sdpa_ms = do_bench(lambda: sdpa(q, k, v, causal), warmup=25, rep=100, return_mode="median")
                    row("sdpa-flash", None, "fwd", B, H, N, D, causal, sdpa_ms, sdpa_ms)
                    for name, version, config in variants(mod, versions, D):
                        if version == 1 and N > slow_n:
                            continue
                        fn = fwd_fn(mod, version, config)
                        ms = do_bench(lambda: fn(q, k, v, causal), warmup=25, rep=100, return_mode="median")
                        row(name, version, "fwd", B, H, N, D, causal, ms, sdpa_ms, config)
                if N in bwd_ns:
                    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
                    do = torch.randn_like(q)
                    o_ref = sdpa(q, k, v, causal)
                    # backward only: the graph is kept, the gradients are recomputed each call
                    b_sdpa = do_bench(lambda: torch.autograd.grad(o_ref, (q, k, v), do, retain_graph=True),
                                      warmup=25, rep=100, return_mode="median")
                    row("sdpa-flash", None, "bwd", B, H, N, D, causal, b_sdpa, b_sdpa)
                    for bv in (1, 2, 3):
                        if bv == 1 and N > slow_n:
                            continue
                        if bv in mod.BWD_ARCH_ONLY and torch.cuda.get_device_capability() != mod.BWD_ARCH_ONLY[bv]:
                            continue                # backward v3 (wgmma dK/dV): sm_90a only
                        o_ours = mod.FlashAttentionCUDA.apply(q, k, v, causal, D ** -0.5, 3, 0, bv)
                        b_ours = do_bench(lambda: torch.autograd.grad(o_ours, (q, k, v), do, retain_graph=True),
                                          warmup=25, rep=100, return_mode="median")
                        row(f"step07-bwd{bv}", bv, "bwd", B, H, N, D, causal, b_ours, b_sdpa)
                    del o_ref, o_ours, do
                del q, k, v
                torch.cuda.empty_cache()
    return rows


def table(rows):
    """Forward TFLOP/s per version and shape, plus each version's ratio to SDPA-FLASH."""
    impls = sorted({r["impl"] for r in rows if r["mode"] == "fwd"}, key=lambda s: (s != "sdpa-flash", s))
    keys = sorted({(r["D"], r["causal"], r["N"]) for r in rows if r["mode"] == "fwd"})
    by = {(r["impl"], r["D"], r["causal"], r["N"]): r for r in rows if r["mode"] == "fwd"}
    lines = ["forward, bf16, TFLOP/s (ratio to SDPA-FLASH)",
             f"{'D':>4} {'causal':>6} {'N':>6} " + " ".join(f"{i:>17s}" for i in impls)]
    for D, causal, N in keys:
        cells = []
        for i in impls:
            r = by.get((i, D, causal, N))
            cells.append(f"{'-':>17s}" if r is None else f"{r['tflops']:8.1f} (x{r['ratio_to_sdpa_flash']:.2f})")
        lines.append(f"{D:>4} {str(causal):>6} {N:>6} " + " ".join(cells))
    return "\n".join(lines)


# ---------------------------------------------------------------- mutants

MUTANTS = [
    ("v3 forgets to rescale O", "csrc/step07_fwd_v3.cu",
     "                    o[mt][nt][2 * h] *= alpha;\n                    o[mt][nt][2 * h + 1] *= alpha;\n", ""),
    ("v2 causal mask off by one", "csrc/step07_fwd_v2.cu",
     "if (key >= p.nk || (p.causal && key > row)) s[nt][e] = -INFINITY;",
     "if (key >= p.nk || (p.causal && key >= row)) s[nt][e] = -INFINITY;"),
    ("backward forgets Delta", "csrc/step07_bwd.cu",
     "dSs[i * (BT + 1) + j] = pij * (dp - delta[i]);", "dSs[i * (BT + 1) + j] = pij * dp;"),
    ("tensor-core backward forgets Delta in dK", "csrc/step07_bwd_mma.cu",
     "dp[nt][e] = pv * (dp[nt][e] - dlt[st * BB + qi]);", "dp[nt][e] = pv * dp[nt][e];"),
]


def make_mutant(dest: Path):
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(REPO / "solutions", dest, ignore=shutil.ignore_patterns("__pycache__"))
    for name, rel, old, new in MUTANTS:
        p = dest / rel
        text = p.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"mutant '{name}': the line to break was not found exactly once in {rel}")
        p.write_text(text.replace(old, new))
    return dest


def run_mutants(dest: Path, build_only=False):
    if not (dest / "step07_cuda.py").exists():
        make_mutant(dest)
    mod = load_step(7, dest)
    t = time.time()
    mod.build()
    print(f"mutant build: {time.time() - t:.0f} s", flush=True)
    if build_only:
        return 0
    env = dict(os.environ, CI="true", COLUMNS="4000")   # keep pytest's summary lines whole
    r = subprocess.run([sys.executable, "-m", "pytest", str(REPO / "tests/test_step07_cuda.py"), "--impl", str(dest),
                        "-q", "-rf", "--tb=no", "-p", "no:cacheprovider", "-k", "forward_backward_lse"],
                       capture_output=True, text=True, cwd=REPO, env=env)
    failed = {}
    for line in r.stdout.splitlines():
        m = re.match(r"FAILED \S+::test_forward_backward_lse\[(\S+)\] - \S+: (\w+) does not match", line)
        if m:
            failed[m.group(1)] = m.group(2)
    print(r.stdout.strip().splitlines()[-1] if r.stdout.strip() else r.stderr[-2000:])

    # What each planted bug must do (test ids: version-dtype-causal-case).
    def cases(prefix, causal=None):
        return [i for i in ALL_IDS if i.startswith(prefix) and (causal is None or f"-{causal}-" in i)]

    expect = {}
    for i in cases("v3-"):
        # The rescale matters once a row spans two key tiles (BN = 64) and its max
        # grows in the second; with 100 keys or more that happens in every case.
        # Below, the backward's bug is the one sure to show.
        nk = int(re.search(r"-k(\d+)-", i).group(1))
        expect[i] = {"O"} if nk >= 100 else {"O", "dQ", "dK", "dV"}
    for i in cases("v2-", "causal"):
        expect[i] = {"O"}
    for i in cases("v2-", "full") + cases("v1-"):
        expect[i] = {"dQ", "dK", "dV"}              # only the backwards are broken there
    missed = {i: e for i, e in expect.items() if failed.get(i) not in e}
    for name, *_ in MUTANTS:
        print(f"  planted: {name}")
    print(f"mutant tests failing: {len(failed)} of {len(ALL_IDS)}; by first mismatch: "
          + ", ".join(f"{q}: {list(failed.values()).count(q)}" for q in ("O", "LSE", "dQ", "dK", "dV")))
    if missed:
        print("NOT CAUGHT as expected:")
        for i, e in sorted(missed.items()):
            print(f"  {i}: expected a failure on {sorted(e)}, got {failed.get(i, 'a pass')}")
        return 1
    print("every planted bug was caught by the tests meant to catch it")
    return 0


def _all_ids():
    sys.path.insert(0, str(REPO / "tests"))
    import test_step07_cuda as t
    ids = []
    for v, d in t.VERSION_DTYPES:
        for causal in ("full", "causal"):
            for c in t.GPU_CASES:
                ids.append(f"v{v}-{str(d).replace('torch.', '')}-{causal}-{t._id(c)}")
    return ids


ALL_IDS: list[str] = []


def main(argv=None):
    global ALL_IDS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="JSON file for the rows")
    ap.add_argument("--impl", default="solutions")
    ap.add_argument("--versions", default="1,2,3,4,5,6", help="v4 to v6 (wgmma) are dropped off sm_90")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--ns", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--slow-n", type=int, default=2048, help="largest N for v1")
    ap.add_argument("--bwd-ns", default="1024,4096,16384", help="N at which the backward is timed too (D=128 only)")
    ap.add_argument("--mutants", type=Path, help="plant bugs in a copy of solutions/ here and test it")
    ap.add_argument("--build-only", action="store_true", help="with --mutants: build the copy, test nothing")
    ap.add_argument("--profile-once", action="store_true",
                    help="run v3 and SDPA-FLASH once each (bf16, D=128, N=4096, B=4, H=16, not causal), for ncu")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench/cuda_gpu.py needs a CUDA GPU")
    if args.mutants:
        ALL_IDS = _all_ids()
        return run_mutants(args.mutants, args.build_only)

    if args.profile_once:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        mod = load_step(7, args.impl)
        q, k, v = make_qkv(4, 16, 4096, D=128, dtype=torch.bfloat16, device="cuda")
        with torch.no_grad():
            mod.attention(q, k, v)                       # build and warm up outside the profiled launches
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                F.scaled_dot_product_attention(q, k, v)
            torch.cuda.synchronize()
            mod.attention(q, k, v)
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                F.scaled_dot_product_attention(q, k, v)
        torch.cuda.synchronize()
        return 0

    info = machine()
    print(json.dumps(info))
    mod = load_step(7, args.impl)
    t = time.time()
    mod.build(verbose=False)
    print(f"build (or cache load): {time.time() - t:.0f} s", flush=True)
    versions = [int(x) for x in args.versions.split(",")]
    for hopper in (4, 5, 6):
        if hopper in versions and torch.cuda.get_device_capability() != (9, 0):
            print(f"v{hopper} needs sm_90a (wgmma): not run on this GPU", flush=True)
            versions.remove(hopper)
    print("validating against the float64 reference ...", flush=True)
    validate(mod, versions)
    if 3 in versions:
        validate_configs(mod)
    print("All results match. Starting benchmarks.", flush=True)
    Ds = [int(x) for x in args.dims.split(",")]
    Ns = [int(x) for x in args.ns.split(",")]
    bwd_ns = [int(x) for x in args.bwd_ns.split(",") if x]
    rows = []
    for D in Ds:
        rows += bench(mod, versions, [D], Ns, args.slow_n, bwd_ns if D == 128 else [], info)
    print(table(rows))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=1))
        print(f"wrote {len(rows)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
