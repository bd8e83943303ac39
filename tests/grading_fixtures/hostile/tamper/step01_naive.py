"""Hostile: tries to change its own score, then returns zeros.

At import it patches every comparison it can reach (attnlib.compare, attnlib.checks,
torch.testing, torch.allclose), rewrites the copy of attnlib/compare.py it can
find to accept anything, and writes a perfect results.json wherever a grader
might look. Expect: the forward and backward checks fail as for any zeros
(only the contract's 2 points remain), and the grader's results.json is its own.
"""
import json
import os
from pathlib import Path

import torch
import torch.testing

import attnlib
import attnlib.checks
import attnlib.compare
from attnlib import check_inputs

# Gradescope reads the grade from /autograder/results. This fixture aims at a stand-in root: the
# test points it at a temporary folder; left as it is, a folder beside this file. Never the real one.
AUTOGRADER_ROOT = Path(__file__).resolve().parent / "autograder-root"
FAKE = {"score": 1000.0, "tests": [{"name": "everything", "score": 1000.0, "max_score": 10.0}]}


def _noop(*args, **kwargs):
    return None


attnlib.compare.assert_close = _noop
attnlib.assert_close = _noop
attnlib.checks.assert_close = _noop
attnlib.checks.check_attention = _noop
torch.testing.assert_close = _noop
torch.allclose = lambda *a, **k: True

# Loosen the tolerance in the file itself.
src = Path(attnlib.compare.__file__)
src.write_text(src.read_text().replace("torch.float32: (1e-5, 1e-4)", "torch.float32: (1e9, 1e9)"))

# A perfect results.json wherever it might be read.
for d in {Path.cwd(), Path(os.environ.get("HOME", ".")), Path(os.environ.get("TMPDIR", ".")),
          Path(__file__).parent, AUTOGRADER_ROOT / "results"}:
    try:
        d.mkdir(parents=True, exist_ok=True)
        (d / "results.json").write_text(json.dumps(FAKE))
    except OSError:
        pass
Path(Path.cwd(), "TAMPERED").write_text("the tamper fixture ran")


def attention(q, k, v, is_causal=False, scale=None):
    check_inputs(q, k, v, is_causal=is_causal, scale=scale)
    return torch.zeros_like(q)
