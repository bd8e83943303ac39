"""Experiment: what does the profiler say step 07's forward v4 (wgmma) still leaves to cuDNN, against v3 (mma.sync)?

Question. On the H200 v4 runs 1.27-1.39x v3 and 0.87-0.88x cuDNN at D=64, 0.69-0.79x at D=128
(results/h200/step07_v4/README.md). Issue 17 asks notebook 07 for ncu figures of v3 and v4: tensor-pipe
utilization and stall reasons. Is v4 waiting on its wgmma batches (it waits for each at once), on memory
(cp.async by the computing warps, no TMA), or on occupancy (config 0 fits one CTA an SM)? cuDNN's kernel on
the same shape is the yardstick.

Method. One warm forward of each side (v3, v4 config 1 = 128x64, v4 config 0 = 128x128, SDPA's cuDNN backend)
inside an NVTX range "measure", after warm-up calls outside it; bf16, not causal, B = 1, H = 2048 / D,
N = 16384, D in {64, 128}. ncu profiles the kernels in that range only:

    ncu --nvtx --nvtx-include "measure/" --target-processes all \\
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \\
        --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \\
        -o DIR/cuda_v3_v4 python bench/experiments/cuda_v3_v4_ncu.py
    ncu --import DIR/cuda_v3_v4.ncu-rep --page details --csv > DIR/cuda_v3_v4.csv

(Tar the folder before it leaves a lent machine: only a few loose files come back.) Without ncu,
``--out DIR`` times each side with do_bench and writes DIR/cuda_v3_v4_timings.json (under a minute), a check
that the sides run before profiling them.

Answer: not yet run (written 2026-12-01 without a GPU; the device time of that session was spent).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def sides(s7, D):
    """name -> a forward call, for one head dim."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    H, N = 2048 // D, 16384
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    return {
        f"v3 D={D}": lambda: s7.attention_with_lse(q, k, v, False, None, 3),
        f"v4-128x64 D={D}": lambda: s7.FlashAttentionCUDA.apply(q, k, v, False, None, 4, 1),
        f"v4-128x128 D={D}": lambda: s7.FlashAttentionCUDA.apply(q, k, v, False, None, 4, 0),
        f"cudnn D={D}": cudnn,
    }, 4 * H * N * N * D


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="time each side with do_bench instead of the NVTX range")
    ap.add_argument("--dims", default="64,128")
    args = ap.parse_args(argv)
    import torch

    from attnlib.loader import load_step
    from bench.core import machine_info

    s7 = load_step(7, "solutions")
    s7.build()
    runs = {}
    for D in (int(d) for d in args.dims.split(",")):
        fns, flops = sides(s7, D)
        runs[D] = (fns, flops)
        with torch.no_grad():
            for fn in fns.values():                # warm-up: the extension's first launch, cuDNN's plan
                for _ in range(3):
                    fn()
    torch.cuda.synchronize()
    if args.out is None:
        torch.cuda.nvtx.range_push("measure")
        with torch.no_grad():
            for fns, _ in runs.values():
                for name, fn in fns.items():
                    torch.cuda.nvtx.range_push(name)
                    fn()
                    torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        return 0
    import triton
    res = {"machine": machine_info(), "N": 16384, "dtype": "bfloat16", "causal": False, "rows": []}
    with torch.no_grad():
        for D, (fns, flops) in runs.items():
            for name, fn in fns.items():
                ms = float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))
                res["rows"].append({"side": name, "D": D, "ms": round(ms, 4), "tflops": round(flops / ms / 1e9, 1)})
                print(res["rows"][-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cuda_v3_v4_timings.json").write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
