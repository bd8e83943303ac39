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
    ncu --import DIR/cuda_v3_v4.ncu-rep --page raw --csv > DIR/cuda_v3_v4_raw.csv

(Tar the folder before it leaves a lent machine: only a few loose files come back.) Without ncu,
``--out DIR`` times each side with do_bench and writes DIR/cuda_v3_v4_timings.json (under a minute), a check
that the sides run before profiling them. ``--summarize DIR`` (CPU, no torch) reads the two CSV pages and the
timings and writes DIR/summary.json: per kernel, the figures below, each named by its ncu metric.

Answer (one H200, 2026-12-01 ~17:08 UTC, torch 2.11.0+cu130, CUDA 13.0; results/h200/step07_v4/ncu/, its
README has the table). No --clock-control was given, so ncu fixed the SM clock (1.34-1.37 GHz): durations under
ncu are 1.24-1.33x do_bench's (cuDNN at D=128 1.08x); the figures are shares of cycles, times compared only
within the profile. Tensor pipe active (sm__pipe_tensor_cycles_active, % of elapsed cycles), D=64 / D=128:
v3 48.7 / 52.3%, v4 128x64 43.2 / 45.1%, v4 128x128 34.5 / 43.6%, cuDNN 51.2 / 75.1%. v3 runs no wgmma (gmma
0%, all on hmma: mma.sync); v4 and cuDNN run wgmma (their hmma counter is exactly half the gmma one). Times the
duration, every wgmma kernel keeps the tensor pipe busy 2.98-3.04 ms, v3 4.46-4.47 ms for the same FLOPs: v4
gives the tensor cores the same work as cuDNN and leaves them idle 3.92 / 3.64 ms against cuDNN's 2.85 / 1.00.
The XU pipe (exp2 runs there) is as busy in every kernel, 3.1 ms at D=64 (more than the products) and 1.55 ms at D=128;
cuDNN's tensor and XU busy times add to more than its duration (at least 0.23 / 0.55 ms overlapped), v4's to
less. Top stalls, cycles per issued instruction (share of all warp cycles): v3 wait 1.01 (25%) / 1.65 (35%);
v4 128x64 barrier 1.22 (19%) and not selected 1.21 (19%) at D=64, barrier 1.49 (30%) at D=128, then wait
1.08 / 0.90; cuDNN wait 0.74 (18%) and barrier 0.71 (17%) at D=64, barrier 1.32 (26%) at D=128; the gmma stall
0.22 / 0.09 in v4. v4 issues 1.34 / 1.52x cuDNN's instructions, MIO throttle 0.55 / 0.30 against 0.04 / 0.02,
LSU 12.2 / 7.8% against 1.6 / 1.2%, and only cuDNN's TMA pipe is active. Occupancy is not it: at D=64 v4 has
16 warps an SM (111 registers, 2 CTAs) against cuDNN's 9. So what v4 leaves to cuDNN is overlap (softmax under
the next wgmma, two consumer warpgroups) and TMA copies from a producer warp; not measured yet. Open: where v4's
warps wait, line by line (ncu's source view, --set full).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
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


# --summarize: the two CSV exports of the report -> summary.json (no GPU, no torch).
DETAILS, RAW, TIMINGS = "cuda_v3_v4.csv", "cuda_v3_v4_raw.csv", "cuda_v3_v4_timings.json"
NCU_COMMAND = ('ncu --nvtx --nvtx-include "measure/" --target-processes all --section SpeedOfLight '
               "--section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats "
               "--section MemoryWorkloadAnalysis -o DIR/cuda_v3_v4 python bench/experiments/cuda_v3_v4_ncu.py")
# What each field of a kernel's entry is: the ncu metric it comes from (raw page unless it says "details").
METRICS = {
    "duration_ms": "gpu__time_duration.sum (under ncu, at the clocks ncu fixed: see sm_clock_ghz)",
    "sm_clock_ghz": "gpc__cycles_elapsed.avg.per_second",
    "tensor_pipe_active_pct": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed: share of the kernel's "
                              "cycles the tensor pipe is busy, averaged over the SMs (mma.sync and wgmma alike)",
    "tensor_pipe_active_pct_of_active_cycles": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "tensor_busy_ms": "tensor_pipe_active_pct / 100 x duration_ms: the tensor pipe's busy time, the work it was given",
    "gmma_inst_pct": "sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active (wgmma instructions)",
    "hmma_inst_pct": "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active",
    "xu_pipe_pct": "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_elapsed (special functions, exp2 among them)",
    "tma_pipe_pct": "sm__pipe_tma_cycles_active.avg.pct_of_peak_sustained_elapsed",
    "lsu_pipe_pct": "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_elapsed (loads, stores, cp.async, "
                    "shuffles, CTA barriers)",
    "uniform_pipe_pct": "sm__inst_executed_pipe_uniform.avg.pct_of_peak_sustained_elapsed",
    "spill_instructions": "sass__inst_executed_register_spilling (warp-level instructions to or from local memory)",
    "issue_slots_busy_pct": "details: Issue Slots Busy (sm__inst_issued.sum.pct_of_peak_sustained_elapsed)",
    "instructions_issued_e9": "sm__inst_issued.sum.per_cycle_active x sm__cycles_active.avg, in billions",
    "warps_per_sm": "sm__warps_active.avg.per_cycle_active",
    "theoretical_occupancy_pct": "details: Theoretical Occupancy",
    "achieved_occupancy_pct": "details: Achieved Occupancy",
    "ctas_per_sm": "min of launch__occupancy_limit_{registers,shared_mem,warps,barriers,blocks}",
    "registers_per_thread": "launch__registers_per_thread (at launch; a kernel using setmaxnreg changes it later)",
    "shared_mem_per_block_kb": "launch__shared_mem_per_block (dynamic + static + the driver's 1 KB)",
    "warp_cycles_per_issued_instruction": "smsp__average_warp_latency_per_inst_issued.ratio: the sum of the stalls",
    "stalls": "smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio: warp-cycles spent in each state "
              "per issued instruction; 'selected' is the issuing cycle itself (1 by definition)",
    "top_stalls": "the five largest stalls other than 'selected': [reason, cycles per issued instruction, share of "
                  "warp_cycles_per_issued_instruction]",
}


def _num(text):
    """ncu's CSV numbers: '12,544,090' -> 12544090.0; 'no data' or '' -> None."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def _side(nvtx):
    """The inner NVTX range of a kernel ('v4-128x64 D=64'), from ncu's push/pop range column."""
    names = re.findall(r"<default domain>:([^:]+):none", nvtx)
    return names[-1] if names else None


def _tiles(side, kernel):
    """Query rows x keys of a tile, from step 07's config template; cuDNN's as its kernel name writes it."""
    if mm := re.search(r"V3Config<(\d+), (\d+), (\d+), (\d+)>", kernel):
        _, bn, mt, warps = map(int, mm.groups())
        return f"{warps * 16 * mt}x{bn}"
    if mm := re.search(r"V4Config<(\d+), (\d+)>", kernel):
        return f"128x{mm.group(2)}"
    mm = re.search(r"_(\d+x\d+x\d+)_\d+x\d+x\d+_cga", kernel)
    return f"{mm.group(1)} (kernel name)" if mm else None


WHAT = ("ncu of step 07's forward v3 (mma.sync), v4 (wgmma; 128x64 tiles = config 1, the default, and "
        "128x128 = config 0) and SDPA's cuDNN forward, bf16, not causal, B=1, H=2048/D, N=16384; "
        "written by bench/experiments/cuda_v3_v4_ncu.py --summarize from "
        f"{DETAILS} (--page details) and {RAW} (--page raw) of one report")


def summarize(folder: Path, details_csv=DETAILS, raw_csv=RAW, timings_json=TIMINGS, what=WHAT,
              ncu_command=NCU_COMMAND) -> dict:
    """Read the details and raw CSV pages of the ncu report (and the do_bench timings beside them) in folder,
    write folder/summary.json, return it. (bench/experiments/triton_ncu.py passes its own file names.)"""
    folder = Path(folder)
    with open(folder / details_csv, newline="") as f:
        details = list(csv.DictReader(f))
    with open(folder / raw_csv, newline="") as f:
        raw = list(csv.reader(f))
    header, rows = raw[0], raw[2:]               # raw[1]: the units
    timings = json.loads((folder / timings_json).read_text())
    timed = {r["side"]: r for r in timings["rows"]}

    def det(kid, name):
        vals = [r["Metric Value"] for r in details if r["ID"] == kid and r["Metric Name"] == name]
        return _num(vals[0]) if vals else None

    reasons = sorted({m.group(1) for h in header
                      if (m := re.fullmatch(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio", h))})
    kernels = []
    for row in rows:
        r = dict(zip(header, row))
        g = lambda name: _num(r[name])            # noqa: E731
        kid, side = r["ID"], _side(r["thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg"])
        D = int(re.search(r"D=(\d+)", side).group(1))
        duration = g("gpu__time_duration.sum")
        tensor = g("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed")
        stalls = {x: round(g(f"smsp__average_warps_issue_stalled_{x}_per_issue_active.ratio"), 3) for x in reasons}
        cpi = g("smsp__average_warp_latency_per_inst_issued.ratio")
        top = sorted(((x, v) for x, v in stalls.items() if x != "selected"), key=lambda t: -t[1])[:5]
        limits = ["registers", "shared_mem", "warps", "barriers", "blocks"]
        t = timed.get(side, {})
        kernels.append({
            "id": int(kid), "side": side, "impl": side.split()[0].split("-")[0], "D": D,
            "tiles": _tiles(side, r["Kernel Name"]), "kernel": r["Kernel Name"],
            "block": r["Block Size"], "grid": r["Grid Size"],
            "duration_ms": round(duration, 3), "do_bench_ms": t.get("ms"), "do_bench_tflops": t.get("tflops"),
            "sm_clock_ghz": round(g("gpc__cycles_elapsed.avg.per_second"), 3),
            "tensor_pipe_active_pct": round(tensor, 1),
            "tensor_pipe_active_pct_of_active_cycles":
                round(g("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"), 1),
            "tensor_busy_ms": round(tensor / 100 * duration, 3),
            "gmma_inst_pct": round(g("sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active"), 2),
            "hmma_inst_pct": round(g("sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active"), 2),
            "xu_pipe_pct": round(g("sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_elapsed"), 1),
            "tma_pipe_pct": round(g("sm__pipe_tma_cycles_active.avg.pct_of_peak_sustained_elapsed"), 2),
            "lsu_pipe_pct": round(g("sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_elapsed"), 1),
            "uniform_pipe_pct": round(g("sm__inst_executed_pipe_uniform.avg.pct_of_peak_sustained_elapsed"), 1),
            "spill_instructions": int(g("sass__inst_executed_register_spilling")),
            "issue_slots_busy_pct": det(kid, "Issue Slots Busy"),
            "instructions_issued_e9": round(g("sm__inst_issued.sum.per_cycle_active")
                                            * g("sm__cycles_active.avg") / 1e9, 3),
            "warps_per_sm": round(g("sm__warps_active.avg.per_cycle_active"), 2),
            "theoretical_occupancy_pct": det(kid, "Theoretical Occupancy"),
            "achieved_occupancy_pct": det(kid, "Achieved Occupancy"),
            "ctas_per_sm": int(min(g(f"launch__occupancy_limit_{x}") for x in limits)),
            "registers_per_thread": int(g("launch__registers_per_thread")),
            "shared_mem_per_block_kb": round(g("launch__shared_mem_per_block"), 2),
            "warp_cycles_per_issued_instruction": round(cpi, 3),
            "stalls": dict(sorted(stalls.items(), key=lambda t: -t[1])),
            "top_stalls": [[x, v, round(v / cpi, 3)] for x, v in top],
        })
    clocks = [k["sm_clock_ghz"] for k in kernels]
    m = dict(timings["machine"])
    m["gpu"] = rows[0][header.index("device__attribute_display_name")]
    summary = {
        "what": what,
        "machine": m,
        "date_note": "the do_bench timings' date; the ncu report was taken in the same session on the same GPU",
        "ncu_command": ncu_command,
        "clock_note": (f"no --clock-control was given, so ncu fixed the clocks (its default): SM clock "
                       f"{min(clocks):.2f}-{max(clocks):.2f} GHz under ncu (the GPU's maximum is "
                       f"{_num(rows[0][header.index('device__attribute_max_gpu_frequency_khz')]) / 1e6:.2f}); "
                       "duration_ms is longer than do_bench_ms, timed with the clocks free"),
        "N": timings["N"], "dtype": timings["dtype"], "causal": timings["causal"],
        "metrics": METRICS,
        "kernels": kernels,
    }
    (folder / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="time each side with do_bench instead of the NVTX range")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--summarize", type=Path, default=None, metavar="DIR",
                    help=f"read DIR/{DETAILS} and DIR/{RAW} (ncu's CSV pages), write DIR/summary.json; no GPU")
    args = ap.parse_args(argv)
    if args.summarize is not None:
        for k in summarize(args.summarize)["kernels"]:
            print(f"{k['side']:18s} {k['duration_ms']:6.2f} ms  tensor pipe {k['tensor_pipe_active_pct']:5.1f}%  "
                  f"busy {k['tensor_busy_ms']:.2f} ms  gmma {k['gmma_inst_pct']:4.2f}% "
                  f"hmma {k['hmma_inst_pct']:5.2f}%  "
                  f"issue {k['issue_slots_busy_pct']:4.1f}%  occ {k['achieved_occupancy_pct']:5.2f}/"
                  f"{k['theoretical_occupancy_pct']:5.2f}%  regs {k['registers_per_thread']}  "
                  f"top: " + ", ".join(f"{x} {v:.2f}" for x, v, _ in k["top_stalls"][:3]))
        print(f"wrote {args.summarize / 'summary.json'}")
        return 0
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
