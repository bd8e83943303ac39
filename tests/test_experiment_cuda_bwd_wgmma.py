"""bench/experiments/cuda_bwd_wgmma.py: an experiment's dK/dV backward kernel on Hopper's wgmma
(bench/experiments/csrc/step07_bwd_wgmma.cu; not course code).

On a CPU (skipped without nvcc / cuobjdump): the kernel compiles for sm_90a with step07_cuda.build()'s
flags and its machine code is what its header claims -- no spills, no stack, the products on HGMMA
(D/16 for S^T and for dP^T, 64/16 for dV and for dK), no HMMA, two wgmma waits an iteration's worth
(WARPGROUP.DEPBAR) and no C75xx serialization. Kept cheap (the suite's budget): bf16 only and v2's
kernels left out, 4 instances, one nvcc run of about 2-4 s. On an sm_90a GPU: dK, dV against the float64
reference at two small shapes.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from bench.experiments import cuda_bwd_wgmma as bw

pytestmark = pytest.mark.step07


@pytest.fixture(scope="module")
def report():
    if shutil.which("nvcc") is None or bw.cuobjdump() is None:
        pytest.skip("needs nvcc and cuobjdump (the CUDA toolkit, or Triton's copy) to read the kernel's machine code")
    return bw.compile_report(bf16_only=True)


def test_every_instance_compiles_without_spills(report):
    kernels = report["kernels"]
    assert sorted(kernels) == sorted(f"bf16 D={d} warpgroups={w}" for d in (64, 128) for w in (1, 2)), sorted(kernels)
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
