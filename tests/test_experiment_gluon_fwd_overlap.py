"""bench/experiments/gluon_fwd_overlap.py and gluon_dkdv_overlap.py without a GPU: their Gluon kernels compile for sm_90a,
the overlapped variants leave products in flight (``wgmma.wait_group`` 1 or 2) where the others wait on every one, ptxas
does not serialize them, and the host refuses the inputs the kernels do not cover. (Gluon has no CPU interpreter: the
numbers are checked on the GPU, each experiment's part (1).)"""

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
SCRIPT = ROOT / "bench" / "experiments" / "gluon_fwd_overlap.py"
pytestmark = [pytest.mark.step05]


@functools.cache
def _experiment():
    spec = importlib.util.spec_from_file_location("gluon_fwd_overlap", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@functools.cache
def _waits():
    """{variant: {pendings: count}}, compiled in a process without TRITON_INTERPRET (on a CPU the test session runs
    Triton's interpreter, whose library functions Gluon cannot compile)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, str(SCRIPT), "--waits", "--variants",
                        "overlap 128x64 s2 w8,no-overlap 128x64 s2 w8"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("variant, in_flight", [("overlap 128x64 s2 w8", True), ("no-overlap 128x64 s2 w8", False)])
def test_overlap_leaves_one_product_in_flight(variant, in_flight):
    waits = _waits()[variant]
    assert waits.get("0"), f"{variant}: no wgmma.wait_group 0 in its PTX ({waits})"
    assert bool(waits.get("1")) == in_flight, (
        f"{variant}: wgmma.wait_group 1 {'missing' if in_flight else 'present'} in its PTX ({waits}); the main loop of "
        f"_gluon_fwd {'must wait for S_j alone (num_outstanding=1)' if in_flight else 'waits on both products'}")


def test_refuses_what_it_does_not_cover():
    mod = _experiment()
    q = torch.empty(1, 2, 1000, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of 128"):
        mod.check_inputs(q, q, q)
    q = torch.empty(1, 2, 1024, 64, dtype=torch.float32)
    with pytest.raises(ValueError, match="16-bit"):
        mod.check_inputs(q, q, q)


DKDV = ROOT / "bench" / "experiments" / "gluon_dkdv_overlap.py"


@functools.cache
def _backward_reports():
    """gluon_dkdv_overlap.py --report for its dK/dV and dQ kernels, in one process without TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, str(DKDV), "--report", "overlap 64x32 s3 w4,dq overlap 128x64 s3 w8"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.step06
def test_dkdv_overlap_keeps_products_in_flight_unserialized():
    """gluon_dkdv_overlap.py's kernel: S^T and dP^T waited for one at a time, and ptxas does not serialize the wgmmas
    (its C7515 warning, which a product left in flight across the loop's back edge caused)."""
    rep = _backward_reports()["overlap 64x32 s3 w4"]
    assert rep["waits"].get("1") == 2, f"expected two waits leaving one product in flight: {rep}"
    assert not rep["serialized"], f"ptxas serialized the wgmmas of _gluon_dkdv: {rep}"


@pytest.mark.step06
def test_dq_overlap_waits_one_product_at_a_time_unserialized():
    """gluon_dkdv_overlap.py's dQ kernel: S_j, dP_j and the previous dQ product waited for one by one (2, 1, 0 left
    in flight), and ptxas does not serialize the wgmmas."""
    rep = _backward_reports()["dq overlap 128x64 s3 w8"]
    assert rep["waits"].get("2") == 1 and rep["waits"].get("1") == 1, f"expected waits leaving 2, then 1: {rep}"
    assert not rep["serialized"], f"ptxas serialized the wgmmas of _gluon_dq: {rep}"
