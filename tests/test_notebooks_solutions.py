"""The notebooks against the course's own solutions/: a maintainer's file, not in the student release
(grading/package.py lists what is; this file names solutions/, which the release does not hold).

- no notebook reads solutions/ behind the IMPL switch;
- attnlib.nb.show_region shows a solution's region from solutions/ and only the TODO from a stub;
- every exercise at the end of a notebook has its answer in solutions/EXERCISES.md.
"""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SOURCES = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.py"))
EXERCISES = REPO / "solutions" / "EXERCISES.md"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_no_notebook_reads_solutions_behind_the_switch(path):
    """With IMPL = "steps" a notebook must not show the code the student is about to write."""
    text = path.read_text()
    for needle in ('"solutions"', "'solutions'", "solutions/"):
        for line in text.splitlines():
            if needle in line and not line.lstrip().startswith("#"):
                pytest.fail(f"{path.name} names solutions/ in code: {line.strip()!r}; read files through "
                            "attnlib.nb.show_region or load_step, which follow IMPL")


def test_show_region_follows_impl(tmp_path):
    """Notebook 07's regions: a TODO from a stub, the code from solutions/; never solutions' code for a stub.
    (Pristine stubs, generated into a temporary folder: your own steps/ may hold your code.)"""
    from attnlib import stubgen
    from attnlib.nb import show_region
    stubgen.write(stubgen.SOLUTIONS, tmp_path / "steps")
    sol = show_region("step07_fwd_v1.cu", "online softmax", impl="solutions")
    stub = show_region("step07_fwd_v1.cu", "online softmax", impl=tmp_path / "steps")
    assert ">>> STUDENT" in sol and "fmaxf" in sol
    assert "TODO(Step 07): online softmax" in stub
    code = [line.strip() for line in sol.splitlines()[1:-1] if len(line.strip()) > 3 and not line.strip().startswith("//")]
    leaked = [line for line in code if line in stub]
    assert not leaked, f"with IMPL = steps the region shows solution lines: {leaked}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_every_exercise_has_its_answer(path):
    """As many answers in solutions/EXERCISES.md, under `## NN ...`, as the notebook has exercises."""
    text = path.read_text()
    ex = text.rfind("# ## Exercises")
    assert ex > 0, f"{path.name} has no '## Exercises' (tests/test_notebooks.py says what it needs)"
    n_ex = len(re.findall(r"^# (\d)\. ", text[ex:], flags=re.M))
    section = re.search(rf"^## {path.stem[:2]} .*?(?=^## |\Z)", EXERCISES.read_text(), flags=re.M | re.S)
    assert section, f"solutions/EXERCISES.md has no section '## {path.stem[:2]} ...'"
    n_ans = len(re.findall(r"^(\d)\. ", section.group(0), flags=re.M))
    assert n_ans == n_ex, f"{path.name}: {n_ex} exercises, {n_ans} answers in solutions/EXERCISES.md"
