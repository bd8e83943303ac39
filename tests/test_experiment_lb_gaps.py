"""bench/experiments/lb_gaps.py's trace reader on a synthetic trace: a gap the host caused (the next kernel's
launch ended after the previous kernel ended) is told apart from a launch-boundary gap, kernels launched outside
a step (do_bench's cache clear) are left out, and a kernel whose launch the trace lacks inherits its step."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.experiments.lb_gaps import analyze  # noqa: E402

pytestmark = pytest.mark.step06


def X(cat, name, ts, dur, corr=None):
    e = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}
    if corr is not None:
        e["args"] = {"correlation": corr}
    return e


def test_gaps_split_by_cause():
    ev = [
        X("cuda_runtime", "cudaLaunchKernel", 0, 2, corr=1),          # the cache clear, outside the step
        X("kernel", "FillFunctor<int>", 5, 10, corr=1),
        X("user_annotation", "harness_step0", 20, 200),
        X("cuda_driver", "cuLaunchKernelEx", 21, 3, corr=2),
        X("kernel", "_attn_fwd_kernel", 30, 50, corr=2),              # ends at 80
        X("cuda_driver", "cuLaunchKernelEx", 40, 3, corr=3),           # launched long before: a boundary gap
        X("kernel", "_bwd_preprocess", 82, 8, corr=3),                # gap 2, not the host's; ends at 90
        X("cuda_driver", "cuLaunchKernelEx", 95, 5, corr=4),           # launch ends at 100 > 90: host-bound
        X("kernel", "_bwd_dkdv_kernel", 103, 40, corr=4),             # gap 13, the host's; ends at 143
        X("kernel", "_bwd_dq_kernel", 150, 20, corr=99),              # launch not in the trace: gap 7, unattributed
    ]
    a = analyze({"traceEvents": ev})
    assert a["steps"] == 1
    m = a["mean"]
    assert m["kernels"] == 4, "the cache clear (launched outside the step) must not count"
    assert m["busy_us"] == 50 + 8 + 40 + 20
    assert m["span_us"] == 170 - 30
    assert (m["host_gap_us"], m["other_gap_us"], m["unattributed_gap_us"]) == (13, 2, 7)
    assert a["boundaries"]["_bwd_preprocess -> _bwd_dkdv_kernel"]["mean_host_us"] == 13
