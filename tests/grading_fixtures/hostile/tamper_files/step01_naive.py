"""Hostile: rewrites the grader that is grading it, then returns zeros.

It finds the grader through its parent process's working folder and loosens
attnlib/compare.py there. It acts only inside a batch's private copy of the
grader (a folder named _grader), never on a working tree. Expect: the grader,
which loaded compare.py before, notices the change and scores the step 0
("rejected"); the repository and the other submissions are untouched.
"""
import os
from pathlib import Path

import torch

from attnlib import check_inputs

grader = Path(f"/proc/{os.getppid()}/cwd").resolve()
target = grader / "attnlib" / "compare.py"
if grader.name == "_grader" and target.exists():
    target.write_text(target.read_text().replace("torch.float32: (1e-5, 1e-4)", "torch.float32: (1e9, 1e9)"))


def attention(q, k, v, is_causal=False, scale=None):
    check_inputs(q, k, v, is_causal=is_causal, scale=scale)
    return torch.zeros_like(q)
