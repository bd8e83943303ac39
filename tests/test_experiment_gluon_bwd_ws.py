"""Step 06's one-kernel backward for Hopper (``_gluon_bwd_ws`` in solutions/gluon_dkdv.py, measured by
bench/experiments/gluon_bwd_ws.py) without a GPU: the tiles it ships are the experiment's best, and it compiles for
sm_90a as its design says: five products a query tile, dQ added by one bulk reduce a consumer's turn, the bulk waits
before a staging buffer is written again and before the CTA leaves, barriers local to a warpgroup, the registers
moved from the loader to the consumers, no wgmma serialized. (Gluon has no CPU interpreter: the numbers are checked
on the GPU, tests/test_gluon_dkdv.py's GPU tests and the experiment's part (1).)"""

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
SCRIPT = ROOT / "bench" / "experiments" / "gluon_bwd_ws.py"
pytestmark = [pytest.mark.step06]


def _module():
    spec = importlib.util.spec_from_file_location("gluon_bwd_ws", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@functools.cache
def _reports():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # one process for every compile these tests read (the shipped tiles and round 3's switches)
    r = subprocess.run([sys.executable, str(SCRIPT), "--aot-check", "--variants64", "alt m64 s2 q1@causal",
                        "--variants128", "split m64 s2 q2@causal,split m64 s2 q2 lm@causal,split m64 s2 q2 lm ds@causal"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_solution_ships_the_experiments_best_tiles():
    from solutions import gluon_dkdv
    mod = _module()
    assert gluon_dkdv.BWD_TILES[64] == mod.VARIANTS["alt m64 s2 q1"]
    assert gluon_dkdv.BWD_TILES[128] == mod.VARIANTS["split m64 s2 q2"]
    # round 3's winner at D=128 causal: the same tiles with both switches
    assert (*gluon_dkdv.BWD_TILES[128], gluon_dkdv.BWD_SWITCHES[(128, True)]) == mod.VARIANTS["split m64 s2 q2 lm ds"]
    assert set(gluon_dkdv.BWD_SWITCHES) == {(128, True)}, gluon_dkdv.BWD_SWITCHES


@pytest.mark.parametrize("key,wgmma,bulk_waits", [("alt m64 s2 q1 D64 causal", 48, [0, 0, 0, 0]),
                                                  ("split m64 s2 q2 lm ds D128 causal", 64, [0, 0, 1, 1])])
def test_compiles_for_sm90a_as_designed(key, wgmma, bulk_waits):
    rep = _reports()[key]
    # Each consumer's code: S^T, dP^T, dV, dK and two dQ products over the two 64-key halves, in k-steps of 16
    # (D=64: 4+4+4+4, dQ 2x4; D=128: 8+8+4+4, dQ 2x4); the PTX holds both consumers' copies.
    assert rep["wgmma"] == wgmma, f"{rep['wgmma']} wgmma in the PTX"
    assert rep["tma_reduce_add"] == 2, f"{rep}: one bulk reduce of dQ in each consumer's code"
    assert rep["bulk_waits"] == bulk_waits, (
        f"bulk waits {rep['bulk_waits']}: each consumer waits for its reduce DQ_BUFS turns ago (store_wait(DQ_BUFS - 1))"
        " before writing a staging buffer again, and for all of them (store_wait(0)) before its CTA leaves")
    counts = {n for _, n in rep["named_barriers"]}
    assert counts == {"128"}, f"barriers {rep['named_barriers']}: a consumer's barriers must count its 128 threads " \
                              "alone (one over the CTA would wait for warps that never reach it)"
    assert ["dec", "24"] in rep["setmaxnreg"] and ["inc", "240"] in rep["setmaxnreg"], rep["setmaxnreg"]
    assert not rep["serialized"], "ptxas serialized the wgmmas"
    if "D64" in key:
        assert rep["spill"] == [0, 0], f"spills {rep['spill']}"


def test_refuses_what_it_does_not_cover():
    mod = _module()
    for shape, why in (((1, 2, 1024, 96), "D 64 or 128"), ((1, 2, 1000, 64), "multiple of 128")):
        q = torch.empty(shape, dtype=torch.bfloat16)
        with pytest.raises(ValueError, match=why):
            mod.check_inputs(q, q, q, q)


def test_round_3_switches_change_what_they_say_and_step06_sets_them_at_d128_causal_only():
    """Round 3's switches: DS_FIRST waits for dP^T whole before dV is issued (one more ``wgmma.wait_group 0`` a
    consumer, one fewer ``1``), and LOCAL_MASK's causal mask from the tile's own indices spills less than the global
    offsets at D=128 (ptxas 13.0: 92 B against 176; 72 with both). Step 06 launches both at D=128 causal (round 3:
    1.06-1.12x without them), neither at D=64 or without a mask (within the run's noise there)."""
    rep = _reports()
    plain, lm, both = (rep[f"split m64 s2 q2{x} D128 causal"] for x in ("", " lm", " lm ds"))
    assert plain["waits"] == lm["waits"] == {"1": 4, "0": 4}, (plain["waits"], lm["waits"])
    assert both["waits"] == {"1": 2, "0": 6}, both["waits"]
    assert both["spill"][0] <= lm["spill"][0] < plain["spill"][0], (both["spill"], lm["spill"], plain["spill"])
    assert both["wgmma"] == plain["wgmma"] == 64 and not both["serialized"], both
    from solutions import gluon_dkdv
    for d in (64, 128):                         # what step 06 launches
        q = torch.empty(1, 2, 4096, d, dtype=torch.bfloat16)
        lse = torch.empty(2, 4096)
        for causal in (True, False):
            kwargs = gluon_dkdv.bwd_launch_args(q, q, q, q, lse, lse, q, q, causal, d ** -0.5)[2]
            got = {x: kwargs[x] for x in ("LOCAL_MASK", "DS_FIRST") if x in kwargs}
            want = {"LOCAL_MASK": True, "DS_FIRST": True} if (d, causal) == (128, True) else {}
            assert got == want, f"D={d} {'causal' if causal else 'full'}: step 06 launches {got}, round 3 chose {want}"
        # tiles given (the experiment's variants): no switch added
        kwargs = gluon_dkdv.bwd_launch_args(q, q, q, q, lse, lse, q, q, True, d ** -0.5,
                                            tiles=gluon_dkdv.BWD_TILES[d])[2]
        assert not {"LOCAL_MASK", "DS_FIRST"} & set(kwargs), kwargs
