"""The three ways to install the course ask for the same packages: requirements.txt (`make setup`),
pyproject.toml (`pip install -e .[dev]`) and environment.yml (conda), and each installs the course."""

import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

if sys.version_info >= (3, 11):
    import tomllib
else:                                          # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")


def _name(req: str) -> str:
    return re.split(r"[<>=!~;\[ ]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _requirements() -> dict:
    lines = [ln.split("#", 1)[0].strip() for ln in (REPO / "requirements.txt").read_text().splitlines()]
    return {_name(ln): ln.split(";")[0].strip() for ln in lines if ln}


def _conda_pip() -> list:
    text = (REPO / "environment.yml").read_text()
    pip = text.split("  - pip:\n", 1)[1]
    return [ln.strip()[2:].strip() for ln in pip.splitlines() if ln.strip().startswith("- ")]


def test_conda_environment_matches_requirements_and_installs_the_course():
    pip = _conda_pip()
    assert "-e ." in pip, "environment.yml must install the course itself (`- -e .` under pip:), as make setup does"
    conda = {_name(r): r for r in pip if r != "-e ."}
    reqs = {n: r for n, r in _requirements().items() if n != "tomli"}     # tomli: Python < 3.11 only
    assert conda == reqs, ("environment.yml's pip list and requirements.txt differ:\n"
                           f"  only in environment.yml: {sorted(set(conda) - set(reqs))}\n"
                           f"  only in requirements.txt: {sorted(set(reqs) - set(conda))}\n"
                           f"  different pins: {sorted(n for n in set(conda) & set(reqs) if conda[n] != reqs[n])}")


def test_pyproject_matches_requirements():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *project.get("optional-dependencies", {}).get("dev", [])]
    py = {_name(r): r.split(";")[0].strip() for r in declared}
    reqs = {n: r for n, r in _requirements().items()}
    assert py == reqs, ("pyproject.toml ([project] + [dev]) and requirements.txt differ:\n"
                        f"  only in pyproject.toml: {sorted(set(py) - set(reqs))}\n"
                        f"  only in requirements.txt: {sorted(set(reqs) - set(py))}\n"
                        f"  different pins: {sorted(n for n in set(py) & set(reqs) if py[n] != reqs[n])}")
