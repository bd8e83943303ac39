"""The notebooks: their text sources, the one switch, and a run of each from notebooks/ on the
implementation under test (``--impl``). What concerns the course's solutions/ (show_region on them,
the answers to the exercises, no notebook reading them) is in tests/test_notebooks_solutions.py,
which a student release does not hold.

Each notebook's source is ``notebooks/NN_name.py`` (jupytext percent format), paired with the
``NN_name.ipynb`` that Jupyter opens; `make notebooks` writes the .ipynb from the .py.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attnlib.nb import SWITCH
from attnlib.pytest_plugin import not_installed_mark

REPO = Path(__file__).resolve().parent.parent
NB_DIR = REPO / "notebooks"
NOTEBOOKS = sorted(NB_DIR.glob("[0-9][0-9]_*.ipynb"))
SOURCES = sorted(NB_DIR.glob("[0-9][0-9]_*.py"))


def _env_without_pythonpath(**extra):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(extra)
    return env


def test_every_notebook_has_a_text_source():
    assert NOTEBOOKS, "no notebooks found"
    assert [p.stem for p in NOTEBOOKS] == [p.stem for p in SOURCES], (
        "each notebooks/NN_name.ipynb is written from notebooks/NN_name.py (jupytext percent format): "
        f"notebooks {[p.stem for p in NOTEBOOKS]}, sources {[p.stem for p in SOURCES]}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_matches_its_source(path):
    """The .ipynb holds exactly the cells of its .py source, with no outputs."""
    jupytext = pytest.importorskip("jupytext")
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(path, as_version=4)
    src = jupytext.read(path.with_suffix(".py"))
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.get("outputs"), f"{path.name}: commit notebooks without outputs (clear them)"
    got = [(c.cell_type, c.source) for c in nb.cells]
    want = [(c.cell_type, c.source) for c in src.cells]
    for i, (g, w) in enumerate(zip(got, want)):
        assert g == w, (f"{path.name} cell {i} differs from {path.stem}.py: edit the .py and run "
                        f"`make notebooks`\n  .ipynb: {g[1][:200]!r}\n  .py:    {w[1][:200]!r}")
    assert len(got) == len(want), (f"{path.name} has {len(got)} cells, {path.stem}.py {len(want)}: "
                                   "run `make notebooks`")


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_markdown_lines_are_comments(path):
    """In the percent format a markdown cell's every line is a comment: a line without its '# ' is kept as
    raw text by jupytext, so the .py stops being Python and an editor's reflow goes unseen (it happened in
    notebook 06's section 11)."""
    bad, markdown = [], False
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("# %%"):
            markdown = "[markdown]" in line
        elif markdown and line.strip() and not line.startswith("#"):
            bad.append(f"  line {i}: {line[:100]}")
    assert not bad, f"{path.name}: markdown lines without their '# ' (add it, then `make notebooks`):\n" + "\n".join(bad)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_one_switch_in_every_notebook(path):
    """The first code cell starts with the same IMPL switch everywhere (attnlib.nb.SWITCH)."""
    jupytext = pytest.importorskip("jupytext")
    code = [c.source for c in jupytext.read(path).cells if c.cell_type == "code"]
    assert code and code[0].startswith(SWITCH), (
        f"{path.name}: the first code cell must start with the switch in attnlib/nb.py (SWITCH):\n{SWITCH}\n"
        f"it starts with:\n{code[0][:300] if code else '(no code cell)'}")


NOT_INSTALLED = not_installed_mark()

# How an executed copy kept by `make gpu-check` was made (its first cell says it)
GPU_CHECK_BY = ("`make gpu-check` (tests/test_notebooks.py), beside the rest of the test suite and the grader "
                "on the same GPU: a time this copy measured live ran under their load (the tables it reads "
                "from results/ were measured alone)")


@NOT_INSTALLED
def test_attnlib_imports_from_notebooks_without_pythonpath():
    """`make setup` installs the course in editable mode: attnlib imports from notebooks/ alone."""
    r = subprocess.run([sys.executable, "-c", "import attnlib.nb, attnlib.loader; print(attnlib.loader.REPO)"],
                       cwd=NB_DIR, env=_env_without_pythonpath(), capture_output=True, text=True)
    assert r.returncode == 0, ("`import attnlib` fails from notebooks/ without PYTHONPATH: run `make setup` "
                               f"(it runs `pip install -e .`)\n{r.stderr[-2000:]}")
    assert Path(r.stdout.strip()) == REPO, f"attnlib comes from {r.stdout.strip()}, not this checkout {REPO}"


def _steps_run_by(path: Path) -> list[int]:
    """The steps a notebook runs: its own (if it is a step's) and every ``load_step(N)`` in its source."""
    from attnlib.contract import STEPS
    own = {int(path.name[:2])} & set(STEPS)
    return sorted(own | {int(n) for n in re.findall(r"load_step\((\d+)", path.with_suffix(".py").read_text())})


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path):
    """Executed as Jupyter would from notebooks/, with no PYTHONPATH, on the implementation under test
    (``--impl``: your steps/ by default; the course's `make test` gives solutions/), at small sizes."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    from attnlib.contract import STEPS
    from attnlib.loader import impl_root
    root = impl_root()
    lacking = [f"{STEPS[n][0]}.py" for n in _steps_run_by(path) if not (root / f"{STEPS[n][0]}.py").exists()]
    if lacking:
        pytest.skip(f"{path.name} runs {', '.join(lacking)}, which {root} lacks")
    nb = nbformat.read(path, as_version=4)
    old = dict(os.environ)
    # ATTN_EXECUTED_DIR (set by `make gpu-check`): keep each executed notebook there, plots inline
    keep = os.environ.get("ATTN_EXECUTED_DIR")
    backend = "module://matplotlib_inline.backend_inline" if keep else "Agg"
    env = _env_without_pythonpath(ATTN_IMPL=str(root), MPLBACKEND=backend)     # before the clear below
    os.environ.clear()
    os.environ.update(env)
    stub = None
    try:
        client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                         resources={"metadata": {"path": str(NB_DIR)}})
        client.execute()
    except nbclient.exceptions.CellExecutionError as exc:
        if exc.ename != "NotImplementedError":
            raise
        stub = exc.evalue                   # one line, not the cell's whole traceback
    finally:
        os.environ.clear()
        os.environ.update(old)
    if stub is not None:
        pytest.fail(f"NOT IMPLEMENTED: {path.name} runs {root} and stops at a stub: {stub}", pytrace=False)
    if keep:
        from attnlib.nb import write_executed
        write_executed(nb, path.name, root.name, Path(keep) / path.name, by=GPU_CHECK_BY)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.stem)
def test_notebook_ends_with_references_and_exercises(path):
    """Every notebook ends with its references and two or three exercises (their answers: the course's
    tests/test_notebooks_solutions.py)."""
    text = path.read_text()
    refs, ex = text.rfind("# ## References"), text.rfind("# ## Exercises")
    assert 0 < refs < ex, f"{path.name}: end with '## References' then '## Exercises'"
    for must in ("2205.14135", "2307.08691", "2407.08608", "06-fused-attention", "assignment2-systems"):
        assert must in text[refs:ex], f"{path.name}: the references lack {must}"
    n_ex = len(re.findall(r"^# (\d)\. ", text[ex:], flags=re.M))
    assert 2 <= n_ex <= 3, f"{path.name}: {n_ex} exercises"


@pytest.mark.slow
def test_executed_copy_names_its_machine(tmp_path):
    """`make executed` (attnlib.nb.execute): outputs kept, a first cell naming machine and date."""
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    from attnlib.nb import execute, machine
    src = tmp_path / "src" / "99_tiny.ipynb"
    src.parent.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("import os, attnlib\nprint(os.environ['ATTN_IMPL'], 6 * 7)")]
    nbformat.write(nb, src)
    out = nbformat.read(execute(src, tmp_path / "executed" / src.name), as_version=4)
    assert out.cells[0].cell_type == "markdown" and machine() in out.cells[0].source and "UTC" in out.cells[0].source
    assert "solutions 42" in out.cells[1].outputs[0]["text"]
