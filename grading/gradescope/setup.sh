#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image (Ubuntu 22.04 and
# Python 3.10 by default). The zip's contents are in /autograder/source.
#
# What it installs, and why:
#   python3-dev     Python.h: torch.compile (step 02) compiles C++ against it; without it every
#                   student scores 0 on step 02 ("fatal error: Python.h: No such file or directory")
#   python3-venv    the grading venv, /autograder/venv
#   g++             the compiler Inductor's CPU backend calls
#   torch           the CPU build, from PyTorch's CPU index (Gradescope has no GPU; PyPI's torch is
#                   the CUDA build, ~2.5 GB more); if that index cannot be reached, PyPI at once
#   the runtime dependencies of pyproject.toml's [project] (triton, numpy, tqdm, tomli on 3.10...),
#                   not the development ones (pytest, jupyter): the venv only grades
set -euo pipefail
cd /autograder/source
VENV=/autograder/venv
TORCH="torch>=2.11,<2.14"
CPU_INDEX=https://download.pytorch.org/whl/cpu

export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends python3 python3-dev python3-venv g++ ca-certificates

python3 -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install --upgrade pip || echo "setup.sh: could not upgrade pip; going on with $("$PIP" --version)" >&2
# pyproject.toml's [project] dependencies: what the grader needs at run time, nothing else.
mapfile -t RUNTIME < <(python3 - <<'PY'
import re
text = open("pyproject.toml").read()
block = re.search(r"^\[project\]$.*?^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
for spec in re.findall(r'^\s*"([^"]+)"', block, re.M):
    if not spec.startswith("torch"):          # installed first, from the CPU index
        print(spec.replace("'", '"'))
PY
)
# --retries 0: a CPU index that cannot be reached fails in seconds, not after 5 retries per package.
if ! "$PIP" install --retries 0 --timeout 30 "$TORCH" --index-url "$CPU_INDEX"; then
    echo "setup.sh: PyTorch's CPU index ($CPU_INDEX) could not be reached or had no matching torch;" \
         "installing $TORCH from PyPI instead (the CUDA build: about 2.5 GB more, same results on a CPU)" >&2
    # One resolve with the runtime pins: PyPI's torch depends on triton, which the course pins too.
    "$PIP" install "$TORCH" "${RUNTIME[@]}"
fi
"$PIP" install "${RUNTIME[@]}"
"$VENV/bin/python" -c "import torch, triton, numpy; print('setup.sh: torch', torch.__version__, '| triton', triton.__version__)"
# Self-test, before any student depends on it: torch.compile (step 02) under the address-space cap
# the grader gives a CPU worker (memory_mb). It needs Python.h and g++, and a cap that fits the
# torch build: PyPI's CUDA build maps far more address space than the CPU build. On a stock
# Ubuntu 22.04 root, torch 2.11.0+cu130 under 4096 MiB compiled step 02's first graph and ran out
# of memory (MemoryError) on the second, 4 of 10 points; under 16384 MiB it scored 10/10.
"$VENV/bin/python" - <<'PY'
import resource, sys
from grading import config
conf = config.load()
cap_mb = min(sc.memory_mb for sc in conf.steps.values())
import torch
if torch.version.cuda and cap_mb < 16384:
    sys.exit(f"setup.sh: torch {torch.__version__} is a CUDA build, and the grader caps a CPU worker's address "
             f"space at {cap_mb} MiB (grading/config.toml, memory_mb): torch.compile runs out of it, and step 02 "
             "would lose points for every student. Make PyTorch's CPU index reachable, or ship a config with "
             "memory_mb = 16384: python -m grading autograder --config FILE.")
cap_mb = conf.steps[2].memory_mb
resource.setrlimit(resource.RLIMIT_AS, (cap_mb << 20, cap_mb << 20))
try:
    for causal in (False, True):      # two graphs, as step 02's grading compiles
        mask = torch.ones(8, 8, dtype=torch.bool).triu(1) if causal else torch.zeros(8, 8, dtype=torch.bool)
        torch.compile(lambda x, m: (x @ x.T).masked_fill(m, -1e9).softmax(-1))(torch.randn(8, 8), mask)
except Exception as exc:
    sys.exit(f"setup.sh: torch.compile fails under step 02's {cap_mb} MiB address-space cap with torch "
             f"{torch.__version__}: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}\n"
             "Every student would lose step 02. Is python3-dev (Python.h) installed, and g++?")
print(f"setup.sh: torch.compile works under step 02's {cap_mb} MiB address-space cap")
PY

# Student code runs as this user, which cannot read the hidden tests or write
# the results, the grader's source or the virtual environment.
id student >/dev/null 2>&1 || adduser --disabled-password --gecos "" --no-create-home student
chown -R root:root /autograder/source "$VENV"
chmod -R go-w /autograder/source "$VENV"
if [ -d hidden ]; then chmod -R o-rwx hidden; fi
# Warm the import caches once, as root, so the first submission is not slower.
"$VENV/bin/python" -c "import torch, grading.grade" || true
