"""Build the two things that leave the course repository.

    python -m grading autograder [--out dist/autograder.zip] [--hidden DIR] [--config FILE]
    python -m grading release --out DIR [--steps 1,2,3] [--zip] [--force]

The **autograder zip** follows Gradescope's specification: ``setup.sh`` and
``run_autograder`` at the root of the archive, the rest unpacked into
/autograder/source (attnlib/, grading/, the stubs in steps/ that define the
release, the hidden tests in hidden/). No solutions.

The **student release** is the course as a student gets it: the files named in
``RELEASE_FILES`` (an allow-list: nothing else), stubs regenerated from the
solutions, notebooks set to the student's code (``steps``), and its own README,
Makefile and CI script (grading/release/), whose ``make test`` tests ``steps/``.
It checks its own work and refuses to finish if any released file holds a line
of a solution region (grading/leaks.py), a solution file or a hidden test, or if a
released test or notebook names solutions/ (it would fail where there is none).
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
        for sub in ("attnlib", "capstone", "grading", "steps", "requirements.txt", "pyproject.toml"):
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

# What a student gets: an explicit list of the repository's files (globs; `*` crosses folders).
# A file joins the release only by being named here -- experiments, logs and new folders stay
# out until someone decides they belong. README.md, Makefile and .ci/run are written for the
# release (grading/release/), and steps/ is regenerated from the solutions.
RELEASE_FILES = [
    ".gitignore", "requirements.txt", "environment.yml", "pyproject.toml", "pytest.ini", "conftest.py",
    "attnlib/*.py",
    # The grader, for `make grade`; not the packaging, the leak check or the Gradescope scripts.
    "grading/__init__.py", "grading/__main__.py", "grading/batch.py", "grading/config.py",
    "grading/config.toml", "grading/evaluate.py", "grading/grade.py", "grading/report.py",
    "grading/sandbox.py", "grading/spec.py", "grading/worker.py", "grading/worker_reference.py", "grading/README.md",
    "notebooks/[0-9][0-9]_*.ipynb", "notebooks/[0-9][0-9]_*.py",   # the notebooks and their jupytext sources
    "tests/test_step[0-9][0-9]_*.py", "tests/test_contract.py", "tests/test_attnlib.py",
    "tests/test_notebooks.py", "tests/test_bench.py", "tests/test_ops.py", "tests/test_cs336.py", "tests/test_packaging.py",
    # The capstone: the dispatcher and the GPT, on the student's own steps.
    "capstone/*.py",
    # The benchmark harness; not the experiments (bench/experiments/, cuda_gpu.py hold whole kernels).
    "bench/__init__.py", "bench/__main__.py", "bench/core.py", "bench/plots.py", "bench/profiling.py",
    "bench/step04_figures.py",
    # Measured numbers and figures; no logs (test logs print the code around a failure).
    "results/h200/README.md", "results/h200/grid/*", "results/h200/sweep/*", "results/h200/leaderboard/*",
    "results/h200/step04/step04_figures.*", "results/h200/step07_cuda.json", "results/h200/triton/README.md",
    "results/h200/triton/*.json",
    # ... and what the notebooks read (tests/test_release.py checks the list covers it).
    "results/h200/triton_gpu.json", "results/h200/triton_gpu_tuning.json", "results/h200/triton_leaderboard_sweep.json",
    "results/h200/step07_ptxas.txt", "results/h200/step07_ncu_v3_vs_sdpa_flash.txt",
    "results/h200/step07_v4/ncu/summary.json", "results/h200/step07_v5/cuda_v5.json",
    "results/h200/gpu-check/cs336_harness*.json", "results/h200/gpu-check/summary*.json",
    "results/h200/gpu-check/cs336_fwd_opaque_*/cs336_harness*.json",   # the compiled forward's A/B (notebook 06 §9)
    "results/h200/varlen/*.json", "results/h200/sparse/*.json", "results/h200/ring/ring.json",
    "results/h200/ring/ring.png", "results/h200/ring/README.md", "results/h200/host/*.json", "results/h200/host/README.md",
    "results/h200/capstone/*.json", "results/h200/capstone/*.png", "results/h200/capstone/README.md",
    "results/h200/step07_bwd_wgmma/cuda_bwd_wgmma.json",   # step 07's backward v3 (notebook 07 reads it)
    "results/h200/step07_v6/cuda_v6.json",                 # step 07's forward v6 (notebook 07 reads it)
    "results/h200/triton/ncu/summary.json",                # ncu of steps 05/06 against cuDNN (notebook 06 reads it)
    "results/h200/triton/ncu_c4k/summary.json",            # the same at N=4096 causal (notebook 06 reads it)
]
# Never, whatever the list above says: a second lock. Among them the maintainers' tests, which check
# solutions/ itself (test_stubs, test_notebooks_solutions): the release has no solutions/.
NEVER = ["solutions/*", "notebooks/executed/*", "hidden/*", "*hidden.toml", "tests/grading_fixtures/*", "tests/test_grading*.py",
         "tests/test_stubs.py", "tests/test_notebooks_solutions.py", "tests/test_release.py", "*.log",
         "grading/gradescope/*", "grading/leaks.py",
         "grading/package.py", "grading/release/*"]
RELEASE_TEMPLATES = HERE / "release"          # README.md, Makefile, ci_run: the release's own


def _repo_files() -> list[str]:
    """Tracked files and untracked ones git does not ignore (the working tree as it stands)."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                             cwd=REPO, capture_output=True, check=True).stdout.decode()
        files = [f for f in out.split("\0") if f and (REPO / f).is_file()]
    except (OSError, subprocess.CalledProcessError):
        files = [p.relative_to(REPO).as_posix() for p in _files(REPO, ".")]
    return sorted(set(files))


def _released(rel: str, extra_never: list[str]) -> bool:
    return (any(fnmatch.fnmatch(rel, pat) for pat in RELEASE_FILES)
            and not any(fnmatch.fnmatch(rel, pat) for pat in NEVER + extra_never))


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


def _readme_sections(text: str) -> dict[str, str]:
    """The course README's `## ` sections by title (the part before the first one under "")."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    out = {"": parts[0]}
    for title, body in zip(parts[1::2], parts[2::2]):
        out[title.strip()] = f"## {title.strip()}{body}"
    return out


def release_readme(course_readme: str, template: str) -> str:
    """The release's README: the template, with `{{section: TITLE}}` replaced by that section of the
    course's README (so the step table and the measurements are written once)."""
    sections = _readme_sections(course_readme)

    def sub(m):
        title = m.group(1).strip()
        if title not in sections:
            raise PackageError(f"grading/release/README.md wants the section {title!r}, which README.md lacks")
        return sections[title].rstrip() + "\n"
    return re.sub(r"^\{\{section: (.+?)\}\}$", sub, template, flags=re.M)


def build_release(out: Path, steps: list[int] | None = None, force: bool = False,
                  exclude: list[str] | None = None) -> dict:
    """Write the student release to ``out``; returns a small report. Refuses (PackageError) to
    finish if any released file holds a solution line (grading/leaks.py)."""
    from attnlib import stubgen

    from . import config as cfg
    out = Path(out).resolve()
    if out == REPO or REPO in out.parents and not out.is_relative_to(REPO / "out"):
        raise PackageError("write the release outside the repository (or under out/)")
    if out.exists():
        if not force and any(out.iterdir()):
            raise PackageError(f"{out} exists and is not empty (use --force to replace it)")
        shutil.rmtree(out)
    extra_never = list(exclude if exclude is not None else cfg.load().release_exclude)
    try:
        return _build_release(out, steps, extra_never)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)       # a release that failed its checks is not left to be zipped
        raise


def _build_release(out: Path, steps: list[int] | None, extra_never: list[str]) -> dict:
    from attnlib import stubgen
    report = {"copied": 0, "excluded": [], "notebooks_switched": [], "stubs": [], "written": []}
    for rel in _repo_files():
        n = _step_of(rel)
        if (not _released(rel, extra_never)
                or steps and n is not None and n not in steps and rel.startswith(("notebooks/", "tests/"))):
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
        (out / "steps").mkdir()
        report["stubs"] = stubgen.write(sol, out / "steps", force=True)
        problems = stubgen.drift(sol, out / "steps")
        if problems:
            raise PackageError("the release's stubs do not match the solutions: " + "; ".join(problems))

    for nb in sorted((out / "notebooks").glob("*.ipynb")) if (out / "notebooks").exists() else []:
        if _student_notebook(nb):
            report["notebooks_switched"].append(nb.name)

    # The release's own README, Makefile and CI script: they speak of steps/ only.
    (out / "README.md").write_text(release_readme((REPO / "README.md").read_text(),
                                                  (RELEASE_TEMPLATES / "README.md").read_text()))
    shutil.copyfile(RELEASE_TEMPLATES / "Makefile", out / "Makefile")
    (out / ".ci").mkdir(exist_ok=True)
    shutil.copyfile(RELEASE_TEMPLATES / "ci_run", out / ".ci" / "run")
    os.chmod(out / ".ci" / "run", 0o755)
    report["written"] = ["README.md", "Makefile", ".ci/run"]

    report["leaks_allowed"] = verify_release(out)         # the leak check first: it matters most
    named = [p.relative_to(out).as_posix() for p in sorted([*out.glob("tests/*.py"), *out.glob("notebooks/*.py"),
                                                             *out.glob("notebooks/*.ipynb")])
             if p.name != "conftest.py" and _mentions_solutions(_code_of(p))]
    if named:
        raise PackageError(f"released tests or notebooks name solutions/, which the release lacks: {', '.join(named)}")
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


def verify_release(out: Path, solutions: Path = REPO / "solutions") -> list[str]:
    """Raise PackageError if the release at ``out`` holds a solution, a hidden test, the grader's
    fixtures, a region marker, or any line of a solution region (grading/leaks.py). Returns the
    allowed matches that were found (grading.leaks.ALLOWED), for the report."""
    from . import leaks as lk
    found = []
    for p in _files(out, "."):
        rel = p.relative_to(out).as_posix()
        if rel.startswith("solutions/") or p.name == "hidden.toml" or "grading_fixtures" in rel:
            found.append(rel)
        elif (rel.startswith(("steps/", "notebooks/")) and p.suffix in (".py", ".cu", ".cuh", ".cpp", ".h", ".ipynb")
              and REGION.search(_code_of(p))):
            found.append(f"{rel} (a solution region's marker)")
        elif p.suffix == ".ipynb" and re.search(r"""ATTN_IMPL["']\s*,\s*["']solutions""", _code_of(p)):
            found.append(f"{rel} (defaults to solutions/)")
    leaks, stale = lk.scan(out, solutions)
    found += [str(x) for x in leaks]
    if found:
        raise PackageError(f"the release would leak ({len(found)}):\n  " + "\n  ".join(found[:40])
                           + ("\n  ..." if len(found) > 40 else ""))
    return [f"{g}: {line}" for g, line, _ in lk.ALLOWED if (g, line) not in {(a, b) for a, b, _ in stale}]


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
    print(f"{a.out}: {rep['copied']} files copied, {len(rep['stubs'])} stubs regenerated, "
          f"{', '.join(rep['written'])} written for the release; {len(rep['excluded'])} files not in the release's "
          f"list; notebooks switched to steps/: {rep['notebooks_switched'] or 'none needed'}; "
          "no solution line in any released file (grading/leaks.py), no released test or notebook names solutions/")
    for a_ in rep["leaks_allowed"]:
        print(f"allowed on purpose: {a_}")
    if a.zip:
        z = shutil.make_archive(str(a.out), "zip", root_dir=a.out.parent, base_dir=a.out.name)
        print(f"and {z}")
    return 0
