"""Experiment: where step 09 loses to FlexAttention without global tokens (window 256: 0.77-0.79x forward +
backward, 0.84-0.85x forward; results/h200/sparse/README.md, fourth run).

Question. Both walk the same band: a 128-row query tile at window 256 meets 6 key tiles of 64 in step 09 (2 of
them full) and 3 blocks of 128 in FlexAttention (1 full), the same keys and the same share of masked work. So
where does step 09's time go that FlexAttention's does not: occupancy, stalls on the masked stages, memory,
or the backward's split into a dK/dV and a dQ kernel? The profiler's view of each kernel, side by side.

This file runs one warm forward + backward of each (N = 32768, H = 16, D = 64, bf16, causal, window 256, no
global token) inside an NVTX range "measure", after warm-up calls outside it; ncu profiles the kernels in that
range only:

    ncu --nvtx --nvtx-include "measure/" --target-processes all \\
        --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \\
        --section MemoryWorkloadAnalysis --section SchedulerStats -o DIR/sparse_vs_flex \\
        python bench/experiments/sparse_vs_flex_ncu.py
    ncu --import DIR/sparse_vs_flex.ncu-rep --page details --csv > DIR/sparse_vs_flex.csv

Without ncu, ``python bench/experiments/sparse_vs_flex_ncu.py --out DIR`` times each kernel's call with
do_bench instead (a minute on an H200), so the kernels can be ranked before profiling.

Answer (one H200, 2026-12-01; results/h200/sparse/README.md, "Fifth run"). The backward first: at 5e80ecd
(12:25 UTC, only the log came back) step 09 took 0.283 ms forward and 1.524 ms forward + backward against
FlexAttention's 0.242 / 1.160 (0.85x, 0.76x), and the profiler's kernel list put 0.42 ms of step 09's backward
in three PyTorch kernels computing D = rowsum(dO * O) in fp32 (a copy 198 us, a multiply 94.5, a sum 129),
more than its dQ kernel (289 us; dK/dV 391, forward 283). Those became one Triton kernel, attnlib/rowdot.py
(5c8a7ee, 36 us; FlexAttention's own pass 35 us): forward + backward 1.143 against 1.153 ms, 1.01x
(results/h200/sparse/sparse_vs_flex_5c8a7ee.json). The forward stays 0.85x (0.282 / 0.241 ms). ncu of the two
forward kernels (sparse_vs_flex_ncu_5c8a7ee.csv; the report itself did not come back): step 09 365.6 us under
ncu, 128 registers, 8 warps, 65.5 KB shared, 2 programs an SM, occupancy 25%, an instruction issued in 61.5%
of cycles; FlexAttention 312.8 us, 255 registers, 4 warps, 114.7 KB, 2 programs an SM, occupancy 12.5%, 49.7%;
both 4096 programs, L2 hit 52%, DRAM 15-17%. Neither is memory-bound; step 09 issues about 1.45x the
instructions (0.615 x 365.6 / (0.497 x 312.8)): the forward's gap is instruction count, not occupancy or
memory. Open: which instructions (likely the per-element mask arithmetic on the partial tiles); next, ncu's
source view (--set full, SourceCounters) of both forward kernels. FlexAttention's 128-key tiles do not help
step 09's forward (bench/experiments/sparse_bwd_tiles.py --fwd-only). (The kernel list also holds 278 us of
bf16 adds for both sides: .backward(do) accumulates .grad into the same leaf tensors.)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from attnlib.loader import load_step  # noqa: E402
from bench.core import machine_info  # noqa: E402
from bench.sparse_gpu import make_mask_mod  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None, help="time each side with do_bench and write DIR/timings.json")
    ap.add_argument("--n", type=int, default=32768)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--globals", type=int, default=0)
    args = ap.parse_args(argv)
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    s9 = load_step(9, "solutions")
    flex = torch.compile(flex_attention)
    N, w, g, H, D = args.n, args.window, args.globals, 16, 64
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    bm = create_block_mask(make_mask_mod(w, g), 1, 1, N, N, device="cuda")
    sides = {
        "step09": lambda: s9.attention_sparse(q, k, v, w, g, is_causal=True),
        "flex": lambda: flex(q, k, v, block_mask=bm),
    }
    for fn in sides.values():                       # warm-up: compiles, tile schedules, autotuning
        for _ in range(3):
            fn().backward(do)
    torch.cuda.synchronize()
    if args.out is None:
        torch.cuda.nvtx.range_push("measure")
        for name, fn in sides.items():
            torch.cuda.nvtx.range_push(name)
            fn().backward(do)
            torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        return 0
    import triton
    res = {"machine": machine_info(), "N": N, "window": w, "n_global": g, "H": H, "D": D}
    for name, fn in sides.items():
        with torch.no_grad():
            res[f"{name}_fwd_ms"] = float(triton.testing.do_bench(fn, warmup=25, rep=200))
        res[f"{name}_fwd_bwd_ms"] = float(triton.testing.do_bench(lambda: fn().backward(do), warmup=25, rep=200))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for fn in sides.values():
            fn().backward(do)
        torch.cuda.synchronize()
    res["kernels_us"] = {e.key: round(e.device_time_total, 1) for e in prof.key_averages()
                         if e.device_time_total > 0}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "timings.json").write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: v for k, v in res.items() if k != "machine"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
