"""bench/gpu_check.py's pytest section across two calls: runs merge only at one commit, and a check
with a run missing or interrupted is never complete."""

from bench.gpu_check import TEST_RUNS, merge_pytest, total_of


def _run(passed, failed=0, interrupted=False):
    return {"passed": passed, "failed": failed, "errors": 0, "skipped": 1, "not_passing": ["t::x"] if failed else [],
            "compiled_model": {"tests": 2, "passed": 2}, "interrupted": interrupted, "last_line": f"{passed} passed"}


def test_two_calls_at_one_commit_add_up():
    first = merge_pytest(None, {"suite": _run(1000), "notebooks": _run(47)}, "abc1234")
    assert first["missing"] == ["grading"]
    first["commit"] = "abc1234"
    both = merge_pytest(first, {"grading": _run(91)}, "abc1234")
    assert set(both["runs"]) == set(TEST_RUNS)
    assert both["passed"] == 1138 and both["failed"] == 0 and both["skipped"] == 3
    assert "missing" not in both and "interrupted" not in both
    assert both["merged_from_an_earlier_call"] == ["notebooks", "suite"]
    assert both["compiled_model"] == {"tests": 6, "passed": 6}


def test_an_earlier_call_at_another_commit_is_dropped():
    first = merge_pytest(None, {"suite": _run(1000), "notebooks": _run(47)}, "abc1234")
    first["commit"] = "abc1234"
    later = merge_pytest(first, {"grading": _run(91)}, "def5678")
    assert set(later["runs"]) == {"grading"} and later["missing"] == ["suite", "notebooks"]
    dirty = merge_pytest(first, {"grading": _run(91)}, "abc1234+changes")
    assert set(dirty["runs"]) == {"grading"}


def test_failures_and_interruptions_are_carried():
    tot = total_of({"suite": _run(10, failed=1), "grading": _run(5, interrupted=True), "notebooks": _run(3)})
    assert tot["failed"] == 1 and tot["not_passing"] == ["t::x"] and tot["interrupted"] == ["grading"]
    none = total_of({"suite": dict(_run(10), passed=None), "grading": _run(5), "notebooks": _run(3)})
    assert none["passed"] is None


def test_a_nameless_junit_case_is_not_counted(tmp_path):
    """A run stopped at its budget leaves a nameless <testcase/> in the junit file: not a pass."""
    from bench.gpu_check import junit_counts
    xml = tmp_path / "j.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="t" name="a"/><testcase classname="t" name="b">'
                   '<failure message="x"/></testcase><testcase time="0.002"/></testsuite></testsuites>')
    c = junit_counts(xml)
    assert (c["passed"], c["failed"]) == (1, 1)


def test_grades_are_read_from_the_grading_tests_output(tmp_path):
    """With tests and grade in one call, gpu_check reads the two whole-class grades the grading tests
    printed (GPU_CHECK_GRADES), and says so when a test did not write its grade."""
    import json

    from bench.gpu_check import grades_from_tests
    folder, out = tmp_path / "grades", tmp_path / "out"
    folder.mkdir()
    out.mkdir()
    summary = {"points": 100.0, "max": 100.0, "steps": {"01": {"points": 10.0}}}
    (folder / "grade_solutions.log").write_text("table\nGRADING-SUMMARY " + json.dumps(summary) + "\n")
    got = grades_from_tests(folder, out)
    assert got["grade_solutions"]["points"] == 100.0 and got["grade_solutions"]["max"] == 100.0
    assert "test_solutions_score_full_marks" in got["grade_solutions"]["how"]
    assert (out / "grade_solutions.log").exists()
    assert got["grade_stubs"]["points"] is None and "did not write" in got["grade_stubs"]["error"]


def test_one_call_takes_the_grades_from_the_grading_tests(tmp_path, monkeypatch):
    """main() with tests and grade: no grader of its own; the grading run gets GPU_CHECK_GRADES and the
    summary's grade sections come from what that run wrote (a fake run here: no GPU, no pytest)."""
    import json

    import torch

    from bench import gpu_check
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "fake GPU")
    monkeypatch.setenv("GPU_CHECK_COMMIT", "abc1234")
    seen = {}

    def fake_tests(out, workers, budget_s, env, which):
        seen["which"], seen["env"] = list(which), env.get("GPU_CHECK_GRADES")
        folder = tmp_path / "out" / "grades"
        for name, pts, mx in (("grade_solutions", 100.0, 100.0), ("grade_stubs", 0.0, 100.0)):
            (folder / f"{name}.log").write_text("GRADING-SUMMARY " + json.dumps({"points": pts, "max": mx}) + "\n")
        return {"runs": {w: _run(5) for w in which}}

    def no_grader(*a, **k):
        raise AssertionError("the grade part ran the grader itself")

    monkeypatch.setattr(gpu_check, "run_tests", fake_tests)
    monkeypatch.setattr(gpu_check, "run_grades", no_grader)
    rc = gpu_check.main(["--parts", "tests,grade", "--out", str(tmp_path / "out")])
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert seen["which"] == list(TEST_RUNS) and seen["env"] == str(tmp_path / "out" / "grades")
    assert summary["grade_solutions"]["points"] == 100.0 and summary["grade_stubs"]["points"] == 0.0
    assert "test_solutions_score_full_marks" in summary["grade_solutions"]["how"]
    assert summary["pytest"]["passed"] == 15 and rc == 0
    assert not summary["complete"]          # no leaderboard part at this commit


def test_make_splits_the_check_in_two_commands():
    """The Makefile passes the split the lent H200 needs (README): the parts, the test runs, the merge."""
    import shutil
    import subprocess
    from pathlib import Path

    import pytest
    if shutil.which("make") is None:
        pytest.skip("no make")
    repo = Path(__file__).resolve().parent.parent

    def dry(*args):   # the command make would run (under `make test` this is a sub-make: no directory lines)
        out = subprocess.run(["make", "--no-print-directory", "-n", "gpu-check", *args], cwd=repo,
                             capture_output=True, text=True, check=True).stdout
        return next(line for line in out.splitlines() if "-m bench.gpu_check" in line)
    assert dry().split()[1:] == ["-m", "bench.gpu_check"]
    first = dry("PARTS=lb,tests", "RUNS=suite,notebooks").split()
    assert first[-4:] == ["--parts", "lb,tests", "--tests-runs", "suite,notebooks"]
    second = dry("PARTS=tests,grade", "RUNS=grading", "MERGE=results/h200/gpu-check/summary.json").split()
    assert second[-6:] == ["--parts", "tests,grade", "--tests-runs", "grading",
                           "--merge-from", "results/h200/gpu-check/summary.json"]


def test_every_test_file_with_a_module_fixture_runs_on_one_worker():
    """gpu-check spreads the suite's tests one by one, but for ONE_WORKER_FILES: a module fixture in any
    other file would be built once per worker that runs its tests (a file of nvcc builds: once for each
    of seven workers). The grading and notebook tests are runs of their own."""
    import re
    from pathlib import Path

    from bench.gpu_check import ONE_WORKER_FILES
    repo = Path(__file__).resolve().parent.parent
    scoped = re.compile(r"""scope\s*=\s*["'](module|session|package)["']""")
    have = {f"tests/{p.name}" for p in (repo / "tests").glob("test_*.py") if scoped.search(p.read_text())}
    apart = {"tests/test_grading.py", "tests/test_notebooks.py"}
    assert have - apart <= set(ONE_WORKER_FILES), (
        f"{sorted(have - apart - set(ONE_WORKER_FILES))} build a module fixture: add them to "
        f"bench/gpu_check.py's ONE_WORKER_FILES")
    assert all((repo / f).exists() for f in ONE_WORKER_FILES), "ONE_WORKER_FILES names a file that is gone"


def test_the_suite_is_two_pytest_processes_counted_as_one_run(tmp_path, monkeypatch):
    """run_tests launches the suite as two pytests (ONE_WORKER_FILES apart, one file a worker; the rest
    spread test by test, without those files) and adds their junit counts into one 'suite' run."""
    import subprocess

    from bench import gpu_check
    launched = []

    class FakePytest:
        def __init__(self, cmd, **kw):
            launched.append(cmd)
            junit = next(a.split("=", 1)[1] for a in cmd if a.startswith("--junitxml="))
            failed = '<failure message="x"/>' if "suite_files" in junit else ""
            with open(junit, "w") as f:
                f.write(f'<testsuites><testsuite><testcase classname="t" name="a"/>'
                        f'<testcase classname="t" name="b">{failed}</testcase></testsuite></testsuites>')
            kw["stdout"].write("==== 1 passed ====\n")
            kw["stdout"].flush()

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(subprocess, "Popen", FakePytest)
    res = gpu_check.run_tests(tmp_path, 16, 60, {}, ["suite"])
    assert list(res["runs"]) == ["suite"] and len(launched) == 2
    main, files = launched
    assert files[files.index("--dist") + 1] == "loadfile" and set(gpu_check.ONE_WORKER_FILES) <= set(files)
    assert main[main.index("--dist") + 1] == "worksteal"
    ignored = {main[i + 1] for i, a in enumerate(main) if a == "--ignore"}
    assert set(gpu_check.ONE_WORKER_FILES) | {"tests/test_grading.py", "tests/test_notebooks.py"} <= ignored
    suite = res["runs"]["suite"]
    assert (suite["passed"], suite["failed"]) == (3, 1) and suite["not_passing"] == ["t::b"]


def test_import_puts_a_device_run_where_the_course_keeps_it(tmp_path):
    """bench.gpu_check_import: the archive's summary replaces the committed one (kept as summary_<sha>.json
    when of another commit), the logs and the executed notebooks land in place, the suite's logs shrink to
    their failures and durations."""
    import json
    import tarfile

    from bench.gpu_check_import import import_run
    gc = tmp_path / "run" / "gc"
    (gc / "executed").mkdir(parents=True)
    (gc / "bench_leaderboard").mkdir()
    (gc / "bench_leaderboard" / "results.csv").write_text("impl,ms\n")
    new = {"pytest": {"commit": "abcdef0123", "passed": 9, "failed": 1, "not_passing": ["t::x"]},
           "leaderboard_ms": {"commit": "abcdef0123"}, "complete": False}
    (gc / "summary.json").write_text(json.dumps(new))
    (gc / "pytest_suite.log").write_text("head1\nhead2\nhead3\n" + "PASSED x\n" * 500 + "FAILED t::x - boom\n"
                                         "==== slowest 25 durations ====\n9.0s call t::x\n== 1 failed, 9 passed ==\n")
    (gc / "pytest_grading.log").write_text("grading\n")
    (gc / "gc_run.log").write_text("[gpu-check 01:00:00] tests\n{\n \"json\": 1\n}\n")
    (gc / "executed" / "01_naive.ipynb").write_text("{}")
    archive = tmp_path / "gc.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(gc, arcname="gc")
    results, executed = tmp_path / "results", tmp_path / "executed"
    results.mkdir()
    (results / "summary.json").write_text(json.dumps({"pytest": {"commit": "1234567"}}))
    done = import_run(archive, results, executed)
    assert done["sha"] == "abcdef0" and done["kept_previous"] == "summary_1234567.json"
    assert json.loads((results / "summary.json").read_text()) == new
    assert json.loads((results / "summary_1234567.json").read_text())["pytest"]["commit"] == "1234567"
    assert (results / "pytest_grading_abcdef0.log").exists() and (results / "bench_leaderboard" / "results.csv").exists()
    assert (results / "gc_run_abcdef0.log").read_text() == "[gpu-check 01:00:00] tests\n"
    suite = (results / "pytest_suite_summary.log").read_text()
    assert "FAILED t::x - boom" in suite and "9.0s call t::x" in suite and "PASSED x" not in suite
    assert (executed / "01_naive.ipynb").exists()
    assert "grade_solutions.log" in done["missing"]
    # the same run imported twice keeps no second copy of itself
    assert import_run(archive, results, executed)["kept_previous"] is None
    assert not (results / "summary_abcdef0.json").exists()


def test_device_script_archives_the_run_and_says_how_it_went(tmp_path):
    """bench/gpu_check_device.sh, with a fake machine (device_setup and gpu_check replaced): the --out
    folder comes back as $OUT/gc.tgz, the progress lines and a one-line verdict are printed, and the
    script's status is the check's."""
    import os
    import shutil
    import subprocess
    import sys
    import tarfile
    from pathlib import Path

    import pytest
    if shutil.which("bash") is None or shutil.which("tar") is None:
        pytest.skip("needs bash and tar")
    repo = Path(__file__).resolve().parent.parent
    fake = tmp_path / "repo"
    (fake / "bench").mkdir(parents=True)
    shutil.copy(repo / "bench" / "gpu_check_device.sh", fake / "bench")
    (fake / "bench" / "device_setup.sh").write_text("echo setup done\n")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "python3").write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1" = "-m" ]; then\n'
        '  out=$4; mkdir -p "$out"\n'
        '  echo \'{"complete": false, "pytest": {"passed": 5, "failed": 1, "errors": 0, "not_passing": ["t::x"]}}\' > "$out/summary.json"\n'
        '  echo "[gpu-check 00:00:01] tests"; exit 1\n'
        "fi\n"
        f'exec {sys.executable} "$@"\n')
    (bin_ / "python3").chmod(0o755)
    out = tmp_path / "OUT"
    out.mkdir()
    env = dict(os.environ, PATH=f"{bin_}:{os.environ['PATH']}", OUT=str(out), GPU_CHECK_COMMIT="abc",
               GPU_CHECK_DIR=str(tmp_path / "gc"))
    r = subprocess.run(["bash", str(fake / "bench" / "gpu_check_device.sh")], env=env, capture_output=True, text=True)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "[gpu-check 00:00:01] tests" in r.stdout and "complete: False" in r.stdout and "t::x" in r.stdout
    with tarfile.open(out / "gc.tgz") as tar:
        names = set(tar.getnames())
    assert {"gc/summary.json", "gc/gc_run.log", "gc/setup.log"} <= names
    r = subprocess.run(["bash", str(fake / "bench" / "gpu_check_device.sh")], capture_output=True, text=True,
                       env={k: v for k, v in env.items() if k != "GPU_CHECK_COMMIT"})
    assert r.returncode != 0 and "GPU_CHECK_COMMIT" in r.stderr
