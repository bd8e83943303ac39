"""Write a Grade three ways: a terminal table, Gradescope's results.json, JUnit XML.

Gradescope's format (https://gradescope-autograders.readthedocs.io/en/latest/specs/):
top-level ``score``, ``execution_time``, ``output``, ``tests`` (each with
``name``, ``number``, ``score``, ``max_score``, ``status``, ``output``, ``tags``,
``visibility``) and, when a GPU measured speed, ``leaderboard`` entries
``{"name", "value", "order": "asc"}``. One Gradescope test per step and group.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from .grade import S_FAILED, S_PASSED, UNCOUNTED, Grade, GroupResult, StepResult

WITHHELD = "hidden test: its details are withheld"


def _pts(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".") if x != int(x) else f"{int(x)}"


def _visible_message(gr: GroupResult, text: str) -> str:
    return text if gr.group.reveal else WITHHELD


def step_message(s: StepResult) -> str:
    """The first failure, unless it belongs to a group whose details are withheld."""
    for gr in s.groups:
        for c in gr.checks:
            if not c.passed and not gr.group.reveal and s.message.startswith(f"{gr.group.name} "):
                return f"{gr.group.name}: {WITHHELD}"
    return _scrub(s, s.message)


def _scrub(s: StepResult, text: str, hide=lambda gr: not gr.group.reveal) -> str:
    """``text`` without the names of withheld checks ("while running hidden_shapes 1x3-q70...")."""
    for gr in s.groups:
        if hide(gr):
            for c in gr.checks:
                text = text.replace(f"{gr.group.name} {c.name}", "a hidden check")
    return text


# ---------------------------------------------------------------------------
# What a student sees on Gradescope while some tests are hidden
# ---------------------------------------------------------------------------
# Gradescope shows the top-level `output` and every `visible` test at once, and hides the total
# while any test is not visible. So while a group is not `visible`, nothing shown at once may
# carry its points, its checks or its failures, nor the total: the public view is built from the
# visible groups alone.

def is_hidden(gr: GroupResult) -> bool:
    return gr.group.visibility != "visible"


def any_hidden(g: Grade) -> bool:
    return any(is_hidden(gr) for s in g.steps if s.status not in UNCOUNTED for gr in s.groups if gr.graded)


def public_step(s: StepResult) -> tuple[str, str, str, str]:
    """(points, checks, status, first failure) of a step from its visible groups only."""
    vis = [gr for gr in s.groups if gr.graded and not is_hidden(gr)]
    pts = round(sum(gr.points for gr in vis), 4)
    mx = round(sum(gr.group.points for gr in vis), 4)
    n_ok, n = sum(gr.n_passed for gr in vis), sum(len(gr.checks) for gr in vis)
    if s.status not in (S_PASSED, S_FAILED):        # the whole step: missing, crashed, timed out, rule...
        status, msg = s.status, _scrub(s, step_message(s), hide=lambda gr: is_hidden(gr) or not gr.group.reveal)
        if any(msg.startswith(f"{gr.group.name} ") for gr in s.groups if is_hidden(gr)):
            msg = WITHHELD
    else:
        fails = [(gr, c) for gr in vis for c in gr.checks if not c.passed]
        status = S_PASSED if not fails else S_FAILED
        msg = f"{fails[0][0].group.name} {fails[0][1].name}: {fails[0][1].summary}" if fails else ""
        if fails and not fails[0][0].group.reveal:
            msg = f"{fails[0][0].group.name}: {WITHHELD}"
    hidden = any(is_hidden(gr) for gr in s.groups if gr.graded)
    if s.status in (S_PASSED, S_FAILED) and hidden and status == S_PASSED:
        status = "visible tests passed"
    return f"{_pts(pts)}/{_pts(mx)}", f"{n_ok}/{n}", status, msg


# ---------------------------------------------------------------------------
# Terminal
# ---------------------------------------------------------------------------

def table(g: Grade, width: int | None = None, public: bool = False) -> str:
    """The per-step table. ``public``: what a student may see while tests are hidden (visible groups'
    points only, no total); the same as the full table when every group is visible."""
    width = width or max(100, min(shutil.get_terminal_size((140, 20)).columns, 200))
    public = public and any_hidden(g)
    rows = [("Step", "What", "Points", "Checks", "Status: first failure")]
    for s in g.steps:
        if s.status in UNCOUNTED:
            pts, checks, status, first = "-", "-", s.status, step_message(s)
        elif public:
            pts, checks, status, first = public_step(s)
        else:
            pts, checks = f"{_pts(s.points)}/{_pts(s.max_points)}", f"{s.n_passed}/{s.n_checks}"
            status, first = s.status, step_message(s)
        first = first.splitlines()[0] if first else ""
        msg = status if status == S_PASSED else _status_line(status, first)
        rows.append((f"{s.step:02d}", s.title, pts, checks, msg))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for j, r in enumerate(rows):
        head = "  ".join(r[i].ljust(widths[i]) if i != 2 else r[i].rjust(widths[i]) for i in range(4))
        room = max(20, width - len(head) - 2)
        tail = r[4] if len(r[4]) <= room else r[4][: room - 3] + "..."
        lines.append(f"{head}  {tail}")
        if j == 0:
            lines.append("-" * min(width, len(head) + 2 + max(len(x[4]) for x in rows)))
    gpu_note = "" if g.has_gpu else "   (no GPU here: GPU-only parts are not graded and not counted)"
    if not g.isolated:
        lines.insert(0, "WITHOUT OS ISOLATION OF THE WORKERS on this machine (see the note)")
    if public:
        lines.append("Points of the visible tests only; the hidden tests' points and the total show once "
                     "they are released." + gpu_note)
    else:
        lines.append(f"Total {_pts(g.points)}/{_pts(g.max_points)}" + gpu_note)
    return "\n".join(lines)


def details(g: Grade, per_group: int = 3) -> str:
    """The full reports of the first failures of each failing group."""
    out = []
    for s in g.steps:
        if s.status in UNCOUNTED or s.status == S_PASSED:
            continue
        out.append(f"== Step {s.step:02d} ({s.module}): {_pts(s.points)}/{_pts(s.max_points)}, {s.status}")
        if s.status in ("not implemented", "missing", "import error", "rejected"):
            out.append("  " + "\n  ".join(s.message.splitlines()))
            continue
        for r in s.rules:
            if not r.ok:
                out.append(f"  RULE {r.rule}: {r.message}")
        for gr in s.groups:
            if not gr.graded:
                continue
            fails = [c for c in gr.checks if not c.passed]
            out.append(f"  [{gr.group.name}] {_pts(gr.points)}/{_pts(gr.group.points)} points, "
                       f"{gr.n_passed}/{len(gr.checks)} checks passed" + (f" ({gr.note})" if gr.note else ""))
            if not gr.group.reveal:
                if fails:
                    out.append(f"    {WITHHELD}")
                continue
            if fails and all(c.status == "not implemented" for c in fails):
                out.append(f"    {fails[0].message.splitlines()[0]}")
                continue
            seen = set()
            for c in fails[:per_group]:
                if c.message in seen:
                    out.append(f"    - {c.name}: (same as above)")
                    continue
                seen.add(c.message)
                body = "\n".join("      " + ln for ln in c.message.splitlines())
                out.append(f"    - {c.name}:\n{body}")
            if len(fails) > per_group:
                out.append(f"    ... and {len(fails) - per_group} more: " + ", ".join(c.name for c in fails[per_group:][:12]))
    return "\n".join(out)


# ---------------------------------------------------------------------------
# Gradescope
# ---------------------------------------------------------------------------

def _status_line(status: str, msg: str) -> str:
    """"not implemented: Step 01: ..." -- the status once, even when the message starts with it."""
    while msg.startswith(f"{status}: "):
        msg = msg[len(status) + 2:]
    return f"{status}: {msg}" if msg else status


def _group_output(s: StepResult, gr: GroupResult, per_group: int) -> str:
    if not gr.graded:
        return gr.note or "not graded here"
    fails = [c for c in gr.checks if not c.passed]
    head = f"{gr.n_passed}/{len(gr.checks)} checks passed."
    if gr.note:
        head += f" {gr.note}: " + "; ".join(r.message for r in s.rules if not r.ok)
    elif s.status in ("rejected",):
        head += f" {s.message}"
    if not gr.group.reveal:
        return head if not fails else f"{head} {WITHHELD}."
    lines = [head]
    if fails and s.status == "not implemented":          # the stub's one sentence, once
        return f"{head}\n\n{_status_line(s.status, fails[0].message.splitlines()[0])}"
    seen = {}
    for c in fails[:per_group]:
        if c.message in seen:
            lines.append(f"\n--- {c.name} ({c.status}): the same as {seen[c.message]}")
            continue
        seen[c.message] = c.name
        lines.append(f"\n--- {c.name} ({c.status})\n{c.message}")
    if len(fails) > per_group:
        lines.append(f"\n... and {len(fails) - per_group} more failing: " + ", ".join(c.name for c in fails[per_group:]))
    return "\n".join(lines)


def gradescope(g: Grade, per_group: int = 3) -> dict:
    tests = []
    for s in g.steps:
        if s.status in UNCOUNTED:
            tests.append({"name": f"Step {s.step:02d} ({s.title})", "number": f"{s.step}",     # 0/0: informational
                          "score": 0.0, "max_score": 0.0, "output": s.message,
                          "tags": [f"step{s.step:02d}"], "visibility": "visible"})
            continue
        j = 0
        for gr in s.groups:
            if not gr.graded:
                continue
            j += 1                               # numbered 1, 2, 3...: no gap where a GPU-only group is left out
            t = {"name": f"Step {s.step:02d} ({s.title}): {gr.group.name}", "number": f"{s.step}.{j}",
                 "score": gr.points, "max_score": gr.group.points,
                 "status": "passed" if gr.checks and gr.n_passed == len(gr.checks) and gr.note == "" else "failed",
                 "output": _group_output(s, gr, per_group)[:60000],
                 "tags": [f"step{s.step:02d}", gr.group.kind] + (["hidden"] if gr.group.hidden else []),
                 "visibility": gr.group.visibility}
            if s.status not in (S_PASSED, S_FAILED, "not implemented") and gr.group.reveal and not gr.note:
                status, msg = (public_step(s)[2:] if not is_hidden(gr) else (s.status, step_message(s)))
                if status == "missing" and any(n.startswith("no step file found") for n in g.notes):
                    msg += " (the note under the table says where the grader looked and what it saw)"
                t["output"] = f"Step status: {_status_line(status, msg)}\n\n" + t["output"]
            tests.append(t)
    out = {"score": g.points, "execution_time": round(g.seconds, 1),
           "output": "```\n" + public_table(g) + "\n```" + "".join(f"\n\n**Note:** {n}" for n in g.notes),
           "output_format": "md",
           "stdout_visibility": "hidden", "tests": tests,
           "extra_data": {"max_points": g.max_points, "gpu": g.has_gpu,
                          "worker_namespaces": g.isolated,
                          "steps": {s.module: {"points": s.points, "max": s.max_points, "status": s.status,
                                                     "seconds": round(s.seconds, 1)}
                                    for s in g.steps}}}
    lb = [e for s in g.steps for e in s.leaderboard]
    if lb:
        out["leaderboard"] = lb
    return out


def public_table(g: Grade) -> str:
    """The table a student sees at once: no withheld details, and while any group is hidden, no
    hidden points and no total."""
    return table(g, width=160, public=True)


# ---------------------------------------------------------------------------
# JUnit XML
# ---------------------------------------------------------------------------

_BAD_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _x(text: str) -> str:
    return _BAD_XML.sub("?", text)


def junit(g: Grade) -> str:
    suites = ET.Element("testsuites", name="attention-course grading")
    tot = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for s in g.steps:
        suite = ET.SubElement(suites, "testsuite", name=s.module)
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        if s.status in UNCOUNTED or not any(gr.checks for gr in s.groups):
            case = ET.SubElement(suite, "testcase", classname=s.module, name="step")
            counts["tests"] += 1
            if s.status in UNCOUNTED:
                ET.SubElement(case, "skipped", message=_x(s.message))
                counts["skipped"] += 1
            elif s.status != S_PASSED:
                ET.SubElement(case, "failure", message=_x(s.status), type=s.status).text = _x(s.message)
                counts["failures"] += 1
        for r in s.rules:
            case = ET.SubElement(suite, "testcase", classname=f"{s.module}.rules", name=r.rule)
            counts["tests"] += 1
            if not r.ok:
                ET.SubElement(case, "failure", message="rule broken", type="rule").text = _x(r.message)
                counts["failures"] += 1
        for gr in s.groups:
            for j, c in enumerate(gr.checks, 1):
                name = c.name if gr.group.reveal else f"hidden check {j}"      # not even the input's shape
                case = ET.SubElement(suite, "testcase", classname=f"{s.module}.{gr.group.name}", name=name,
                                     time=f"{c.seconds:.3f}")
                counts["tests"] += 1
                if not gr.graded:
                    ET.SubElement(case, "skipped", message=gr.note)
                    counts["skipped"] += 1
                elif not c.passed:
                    text = _visible_message(gr, c.message)
                    kind = "error" if c.status in ("error", "lost") else "failure"
                    ET.SubElement(case, kind, message=_x(c.summary if gr.group.reveal else WITHHELD)[:500],
                                  type=c.status).text = _x(text)
                    counts["errors" if kind == "error" else "failures"] += 1
            if not gr.graded and not gr.checks:
                case = ET.SubElement(suite, "testcase", classname=f"{s.module}.{gr.group.name}", name="group")
                ET.SubElement(case, "skipped", message=gr.note or "not graded here")
                counts["tests"] += 1
                counts["skipped"] += 1
        for k, v in counts.items():
            suite.set(k, str(v))
            tot[k] += v
        suite.set("time", f"{s.seconds:.3f}")
    for k, v in tot.items():
        suites.set(k, str(v))
    suites.set("time", f"{g.seconds:.3f}")
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True)


# ---------------------------------------------------------------------------

def summary(g: Grade) -> dict:
    """Compact, for the batch gradebook."""
    return {"impl": g.impl, "points": g.points, "max": g.max_points, "seconds": round(g.seconds, 1),
            "steps": {f"{s.step:02d}": {"points": s.points, "max": s.max_points, "status": s.status,
                                        "seconds": round(s.seconds, 1),
                                        "message": step_message(s).splitlines()[0][:300] if s.message else ""}
                      for s in g.steps}}


def write_atomic(path: Path, text: str):
    """Write via a temporary file and a rename: a link planted at ``path`` is replaced, never followed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def write_all(g: Grade, *, results: Path | None = None, junit_path: Path | None = None, per_group: int = 3):
    if results:
        write_atomic(results, json.dumps(gradescope(g, per_group), indent=1))
    if junit_path:
        write_atomic(junit_path, junit(g))
