"""bench/experiments/cuda_bwd_wgmma.py: step 07's dK/dV backward kernel on Hopper's wgmma, now the course's
backward v3 (solutions/csrc/step07_bwd_wgmma.cu), which the experiment times and compiles.

On a CPU (skipped without nvcc / cuobjdump): the SOLUTION's kernel file -- never steps/, whose two RS
products are a student stub, whatever --impl says -- compiles for sm_90a with step07_cuda.build()'s flags
and its machine code is what its header claims -- no spills, no stack, the products on HGMMA (D/16 for S^T
and for dP^T, 64/16 for dV and for dK), no HMMA, two wgmma waits (WARPGROUP.DEPBAR) and no C75xx
serialization. One nvcc run of the 8 instances (f16/bf16 x D 64/128 x configs 0/1), about 4 s; it is the
only sm_90a compile of this kernel on the CPU (test_step07_cuda's compile test builds every .cu for plain
sm_90, where the body is empty). On an sm_90a GPU: dK, dV (both configs) and backward v3's dQ, dK, dV
against the float64 reference at two small shapes.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from bench.experiments import cuda_bwd_wgmma as bw
from session_once import once_per_session

pytestmark = pytest.mark.step07

REPO = Path(__file__).resolve().parents[1]


def test_experiment_reads_the_course_solution():
    """The experiment keeps no kernel of its own, and its report is of the written solution."""
    assert bw.KERNEL_SOURCE == REPO / "solutions" / "csrc" / "step07_bwd_wgmma.cu"
    text = bw.KERNEL_SOURCE.read_text()
    assert not any(ln.strip().startswith("STUDENT_TODO;") for ln in text.splitlines()), \
        "solutions/csrc/step07_bwd_wgmma.cu holds a STUDENT_TODO: the report would measure a stub"
    assert not (REPO / "bench" / "experiments" / "csrc" / "step07_bwd_wgmma.cu").exists(), \
        "a diverging copy of the wgmma dK/dV kernel is back in bench/experiments/csrc"
    assert bw._step07().BWD_FILES[bw.BWD_VERSION] == bw.KERNEL_SOURCE.name


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    if shutil.which("nvcc") is None or bw.cuobjdump() is None:
        pytest.skip("needs nvcc and cuobjdump (the CUDA toolkit, or Triton's copy) to read the kernel's machine code")
    rep = once_per_session(tmp_path_factory, "cuda_bwd_wgmma-report", bw.compile_report)   # not once a worker
    assert Path(rep["source"]) == bw.KERNEL_SOURCE
    return rep


def test_every_instance_compiles_without_spills(report):
    kernels = report["kernels"]
    assert sorted(kernels) == sorted(f"{t} D={d} warpgroups={w}" for t in ("f16", "bf16") for d in (64, 128)
                                     for w in (1, 2)), sorted(kernels)
    bad = {k: v for k, v in kernels.items()
           if v.get("stack") != 0 or v.get("spill_stores") or v.get("spill_loads") or v.get("LDL") or v.get("STL")}
    assert not bad, f"the wgmma dK/dV kernel spills or uses stack: {bad}"


def test_products_on_wgmma(report):
    for name, k in report["kernels"].items():
        d = 128 if "D=128" in name else 64
        want = 2 * (d // 16) + 2 * (64 // 16)        # S^T, dP^T: D/16 each; dV, dK: BM/16 each
        assert k["HGMMA"] == want, f"{name}: {k['HGMMA']} HGMMA, want {want}"
        assert k["HMMA"] == 0, f"{name}: {k['HMMA']} HMMA (mma.sync) left"


def test_wgmma_not_serialized(report):
    assert not report["c75xx"], "ptxas serialized the wgmma:\n" + "\n".join(report["c75xx"])
    for name, k in report["kernels"].items():
        # one wait for S^T and dP^T, one for dV and dK
        assert k["WARPGROUP.DEPBAR"] == 2, f"{name}: {k['WARPGROUP.DEPBAR']} wgmma waits"


gpu_sm90 = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                              reason="needs an sm_90a GPU (H100/H200)")


@gpu_sm90
@pytest.mark.parametrize("config", bw.CONFIGS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq,nk", [(77, 77), (300, 200)])
def test_dkdv_matches_reference(nq, nk, causal, D, dtype, config):
    from attnlib import make_qkv
    q, k, v = make_qkv(2, 3, nq, nk, D=D, dtype=dtype, device="cuda", seed=nq + D)
    bw.check_case(q, k, v, causal, config)
