"""Shared test setup (at the repository root, so `pytest --impl ...` is known before tests are collected).

Which implementation is tested: ``--impl steps`` (default, your work),
``--impl solutions``, or ``--impl path/to/submission`` (``--impl=PATH`` too; the folder may be
anywhere); or ATTN_IMPL. The option itself comes from attnlib/pytest_plugin.py, installed with
the course, so pytest knows it before it parses a path that follows it.

    pytest -m quick          # one quick test per step (what `make check` runs)
    pytest -m step04         # one step
"""

import os

import torch

# Without a GPU, Triton kernels run in its interpreter. The flag is read when
# triton is imported, and torch.compile imports it: set it before anything else.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from attnlib.contract import STEPS

STEP_OF_MARK = {f"step{n:02d}": n for n in STEPS}


def pytest_addoption(parser):
    # Only when the course is not installed (no `pip install -e .`): then --impl works before
    # a path under the repository, not before a folder outside it.
    from attnlib.pytest_plugin import add_impl_option
    add_impl_option(parser)


def pytest_configure(config):
    impl = config.getoption("--impl")
    if impl:
        os.environ["ATTN_IMPL"] = impl
    os.environ.setdefault("ATTN_IMPL", "steps")
    for mark in STEP_OF_MARK:
        config.addinivalue_line("markers", f"{mark}: tests of step {mark[4:]} ({STEPS[STEP_OF_MARK[mark]][1]})")
    # Markers and warning filters live here, not only in pytest.ini: with `--impl /folder/elsewhere`
    # pytest takes that folder for its root and never reads pytest.ini.
    for line in ("gpu: needs a CUDA GPU (skipped on a CPU, with the reason)",
                 "slow: takes more than a few seconds on a CPU",
                 "quick: one fast test per step, run by `make check` (pytest -m quick)"):
        config.addinivalue_line("markers", line)
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:torch.*")
    # NumPy 2.x on Triton 3.6 interpreter internals: not the student's code.
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:triton.*")
    config.option.strict_markers = True
    # Tolerances for float32 assume true fp32 matrix products (attnlib/compare.py).
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


@pytest.fixture(autouse=True)
def _fp32_stays_fp32():
    """A test that turns TF32 on and leaves it on fails, and the setting is put back: every later float32
    test in the same worker would otherwise compare TF32 products against the fp32 bound (on a GPU), a
    failure far from its cause and dependent on which worker ran what."""
    yield
    flags = {"torch.backends.cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
             "torch.backends.cudnn.allow_tf32": torch.backends.cudnn.allow_tf32}
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    left_on = [name for name, on in flags.items() if on]
    if left_on:
        pytest.fail(f"this test left {', '.join(left_on)} = True (conftest.py sets them False for the whole "
                    f"run): restore the setting where it is changed (try/finally)", pytrace=False)


def pytest_report_header(config):
    from attnlib.loader import impl_root
    try:
        root = impl_root()
    except FileNotFoundError as e:
        return f"attention implementation: {e}"
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    return f"attention implementation: {root}  (GPU: {gpu})"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Report a stub's NotImplementedError as one line, and a Triton error in a few, not a traceback."""
    outcome = yield
    rep = outcome.get_result()
    if call.excinfo is None or not rep.failed:
        return
    if call.excinfo.errisinstance(NotImplementedError):
        rep.longrepr = f"NOT IMPLEMENTED: {call.excinfo.value}"
    elif item.config.getoption("tbstyle", "auto") != "long":
        from attnlib.diagnose import triton_report
        short = triton_report(call.excinfo.value)
        if short:
            rep.longrepr = short


@pytest.fixture
def load():
    """``load(4)`` imports step 04 from the implementation under test; a step the folder lacks is skipped."""
    from attnlib.contract import STEPS
    from attnlib.loader import impl_root, load_step

    def _load(n, impl=None):
        if impl is None and not (impl_root() / f"{STEPS[n][0]}.py").exists():
            pytest.skip(f"step {n:02d} is not in {impl_root()} ({STEPS[n][0]}.py)")
        return load_step(n, impl) if impl is not None else load_step(n)
    return _load


# The longest tests on a 2-core CPU (`--durations=40` of `make test`, 2026-12-02: the grader's whole-class runs
# 136 and 63 s, notebook 10 52 s, a hostile submission 47 s, every .cu file through nvcc 43 s, then 20-36 s
# each). Run first, longest first, so that `make test`'s two workers do not end on one of them alone (a long
# test started last added up to 2 minutes to the run). Reordered after step 10's stub (ranks forked with
# torch._dynamo loaded, attnlib/dist.py) and hostile/compile_opaque_op (its warm-up) got shorter: 16 -> 9 s
# and 48 -> 25-34 s alone.
LONG_FIRST = (
    "tests/test_grading.py::test_solutions_score_full_marks",
    "tests/test_notebooks.py::test_notebook_runs[10_ring]",
    "tests/test_step07_cuda.py::test_every_cu_file_compiles",
    "tests/test_grading.py::test_stubs_score_zero_not_implemented",
    "tests/test_grading.py::test_hostile_submission[compile_opaque_op]",
    "tests/test_grading.py::test_batch_grades_everyone_despite_broken_submissions",
    "tests/test_grading.py::test_wrong_submission_loses_exactly_its_points[step02-not-compiled]",
    "tests/test_grading.py::test_wrong_submission_loses_exactly_its_points[step02-scale-twice]",
    "tests/test_release.py::test_release_filled_with_solutions_passes_its_quick_check",
    "tests/test_grading.py::test_hostile_submission[compile_decoy_inside]",
    "tests/test_notebooks.py::test_notebook_runs[06_triton_bwd]",
    "tests/test_grading.py::test_wrong_submission_loses_exactly_its_points[step02-causal-dropped]",
    "tests/test_step04_flash_torch.py::test_compiled[100-100-True-cpu-float32]",
    "tests/test_bench_capstone.py::test_cpu_smoke_runs_every_part_and_records_what_cannot_run",
)


def pytest_collection_modifyitems(config, items):
    rank = {nodeid: i for i, nodeid in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid, len(LONG_FIRST)))     # stable: the rest keep their order
