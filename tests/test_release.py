"""The student release: nothing to copy in it, and it works as a course.

- the leak check (grading/leaks.py) finds a solution line however it is disguised --
  re-indented, quoted in a log, in a notebook's output, in a later step's stub -- and
  lets through what the student was given (hints, earlier stubs, attnlib);
- a release build with a planted leak (one of bench/'s experiment files, which hold whole
  kernels) fails and leaves no folder behind;
- a release filled with the solutions passes its own quick check (`make quick`).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from attnlib import stubgen
from grading import leaks, package
from grading.package import PackageError, _student_notebook, build_release

REPO = Path(__file__).resolve().parent.parent
QUICK_STEPS = [1, 3]          # two quick steps: the release's quick check stays well under a minute

# Deselected in the quick check below, which borrows this interpreter: its editable install of the
# course (`pip install -e .`) is this checkout, not the release, and this test says so.
BORROWED_VENV = ["tests/test_notebooks.py::test_attnlib_imports_from_notebooks_without_pythonpath"]


def _course(tmp_path: Path) -> Path:
    """A two-step course: step 05 solved, step 06 given step 05's loop as code, plus a hint."""
    sol = tmp_path / "solutions"
    sol.mkdir()
    (sol / "step05_triton_fwd.py").write_text(
        "def fwd(acc, alpha, m_i, s):\n"
        "    # >>> STUDENT: rescale the accumulator, acc = acc * alpha[:, None]\n"
        "    acc = acc * alpha[:, None]\n"
        "    m_new = tl.maximum(m_i, tl.max(s, 1))\n"
        "    return acc\n"
        "    # <<< STUDENT\n")
    (sol / "step06_triton_bwd.py").write_text(
        "def bwd(acc, m_i, s):\n"
        "    m_new = tl.maximum(m_i, tl.max(s, 1))\n"         # step 05's answer, inlined in step 06
        "    # >>> STUDENT: the dK/dV loop\n"
        "    dv = dv + tl.dot(tl.trans(p), do)\n"
        "    # <<< STUDENT\n")
    return sol


def test_leak_check_finds_disguised_solution_lines(tmp_path):
    sol = _course(tmp_path)
    keys = leaks.secrets(sol, library=tmp_path / "no-library")
    assert leaks.normalize("m_new = tl.maximum(m_i, tl.max(s, 1))") in keys        # a later stub is no excuse
    assert leaks.normalize("acc = acc * alpha[:, None]") not in keys                # the hint gives it away
    assert leaks.normalize("return acc") not in keys                                # too short to mean anything

    rel = tmp_path / "release"
    (rel / "bench").mkdir(parents=True)
    (rel / "bench" / "experiment.py").write_text("def k():\n        m_new=tl.maximum( m_i ,tl.max(s,1))\n")
    (rel / "results.log").write_text("E       dv = dv + tl.dot(tl.trans(p),   do)\n")
    (rel / "nb.ipynb").write_text(json.dumps({"cells": [
        {"cell_type": "markdown", "source": ["no code here\n"]},
        {"cell_type": "code", "source": ["print(1)\n"],
         "outputs": [{"output_type": "stream", "text": ["    dv = dv + tl.dot(tl.trans(p), do)\n"]}]}]}))
    (rel / "clean.py").write_text("acc = acc * alpha[:, None]\nreturn acc\n")
    (rel / "figure.png").write_bytes(b"\x89PNG m_new = tl.maximum(m_i, tl.max(s, 1))")   # binary: not read
    found, stale = leaks.scan(rel, sol, allowed=[("nowhere.py", "x = 1", "unused")])
    assert sorted((x.path, x.where) for x in found) == [
        ("bench/experiment.py", "line 2"), ("nb.ipynb", "cell 2, line 2"), ("results.log", "line 1")], found
    assert "solutions/step05_triton_fwd.py:4" in str(found[0]) and "solutions/step06_triton_bwd.py:4" in str(found[2])
    assert stale == [("nowhere.py", "x = 1", "unused")]
    # An entry of the allowed list lets exactly that line through, in that file only.
    found, stale = leaks.scan(rel, sol, allowed=[("results.log", "dv = dv + tl.dot(tl.trans(p), do)", "shown")])
    assert [x.path for x in found] == ["bench/experiment.py", "nb.ipynb"] and stale == []


def test_release_build_fails_on_a_planted_leak(tmp_path, monkeypatch):
    # bench/experiments/triton_fwd_tma.py holds a whole Triton forward kernel (step 05's answer): put it on the list.
    monkeypatch.setattr(package, "RELEASE_FILES", package.RELEASE_FILES + ["bench/experiments/triton_fwd_tma.py"])
    out = tmp_path / "release"
    leak = r"bench/experiments/triton_fwd_tma.py \(line \d+\) holds solutions/step05"
    with pytest.raises(PackageError, match=leak) as exc:
        build_release(out, steps=[1, 2, 3])
    assert "would leak" in str(exc.value)
    assert not out.exists(), "a release that failed its leak check was left behind"


def test_release_build_fails_on_a_test_that_names_solutions(tmp_path, monkeypatch):
    # tests/test_notebooks_solutions.py checks solutions/ itself: released, it would fail there.
    maintainers = "tests/test_notebooks_solutions.py"
    monkeypatch.setattr(package, "NEVER", [p for p in package.NEVER if p != maintainers])
    monkeypatch.setattr(package, "RELEASE_FILES", package.RELEASE_FILES + [maintainers])
    out = tmp_path / "release"
    with pytest.raises(PackageError, match=r"name solutions/, which the release lacks: tests/test_notebooks_solutions"):
        build_release(out, steps=QUICK_STEPS)
    assert not out.exists(), "a release that failed its check was left behind"


def test_release_holds_only_listed_files(tmp_path):
    rep = build_release(tmp_path / "release", steps=QUICK_STEPS)
    rel = tmp_path / "release"
    files = sorted(p.relative_to(rel).as_posix() for p in rel.rglob("*") if p.is_file())
    for f in files:
        assert (f in rep["written"] or f.startswith("steps/")
                or package._released(f, [])), f"{f} is in the release but not on its list"
    assert not any(f.endswith(".log") or f.startswith(("solutions/", "grading/gradescope/")) for f in files)
    assert not any(f.startswith(("bench/triton_", "bench/experiments/")) or f == "bench/cuda_gpu.py" for f in files)
    assert "tests/test_step04_flash_torch.py" not in files and "steps/step03_sdpa.py" in files
    assert "tests/test_notebooks.py" in files
    assert not any(f in files for f in ("tests/test_stubs.py", "tests/test_notebooks_solutions.py")), \
        "a maintainer's test of solutions/ is in the release"
    for name, text in stubgen.generate(REPO / "solutions").items():
        if leaks.step_of(name) in QUICK_STEPS:
            assert (rel / "steps" / name).read_text() == text, f"steps/{name} is not the stub of solutions/{name}"
    # The release's own texts speak of steps/, never of solutions/.
    for f in ("README.md", "Makefile", ".ci/run"):
        assert "solutions" not in (rel / f).read_text(), f"the release's {f} mentions solutions/"
    assert "make quick" in (rel / "README.md").read_text() and "## The steps" in (rel / "README.md").read_text()


def test_a_notebook_left_on_the_solutions_comes_out_on_steps(tmp_path):
    nb = tmp_path / "nb.ipynb"
    nb.write_text(json.dumps({"cells": [{"cell_type": "code", "execution_count": 3, "metadata": {},
                                         "outputs": [{"output_type": "stream", "name": "stdout", "text": "x"}],
                                         "source": ['IMPL = os.environ.get("ATTN_IMPL", "solutions")\n']}],
                              "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    assert _student_notebook(nb)
    cell = json.loads(nb.read_text())["cells"][0]
    assert '"steps")' in "".join(cell["source"]) and cell["outputs"] == [] and cell["execution_count"] is None


def test_full_release_has_no_solution_line(tmp_path):
    rep = build_release(tmp_path / "release")
    assert len(rep["leaks_allowed"]) == len(leaks.ALLOWED), "an entry of grading.leaks.ALLOWED matches nothing"


def test_released_tests_never_name_solutions():
    """In the release there is no solutions/: a released test or notebook that names it fails there."""
    named = [rel for rel in package._repo_files()
             if rel.startswith(("tests/", "notebooks/")) and package._released(rel, [])
             and rel != "conftest.py" and package._mentions_solutions(package._code_of(REPO / rel))]
    assert named == [], (f"released files that name solutions/, which the release lacks: {named}; load through "
                         "the `load` fixture (the implementation under test), or, for a maintainer's test of "
                         "solutions/, put it in a file that grading/package.py's NEVER keeps out")


def test_released_notebooks_find_the_results_they_read():
    """A released notebook that reads `RESULTS / "file"` (results/h200/) finds that file in the release
    (a result not yet committed is the notebook's to guard: it says so when it runs)."""
    repo_files = package._repo_files()
    wanted = []
    for nb in sorted((REPO / "notebooks").glob("[0-9][0-9]_*.py")):
        if not package._released(nb.relative_to(REPO).as_posix(), []):
            continue
        text = nb.read_text()
        if "RESULTS = " in text:
            assert 'RESULTS = REPO / "results" / "h200"' in text, f"{nb.name}: RESULTS is not results/h200"
        for chain in re.findall(r'RESULTS((?:\s*/\s*f?"[^"]+")+)', text):
            parts = [re.sub(r"\{[^}]*\}", "*", x) for x in re.findall(r'"([^"]+)"', chain)]
            wanted.append((nb.name, "/".join(["results/h200", *parts])))
    assert len(wanted) > 10, f"the notebooks' reads of results/ were not found: {wanted}"
    missing = [(name, f) for name, pat in wanted for f in repo_files
               if fnmatch.fnmatch(f, pat) and not package._released(f, [])]
    assert not missing, f"released notebooks read results that the release leaves out (RELEASE_FILES): {missing}"


@pytest.mark.slow
def test_release_filled_with_solutions_passes_its_quick_check(tmp_path):
    rel = tmp_path / "release"
    build_release(rel, steps=QUICK_STEPS)
    for p in (REPO / "solutions").glob("step0[1-9]_*.py"):
        if leaks.step_of(p.name) not in QUICK_STEPS:
            continue
        shutil.copyfile(p, rel / "steps" / p.name)
    deselect = " ".join(f"--deselect {t}" for t in BORROWED_VENV if (rel / t.split("::")[0]).exists())
    env = {k: v for k, v in os.environ.items() if k != "ATTN_IMPL"}
    proc = subprocess.run(["make", "quick", f"PYTHON={sys.executable}", "--no-print-directory"],
                          cwd=rel, capture_output=True, text=True, timeout=600,
                          env={**env, "PYTEST_ADDOPTS": f"-p no:cacheprovider {deselect}"})
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
    assert proc.returncode == 0, f"the release's `make quick` failed with the solutions in steps/:\n{tail}"
    assert " passed" in tail and "no tests ran" not in tail, tail
