"""Does a folder hold any line of a solution? The student release's last gate.

Every line a student is meant to write is inside a STUDENT region of a file in
solutions/ (or ends with ``SOLUTION-ONLY``). This module collects those lines,
normalizes them (every blank removed, so re-indenting or re-spacing a line does not
hide it) and looks for each one in every text file of a folder -- code, notebooks
(their cells and outputs), logs, data -- as a substring of a normalized line, so a
solution line quoted in a traceback (``E       return F.scaled_dot_product_...``)
is found too. Markers play no part: a copied kernel without its markers is caught.

A region line is *not* secret when it is shorter than ``MIN_CHARS`` once normalized
(``return o``, ``}``) or when the student has been given it: it appears somewhere in
the stub of its own step or of an earlier one (as code, or inside a hint), or in the
course's library attnlib/ (``ctx.save_for_backward(q, k, v, o, lse)`` is given code in
step 04 and part of a region in step 06; ``if is_causal:`` is in the reference). A later
step's stub is no excuse: a step 06 stub that inlines step 05's answers leaks them.

A line a notebook shows on purpose is allowed only by an entry in ``ALLOWED``:
the file, the line as written, and why.

    python -m grading.leaks FOLDER [--solutions DIR]      # exit 1 and a list if anything leaks
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
C_LIKE = {".cu", ".cuh", ".cpp", ".h", ".hpp", ".c"}
SOURCE = C_LIKE | {".py"}
MIN_CHARS = 12          # normalized: `o=acc/l_i` (9) is too common to call a leak; `m_new=tl.maximum(m_i,` is not
BINARY = {".png", ".jpg", ".jpeg", ".gif", ".pdf", ".so", ".pyc", ".zip", ".gz", ".whl", ".pt", ".npz"}

# (file glob in the checked folder, the solution line as written, why it may appear there)
ALLOWED = [
    (nb, "lo = (start_n // BLOCK_M) * BLOCK_M",
     "notebook 06, section 2, derives which query tiles a dK/dV program visits in plain Python; "
     "step 06's region hint states the same formula")
    for nb in ("notebooks/06_triton_bwd.ipynb", "notebooks/06_triton_bwd.py")    # the notebook and its source
]


@dataclass(frozen=True)
class Secret:
    line: str           # as written in the solution
    origin: str         # solutions/FILE:LINE


@dataclass(frozen=True)
class Leak:
    path: str           # relative to the checked folder
    where: str          # "line 12", "cell 4"
    secret: Secret

    def __str__(self):
        return f"{self.path} ({self.where}) holds {self.secret.origin}: {self.secret.line.strip()[:90]}"


def normalize(line: str) -> str:
    return re.sub(r"\s+", "", line)


def step_of(rel: str) -> int | None:
    m = re.search(r"step(\d\d)", rel)
    return int(m.group(1)) if m else None


def region_lines(text: str, suffix: str) -> list[tuple[int, str]]:
    """(line number, code) of every line a student writes: inside a STUDENT region, or SOLUTION-ONLY.
    Comments and ``STUB:`` lines are left out (the stub shows those)."""
    cm = "//" if suffix in C_LIKE else "#"
    out, inside = [], False
    for i, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if s.startswith(f"{cm} >>> STUDENT:"):
            inside = True
            continue
        if s.startswith(f"{cm} <<< STUDENT"):
            inside = False
            continue
        only = s.endswith(f"{cm} SOLUTION-ONLY")
        if only:
            s = s[: -len(f"{cm} SOLUTION-ONLY")].rstrip()
        if (inside or only) and s and not s.startswith(cm):
            out.append((i, s))
    return out


def code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, code) of every line of a Python file but its comments, blank lines and docstrings (prose):
    a solution-only file's secrets (attnlib.stubgen: it has no stub, so all its code is the solution's)."""
    import ast
    prose = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
            prose.update(range(body[0].lineno, body[0].end_lineno + 1))
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if s and not s.startswith("#") and i not in prose:
            out.append((i, s.split("  # ")[0].rstrip()))
    return out


def secrets(solutions: Path, library: Path = REPO / "attnlib") -> dict[str, Secret]:
    """normalized line -> Secret, for every solution line the student has not been given: it is not
    anywhere (hints included) in the stub of its step or an earlier one, nor in the course's library."""
    from attnlib import stubgen
    stubs = stubgen.generate(solutions)
    lib = "\n".join(normalize(x) for p in sorted(Path(library).rglob("*.py")) for x in p.read_text().splitlines())
    given: dict[int, list[str]] = {}          # step -> normalized lines of its stubs
    for rel, text in stubs.items():
        given.setdefault(step_of(rel) or 0, []).extend(normalize(x) for x in text.splitlines())
    out: dict[str, Secret] = {}
    for rel in sorted(stubs):
        if Path(rel).suffix not in SOURCE:
            continue
        n = step_of(rel) or 0
        public = "\n".join([lib] + [x for m, lines in given.items() if m <= n for x in lines])
        for i, code in region_lines((solutions / rel).read_text(), Path(rel).suffix):
            key = normalize(code)
            if len(key) >= MIN_CHARS and key not in public:
                out.setdefault(key, Secret(code, f"solutions/{rel}:{i}"))
    # A solution-only file (no stub): every code line is the solution's, unless a stub of any step or the
    # library has it too (an import, a shape unpacking).
    public = "\n".join([lib] + [x for lines in given.values() for x in lines])
    for rel in stubgen.solution_only_files(solutions):
        if Path(rel).suffix != ".py":
            continue
        for i, code in code_lines((solutions / rel).read_text()):
            key = normalize(code)
            if len(key) >= MIN_CHARS and key not in public:
                out.setdefault(key, Secret(code, f"solutions/{rel}:{i}"))
    return out


def _texts(path: Path):
    """(where, text) pieces of one file: its lines, or a notebook's cells (sources and outputs)."""
    if path.suffix.lower() in BINARY:
        return
    try:
        raw = path.read_text()
    except (UnicodeDecodeError, OSError):
        return
    if path.suffix == ".ipynb":
        try:
            cells = json.loads(raw).get("cells", [])
        except ValueError:
            yield "the file", raw
            return
        for j, cell in enumerate(cells, 1):
            parts = ["".join(cell.get("source", []))]
            for o in cell.get("outputs", []):
                parts.append("".join(o.get("text", [])))
                for v in (o.get("data") or {}).values():
                    parts.append("".join(v) if isinstance(v, list) else str(v))
            yield f"cell {j}", "\n".join(x.rstrip("\n") for x in parts)     # line N: counted over source, then outputs
        return
    yield "", raw


def scan(folder: Path, solutions: Path = REPO / "solutions", allowed=ALLOWED) -> tuple[list[Leak], list[tuple]]:
    """Every solution line found in ``folder``; and the ``allowed`` entries that matched nothing (stale)."""
    folder = Path(folder)
    table = secrets(Path(solutions))
    allow = {(glob, normalize(line)) for glob, line, _ in allowed}
    used = set()
    leaks = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        rel = path.relative_to(folder).as_posix()
        for where, text in _texts(path):
            lines = [normalize(x) for x in text.splitlines()]
            joined = "\n".join(lines)
            for key, sec in table.items():
                pos = joined.find(key)
                if pos < 0:
                    continue
                hit = [(g, k) for g, k in allow if k == key and fnmatch(rel, g)]
                if hit:
                    used.update(hit)
                    continue
                line_no = joined.count("\n", 0, pos) + 1
                at = f"{where}, line {line_no}" if where else f"line {line_no}"
                leaks.append(Leak(rel, at, sec))
    stale = [a for a in allowed if (a[0], normalize(a[1])) not in used]
    return leaks, stale


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m grading.leaks", description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--solutions", type=Path, default=REPO / "solutions")
    a = ap.parse_args(argv)
    leaks, _ = scan(a.folder, a.solutions)
    for leak in leaks:
        print(leak)
    print(f"{len(leaks)} solution line(s) found in {a.folder}" if leaks else f"{a.folder}: no solution line")
    return 1 if leaks else 0


if __name__ == "__main__":
    sys.exit(main())
