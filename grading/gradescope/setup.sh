#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image
# (Ubuntu 22.04 by default). The zip's contents are in /autograder/source.
set -euo pipefail
cd /autograder/source

apt-get install -y --no-install-recommends python3 python3-pip python3-venv g++
python3 -m venv /autograder/venv
PIP=/autograder/venv/bin/pip
$PIP install --upgrade pip
# The CPU build of torch (Gradescope has no GPU): the default wheel would pull CUDA.
$PIP install "torch>=2.11,<2.14" --index-url https://download.pytorch.org/whl/cpu
$PIP install -r requirements.txt
# Python 3.10 has no tomllib: the grader reads its config with tomli there.
/autograder/venv/bin/python -c "import tomllib" 2>/dev/null || $PIP install "tomli>=2"

# Student code runs as this user, which cannot read the hidden tests or write
# the results, the grader's source or the virtual environment.
id student >/dev/null 2>&1 || adduser --disabled-password --gecos "" --no-create-home student
chown -R root:root /autograder/source /autograder/venv
chmod -R go-w /autograder/source /autograder/venv
if [ -d hidden ]; then chmod -R o-rwx hidden; fi
# Warm the import caches once, as root, so the first submission is not slower.
/autograder/venv/bin/python -c "import torch, grading.grade" || true
