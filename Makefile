# Two commands matter: `make grade` (your work) and `make test` (the whole suite).
# Both set up .venv first if it is missing.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
IMPL    ?= steps
STAMP   := $(VENV)/.installed

.PHONY: setup grade test test-solutions test-stubs stubs check-stubs notebooks bench gpu-check clean help

help:
	@echo "make grade   grade your steps/ (IMPL=solutions or IMPL=path to grade another folder)"
	@echo "make test    the whole suite against solutions/, stubs and notebooks included"
	@echo "make stubs   regenerate steps/ from solutions/ (refuses to overwrite your edits)"
	@echo "make bench   benchmark every step (small on a CPU, FlashAttention's grid on a GPU)"
	@echo "make gpu-check  on a GPU: the whole suite, the grader on solutions and stubs, the leaderboard"

$(STAMP): requirements.txt
	test -x $(VPY) || $(PY) -m venv $(VENV)
	# torch first: on the course's CPU machines `torch==2.13.0` is a local CPU build;
	# a bare `torch` would fetch a multi-GB CUDA build.
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q "torch==2.13.0" || $(VPY) -m pip install -q "torch>=2.11,<2.14"
	$(VPY) -m pip install -q -r requirements.txt
	touch $(STAMP)

setup: $(STAMP)

grade: $(STAMP)
	$(VPY) -m grading --impl $(IMPL)

test: $(STAMP)
	$(VPY) -m pytest --impl solutions -q

stubs: $(STAMP)
	$(VPY) -m attnlib.stubgen

check-stubs: $(STAMP)
	$(VPY) -m attnlib.stubgen --check

bench: $(STAMP)
	$(VPY) -m bench

# On a GPU machine: every test in parallel, the grader on solutions/ (full marks) and on pristine
# stubs (zero), the compiled-model tests, the leaderboard in CS336's harness and ours; writes
# results/h200/gpu-check/summary.json. GPU_PY: the interpreter with a CUDA torch (.venv if set up).
GPU_PY ?= $(shell test -x $(VPY) && echo $(VPY) || echo python3)
gpu-check:
	$(GPU_PY) -m bench.gpu_check

clean:
	rm -rf $(VENV) .pytest_cache
