"""`pytest --impl FOLDER` grades any folder, inside the checkout or not, in both spellings."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(not (REPO / "solutions").is_dir(), reason="a student release has no solutions/")
@pytest.mark.parametrize("form", ["space", "equals"])
def test_impl_with_an_absolute_path_outside_the_checkout(tmp_path, form):
    impl = tmp_path / "submission"
    shutil.copytree(REPO / "solutions", impl, ignore=shutil.ignore_patterns("__pycache__", "csrc"))
    args = ["--impl", str(impl)] if form == "space" else [f"--impl={impl}"]
    r = subprocess.run([sys.executable, "-m", "pytest", *args, "-m", "step01", "-k", "explicit_scale",
                        "-p", "no:cacheprovider", "-q", "-rN"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, (f"`pytest {' '.join(args)} -m step01` exited {r.returncode} (4 = pytest took "
                               f"the folder for a test path: is the course installed, `make setup`?):\n{out[-3000:]}")
    assert "2 passed" in out, out[-3000:]
    r = subprocess.run([sys.executable, "-m", "pytest", *args, "--co", "-q", "-p", "no:cacheprovider",
                        "tests/test_step01_naive.py"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "PytestUnknownMarkWarning" not in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]
