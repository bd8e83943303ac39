"""Experiment: what ncu shows is left between steps 05/06 (Triton) and cuDNN on the H200.

Question. Issue 17's Triton targets are not met: step 05's forward runs 0.80-0.97x cuDNN, step 06's
forward+backward 0.72-0.83x (results/h200/grid_1201/README.md), and the CS336 leaderboard shape reads
5.06 ms against cuDNN's 4.49 (results/h200/gpu-check/). The issue asks, where a target is not reached, for
what the profiler shows is left. The compile reports say Triton waits on every wgmma right after issuing it
(results/h200/triton/README.md); this asks ncu the same questions notebook 07 asked of step 07 v3/v4
(results/h200/step07_v4/ncu/): how busy the tensor pipe is, what the warps stall on, how many warps an SM
holds, against cuDNN's kernels on the same inputs.

Sides (bf16, one warm call each inside an NVTX range "measure", warm-up calls outside it):
  - the leaderboard shape, B=1, H=16, N=16384, D=64, causal: step 05's forward ("s05-fwd"), step 06's
    backward on that forward's O and LSE with a random dO ("s06-bwd": its Delta, dK/dV and dQ kernels),
    cuDNN's forward and its backward (SDPA's CUDNN_ATTENTION, the backward through autograd.grad);
  - D=128, not causal, B=1, H=16, N=16384, the forward only (where step 05 is furthest from cuDNN: 0.84x).

Usage (an H200; ncu fixes the clocks unless told otherwise, as in step07_v4/ncu):
    ncu --nvtx --nvtx-include "measure/" --target-processes all --section SpeedOfLight \\
        --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats \\
        --section MemoryWorkloadAnalysis -o DIR/triton python bench/experiments/triton_ncu.py
    ncu --import DIR/triton.ncu-rep --page details --csv > DIR/triton.csv
    ncu --import DIR/triton.ncu-rep --page raw --csv > DIR/triton_raw.csv
    python bench/experiments/triton_ncu.py --out DIR         # triton_timings.json: do_bench, no ncu
    python bench/experiments/triton_ncu.py --summarize DIR   # summary.json (CPU), the fields of cuda_v3_v4_ncu.py
    (each of the three with --shapes c4k64,c4k128: the causal forward and backward at N=4096, D 64 and 128,
    instead; run on an H200 2026-12-03 11:36 UTC, results/h200/triton/ncu_c4k/ and its README)
Test: tests/test_experiment_triton_ncu.py (the sides' names and the summary on a stand-in report).

Answer (one H200, 2026-12-01 ~22:07 UTC; results/h200/triton/ncu/, its README has the table). ncu fixed the SM
clock (1.32-1.47 GHz); shares of cycles and tensor-busy time (share x duration) are what carry:
  - leaderboard forward: nothing left. Step 05 and cuDNN give the tensor pipe the same work (0.76 ms busy each)
    at the same share (47.8% / 47.3%); do_bench 1.19 against 1.27 ms.
  - D=128 forward: the same tensor work (3.00 / 3.09 ms busy) at 56% of the cycles against cuDNN's 75%: step 05's
    one 8-warp program an SM (254 registers) stalls on barriers and wgmma waits; cuDNN's warp-specialized kernel
    keeps the products going under the softmax (what step 07 v5/v6 do in CUDA).
  - leaderboard backward: utilization is not the gap (dK/dV 52.6%, dQ 70.9% against cuDNN's 48.2%); the work is:
    2.65 ms of tensor-busy time against 1.91 (1.39x), the dQ kernel's recomputation of S and dP (seven products
    against five; cuDNN adds dQ with atomics). About the whole of the 0.56 ms backward gap (3.77 / 3.20 ms).
  - found on the way: autograd runs a CUDA backward on its own thread, outside the main thread's NVTX ranges: the
    first run profiled no cuDNN backward kernel; hooks on the node open the ranges on that thread now.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.experiments import cuda_v3_v4_ncu as base  # noqa: E402

DETAILS, RAW, TIMINGS = "triton.csv", "triton_raw.csv", "triton_timings.json"
NCU_COMMAND = base.NCU_COMMAND.replace("cuda_v3_v4", "triton")   # -o DIR/triton ... triton_ncu.py
SHAPES = {  # name -> (H, N, D, causal, with the backward); B = 1
    "lb": (16, 16384, 64, True, True),
    "d128": (16, 16384, 128, False, False),
    # FlashAttention's grid at N=4096, causal, as one batch (B*H = 4*32 and 4*16 heads): the forward's largest gap
    # to cuDNN (0.86x at D=64, 0.91x at D=128, results/h200/grid_1203/), and the backward with it (fwd+bwd 0.85x
    # and 0.80x there; D=128 has no Gluon dK/dV kernel) (--shapes c4k64,c4k128)
    "c4k64": (128, 4096, 64, True, True),
    "c4k128": (64, 4096, 128, True, True),
}
DEFAULT_SHAPES = "lb,d128"
WHAT = ("ncu of step 05's forward and step 06's backward (Triton) against SDPA's cuDNN forward and backward, bf16: "
        "the CS336 leaderboard shape (B=1, H=16, N=16384, D=64, causal), forward and backward, and B=1, H=16, "
        "N=16384, D=128, not causal, forward only (or, with --shapes c4k64,c4k128, the forward and backward at N=4096, "
        "causal, D=64 and 128, B*H 128 and 64); written by bench/experiments/triton_ncu.py --summarize from "
        f"{DETAILS} (--page details) and {RAW} (--page raw) of one report")


NVTX_ON_AUTOGRAD_THREAD = False   # set while the sides run inside "measure" (main)


def flops(H, N, D, causal, mode):
    f = 4 * H * N * N * D / (2 if causal else 1)
    return f if mode == "fwd" else 2.5 * f


def side_tag(shape):
    """What a shape's side names carry after the side: its D (the summary reads it), the mask, and N where it is not
    16384 ('D=64 causal', 'D=64 causal N=4096')."""
    _, N, D, causal, _ = SHAPES[shape]
    return f"D={D} {'causal' if causal else 'full'}" + ("" if N == 16384 else f" N={N}")


def sides(s05, s06, shape):
    """side name -> (a call, its FLOPs) for one shape; the names carry D= (the summary reads it)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    H, N, D, causal, bwd = SHAPES[shape]
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    tag = side_tag(shape)
    out = {f"s05-fwd {tag}": (lambda: s05.attention_with_lse(q, k, v, is_causal=causal), flops(H, N, D, causal, "fwd"))}

    def cudnn_fwd():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    out[f"cudnn-fwd {tag}"] = (cudnn_fwd, flops(H, N, D, causal, "fwd"))
    if bwd:
        o, lse = s06.attention_with_lse(q, k, v, is_causal=causal)
        do = torch.randn_like(q)
        scale = D ** -0.5
        out[f"s06-bwd {tag}"] = (lambda: s06.backward(q, k, v, o, lse, do, causal, scale),
                                 flops(H, N, D, causal, "bwd"))
        qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            og = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
        # autograd runs a CUDA backward on its own thread, outside the main thread's NVTX ranges (the 22:10 run
        # profiled no cuDNN backward kernel): the node's hooks, which run on that thread, open and close them there
        name = f"cudnn-bwd {tag}"
        def push(*_):                      # a hook's return value would replace the gradients: return None
            if NVTX_ON_AUTOGRAD_THREAD:
                torch.cuda.nvtx.range_push("measure")
                torch.cuda.nvtx.range_push(name)

        def pop(*_):
            if NVTX_ON_AUTOGRAD_THREAD:
                torch.cuda.nvtx.range_pop()
                torch.cuda.nvtx.range_pop()
        og.grad_fn.register_prehook(push)
        og.grad_fn.register_hook(pop)

        def cudnn_bwd():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.autograd.grad(og, (qg, kg, vg), do, retain_graph=True)
        out[f"cudnn-bwd {tag}"] = (cudnn_bwd, flops(H, N, D, causal, "bwd"))
    return out


def summarize(folder: Path) -> dict:
    return base.summarize(folder, DETAILS, RAW, TIMINGS, WHAT, NCU_COMMAND)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="time each side with do_bench instead of the NVTX range")
    ap.add_argument("--summarize", type=Path, default=None, metavar="DIR",
                    help=f"read DIR/{DETAILS} and DIR/{RAW} (ncu's CSV pages), write DIR/summary.json; no GPU")
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help=f"comma-separated, of {', '.join(SHAPES)} "
                    f"(default {DEFAULT_SHAPES})")
    args = ap.parse_args(argv)
    shapes = args.shapes.split(",")
    if unknown := [x for x in shapes if x not in SHAPES]:
        ap.error(f"--shapes: unknown {unknown}; known: {', '.join(SHAPES)}")
    if args.summarize is not None:
        for k in summarize(args.summarize)["kernels"]:
            print(f"{k['side']:24s} {k['kernel'][:40]:40s} {k['duration_ms']:6.3f} ms  tensor pipe "
                  f"{k['tensor_pipe_active_pct']:5.1f}%  xu {k['xu_pipe_pct']:4.1f}%  issue {k['issue_slots_busy_pct']}%  "
                  f"warps/SM {k['warps_per_sm']}  regs {k['registers_per_thread']}  "
                  f"top: " + ", ".join(f"{x} {v:.2f}" for x, v, _ in k["top_stalls"][:3]))
        print(f"wrote {args.summarize / 'summary.json'}")
        return 0
    import torch

    from attnlib.loader import load_step
    from bench.core import machine_info

    s05, s06 = load_step(5, "solutions"), load_step(6, "solutions")
    runs = {}
    for shape in shapes:
        runs.update(sides(s05, s06, shape))
    with torch.no_grad():
        for fn, _ in runs.values():              # warm-up: Triton's compile, cuDNN's plan
            for _ in range(3):
                fn()
    torch.cuda.synchronize()
    if args.out is None:
        global NVTX_ON_AUTOGRAD_THREAD
        NVTX_ON_AUTOGRAD_THREAD = True
        torch.cuda.nvtx.range_push("measure")
        with torch.no_grad():
            for name, (fn, _) in runs.items():
                torch.cuda.nvtx.range_push(name)
                fn()
                torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        NVTX_ON_AUTOGRAD_THREAD = False
        return 0
    import triton
    res = {"machine": machine_info(), "N": "per side (its name; 16384 where it names none)", "dtype": "bfloat16",
           "causal": "per side (its name)", "shapes": {x: SHAPES[x] for x in shapes}, "rows": []}
    with torch.no_grad():
        for name, (fn, fl) in runs.items():
            ms = float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))
            res["rows"].append({"side": name, "ms": round(ms, 4), "tflops": round(fl / ms / 1e9, 1)})
            print(res["rows"][-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / TIMINGS).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
