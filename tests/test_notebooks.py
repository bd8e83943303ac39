"""Every notebook runs top to bottom on a CPU, against solutions/, at small sizes."""

import os
import sys
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.get("outputs"), f"{path.name}: commit notebooks without outputs (clear them)"
    env = dict(os.environ, ATTN_IMPL="solutions", MPLBACKEND="Agg",
               PYTHONPATH=str(path.parent.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    old = dict(os.environ)
    os.environ.update(env)
    try:
        client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                         resources={"metadata": {"path": str(path.parent)}})
        client.execute()
    finally:
        os.environ.clear()
        os.environ.update(old)
