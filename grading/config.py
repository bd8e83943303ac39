"""Read grading/config.toml (and a hidden-test overlay) into plain dataclasses.

Nothing here imports torch or student code: the instructor's intent only.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (Gradescope's Ubuntu 22.04): `pip install tomli`
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on the interpreter
        raise ImportError("grading needs Python 3.11+ (tomllib) or `pip install tomli` "
                          "to read grading/config.toml") from exc

from attnlib.cases import CASES, QUICK_CASES, Case

HERE = Path(__file__).resolve().parent
DEFAULT_CONFIG = HERE / "config.toml"
HIDDEN_FILE = "hidden.toml"

VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")
KINDS = ("forward", "backward", "contract", "lse", "autograd", "backend", "lowp", "speed", "warmup", "capstone",
         "ring", "ring_backward", "sparse", "sparse_backward")
GROUP_KEYS = {"points", "kind", "cases", "causal", "scales", "q_factors", "needs_gpu", "all_or_nothing",
              "visibility", "reveal", "seed"}
STEP_KEYS = {"timeout_s", "memory_mb", "cases", "causal", "scales", "q_factors", "visibility", "groups"}


class ConfigError(ValueError):
    pass


@dataclass
class Group:
    step: int
    name: str
    kind: str
    points: float
    cases: list[Case]
    causal: list[bool]
    scales: list[float]
    q_factors: list[float] = field(default_factory=list)    # large scores: q multiplied by each (fp32 only)
    needs_gpu: bool = False
    all_or_nothing: bool = False
    visibility: str = "visible"
    reveal: bool = True
    seed: int = 0
    hidden: bool = False           # came from the hidden overlay


@dataclass
class StepConfig:
    step: int
    timeout_s: float
    memory_mb: int
    groups: list[Group] = field(default_factory=list)


@dataclass
class Config:
    seed: int
    jobs: int
    diagnose_first: int
    report_failures: int
    steps: dict[int, StepConfig]
    release_exclude: list[str]
    source: str = ""


def _case(spec, where) -> Case:
    if isinstance(spec, str):
        for c in CASES:
            if c.id == spec:
                return c
        raise ConfigError(f"{where}: unknown case id {spec!r}; known: {[c.id for c in CASES]}")
    if isinstance(spec, dict):
        try:
            return Case(tuple(int(b) for b in spec.get("batch", ())), int(spec["nq"]),
                        int(spec.get("nk", spec["nq"])), int(spec["d"]))
        except KeyError as exc:
            raise ConfigError(f"{where}: an inline case needs nq and d (and batch, nk): {spec!r}") from exc
    raise ConfigError(f"{where}: a case is an id string or a table, got {spec!r}")


def _cases(spec, where) -> list[Case]:
    if spec == "all":
        return list(CASES)
    if spec == "quick":
        return list(QUICK_CASES)
    if isinstance(spec, list) and spec:
        return [_case(s, where) for s in spec]
    raise ConfigError(f"{where}: cases must be 'all', 'quick' or a non-empty list, got {spec!r}")


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for key, val in over.items():
        if isinstance(val, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], val)
        else:
            out[key] = copy.deepcopy(val)
    return out


def group_seed(base: int, name: str, hidden: bool, secret: bytes = b"") -> int:
    """Visible groups share the inputs (forward and backward check the same runs);
    hidden groups draw their own from ``secret`` (the hidden file's bytes: the worker cannot read
    them, so it cannot work the seed out from the public config and the group's name)."""
    if not hidden:
        return base
    digest = hashlib.sha256(secret + b"\0" + name.encode() + b"\0" + str(base).encode()).digest()
    return int.from_bytes(digest[:4], "big") % (2 ** 31 - 1) + 1


def load(path: str | Path | None = None, hidden: str | Path | None = None) -> Config:
    """Load the config (default grading/config.toml), merging ``hidden/hidden.toml`` if given."""
    path = Path(path) if path else DEFAULT_CONFIG
    raw = tomllib.loads(path.read_text())
    hidden_raw: dict = {}
    secret = b""
    if hidden:
        hp = Path(hidden)
        hp = hp / HIDDEN_FILE if hp.is_dir() else hp
        if not hp.exists():
            raise ConfigError(f"hidden tests: {hp} does not exist")
        secret = hp.read_bytes()
        hidden_raw = tomllib.loads(secret.decode())
        unknown = set(hidden_raw) - {"step", "grading"}
        if unknown:
            raise ConfigError(f"{hp}: only [grading] and [step.N...] tables belong in a hidden file, got {unknown}")
    g = _merge(raw.get("grading", {}), hidden_raw.get("grading", {}))
    defaults = raw.get("defaults", {})
    seed = int(g.get("seed", 0))
    steps: dict[int, StepConfig] = {}
    step_tables = raw.get("step", {})
    hidden_steps = hidden_raw.get("step", {})
    for key in sorted(set(step_tables) | set(hidden_steps), key=int):
        n = int(key)
        table = _merge(defaults, step_tables.get(key, {}))
        htable = hidden_steps.get(key, {})
        unknown = (set(table) | set(htable)) - STEP_KEYS
        if unknown:
            raise ConfigError(f"[step.{n}]: unknown keys {sorted(unknown)}; known: {sorted(STEP_KEYS)}")
        hidden_names = set(htable.get("groups", {})) - set(table.get("groups", {}))
        overridden = set(htable.get("groups", {})) & set(table.get("groups", {}))
        for k, v in htable.items():      # step-level keys of the overlay (a timeout, say)
            if k != "groups":
                table[k] = v
        groups_raw = _merge(table.get("groups", {}), htable.get("groups", {}))
        sc = StepConfig(n, float(table.get("timeout_s", 120)), int(table.get("memory_mb", 4096)))
        for name, gt in groups_raw.items():
            where = f"[step.{n}.groups.{name}]"
            if not isinstance(gt, dict):
                raise ConfigError(f"{where}: expected a table, got {gt!r}")
            unknown = set(gt) - GROUP_KEYS
            if unknown:
                raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(GROUP_KEYS)}")
            kind = gt.get("kind", name)
            if kind not in KINDS:
                raise ConfigError(f"{where}: unknown kind {kind!r}; kinds: {KINDS}")
            vis = gt.get("visibility", table.get("visibility", "visible"))
            if vis not in VISIBILITIES:
                raise ConfigError(f"{where}: visibility {vis!r} is not one of {VISIBILITIES}")
            points = float(gt.get("points", 0))
            if points < 0:
                raise ConfigError(f"{where}: points must be >= 0")
            is_hidden = name in hidden_names or (name in overridden and "cases" in htable["groups"][name])
            sc.groups.append(Group(
                step=n, name=name, kind=kind, points=points,
                cases=_cases(gt.get("cases", table.get("cases", "all")), where),
                causal=[bool(c) for c in gt.get("causal", table.get("causal", [False, True]))],
                scales=[float(s) for s in gt.get("scales", table.get("scales", []))],
                q_factors=[float(f) for f in gt.get("q_factors", table.get("q_factors", []))],
                needs_gpu=bool(gt.get("needs_gpu", False)),
                all_or_nothing=bool(gt.get("all_or_nothing", False)),
                visibility=vis, reveal=bool(gt.get("reveal", True)),
                seed=int(gt.get("seed", group_seed(seed, name, is_hidden, secret))),
                hidden=is_hidden,
            ))
        steps[n] = sc
    rel = raw.get("release", {})
    return Config(seed=seed, jobs=int(g.get("jobs", 2)), diagnose_first=int(g.get("diagnose_first", 3)),
                  report_failures=int(g.get("report_failures", 3)), steps=steps,
                  release_exclude=list(rel.get("exclude", [])), source=str(path))
