# Two commands matter: `make grade` (your work) and `make test` (the whole suite).
# Both set up .venv first if it is missing.
PY      ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
IMPL    ?= steps
STAMP   := $(VENV)/.installed

.PHONY: setup grade test test-solutions test-stubs stubs check-stubs notebooks bench clean help

help:
	@echo "make grade   grade your steps/ (IMPL=solutions or IMPL=path to grade another folder)"
	@echo "make test    the whole suite against solutions/, stubs and notebooks included"
	@echo "make stubs   regenerate steps/ from solutions/ (refuses to overwrite your edits)"
	@echo "make bench   benchmark every step (small on a CPU, FlashAttention's grid on a GPU)"

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

clean:
	rm -rf $(VENV) .pytest_cache
