"""bench/experiments/gluon_dkdv_dq.py without a GPU: its dK/dV kernel with a fifth product (dQ^T = K^T dS^T, added by
fp32 atomics) compiles for sm_90a with the solution's waits, every product counted, no spill and no serialized
wgmma in the variants it runs by default; the host refuses what the kernel does not cover. (Gluon has no CPU
interpreter: the numbers are checked on the GPU, the experiment's part (1).)"""

import functools
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "experiments" / "gluon_dkdv_dq.py"
pytestmark = [pytest.mark.step06]


@functools.cache
def _reports():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, str(SCRIPT), "--aot-check", "--variants",
                        "dq 64x32 s3 w4@causal,dq 64x32 s3 w4 vec@causal,dq 64x32 s3 w4 vec@full,"
                        "dq 64x32 s3 w4 tma@causal"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("key", ["dq 64x32 s3 w4 causal", "dq 64x32 s3 w4 vec causal", "dq 64x32 s3 w4 vec full"])
def test_five_products_a_tile_and_dq_added_by_atomics(key):
    rep = _reports()[key]
    assert rep["wgmma"] == 16, f"{rep['wgmma']} wgmma in the PTX: S^T 4, dP^T 4, dV 2, dK 2 and dQ^T 4 (k-steps of 16)"
    if " vec" in key:
        assert (rep["atomics_v4_f32"], rep["atomics_f32"]) == (4, 0), (
            f"{rep}: a 64 x 32 dQ^T tile over 128 threads is 16 floats a thread, four 16-byte adds")
    else:
        assert rep["atomics_f32"] == 16, f"{rep['atomics_f32']} fp32 atomic adds: 64 x 32 / 128 threads is 16"
    assert rep["waits"] == {"1": 2, "0": 1}, f"waits {rep['waits']}: the solution's kernel waits twice with one " \
                                             "product left in flight, and once for all"
    assert not rep["serialized"], "ptxas serialized the wgmmas"
    assert rep["spill"] == [0, 0], f"spills {rep['spill']}"


def test_round_2_adds_dq_by_one_tma_reduce_a_tile():
    """Round 2: dQ_i^T staged in shared memory (two buffers) and added by the TMA unit's bulk reduce, no fp32 atomic:
    one cp.reduce.async.bulk.tensor ... add in the loop, waited for with one group left in flight (the buffer
    written next) and all of them before the CTA leaves."""
    rep = _reports()["dq 64x32 s3 w4 tma causal"]
    assert rep["tma_reduce_add"] == 1 and rep["atomics_f32"] == rep["atomics_v4_f32"] == 0, rep
    assert rep["bulk_waits"] == [0, 1], f"bulk waits {rep['bulk_waits']}: store_wait(1) before reusing a buffer, " \
                                        "store_wait(0) at the end"
    assert rep["wgmma"] == 16 and rep["waits"] == {"1": 2, "0": 1} and not rep["serialized"], rep
    assert rep["spill"] == [0, 0], f"spills {rep['spill']}"


def test_refuses_what_it_does_not_cover():
    spec = importlib.util.spec_from_file_location("gluon_dkdv_dq", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    q = torch.empty(1, 2, 1024, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="D=64"):
        mod.check_inputs(q, q, q, q)
    q = torch.empty(1, 2, 1000, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of 128"):
        mod.check_inputs(q, q, q, q)
