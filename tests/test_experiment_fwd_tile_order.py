"""bench/experiments/fwd_tile_order.py without a GPU: every order it times computes each (query tile, head) once, in
the interpreter (``--small``: step 05's Triton kernel under HEAD_GROUP 0 to 32 on ten heads, causal, against float64)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.step05]


@pytest.mark.parametrize("rnd", [2])
def test_every_order_is_right_in_the_interpreter(rnd):
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "experiments" / "fwd_tile_order.py"), "--small",
                        "--round", str(rnd)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ok = [ln for ln in r.stdout.splitlines() if ln.rstrip().endswith(" ok")]
    assert len(ok) == 6, f"want one line a HEAD_GROUP of round {rnd}, all ok:\n{r.stdout[-3000:]}"
