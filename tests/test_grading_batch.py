"""The corpus graded as one class: every hostile submission and every planted bug of steps 01-04 in ONE
``python -m grading batch -j 2``, each row what that submission scores alone (issue 14: "the planted cases
score what they should one at a time and in a batch of all of them at -j 2, with every other row untouched").

tests/test_grading.py grades each submission by itself; here they share a batch, so a submission that
reaches for another's row, the batch's gradebook or the grader's tree would show in someone else's row.
A good student (the solutions of steps 01-04) must keep full marks among them.

Left out, each graded alone in tests/test_grading.py: the planted bugs of steps 05-10 (Triton's interpreter,
rings of processes: minutes each here), those graded under a config of their own (``config = ...`` in
wrong.toml: one batch has one config), and ``peek_ahead`` (it needs the hidden tests merged in).

Several minutes on 2 cores: ``make test-grader`` runs it (ATTN_GRADER_BATCH=1); ``make test`` skips it.
"""

import csv
import os
import shutil
import subprocess
import sys

import pytest
import torch

import test_grading as T

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.environ.get("ATTN_GRADER_BATCH") != "1",
                                 reason="the corpus as one batch takes minutes: make test-grader")]

STEPS_GRADED = (1, 2, 3, 4)


def _solution(name, dst):
    shutil.copyfile(T.REPO / "solutions" / f"{T.STEPS[name][0]}.py", dst / f"{T.STEPS[name][0]}.py")


def build_class(root, tmp_path_factory):
    """``root/<submission>/``, and {submission: {step: (points, status or None)}} for the steps it holds."""
    want = {}
    good = root / "good"
    good.mkdir(parents=True)
    for n in STEPS_GRADED:
        _solution(n, good)
    conf = T.cfg.load(T.TEST_CONFIG)       # the batch's config: its groups set each step's full marks
    marks = {n: float(sum(g.points for g in conf.steps[n].groups)) for n in STEPS_GRADED}
    want["good"] = {n: (marks[n], "passed") for n in STEPS_GRADED}
    gpu = torch.cuda.is_available()
    for spec in T.WRONG:
        if spec["step"] not in STEPS_GRADED or "config" in spec:
            continue
        full = T.plant(spec, root.parent / "planted" / spec["name"])
        dst = root / spec["name"]
        dst.mkdir()
        shutil.copyfile(full / spec["file"], dst / spec["file"])
        points = spec.get("points_gpu", spec["points"]) if gpu else spec["points"]
        want[spec["name"]] = {spec["step"]: (points, spec["status"])}
        if spec["step"] == 2:              # step 02 compiles step 01's function: the solution's, graded too
            _solution(1, dst)
            want[spec["name"]][1] = (marks[1], "passed")
    for name, (steps, expected, _, tweak) in T.HOSTILE.items():
        if tweak.get("hidden"):
            continue
        dst = root / name
        shutil.copytree(T.FIX / "hostile" / name, dst)
        if name in T.AIMS:
            placeholder, line, _ = T.AIMS[name]
            src = dst / "step01_naive.py"
            aim = T.aimed(tmp_path_factory, name)
            aim.parent.mkdir(parents=True, exist_ok=True)
            src.write_text(src.read_text().replace(placeholder, line.format(str(aim))))
        want[name] = dict(expected)
        if 3 in steps:
            _solution(3, dst)
        if 2 in steps and (dst / "step02_compile.py").exists() and not (dst / "step01_naive.py").exists():
            _solution(1, dst)
            want[name][1] = (marks[1], "passed")
    return want


def test_every_planted_case_in_one_batch(tmp_path, tmp_path_factory):
    root = tmp_path / "class"
    want = build_class(root, tmp_path_factory)
    before = {p: p.read_bytes() for p in (T.REPO / "attnlib").glob("*.py")}
    cmd = [sys.executable, "-m", "grading", "batch", str(root), "-j", "2", "--config", str(T.TEST_CONFIG),
           "--out", str(tmp_path / "out")]
    for n in STEPS_GRADED:
        cmd += ["--step", str(n)]
    proc = subprocess.run(cmd, cwd=T.REPO, capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {r["submission"]: r for r in csv.DictReader(open(tmp_path / "out" / "gradebook.csv"))}
    assert set(rows) == set(want), f"rows {sorted(set(rows) ^ set(want))} missing or extra"
    wrong = []
    for name, steps in sorted(want.items()):
        r = rows[name]
        for n in STEPS_GRADED:
            points, status = steps.get(n, (0.0, "missing"))
            got_p, got_s = float(r[f"step{n:02d}"] or 0), r[f"step{n:02d}_status"]
            if abs(got_p - points) > 1e-3 or (status and got_s != status):
                wrong.append(f"{name}, step {n:02d}: {got_p:g} {got_s!r}, alone {points:g} {status!r} "
                             f"({r['first_failure'][:160]})")
        total = sum(p for p, _ in steps.values())
        if abs(float(r["total"]) - total) > 1e-3:
            wrong.append(f"{name}: total {r['total']}, alone {total:g}")
    assert not wrong, f"{len(wrong)} row(s) of the batch differ from the submission graded alone:\n" + "\n".join(wrong)
    # The pickle's payload never ran in the grader (it would have left its sentinel file).
    assert not T.aimed(tmp_path_factory, "evil_pickle").exists(), "evil_pickle's payload ran in the grader"
    # Nobody rewrote the repository's grader library (each grader runs from its own snapshot).
    assert {p: p.read_bytes() for p in (T.REPO / "attnlib").glob("*.py")} == before
