"""bench/experiments/triton_ncu.py: ncu of steps 05/06 against cuDNN. On a CPU: its command names its own files,
every side's name carries the D the summary reads, and its summary reads a stand-in report (two kernels of one
side, the figures computed from the metrics the way cuda_v3_v4_ncu.py defines them)."""

from __future__ import annotations

import csv
import json

import pytest

from bench.experiments import cuda_v3_v4_ncu as base
from bench.experiments import triton_ncu

pytestmark = pytest.mark.step06


def test_command_and_files_are_its_own():
    assert "-o DIR/triton " in triton_ncu.NCU_COMMAND and "bench/experiments/triton_ncu.py" in triton_ncu.NCU_COMMAND
    assert (triton_ncu.DETAILS, triton_ncu.RAW, triton_ncu.TIMINGS) == ("triton.csv", "triton_raw.csv",
                                                                        "triton_timings.json")
    assert triton_ncu.flops(16, 16384, 64, True, "bwd") == 2.5 * 2 * 16 * 16384**2 * 64


def _stand_in(folder, sides):
    """A raw page, a details page and timings for kernels [(id, side, kernel name, duration ms, tensor %)]."""
    reasons = ["long_scoreboard", "wait", "math_pipe_throttle", "selected"]
    plain = ["gpu__time_duration.sum", "gpc__cycles_elapsed.avg.per_second",
             "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
             "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
             "sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active",
             "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active",
             "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_elapsed",
             "sm__pipe_tma_cycles_active.avg.pct_of_peak_sustained_elapsed",
             "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_elapsed",
             "sm__inst_executed_pipe_uniform.avg.pct_of_peak_sustained_elapsed",
             "sass__inst_executed_register_spilling", "sm__inst_issued.sum.per_cycle_active", "sm__cycles_active.avg",
             "sm__warps_active.avg.per_cycle_active", "launch__registers_per_thread", "launch__shared_mem_per_block",
             "smsp__average_warp_latency_per_inst_issued.ratio",
             *[f"launch__occupancy_limit_{x}" for x in ("registers", "shared_mem", "warps", "barriers", "blocks")],
             *[f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio" for r in reasons]]
    nvtx = "thread Domain:Push/Pop_Range:PL_Type:PL_Value:CLR_Type:Color:Msg_Type:Msg"
    header = ["ID", nvtx, "Kernel Name", "Block Size", "Grid Size", "device__attribute_display_name",
              "device__attribute_max_gpu_frequency_khz", *plain]
    with open(folder / triton_ncu.RAW, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerow(["" for _ in header])
        for kid, side, kernel, ms, tensor in sides:
            vals = {m: "1" for m in plain}
            vals.update({"gpu__time_duration.sum": str(ms), "gpc__cycles_elapsed.avg.per_second": "1,365,000,000",
                         "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed": str(tensor),
                         "smsp__average_warp_latency_per_inst_issued.ratio": "10",
                         "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio": "4",
                         "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio": "2",
                         "launch__occupancy_limit_registers": "4", "launch__occupancy_limit_blocks": "32"})
            w.writerow([str(kid), f"<default domain>:measure:none:<default domain>:{side}:none", kernel, "(128, 1, 1)",
                        "(16, 512, 1)", "NVIDIA H200", "1,980,000", *[vals[m] for m in plain]])
    with open(folder / triton_ncu.DETAILS, "w", newline="") as f:
        w = csv.DictWriter(f, ["ID", "Metric Name", "Metric Value"])
        w.writeheader()
        for kid, *_ in sides:
            for name, v in [("Issue Slots Busy", "40"), ("Theoretical Occupancy", "25"), ("Achieved Occupancy", "20")]:
                w.writerow({"ID": str(kid), "Metric Name": name, "Metric Value": v})
    (folder / triton_ncu.TIMINGS).write_text(json.dumps({
        "machine": {"gpu": "NVIDIA H200"}, "N": 16384, "dtype": "bfloat16", "causal": "per side (its name)",
        "rows": [{"side": "s06-bwd D=64 causal", "ms": 3.7, "tflops": 370.0}]}))


def test_every_shape_names_its_sides_apart():
    """Every shape's sides carry the D the summary reads, and no two shapes give a side the same name (the N=4096
    shapes name their N); an unknown --shapes entry is refused."""
    tags = [triton_ncu.side_tag(name) for name in triton_ncu.SHAPES]
    assert len(set(tags)) == len(tags), f"two shapes share side names: {tags}"
    for name, tag in zip(triton_ncu.SHAPES, tags):
        assert tag.startswith(f"D={triton_ncu.SHAPES[name][2]} "), tag
    with pytest.raises(SystemExit):
        triton_ncu.main(["--shapes", "lb,nope", "--summarize", "x"])


def test_summary_of_a_stand_in_report(tmp_path):
    _stand_in(tmp_path, [(0, "s06-bwd D=64 causal", "_bwd_dkdv_kernel", 2.5, 40.0),
                         (1, "s06-bwd D=64 causal", "_bwd_dq_kernel", 1.5, 60.0),
                         (2, "cudnn-fwd D=128 full", "cudnn_kernel", 2.0, 80.0)])
    s = triton_ncu.summarize(tmp_path)
    assert s["what"] == triton_ncu.WHAT and s["ncu_command"] == triton_ncu.NCU_COMMAND
    assert json.loads((tmp_path / "summary.json").read_text())["kernels"] == s["kernels"]
    k0, k1, k2 = s["kernels"]
    assert (k0["side"], k0["impl"], k0["D"], k2["impl"], k2["D"]) == ("s06-bwd D=64 causal", "s06", 64, "cudnn", 128)
    assert k0["tensor_busy_ms"] == 1.0 and k1["tensor_busy_ms"] == 0.9
    assert k0["do_bench_ms"] == k1["do_bench_ms"] == 3.7 and k2["do_bench_ms"] is None
    assert k0["top_stalls"][0] == ["wait", 4.0, 0.4] and k0["ctas_per_sm"] == 1
    assert base.summarize is not triton_ncu.summarize
