"""Experiment: step 07's dK/dV backward kernel on Hopper's wgmma, now the course's backward v3
(solutions/csrc/step07_bwd_wgmma.cu).

Question. Step 07's fwd+bwd runs 0.50-0.58x cuDNN on an H200 with any forward
(results/h200/grid_1201/README.md): the backward is still backward v2 (solutions/csrc/step07_bwd_mma.cu,
mma.sync), and its dK/dV kernel is the bulk of a FlashAttention-2 backward's time. Does a dK/dV kernel on
wgmma -- forward v4's machinery (solutions/csrc/step07_wgmma.cuh: the 128-byte swizzle, the descriptors,
P fed from registers) -- make a real part of that gap go away?

Design (the kernel file's header has the details). A CTA owns 128 keys (config 0: two warpgroups x 64;
config 1: one warpgroup, 64 keys), K and V resident in shared memory in v4's swizzled layout, fp32 dK and
dV in registers; it walks query tiles of 64 rows (causal: from the key tile's first query), Q and dO
double-buffered by cp.async, LSE and Delta rows double-buffered in shared memory. Per tile:
S^T = K Q^T and dP^T = V dO^T (wgmma SS, one wait), P^T = exp2(...) and dS^T = P^T (dP^T - Delta) in
registers (masks on boundary tiles only), dV += P^T dO and dK += dS^T Q (wgmma RS: P^T, dS^T from
registers; dO, Q MN-major), one wait. Delta and dQ are backward v2's own kernels: the "hybrid"
backward is Delta + this dK/dV + v2's dQ, the whole backward this kernel gives step 07.
The experiment first kept its own copy of the kernel and a binding (bench/experiments/csrc/, the
.cu #including the course's step07_bwd_mma.cu; run as below at 29222e3); since the kernel moved into
the course unchanged but for comments, the STUDENT markers and the namespaces (step07_cuda.py's
backward version 3, the default backward of forwards v4 to v6; v2's Delta and dQ reached through
bwd_mma_delta / bwd_mma_dq instead of an #include), this file times and compiles the course's
solutions/csrc/step07_bwd_wgmma.cu -- the dK/dV kernel alone through the module's bwd3_dkdv, the
hybrid backward as bwd_op(..., 3) -- and the copy is gone.

Compile report (CPU, nvcc 13.0, sm_90a, step07_cuda.build()'s flags, `--compile-report`, 2026-12-01,
the experiment's copy; the same figures from the course's file): 8 instances (f16/bf16 x D 64/128 x
configs 0/1), no spills, 0 bytes stack, no LDL/STL, no C75xx; registers 184 / 194 (D=64, configs 0/1),
254 / 254 (D=128); HGMMA 16 (D=64) / 24 (D=128) = D/16 + D/16 + 64/16 + 64/16, no HMMA; 2
WARPGROUP.DEPBAR; shared memory config 0 66 / 129 KB, config 1 50 / 98 KB.
tests/test_experiment_cuda_bwd_wgmma.py checks them on the course's file.

Answer (H200, 2026-12-01 21:12 UTC, 29222e3, the experiment's copy of the kernel; results/h200/
step07_bwd_wgmma/cuda_bwd_wgmma.json, cuda_bwd_wgmma.log, cuda_bwd_wgmma_stdout.log,
results/h200/step07_bwd_wgmma/README.md; 71 s, `--sanitize --budget-s 110`): yes, a real part.
  - right: 112/112 reference cases (dK, dV of both configs and dQ, dK, dV of the hybrid backward
    against float64; bf16 and fp16, D 64/128, causal and not, Nq != Nk); compute-sanitizer memcheck
    0 errors, racecheck 0 hazards;
  - speed (bf16, N 4k/8k/16k, B = 16384/N, H = 2048/D, 12 shapes): the wgmma dK/dV kernel (config 0)
    takes 0.33-0.39 of backward v2's whole time (401-545 TFLOP/s counting its 4 products; config 1
    0.35-0.42, slower at every shape); the hybrid backward runs 1.19-1.36x faster than v2's (236-304
    TFLOP/s against 191-236), 0.53-0.64x cuDNN's backward (v2: 0.43-0.52x); forward v5 + hybrid
    0.59-0.70x cuDNN's fwd+bwd (v5 + v2: 0.49-0.58x);
  - so it is in the course as backward v3 (config 0), paired by default with forwards v4 and v5 (and v6, added since).
  Open: dQ (v2's mma.sync kernel, which recomputes S and dP) is now the larger part of the backward
  (the hybrid minus dK/dV, i.e. Delta and dQ: 0.53-0.58 of it); next, dQ on wgmma or accumulated
  with atomics in the dK/dV kernel (FlashAttention-3), and the exponentials of P^T under dP^T
  (compiled clean on the CPU, not timed).

What it does on a GPU (each part in its own try/except, the JSON rewritten after every part and row):
  1. build the course's step 07 (solutions/: the forwards that give O and LSE, backward v2 for the
     comparison, backward v3 and its dK/dV kernel alone, bwd3_dkdv);
  2. dK, dV (``dkdv``, both configs) and dQ, dK, dV of the hybrid backward (backward v3) against the float64
     reference (attnlib.reference.reference_backward, attnlib.compare.assert_close: the tolerances of
     tests/test_step07_cuda.py's gradient checks), bf16 and fp16, D 64 and 128, causal and not,
     (Nq, Nk) in (1, 1), (77, 77), (128, 128), (300, 700), (700, 300), (1000, 1000), (1030, 1030);
  3. timing (triton.testing.do_bench, median), bf16, N 4k/8k/16k, B = 16384/N, H = 2048/D, D 128 and 64,
     causal and not: the wgmma dK/dV kernel alone (Delta precomputed), the hybrid backward = backward v3 (Delta + wgmma
     dK/dV + v2's dQ), backward v2 whole (the course's bwd_op), cuDNN's backward (SDPA cuDNN fwd+bwd minus
     its fwd); every output first compared with backward v2's at that shape. TFLOP/s with FlashAttention's
     backward count (2.5x the forward's 4*B*H*N*N*D, halved when causal) for whole backwards and
     2.0x for the dK/dV kernel alone (4 of the 5 products); fwd+bwd view: forward v5 (config 2) + the
     hybrid backward against cuDNN fwd+bwd;
  4. ``--sanitize``: small cases (N 77 and 300, both D, causal and not, both configs) in a child process
     under compute-sanitizer memcheck, then racecheck.
A budget (--budget-s, default 150 s from the start) stops new timing rows, so the whole run stays under
4 minutes on an H200 (one build, then about 2 s a row; 71 s in all on 12-01 with two builds).

Usage (repo root):
    python bench/experiments/cuda_bwd_wgmma.py --out $OUT/bwdw --sanitize     # the GPU run (an H200)
    python bench/experiments/cuda_bwd_wgmma.py --compile-report               # no GPU: registers, spills, SASS
Test: tests/test_experiment_cuda_bwd_wgmma.py (the compile report's claims on a CPU, on the course's
solutions/csrc/step07_bwd_wgmma.cu; the reference check on an sm_90a GPU).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bench.experiments import gpu_run  # noqa: E402

from bench.experiments.cuda_v5 import STEP07_CSRC, _step07, cuobjdump, nvcc_flags, parse_report  # noqa: E402

# The course's backward v3 -- always the SOLUTION (its student region written), never steps/.
KERNEL_SOURCE = STEP07_CSRC / "step07_bwd_wgmma.cu"
BWD_VERSION = 3                     # step07_cuda's backward version of this kernel
CONFIGS = (0, 1)                    # launch_dkdv_d: 0 = 2 warpgroups (128 keys), 1 = 1 warpgroup (64 keys)
CONFIG_WARPGROUPS = {0: 2, 1: 1}
KERNEL = "dkdv_wgmma_kernel"

REC = gpu_run.Record("cuda_bwd_wgmma")    # the run's log and JSON (bench/experiments/gpu_run.py)
RESULT = REC.result
log, save, part = REC.log, REC.save, REC.part


# ---------------------------------------------------------------- the compile report (CPU)

def compile_kernel(workdir: Path, src: Path | None = None) -> tuple[str, str]:
    """nvcc the course's kernel file (or ``src``, a modified copy; step07_* headers from solutions/csrc) to an
    sm_90a cubin with -Xptxas -v and cuda_v5.nvcc_flags() (step07_cuda.build()'s flags): the 8 dK/dV
    instances (v2's Delta and dQ live in step07_bwd_mma.cu, not compiled here); (ptxas report, SASS)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError("nvcc is not on PATH")
    src = Path(src) if src is not None else KERNEL_SOURCE
    cub = workdir / "bwdw.cubin"
    r = subprocess.run([nvcc, *nvcc_flags("sm_90a"), "-Xptxas", "-v", f"-I{STEP07_CSRC}", "-cubin", str(src),
                        "-o", str(cub)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"nvcc failed on {src}:\n{r.stderr[-4000:]}")
    tool = cuobjdump()
    if tool is None:
        raise FileNotFoundError("no cuobjdump (CUDA toolkit or Triton's copy)")
    sass = subprocess.run([tool, "-sass", str(cub)], capture_output=True, text=True).stdout
    return r.stdout + r.stderr, sass


def kernel_key(name: str) -> str:
    """'bf16 D=128 warpgroups=2' from a mangled dkdv_wgmma_kernel<T, BwdWConfig<D, WG>> name."""
    m = re.search(r"BwdWConfigILi(\d+)ELi(\d+)E", name)
    ty = "f16" if "6__half" in name else "bf16"
    return f"{ty} D={m.group(1)} warpgroups={m.group(2)}" if m else name


def compile_report(src: Path | None = None) -> dict:
    """Per instance of the dK/dV kernel: registers, stack, spills, and the static counts of HGMMA, HMMA,
    WARPGROUP.DEPBAR / ARRIVE, MUFU.EX2, LDGSTS, BAR.SYNC, LDL/STL (cuda_v5.parse_report), plus any
    C75xx (ptxas serializing the wgmma) line."""
    t0 = time.time()
    with tempfile.TemporaryDirectory() as d:
        report, sass = compile_kernel(Path(d), src)
    rep = parse_report(report, sass)
    kernels = {kernel_key(k): {n: v for n, v in info.items() if not n.startswith(("max_reg_", "setmaxnreg"))}
               for k, info in rep["kernels"].items() if KERNEL in k}
    return {"source": str(Path(src) if src is not None else KERNEL_SOURCE), "c75xx": rep["c75xx"],
            "warnings": sorted(set(ln.strip() for ln in report.splitlines() if "warning" in ln.lower())),
            "kernels": kernels, "s": round(time.time() - t0, 1)}


# ---------------------------------------------------------------- the GPU side

def build(verbose: bool = False):
    """The course's step 07 module (solutions/, step07_cuda.build()): backward v3 and bwd3_dkdv are in it."""
    return _step07().build(verbose)


def _require_sm90a():
    if not torch.cuda.is_available():
        raise RuntimeError("the wgmma dK/dV kernel needs a GPU (an H100/H200)")
    cap = torch.cuda.get_device_capability()
    if tuple(cap) != (9, 0):
        raise RuntimeError(f"the wgmma dK/dV kernel needs an sm_90a GPU; this one is {cap[0]}.{cap[1]}")


def _flat(t):
    return t.reshape(-1, t.shape[-2], t.shape[-1]).contiguous()


def forward(q, k, v, causal, scale):
    """(O, LSE) of the course's forward v4 (its default config): what the backward is given."""
    s7 = _step07()
    with torch.no_grad():
        return s7.fwd_op(q, k, v, bool(causal), float(scale), 4, s7.DEFAULT_CONFIG.get(4, 0))


def delta_of(o, do):
    """Delta = rowsum(dO * O), float32 (BH, Nq) (what v2's delta2_kernel computes, in torch)."""
    return (o.float() * do.float()).sum(-1).reshape(-1, o.shape[-2]).contiguous()


def dkdv(q, k, v, o, lse, do, causal, scale, config=0):
    """(dK, dV) shaped like k, v: Delta in torch, then the course's wgmma dK/dV kernel (bwd3_dkdv)."""
    dk, dv = build().bwd3_dkdv(_flat(q), _flat(k), _flat(v), lse.reshape(-1, lse.shape[-1]).contiguous(),
                               _flat(do), delta_of(o, do), bool(causal), float(scale), int(config))
    return dk.view(k.shape), dv.view(v.shape)


def hybrid_bwd(q, k, v, o, lse, do, causal, scale):
    """(dQ, dK, dV) by the course's backward v3: Delta and dQ by v2's kernels, dK and dV by the wgmma
    kernel (its config 0: the backward runs no other)."""
    with torch.no_grad():
        return _step07().bwd_op(q, k, v, o, lse, do, bool(causal), float(scale), BWD_VERSION)


def check_case(q, k, v, causal, config):
    """Raise (attnlib's report) unless dK, dV (``dkdv``) and dQ, dK, dV (``hybrid_bwd``) match float64."""
    from attnlib.checks import describe
    from attnlib.compare import assert_close
    from attnlib.inputs import make_dout
    from attnlib.reference import reference_backward
    scale = q.shape[-1] ** -0.5
    o, lse = forward(q, k, v, causal, scale)
    do = make_dout(o, seed=1)
    ref = reference_backward(q, k, v, do, causal, scale)
    ctx = describe(q, k, causal) + f", config {config}"
    dk, dv = dkdv(q, k, v, o, lse, do, causal, scale, config)
    assert_close(dk, ref[1], name="dK", row_label="key rows", context=ctx)
    assert_close(dv, ref[2], name="dV", row_label="key rows", context=ctx)
    if config != 0:
        return                  # the backward runs config 0 only: checked once
    got = hybrid_bwd(q, k, v, o, lse, do, causal, scale)
    for name, g, r, rows in (("dQ", got[0], ref[0], "query rows"), ("dK", got[1], ref[1], "key rows"),
                             ("dV", got[2], ref[2], "key rows")):
        assert_close(g, r, name=f"{name} (hybrid bwd)", row_label=rows, context=ctx)


SHAPES = [(1, 1), (77, 77), (128, 128), (300, 700), (700, 300), (1000, 1000), (1030, 1030)]


def flops(B, H, N, D, causal, mode="bwd"):
    """bench.core's FlashAttention count: fwd 4*B*H*N*N*D (halved causal), bwd 2.5x, fwd+bwd 3.5x."""
    from bench.core import flops as course_flops
    return course_flops(B, H, N, D, causal, mode)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="folder for cuda_bwd_wgmma.json and cuda_bwd_wgmma.log")
    ap.add_argument("--sanitize", action="store_true", help="also run small cases under compute-sanitizer")
    ap.add_argument("--budget-s", type=float, default=150.0, help="no new timing row starts after this")
    ap.add_argument("--compile-report", action="store_true", help="no GPU: nvcc + cuobjdump, print the report")
    ap.add_argument("--sanitize-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    t_start = time.time()

    if args.compile_report:
        print(json.dumps(compile_report(), indent=1))
        return

    if args.sanitize_child:
        from attnlib import make_qkv
        for D in (64, 128):
            for N in (77, 300):
                for causal in (False, True):
                    q, k, v = make_qkv(1, 2, N, D=D, dtype=torch.bfloat16, device="cuda", seed=N)
                    o, lse = forward(q, k, v, causal, D ** -0.5)
                    do = torch.randn_like(o)
                    for config in CONFIGS:
                        dkdv(q, k, v, o, lse, do, causal, D ** -0.5, config)
                    hybrid_bwd(q, k, v, o, lse, do, causal, D ** -0.5)
        torch.cuda.synchronize()
        print("sanitize child: done")
        return

    if args.out is None:
        ap.error("--out DIR is required on the GPU (or --compile-report on a CPU)")
    REC.open(args.out, REPO)
    if not torch.cuda.is_available():
        log("no GPU: nothing to do here (try --compile-report)")
        RESULT["meta"]["error"] = "no GPU"
        save()
        return
    RESULT["meta"]["gpu"] = torch.cuda.get_device_name()
    RESULT["meta"]["capability"] = torch.cuda.get_device_capability()
    log(f"GPU {RESULT['meta']['gpu']} {RESULT['meta']['capability']}, torch {torch.__version__}")
    s7 = _step07()

    @part("1 build")
    def build_part():
        _require_sm90a()
        t0 = time.time()
        course = s7.build()
        log(f"built: step 07 (backward v3 in it) in {time.time() - t0:.1f} s ({course.__file__})")
        return {"course_build_s": round(time.time() - t0, 1), "course_module": course.__file__}
    build_part()

    @part("2 correctness")
    def correctness():
        from attnlib import make_qkv

        def cases():
            for dtype in (torch.bfloat16, torch.float16):
                for D in (64, 128):
                    for causal in (False, True):
                        for nq, nk in SHAPES:
                            for config in CONFIGS:
                                q, k, v = make_qkv(2, 3, nq, nk, D=D, dtype=dtype, device="cuda", seed=nq + nk + D)
                                yield (f"{str(dtype)[6:]} D={D} causal={causal} Nq={nq} Nk={nk} config={config}",
                                       lambda q=q, k=k, v=v, causal=causal, config=config:
                                       check_case(q, k, v, causal, config))
        return gpu_run.check_cases(cases(), log)
    correctness()

    @part("3 timing")
    def timing():
        import triton
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        rows = []
        for D in (128, 64):
            for causal in (False, True):
                for N in (4096, 8192, 16384):
                    if time.time() - t_start > args.budget_s:
                        log(f"  budget ({args.budget_s} s) spent: no more rows")
                        return {"rows": rows, "stopped_early": True}
                    B, H = 16384 // N, 2048 // D
                    sc = D ** -0.5
                    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                    do = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16)
                    with torch.no_grad():
                        o, lse = s7.fwd_op(q, k, v, causal, sc, 5, s7.DEFAULT_CONFIG.get(5, 0))
                    ext = build()
                    q3, k3, v3, do3 = (_flat(t) for t in (q, k, v, do))
                    lse2 = lse.reshape(-1, N).contiguous()
                    delta = delta_of(o, do)
                    row = {"D": D, "causal": causal, "N": N, "B": B, "H": H, "ms": {}, "tflops": {}, "errors": {},
                           "rel_diff_vs_v2": {}}
                    with torch.no_grad():
                        _, dk_ref, dv_ref = s7.bwd_op(q, k, v, o, lse, do, causal, sc, 2)

                    def rel(a, b):
                        return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6)).item()

                    impls = {}
                    for c in CONFIGS:
                        impls[f"wgmma-dkdv-c{c}"] = (lambda c=c: ext.bwd3_dkdv(q3, k3, v3, lse2, do3, delta, causal,
                                                                               sc, c), "dkdv")
                    # the hybrid backward is the course's backward v3 (its name kept: the 12-01 JSON's)
                    impls["hybrid-bwd-c0"] = (lambda: s7.bwd_op(q, k, v, o, lse, do, causal, sc, BWD_VERSION)[1:],
                                              "bwd")
                    impls["v2-bwd"] = (lambda: s7.bwd_op(q, k, v, o, lse, do, causal, sc, 2)[1:], "bwd")
                    for name, (fn, kind) in impls.items():
                        try:
                            with torch.no_grad():
                                dk, dv = fn()
                                d = max(rel(dk.view(k.shape), dk_ref), rel(dv.view(v.shape), dv_ref))
                            row["rel_diff_vs_v2"][name] = d
                            if not d < 0.02:
                                raise AssertionError(f"dK/dV differ from backward v2's by {d:.3g} (relative): not timed")
                            ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
                            row["ms"][name] = ms
                            # the dK/dV kernel does 4 of the backward's 5 products: 2.0x the forward's count
                            row["tflops"][name] = (flops(B, H, N, D, causal, "fwd") * (2.0 if kind == "dkdv" else 2.5)
                                                   / ms / 1e9)
                        except Exception as e:  # noqa: BLE001
                            row["errors"][name] = f"{type(e).__name__}: {str(e)[:300]}"
                    # cuDNN: fwd+bwd minus fwd (SDPA, the cuDNN backend)
                    try:
                        qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))

                        def cud_fwd():
                            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                                return F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)

                        def cud_fb():
                            out = cud_fwd()
                            out.backward(do)
                        ms_f = triton.testing.do_bench(cud_fwd, warmup=25, rep=100, return_mode="median")
                        ms_fb = triton.testing.do_bench(cud_fb, warmup=25, rep=100, return_mode="median",
                                                        grad_to_none=[qg, kg, vg])
                        row["ms"]["cudnn-fwd"] = ms_f
                        row["ms"]["cudnn-fwd+bwd"] = ms_fb
                        row["ms"]["cudnn-bwd"] = ms_fb - ms_f
                        row["tflops"]["cudnn-bwd"] = flops(B, H, N, D, causal, "bwd") / (ms_fb - ms_f) / 1e9
                    except Exception as e:  # noqa: BLE001
                        row["errors"]["cudnn"] = f"{type(e).__name__}: {str(e)[:300]}"
                    try:
                        ms_v5 = triton.testing.do_bench(
                            lambda: s7.fwd_op(q, k, v, causal, sc, 5, s7.DEFAULT_CONFIG.get(5, 0)),
                            warmup=25, rep=100, return_mode="median")
                        row["ms"]["v5-fwd"] = ms_v5
                        for bw in ("hybrid-bwd-c0", "v2-bwd"):
                            if bw in row["ms"]:
                                row["ms"][f"v5+{bw}"] = ms_v5 + row["ms"][bw]
                    except Exception as e:  # noqa: BLE001
                        row["errors"]["v5-fwd"] = f"{type(e).__name__}: {str(e)[:300]}"
                    ms = row["ms"]
                    row["ratios"] = {}
                    if "v2-bwd" in ms:
                        row["ratios"].update({f"{n}/v2-bwd": ms[n] / ms["v2-bwd"] for n in ms if n.startswith(("wgmma", "hybrid"))})
                    if "cudnn-bwd" in ms:
                        row["ratios"].update({f"x_cudnn_bwd[{n}]": ms["cudnn-bwd"] / ms[n]
                                              for n in ("hybrid-bwd-c0", "v2-bwd") if n in ms})
                    if "cudnn-fwd+bwd" in ms:
                        row["ratios"].update({f"x_cudnn_fwd+bwd[{n}]": ms["cudnn-fwd+bwd"] / ms[n]
                                              for n in ("v5+hybrid-bwd-c0", "v5+v2-bwd") if n in ms})
                    rows.append(row)
                    RESULT["parts"]["3 timing (partial)"] = rows
                    save()
                    log(f"  D={D} causal={int(causal)} N={N:5d} B={B} H={H}: "
                        + "  ".join(f"{n} {t:.3f} ms" for n, t in ms.items())
                        + "\n    " + "  ".join(f"{n} {t:.2f}" for n, t in row["ratios"].items())
                        + ("" if not row["errors"] else f"\n    errors: {row['errors']}"))
        return {"rows": rows}
    timing()
    RESULT["parts"].pop("3 timing (partial)", None)

    if args.sanitize:
        @part("4 sanitize")
        def sanitize():
            return gpu_run.sanitize(__file__, t_start, log)
        sanitize()

    RESULT["meta"]["total_s"] = round(time.time() - t_start, 1)
    save()
    log(f"\ndone in {time.time() - t_start:.0f} s; {REC.json_path}")


if __name__ == "__main__":
    main()
