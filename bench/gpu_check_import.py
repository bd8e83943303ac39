"""Bring a `make gpu-check` run from the lent H200 into the repository: ``bench/gpu_check_device.sh``
archives the run's folder into ``gc.tgz``; this puts each piece where the course keeps it.

    python -m bench.gpu_check_import /work/.device/N/gc.tgz

- ``results/h200/gpu-check/summary.json``: the run's summary; the one it replaces, if of another commit,
  is kept beside it as ``summary_<sha>.json``;
- the logs: ``grade_solutions.log``, ``grade_stubs.log``, ``pytest_notebooks.log``,
  ``pytest_grading_<sha>.log``, ``gc_run_<sha>.log`` (the run's own progress lines), ``bench_leaderboard/``
  and its log, and ``pytest_suite_summary.log``: of the suite's two pytest logs, their headers, every
  FAILED / ERROR line and their slowest durations (the whole logs are thousands of lines);
- the notebooks as executed on the GPU, into ``notebooks/executed/``.

It prints what the READMEs should now say (their figures are written by hand: see the list it prints).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SECTIONS = ("leaderboard_ms", "pytest", "grade_solutions", "grade_stubs")


def commit_of(summary: dict) -> str | None:
    """The summary's commit, short: the one its sections share (the first found, if they differ)."""
    for key in SECTIONS:
        c = (summary.get(key) or {}).get("commit")
        if c:
            return c.split("+")[0][:7]
    return None


def suite_summary(logs: list[Path]) -> str:
    """Each pytest log's first lines, its FAILED / ERROR lines and its slowest durations."""
    out = []
    for log in logs:
        if not log.exists():
            continue
        lines = log.read_text(errors="replace").splitlines()
        out.append(f"# {log.name}")
        out += lines[:3]
        out += [ln for ln in lines if ln.startswith(("FAILED", "ERROR"))]
        start = next((i for i, ln in enumerate(lines) if "slowest" in ln and "durations" in ln), None)
        if start is not None:
            out += lines[start:]
        elif lines:
            out.append(lines[-1])
    return "\n".join(out) + "\n"


def import_run(archive: Path, results: Path, executed: Path) -> dict:
    """Unpack ``archive`` (a gc.tgz) into ``results`` and ``executed``; returns what was done."""
    done = {"copied": [], "missing": [], "kept_previous": None}
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        found = sorted(Path(tmp).rglob("summary.json"))
        if not found:
            raise SystemExit(f"{archive}: no summary.json inside (did the run end before writing it? "
                             f"read gc_run.log in the archive)")
        src = found[0].parent
        summary = json.loads((src / "summary.json").read_text())
        sha = commit_of(summary)
        if sha is None:
            raise SystemExit(f"{archive}: its summary.json names no commit")
        results.mkdir(parents=True, exist_ok=True)
        old = results / "summary.json"
        if old.exists():
            old_sha = commit_of(json.loads(old.read_text()))
            if old_sha and old_sha != sha:
                keep = results / f"summary_{old_sha}.json"
                if not keep.exists():
                    old.rename(keep)
                    done["kept_previous"] = keep.name

        def put(name: str, dest_name: str | None = None, dest: Path = results):
            for candidate in (src / name, src / "grades" / name):
                if candidate.exists():
                    target = dest / (dest_name or name)
                    if candidate.is_dir():
                        shutil.copytree(candidate, target, dirs_exist_ok=True)
                    else:
                        shutil.copy2(candidate, target)
                    done["copied"].append(str(target.relative_to(REPO) if target.is_relative_to(REPO) else target))
                    return
            done["missing"].append(name)

        put("summary.json")
        for name in ("grade_solutions.log", "grade_stubs.log", "pytest_notebooks.log", "bench_leaderboard.log",
                     "bench_leaderboard"):
            put(name)
        put("pytest_grading.log", f"pytest_grading_{sha}.log")
        run_log = src / "gc_run.log"
        if run_log.exists():
            (results / f"gc_run_{sha}.log").write_text(
                "\n".join(ln for ln in run_log.read_text().splitlines() if ln.startswith("[gpu-check")) + "\n")
            done["copied"].append(f"gc_run_{sha}.log")
        suite_logs = [src / "pytest_suite.log", src / "pytest_suite_files.log"]
        if any(p.exists() for p in suite_logs):
            (results / "pytest_suite_summary.log").write_text(suite_summary(suite_logs))
            done["copied"].append("pytest_suite_summary.log")
        else:
            done["missing"].append("pytest_suite.log")
        notebooks = sorted((src / "executed").glob("*.ipynb"))
        if notebooks:
            executed.mkdir(parents=True, exist_ok=True)
            for nb in notebooks:
                shutil.copy2(nb, executed / nb.name)
            done["copied"].append(f"{len(notebooks)} notebooks into {executed}")
        else:
            done["missing"].append("executed/*.ipynb")
    done["sha"], done["summary"] = sha, summary
    return done


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("archive", type=Path, help="gc.tgz from bench/gpu_check_device.sh")
    ap.add_argument("--results", type=Path, default=REPO / "results" / "h200" / "gpu-check")
    ap.add_argument("--executed", type=Path, default=REPO / "notebooks" / "executed")
    args = ap.parse_args(argv)
    done = import_run(args.archive, args.results, args.executed)
    s, p = done["summary"], done["summary"].get("pytest") or {}
    lb = (s.get("leaderboard_ms") or {}).get("cs336_harness")
    print(f"gpu-check at {done['sha']}: complete {s.get('complete')}; pytest {p.get('passed')} passed, "
          f"{p.get('failed')} failed, {p.get('errors')} errors, {p.get('skipped')} skipped; solutions "
          f"{(s.get('grade_solutions') or {}).get('points')}, stubs {(s.get('grade_stubs') or {}).get('points')}; "
          f"CS336 harness {lb}")
    if p.get("not_passing"):
        print("not passing:", *p["not_passing"], sep="\n  ")
    if done["kept_previous"]:
        print(f"the previous summary kept as {done['kept_previous']}")
    print("copied:", *done["copied"], sep="\n  ")
    if done["missing"]:
        print("not in the archive:", *done["missing"], sep="\n  ")
    print("by hand: results/h200/gpu-check/README.md (its top), README.md ('Its state today' and the CS336 "
          "paragraph's figures), notebooks/README.md (the executed copies' run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
