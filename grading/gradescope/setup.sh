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
# --retries 0: a CPU index that cannot be reached fails in seconds, not after 5 retries per package.
if ! "$PIP" install --retries 0 --timeout 30 "$TORCH" --index-url "$CPU_INDEX"; then
    echo "setup.sh: PyTorch's CPU index ($CPU_INDEX) could not be reached or had no matching torch;" \
         "installing $TORCH from PyPI instead (the CUDA build: about 2.5 GB more, same results on a CPU)" >&2
    "$PIP" install "$TORCH"
fi
# pyproject.toml's [project] dependencies: what the grader needs at run time, nothing else.
mapfile -t RUNTIME < <(python3 - <<'PY'
import re
text = open("pyproject.toml").read()
block = re.search(r"^\[project\]$.*?^dependencies = \[(.*?)^\]", text, re.S | re.M).group(1)
for spec in re.findall(r'^\s*"([^"]+)"', block, re.M):
    if not spec.startswith("torch"):          # installed above, from the CPU index
        print(spec.replace("'", '"'))
PY
)
"$PIP" install "${RUNTIME[@]}"
"$VENV/bin/python" -c "import torch, triton, numpy; print('setup.sh: torch', torch.__version__, '| triton', triton.__version__)"

# Student code runs as this user, which cannot read the hidden tests or write
# the results, the grader's source or the virtual environment.
id student >/dev/null 2>&1 || adduser --disabled-password --gecos "" --no-create-home student
chown -R root:root /autograder/source "$VENV"
chmod -R go-w /autograder/source "$VENV"
if [ -d hidden ]; then chmod -R o-rwx hidden; fi
# Warm the import caches once, as root, so the first submission is not slower.
"$VENV/bin/python" -c "import torch, grading.grade" || true
