"""bench/ring_gpu.py's reading of a profiler trace: what the two-GPU run will report as overlap."""

import json

from bench.ring_gpu import overlap_from_trace


def test_overlap_counts_only_nccl_time_under_no_compute_kernel(tmp_path):
    events = [
        {"cat": "kernel", "name": "_attn_fwd_kernel", "ts": 0, "dur": 100},
        {"cat": "kernel", "name": "ncclDevKernel_SendRecv(a)", "ts": 10, "dur": 50},   # under the forward
        {"cat": "kernel", "name": "_bwd_dkdv_kernel", "ts": 120, "dur": 30},
        {"cat": "kernel", "name": "ncclDevKernel_SendRecv(b)", "ts": 140, "dur": 40},  # 10 us under, 30 alone
        {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 500},                    # not a GPU kernel
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    r = overlap_from_trace(path)
    got = {k: round(r[k], 9) for k in ("span_ms", "compute_busy_ms", "nccl_kernel_ms", "nccl_exposed_ms")}
    assert got == {"span_ms": 0.18, "compute_busy_ms": 0.13, "nccl_kernel_ms": 0.09, "nccl_exposed_ms": 0.03}, got


def test_a_cpu_trace_says_it_has_no_kernels(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": [{"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5}]}))
    assert overlap_from_trace(path)["kernels"] == 0
