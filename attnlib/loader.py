"""Import a step from steps/ (the default), solutions/, or any folder of the same shape.

The one switch: the environment variable ``ATTN_IMPL`` (or pytest's ``--impl``)
set to ``steps``, ``solutions`` or a path. Each folder is imported as a package
under a private name, so ``from .step04_flash_torch import ...`` inside a step
finds its sibling in the same folder, never another folder's.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path

from .contract import STEPS

REPO = Path(__file__).resolve().parent.parent


def impl_root(impl: str | os.PathLike | None = None) -> Path:
    """Resolve ``steps`` / ``solutions`` / a path (default: ``$ATTN_IMPL`` or ``steps``)."""
    impl = impl or os.environ.get("ATTN_IMPL") or "steps"
    p = Path(impl)
    if str(impl) in ("steps", "solutions") and not p.is_absolute():
        p = REPO / str(impl)
    p = p.resolve()
    if not p.is_dir():
        raise FileNotFoundError(f"implementation folder {p} does not exist (ATTN_IMPL={impl!r})")
    return p


def _package_for(root: Path) -> str:
    name = "_attn_impl_" + hashlib.sha1(str(root).encode()).hexdigest()[:10]
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, root / "__init__.py", submodule_search_locations=[str(root)])
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import {root} as a package (is {root / '__init__.py'} there?)")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return name


def load_step(step: int, impl: str | os.PathLike | None = None):
    """Return the module of step ``step`` (a key of ``STEPS``) from the chosen folder."""
    if step not in STEPS:
        raise ValueError(f"no step {step}; steps are {sorted(STEPS)}")
    root = impl_root(impl)
    module, _ = STEPS[step]
    if not (root / f"{module}.py").exists():
        raise FileNotFoundError(f"{root / module}.py is missing")
    return importlib.import_module(f"{_package_for(root)}.{module}")
