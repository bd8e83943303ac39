"""Grade a class: every submission in a folder, in parallel, into a CSV gradebook.

    python -m grading batch SUBMISSIONS/ -j 4 [--out OUT] [--hidden DIR] [--step N]

Each entry of SUBMISSIONS (a folder shaped like steps/, or holding steps/) is
graded by its own grader process (``python -m grading --impl ENTRY``), run from
its own copy of the grader, with its own timeout, so a submission that breaks
or rewrites its grader -- or anything else -- costs that row only. The gradebook is built from each grader's summary line on
its stdout, a pipe no worker can reach (workers write to files), not from
files a submission could overwrite.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from attnlib.contract import STEPS

REPO = Path(__file__).resolve().parent.parent


def submissions(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def snapshot(dst: Path) -> Path:
    """A private copy of the grader (attnlib/, capstone/, grading/) for one submission's grader to run from.

    A submission that rewrites the grader running it changes only its own copy (after the
    grader has loaded it, and the file check zeroes the step); the repository and the other
    submissions' graders never see it, and the check watches a tree nobody else edits."""
    if dst.exists():
        shutil.rmtree(dst)
    for pkg in ("attnlib", "capstone", "grading"):       # capstone: the model of steps 04/06's capstone group
        shutil.copytree(REPO / pkg, dst / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def grade_one(sub: Path, out: Path, args, timeout_s: float, release: list[int]) -> dict:
    with tempfile.TemporaryDirectory(prefix="grader-") as tmp:
        return _grade_one(sub, out, args, timeout_s, snapshot(Path(tmp) / "_grader"), release)


def _grade_one(sub: Path, out: Path, args, timeout_s: float, grader: Path, release: list[int]) -> dict:
    cmd = [sys.executable, "-m", "grading", "--impl", str(sub.resolve()), "--jobs", "1", "--quiet", "--summary-json",
           "--out", str((out / sub.name).resolve()), "--check-grader-files",
           "--release-steps", ",".join(map(str, release))]
    for opt in ("config", "hidden"):
        if getattr(args, opt):
            cmd += [f"--{opt}", str(Path(getattr(args, opt)).resolve())]
    if args.worker_user:
        cmd += ["--worker-user", args.worker_user]
    if args.budget_s:
        cmd += ["--budget-s", str(args.budget_s)]
    for s in args.step or []:
        cmd += ["--step", str(s)]
    t0 = time.monotonic()
    row = {"submission": sub.name, "points": 0.0, "max": None, "seconds": None, "steps": {}, "error": ""}
    try:
        proc = subprocess.run(cmd, cwd=grader, capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    except subprocess.TimeoutExpired:
        row["error"] = (f"the grader ran past {timeout_s:.0f} s (stopped or hung: by the submission?); "
                        "the other rows are not affected")
        return row
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("GRADING-SUMMARY ")), None)
    if line is None and proc.returncode < 0:
        try:
            sig = signal.Signals(-proc.returncode).name
        except ValueError:
            sig = f"signal {-proc.returncode}"
        row["error"] = (f"grader killed by {sig} (by the submission?): this row has no grade; "
                        "the other rows are not affected")
        return row
    if line is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        row["error"] = f"the grader failed (exit {proc.returncode}): {tail[0][:300]}"
        return row
    s = json.loads(line[len("GRADING-SUMMARY "):])
    row.update(points=s["points"], max=s["max"], steps=s["steps"], seconds=round(time.monotonic() - t0, 1))
    (out / sub.name).mkdir(parents=True, exist_ok=True)
    (out / sub.name / "table.txt").write_text(proc.stdout)
    return row


def write_gradebook(rows: list[dict], path: Path, steps: list[int]):
    cols = ["submission", "total", "max"]
    for n in steps:
        cols += [f"step{n:02d}", f"step{n:02d}_status"]
    cols += ["seconds", "first_failure"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for r in sorted(rows, key=lambda r: r["submission"]):
            line = [r["submission"], r["points"], r["max"] if r["max"] is not None else ""]
            first = r["error"]
            for n in steps:
                st = r["steps"].get(f"{n:02d}", {})
                line += [st.get("points", 0.0 if r["error"] else ""), st.get("status", "grader failed" if r["error"] else "")]
                if not first and st.get("message") and st.get("status") not in ("passed", "not released", "needs a GPU"):
                    first = f"step {n:02d}: {st['message']}"
            line += [r["seconds"] if r["seconds"] is not None else "", first]
            w.writerow(line)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m grading batch", description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="one subfolder per submission")
    ap.add_argument("-j", "--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                    help="submissions graded at once")
    ap.add_argument("--out", type=Path, default=REPO / "out" / "batch", help="gradebook.csv and one folder per submission")
    ap.add_argument("--config")
    ap.add_argument("--hidden")
    ap.add_argument("--worker-user", dest="worker_user")
    ap.add_argument("--step", action="append")
    ap.add_argument("--timeout", type=float, help="per submission (default: the budget + 60 s, or the sum of the "
                    "step timeouts + 60 s)")
    ap.add_argument("--budget-s", dest="budget_s", type=float,
                    help="each submission's grading budget, as on Gradescope (python -m grading --budget-s)")
    args = ap.parse_args(argv)
    from tqdm import tqdm

    from . import config as cfg
    conf = cfg.load(args.config, args.hidden)
    subs = submissions(args.folder)
    if not subs:
        print(f"no submissions (subfolders) in {args.folder}", file=sys.stderr)
        return 2
    timeout_s = args.timeout or (args.budget_s or sum(s.timeout_s for s in conf.steps.values())) + 60
    args.out.mkdir(parents=True, exist_ok=True)
    from .grade import released_steps
    release = released_steps()
    rows = []
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futs = {pool.submit(grade_one, s, args.out, args, timeout_s, release): s for s in subs}
        with tqdm(total=len(futs), desc="grading", unit="submission") as bar:
            for fut in as_completed(futs):
                try:
                    row = fut.result()
                except Exception as exc:  # never let one submission stop the rest
                    row = {"submission": futs[fut].name, "points": 0.0, "max": None, "seconds": None,
                           "steps": {}, "error": f"batch error: {exc!r}"}
                rows.append(row)
                bar.set_postfix_str(f"{row['submission']}: {row['points']}")
                bar.update()
    steps = sorted(STEPS) if not args.step else sorted({int(x) for s in args.step for x in str(s).split(",")})
    write_gradebook(rows, args.out / "gradebook.csv", steps)
    (args.out / "gradebook.json").write_text(json.dumps(sorted(rows, key=lambda r: r["submission"]), indent=1))
    print(f"{len(rows)} submissions graded; gradebook: {args.out / 'gradebook.csv'}")
    return 0
