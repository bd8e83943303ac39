"""bench/experiments/gpu_run.py, what step 07's CUDA experiments share on the GPU, checked on a CPU: a run's
record (log, JSON after every part, a failing part recorded and the next one run) and the
compute-sanitizer plumbing (through a stand-in compute-sanitizer that runs the command and fails the way
the real one does, with --error-exitcode, when the child reports an error)."""

from __future__ import annotations

import json
import os
import stat
import sys

from bench.experiments import gpu_run
from attnlib.loader import REPO


def test_record_writes_log_and_json_and_a_failing_part_does_not_stop_the_run(tmp_path, monkeypatch):
    # Record.open turns step 06's Hopper dK/dV path off for the run (ATTN_GLUON_DKDV=0): monkeypatch restores the
    # variable afterwards, so the tests after this one in the worker see step 06 as it ships.
    monkeypatch.delenv("ATTN_GLUON_DKDV", raising=False)
    monkeypatch.delenv("ATTN_GLUON_FWD", raising=False)
    rec = gpu_run.Record("exp")
    rec.open(tmp_path / "out", REPO)

    @rec.part("1 fails")
    def one():
        raise ValueError("planted")

    @rec.part("2 runs")
    def two():
        rec.log("second part ran")
        return {"rows": [1, 2]}

    one()
    two()
    saved = json.loads((tmp_path / "out" / "exp.json").read_text())
    assert saved["parts"]["1 fails"]["ok"] is False and "ValueError: planted" in saved["parts"]["1 fails"]["error"]
    assert saved["parts"]["2 runs"]["ok"] is True and saved["parts"]["2 runs"]["rows"] == [1, 2]
    assert {"torch", "argv", "date_utc"} <= set(saved["meta"]) and saved["meta"]["ATTN_GLUON_DKDV"] == "0"
    assert saved["meta"]["ATTN_GLUON_FWD"] == "0"
    log = (tmp_path / "out" / "exp.log").read_text()
    assert "1 fails FAILED: ValueError: planted" in log and "second part ran" in log


CHILD = """import sys
assert sys.argv[1] == "--sanitize-child"
print("child ran")
sys.exit(int({rc!r}))
"""

# A stand-in for compute-sanitizer: `--tool T --error-exitcode E cmd...` runs cmd and exits E when it failed.
FAKE = """#!{python}
import subprocess, sys
a = sys.argv[1:]
tool, code, cmd = a[1], int(a[3]), a[4:]
r = subprocess.run(cmd)
print("========= " + tool + " done")
sys.exit(code if r.returncode else 0)
"""


def _fake_sanitizer(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "compute-sanitizer"
    fake.write_text(FAKE.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_sanitize_runs_the_script_child_under_both_tools(tmp_path, monkeypatch):
    _fake_sanitizer(tmp_path, monkeypatch)
    for rc, want in ((0, 0), (1, 3)):
        script = tmp_path / f"child{rc}.py"
        script.write_text(CHILD.format(rc=rc))
        lines = []
        out = gpu_run.sanitize(str(script), t_start=0.0, log=lines.append, budget_s=1e9)
        assert set(out) == {"memcheck", "racecheck"}
        for tool in ("memcheck", "racecheck"):
            assert out[tool]["rc"] == want, (rc, out[tool])
            assert "child ran" in out[tool]["tail"] and f"{tool} done" in out[tool]["tail"]
        assert len(lines) == 2


def test_check_cases_runs_every_case_and_records_each_failure():
    """The four experiments' correctness part: a failing case is recorded with its message and logged, the
    next case still runs, and the counts say how many failed out of how many."""
    ran, lines = [], []

    def case(tag, fail):
        def check():
            ran.append(tag)
            if fail:
                raise AssertionError(f"{tag} is off by 0.5")
        return tag, check

    res = gpu_run.check_cases((case(t, t == "b") for t in "abc"), lines.append)
    assert ran == ["a", "b", "c"]
    assert (res["n_fail"], res["n"]) == (1, 3)
    assert [r["ok"] for r in res["rows"]] == [True, False, True]
    assert res["rows"][1] == {"case": "b", "ok": False, "error": "b is off by 0.5"}
    assert lines[0] == "  FAIL b: b is off by 0.5" and lines[-1] == "correctness: 2/3 cases match the float64 reference"
