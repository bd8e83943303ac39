"""`pytest --impl FOLDER` grades any folder, inside the checkout or not, in both spellings."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnlib.pytest_plugin import not_installed_mark

REPO = Path(__file__).resolve().parent.parent


NOT_INSTALLED = not_installed_mark()


@pytest.mark.skipif(not (REPO / "solutions").is_dir(), reason="a student release has no solutions/")
@NOT_INSTALLED
@pytest.mark.parametrize("form", ["space", "equals"])
def test_impl_with_an_absolute_path_outside_the_checkout(tmp_path, form):
    impl = tmp_path / "submission"
    shutil.copytree(REPO / "solutions", impl, ignore=shutil.ignore_patterns("__pycache__", "csrc"))
    args = ["--impl", str(impl)] if form == "space" else [f"--impl={impl}"]
    # An unknown-mark warning would mean conftest's markers were lost with the root: make it an error.
    r = subprocess.run([sys.executable, "-m", "pytest", *args, "-m", "step01", "-k", "explicit_scale",
                        "-p", "no:cacheprovider", "-rN", "-W", "error::pytest.PytestUnknownMarkWarning"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, (f"`pytest {' '.join(args)} -m step01` exited {r.returncode} (4 = pytest took "
                               f"the folder for a test path: is the course installed, `make setup`?):\n{out[-3000:]}")
    assert "2 passed" in out and f"attention implementation: {impl}" in out, out[-3000:]
