# Two commands matter: `make grade` (your work) and `make test` (the whole suite).
# Every target sets up .venv first if it is missing.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
IMPL    ?= steps
LEVEL   ?= guided
STAMP   := $(VENV)/.installed

.PHONY: setup grade check test test-grader stubs check-stubs lab notebooks executed bench gpu-check clean help

help:
	@echo "make grade   grade your steps/ (IMPL=solutions or IMPL=path to grade another folder)"
	@echo "make check   one quick test per step on IMPL (default: your steps/), under 2 minutes on a laptop"
	@echo "make test    the whole suite against solutions/, stubs and notebooks included"
	@echo "make test-grader  the grader's hostile and planted submissions graded as one batch (-j 2), minutes"
	@echo "make lab     Jupyter Lab at the repository root (the notebooks are in notebooks/)"
	@echo "make notebooks  write notebooks/NN_*.ipynb from their sources notebooks/NN_*.py (jupytext)"
	@echo "make executed  run every notebook against solutions/ into notebooks/executed/ (on the GPU machine)"
	@echo "make stubs   regenerate steps/ from solutions/ (refuses to overwrite your edits);"
	@echo "             make stubs LEVEL=hard: the hard track, signatures and docstrings without hints"
	@echo "make bench   benchmark every step (small on a CPU, FlashAttention's grid on a GPU)"
	@echo "make gpu-check  on a GPU: the whole suite, the grader on solutions and stubs, the leaderboard"

# The course itself is installed in editable mode (`pip install -e .`): attnlib, the grader and
# the pytest option --impl then import from any folder, notebooks/ included, with no PYTHONPATH.
$(STAMP): requirements.txt pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	# torch first: on the course's CPU machines `torch==2.13.0` is a local CPU build;
	# a bare `torch` would fetch a multi-GB CUDA build.
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q "torch==2.13.0" || $(VPY) -m pip install -q "torch>=2.11,<2.14"
	$(VPY) -m pip install -q -r requirements.txt
	$(VPY) -m pip install -q --no-deps -e .
	touch $(STAMP)

setup: $(STAMP)

grade: $(STAMP)
	$(VPY) -m grading --impl $(IMPL)

check: $(STAMP)
	$(VPY) -m pytest -m quick --impl $(IMPL) -q

# Two pytest-xdist workers, one thread each (the CI machine's two cores). `--dist worksteal`: an idle worker
# takes queued tests from the busy one. With `--dist load` a few long tests (the grader's whole-class runs,
# 54-117 s) could land on one worker at the end: 11m58s-12m29s on 2 cores (2026-12-01, 878 tests), against
# 9m53s with worksteal, the tests' own time being 19m22s in all. Each planted submission is graded by the
# worker whose test asks. (TORCHINDUCTOR_COMPILE_THREADS=1, Inductor compiling in-process, was tried on
# 2026-12-02 and is slower here: steps 02 and 04's compiled tests, cold caches, two runs each alternated,
# 67-72 s against 60-63 s with Inductor's own compile pool.)
# 2026-12-03, this VM, 2 cores, 1008-1012 tests, 610 skipped (wall times noisy: another job shared the VM):
# before 931d992, 13m32s (pytest's own) and 11m54s with a fresh Inductor cache (1329 s CPU in all; the grader's
# whole-class run 137 s of it, its step 02 36 s CPU cold when graded alone). 931d992: the solutions' and the planted
# bugs' grades compile into this machine's Inductor cache (tests/test_grading.py, trusted_cache; hostile
# submissions keep their own): warm, step 02's grade 36 -> 15 s alone, step02-scale-twice 29 -> 14 s CPU,
# step02-not-compiled 20 -> 14 s. `bash .ci/run` on a clean clone after it: 11m26s (12m33s with the install);
# with a fresh Inductor cache 14m07s, every test slower than the run before, the ones untouched too (1585 s CPU).
test: $(STAMP)
	OMP_NUM_THREADS=1 $(VPY) -m pytest --impl solutions -q -n 2 --dist worksteal

# The grader's corpus as one class (every hostile submission, the planted bugs of steps 01-04) in one
# `python -m grading batch -j 2`: every row as it scores alone. Minutes; not part of `make test`.
test-grader: $(STAMP)
	ATTN_GRADER_BATCH=1 OMP_NUM_THREADS=1 $(VPY) -m pytest --impl solutions -q tests/test_grading_batch.py

lab: $(STAMP)
	$(VPY) -m jupyter lab --notebook-dir=$(CURDIR)

notebooks: $(STAMP)
	$(VPY) -m jupytext --to notebook --update notebooks/[0-9][0-9]_*.py

executed: $(STAMP)
	$(VPY) -m attnlib.nb execute notebooks/executed

stubs: $(STAMP)
	$(VPY) -m attnlib.stubgen --level $(LEVEL)

check-stubs: $(STAMP)
	$(VPY) -m attnlib.stubgen --check

bench: $(STAMP)
	$(VPY) -m bench

# On a GPU machine: every test in parallel, the grader on solutions/ (full marks) and on pristine
# stubs (zero), the compiled-model tests, the leaderboard in CS336's harness and ours; writes
# results/h200/gpu-check/summary.json. GPU_PY: the interpreter with a CUDA torch (.venv if set up).
# Where one command may not run 10 minutes (the course's lent H200), two at one commit:
#   make gpu-check PARTS=lb,tests RUNS=suite,notebooks
#   make gpu-check PARTS=tests,grade RUNS=grading MERGE=results/h200/gpu-check/summary.json
GPU_PY ?= $(shell test -x $(VPY) && echo $(VPY) || echo python3)
gpu-check:
	$(GPU_PY) -m bench.gpu_check $(if $(PARTS),--parts $(PARTS)) $(if $(RUNS),--tests-runs $(RUNS)) $(if $(MERGE),--merge-from $(MERGE))

clean:
	rm -rf $(VENV) .pytest_cache *.egg-info
