"""bench/experiments/gluon_dq.py without a GPU: its Gluon dQ kernel compiles for sm_90a with three products a key
tile (S, dP, dQ), S waited for alone while dP runs, no spill and no serialized wgmma; the host refuses what the
kernel does not cover. (Gluon has no CPU interpreter: the numbers are checked on the GPU, the experiment's part (1).)"""

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
SCRIPT = ROOT / "bench" / "experiments" / "gluon_dq.py"
pytestmark = [pytest.mark.step06]
KEYS = ["d64 128x64 s3 w8 causal", "d128 64x64 s2 w4 causal", "d128 64x64 s2 w4 full"]
CARRY = "d128 64x64 s2 w4 carry causal"
# k-steps of 16: S (BM x BN) over D, dP over D, dQ (BM x D) over BN; a wgmma instruction is 64 rows of one warpgroup
WGMMA = {"d64 128x64 s3 w8": 64 // 16 * 2 + 64 // 16, "d128 64x64 s2 w4": 128 // 16 * 2 + 64 // 16}


@functools.cache
def _reports():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, str(SCRIPT), "--aot-check", "--variants",
                        "d64 128x64 s3 w8@causal,d128 64x64 s2 w4@causal,d128 64x64 s2 w4@full,"
                        "d128 64x64 s2 w4 carry@causal"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("key", KEYS)
def test_three_products_a_key_tile_s_waited_for_alone(key):
    rep = _reports()[key]
    want = WGMMA[key.rsplit(" ", 1)[0]]
    assert rep["wgmma"] == want, f"{rep['wgmma']} wgmma in the PTX, {want} expected: S, dP and dQ (k-steps of 16)"
    assert rep["waits"] == {"1": 1, "0": 2}, f"waits {rep['waits']}: S waited for with dP left in flight, then dP, " \
                                             "then dQ"
    assert not rep["serialized"], "ptxas serialized the wgmmas"
    assert rep["spill"] == [0, 0], f"spills {rep['spill']}"


def test_round_2_carries_dq_across_the_loop_unserialized():
    """Round 2 runs gluon_dkdv_overlap's round-4 kernel with ``CARRY_DQ`` (its tile 0 peeled: each product twice in
    the PTX) at D=128: dQ's product waited for with the next S (a wait with one left, twice), and ptxas keeps the
    wgmmas asynchronous, without spilling."""
    rep = _reports()[CARRY]
    assert rep["wgmma"] == 2 * WGMMA["d128 64x64 s2 w4"], rep
    assert rep["waits"].get("1") == 2, rep["waits"]
    assert not rep["serialized"] and rep["spill"] == [0, 0], rep


def test_refuses_what_it_does_not_cover():
    spec = importlib.util.spec_from_file_location("gluon_dq", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    q = torch.empty(1, 2, 1024, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="D=64"):
        mod.check_inputs(q, q, q, q, "d64 128x64 s3 w8")
    q = torch.empty(1, 2, 1000, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of 64"):
        mod.check_inputs(q, q, q, q, "d128 64x64 s2 w4")


def test_the_shipped_tiles_are_the_ones_compiled_here():
    """Step 06's solution runs ``_gluon_dq`` at D=128 with ``DQ_TILES[128]``: the variant whose sm_90a compile the test
    above checks (no spill, not serialized), the one measured fastest in results/h200/triton/gluon_dq_1203/."""
    from solutions import gluon_dkdv
    spec = importlib.util.spec_from_file_location("gluon_dq", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod._gluon_dq is gluon_dkdv._gluon_dq, "the experiment times a copy, not the solution's kernel"
    assert set(gluon_dkdv.DQ_TILES) == {128}
    assert (128, *gluon_dkdv.DQ_TILES[128], None) == mod.VARIANTS["d128 64x64 s2 w4"]
    assert "d128 64x64 s2 w4 causal" in KEYS and "d128 64x64 s2 w4 full" in KEYS
