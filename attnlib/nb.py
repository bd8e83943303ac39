"""Helpers for the notebooks: one switch for the implementation, one for the size.

The notebooks import this module from wherever Jupyter runs them (notebooks/, the repository root):
`make setup` installs the course in editable mode, so no ``sys.path`` or ``PYTHONPATH`` is needed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent

# The first code cell of every notebook starts with these lines (tests/test_notebooks.py checks it).
SWITCH = """\
# The one switch: "steps" runs your code (steps/), "solutions" the course's, or a path to a folder like steps/.
import os
IMPL = os.environ.get("ATTN_IMPL", "steps")

from attnlib.nb import setup
load_step, device, small = setup(IMPL)"""


def setup(impl: str | None = None):
    """Point the loader at ``impl`` ("steps", "solutions" or a folder) and report the machine.

    Returns ``(load_step, device, small)``: ``small`` is True on a CPU, where the
    notebooks shrink their sizes so they run in seconds.
    """
    if not torch.cuda.is_available() and "triton" not in sys.modules:
        os.environ.setdefault("TRITON_INTERPRET", "1")   # Triton kernels run in its interpreter
    impl = impl or os.environ.get("ATTN_IMPL", "steps")
    os.environ["ATTN_IMPL"] = impl
    from .loader import impl_root, load_step
    device = "cuda" if torch.cuda.is_available() else "cpu"
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (small sizes)"
    print(f"implementation: {impl_root()}\ndevice: {name}; torch {torch.__version__}")
    return load_step, device, device == "cpu"


def median_ms(fn, device, reps=5):
    """Median wall-clock milliseconds of ``fn()`` after two warm-up calls, synchronising on a GPU.

    Good enough for the notebooks' curves; ``bench/`` times with CUDA events (do_bench).
    """
    import time
    for _ in range(2):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return sorted(times)[len(times) // 2]


def show_region(file: str, hint_start: str, impl: str | os.PathLike | None = None, context: int = 2) -> str:
    """The student region of ``csrc/<file>`` that begins with ``hint_start``, as it stands in the
    folder IMPL names (never solutions/ unless IMPL is "solutions").

    In a solution the region runs from ``>>> STUDENT: <hint>`` to ``<<< STUDENT``; in a stub it is the
    ``TODO(Step NN): <hint>`` line, shown with ``context`` lines either side.
    """
    from .loader import impl_root
    root = impl_root(impl)
    path = root / "csrc" / file
    lines = path.read_text().splitlines()
    start = [n for n, line in enumerate(lines) if ">>> STUDENT: " + hint_start in line]
    if start:
        i = start[0]
        j = next(n for n in range(i, len(lines)) if "<<< STUDENT" in lines[n])
        return "\n".join(lines[i:j + 1])
    todo = [n for n, line in enumerate(lines) if "): " + hint_start in line and "TODO(" in line]
    if todo:
        i = todo[0]
        return "\n".join(lines[max(0, i - context):i + context + 1])
    return (f"{path}: no region starting '{hint_start}' is left (you have written it): "
            "open the file to read your version")


def machine() -> str:
    """One line naming where a notebook ran: the GPU (or CPU), torch and triton versions."""
    import platform
    try:
        import triton
        tv = triton.__version__
    except Exception:                       # pragma: no cover - triton is a dependency
        tv = "none"
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU only ({platform.processor() or platform.machine()})"
    return f"{dev}; torch {torch.__version__}; triton {tv}"


def execute(src: Path, dst: Path, impl: str = "solutions", timeout: int = 1800) -> Path:
    """Run notebook ``src`` from notebooks/ as a student would (no PYTHONPATH) and write it, outputs
    and all, to ``dst``, with a first cell that names the machine and the date."""
    import nbclient
    import nbformat
    nb = nbformat.read(src, as_version=4)
    old = dict(os.environ)
    os.environ.pop("PYTHONPATH", None)
    os.environ.update(ATTN_IMPL=impl, MPLBACKEND="module://matplotlib_inline.backend_inline")
    try:
        nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(src.parent)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(old)
    return write_executed(nb, src.name, impl, dst)


def write_executed(nb, name: str, impl: str, dst: Path, by: str = "`make executed`") -> Path:
    """Write executed notebook ``nb`` (of ``notebooks/<name>``) to ``dst`` with a first cell that
    names the machine and the date."""
    import datetime
    import nbformat
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    nb.cells.insert(0, nbformat.v4.new_markdown_cell(
        f"*Executed copy of `notebooks/{name}` with IMPL = \"{impl}\", on {machine()}, {when}, by "
        f"{by}. The source is the notebook next to this folder; edit that, not this.*"))
    dst.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dst)
    return dst


def main(argv=None):
    """``python -m attnlib.nb execute [OUT_DIR] [NN ...]``: executed copies of the notebooks."""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m attnlib.nb")
    ap.add_argument("command", choices=["execute"])
    ap.add_argument("out", nargs="?", type=Path, default=REPO / "notebooks" / "executed")
    ap.add_argument("--only", nargs="*", default=None, help="notebook numbers, e.g. 04 05")
    args = ap.parse_args(argv)
    for src in sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        if args.only and src.name[:2] not in args.only:
            continue
        print(f"executing {src.name} ...", flush=True)
        print("  wrote", execute(src, args.out / src.name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
