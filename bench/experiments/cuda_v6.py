"""Experiment: step 07 forward v6 -- v5 plus the softmax overlapped with a wgmma inside each consumer warpgroup.

Question. The course's forward v5 (solutions/csrc/step07_fwd_v5.cu; config 2, 128x128 tiles, 2 stages)
reaches 0.88-0.98x cuDNN at D=64 and 0.86-0.91x at D=128 on the H200 (results/h200/step07_v5/,
results/h200/grid_1201/). Each consumer iteration issues P_{j-1} V_{j-1} and Q K_j^T, waits for both at
once, then runs the softmax with the tensor cores idle unless the other warpgroup has work queued. Its
header lists what it does not do: FlashAttention-3's intra-warpgroup overlap (arXiv:2407.08608 §3.2),
the exponentials of one tile under a product still in flight. Does v6, which does it, close the rest of
the gap to cuDNN?

Design, as run at 29222e3 (bench/experiments/csrc/step07_fwd_v6.cu there; its header had the details; torch glue
bench/experiments/csrc/step07_v6_binding.cpp). v6 #includes v5's .cu and
reuses its producer, TMA tensor maps, mbarrier ring, setmaxnreg 24/240, layout and epilogue; only the
consumer loop changes. Two orders of the loop:
  - ORDER 0, FlashAttention-3's (its Algorithm 2): issue S_j = Q K_j^T and O += P_{j-1} V_{j-1}, wait<1>
    (S_j retires, P V stays in flight), mask + row max + exp2 + row sums of S_j under P_{j-1} V_{j-1},
    wait<0>, O *= alpha, pack P_j. Nothing in flight at the loop's back edge; one S tile live.
  - ORDER 2, "S-next" (the question's form: the softmax of tile j under Q K^T of tile j+1): issue
    S_{j+1} into the other S buffer, the exponentials of S_j under it (and under P_{j-1} V_{j-1}), wait<1>
    (P_{j-1} V_{j-1} retires), O *= alpha, pack P_j, issue P_j V_j, wait<1> (S_{j+1} retires). The loop
    is unrolled by two (S_even / S_odd two register arrays, never copied) and P V is drained before the
    back edge (an accumulator in flight across it made ptxas serialize every wgmma: C7514).
  Configs: 0 = 128x64 tiles, order 0; 2 = 128x128, order 0 (v5's config 2 plus the overlap);
  6 = 128x64, order 2; 7 = 128x128, order 2, D=64 only. All 2 stages, two consumer warpgroups, no
  ping-pong.
  Found on the way (CPU, SASS): ptxas hoists a wgmma wait to the top of its basic block, above every
  MUFU.EX2, so nothing overlaps unless something ends the block after the exponentials: v6 waits there
  on V_j's mbarrier (needed next anyway; its try-wait loop is a block boundary). And two run-time
  `if (next)` blocks around one wgmma group (issue in one, wait in the other) made ptxas serialize
  (C7514): the last tile is peeled with a literal instead. At D=128 with 128x128 tiles the S-next orders
  do not fit (two 64-register S tiles, O's 64, P's 32): 156-196 bytes spilled and C7512.

Compile report of that copy (CPU, nvcc 13.0, sm_90a, the course's flags; `--compile-report`, 2026-12-01, 10 s): 14
instances (fp16/bf16 x configs 0, 2, 6 at D 64/128, 7 at D=64):
  - spills: none, 0 bytes stack; no C75xx warning (no serialized wgmma) in any instance;
  - USETMAXREG 24 (producer) / 240 (consumers) in each; UTMALDG 3 (D=64) / 6 (D=128); no HMMA, LDL, STL;
  - order 0 (configs 0, 2): consumers' code up to v5's register (R103 / R135 / R151 / R183 at D,BN = 64,64 /
    128,64 / 64,128 / 128,128), HGMMA 16-32, 4 WARPGROUP.DEPBAR; all 34 (BN=64) or 66 (BN=128) MUFU.EX2 of
    a tile issued while P_{j-1} V_{j-1} is in flight, none while Q K^T is (S_j is waited first);
  - order 2 (configs 6, 7): R157 / R187 / R237 (D,BN = 64,64 / 128,64 / 64,128), HGMMA 36-56, 11 DEPBAR;
    34 / 66 MUFU.EX2 a tile issued while Q K_{j+1}^T is in flight (between its HGMMA group and the DEPBAR
    that retires it), 28-65 of them also under P_{j-1} V_{j-1};
  - the control, v5's config 2 (bf16, D 64/128) compiled in the same unit: no MUFU.EX2 under any wgmma.
  (The overlap walk: `overlap()`, layout order through the consumers' SASS, wgmma groups ended by the HGMMA
  marked gsb0, retired by WARPGROUP.DEPBAR.LE gsb0, N.) tests/test_experiment_cuda_v6.py checks these on a
  3-instance build and was seen failing on broken copies: wait<0> at once in order 0 (0 EX2 under P V),
  wait<0> right after issuing S_{j+1} in order 2 (0 under Q K^T), no drain at the back edge or a read of the
  in-flight O there (C7514), no basic-block end after the exponentials (0 EX2 under P V: ptxas hoists the
  wait), consumers at 232 registers (setmaxnreg, 48 bytes spilled).

Answer: yes, in FlashAttention-3's order. One H200, 2026-12-01 21:09 UTC (commit 29222e3, the experiment's own
copy), `--sanitize --budget-s 140`, 91 s: 196/196 cases match the float64 reference, compute-sanitizer memcheck and
racecheck clean. bf16, N 4k-16k (B = 16384/N, H = 2048/D), ratio to cuDNN in the same run (results/h200/step07_v6/):
  - config 2 (128 x 128, order 0): D = 64 0.94-1.00x (395-452 TFLOP/s), D = 128 0.91-1.06x (507-605): 1.03-1.12x
    v5's config 2 (0.90-0.95x and 0.85-0.96x in the run), and faster than cuDNN at D = 128 causal N = 16384;
  - config 0 (128 x 64, order 0): 0.76-0.90x, behind v5's config 2 (half as long a P V to hide the softmax under);
  - the S-next orders (configs 6, 7): 0.51-0.78x, slower than everything: two S tiles live, more waits.
So FlashAttention-3's order moved into the course as forward v6 (solutions/csrc/step07_fwd_v6.cu, configs 0 and
2, default 2; the v6 config 2 kernels there are instruction-for-instruction the measured ones, bf16, checked on
the CPU by comparing cuobjdump's SASS); v5's shared machinery moved to solutions/csrc/step07_tma.cuh (v5's SASS
unchanged, instruction for instruction). The S-next orders stayed here, in git history only: commit 29222e3,
bench/experiments/csrc/step07_fwd_v6.cu. Since then this file checks, times and compiles the course's v6.

What it does on a GPU (each part in its own try/except, the JSON rewritten after every part and row):
  1. build the course's step 07 (v5 and v6 in one extension);
  2. every v6 config against the float64 reference (attnlib.checks: O and the LSE), bf16 and fp16, D 64/128,
     causal and not, (Nq, Nk) in (1, 1), (77, 77), (128, 128), (1000, 1000), (300, 700), (700, 300), (4096, 4096);
  3. timing (triton.testing.do_bench median; each output first compared with v5's): v5 config 2 (the
     course's step07_cuda version 5), v6 configs, SDPA FLASH, SDPA cuDNN; bf16, N 4k/8k/16k, B=16384/N,
     H=2048/D, D 64 and 128, causal and not; TFLOP/s (bench.core.flops), ratio to cuDNN of the same run;
  4. --sanitize: small cases under compute-sanitizer memcheck and racecheck (child processes).
A watchdog stops starting timing rows after --budget-s (default 150 s): under 4 minutes on an H200.

Usage (repo root):
    python bench/experiments/cuda_v6.py --out $OUT/v6 --sanitize    # the GPU run (an H200)
    python bench/experiments/cuda_v6.py --compile-report              # no GPU: registers, spills, SASS, overlap
Test: tests/test_experiment_cuda_v6.py (the compile report's claims, on solutions/csrc/step07_fwd_v6.cu).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
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

from bench.experiments import cuda_v5, gpu_run  # noqa: E402  (nvcc_flags, cuobjdump, parse_report, _step07, flops, SHAPES)

STEP07_CSRC = cuda_v5.STEP07_CSRC                  # solutions/csrc: the course's step 07
V6_SOURCE = STEP07_CSRC / "step07_fwd_v6.cu"       # the course's forward v6 (the solution, never a stub)
CONFIGS = {64: (0, 2), 128: (0, 2)}                # launch_d in step07_fwd_v6.cu (step07_cuda.V6_CONFIGS)
CONFIG_BN = {0: 64, 2: 128}                        # config -> BN; BM = 128, 2 stages, two consumer warpgroups
V5_CONFIG = 2                                      # the course's v5 default, the baseline

REC = gpu_run.Record("cuda_v6")    # the run's log and JSON (bench/experiments/gpu_run.py)
RESULT = REC.result
log, save, part = REC.log, REC.save, REC.part


# ---------------------------------------------------------------- the compile report (CPU)

def compile_v6(workdir: Path, src: Path | None = None) -> tuple[str, str]:
    """nvcc the course's step07_fwd_v6.cu (or ``src``, a modified copy: its step07_* headers are taken from its own
    folder first) to a cubin with -Xptxas -v and the course's flags (cuda_v5.nvcc_flags); return (ptxas report, SASS)."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError("nvcc is not on PATH")
    src = Path(src) if src is not None else V6_SOURCE
    cub = workdir / "v6.cubin"
    cmd = [nvcc, *cuda_v5.nvcc_flags(), "-Xptxas", "-v", f"-I{STEP07_CSRC}", "-cubin", str(src), "-o", str(cub)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"nvcc failed on {src}:\n{r.stderr[-4000:]}")
    tool = cuda_v5.cuobjdump()
    if tool is None:
        raise FileNotFoundError("no cuobjdump (CUDA toolkit or Triton's copy)")
    sass = subprocess.run([tool, "-sass", str(cub)], capture_output=True, text=True).stdout
    return r.stdout + r.stderr, sass


def v6_key(name: str) -> str | None:
    m = re.search(r"fwd_v6_kernel.*V5ConfigILi(\d+)ELi(\d+)ELi(\d+)E", name)
    if not m:
        return None
    ty = "f16" if "6__half" in name else "bf16"
    return f"{ty} D={m.group(1)} BN={m.group(2)}" + ("" if m.group(3) == "2" else f" stages={m.group(3)}")


def overlap(fn_sass: str) -> dict:
    """Walk one kernel's consumer SASS (before USETMAXREG.DEALLOC) in layout order, tracking wgmma groups:
    a group is a run of HGMMA ending with the one marked gsb0; SS (A from a descriptor: Q K^T) or RS (A from
    registers: P V); WARPGROUP.DEPBAR.LE gsb0, N retires the oldest until N are left. Count the MUFU.EX2
    issued while each group was in flight. (Layout order, not control flow: right for these kernels, whose
    loop bodies are laid out straight and whose out-of-line blocks are mbarrier retries.)"""
    lines = [ln.split(";")[0] for ln in fn_sass.split("\n") if "/*" in ln]
    cut = next((i for i, ln in enumerate(lines) if "USETMAXREG.DEALLOC" in ln), len(lines))
    pending, groups, cur = [], [], None
    for ln in lines[:cut]:
        if re.search(r"\bHGMMA\b", ln):
            if cur is None:
                cur = {"kind": "SS" if re.search(r"HGMMA\S*\s+R\d+,\s*gdesc", ln) else "RS", "ex2": 0, "n": 0}
            cur["n"] += 1
            if "gsb0" in ln:
                pending.append(cur)
                groups.append(cur)
                cur = None
        elif re.search(r"\bMUFU\.EX2\b", ln):
            for g in pending:
                g["ex2"] += 1
        else:
            m = re.search(r"WARPGROUP\.DEPBAR\.LE\s+gsb0,\s*(0x[0-9a-f]+|\d+)", ln)
            if m:
                keep = int(m.group(1), 0)
                while len(pending) > keep:
                    pending.pop(0)
    # The producer's code: from USETMAXREG.DEALLOC to its first unpredicated EXIT. (v6's consumers'
    # out-of-line mbarrier retry blocks are laid out after it, with their high registers: cuda_v5's
    # "everything after DEALLOC" would count them as the producer's.)
    end = next((i for i in range(cut, len(lines)) if re.search(r"^\s*/\*[0-9a-f]+\*/\s+EXIT\b", lines[i])), len(lines))
    regs = [int(x) for ln in lines[cut:end + 1] for x in re.findall(r"\bR(\d+)\b", ln)]
    ss = [g["ex2"] for g in groups if g["kind"] == "SS"]
    rs = [g["ex2"] for g in groups if g["kind"] == "RS"]
    return {"groups": len(groups), "ex2_under_qk": ss, "ex2_under_pv": rs,
            "max_ex2_under_qk": max(ss, default=0), "max_ex2_under_pv": max(rs, default=0),
            "ex2_total": sum(1 for ln in lines[:cut] if re.search(r"\bMUFU\.EX2\b", ln)),
            "max_reg_producer": max(regs) if regs else None}


def parse_v6(report: str, sass: str) -> dict:
    """cuda_v5.parse_report (registers, spills, setmaxnreg, instruction counts) per instance, keyed for v6;
    per instance the C75xx warnings ptxas printed for it and the overlap walk."""
    base = cuda_v5.parse_report(report, sass)
    per_fn_warn: dict[str, list[str]] = {}
    for m in re.finditer(r"\((C75\d\d)\)[^\n]*?function '([^']+)'", report):
        per_fn_warn.setdefault(m.group(2), []).append(m.group(1))
    fn_sass = {f.split("\n")[0].strip(): f for f in re.split(r"\n\s*Function : ", sass)[1:]}
    kernels = {}
    for name, text in fn_sass.items():   # cuda_v5 keys them by V5Config (which v6 uses): re-key them for v6
        nk = v6_key(name)
        if nk is not None:
            kernels[nk] = {**base["kernels"][cuda_v5._kernel_key(name)], **overlap(text),
                           "c75xx": sorted(set(per_fn_warn.get(name, [])))}
    return {"c75xx": sorted({w for ws in per_fn_warn.values() for w in ws}), "kernels": kernels}


def compile_report(src: Path | None = None) -> dict:
    """parse_v6 of compile_v6(src); ``source`` says which file was compiled, ``compile_s`` how long."""
    t0 = time.time()
    with tempfile.TemporaryDirectory() as d:
        report, sass = compile_v6(Path(d), src)
    return {"source": str(Path(src) if src is not None else V6_SOURCE), "compile_s": round(time.time() - t0, 1),
            **parse_v6(report, sass)}


def summary(rep: dict) -> list[str]:
    out = [f"{rep['source']} ({rep['compile_s']} s); C75xx anywhere: {rep['c75xx'] or 'none'}"]
    for name, k in sorted(rep["kernels"].items()):
        out.append(f"  {name:20s} regs(ptxas) {k.get('ptxas_registers')} spill {k.get('spill_stores')}/{k.get('spill_loads')}"
                   f" setmaxnreg {k.get('setmaxnreg')} top R{k.get('max_reg_consumers')} HGMMA {k.get('HGMMA')}"
                   f" UTMALDG {k.get('UTMALDG')} DEPBAR {k.get('WARPGROUP.DEPBAR')} EX2 {k.get('ex2_total')}"
                   f" | EX2 under QK^T {k.get('ex2_under_qk')} under PV {k.get('ex2_under_pv')} | C75xx {k.get('c75xx') or '-'}")
    return out


# ---------------------------------------------------------------- the GPU side

def v6_fwd(q, k, v, is_causal=False, scale=None, config=2):
    """(O, LSE) of the course's v6 at ``config``; q, k, v (..., N, D); O in q's dtype, LSE float32 (..., Nq)."""
    cuda_v5._require_sm90a()
    s7 = cuda_v5._step07()
    s = q.shape[-1] ** -0.5 if scale is None else float(scale)
    with torch.no_grad():
        return s7.fwd_op(q, k, v, bool(is_causal), s, 6, int(config))


def check_case(q, k, v, causal, config):
    """Raise (attnlib's report) unless v6's O and LSE match the float64 reference."""
    from attnlib.checks import check_attention, check_lse

    def attn(q, k, v, is_causal, scale):
        return v6_fwd(q, k, v, is_causal, scale, config)[0]
    check_attention(attn, q, k, v, is_causal=causal, grads=False)
    check_lse(v6_fwd(q, k, v, causal, None, config)[1], q, k, v, is_causal=causal)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="folder for cuda_v6.json and cuda_v6.log")
    ap.add_argument("--sanitize", action="store_true", help="also run small cases under compute-sanitizer")
    ap.add_argument("--budget-s", type=float, default=150.0, help="no new timing row starts after this")
    ap.add_argument("--compile-report", action="store_true", help="no GPU: nvcc + cuobjdump, print the report")
    ap.add_argument("--json", action="store_true", help="with --compile-report: print the whole report as JSON")
    ap.add_argument("--sanitize-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    t_start = time.time()

    if args.compile_report:
        rep = compile_report()
        print(json.dumps(rep, indent=1) if args.json else "\n".join(summary(rep)))
        return

    if args.sanitize_child:
        from attnlib import make_qkv
        for D in (64, 128):
            for N in (77, 300):
                for causal in (False, True):
                    q, k, v = make_qkv(1, 2, N, D=D, dtype=torch.bfloat16, device="cuda", seed=N)
                    for config in CONFIGS[D]:
                        v6_fwd(q, k, v, causal, None, config)
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
    s7 = cuda_v5._step07()

    @part("1 build")
    def build_part():
        t0 = time.time()
        ext = s7.build()
        log(f"step 07 (v5, v6) built in {time.time() - t0:.1f} s ({ext.__file__})")
        return {"build_step07_s": round(time.time() - t0, 1)}
    build_part()

    @part("2 correctness")
    def correctness():
        from attnlib import make_qkv

        def cases():
            for dtype in (torch.bfloat16, torch.float16):
                for D in (64, 128):
                    for causal in (False, True):
                        for nq, nk in cuda_v5.SHAPES:
                            for config in CONFIGS[D]:
                                B, H = (1, 2) if max(nq, nk) >= 4096 else (2, 3)
                                q, k, v = make_qkv(B, H, nq, nk, D=D, dtype=dtype, device="cuda", seed=nq + nk + D)
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
                    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                    sc = D ** -0.5
                    impls = {"v5-c2": lambda: cuda_v5.v5_fwd(q, k, v, causal, sc, V5_CONFIG)[0]}
                    for c in CONFIGS[D]:
                        impls[f"v6-c{c}"] = lambda c=c: v6_fwd(q, k, v, causal, sc, c)[0]

                    def sdpa(backend):
                        def f():
                            with sdpa_kernel(backend):
                                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        return f
                    impls["sdpa-flash"] = sdpa(SDPBackend.FLASH_ATTENTION)
                    impls["cudnn"] = sdpa(SDPBackend.CUDNN_ATTENTION)
                    row = {"D": D, "causal": causal, "N": N, "B": B, "H": H, "ms": {}, "tflops": {}, "errors": {},
                           "max_diff_vs_v5": {}}
                    with torch.no_grad():
                        ref = impls["v5-c2"]()
                        for name, fn in impls.items():
                            try:
                                diff = (fn().float() - ref.float()).abs().max().item()
                                row["max_diff_vs_v5"][name] = diff
                                if not diff < 0.05:
                                    raise AssertionError(f"output differs from v5 by {diff:.3g}: not timed")
                                ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
                                row["ms"][name] = ms
                                row["tflops"][name] = cuda_v5.flops(B, H, N, D, causal) / ms / 1e9
                            except Exception as e:  # noqa: BLE001
                                row["errors"][name] = f"{type(e).__name__}: {str(e)[:300]}"
                    cud = row["ms"].get("cudnn")
                    row["x_cudnn"] = {n: cud / ms for n, ms in row["ms"].items()} if cud else {}
                    rows.append(row)
                    RESULT["parts"]["3 timing (partial)"] = rows
                    save()
                    log(f"  D={D} causal={int(causal)} N={N:5d} B={B} H={H}: " + "  ".join(
                        f"{n} {row['tflops'][n]:.0f} TF/s" + (f" (x{row['x_cudnn'][n]:.2f})" if n in row["x_cudnn"] else "")
                        for n in row["tflops"]) + ("" if not row["errors"] else f"  errors: {row['errors']}"))
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
