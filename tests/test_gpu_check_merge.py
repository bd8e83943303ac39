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
