"""Command line: ``python -m grading [grade options] | batch | autograder | release | doctor``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "out" / "grading"

from attnlib.contract import STEPS  # noqa: E402


def _steps(values):
    out = []
    for v in values or []:
        for part in str(v).split(","):
            if part.strip():
                n = int(part)
                if n not in STEPS:
                    raise argparse.ArgumentTypeError(f"no step {n}: steps are {min(STEPS)}-{max(STEPS)}")
                out.append(n)
    return sorted(set(out)) or None


def grade_main(argv) -> int:
    ap = argparse.ArgumentParser(prog="python -m grading",
                                 description="Grade a submission folder, step by step, each in its own worker.")
    ap.add_argument("--impl", default="steps", help="steps (your work, default), solutions, or a folder shaped like steps/")
    ap.add_argument("--step", action="append", help="grade only these steps (repeat, or 4,5)")
    ap.add_argument("--config", help="config file (default grading/config.toml)")
    ap.add_argument("--hidden", help="folder with hidden.toml: hidden tests merged in (instructors)")
    ap.add_argument("--jobs", "-j", type=int, help="steps graded at once (default: config)")
    ap.add_argument("--budget-s", type=float, help="the whole run's wall-clock budget: each step's timeout is cut to "
                    "what is left, a step that would start too late scores 0 as 'out of time', and results.json "
                    "is written after every step anyway (Gradescope: its timeout less a minute)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"where results.json and junit.xml go (default {DEFAULT_OUT.relative_to(REPO)})")
    ap.add_argument("--gradescope", type=Path, help="write Gradescope's results.json here (default OUT/results.json)")
    ap.add_argument("--junit", type=Path, help="write JUnit XML here (default OUT/junit.xml)")
    ap.add_argument("--worker-user", help="run the workers as this user (the grader must be root): Gradescope")
    ap.add_argument("--cache", help="compile caches kept across runs (default: out/grading/cache for steps/ and "
                    "solutions/, private to the run for any other folder, which may be a stranger's submission)")
    ap.add_argument("--check-grader-files", action="store_true",
                    help="score a step 0 if grading/, attnlib/ or the hidden tests change while its worker runs "
                         "(on in batch and on Gradescope; off by default, as colleagues may edit a working tree)")
    ap.add_argument("--release-steps", help=argparse.SUPPRESS)       # set by batch: its graders run from a snapshot
    ap.add_argument("--quiet", "-q", action="store_true", help="the table only, no failure reports")
    ap.add_argument("--summary-json", action="store_true", help="print one JSON summary line last (for batch)")
    args = ap.parse_args(argv)

    from . import config as cfg
    from .grade import Grader
    from .report import details, summary, table, write_all

    conf = cfg.load(args.config, args.hidden)
    cache = args.cache
    if cache is None and args.impl in ("steps", "solutions") and not args.worker_user:
        cache = str(DEFAULT_OUT / "cache")      # your own code: keep torch.compile's work between runs
    grader = Grader(conf, hidden=args.hidden, worker_user=args.worker_user, jobs=args.jobs, cache=cache,
                    check_files=args.check_grader_files, release=_steps([args.release_steps]) if args.release_steps else None,
                    budget_s=args.budget_s)
    results = args.gradescope or args.out / "results.json"
    junit_path = args.junit or args.out / "junit.xml"

    def so_far(partial):      # killed from outside, the run still leaves what it graded
        write_all(partial, results=results, per_group=conf.report_failures)

    try:
        g = grader.grade(args.impl, _steps(args.step), on_step=so_far)
    except FileNotFoundError as exc:
        print(f"grading: {exc}", file=sys.stderr)
        return 2
    write_all(g, results=results, junit_path=junit_path, per_group=conf.report_failures)
    print(table(g))
    if not args.quiet:
        d = details(g, conf.report_failures)
        if d:
            print("\n" + d)
    for note in g.notes:
        print(f"note: {note}")
    if not args.summary_json:
        print(f"\n{g.seconds:.0f} s. Results: {results}  JUnit: {junit_path}")
    else:
        print("GRADING-SUMMARY " + json.dumps(summary(g)))
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] == "batch":
        from .batch import main as batch_main
        return batch_main(argv[1:])
    if argv and argv[0] in ("autograder", "release"):
        if not (Path(__file__).parent / "package.py").exists():
            print(f"grading {argv[0]}: the course's packaging is not part of the student release", file=sys.stderr)
            return 2
        from .package import main as package_main
        return package_main(argv)
    if argv and argv[0] == "doctor":
        return doctor()
    if argv and argv[0] == "grade":
        argv = argv[1:]
    return grade_main(argv)


def doctor() -> int:
    """Which of the worker's protections are active on this machine."""
    from .sandbox import protections
    print("The grader's protections of a worker on this machine:")
    for name, active, how in protections():
        print(f"  [{'x' if active else ' '}] {name}  ({how})")
    return 0


def _exit(code: int):
    """Exit without the interpreter's teardown, once everything is written: after ``import torch`` that
    teardown is 0.5-0.7 s of CPU (measured 2026-12-03, 2-core CPU machine), paid once per submission in a
    batch (one grader process each) and per command in the grader's tests. The atexit handlers (temporary
    folders' finalizers among them) still run and the streams are flushed, as in a normal exit."""
    import atexit
    import os
    try:
        atexit._run_exitfuncs()
    finally:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:
                pass
        os._exit(0 if code is None else code if isinstance(code, int) else 1)


if __name__ == "__main__":
    _exit(main())
