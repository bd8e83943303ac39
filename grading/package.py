"""Build the two things that leave the course repository.

    python -m grading autograder [--out dist/autograder.zip] [--hidden DIR] [--config FILE]
    python -m grading release --out DIR [--steps 1,2,3] [--zip] [--force]

The **autograder zip** follows Gradescope's specification: ``setup.sh`` and
``run_autograder`` at the root of the archive, the rest unpacked into
/autograder/source (attnlib/, grading/, the stubs in steps/ that define the
release, the hidden tests in hidden/). No solutions.

The **student release** is the repository as a student gets it: no solutions/,
no hidden tests, no grader self-tests, stubs regenerated from the solutions,
notebooks set to the student's code (``steps``), and a Makefile whose
``make test`` tests ``steps/``. It checks its own work and refuses to finish if a
solution region or a hidden file slipped through.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
SKIP_DIRS = {"__pycache__", ".pytest_cache", ".ipynb_checkpoints", ".git", ".venv", "out", "dist", "build"}
STEP_RE = re.compile(r"step(\d\d)")


class PackageError(Exception):
    pass


def _files(root: Path, sub: str):
    base = root / sub
    if base.is_file():
        yield base
        return
    for dirpath, dirnames, names in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for n in sorted(names):
            if not n.endswith((".pyc", ".so")):
                yield Path(dirpath) / n


# ---------------------------------------------------------------------------
# Gradescope
# ---------------------------------------------------------------------------

def build_autograder(out: Path, hidden: Path | None = None, config: Path | None = None) -> list[str]:
    """Write the Gradescope autograder zip; returns its member names."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if hidden is not None and not (Path(hidden) / "hidden.toml").exists():
        raise PackageError(f"{hidden}: a hidden-test folder needs a hidden.toml")
    members = []

    def add(zf, path: Path, arc: str, executable=False):
        info = zipfile.ZipInfo(arc, date_time=(2020, 1, 1, 0, 0, 0))
        mode = 0o755 if executable or os.access(path, os.X_OK) else 0o644
        info.external_attr = (stat.S_IFREG | mode) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        zf.writestr(info, path.read_bytes())
        members.append(arc)

    with zipfile.ZipFile(out, "w") as zf:
        add(zf, HERE / "gradescope" / "setup.sh", "setup.sh", executable=True)
        add(zf, HERE / "gradescope" / "run_autograder", "run_autograder", executable=True)
        for sub in ("attnlib", "grading", "steps", "requirements.txt", "pyproject.toml"):
            for p in _files(REPO, sub):
                rel = p.relative_to(REPO).as_posix()
                if rel == "grading/config.toml" and config:
                    p = Path(config)
                add(zf, p, rel)
        if hidden:
            for p in _files(Path(hidden), "."):
                add(zf, p, "hidden/" + p.relative_to(Path(hidden)).as_posix())
    bad = [m for m in members if m.startswith("solutions/")]
    if bad:
        raise PackageError(f"solutions in the autograder zip: {bad[:3]}")
    return members


# ---------------------------------------------------------------------------
# The student release
# ---------------------------------------------------------------------------

def _repo_files() -> list[str]:
    """Tracked files and untracked ones git does not ignore (the working tree as it stands)."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                             cwd=REPO, capture_output=True, check=True).stdout.decode()
        files = [f for f in out.split("\0") if f and (REPO / f).is_file()]
    except (OSError, subprocess.CalledProcessError):
        files = [p.relative_to(REPO).as_posix() for p in _files(REPO, ".")]
    return sorted(set(files))


def _excluded(rel: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(rel, pat) or fnmatch.fnmatch(rel, pat.rstrip("/*") + "/*") for pat in patterns)


def _step_of(rel: str) -> int | None:
    m = STEP_RE.search(Path(rel).name) or STEP_RE.search(rel)
    if m:
        return int(m.group(1))
    m = re.match(r"notebooks/(\d\d)_", rel)
    return int(m.group(1)) if m else None


NOTEBOOK_SWITCHES = [
    (re.compile(r"""(ATTN_IMPL["']\s*,\s*["'])solutions(["'])"""), r"\1steps\2"),
    (re.compile(r"""^(\s*IMPL\s*=\s*["'])solutions(["'])""", re.M), r"\1steps\2"),
    (re.compile(r"""(setup\(\s*(?:impl\s*=\s*)?["'])solutions(["'])"""), r"\1steps\2"),
]


def _student_notebook(path: Path) -> bool:
    """Point a notebook at the student's code and strip outputs; True if it changed."""
    nb = json.loads(path.read_text())
    changed = False
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        src = "".join(cell.get("source", []))
        new = src
        for pat, rep in NOTEBOOK_SWITCHES:
            new = pat.sub(rep, new)
        if new != src:
            cell["source"] = new.splitlines(keepends=True)
            changed = True
        if cell.get("outputs") or cell.get("execution_count") is not None:
            cell["outputs"], cell["execution_count"] = [], None
            changed = True
    if changed:
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    return changed


def build_release(out: Path, steps: list[int] | None = None, force: bool = False,
                  exclude: list[str] | None = None) -> dict:
    """Write the student release to ``out``; returns a small report."""
    from attnlib import stubgen

    from . import config as cfg
    out = Path(out).resolve()
    if out.exists():
        if not force and any(out.iterdir()):
            raise PackageError(f"{out} exists and is not empty (use --force to replace it)")
        shutil.rmtree(out)
    if out == REPO or REPO in out.parents and not out.is_relative_to(REPO / "out"):
        raise PackageError("write the release outside the repository (or under out/)")
    patterns = list(exclude if exclude is not None else cfg.load().release_exclude)
    patterns += ["solutions/*", "**/hidden.toml", "hidden/*"]
    report = {"copied": 0, "excluded": [], "notebooks_switched": [], "stubs": []}
    for rel in _repo_files():
        n = _step_of(rel)
        skip = _excluded(rel, patterns) or (steps and n is not None and n not in steps
                                            and rel.startswith(("steps/", "notebooks/", "tests/")))
        if skip:
            report["excluded"].append(rel)
            continue
        dst = out / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dst)
        report["copied"] += 1

    # Stubs: regenerated from the solutions (of the chosen steps only), whatever steps/ held.
    with tempfile.TemporaryDirectory() as tmp:
        sol = Path(tmp) / "solutions"
        for p in _files(REPO, "solutions"):
            rel = p.relative_to(REPO / "solutions").as_posix()
            n = _step_of(rel)
            if steps and n is not None and n not in steps:
                continue
            (sol / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p, sol / rel)
        if (out / "steps").exists():
            shutil.rmtree(out / "steps")
        (out / "steps").mkdir()
        report["stubs"] = stubgen.write(sol, out / "steps", force=True)
        problems = stubgen.drift(sol, out / "steps")
        if problems:
            raise PackageError("the release's stubs do not match the solutions: " + "; ".join(problems))

    for nb in sorted((out / "notebooks").glob("*.ipynb")) if (out / "notebooks").exists() else []:
        if _student_notebook(nb):
            report["notebooks_switched"].append(nb.name)

    # make test in a release tests the student's steps/: there is no solutions/ to test.
    for rel in ("Makefile", ".ci/run"):
        p = out / rel
        if p.exists():
            text = p.read_text()
            new = text.replace("--impl solutions", "--impl steps")
            if new != text:
                p.write_text(new)
                report.setdefault("retargeted", []).append(rel)

    _verify_release(out)
    report["warnings"] = [f"{p.relative_to(out).as_posix()} still refers to solutions/ (it will fail in the release)"
                          for p in sorted([*out.glob("tests/*.py"), *out.glob("notebooks/*.ipynb")])
                          if p.name != "conftest.py" and _mentions_solutions(_code_of(p))]
    return report


REGION = re.compile(r"^\s*(#|//) (>>> STUDENT:|<<< STUDENT)|SOLUTION-ONLY\s*$", re.M)


def _code_of(p: Path) -> str:
    if p.suffix != ".ipynb":
        return p.read_text(errors="replace")
    nb = json.loads(p.read_text())
    return "\n".join("".join(c.get("source", [])) for c in nb.get("cells", []) if c.get("cell_type") == "code")


def _mentions_solutions(code: str) -> bool:
    """Code (not comments) that names the solutions folder."""
    lines = (re.sub(r"(^|\s)#.*$", "", ln) for ln in code.splitlines())
    return any(re.search(r"""["']solutions["']|/ ?["']solutions""", ln) for ln in lines)


def _verify_release(out: Path):
    leaks = []
    for p in _files(out, "."):
        rel = p.relative_to(out).as_posix()
        if rel.startswith("solutions/") or p.name == "hidden.toml" or "grading_fixtures" in rel:
            leaks.append(rel)
        elif rel.startswith(("steps/", "notebooks/")) and p.suffix in (".py", ".cu", ".cuh", ".cpp", ".h", ".ipynb"):
            code = _code_of(p)
            if REGION.search(code):
                leaks.append(f"{rel} (a solution region)")
            if p.suffix == ".ipynb" and re.search(r"""ATTN_IMPL["']\s*,\s*["']solutions""", code):
                leaks.append(f"{rel} (defaults to solutions/)")
    if leaks:
        raise PackageError("the release would leak: " + ", ".join(leaks[:10]))


# ---------------------------------------------------------------------------

def main(argv) -> int:
    cmd, rest = argv[0], argv[1:]
    if cmd == "autograder":
        ap = argparse.ArgumentParser(prog="python -m grading autograder", description="Build the Gradescope autograder zip.")
        ap.add_argument("--out", type=Path, default=REPO / "dist" / "autograder.zip")
        ap.add_argument("--hidden", type=Path, help="folder with hidden.toml (and any data it needs)")
        ap.add_argument("--config", type=Path, help="a config to ship instead of grading/config.toml")
        a = ap.parse_args(rest)
        try:
            members = build_autograder(a.out, a.hidden, a.config)
        except PackageError as exc:
            print(f"autograder: {exc}", file=sys.stderr)
            return 1
        print(f"{a.out}: {len(members)} files (setup.sh and run_autograder at the root"
              + (", hidden tests in hidden/" if a.hidden else ", no hidden tests") + ")")
        return 0
    ap = argparse.ArgumentParser(prog="python -m grading release", description="Build the student release.")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", help="only these steps, e.g. 1,2,3 (default: every step in solutions/)")
    ap.add_argument("--zip", action="store_true", help="also write OUT.zip")
    ap.add_argument("--force", action="store_true", help="replace OUT if it exists")
    a = ap.parse_args(rest)
    steps = sorted({int(x) for x in a.steps.split(",")}) if a.steps else None
    try:
        rep = build_release(a.out, steps, a.force)
    except PackageError as exc:
        print(f"release: {exc}", file=sys.stderr)
        return 1
    print(f"{a.out}: {rep['copied']} files, {len(rep['stubs'])} stubs regenerated, "
          f"{len(rep['excluded'])} left out (solutions, hidden and grader tests...); notebooks switched to "
          f"steps/: {rep['notebooks_switched'] or 'none needed'}; retargeted to steps/: {rep.get('retargeted', [])}")
    for w in rep["warnings"]:
        print(f"warning: {w}")
    if a.zip:
        z = shutil.make_archive(str(a.out), "zip", root_dir=a.out.parent, base_dir=a.out.name)
        print(f"and {z}")
    return 0
