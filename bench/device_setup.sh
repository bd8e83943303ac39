#!/usr/bin/env bash
# Make a GPU machine without network match requirements.txt before `make gpu-check`:
#   - the wheels in .whl/ (downloaded where there is network, carried over), installed offline:
#     numpy < 2.4 (Triton 3.6's interpreter fails on numpy 2.4: "only 0-dimensional arrays can be
#     converted to Python scalars"), and what executes notebooks (nbclient, nbformat, jupytext, ipykernel);
#   - the course itself, editable (`make setup` does the same with network).
# Where there is network, `make setup` is all this is. Fill .whl/ with:
#   pip download setuptools "numpy==2.3.5" nbclient nbformat jupytext ipykernel "pytest-timeout>=2.3" --only-binary=:all: \
#     --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
if compgen -G ".whl/*.whl" > /dev/null; then
    "$PY" -m pip install -q --no-index --find-links .whl setuptools "numpy<2.4" nbclient nbformat jupytext ipykernel "pytest-timeout>=2.3"
fi
"$PY" -m pip install -q --no-deps --no-build-isolation -e .
"$PY" - <<'PYEOF'
import numpy, importlib.util as u
print("device_setup: numpy", numpy.__version__, "|", ", ".join(f"{m} {'yes' if u.find_spec(m) else 'NO'}"
      for m in ("nbclient", "nbformat", "jupytext", "ipykernel", "pytest_timeout", "attnlib")))
PYEOF
