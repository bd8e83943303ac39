"""Experiment: step 07 forward v5 -- v4's wgmma kernel fed by TMA from a producer warpgroup (FlashAttention-3's shape).

Question. v4 (solutions/csrc/step07_fwd_v4.cu) reaches 0.87-0.88x cuDNN at D=64 and 0.69-0.79x at
D=128 on the H200 (results/h200/step07_v4/README.md). ncu (results/h200/step07_v4/ncu/README.md) says
it gives the tensor cores cuDNN's work but leaves them idle longer: its warps load K and V with
cp.async themselves, wait on every wgmma batch at once, and the block-wide barrier is its largest
stall; cuDNN loads with TMA. Does a warp-specialized v5 -- TMA loads issued by one producer thread
into an mbarrier-guarded ring of stages, two consumer warpgroups that only compute, setmaxnreg moving
registers from the producer to the consumers, and the P V of one tile issued back to back with the
Q K^T of the next -- close that gap (issue 17's 0.90x cuDNN)?

Design (now the course's forward v5: solutions/csrc/step07_fwd_v5.cu, its header has the details;
v4's descriptor and wgmma wrappers shared through solutions/csrc/step07_wgmma.cuh). One CTA = 3
warpgroups, 384 threads, 128 query rows (config 5: 4 warpgroups, 192 rows):
  - warpgroup 0, the producer: setmaxnreg.dec to 24 registers; one thread loads Q once (TMA, one
    cp.async.bulk.tensor per 64-column block), then K_j and V_j into stage j % STAGES, each stage
    guarded by full_k/full_v mbarriers (arrive.expect_tx + TMA complete_tx) and empty_k/empty_v
    (256 consumer arrivals). The tensor maps are 3-D (D, N, BH), boxes of 64 columns x rows x 1,
    CU_TENSOR_MAP_SWIZZLE_128B -- exactly v4's shared layout, so v4's wgmma descriptors are unchanged;
    rows past a sequence's end arrive as zeros. cuTensorMapEncodeTiled is taken from the driver with
    cudaGetDriverEntryPointByVersion (no -lcuda), the maps passed as __grid_constant__ parameters.
  - warpgroups 1 and 2, the consumers: setmaxnreg.inc to 240; 64 query rows each (v4's split).
    Iteration j: issue O += P_{j-1} V_{j-1} (P from registers), then S = Q K_j^T (both from shared
    memory), one wait for both, release K_j and V_{j-1}, mask, v4's base-2 online softmax, pack P.
    The last tile's P V after the loop. (Issuing P V at the end of iteration j instead, in flight
    across the loop's back edge, made ptxas serialize every wgmma: C7515.)
  - configs (launch_d): 0 = 128x64 tiles, 2 stages; 1 = 128x64, 4 stages; 2 = 128x128, 2 stages;
    3 = config 0 with ping-pong; 4 = config 2 with ping-pong; 5 = three consumer warpgroups (192x64
    tiles, 2 stages, setmaxnreg 160 for the consumers). Ping-pong (FlashAttention-3's inter-warpgroup
    schedule): named barriers 1 and 2 give the two consumers turns; a consumer issues its batch
    (P V_{j-1}, Q K_j^T) only in its turn and passes the turn on right after issuing, so the tensor
    cores run one warpgroup's batch while the other one does its softmax.
  Kept from v4: fp32 accumulation, exp2 with the scale folded into one FFMA, masks on boundary tiles
  only, causal tiles longest first, O and the natural-log LSE stored from registers, the contract
  (fp16/bf16, D 64/128, top-left causal, Nq != Nk). Not done: the intra-warpgroup overlap of the
  softmax of tile j with Q K^T of tile j+1, a TMA store of O, persistent CTAs, cluster multicast.
  The experiment first kept its own copy of the kernel and a binding (bench/experiments/csrc/, run
  as below at c7087a7); since the kernel moved into the course unchanged (step07_cuda.py's forward
  version 5, V5_CONFIGS, DEFAULT_CONFIG[5] = 2), this file runs and compiles the course's
  solutions/csrc/step07_fwd_v5.cu and the copy is gone.

Compile report (CPU, nvcc 13.0, sm_90a, the flags step07_cuda.py builds with; `--compile-report`,
2026-12-01, the experiment's copy; the same figures from solutions/csrc/step07_fwd_v5.cu), 24 kernel
instances (2 dtypes x D 64/128 x 6 configs):
  - spills: none; 0 bytes stack in every instance;
  - registers per role: ptxas reports 168 a thread (65536 / 384 at launch; 128 for config 5, 512
    threads); the SASS holds USETMAXREG.DEALLOC 0x18 (producer: 24) and USETMAXREG.TRY_ALLOC 0xf0
    (consumers: 240; 0xa0 = 160 in config 5). The highest register the consumers' code touches:
    R103 (D=64, BN=64), R135 (D=128, BN=64), R151 (D=64, BN=128), R183 (D=128, BN=128: above the
    168 of launch, so the setmaxnreg budget is what ptxas allocates against), the same with
    ping-pong or three consumers; the producer's code stays under R9 (of 24);
  - instructions a kernel (static counts): UTMALDG.3D 3 (D=64) or 6 (D=128): Q, K, V, one per
    64-column block; HGMMA 12 / 16 at BN=64, D=64 / 128 (D/16 for S + BN/16 for P V in the loop,
    BN/16 for the last P V), 20 / 24 at BN=128; no HMMA, no LDGSTS (cp.async), no LDL/STL;
    2 WARPGROUP.DEPBAR (one wait an iteration, one after the loop) and no C7515 serialization;
    SYNCS (mbarrier init / arrive / try-wait) 25 (2 stages) or 33 (4 stages); BAR.SYNC 1 (after
    the mbarrier init), 3 with ping-pong (its two named-barrier waits).
tests/test_experiment_cuda_v5.py checks each of these; it was seen failing with the TMA load replaced
by a plain shared store (0 UTMALDG) and on this file's first version (P V in flight across the back
edge: C7515, 16 DEPBAR), then passing again.

Answer (H200, 2026-12-01 19:14 UTC, c7087a7, the experiment's copy of the kernel, identical to the
course's but for comments, the STUDENT markers and the namespaces; results/h200/step07_v5/
cuda_v5.json, cuda_v5.log, cuda_v5_stdout.log; 103 s): yes, most of it.
  - right: 336/336 reference cases (O and LSE against float64; bf16 and fp16, D 64/128, causal and
    not, Nq != Nk, every config); compute-sanitizer memcheck 0 errors, racecheck 0 hazards;
  - speed (bf16, N 4k/8k/16k, B = 16384/N, H = 2048/D; TFLOP/s and the ratio to cuDNN's SDPA in
    the same run):
      config                      D=64 not causal  D=64 causal  D=128 not causal  D=128 causal
      v4 (128x64, its default)    0.87-0.89x       0.86-0.90x   0.70-0.71x        0.68-0.76x
      v5 0  128x64, 2 stages      0.76-0.79x       0.77-0.82x   0.81-0.83x        0.79-0.88x
      v5 1  128x64, 4 stages      0.76-0.80x       0.77-0.83x   0.72-0.74x        0.71-0.79x
      v5 2  128x128, 2 stages     0.91-0.94x       0.92-0.98x   0.85-0.87x        0.84-0.95x
      v5 3  0 + ping-pong         0.77-0.80x       0.77-0.84x   0.79-0.82x        0.80-0.90x
      v5 4  2 + ping-pong         0.89-0.92x       0.88-0.89x   0.87-0.95x        0.83-0.94x
      v5 5  three consumers       0.86-0.91x       0.82-0.91x   0.82-0.83x        0.78-0.87x
      SDPA FLASH                  0.65-0.67x       0.67-0.68x   0.54-0.57x        0.54-0.57x
    Config 2 is the best overall: 416-429 / 381-428 TFLOP/s at D=64, 519-534 / 472-537 at D=128
    (0.84-0.98x cuDNN, against v4's 0.68-0.90x), the fastest v5 at every D=64 shape. Config 4
    (ping-pong, 128x128) is the best at D=128 without a mask (531-580 TFLOP/s, 0.87-0.95x) and
    within a few percent of config 2 elsewhere at D=128; ping-pong at 128x64 (config 3) and 4 stages
    (config 1) do not pay; 128x64 tiles lose to v4 at D=64 (0.76-0.84x against 0.86-0.90x).
  - so v5 is in the course: solutions/csrc/step07_fwd_v5.cu, step07_cuda.py's forward version 5
    (attention(..., version=5) runs config 2, DEFAULT_CONFIG[5]; FlashAttentionCUDA.apply(q, k, v,
    is_causal, scale, 5, config) any of V5_CONFIGS), with one student region (the producer's loads).
    This file now times and checks that kernel; a rerun measures the course's build.
  Open: the remaining 2-16% (the softmax under the next Q K^T inside one warpgroup, a TMA store of O,
  persistent CTAs).

What it does on a GPU (each part in its own try/except, the JSON rewritten after every part):
  1. build step 07's extension from solutions/ (step07_cuda.build(): v1-v5 and the backward);
  2. v5 (the course's forward version 5: FlashAttentionCUDA.apply(..., 5, config) for O, fwd_op for
     the LSE) against the float64 reference (attnlib.checks), bf16 and fp16, D 64 and 128,
     causal and not, (Nq, Nk) in (1, 1), (77, 77), (128, 128), (1000, 1000), (300, 700), (700, 300),
     (4096, 4096), every config (336 cases);
  3. timing (triton.testing.do_bench, median; every implementation first checked against v4's output
     at that shape): v4 (its default 128x64 config), v5 configs 0-5, SDPA FLASH, SDPA cuDNN; bf16,
     N 4k/8k/16k, B = 16384/N, H = 2048/D, D 128 and 64, causal and not; TFLOP/s with FlashAttention's
     count 4*B*H*N*N*D (halved for causal), ratio to cuDNN from the same run;
  4. ``--sanitize``: a small case (N = 77 and 300, both D, causal and not, every config) in a child
     process under compute-sanitizer memcheck, then racecheck.
A watchdog stops starting new timing rows after --budget-s (default 150 s), so the whole run stays
under 4 minutes on an H200 (103 s with --budget-s 110 on 12-01, two builds then; one now).

Usage (repo root):
    python bench/experiments/cuda_v5.py --out $OUT/v5 --sanitize     # the GPU run (an H200)
    python bench/experiments/cuda_v5.py --compile-report               # no GPU: registers, spills, SASS counts
Test: tests/test_experiment_cuda_v5.py (the compile report's claims on a CPU, on solutions/csrc/step07_fwd_v5.cu;
the reference check on a GPU).
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

# The course's step 07, always the SOLUTION (its student region written): never steps/, whose
# producer loop is a stub, and never $ATTN_IMPL's choice.
STEP07_DIR = REPO / "solutions"
STEP07_CSRC = STEP07_DIR / "csrc"
V5_SOURCE = STEP07_CSRC / "step07_fwd_v5.cu"
VERSION = 5                          # step07_cuda's forward version of this kernel
CONFIGS = (0, 1, 2, 3, 4, 5)        # launch_d in step07_fwd_v5.cu (step07_cuda.V5_CONFIGS)
# config -> (BN, stages, consumer warpgroups, ping-pong); BM = 64 x consumers.
CONFIG_SHAPES = {0: (64, 2, 2, False), 1: (64, 4, 2, False), 2: (128, 2, 2, False), 3: (64, 2, 2, True),
                 4: (128, 2, 2, True), 5: (64, 2, 3, False)}
PRODUCER_REGS = 24
CONSUMER_REGS = {2: 240, 3: 160}    # setmaxnreg.inc of the consumers, by their number

REC = gpu_run.Record("cuda_v5")    # the run's log and JSON (bench/experiments/gpu_run.py)
RESULT = REC.result
log, save, part = REC.log, REC.save, REC.part


def _step07():
    """solutions/step07_cuda.py of this checkout (the path, not "solutions": attnlib may be installed
    from another checkout, and its "solutions" is that one's)."""
    from attnlib.loader import load_step
    return load_step(7, STEP07_DIR)


# ---------------------------------------------------------------- the compile report (CPU)

def nvcc_flags(arch: str = "sm_90a") -> list[str]:
    """The flags step07_cuda.build() gives nvcc: cpp_extension's own (-std=c++17, the
    __CUDA_NO_HALF*/BFLOAT16 defines, --expt-relaxed-constexpr), step07_cuda.NVCC_FLAGS (-O3
    --use_fast_math -lineinfo) and the -gencode of ``arch`` (step07_cuda.arch_flags((9, 0)) for sm_90a)."""
    from torch.utils.cpp_extension import COMMON_NVCC_FLAGS
    s7 = _step07()
    gencode = s7.arch_flags((9, 0)) if arch == "sm_90a" else [f"-gencode=arch=compute_{arch[3:]},code={arch}"]
    return ["-std=c++17", *COMMON_NVCC_FLAGS, *s7.NVCC_FLAGS, *gencode]


def cuobjdump() -> str | None:
    """cuobjdump from the CUDA toolkit, else the copy Triton ships."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton
    except ImportError:
        return None
    cand = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(cand) if cand.exists() else None


def compile_v5(workdir: Path, src: Path | None = None, arch: str = "sm_90a") -> tuple[str, str]:
    """nvcc the course's solutions/csrc/step07_fwd_v5.cu (or ``src``, a modified copy: its step07_*
    headers still come from solutions/csrc) to a cubin with -Xptxas -v; return (ptxas report, SASS).
    RuntimeError with nvcc's stderr when it does not compile."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        raise FileNotFoundError("nvcc is not on PATH")
    src = Path(src) if src is not None else V5_SOURCE
    cub = workdir / "v5.cubin"
    r = subprocess.run([nvcc, *nvcc_flags(arch), "-Xptxas", "-v", f"-I{STEP07_CSRC}", "-cubin", str(src),
                        "-o", str(cub)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"nvcc failed on {src}:\n{r.stderr[-4000:]}")
    tool = cuobjdump()
    if tool is None:
        raise FileNotFoundError("no cuobjdump (CUDA toolkit or Triton's copy)")
    sass = subprocess.run([tool, "-sass", str(cub)], capture_output=True, text=True).stdout
    return r.stdout + r.stderr, sass


def _kernel_key(name: str) -> str:
    m = re.search(r"V5ConfigILi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELb([01])E", name)
    ty = "f16" if "6__half" in name else "bf16"
    return (f"{ty} D={m.group(1)} BN={m.group(2)} stages={m.group(3)} consumers={m.group(4)}"
            + (" pingpong" if m.group(5) == "1" else "")) if m else name


def parse_report(report: str, sass: str) -> dict:
    """Per kernel instance: ptxas registers / stack / spills, the setmaxnreg values, the highest
    register each role's code touches, and the static counts of the instructions that matter."""
    out: dict = {"c75xx": sorted(set(re.findall(r"\(C75\d\d\)[^\n']*", report)))}
    kernels = {}
    # ptxas -v: "Compiling entry function 'NAME'" ... "N bytes stack frame, S bytes spill stores, L bytes spill loads"
    # ... "Used R registers"
    for m in re.finditer(r"Compiling entry function '([^']+)'.*?(\d+) bytes stack frame, (\d+) bytes spill stores, "
                         r"(\d+) bytes spill loads.*?Used (\d+) registers", report, re.S):
        kernels[_kernel_key(m.group(1))] = {"stack": int(m.group(2)), "spill_stores": int(m.group(3)),
                                           "spill_loads": int(m.group(4)), "ptxas_registers": int(m.group(5))}
    for f in re.split(r"\n\s*Function : ", sass)[1:]:
        key = _kernel_key(f.split("\n")[0])
        lines = [ln.split(";")[0] for ln in f.split("\n") if "/*" in ln]
        k = kernels.setdefault(key, {})
        for ins in ("HGMMA", "UTMALDG", "USETMAXREG", "WARPGROUP.DEPBAR", "WARPGROUP.ARRIVE", "SYNCS", "MUFU.EX2",
                    "HMMA", "LDGSTS", "BAR.SYNC", "LDL", "STL"):
            k[ins] = sum(1 for ln in lines if re.search(r"(?<![\w.])" + re.escape(ins) + r"(?![\w])", ln))
        k["setmaxnreg"] = sorted(int(x, 16) if x.startswith("0x") else int(x)
                                 for x in re.findall(r"USETMAXREG\.\S+(?:\s+\S+,)?\s+(0x[0-9a-f]+|\d+)", "\n".join(lines)))
        # The producer's code is laid out after USETMAXREG.DEALLOC; everything before it is the consumers'
        # (and the prologue's, before the roles split).
        cut = next((i for i, ln in enumerate(lines) if "USETMAXREG.DEALLOC" in ln), len(lines))

        def top(ls):
            regs = [int(x) for ln in ls for x in re.findall(r"\bR(\d+)\b", ln)]
            return max(regs) if regs else None
        k["max_reg_consumers"] = top(lines[:cut])
        k["max_reg_producer"] = top(lines[cut:])
    out["kernels"] = kernels
    return out


def compile_report(src: Path | None = None) -> dict:
    """parse_report of compile_v5(src); ``source`` says which file was compiled."""
    with tempfile.TemporaryDirectory() as d:
        report, sass = compile_v5(Path(d), src)
    return {"source": str(Path(src) if src is not None else V5_SOURCE), **parse_report(report, sass)}


# ---------------------------------------------------------------- the GPU side

def _require_sm90a():
    if not torch.cuda.is_available():
        raise RuntimeError("v5 needs a GPU (an H100/H200)")
    cap = torch.cuda.get_device_capability()
    if tuple(cap) != (9, 0):
        raise RuntimeError(f"v5 (wgmma, TMA, setmaxnreg) needs an sm_90a GPU; this one is {cap[0]}.{cap[1]}")


def v5_fwd(q, k, v, is_causal=False, scale=None, config=0):
    """(O, LSE) of the course's forward v5 at ``config``: step07_cuda.fwd_op(q, k, v, is_causal,
    scale, 5, config); O (..., Nq, D) in q's dtype, LSE float32 (..., Nq); no autograd."""
    s = q.shape[-1] ** -0.5 if scale is None else float(scale)
    with torch.no_grad():
        return _step07().fwd_op(q, k, v, bool(is_causal), s, VERSION, int(config))


def check_case(q, k, v, causal, config):
    """Raise (attnlib's report) unless v5's O and LSE match the float64 reference."""
    from attnlib.checks import check_attention, check_lse
    s7 = _step07()

    def attn(q, k, v, is_causal, scale):      # the course's entry point, its input checks included
        return s7.FlashAttentionCUDA.apply(q, k, v, is_causal, scale, VERSION, config)
    check_attention(attn, q, k, v, is_causal=causal, grads=False)
    check_lse(v5_fwd(q, k, v, causal, None, config)[1], q, k, v, is_causal=causal)


SHAPES = [(1, 1), (77, 77), (128, 128), (1000, 1000), (300, 700), (700, 300), (4096, 4096)]


def flops(B, H, N, D, causal):
    """FlashAttention's forward FLOP count (bench.core's)."""
    from bench.core import flops as course_flops
    return course_flops(B, H, N, D, causal, "fwd")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="folder for cuda_v5.json and cuda_v5.log")
    ap.add_argument("--sanitize", action="store_true", help="also run small cases under compute-sanitizer")
    ap.add_argument("--budget-s", type=float, default=150.0, help="no new timing row starts after this")
    ap.add_argument("--compile-report", action="store_true", help="no GPU: nvcc + cuobjdump, print the report")
    ap.add_argument("--sanitize-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    t_start = time.time()

    if args.compile_report:
        rep = compile_report()
        print(json.dumps(rep, indent=1))
        return

    if args.sanitize_child:
        from attnlib import make_qkv
        for D in (64, 128):
            for N in (77, 300):
                for causal in (False, True):
                    q, k, v = make_qkv(1, 2, N, D=D, dtype=torch.bfloat16, device="cuda", seed=N)
                    for config in CONFIGS:
                        v5_fwd(q, k, v, causal, None, config)
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
    RESULT["meta"]["step07_module"] = s7.__file__

    @part("1 build")
    def build_part():
        _require_sm90a()
        t0 = time.time()
        ext = s7.build()
        log(f"step 07 (solutions/: v1-v5, the backward) built in {time.time() - t0:.1f} s: {ext.__file__}")
        return {"build_s": round(time.time() - t0, 1), "module": ext.__file__}
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
                    impls = {"v4": lambda: s7.fwd_op(q, k, v, causal, sc, 4, s7.DEFAULT_CONFIG.get(4, 0))[0]}
                    for c in CONFIGS:
                        impls[f"v5-c{c}"] = lambda c=c: v5_fwd(q, k, v, causal, sc, c)[0]

                    def sdpa(backend):
                        def f():
                            with sdpa_kernel(backend):
                                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        return f
                    impls["sdpa-flash"] = sdpa(SDPBackend.FLASH_ATTENTION)
                    impls["cudnn"] = sdpa(SDPBackend.CUDNN_ATTENTION)
                    row = {"D": D, "causal": causal, "N": N, "B": B, "H": H, "ms": {}, "tflops": {}, "errors": {},
                           "max_diff_vs_v4": {}}
                    with torch.no_grad():
                        ref = impls["v4"]()
                        for name, fn in impls.items():
                            try:
                                diff = (fn().float() - ref.float()).abs().max().item()
                                row["max_diff_vs_v4"][name] = diff
                                if not diff < 0.05:
                                    raise AssertionError(f"output differs from v4 by {diff:.3g}: not timed")
                                ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
                                row["ms"][name] = ms
                                row["tflops"][name] = flops(B, H, N, D, causal) / ms / 1e9
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
