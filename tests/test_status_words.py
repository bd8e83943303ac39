"""Status words that are true: a step whose student regions are untouched is "not implemented",
whatever its rules say (issue 13, item 5).

Step 06's stub with step 05 solved: the forward runs through step 05's kernel, the backward
raises NotImplementedError, so no Triton kernel runs in the backward. The grader must say
"not implemented", not "rule broken: no Triton kernel was launched in the backward".
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from attnlib import stubgen

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.skipif(not (REPO / "solutions").is_dir(), reason="a student release has no solutions/")
def test_untouched_step06_after_step05_is_not_implemented(tmp_path):
    sub = tmp_path / "submission"
    stubgen.write(stubgen.SOLUTIONS, sub)                       # every step a pristine stub...
    for f in ("step04_flash_torch.py", "step05_triton_fwd.py"):  # ...but 04 and 05 done, as a student hands them in
        (sub / f).write_text(stubgen.as_submitted((stubgen.SOLUTIONS / f).read_text()))   # (no SOLUTION-ONLY line)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "grading", "--impl", str(sub), "--step", "6", "--out", str(out),
                           "--cache", str(tmp_path / "cache"), "--quiet"],
                          cwd=REPO, capture_output=True, text=True, timeout=420)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    st = json.loads((out / "results.json").read_text())["extra_data"]["steps"]["step06_triton_bwd"]
    assert st["status"] == "not implemented" and st["points"] == 0, f"{st['status']}: {proc.stdout[-2000:]}"
