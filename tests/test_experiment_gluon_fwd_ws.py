"""bench/experiments/gluon_fwd_ws.py without a GPU: its warp-specialized Gluon forward compiles for sm_90a with the
registers moved from the loader warp to the consumer warpgroups (``setmaxnreg``), each consumer keeps P V in flight
under its softmax (``wgmma.wait_group 1``), nothing spills at D=64, and the host refuses what the kernel does not
cover. (Gluon has no CPU interpreter: the numbers are checked on the GPU, the experiment's part (1).)"""

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
SCRIPT = ROOT / "bench" / "experiments" / "gluon_fwd_ws.py"
pytestmark = [pytest.mark.step05]
# Step 05's D=64 tiles (causal, where the consumers skip the key tiles past their diagonal, and without a mask, where
# they do not), round 2's persistent kernel (causal), and the persistent tiles step 05 runs at D=64 without a causal
# mask (solutions/gluon_fwd.py, PERSISTENT_TILES).
VARIANTS = {"causal": ["ws 3wg n128 s2", "pers 2wg n128 s2"], "full": ["pers 3wg n128 s3", "ws 3wg n128 s2"]}
KEYS = [f"{v} D64 {mask}" for mask, names in VARIANTS.items() for v in names]


@functools.cache
def _reports():
    """{"VARIANT D64 MASK": report}, compiled in a process without TRITON_INTERPRET (Gluon cannot compile under
    the interpreter the CPU test session runs)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    names = ",".join(f"{v}@{mask}" for mask, vs in VARIANTS.items() for v in vs)
    r = subprocess.run([sys.executable, str(SCRIPT), "--aot-check", "--quick", "--variants", names],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_shipped_persistent_tiles_are_compiled_here():
    import importlib
    from attnlib.loader import load_step
    s5 = load_step(5, "solutions")
    g = importlib.import_module(f"{s5.__package__}.gluon_fwd")
    spec = importlib.util.spec_from_file_location("gluon_fwd_ws", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.PERSISTENT["pers 3wg n128 s3"] == g.PERSISTENT_TILES[64], "step 05 runs other tiles than were compiled here"
    assert mod._gluon_fwd_ws_persistent.fn.__module__.endswith("gluon_fwd"), "the experiment times a copy"


@pytest.mark.parametrize("key, consumer_regs", [("ws 3wg n128 s2 D64 causal", 160), ("pers 2wg n128 s2 D64 causal", 240),
                                                 ("ws 3wg n128 s2 D64 full", 160), ("pers 3wg n128 s3 D64 full", 160)])
def test_registers_move_from_the_loader_to_the_consumers(key, consumer_regs):
    variant = key.split(" D64")[0]
    rep = _reports()[key]
    assert isinstance(rep, dict), rep
    assert {24, consumer_regs} <= set(rep["setmaxnreg"]), (
        f"{variant}: setmaxnreg {rep['setmaxnreg']} in the PTX; gl.warp_specialize's worker_num_regs should give the "
        f"loader warp 24 registers and each consumer warpgroup {consumer_regs}")
    if "regs" in rep:      # ptxas found (Triton's own)
        assert rep["spill"] == [0, 0], f"{variant}: spills {rep['spill']} at D=64"


@pytest.mark.parametrize("key", KEYS)
def test_each_consumer_keeps_p_v_in_flight_under_its_softmax(key):
    variant = key.split(" D64")[0]
    waits = _reports()[key]["waits"]
    n_wg = int(variant.split()[1][0])
    assert waits.get("1") == n_wg, (
        f"{variant}: wgmma.wait_group 1 x{waits.get('1')} in the PTX, want one a consumer ({n_wg}): _ws_consumer's "
        f"main loop must wait for S_j alone (num_outstanding=1) and let P_(j-1) V_(j-1) run under the softmax")


def test_refuses_what_it_does_not_cover():
    spec = importlib.util.spec_from_file_location("gluon_fwd_ws", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    q = torch.empty(1, 2, 1000, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="multiple of 64"):
        mod.check_inputs(q, q, q)
    q = torch.empty(1, 2, 1024, 64, dtype=torch.float32)
    with pytest.raises(ValueError, match="16-bit"):
        mod.check_inputs(q, q, q)
    assert not mod.fits("ws 3wg n128 s2", 128) and mod.fits("ws 2wg n128 s3", 128)
    assert not mod.fits("pers 2wg n128 s3", 128) and mod.fits("pers 2wg n128 s2", 128)   # two Q sets when persistent


def test_causal_consumers_hand_back_the_tiles_past_their_diagonal():
    """Under a causal mask with three warpgroups and 128-key tiles each consumer stops at its own diagonal and hands
    the CTA's later K/V buffers back unread (solutions/gluon_fwd.py, SKIP_PAST_DIAGONAL; round 4 of the experiment):
    one more mbarrier wait and arrive in each consumer's code than without the mask. The products stay the same code
    (the loop's bound is what changes), and the register budget with them."""
    causal, full = _reports()["ws 3wg n128 s2 D64 causal"], _reports()["ws 3wg n128 s2 D64 full"]
    more = {k: causal["mbarrier"][k] - full["mbarrier"][k] for k in ("wait", "arrive")}
    assert more == {"wait": 3, "arrive": 3}, (
        f"causal minus full mbarrier waits/arrives in the PTX: {more}, want 3 and 3 (one hand-back loop a consumer "
        f"warpgroup). If 0: _ws_consumer no longer skips the key tiles past its diagonal under a causal mask, and the "
        f"three warpgroups compute 11% more than they need at N=4096")
    assert causal["setmaxnreg"] == full["setmaxnreg"] and causal.get("spill") == full.get("spill")
