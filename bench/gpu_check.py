"""`make gpu-check`: the course's truth on one GPU.

    python -m bench.gpu_check [--parts lb,tests,grade] [--out results/h200/gpu-check] [--lb-rep-ms 10000]

Three parts, the timings first on an idle GPU, then the tests and the grader side by side; each updates its own
section of ``summary.json`` (with its own commit and date), so a machine that limits one command's
time (the course's H200 lends 10 minutes a command) runs them as separate calls:
  lb     the CS336 leaderboard shape (B=1, H=16, N=16384, D=64, bf16, causal, forward + backward)
         in CS336's own harness: ``torch.compile(Function.apply)``, ``o = f(q, k, v, True)``,
         ``o.sum().backward()``, ``triton.testing.do_bench(rep=10000, warmup=1000)``, its mean;
         step 06, SDPA's FLASH backend and cuDNN's, in the same run; then the same shape in the
         course's harness (``python -m bench leaderboard``: a random dO, the median);
  tests  the whole test suite against solutions/, in parallel (pytest-xdist: the grader's tests in a run
         of their own, since they share one session fixture that grades every planted submission; every
         other test spread one by one, but for the few files with a costly module fixture, which run
         beside them one file a worker), the compiled-model tests counted apart;
  grade  the grader on solutions/ (full marks expected) and on the stubs (0 expected). With the tests'
         grading run in the same call, read from that run's two whole-class grades
         (tests/test_grading.py: solutions/ with the hidden fixtures, the committed steps/; the tests hand
         their output over through GPU_CHECK_GRADES) rather than graded twice more beside them; alone, or
         with --separate-grades, the grader on solutions/ and on pristine stubs generated from solutions/
         into a scratch folder, the two side by side.

One command fits the course's lent H200 (10 minutes a command) again since ab83369, where the three
parts took 455 s with setup (lb 67 s, tests 356: the suite spread test by test, not one file a worker).
There, `bench/gpu_check_device.sh` is that one command (setup, the three parts, the --out folder archived:
the device returns only a few files), and `python -m bench.gpu_check_import gc.tgz` puts it in place here.

Before that, the whole check stopped fitting one command at 78da36d:
the grader's tests ran past their 440 s with three left (the full-marks test alone took 391 s beside
the grade part's own two whole-class runs). The grade part now reads those from the grading tests instead
(above), which takes two of the four whole-class runs off the machine; where it still does not fit, two
commands, the second merging into the first's summary (same commit, or the first's parts are dropped,
never mixed):

    GPU_CHECK_COMMIT=<sha> python -m bench.gpu_check --parts lb,tests --tests-runs suite,notebooks --out DIR
    # bring DIR/summary.json back (here: results/h200/gpu-check/summary.json), then
    GPU_CHECK_COMMIT=<sha> python -m bench.gpu_check --parts tests,grade --tests-runs grading \
        --merge-from results/h200/gpu-check/summary.json --out DIR2

Exit status 0 only when every part asked for is complete and green: the tests have no failure
and no error, the solutions get full marks, the stubs 0. ``summary.json`` says ``"complete": true``
only when all three parts ran at the same commit and passed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable


def log(msg):
    print(f"[gpu-check {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def cs336_leaderboard(rep_ms: int, warmup_ms: int) -> dict:
    """Milliseconds per forward+backward, timed exactly as CS336's README times its leaderboard."""
    import torch
    import torch.nn.functional as F
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attnlib.loader import load_step

    step06 = load_step(6, "solutions")
    torch.manual_seed(0)
    n_heads, d_head, seq = 16, 64, 16384
    q, k, v = torch.randn(3, n_heads, seq, d_head, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def sdpa(q, k, v, is_causal):         # the fused backends take (B, H, N, D): a batch of 1
        return F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=is_causal)[0]

    out = {}
    # SDPA runs eagerly inside sdpa_kernel: compiled, the backend switch was not honored (the
    # "cuDNN" row timed FLASH, 7.15 ms both, H200 2026-11-30), and a single aten call gains nothing.
    every = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    for name, fn, backends in (("step06", torch.compile(step06.FlashAttentionTriton.apply), every),
                               ("sdpa_flash", sdpa, [SDPBackend.FLASH_ATTENTION]),
                               ("sdpa_cudnn", sdpa, [SDPBackend.CUDNN_ATTENTION])):
        flash = fn

        def flash_forward_backward():
            o = flash(q, k, v, True)
            loss = o.sum()
            loss.backward()

        try:
            with sdpa_kernel(backends):
                out[name] = round(float(triton.testing.do_bench(flash_forward_backward, rep=rep_ms,
                                                                warmup=warmup_ms)), 4)
        except Exception as err:  # noqa: BLE001 - a backend that refuses is recorded, not fatal
            out[name] = f"error: {type(err).__name__}: {str(err)[:200]}"
        log(f"CS336 harness {name}: {out[name]}")
        q.grad = k.grad = v.grad = None
    return out


def bench_leaderboard(out_dir: Path) -> dict:
    """The course's own harness: python -m bench leaderboard (median of do_bench, a random dO)."""
    run = subprocess.run([PY, "-m", "bench", "leaderboard", "--impls", "sdpa-flash,sdpa-cudnn,step06",
                          "--out", str(out_dir / "bench_leaderboard"), "--budget-s", "60"],
                         cwd=REPO, capture_output=True, text=True, timeout=240)
    (out_dir / "bench_leaderboard.log").write_text(run.stdout + run.stderr)
    res = {}
    try:
        for r in json.loads((out_dir / "bench_leaderboard" / "results.json").read_text()):
            if r.get("mode") == "fwd+bwd" and r.get("status") == "ok":
                res[r["impl"].replace("-", "_")] = round(float(r["ms"]), 4)
    except (OSError, ValueError, KeyError) as err:
        res["error"] = f"{type(err).__name__}: {err}"
    return res


def junit_counts(path: Path) -> dict:
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failures = []
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        if not case.get("name"):
            # A nameless case: what pytest writes for a run stopped mid-test (SIGINT at the budget);
            # at 78da36d one counted as a pass. Not a test.
            continue
        name = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None:
            counts["failed"] += 1
            failures.append(name)
        elif case.find("error") is not None:
            counts["errors"] += 1
            failures.append(name)
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    counts["not_passing"] = failures[:50]
    compiled = [c for c in root.iter("testcase") if c.get("name") and "compiled_block" in (c.get("name") or "")
                or "compiled_apply" in (c.get("name") or "")]
    counts["compiled_model"] = {
        "tests": len(compiled),
        "passed": sum(1 for c in compiled if c.find("failure") is None and c.find("error") is None
                      and c.find("skipped") is None)}
    return counts


def grade_json(stdout: str) -> dict:
    for line in reversed(stdout.strip().splitlines()):
        if not line.startswith("GRADING-SUMMARY "):
            continue
        try:
            s = json.loads(line[len("GRADING-SUMMARY "):])
        except ValueError:
            continue
        if isinstance(s, dict) and "points" in s:
            return {"points": s["points"], "max": s["max"], "steps": s.get("steps")}
    return {"points": None, "max": None, "error": "no summary line"}


PARTS = ("lb", "tests", "grade")
GRADE_TESTS = {"grade_solutions": "tests/test_grading.py::test_solutions_score_full_marks (solutions/, with the hidden fixtures)",
               "grade_stubs": "tests/test_grading.py::test_stubs_score_zero_not_implemented (steps/, the committed stubs)"}


def grades_from_tests(folder: Path, out: Path) -> dict:
    """The grade part's two results, read from what the grading tests' whole-class runs printed
    (tests/test_grading.py ``keep_for_gpu_check``); copied to ``out`` as grade_*.log."""
    grades = {}
    for name, how in GRADE_TESTS.items():
        path = folder / f"{name}.log"
        if not path.exists():
            grades[name] = {"points": None, "max": None, "how": how,
                            "error": "the grading test did not write its grade: it did not run, or not to its end"}
            continue
        text = path.read_text()
        (out / f"{name}.log").write_text(text)
        grades[name] = dict(grade_json(text), how=how)
    return grades


def stop(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """Interrupt like Ctrl-C (pytest still writes its summary and junit file), then kill the whole
    process group: xdist's workers and the grader's workers die with their parent only if asked."""
    import signal
    try:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=grace_s)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


TEST_RUNS = ("suite", "grading", "notebooks")
# Test files with a costly module fixture (step 10's gloo process groups, the nvcc builds of the CUDA
# experiments): the suite runs them in a pytest of their own, one file a worker, so each is built once,
# and spreads every other test one by one. (pytest-xdist's `--dist loadgroup` would keep them together
# in one run, but under pytest 9.2 it silently stops grouping: pytest-dev/pytest-xdist#1386.)
# tests/test_gpu_check_merge.py checks that every test file with a module fixture is named here.
ONE_WORKER_FILES = ("tests/test_step10_ring.py", "tests/test_experiment_cuda_bwd_wgmma.py",
                    "tests/test_experiment_cuda_v5.py", "tests/test_experiment_cuda_v6.py")
# Workers a run gets, in proportion, among the runs asked for (all three: 9 / 5 / 2 of 16). At 3133c1d
# on the H200 the runs' tests added up to 2228 s (suite), 1396 (grading; its longest test 263) and 537
# (notebooks) of worker time: 9 (8 + 1) / 5 / 2 workers give each about 280, 280 and 270 s. At ab83369
# (7 + 2 / 5 / 2, one command): 350, 79, 321 and 233 s.
_RUN_WEIGHT = {"suite": 9, "grading": 5, "notebooks": 2}


def run_tests(out: Path, workers: int, budget_s: float, env: dict, which=TEST_RUNS) -> dict:
    """Up to three pytest runs side by side: tests/test_grading.py with its tests spread one by one
    (each grades its own planted submission), tests/test_notebooks.py one notebook a worker, and the
    suite: every other test spread one by one (worksteal, as `make test`), in two pytest processes, the
    second for ``ONE_WORKER_FILES``, one file a worker, so their module fixtures are built once.

    Returns ``{"runs": {name: counts}}``, one entry per run asked for (``total_of`` adds them up; the
    suite's two processes are one run).
    """
    which = [w for w in TEST_RUNS if w in which]
    weight = sum(_RUN_WEIGHT[w] for w in which)
    share = {w: max(2, round(workers * _RUN_WEIGHT[w] / weight)) for w in which}
    n_suite = share.get("suite", 4)
    # one worker: at ab83369 these files took 79 s on two while the rest of the suite ran 350 s on seven
    n_files = 1
    # name -> the pytest processes of that run: (log/junit stem, pytest arguments)
    runs = {"suite": [
                # worksteal, not loadfile (one file a worker, before 12-02): at 3133c1d step 06's file alone
                # (337 s of worker time) was the suite's whole length (365 s), where its 2228 s over 11
                # workers needed ~200; worksteal: an idle worker takes queued tests over
                ("suite", ["--ignore", "tests/test_grading.py", "--ignore", "tests/test_notebooks.py",
                           *[a for f in ONE_WORKER_FILES for a in ("--ignore", f)],
                           "-n", str(max(2, n_suite - n_files)), "--dist", "worksteal"]),
                ("suite_files", [*ONE_WORKER_FILES, "-n", str(n_files), "--dist", "loadfile"])],
            # worksteal (as `make test`): at 68c429b, under `load`, the worker busy with the full-marks test
            # (332 s) held the two tests queued behind it after the other workers had finished theirs, and
            # the last was cut by the budget; under worksteal an idle worker takes queued tests over
            "grading": [("grading", ["tests/test_grading.py", "-n", str(share.get("grading", 2)), "--dist", "worksteal"])],
            # every notebook executed as Jupyter would, on the GPU: one a worker (one file, so not loadfile)
            "notebooks": [("notebooks", ["tests/test_notebooks.py", "-n", str(share.get("notebooks", 2)), "--dist", "load"])]}
    procs = []
    for name in which:
        for stem, extra in runs[name]:
            junit = out / f"pytest_{stem}.xml"
            junit.unlink(missing_ok=True)
            log(f"tests ({stem}): pytest {' '.join(extra)}, at most {budget_s:.0f} s")
            f = open(out / f"pytest_{stem}.log", "w")
            # -v: a run stopped at its budget still says which tests ended; --timeout (pytest-timeout,
            # where installed): a test that hangs fails with its stack instead of stopping the run.
            timeout = ["--timeout", "300"] if importlib.util.find_spec("pytest_timeout") else []
            proc = subprocess.Popen([PY, "-m", "pytest", "--impl", "solutions", "-v", "-rfE", "-p", "no:cacheprovider",
                                     "--durations=25", *timeout, f"--junitxml={junit}", *extra],
                                    cwd=REPO, stdout=f, stderr=subprocess.STDOUT,
                                    # the notebooks as executed on this GPU, kept (issue 13: notebooks/executed/)
                                    env=dict(env, ATTN_EXECUTED_DIR=str(out / "executed")) if name == "notebooks" else env,
                                    start_new_session=True)
            procs.append((name, stem, proc, f, junit))
    t0 = time.monotonic()
    res = {"runs": {}}
    for name, stem, proc, f, junit in procs:
        r = {"passed": None, "failed": None, "errors": None, "skipped": None, "not_passing": [],
             "compiled_model": {"tests": 0, "passed": 0}, "interrupted": False}
        try:
            proc.wait(timeout=max(5.0, budget_s - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            stop(proc)
            log(f"tests ({stem}): out of time, interrupted (the counts are of the tests that ended)")
            r["interrupted"] = True
        f.close()
        lines = [ln for ln in (out / f"pytest_{stem}.log").read_text().strip().splitlines() if ln.startswith("=")]
        r["last_line"] = lines[-1] if lines else ""
        log(f"pytest ({stem}): {r['last_line']}")
        if not junit.exists():
            r["error"] = f"no junit file from the {stem} run."
        else:
            r.update(junit_counts(junit))
        res["runs"][name] = _add_counts(res["runs"][name], r) if name in res["runs"] else r
    return res


def _add_counts(a: dict, b: dict) -> dict:
    """One run's counts from its two pytest processes' (the suite's): sums, the last lines joined."""
    out = dict(a)
    for key in ("passed", "failed", "errors", "skipped"):
        out[key] = None if a.get(key) is None or b.get(key) is None else a[key] + b[key]
    out["not_passing"] = (a.get("not_passing") or []) + (b.get("not_passing") or [])
    out["compiled_model"] = {k: a.get("compiled_model", {}).get(k, 0) + b.get("compiled_model", {}).get(k, 0)
                             for k in ("tests", "passed")}
    out["interrupted"] = bool(a.get("interrupted") or b.get("interrupted"))
    out["last_line"] = " | ".join(x for x in (a.get("last_line"), b.get("last_line")) if x)
    if a.get("error") or b.get("error"):
        out["error"] = " ".join(x for x in (a.get("error"), b.get("error")) if x)
    return out


def total_of(runs: dict) -> dict:
    """The pytest section's totals over its runs; ``interrupted`` and ``missing`` name runs, if any."""
    tot = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "not_passing": [],
           "compiled_model": {"tests": 0, "passed": 0}, "last_lines": {}}
    for name, r in runs.items():
        tot["last_lines"][name] = r.get("last_line", "")
        for key in ("passed", "failed", "errors", "skipped"):
            if tot[key] is not None:
                tot[key] = None if r.get(key) is None else tot[key] + r[key]
        tot["not_passing"] += r.get("not_passing", [])
        for key in ("tests", "passed"):
            tot["compiled_model"][key] += r.get("compiled_model", {}).get(key, 0)
        if r.get("error"):
            tot["error"] = (tot.get("error", "") + " " + r["error"]).strip()
    interrupted = sorted(n for n, r in runs.items() if r.get("interrupted"))
    if interrupted:
        tot["interrupted"] = interrupted
    missing = [n for n in TEST_RUNS if n not in runs]
    if missing:
        tot["missing"] = missing
    return tot


def merge_pytest(previous: dict | None, new_runs: dict, commit: str | None) -> dict:
    """The pytest section after this call: its runs, plus the runs of ``previous`` (an earlier call's
    section) at the same commit that this call did not repeat. Runs at another commit are dropped:
    a section never mixes commits."""
    runs = {}
    if previous and commit and previous.get("commit") == commit and "+changes" not in commit:
        runs.update({n: r for n, r in (previous.get("runs") or {}).items() if n in TEST_RUNS})
    runs.update(new_runs)
    merged = total_of(runs)
    merged["runs"] = runs
    if len(new_runs) < len(runs):
        merged["merged_from_an_earlier_call"] = sorted(set(runs) - set(new_runs))
    return merged


def run_grades(budget_s: float, jobs: int, env: dict, out: Path) -> dict:
    """The grader on solutions/ and on pristine stubs, the two at once."""
    grades = {}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        pristine = Path(tmp) / "pristine"
        from attnlib import stubgen
        stubgen.write(REPO / "solutions", pristine, force=True)
        procs = {}
        for name, impl in (("grade_solutions", "solutions"), ("grade_stubs", str(pristine))):
            log(f"{name}: python -m grading --impl {impl}")
            f = open(out / f"{name}.log", "w")
            procs[name] = (subprocess.Popen([PY, "-m", "grading", "--impl", impl, "--summary-json", "--jobs",
                                             str(jobs), "--out", str(Path(tmp) / name)],
                                            cwd=REPO, stdout=f, stderr=subprocess.STDOUT, text=True, env=env,
                                            start_new_session=True), f)
        t0 = time.monotonic()
        for name, (proc, f) in procs.items():
            try:
                proc.wait(timeout=max(5.0, budget_s - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                stop(proc)                           # the grader and its workers, the whole group
                f.close()
                grades[name] = {"points": None, "max": None, "error": f"the grader ran past {budget_s:.0f} s"}
                continue
            f.close()
            grades[name] = grade_json((out / f"{name}.log").read_text())
            log(f"{name}: {grades[name].get('points')}/{grades[name].get('max')}")
    return grades


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default=",".join(PARTS), help="which parts, comma-separated: lb, tests, grade")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "h200" / "gpu-check")
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 8), help="pytest-xdist workers")
    ap.add_argument("--lb-rep-ms", type=int, default=10000, help="CS336's do_bench rep (ms)")
    ap.add_argument("--lb-warmup-ms", type=int, default=1000)
    # The defaults fit one 10-minute command on an H200 with the leaderboard first (~65 s) and setup: the
    # complete run at c509fb3 took 548 s with these, its grading tests 424 s of the 440.
    ap.add_argument("--tests-budget-s", type=float, default=440, help="pytest is stopped past this (the summary says so)")
    ap.add_argument("--grade-budget-s", type=float, default=430)
    ap.add_argument("--grade-jobs", type=int, default=4)
    ap.add_argument("--tests-runs", default=",".join(TEST_RUNS),
                    help="with the tests part: which pytest runs (suite, grading, notebooks); the others are "
                         "kept from the summary's earlier call at the same commit")
    ap.add_argument("--separate-grades", action="store_true",
                    help="run the grader on solutions/ and pristine stubs itself, beside the tests, instead of "
                         "reading the two whole-class runs of tests/test_grading.py (the behaviour before 12-01)")
    ap.add_argument("--merge-from", type=Path, default=None,
                    help="an earlier call's summary.json (its out folder is gone on a lent machine): this call "
                         "adds its parts to it; a part at another commit is replaced, never mixed")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if not parts or any(p not in PARTS for p in parts):
        ap.error(f"--parts takes a comma-separated list of {', '.join(PARTS)}; got {args.parts!r}")
    runs = [w.strip() for w in args.tests_runs.split(",") if w.strip()]
    if not runs or any(w not in TEST_RUNS for w in runs):
        ap.error(f"--tests-runs takes a comma-separated list of {', '.join(TEST_RUNS)}; got {args.tests_runs!r}")

    import torch
    import triton
    if not torch.cuda.is_available():
        print("gpu-check needs a CUDA GPU: on a CPU, `make test` is the whole truth", file=sys.stderr)
        return 2
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    # GPU_CHECK_COMMIT: the commit whose tree this is, where the copy's own .git is not that
    # commit's (the course's device tool sends the working tree beside a .git of the session's start).
    commit = os.environ.get("GPU_CHECK_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip() or None
    dirty = not os.environ.get("GPU_CHECK_COMMIT") and bool(subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True).stdout.strip())
    try:
        summary = json.loads(((args.merge_from or out / "summary.json")).read_text())
    except (OSError, ValueError):
        if args.merge_from:
            print(f"gpu-check: --merge-from {args.merge_from}: no summary there", file=sys.stderr)
            return 2
        summary = {}
    machine = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
               "cuda": torch.version.cuda,
               "ATTN_GLUON_DKDV": os.environ.get("ATTN_GLUON_DKDV", "1"),   # step 06's Hopper dK/dV path on or off
               "ATTN_GLUON_FWD": os.environ.get("ATTN_GLUON_FWD", "1")}     # step 05's Hopper forward path
    summary.update(machine)
    for stale in ("why_incomplete", "incomplete_because", "date", "commit", "seconds"):   # each part carries its own
        summary.pop(stale, None)
    # One thread a process: 16 pytest workers each running 16 OpenMP threads and 16 Inductor compile
    # workers made CPU-side tests 20-100x slower on the H200's 16 cores (2026-11-30: step 02's
    # compile of a 17x40 problem ran past 200 s; the grader timed step 02 submissions out at 120 s).
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               TORCHINDUCTOR_COMPILE_THREADS="1")
    from grading.sandbox import namespaces_available
    summary["grader_worker_namespaces"] = namespaces_available()

    def stamp(section: dict, t0: float) -> dict:
        section["commit"] = commit + ("+changes" if dirty else "") if commit else None
        section["date"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        section["seconds"] = round(time.monotonic() - t0, 1)
        return section

    ok = True
    if "lb" in parts:
        t0 = time.monotonic()
        log("leaderboard, CS336's harness")
        lb = {"cs336_harness": cs336_leaderboard(args.lb_rep_ms, args.lb_warmup_ms)}
        log("leaderboard, the course's harness")
        lb["bench_harness"] = bench_leaderboard(out)
        lb["shape"] = "B=1 H=16 N=16384 D=64 bf16 causal, forward+backward"
        lb["cs336_harness_how"] = (
            f"torch.compile(Function.apply) (SDPA: eager in sdpa_kernel); o.sum().backward(); "
            f"do_bench(rep={args.lb_rep_ms}, warmup={args.lb_warmup_ms}) mean")
        lb["bench_harness_how"] = "python -m bench leaderboard: random dO, do_bench median"
        summary["leaderboard_ms"] = stamp(lb, t0)
        ok &= all(isinstance(v, float) for v in lb["cs336_harness"].values())
    # tests and grade side by side (the grader's two runs take a few cores for about 150 s): the three
    # parts then fit one 10-minute command on the H200 (lb ~2 min, tests ~6, grade within them).
    graded, grade_thread, t_grade = {}, None, time.monotonic()
    which = [w.strip() for w in args.tests_runs.split(",") if w.strip()]
    # Two of the grading tests grade the whole class (solutions full marks, stubs zero): the grade part
    # reads their output instead of running the grader twice more beside them (at 78da36d the four
    # whole-class runs side by side took the full-marks test from 322 to 391 s and the tests past 440 s).
    from_tests = "grade" in parts and "tests" in parts and "grading" in which and not args.separate_grades
    grades_dir = out / "grades"
    if from_tests:
        import shutil
        shutil.rmtree(grades_dir, ignore_errors=True)
        grades_dir.mkdir(parents=True)
        env = dict(env, GPU_CHECK_GRADES=str(grades_dir))
    if "grade" in parts and "tests" in parts and not from_tests:
        import threading
        grade_thread = threading.Thread(target=lambda: graded.update(
            run_grades(args.grade_budget_s, args.grade_jobs, env, out)), daemon=True)
        grade_thread.start()
    if "tests" in parts:
        t0 = time.monotonic()
        new = run_tests(out, args.workers, args.tests_budget_s, env, which)["runs"]
        key = commit + ("+changes" if dirty else "") if commit else None
        summary["pytest"] = stamp(merge_pytest(summary.get("pytest"), new, key), t0)
        got = total_of(new)
        ok &= bool(got.get("failed") == 0 and got.get("errors") == 0 and got.get("passed") and not got.get("interrupted"))
    if "grade" in parts:
        t0 = t_grade
        if from_tests:
            grades = grades_from_tests(grades_dir, out)
        elif grade_thread is not None:
            grade_thread.join()
            grades = graded
        else:
            t0 = time.monotonic()
            grades = run_grades(args.grade_budget_s, args.grade_jobs, env, out)
        for name, g in grades.items():
            summary[name] = stamp(g, t0)
        ok &= bool(grades["grade_solutions"].get("points") is not None
                   and grades["grade_solutions"]["points"] == grades["grade_solutions"]["max"]
                   and grades["grade_stubs"].get("points") == 0)
    sections = [summary.get(k) or {} for k in ("leaderboard_ms", "pytest", "grade_solutions", "grade_stubs")]
    p = summary.get("pytest") or {}
    gs, gz = summary.get("grade_solutions") or {}, summary.get("grade_stubs") or {}
    summary["complete"] = bool(
        all(s.get("commit") for s in sections) and len({s.get("commit") for s in sections}) == 1
        and not sections[0]["commit"].endswith("+changes")
        and p.get("failed") == 0 and p.get("errors") == 0 and p.get("passed") and not p.get("interrupted")
        and not p.get("missing")
        and gs.get("points") is not None and gs.get("points") == gs.get("max") and gz.get("points") == 0)
    summary["complete_means"] = ("every part (lb, tests, grade) ran at one committed, unchanged commit: "
                                 "no test failed, solutions full marks, pristine stubs 0")
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
