"""bench/experiments/cuda_v5.py: step 07's warp-specialized v5 forward (TMA + mbarrier ring, a producer
warpgroup, two or three consumer warpgroups, setmaxnreg, optional ping-pong), now the course's forward
version 5 (solutions/csrc/step07_fwd_v5.cu), which the experiment times and compiles.

On a CPU (skipped without nvcc / cuobjdump): the SOLUTION's solutions/csrc/step07_fwd_v5.cu -- never
steps/, whose producer loop is a student stub, whatever --impl says -- compiles for sm_90a with the
flags step07_cuda.build() uses, and its machine code is what its header claims -- every instance spills nothing,
loads by TMA (UTMALDG), multiplies on HGMMA (no HMMA, no cp.async), holds the setmaxnreg pair (producer
24, consumers 240, or 160 with three), and ptxas did not serialize its wgmma (no C7515). On a GPU (an sm_90a one): v5's O
and LSE against the float64 reference at two small shapes, through step07_cuda's version 5.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from bench.experiments import cuda_v5
from session_once import once_per_session

pytestmark = pytest.mark.step07

REPO = Path(__file__).resolve().parents[1]


def test_compile_report_reads_the_course_solution():
    """The experiment keeps no kernel of its own, and its report is of the written solution."""
    assert cuda_v5.V5_SOURCE == REPO / "solutions" / "csrc" / "step07_fwd_v5.cu"
    assert cuda_v5.STEP07_DIR == REPO / "solutions"
    text = cuda_v5.V5_SOURCE.read_text()
    assert not any(ln.strip().startswith("STUDENT_TODO;") for ln in text.splitlines()), \
        "solutions/csrc/step07_fwd_v5.cu holds a STUDENT_TODO: the report would measure a stub"
    assert not (REPO / "bench" / "experiments" / "csrc" / "step07_fwd_v5.cu").exists(), \
        "a diverging copy of v5 is back in bench/experiments/csrc"
    assert set(cuda_v5.CONFIGS) == set(cuda_v5._step07().V5_CONFIGS[64]) == set(cuda_v5._step07().V5_CONFIGS[128])


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    if shutil.which("nvcc") is None or cuda_v5.cuobjdump() is None:
        pytest.skip("needs nvcc and cuobjdump (the CUDA toolkit, or Triton's copy) to read v5's machine code")
    rep = once_per_session(tmp_path_factory, "cuda_v5-report", cuda_v5.compile_report)   # not once a worker
    assert Path(rep["source"]) == cuda_v5.V5_SOURCE
    return rep


def test_v5_compiles_to_every_instance_without_spills(report):
    kernels = report["kernels"]
    n = 2 * 2 * len(cuda_v5.CONFIGS)
    assert len(kernels) == n, f"expected {n} instances (2 dtypes x 2 head dims x the configs), got {sorted(kernels)}"
    bad = {k: v for k, v in kernels.items() if v.get("stack") != 0 or v.get("spill_stores") or v.get("spill_loads")}
    assert not bad, f"v5 spills or uses stack: {bad}"


def test_v5_is_tma_and_wgmma(report):
    for name, k in report["kernels"].items():
        d = 128 if "D=128" in name else 64
        assert k["UTMALDG"] == 3 * (d // 64), f"{name}: {k['UTMALDG']} TMA loads (UTMALDG), want Q, K, V x D/64"
        assert k["HGMMA"] > 0 and k["HMMA"] == 0, f"{name}: HGMMA {k['HGMMA']}, HMMA {k['HMMA']}"
        assert k["LDGSTS"] == 0, f"{name}: still loads with cp.async (LDGSTS)"
        # the one after the mbarrier init; ping-pong adds its two named-barrier waits (loop, last P V)
        want = 3 if "pingpong" in name else 1
        assert k["BAR.SYNC"] == want, f"{name}: {k['BAR.SYNC']} BAR.SYNC, want {want}"


def test_v5_setmaxnreg_roles(report):
    for name, k in report["kernels"].items():
        regs = cuda_v5.CONSUMER_REGS[3 if "consumers=3" in name else 2]
        assert k["setmaxnreg"] == [cuda_v5.PRODUCER_REGS, regs], f"{name}: {k['setmaxnreg']}"
        assert k["max_reg_consumers"] < regs, f"{name}: the consumers' code uses R{k['max_reg_consumers']}"
        assert k["max_reg_producer"] < cuda_v5.PRODUCER_REGS, f"{name}: the producer's code uses R{k['max_reg_producer']}"


def test_v5_wgmma_not_serialized(report):
    assert not report["c75xx"], "ptxas serialized v5's wgmma:\n" + "\n".join(report["c75xx"])
    for name, k in report["kernels"].items():
        # one wait an iteration (P V_{j-1} and Q K_j^T together) and one after the loop
        assert k["WARPGROUP.DEPBAR"] == 2, f"{name}: {k['WARPGROUP.DEPBAR']} wgmma waits"


gpu_sm90 = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                              reason="needs an sm_90a GPU (H100/H200)")


@gpu_sm90
@pytest.mark.parametrize("config", cuda_v5.CONFIGS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq,nk", [(77, 77), (300, 200)])
def test_v5_matches_reference(nq, nk, causal, D, dtype, config):
    from attnlib import make_qkv
    q, k, v = make_qkv(2, 3, nq, nk, D=D, dtype=dtype, device="cuda", seed=nq + D)
    cuda_v5.check_case(q, k, v, causal, config)
