"""bench/experiments/cuda_v6.py: step 07 forward v6, v5 plus the softmax overlapped with a wgmma inside each
consumer warpgroup (an experiment: bench/experiments/csrc/step07_fwd_v6.cu, which #includes the course's
solutions/csrc/step07_fwd_v5.cu).

On a CPU (skipped without nvcc / cuobjdump), one compile of the test build (-DSTEP07_V6_TEST_ONLY: bf16,
config 2 at D 64 and 128 -- FlashAttention-3's order -- and config 7 at D 64 -- the S-next order -- and v5's
config 2 at D 64 and 128 as the control; about 6 s on 2 cores): every instance
spills nothing, holds the setmaxnreg pair 24/240, ptxas did not serialize its wgmma (no C75xx), and the
exponentials sit under a product in flight in the SASS (MUFU.EX2 issued between an HGMMA group and the
WARPGROUP.DEPBAR that retires it: under P_{j-1} V_{j-1} in order 0, under Q K_{j+1}^T in order 2), where
v5's have none. On an sm_90a GPU: v6 against the float64 reference
at two small shapes.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from bench.experiments import cuda_v6

pytestmark = pytest.mark.step07


@pytest.fixture(scope="module")
def report():
    if shutil.which("nvcc") is None or cuda_v6.cuda_v5.cuobjdump() is None:
        pytest.skip("needs nvcc and cuobjdump (the CUDA toolkit, or Triton's copy) to read v6's machine code")
    return cuda_v6.compile_report(test_only=True)


def test_v6_instances_compile_without_spills(report):
    kernels = report["kernels"]
    assert set(kernels) == set(cuda_v6.TEST_INSTANCES), sorted(kernels)
    bad = {k: v for k, v in kernels.items() if v.get("stack") != 0 or v.get("spill_stores") or v.get("spill_loads")}
    assert not bad, f"v6 spills or uses stack: {bad}"
    for name, k in kernels.items():
        d = 128 if "D=128" in name else 64
        assert k["UTMALDG"] == 3 * (d // 64), f"{name}: {k['UTMALDG']} UTMALDG"
        assert k["HGMMA"] > 0 and k["HMMA"] == 0 and k["LDL"] == 0 and k["STL"] == 0, name


def test_v6_setmaxnreg_roles(report):
    for name, k in report["kernels"].items():
        assert k["setmaxnreg"] == [24, 240], f"{name}: {k['setmaxnreg']}"
        assert k["max_reg_consumers"] < 240, f"{name}: the consumers' code uses R{k['max_reg_consumers']}"
        assert k["max_reg_producer"] < 24, f"{name}: the producer's code uses R{k['max_reg_producer']}"


def test_v6_wgmma_not_serialized(report):
    assert not report["c75xx"], f"ptxas serialized wgmma: {report['c75xx']}"
    for name, k in report["kernels"].items():
        # serialized code waits after every HGMMA: as many DEPBAR as HGMMA groups at least
        assert k["WARPGROUP.DEPBAR"] < k["HGMMA"] // 2, f"{name}: {k['WARPGROUP.DEPBAR']} waits for {k['HGMMA']} HGMMA"


def test_v6_exponentials_overlap_a_wgmma(report):
    for name, k in report["kernels"].items():
        bn = 128 if "BN=128" in name else 64
        # every exponential of one S tile (BN/2 a thread) and alpha's two, while the product is in flight
        if "order=0" in name:
            assert k["max_ex2_under_pv"] >= bn // 2, f"{name}: EX2 under P V {k['ex2_under_pv']}"
        else:
            assert k["max_ex2_under_qk"] >= bn // 2, f"{name}: EX2 under Q K_(j+1)^T {k['ex2_under_qk']}"
    assert sorted(report["v5_kernels"]) == ["bf16 D=128 BN=128 stages=2 consumers=2", "bf16 D=64 BN=128 stages=2 consumers=2"]
    for name, k in report["v5_kernels"].items():   # the control: v5 waits for everything before its softmax
        assert k["max_ex2_under_qk"] == 0 and k["max_ex2_under_pv"] == 0, f"v5 {name}: {k}"


gpu_sm90 = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                              reason="needs an sm_90a GPU (H100/H200)")


@gpu_sm90
@pytest.mark.parametrize("config", [0, 2, 6, 7])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq,nk", [(77, 77), (300, 200)])
def test_v6_matches_reference(nq, nk, causal, D, dtype, config):
    if config not in cuda_v6.CONFIGS[D]:
        pytest.skip(f"no config {config} at D={D}")
    from attnlib import make_qkv
    q, k, v = make_qkv(2, 3, nq, nk, D=D, dtype=dtype, device="cuda", seed=nq + D)
    cuda_v6.check_case(q, k, v, causal, config)
