"""The autograder grades itself.

- the solutions score full marks on every step a CPU can run (hidden tests included);
- the pristine stubs score zero, every step "not implemented";
- each wrong submission (tests/grading_fixtures/wrong.toml: a solution with one
  classic bug) loses exactly the points worked out by hand there, and the report
  names the bug;
- each hostile submission (tests/grading_fixtures/hostile/) -- a hang, an exit, a
  segfault, an 8 TiB allocation, score tampering, a malicious pickle, the course's
  reference passed off as its own -- scores what it should, and never more;
- batch grading, the output formats, the sandbox's defences and the packaging work.

Wrong and hostile submissions use tests/grading_fixtures/config.toml (small,
fixed); the solutions and the stubs the real grading/config.toml.
"""

from __future__ import annotations

import csv
import json
import os
import pickle
import shutil
import subprocess
import sys
import time
import tomllib
import xml.etree.ElementTree as ET
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from attnlib.contract import STEPS
from grading import config as cfg
from grading import sandbox
from grading.grade import Grader, released_steps
from grading.report import details, gradescope, junit, table
from grading.spec import step_needs_gpu

REPO = Path(__file__).resolve().parent.parent
FIX = Path(__file__).resolve().parent / "grading_fixtures"
TEST_CONFIG = FIX / "config.toml"
WRONG = tomllib.loads((FIX / "wrong.toml").read_text())["wrong"]
# What the hostile fixtures aim at, rewritten to a temporary folder of the session (never /autograder
# or a fixed /tmp path): the placeholder line in the fixture -> the line the test puts there.
AIMS = {
    "tamper": ('AUTOGRADER_ROOT = Path(__file__).resolve().parent / "autograder-root"', "AUTOGRADER_ROOT = Path({!r})",
               "autograder"),
    "evil_pickle": ('SENTINEL = str(Path(__file__).resolve().parent / "evil_pickle_ran")', "SENTINEL = {!r}",
                    "evil_pickle_ran"),
}


def aimed(tmp_path_factory, name) -> Path:
    """Where the hostile fixture ``name`` writes (its stand-in /autograder, or its sentinel file)."""
    return tmp_path_factory.getbasetemp() / "aims" / AIMS[name][2]

# name -> (steps graded, expected {step: (points, status)}, strings the report must hold, config tweaks).
# A step the folder lacks is "missing"; step 03, where listed, is the solution's: it must keep its 10 points.
NAMESPACES = sandbox.namespaces_available()
HOSTILE = {
    "infinite_loop": ([1], {1: (0.0, "timed out")}, ["timed out: the step ran past its 12 s limit"], {"timeout_s": 12}),
    "os_exit": ([1], {1: (0.0, "crashed")}, ["the worker exited (code 0)", "os._exit()"], {}),
    "segfault": ([1, 3], {1: (0.0, "crashed"), 3: (10.0, "passed")}, ["crashed: SIGSEGV, a segmentation fault"], {}),
    # 8 TiB, filled: on a CPU machine the address-space cap refuses it at once; on a GPU machine (no such
    # cap: a CUDA context maps far more than it uses) the resident-memory watchdog kills the worker.
    "oom": ([1, 3], {1: (0.0, "crashed" if torch.cuda.is_available() else "failed"), 3: (10.0, "passed")},
            ["went over its 4096 MiB memory limit"] if torch.cuda.is_available() else ["allocate"], {}),
    # In its own mount namespace (root + unshare) the worker finds the grader's library read-only and its
    # rewrite of compare.py fails at import; elsewhere the write lands in the worker's copy, is caught
    # afterwards, and its wrong output fails.
    "tamper": ([1], {1: (0.0, "import error" if NAMESPACES else "failed")},
               ["Read-only file system"] if NAMESPACES else
               ["O does not match the reference", "the output does not require grad"], {}),
    "evil_pickle": ([1], {1: (0.0, "rejected")}, ["is not plain tensors and values", "the whole step scores 0"], {}),
    "reference_cheat": ([1], {1: (0.0, "rule broken")}, ["called attnlib's reference_attention/reference_backward"], {}),
    # Issue 14, hole 2: the reference unwrapped (__wrapped__) or reloaded; the worker's copy has none.
    "reference_unwrapped": ([1], {1: (0.0, "failed")}, ["attnlib.reference_attention is not available while a step is graded"], {}),
    "not_a_tensor": ([1, 2], {1: (0.0, "failed"), 2: (0.0, "missing")},
                     ["attention must return one tensor, got list", "step02_compile.py is missing"], {}),
    "aten_sdpa": ([4], {4: (0.0, "rule broken")}, ["F.scaled_dot_product_attention ran"], {}),
    # Issue 14, hole 4: SDPA with the Python-level hooks off; blocked at the dispatcher (9/10 before).
    "sdpa_modes_off": ([4], {4: (0.0, "rule broken")},
                       ["F.scaled_dot_product_attention ran", "the grader blocks aten::scaled_dot_product_attention"], {}),
    # The blocker's registration destroyed through gc (every torch.library.Library found and destroyed):
    # 7/10 while the blocker was a Library object; its handle is now leaked and untracked.
    "sdpa_library_destroyed": ([4], {4: (0.0, "rule broken")},
                               ["F.scaled_dot_product_attention ran", "the grader blocks aten::scaled_dot_product_attention"], {}),
    "forged_compile": ([2], {2: (0.0, "rule broken")}, ["but Inductor generated no code"], {"private_cache": True}),
    # Attention in a custom op inside the compiled graph (Inductor calls it as an extern kernel), warmed up at
    # import, a fresh one-line graph compiled in each call: its ops run under "## Call CompiledFxGraph ##".
    # (Caught by the opaque-op check alone, recompiling calls included: with it switched off, 6/6 passed,
    # 2026-12-02; the rule's own look in steady state: test_compiled_rule_sees_attention_in_an_opaque_op_in_steady_state.)
    "compile_opaque_op": ([2], {2: (0.0, "rule broken")}, ["but the attention itself ran eagerly"], {}),
    # Issue 14, hole 3 (rest): a decoy compiled inside attention on every call, attention run eagerly (6/6 when
    # the rule counted only the graphs compiled during the calls): the profiler sees score-sized ops outside
    # Inductor's code.
    "compile_decoy_inside": ([2], {2: (0.0, "rule broken")},
                             ["the attention itself ran eagerly in 6 call(s)", "outside the code Inductor generated"], {}),
    # Issue 14, hole 4: N x N everywhere but at the 512 probe, and 255-row chunks kept alive by autograd (9/10
    # each with the largest tensor at 512 as the only measure): the memory probe at 8192 under a lowered cap.
    "nxn_except_at_probe": ([4], {4: (0.0, "rule broken")}, ["at Nq = Nk = 8192 (full), run with 128 MiB",
                                                             "you tried to allocate 268435456 bytes"], {}),
    "nxn_chunks_kept": ([4], {4: (0.0, "rule broken")}, ["at Nq = Nk = 8192 (full), run with 128 MiB",
                                                         "kept alive (by autograd?)"], {}),
    # The same, with the probe's soft address-space cap raised back to the hard one in every call (8/10 while
    # the cap was all the probe had): the grader's own measure of the worker's resident memory catches it.
    "nxn_cap_lifted": ([4], {4: (0.0, "rule broken")}, ["at Nq = Nk = 8192 (full), the worker's resident memory rose",
                                                        "measured by the grader from outside"], {}),
    "syntax_error": ([1], {1: (0.0, "import error")}, ["SyntaxError"], {}),
    # Issue 14, hole 1: every input read from the task file at import, answered from an SDPA cache (10/10
    # before the inputs moved to a pipe); the same from the public seed, SDPA at import caught by the rule;
    # a step that steals the later items off the pipe, hidden ones included, to print them (MUST_NOT_SAY).
    "precompute": ([4], {4: (0.0, "failed")}, ["pre-computed 0 outputs at import (read: task.pt)"], {}),
    "precompute_from_seed": ([4], {4: (0.0, "rule broken")},
                             ["ran 0 time(s) in the forward and 0 in the backward (and 1 at import)",
                              "the grader blocks aten::scaled_dot_product_attention"], {}),
    "peek_ahead": ([1], {1: (0.0, "crashed")}, ["crashed: SIGSEGV"], {"hidden": True}),
}
# Strings the report (every output a student or an instructor's export gets) must not hold.
MUST_NOT_SAY = {"peek_ahead": ["stolen", "1x3x70x48", "q70"]}


def present(step):
    return (REPO / "solutions" / f"{STEPS[step][0]}.py").exists()


def plant(spec: dict, dst: Path) -> Path:
    """A folder shaped like steps/: the solutions as a student would hand them in (no SOLUTION-ONLY lines or
    files: on a Hopper GPU step 06's solution would otherwise run its Gluon dK/dV kernel around a bug planted in
    the Triton one), with one bug planted as ``spec`` says."""
    from attnlib.stubgen import as_submitted
    dst.mkdir(parents=True)
    for p in (REPO / "solutions").glob("*.py"):
        text = as_submitted(p.read_text())
        if text is not None:
            (dst / p.name).write_text(text)
    path = dst / spec["file"]
    text = path.read_text()
    head, tail = "", text
    if "after" in spec:
        i = text.index(spec["after"])
        head, tail = text[:i], text[i:]
    count = spec.get("count", 1)
    found = tail.count(spec["old"])
    assert found >= count and (found == 1 or "count" in spec or "after" in spec), (
        f"{spec['name']}: {spec['old']!r} occurs {found} times in {spec['file']} (expected {count}): "
        "the solution changed; update tests/grading_fixtures/wrong.toml")
    path.write_text(head + tail.replace(spec["old"], spec["new"], count))
    return dst


def report(grade) -> str:
    """Everything a student could read about the grade: the details and every Gradescope output."""
    gs = gradescope(grade, per_group=50)
    return details(grade, per_group=50) + "\n" + "\n".join(t["output"] for t in gs["tests"])


def step_of(grade, n):
    return next(s for s in grade.steps if s.step == n)


# ---------------------------------------------------------------------------
# Solutions, stubs, batch: through the command line, as `make grade` runs it
# ---------------------------------------------------------------------------
# (First in the file: the longest single tests. pytest-xdist hands tests out in file order, and
# started last they set the end of the run: `make test` on 2 workers, `make gpu-check` on 5.)

def trusted_cache(tmp_path_factory) -> Path:
    """``--cache`` for a grade of the course's own code -- solutions/, or a copy with one bug planted by these
    tests -- never a stranger's: its ``inductor`` is this machine's Inductor cache, the one the in-process
    tests (tests/test_step02_compile.py, step 04's compiled tests) and the notebooks compile into, so a graph
    compiled once (here, there, or in an earlier run) is not compiled again in every worker. Sound for
    trusted code only: Inductor's cache is addressed by the graph, the inputs' metadata, the config and
    torch's version, so a planted bug's graph never answers for the solution's; a submission that could
    write there could poison it (grading/sandbox.py: a stranger gets a cache of its own, as the hostile
    fixtures below do). Triton, extension and nvcc caches stay the session's own."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    folder = tmp_path_factory.getbasetemp() / "trusted-cache"
    if not (folder / "inductor").exists():
        shared = Path(cache_dir())
        shared.mkdir(parents=True, exist_ok=True)
        folder.mkdir(exist_ok=True)
        (folder / "inductor").symlink_to(shared, target_is_directory=True)
    return folder


def run_cli(*args, timeout=420):
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "grading", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout, time.monotonic() - t0


# The whole class's grade from cold Triton and nvcc caches (Inductor's: this machine's, trusted_cache; cold
# on a fresh machine, where step 02 compiles for 36 s alone, 98 s beside the rest of `make test`): on a CPU
# about 2 minutes; on an H200 beside the rest of `make gpu-check` 5-6 minutes (Triton and nvcc compile every
# kernel each step runs; 330 s for the grader's own run there with 4 jobs, 2026-12-01), past pytest-timeout's
# 300 s default. Its own limit is that of the grader's command below, and 4 jobs where the cores are there.
FULL_GRADE_S = 470


def keep_for_gpu_check(name, out):
    """`make gpu-check` takes the class's grades from the two whole-class runs below instead of grading
    the class twice more beside them (GPU_CHECK_GRADES: a folder; bench/gpu_check.py). Written before
    the test's own assertions, so a wrong grade reaches the summary as well as failing here."""
    folder = os.environ.get("GPU_CHECK_GRADES")
    if folder:
        Path(folder, f"{name}.log").write_text(out)


@pytest.mark.slow
@pytest.mark.timeout(FULL_GRADE_S + 30)
def test_solutions_score_full_marks(tmp_path, tmp_path_factory):
    jobs = 4 if (os.cpu_count() or 1) >= 8 else 2
    out, secs = run_cli("--impl", "solutions", "--hidden", str(FIX / "hidden"), "--out", str(tmp_path),
                        "--cache", str(trusted_cache(tmp_path_factory)), "--jobs", str(jobs), "--quiet",
                        "--summary-json",
                        timeout=FULL_GRADE_S)
    keep_for_gpu_check("grade_solutions", out)
    print(out, f"\n{secs:.0f} s")
    res = json.loads((tmp_path / "results.json").read_text())
    steps = res["extra_data"]["steps"]
    graded = [n for n in released_steps() if not step_needs_gpu(n) or torch.cuda.is_available()]
    assert graded, "no step to grade"
    for n in graded:
        st = steps[STEPS[n][0]]
        assert st["status"] == "passed" and st["points"] == st["max"] > 0, f"step {n:02d}: {st}\n{out}"
        assert 0 < st["seconds"] < FULL_GRADE_S, f"step {n:02d}: its wall time is not recorded: {st}"
    assert res["score"] == pytest.approx(res["extra_data"]["max_points"])
    # Gradescope's format: every test has a name, a score out of max_score, an output and a visibility.
    for t in res["tests"]:
        assert {"name", "score", "max_score", "output", "visibility"} <= set(t), t
        assert t["visibility"] in ("visible", "hidden", "after_due_date", "after_published")
    hidden = [t for t in res["tests"] if "hidden" in t["tags"]]
    assert hidden and all(t["visibility"] == "after_due_date" and t["score"] == t["max_score"] for t in hidden)
    root = ET.parse(tmp_path / "junit.xml").getroot()
    assert root.tag == "testsuites" and int(root.get("failures")) == 0 and int(root.get("errors")) == 0
    assert int(root.get("tests")) > 100


@pytest.mark.slow
def test_stubs_score_zero_not_implemented(tmp_path):
    out, _ = run_cli("--impl", "steps", "--out", str(tmp_path), "--cache", str(tmp_path / "cache"), "--quiet",
                     "--jobs", "2", "--summary-json")
    keep_for_gpu_check("grade_stubs", out)
    res = json.loads((tmp_path / "results.json").read_text())
    for n in released_steps():
        if not (REPO / "steps" / f"{STEPS[n][0]}.py").exists():
            continue
        st = res["extra_data"]["steps"][STEPS[n][0]]
        if step_needs_gpu(n) and not torch.cuda.is_available():
            assert st["status"] == "needs a GPU" and st["max"] == 0
            continue
        assert st["status"] == "not implemented" and st["points"] == 0 and st["max"] > 0, f"step {n:02d}: {st}\n{out}"
    assert "not implemented: Step 01:" in out


@pytest.mark.slow
def test_batch_grades_everyone_despite_broken_submissions(tmp_path):
    subs = tmp_path / "class"
    (subs / "good").mkdir(parents=True)
    shutil.copyfile(REPO / "solutions" / "step01_naive.py", subs / "good" / "step01_naive.py")
    shutil.copytree(FIX / "hostile" / "os_exit", subs / "crashes")
    shutil.copytree(FIX / "hostile" / "syntax_error", subs / "broken")
    (subs / "nested" / "steps").mkdir(parents=True)           # a zip of the whole repo: steps/ inside
    shutil.copyfile(REPO / "solutions" / "step01_naive.py", subs / "nested" / "steps" / "step01_naive.py")
    shutil.copytree(FIX / "hostile" / "tamper_files", subs / "rewrites_grader")
    before = (REPO / "attnlib" / "compare.py").read_text()
    proc = subprocess.run([sys.executable, "-m", "grading", "batch", str(subs), "-j", "2", "--step", "1",
                           "--config", str(TEST_CONFIG), "--out", str(tmp_path / "out")],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "100%" in proc.stderr                                   # the progress bar ran to the end
    rows = {r["submission"]: r for r in csv.DictReader(open(tmp_path / "out" / "gradebook.csv"))}
    assert set(rows) == {"good", "crashes", "broken", "nested", "rewrites_grader"}
    assert float(rows["good"]["total"]) == 10.0 and rows["good"]["step01_status"] == "passed"
    assert float(rows["nested"]["total"]) == 10.0
    assert float(rows["crashes"]["total"]) == 0.0 and rows["crashes"]["step01_status"] == "crashed"
    assert rows["broken"]["step01_status"] == "import error" and "SyntaxError" in rows["broken"]["first_failure"]
    assert (tmp_path / "out" / "good" / "results.json").exists()
    # It rewrote its own grader's copy of attnlib/compare.py: caught (or, in its own mount namespace,
    # refused: the library is read-only there), and nobody else's grade moved.
    if NAMESPACES:
        assert rows["rewrites_grader"]["step01_status"] == "failed", rows["rewrites_grader"]
    else:
        assert rows["rewrites_grader"]["step01_status"] == "rejected", rows["rewrites_grader"]
        assert "attnlib/compare.py" in rows["rewrites_grader"]["first_failure"]
    assert float(rows["rewrites_grader"]["total"]) == 0.0
    assert (REPO / "attnlib" / "compare.py").read_text() == before


# ---------------------------------------------------------------------------
# Every wrong and hostile submission, graded once, two at a time
# ---------------------------------------------------------------------------

@pytest.fixture(scope="session")
def graded(tmp_path_factory):
    base = tmp_path_factory.mktemp("submissions")
    cache = tmp_path_factory.mktemp("compile-cache")     # the hostile submissions': this session's, apart
    shared = trusted_cache(tmp_path_factory)
    jobs = []
    for spec in WRONG:
        if present(spec["step"]):
            # A solution with one planted bug: the course's own code, graded with the machine's Inductor cache.
            tweak = {"config": FIX / spec["config"], "trusted": True} if "config" in spec else {"trusted": True}
            jobs.append((spec["name"], plant(spec, base / spec["name"]), [spec["step"]], tweak, None))
    for name, (steps, _, _, tweak) in HOSTILE.items():
        dst = base / name
        shutil.copytree(FIX / "hostile" / name, dst)
        if name in AIMS:
            placeholder, line, _ = AIMS[name]
            src = dst / "step01_naive.py"
            text = src.read_text()
            assert placeholder in text, f"hostile/{name}: the line the test rewrites changed: {placeholder}"
            aim = aimed(tmp_path_factory, name)
            aim.parent.mkdir(parents=True, exist_ok=True)
            src.write_text(text.replace(placeholder, line.format(str(aim))))
        if 3 in steps:
            shutil.copyfile(REPO / "solutions" / "step03_sdpa.py", dst / "step03_sdpa.py")
        if 2 in steps and (dst / "step02_compile.py").exists() and not (dst / "step01_naive.py").exists():
            shutil.copyfile(REPO / "solutions" / "step01_naive.py", dst / "step01_naive.py")   # what step 02 compiles
        jobs.append((name, dst, steps, tweak, FIX / "hidden" if tweak.get("hidden") else None))
    # The same bug, graded with the hidden tests merged in.
    spec = next(s for s in WRONG if s["name"] == "step01-causal-off-by-one")
    jobs.append(("hidden:" + spec["name"], base / spec["name"], [1], {}, FIX / "hidden"))

    def run(job):
        name, folder, steps, tweak, hidden = job
        tweak = dict(tweak)
        conf = cfg.load(tweak.pop("config", TEST_CONFIG), hidden)
        private = tweak.pop("private_cache", False)      # as for any stranger's submission
        trusted = tweak.pop("trusted", False)              # a planted bug: trusted_cache()
        tweak.pop("hidden", None)                          # graded with the hidden tests: ``hidden`` above
        for key, val in tweak.items():
            for n in steps:
                setattr(conf.steps[n], key, val)
        t0 = time.monotonic()
        where = None if private else str(shared if trusted else cache)
        g = Grader(conf, hidden=str(hidden) if hidden else None, jobs=1, threads=1,
                   cache=where).grade(folder, steps)
        return name, g, time.monotonic() - t0

    def show(name, g, secs):
        print(f"{name:40s} {g.points:6.2f}/{g.max_points:g}  {secs:5.1f} s  "
              + ", ".join(f"{s.step:02d}: {s.status}" for s in g.steps))

    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Under xdist (make gpu-check runs this file with --dist load): each worker grades only the
        # submissions its own tests ask for, when they ask, so the tests spread over the workers.
        return LazyGrades({j[0]: j for j in jobs}, run, show)
    # Longest first (step 02 compiles, step 10 starts process groups), so neither core idles at the end.
    cost = {2: 6, 10: 3, 6: 3, 5: 2, 4: 2}
    jobs.sort(key=lambda j: -max(cost.get(n, 1) for n in j[2]))
    with ThreadPoolExecutor(2) as pool:                  # the CI machine's two cores
        out = {name: (g, secs) for name, g, secs in pool.map(run, jobs)}
    for name, (g, secs) in sorted(out.items()):
        show(name, g, secs)
    return {name: g for name, (g, _) in out.items()}


class LazyGrades(dict):
    """``graded[name]``, graded on first use."""

    def __init__(self, jobs, run, show):
        super().__init__()
        self.jobs, self.run, self.show = jobs, run, show

    def __missing__(self, name):
        _, g, secs = self.run(self.jobs[name])
        self.show(name, g, secs)
        self[name] = g
        return g


@pytest.mark.slow
@pytest.mark.parametrize("spec", WRONG, ids=[s["name"] for s in WRONG])
def test_wrong_submission_loses_exactly_its_points(graded, spec):
    if not present(spec["step"]):
        pytest.skip(f"step {spec['step']:02d} has not landed in solutions/")
    g = graded[spec["name"]]
    s = step_of(g, spec["step"])
    text = report(g)
    assert s.status == spec["status"], f"{spec['name']}: status {s.status!r}, expected {spec['status']!r}\n{text}"
    expected = spec.get("points_gpu", spec["points"]) if torch.cuda.is_available() else spec["points"]
    assert s.points == pytest.approx(expected, abs=1e-3), f"{spec['name']}: {s.points} points\n{text}"
    conf = cfg.load(FIX / spec["config"]) if "config" in spec else cfg.load(TEST_CONFIG)
    assert s.max_points == pytest.approx(sum(g.points for g in conf.steps[spec["step"]].groups))
    # The diagnosis names the kernel's own tile sizes, which differ between the interpreter and a GPU.
    for needle in spec.get("expect_gpu", spec["expect"]) if torch.cuda.is_available() else spec["expect"]:
        assert needle in text, f"{spec['name']}: the report does not say {needle!r}\n{text}"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_submission(graded, name, tmp_path_factory):
    steps, expected, needles, _ = HOSTILE[name]
    g = graded[name]
    text = report(g)
    for n, (points, status) in expected.items():
        s = step_of(g, n)
        assert (s.points, s.status) == (pytest.approx(points, abs=1e-3), status), f"{name}, step {n}:\n{text}"
    for needle in needles:
        assert needle in text, f"{name}: the report does not say {needle!r}\n{text}"
    text += "\n" + junit(g)
    for secret in MUST_NOT_SAY.get(name, []):
        assert secret not in text, (f"{name}: the report shows {secret!r}, which the submission read from an input "
                                    "sent after the check it reports on: a record read after a later item was sent "
                                    f"(sandbox._Channel), or a crash's output quoted after a hidden item\n{text}")
    if name == "evil_pickle":
        assert not aimed(tmp_path_factory, name).exists(), "the grader unpickled the submission's object: its command ran"
    if name == "tamper":
        assert g.points == 0.0
        planted = aimed(tmp_path_factory, name) / "results" / "results.json"
        if NAMESPACES:      # stopped at import by the read-only library, before it planted anything
            assert not planted.exists()
        else:               # it did plant a perfect results.json -- in the temporary stand-in, where it was aimed
            assert json.loads(planted.read_text())["score"] == 1000.0
        assert "(1e9, 1e9)" not in (REPO / "attnlib" / "compare.py").read_text(), "the repository's compare.py changed"


@pytest.mark.slow
def test_hidden_tests_merge_and_stay_withheld(graded):
    g = graded["hidden:step01-causal-off-by-one"]
    s = step_of(g, 1)
    hidden = next(gr for gr in s.groups if gr.group.name == "hidden_shapes")
    assert hidden.group.hidden and hidden.group.visibility == "after_due_date" and not hidden.group.reveal
    assert len(hidden.checks) == 4 and hidden.n_passed == 2          # the causal half fails there too
    assert (s.points, s.max_points) == (pytest.approx(7.0), pytest.approx(12.0))
    gs = gradescope(g)
    test = next(t for t in gs["tests"] if t["name"].endswith(": hidden_shapes"))
    assert test["visibility"] == "after_due_date" and test["score"] == 1.0 and test["max_score"] == 2.0
    assert "withheld" in test["output"] and "q70" not in test["output"], test["output"]
    assert "q70" not in details(g) and "q70" not in junit(g)
    # The visible groups still explain themselves.
    assert "it hides the diagonal" in details(g)


# ---------------------------------------------------------------------------
# The sandbox's defences, one by one
# ---------------------------------------------------------------------------

class _MyTensor(torch.Tensor):
    pass


class _Evil:
    sentinel = None          # set by the test: a file in its tmp_path

    def __reduce__(self):
        return (os.system, (f"touch {self.sentinel}",))


def test_load_record_accepts_plain_tensors_only(tmp_path):
    ok = tmp_path / "ok.pt"
    torch.save({"tensors": {"o": torch.ones(2)}, "meta": {"x": [1, 2.0, "s", None, True]}}, ok)
    assert sandbox.load_record(ok)["tensors"]["o"].sum() == 2
    _Evil.sentinel = sentinel = tmp_path / "evil_pickle_ran"
    bad = {
        "pickle": lambda p: p.write_bytes(pickle.dumps({"tensors": {"o": _Evil()}})),
        "parameter": lambda p: torch.save({"o": torch.nn.Parameter(torch.ones(1))}, p),
        "subclass": lambda p: torch.save({"o": torch.ones(1).as_subclass(_MyTensor)}, p),
        "sparse": lambda p: torch.save({"o": torch.eye(2).to_sparse()}, p),
        "not a dict": lambda p: torch.save([torch.ones(1)], p),
        "symlink": lambda p: p.symlink_to(ok),
        "fifo": lambda p: os.mkfifo(p),
    }
    for name, make in bad.items():
        p = tmp_path / f"{name.replace(' ', '_')}.pt"
        try:
            make(p)
        except (TypeError, AttributeError, RuntimeError):
            continue                      # this torch cannot even make that object: nothing to reject
        with pytest.raises(sandbox.Rejected):
            sandbox.load_record(p)
    assert not sentinel.exists()


def test_grader_files_notices_a_change(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "pkg" / "__pycache__").mkdir()
    gf = sandbox.GraderFiles([tmp_path / "pkg"])
    assert gf.changed() == []
    (tmp_path / "pkg" / "__pycache__" / "a.pyc").write_bytes(b"ignored")
    assert gf.changed() == []
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
    (tmp_path / "pkg" / "b.py").write_text("")
    assert [Path(p).name for p in gf.changed()] == ["a.py", "b.py"]


def test_results_are_written_over_a_planted_link(tmp_path):
    from grading.report import write_atomic
    target = tmp_path / "elsewhere.json"
    target.write_text("keep")
    (tmp_path / "results.json").symlink_to(target)
    write_atomic(tmp_path / "results.json", '{"score": 1}')
    assert target.read_text() == "keep" and not (tmp_path / "results.json").is_symlink()


def test_config_errors_are_clear(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('[step.1.groups]\nforward = { points = 1, weight = 2 }\n')
    with pytest.raises(cfg.ConfigError, match="unknown keys.*weight"):
        cfg.load(p)
    p.write_text('[step.1.groups]\nforward = { points = 1, cases = ["no-such-case"] }\n')
    with pytest.raises(cfg.ConfigError, match="unknown case id"):
        cfg.load(p)
    real = cfg.load()
    for n, sc in real.steps.items():
        assert sum(g.points for g in sc.groups) > 0, f"step {n} pays nothing"


def test_items_on_a_gpu_machine():
    """What would run where with a GPU (built here without one: nothing is launched)."""
    from grading.spec import STEP_SPECS, build_items
    conf = cfg.load()
    for n, sc in conf.steps.items():
        items, skipped = build_items(n, sc.groups, has_gpu=True)
        assert not skipped, f"step {n}: {skipped}"
        kinds = {(it.kind, it.device, str(it.dtype)) for it in items}
        if n <= 4 or STEP_SPECS[n].runs_on == "cpu":
            assert ("attn", "cpu", "torch.float32") in kinds
            assert {("attn", "cuda", "torch.float16"), ("attn", "cuda", "torch.bfloat16")} <= kinds
        else:
            assert ("attn", "cuda", "torch.float16") in kinds and not any(d == "cpu" for _, d, _ in kinds)
        assert any(it.kind == "time" for it in items) == any(g.kind == "speed" for g in sc.groups)
    items, skipped = build_items(7, conf.steps[7].groups, has_gpu=False)
    assert items == [] and len(skipped) == len(conf.steps[7].groups)


def _large_score_record(attention, causal):
    """An attn item at q x 100 (as spec.build_items makes it) and the record of ``attention`` on it."""
    from attnlib.inputs import make_dout, make_qkv
    from grading.spec import Item
    q, k, v = make_qkv(Nq=17, Nk=40, D=32, batch_shape=(1, 2), seed=2)
    it = Item("attn", "t", q * 100, k, v, causal, None, "cpu", dout=make_dout(q, seed=3), grads=True)
    it.expect["q_factor"] = 100.0
    qq, kk, vv = (t.clone().requires_grad_(True) for t in (it.q, k, v))
    o = attention(qq, kk, vv, is_causal=causal)
    o.backward(it.dout)
    rec = {"tensors": {"o": o.detach(), "dq": qq.grad, "dk": kk.grad, "dv": vv.grad},
           "meta": {"o_device": "cpu", "requires_grad": True}}
    return it, rec


@pytest.mark.parametrize("causal", [False, True])
def test_large_score_backward_allowance_passes_the_right_step_and_nothing_much_worse(causal):
    """The backward at q x 100: the base tolerance plus LARGE_SCORE_DRIFT_MULTIPLE x the drift of honest fp32
    computations. solutions/step04 passes (17 x 40 causal, seed 2: 83% of its dQ is past the base tolerance
    alone); its dQ moved by 2 x the allowance fails; a backward rebuilding P unshifted (NaN) fails, and the
    report says what the allowance was and what to check."""
    from attnlib.loader import load_step
    from grading.evaluate import Evaluator, Fail
    from grading.spec import LARGE_SCORE_DRIFT_MULTIPLE, Check
    step04 = load_step(4, REPO / "solutions")
    c = Check("backward", "grads", "t")
    it, rec = _large_score_record(step04.attention, causal)
    ev = Evaluator()
    ev.check_grads(c, it, rec)
    if causal:     # the case the base tolerance alone fails: the allowance is what lets it pass
        from attnlib.compare import CompareError, assert_close
        with pytest.raises(CompareError):
            assert_close(rec["tensors"]["dq"], ev._grads(it)[0], name="dQ")
    drift = ev._drift(it, 32 ** -0.5)[0]
    worse = dict(rec, tensors=dict(rec["tensors"]))
    worse["tensors"]["dq"] = rec["tensors"]["dq"] + 2 * LARGE_SCORE_DRIFT_MULTIPLE * drift + 1e-4 * ev._grads(it)[0].abs().max().float()
    with pytest.raises(Fail, match="past even that"):
        ev.check_grads(c, it, worse)

    def unshifted(q, k, v, is_causal=False):
        s = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
        if is_causal:
            s = s.masked_fill(torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).triu(1), float("-inf"))
        p = torch.exp(s)
        return (p / p.sum(-1, keepdim=True)) @ v
    it, rec = _large_score_record(unshifted, causal)
    with pytest.raises(Fail, match=r"(?s)NaN.*allows 4 x that.*never exp\(S\) alone"):
        Evaluator().check_grads(c, it, rec)


def test_the_memory_probe_cap_refuses_an_nxn_matrix_and_is_lifted_after():
    """no_nxn's memory probe: inside the cap an 8192 x 8192 float32 matrix (256 MiB) cannot be made, an
    8192 x 64 strip can; afterwards the worker's own limit is back."""
    import resource
    from grading.spec import NXN_MEMORY_HEADROOM_MB
    from grading.worker import _memory_cap
    before = resource.getrlimit(resource.RLIMIT_AS)
    with _memory_cap(NXN_MEMORY_HEADROOM_MB):
        torch.ones(8192, 64)
        with pytest.raises((RuntimeError, MemoryError)):
            torch.ones(8192, 8192)
    assert resource.getrlimit(resource.RLIMIT_AS) == before
    torch.ones(8192, 8192)


def test_the_gpu_memory_probe_is_built_for_the_triton_steps_on_a_gpu():
    """On a GPU machine steps 08 and 09 get no_nxn's memory probe at N = 16384 under a CUDA cap; step 04's
    stays on the CPU at 8192; without a GPU no Triton step gets one (the interpreter is too slow)."""
    from grading.spec import NXN_MEMORY_HEADROOM_MB, build_items
    conf = cfg.load()                                   # the course's config: every step
    for n in (8, 9):
        for has_gpu in (True, False):
            items, _ = build_items(n, conf.steps[n].groups, has_gpu=has_gpu)
            probes = [it for it in items if it.extra.get("headroom_mb")]
            if has_gpu:
                assert {(it.device, it.q.shape[-2], it.extra.get("gpu"), it.is_causal) for it in probes} == {
                    ("cuda", 16384, True, False), ("cuda", 16384, True, True)}, [it.id for it in probes]
                assert all(it.extra["headroom_mb"] == NXN_MEMORY_HEADROOM_MB and not it.extra["measure"]
                           for it in probes)
            else:
                assert not probes, [it.id for it in probes]
    items4, _ = build_items(4, conf.steps[4].groups, has_gpu=True)
    assert {(it.device, it.q.shape[-2]) for it in items4 if it.extra.get("headroom_mb")} == {("cpu", 8192)}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA memory cap needs a GPU")
def test_the_gpu_memory_probe_cap_refuses_an_nxn_matrix_and_is_lifted_after():
    """Inside the CUDA cap a 16384 x 16384 fp16 matrix (512 MiB) cannot be made, a 16384 x 64 strip can;
    the record gets the call's peak; afterwards the whole GPU is back."""
    from grading.spec import NXN_MEMORY_HEADROOM_MB
    from grading.worker import _cuda_memory_cap
    rec = {"meta": {}}
    with _cuda_memory_cap(NXN_MEMORY_HEADROOM_MB, rec):
        strip = torch.ones(16384, 64, device="cuda", dtype=torch.float16)
        with pytest.raises(torch.OutOfMemoryError):
            torch.ones(16384, 16384, device="cuda", dtype=torch.float16)
    assert 1.5 < rec["meta"]["gpu_peak_mb"] < NXN_MEMORY_HEADROOM_MB, rec
    del strip
    torch.ones(16384, 16384, device="cuda", dtype=torch.float16)


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU memory probe runs on a GPU only")
def test_nxn_except_at_the_probe_is_caught_on_a_gpu():
    """Issue 14, hole 4, on a GPU: step 09 with O(N) memory at the 512 probe and N x N elsewhere
    (hostile_gpu/nxn_except_at_probe) breaks no_nxn through the memory probe at 16384."""
    g = Grader(cfg.load(), jobs=1, threads=1).grade(FIX / "hostile_gpu" / "nxn_except_at_probe", [9])
    text = report(g)
    s = step_of(g, 9)
    assert (s.points, s.status) == (0.0, "rule broken"), text
    assert "at Nq = Nk = 16384 (full), run with 128 MiB of GPU memory" in text, text


def test_hidden_items_go_last_and_draw_from_a_seed_the_worker_cannot_know(tmp_path):
    """The worker gets items in this order, one at a time: no visible call comes after a hidden input.
    A hidden group's seed comes from the hidden file's bytes, not from the public seed and its name."""
    from grading.spec import build_items
    conf = cfg.load(TEST_CONFIG, FIX / "hidden")
    items, _ = build_items(1, conf.steps[1].groups, has_gpu=False)
    # Step 04 with a hidden group: its N x N probes (built after the groups) must still come first.
    step4 = tmp_path / "step4.toml"
    step4.write_text('[step.4.groups.hidden_fwd]\nkind = "forward"\npoints = 1\nreveal = false\n'
                     'cases = [{ batch = [1, 1], nq = 20, nk = 70, d = 16 }]\n')
    items4, _ = build_items(4, cfg.load(TEST_CONFIG, step4).steps[4].groups, has_gpu=False)
    assert any(it.nxn_probe for it in items4)
    assert {it.q.shape[-2] for it in items4 if it.extra.get("headroom_mb")} == {8192}    # the memory probe
    for its in (items, items4):
        order = [it.hidden for it in its]
        assert any(order) and order == sorted(order), (
            f"a visible item is sent after a hidden one ({[it.id for it in its]}): build_items must put "
            "the hidden groups' items last")
        assert all(c.group.startswith("hidden") for it in its if it.hidden for c in it.checks)
    assert all(set(it.task()) <= {"kind", "q", "k", "v", "is_causal", "scale", "device", "grads", "nxn_probe",
                                  "extra", "dout", "bad_q", "bad_k", "bad_v"} for it in items), "the worker gets an id or a seed"
    seed = next(g for g in conf.steps[1].groups if g.hidden).seed
    other = tmp_path / "hidden.toml"
    other.write_text((FIX / "hidden" / "hidden.toml").read_text() + "# one more line: another secret\n")
    assert next(g for g in cfg.load(TEST_CONFIG, other).steps[1].groups if g.hidden).seed != seed, (
        "the hidden group's seed does not depend on the hidden file: a worker could work it out")


# ---------------------------------------------------------------------------
# Packaging
# ---------------------------------------------------------------------------

def test_autograder_zip_follows_gradescope(tmp_path):
    from grading.package import build_autograder
    z = tmp_path / "autograder.zip"
    build_autograder(z, hidden=FIX / "hidden")
    with zipfile.ZipFile(z) as zf:
        names = zf.namelist()
        modes = {i.filename: i.external_attr >> 16 for i in zf.infolist()}
    assert "setup.sh" in names and "run_autograder" in names            # at the root of the archive
    assert modes["run_autograder"] & 0o111 and modes["setup.sh"] & 0o111
    assert "hidden/hidden.toml" in names and "grading/config.toml" in names and "steps/step01_naive.py" in names
    assert not any(n.startswith(("solutions/", "tests/")) for n in names)
    for script in ("setup.sh", "run_autograder"):
        subprocess.run(["bash", "-n", str(REPO / "grading" / "gradescope" / script)], check=True)


# ---------------------------------------------------------------------------
# What a student sees: Gradescope's rules (no grading here: results built by hand)
# ---------------------------------------------------------------------------

def _grade_by_hand(hidden_passes: bool = False, step_status: str = "failed", message: str = ""):
    """Step 01 with a visible forward group (2 checks, 1 failing), a GPU-only lowp group, and an
    after-due-date group that hides its details (2 checks)."""
    from grading.config import Group
    from grading.evaluate import CheckResult
    from grading.grade import Grade, GroupResult, StepResult

    def group(name, points, **kw):
        return Group(step=1, name=name, kind=kw.pop("kind", name), points=points, cases=[], causal=[False],
                     scales=[], **kw)
    fwd = GroupResult(group("forward", 4), [CheckResult("forward", "2x3-q1-k1-d16", "passed"),
                                           CheckResult("forward", "1x2-q17-k40-d32 causal", "failed",
                                                       "O is wrong (12.00% bad)\nlikely bug: the causal mask is off by one")])
    fwd.points = 2.0
    lowp = GroupResult(group("lowp", 0, needs_gpu=True), graded=False, note="needs a GPU")
    hid = GroupResult(group("hidden_shapes", 7, kind="forward", visibility="after_due_date", reveal=False, hidden=True),
                      [CheckResult("hidden_shapes", "1x3-q70-k70-d48", "passed"),
                       CheckResult("hidden_shapes", "1x3-q70-k70-d48 causal", "passed" if hidden_passes else "failed",
                                   "O is wrong at 1x3-q70-k70-d48")])
    hid.points = 7.0 if hidden_passes else 3.5
    s = StepResult(1, "step01_naive", "naive PyTorch attention", step_status, [fwd, lowp, hid],
                   message=message or "forward 1x2-q17-k40-d32 causal: O is wrong")
    return Grade("sub", [s], 1.0, has_gpu=False)


def _student_sees(g) -> str:
    """Everything Gradescope shows a student at once: the top-level output and every visible test."""
    gs = gradescope(g)
    return gs["output"] + "\n" + "\n".join(json.dumps(t) for t in gs["tests"] if t["visibility"] == "visible")


def test_hidden_groups_points_and_the_total_stay_hidden():
    g = _grade_by_hand()
    seen = _student_sees(g)
    assert g.points == 5.5 and g.max_points == 11
    for secret in ("5.5", "11", "3.5", "/7", "Total", "q70", "hidden_shapes"):
        assert secret not in seen, f"a student sees {secret!r} while a group is hidden:\n{seen}"
    assert "2/4" in seen and "1/2" in seen                       # the visible group's own score and checks
    # Hidden passes and visible fails: the visible table must not tell which.
    assert "visible tests passed" not in _student_sees(_grade_by_hand(hidden_passes=True))
    # A whole-step status whose message names a hidden check says only that it was a hidden one.
    g = _grade_by_hand(step_status="timed out", message="timed out: the step ran past its 120 s limit while "
                       "running hidden_shapes 1x3-q70-k70-d48 causal (an infinite loop?)")
    seen = _student_sees(g)
    assert "q70" not in seen and "a hidden check" in seen, seen
    # Once nothing is hidden, the total is back.
    g = _grade_by_hand()
    g.steps[0].groups[2].group.visibility = "visible"
    assert "Total 5.5/11" in gradescope(g)["output"]


def test_gradescope_tests_are_numbered_without_gaps_and_say_not_implemented_once():
    from grading.evaluate import CheckResult
    g = _grade_by_hand()
    assert [t["number"] for t in gradescope(g)["tests"]] == ["1.1", "1.2"]      # lowp (GPU only) is left out
    s = g.steps[0]
    s.status, s.message = "not implemented", "not implemented: Step 01: compute softmax(QK^T * scale) V"
    s.groups[0].checks = [CheckResult("forward", f"case{i}", "not implemented", s.message) for i in range(3)]
    out = gradescope(g)["tests"][0]["output"]
    assert out.count("Step 01: compute") == 1 and "not implemented: not implemented" not in out, out
    assert "not implemented: not implemented" not in table(g) and "not implemented: Step 01" in table(g)


def test_repeated_failure_messages_are_shown_once():
    from grading.evaluate import CheckResult
    g = _grade_by_hand()
    msg = "O is wrong (100.00% bad)\nlikely bug: the accumulator is not rescaled"
    g.steps[0].groups[0].checks = [CheckResult("forward", f"case{i}", "failed", msg) for i in range(3)]
    out = gradescope(g)["tests"][0]["output"]
    assert out.count("accumulator is not rescaled") == 1 and out.count("the same as case0") == 2, out


# ---------------------------------------------------------------------------
# The global time budget: a slow submission keeps what was graded before the deadline
# ---------------------------------------------------------------------------

@pytest.mark.slow
def test_a_run_cut_by_its_budget_still_writes_what_it_graded(tmp_path):
    sub = tmp_path / "sub"
    sub.mkdir()
    shutil.copyfile(REPO / "solutions" / "step01_naive.py", sub / "step01_naive.py")
    shutil.copyfile(FIX / "hostile" / "infinite_loop" / "step01_naive.py", sub / "step03_sdpa.py")   # never returns
    shutil.copyfile(REPO / "solutions" / "step04_flash_torch.py", sub / "step04_flash_torch.py")
    # Step 01 must be graded within budget - BUDGET_RESERVE_S - 5 s for step 03 to start. In `make gpu-check` four
    # pytest groups share the H200 machine and step 01 took more than 10 s there (2026-12-02, fe7f0f9: step 03 "out
    # of time" instead of "timed out"); on a CPU it takes a few seconds.
    budget = 45 if torch.cuda.is_available() else 30
    t0 = time.monotonic()
    out, _ = run_cli("--impl", str(sub), "--step", "1,3,4", "--config", str(TEST_CONFIG), "--jobs", "1",
                     "--budget-s", str(budget), "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache"))
    secs = time.monotonic() - t0
    assert secs < budget + 10, f"the run took {secs:.0f} s against a {budget} s budget\n{out}"
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    steps = res["extra_data"]["steps"]
    assert steps["step01_naive"]["status"] == "passed" and steps["step01_naive"]["points"] == 10, out
    assert steps["step03_sdpa"]["status"] == "timed out" and steps["step04_flash_torch"]["status"] == "out of time", out
    assert res["score"] == 10 and steps["step04_flash_torch"]["max"] > 0, res["score"]
    assert f"of the grading run's {budget:g} s budget" in out and "budget ran out" in out, out


def test_the_grade_so_far_is_reported_after_every_step(tmp_path):
    """`on_step` sees each step land; the steps not graded yet count 0, saying why."""
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "step01_naive.py").write_text("raise NotImplementedError('Step 01: not yet')\n")
    seen = []
    Grader(cfg.load(TEST_CONFIG), jobs=1, threads=1).grade(sub, [1, 3], on_step=seen.append)
    assert [[s.status for s in g.steps] for g in seen] == [
        ["out of time", "out of time"], ["not implemented", "out of time"], ["not implemented", "missing"]]
    assert "stopped before this step finished" in seen[1].steps[1].message
    assert seen[1].max_points == seen[2].max_points > 0          # an unfinished step counts against the total
    json.dumps(gradescope(seen[1]))                               # and is a valid results.json


# ---------------------------------------------------------------------------
# Where the step files are: the shapes a submission comes in
# ---------------------------------------------------------------------------

def test_step_files_are_found_at_the_top_in_steps_or_one_folder_deeper(tmp_path):
    from grading.grade import find_submission

    def sub(*paths):
        root = tmp_path / f"sub{len(list(tmp_path.iterdir()))}"
        for rel in paths:
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text("")
        root.mkdir(exist_ok=True)
        return root
    for paths, where in [(["step01_naive.py"], "."), (["steps/step01_naive.py", "README.md"], "steps"),
                         (["attention-course/steps/step01_naive.py", "__MACOSX/x"], "attention-course/steps"),
                         (["mywork/step01_naive.py", "mywork/step02_compile.py"], "mywork")]:
        root = sub(*paths)
        found, note = find_submission(root)
        assert found == (root / where).resolve() and note == "", (paths, found, note)
    # Two candidates: the fuller one, and a note that says so.
    root = sub("old/step01_naive.py", "new/steps/step01_naive.py", "new/steps/step02_compile.py")
    found, note = find_submission(root)
    assert found == (root / "new" / "steps").resolve() and "(new/steps/, old/)" in note, note
    # Nothing: the note says where the grader looked and what it saw, and the student sees it.
    root = sub("attention-course/deeper/steps/step01_naive.py", "notes.txt")
    found, note = find_submission(root)
    assert found == root.resolve()
    assert "looked in the submission's top folder, its steps/, and each subfolder" in note
    assert "notes.txt" in note and "It saw: notes.txt, attention-course/deeper/steps/step01_naive.py" in note   # too deep: shown
    g = Grader(cfg.load(TEST_CONFIG), jobs=1, threads=1).grade(root, [1])
    gs = gradescope(g)
    assert g.steps[0].status == "missing" and note in gs["output"]
    assert "the note under the table says where the grader looked" in gs["tests"][0]["output"]


def test_ring_gradients_get_the_large_score_allowance_and_no_more():
    """attnlib.ringcheck.rank_failures with an allowance: a rank's dQ off by less than the allowance (past
    the base tolerance) passes; off by twice the allowance fails, with the large-score note."""
    from attnlib.ringcheck import RingCase, _references, positions, rank_failures
    case = RingCase(batch=(1, 1), n=16, d=8)
    inputs, ref_lse, refs = _references(case, grads=True)
    rows = positions(case.n, 2, 0, False)
    got = {"lse": ref_lse[..., rows].float(), "o": refs[0][..., rows, :].float(),
           "dq": refs[1][..., rows, :].float(), "dk": refs[2][..., rows, :].float(), "dv": refs[3][..., rows, :].float()}
    extra = 1e-3
    allowance = {name: (extra, extra / 4, 100.0) for name in ("dQ", "dK", "dV")}
    got["dq"] = got["dq"] + 0.5 * extra
    assert rank_failures(got, 0, 2, case, inputs, ref_lse, refs, allowance=allowance) == []
    assert [f[0] for f in rank_failures(got, 0, 2, case, inputs, ref_lse, refs)] == ["dQ"]     # no allowance: past
    got["dq"] = got["dq"] + 1.5 * extra
    fails = rank_failures(got, 0, 2, case, inputs, ref_lse, refs, allowance=allowance)
    assert [f[0] for f in fails] == ["dQ"] and "large scores (q x 100)" in fails[0][2], fails


def test_compiled_rule_sees_attention_in_an_opaque_op_in_steady_state():
    """``compiled``: attention hidden in a custom op inside the compiled graph, the graph warm (no recompile
    in the watched call: the ops sit under "## Call CompiledFxGraph ##"), counts as eager; the solution's
    compiled naive attention, warm too, counts nothing. The rule's own look, without a worker."""
    import importlib.util
    from grading.worker import Guards
    from attnlib.loader import load_step

    spec = importlib.util.spec_from_file_location(
        "hostile_compile_opaque_op", FIX / "hostile" / "compile_opaque_op" / "step02_compile.py")
    cheat = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cheat)                                  # compiles and warms up at import
    honest = load_step(2, "solutions")
    q, k, v = (torch.randn(1, 2, 17, 8), torch.randn(1, 2, 40, 8), torch.randn(1, 2, 40, 8))
    for name, fn in (("cheat", cheat.attention), ("solution", honest.attention)):
        fn(q, k, v, True)                                           # the watched call below recompiles nothing
        g = Guards(["compiled"])
        g.score_numel = 2 * 17 * 40
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
            fn(q, k, v, True)
        g._count_eager(prof)
        if name == "cheat":
            assert g.counts["eager_attention_ops"] > 0 and "inside hostile::attn" in g.eager_desc, g.eager_desc
        else:
            assert g.counts["eager_attention_ops"] == 0, g.eager_desc


def test_outside_measure_is_the_graders_own(tmp_path):
    """A record's "outside" entry (the worker tree's resident memory during the item, read from /proc by the
    grader) is always the grader's: one the worker wrote into its record is dropped or overwritten."""
    (tmp_path / "out").mkdir()
    run = sandbox.WorkerRun()
    run.sent = 2
    run.records = {0: {"outside": {"rss_start_mb": 0.0, "rss_peak_mb": 0.0}},
                   1: {"outside": {"rss_start_mb": 0.0, "rss_peak_mb": 0.0}}}
    run.item_rss = {1: (100.0, 900.0)}
    sandbox._collect(run, tmp_path / "out", 2)
    assert "outside" not in run.records[0]
    assert run.records[1]["outside"] == {"rss_start_mb": 100.0, "rss_peak_mb": 900.0}


def test_a_machine_without_namespaces_says_so(monkeypatch, tmp_path):
    """No PID/mount/network namespace for the workers (no root, no unshare): the grade still runs, on the
    older protections, and says so in the table's header, in a note and in results.json."""
    monkeypatch.setattr(sandbox, "namespaces_available", lambda: False)
    g = Grader(cfg.load(TEST_CONFIG), jobs=1, threads=1).grade(REPO / "solutions", [1])
    assert step_of(g, 1).status == "passed"
    assert table(g).splitlines()[0].startswith("WITHOUT OS ISOLATION")
    assert any("without OS isolation" in n for n in g.notes)
    res = gradescope(g)
    assert res["extra_data"]["worker_namespaces"] is False and "without OS isolation" in res["output"]


def test_batch_row_of_a_killed_or_stopped_grader(monkeypatch, tmp_path):
    """A grader process killed by a signal, or stopped past its time, is that row's error, said as such;
    the batch goes on (``grade_one`` returns the row, it does not raise)."""
    import argparse
    from grading import batch

    args = argparse.Namespace(config=None, hidden=None, worker_user=None, budget_s=None, step=None)
    (tmp_path / "alice").mkdir()

    def killed(cmd, **kw):
        return subprocess.CompletedProcess(cmd, -9, stdout="", stderr="")

    def stopped(cmd, **kw):
        raise subprocess.TimeoutExpired(cmd, kw.get("timeout"))

    monkeypatch.setattr(batch.subprocess, "run", killed)
    row = batch.grade_one(tmp_path / "alice", tmp_path / "out", args, 60, [1])
    assert row["error"].startswith("grader killed by SIGKILL") and row["points"] == 0.0
    monkeypatch.setattr(batch.subprocess, "run", stopped)
    row = batch.grade_one(tmp_path / "alice", tmp_path / "out", args, 60, [1])
    assert "ran past 60 s (stopped or hung" in row["error"]


def test_no_sdpa_blocker_falls_back_to_the_public_api(monkeypatch):
    """Where PyTorch's private registration API differs, the blocker is registered through torch.library
    (destroyable by a submission, so it says so in the counts) and SDPA is still blocked."""
    import torch.nn.functional as F
    from grading import worker

    def differs(*args):
        raise TypeError("another PyTorch")

    monkeypatch.setattr(worker, "_raw_library", differs)
    g = worker.Guards(["no_sdpa"])
    q = torch.randn(1, 1, 4, 8)
    g._block_sdpa()
    try:
        with pytest.raises(RuntimeError, match="the grader blocks aten::"):
            F.scaled_dot_product_attention(q, q, q)
        assert g.counts["sdpa_blocker_public"] == 1 and g.sdpa_blocked
    finally:
        g._sdpa_lib._destroy()
    F.scaled_dot_product_attention(q, q, q)                       # this test process gets SDPA back


# In a fresh interpreter, as in a worker: torch._dynamo is not loaded until something imports it.
_DYNAMO_LATE = '''
import sys
import torch
import grading.worker as w
assert "torch._dynamo" not in sys.modules, "torch._dynamo was loaded before the test began"
assert w._DISPATCH_WRAPPED is not w._DISPATCH_RAW, "torch no longer wraps a mode's __torch_dispatch__"
g = w.Guards(["no_sdpa", "no_nxn"])
g.install()
with g.watch("fwd", nxn_probe=True):
    torch.ones(3, 4) @ torch.ones(4, 5)
assert g.max_numel == 20, g.max_numel                          # the mode saw the ops
assert "torch._dynamo" not in sys.modules, "a watched op imported torch._dynamo"
assert w._OpDispatchMode.__torch_dispatch__ is w._DISPATCH_RAW
import torch._dynamo  # noqa: E402
assert w._OpDispatchMode.__torch_dispatch__ is w._DISPATCH_WRAPPED, "torch._dynamo loaded, the mode unwrapped"
with g.watch("fwd", nxn_probe=True):
    torch.ones(6, 7).sum()
assert g.max_numel == 42, g.max_numel
g2 = w.Guards(["no_sdpa"])
g2.install()                                                   # Dynamo loaded: wrapped from the start
assert w._OpDispatchMode.__torch_dispatch__ is w._DISPATCH_WRAPPED
print("ok")
'''


def test_the_dispatch_mode_is_dynamo_disabled_once_dynamo_is_loaded():
    """The rules' dispatch mode (grading/worker.py) runs without torch._disable_dynamo's wrapper, whose first
    call imports torch._dynamo (1.3-1.8 s of every grade of steps 04-10), while Dynamo is not loaded, and has
    that wrapper back the moment torch._dynamo is imported, before anything can be compiled."""
    r = subprocess.run([sys.executable, "-c", _DYNAMO_LATE], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
