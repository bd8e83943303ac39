"""Grade one submission: every released step in its own worker, scored here.

A step that does not exist in this release (no file in steps/ or solutions/ of
the course) is listed as "not released" and counts for nothing; a released
step whose file the submission lacks is "missing" and scores 0. So steps
04-07 join the grade by themselves the day their files land.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attnlib.contract import STEPS

from . import sandbox
from .config import Config, Group
from .evaluate import (ERROR, FAILED, LOST, NOT_IMPLEMENTED, CheckResult, Evaluator, RuleResult,
                       evaluate_rules)
from .spec import RULES, STEP_SPECS, Item, build_items, step_needs_gpu

REPO = sandbox.REPO

# Step statuses
S_PASSED, S_FAILED, S_NOT_IMPL = "passed", "failed", "not implemented"
S_MISSING, S_IMPORT, S_CRASHED, S_TIMEOUT = "missing", "import error", "crashed", "timed out"
S_RULE, S_REJECTED, S_NEEDS_GPU, S_NOT_RELEASED, S_GRADER = (
    "rule broken", "rejected", "needs a GPU", "not released", "grader error")
S_OUT_OF_TIME = "out of time"     # the run's global budget ran out before the step was graded: 0 points
BUDGET_RESERVE_S = 15             # kept back from the budget: writing the results, killing a worker
UNCOUNTED = (S_NEEDS_GPU, S_NOT_RELEASED)

SIGNALS = {
    "SIGSEGV": "a segmentation fault: memory read or written out of bounds (a kernel, an extension, ctypes?)",
    "SIGBUS": "a bus error: a misaligned or unmapped memory access",
    "SIGABRT": "aborted: an assertion in C++/CUDA code, or an uncaught C++ exception",
    "SIGFPE": "a floating-point exception in native code",
    "SIGILL": "an illegal instruction",
    "SIGKILL": "killed from outside: most likely out of memory",
    "SIGXFSZ": "it wrote a file larger than the 2 GiB limit",
    "SIGXCPU": "it ran out of CPU time",
}


@dataclass
class GroupResult:
    group: Group
    checks: list[CheckResult] = field(default_factory=list)
    points: float = 0.0
    graded: bool = True           # False: cannot run here (needs a GPU)
    note: str = ""

    @property
    def max_points(self):
        return self.group.points if self.graded else 0.0

    @property
    def n_passed(self):
        return sum(c.passed for c in self.checks)


@dataclass
class StepResult:
    step: int
    module: str
    title: str
    status: str
    groups: list[GroupResult] = field(default_factory=list)
    rules: list[RuleResult] = field(default_factory=list)
    message: str = ""
    seconds: float = 0.0
    max_rss_mb: float = 0.0
    leaderboard: list[dict] = field(default_factory=list)

    @property
    def points(self):
        return round(sum(g.points for g in self.groups), 4)

    @property
    def max_points(self):
        if self.status in UNCOUNTED:
            return 0.0
        return round(sum(g.max_points for g in self.groups), 4)

    @property
    def n_checks(self):
        return sum(len(g.checks) for g in self.groups if g.graded)

    @property
    def n_passed(self):
        return sum(g.n_passed for g in self.groups if g.graded)


@dataclass
class Grade:
    impl: str
    steps: list[StepResult]
    seconds: float
    has_gpu: bool
    notes: list[str] = field(default_factory=list)
    isolated: bool = True          # each worker in its own PID, mount and network namespace

    @property
    def points(self):
        return round(sum(s.points for s in self.steps), 4)

    @property
    def max_points(self):
        return round(sum(s.max_points for s in self.steps), 4)


# ---------------------------------------------------------------------------

def released_steps() -> list[int]:
    """The steps of this release: those with a file in the course's steps/ (or solutions/)."""
    out = []
    for n, (mod, _) in STEPS.items():
        if (REPO / "steps" / f"{mod}.py").exists() or (REPO / "solutions" / f"{mod}.py").exists():
            out.append(n)
    return out


def resolve_impl(impl: str | os.PathLike) -> Path:
    return find_submission(impl)[0]


SKIP_FOLDERS = ("__MACOSX", "__pycache__", ".git", ".venv", "node_modules")


def _step_files(folder: Path) -> list[str]:
    return sorted(f"{mod}.py" for mod, _ in STEPS.values() if (folder / f"{mod}.py").is_file())


def find_submission(impl: str | os.PathLike) -> tuple[Path, str]:
    """The folder that holds the stepNN_*.py files, and a note ("" when they were found plainly).

    Looked for, in order: the folder itself, its steps/, then each subfolder and its steps/ (a zip
    of the whole course unpacks to attention-course/steps/...). When no step file is anywhere there,
    the note lists where the grader looked and the files it saw, so the student can tell what to fix."""
    if str(impl) in ("steps", "solutions"):
        return REPO / str(impl), ""
    p = Path(impl).expanduser().resolve()
    if not p.is_dir():
        raise FileNotFoundError(f"{impl}: no such folder")
    if _step_files(p):
        return p, ""
    if _step_files(p / "steps"):
        return p / "steps", ""
    subs = sorted(d for d in p.iterdir() if d.is_dir() and not d.name.startswith(".") and d.name not in SKIP_FOLDERS)
    found = [c for d in subs for c in (d, d / "steps") if _step_files(c)]
    if found:
        best = max(found, key=lambda c: len(_step_files(c)))      # the first of the fullest, in name order
        note = "" if len(found) == 1 else (
            f"step files in {len(found)} folders ({', '.join(c.relative_to(p).as_posix() + '/' for c in found)}): "
            f"graded {best.relative_to(p).as_posix()}/, which has the most")
        return best, note
    seen = []
    for dirpath, dirnames, names in os.walk(p):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in SKIP_FOLDERS)
        if len(Path(dirpath).relative_to(p).parts) >= 3:
            dirnames[:] = []
        seen += [(Path(dirpath) / n).relative_to(p).as_posix() for n in sorted(names)]
    shown = ", ".join(seen[:25]) + (f" and {len(seen) - 25} more" if len(seen) > 25 else "")
    expected = ", ".join(f"{mod}.py" for mod, _ in STEPS.values())
    note = ("no step file found. The grader looked in the submission's top folder, its steps/, and each "
            f"subfolder and its steps/, for files named {expected}. It saw: {shown or 'no files at all'}")
    return p, note


def _sdpa_expectations(items: list[Item]):
    """Step 03: what PyTorch itself does with each input, decided here in the grader."""
    names = {SDPBackend.FLASH_ATTENTION: "flash", SDPBackend.EFFICIENT_ATTENTION: "efficient",
             SDPBackend.CUDNN_ATTENTION: "cudnn", SDPBackend.MATH: "math"}
    backends = {v: k for k, v in names.items()}
    for it in items:
        if it.kind not in ("backend", "chosen_backend"):
            continue
        q, k, v = (t.to(it.device) for t in (it.q, it.k, it.v))
        if it.kind == "backend":
            try:
                with torch.no_grad(), sdpa_kernel([backends[it.extra["backend"]]]):
                    F.scaled_dot_product_attention(q, k, v, is_causal=it.is_causal, scale=it.scale)
                it.expect["accepts"] = True
            except RuntimeError:
                it.expect["accepts"] = False
        else:
            choice = SDPBackend(torch._fused_sdp_choice(q, k, v, None, 0.0, it.is_causal, scale=it.scale))
            it.expect["chosen"] = names.get(choice, choice.name.lower())


def _where(items: list[Item], run: sandbox.WorkerRun) -> str:
    line = run.progress.split(" ", 1)[0] if run.progress else ""
    if line.isdigit() and int(line) < len(items) and items[int(line)].checks:
        c = items[int(line)].checks[0]
        return f"while running {c.group} {c.name}"
    if line.isdigit() and int(line) < len(items) and items[int(line)].nxn_probe:
        return f"while running the N x N probe (Nq = Nk = {items[int(line)].q.shape[-2]})"
    return "before the first check" if not run.records else "after the last check it reported"


def _lost_message(run: sandbox.WorkerRun, items, timeout_s, memory_mb, budget_s=None) -> tuple[str, str]:
    """(step status, message) for checks whose result never came back. ``budget_s``: the run's
    global budget, when it, not the step's own limit, set ``timeout_s``."""
    where = _where(items, run)
    if run.timed_out:
        limit = (f"the {timeout_s:.0f} s left of the grading run's {budget_s:g} s budget" if budget_s
                 else f"its {timeout_s:g} s limit")
        return S_TIMEOUT, (f"timed out: the step ran past {limit} {where} "
                           "(an infinite loop? a very slow Python loop?)")
    if run.memory_killed:
        return S_CRASHED, f"killed: the worker went over its {memory_mb} MiB memory limit {where}"
    if run.signal:
        tail = "\n".join(run.stderr_tail.strip().splitlines()[-12:])
        if any(it.hidden for it in items[:run.sent]):
            # The worker had a hidden input by then: what it printed is not shown (it could be that input).
            tail = ""
        return S_CRASHED, (f"crashed: {run.signal}, {SIGNALS.get(run.signal, 'killed by a signal')}, {where}"
                           + (f"\nlast output of the worker:\n{tail}" if tail else ""))
    if not run.done:
        return S_CRASHED, (f"the worker exited (code {run.returncode}) {where}, before this check ran: "
                           "does the submission call sys.exit() or os._exit()?")
    return S_CRASHED, "no result came back for this check"


def _count_files(folder: Path) -> int:
    """Regular files under ``folder`` (lock files aside): what a compiler left in its cache."""
    n = 0
    for dirpath, dirnames, names in os.walk(folder, followlinks=False):
        dirnames[:] = [d for d in dirnames if d != "locks"]
        n += sum(1 for x in names if not x.endswith(".lock") and os.path.isfile(os.path.join(dirpath, x)))
    return n


class Grader:
    def __init__(self, config: Config, *, hidden: str | None = None, worker_user: str | None = None,
                 jobs: int | None = None, has_gpu: bool | None = None, cache: str | None = None,
                 threads: int | None = None, check_files: bool = False, release: list[int] | None = None,
                 budget_s: float | None = None):
        self.config = config
        self.budget_s = budget_s             # the whole run's wall clock (Gradescope's timeout, less a margin)
        self.threads = threads
        self.check_files = check_files       # hash grading/, attnlib/, hidden/ around every worker
        self.release = release               # the released steps (default: what steps/, solutions/ hold)
        self.cache = Path(cache).resolve() if cache else None
        self.hidden = hidden
        self.worker_user = worker_user
        self.jobs = max(1, jobs or config.jobs)
        self.has_gpu = torch.cuda.is_available() if has_gpu is None else has_gpu

    # -- one submission -------------------------------------------------------
    def _unfinished(self, n: int, status: str, message: str) -> StepResult:
        """A step that was not graded (its groups count, at 0 points, unless they need a GPU)."""
        mod, title = STEPS[n]
        res = StepResult(n, mod, title, status, message=message)
        res.groups = [GroupResult(g, graded=not ((g.needs_gpu or step_needs_gpu(n)) and not self.has_gpu))
                      for g in self.config.steps[n].groups]
        return res

    def grade(self, impl, steps: list[int] | None = None, on_step=None) -> Grade:
        """Grade every released step of ``impl``. ``on_step(grade)`` is called after each step with
        the grade so far (steps not finished yet count 0, saying so): write it out, and a run that
        is killed from outside still leaves the steps it graded."""
        t0 = time.monotonic()
        deadline = t0 + self.budget_s - BUDGET_RESERVE_S if self.budget_s else None
        root, where = find_submission(impl)
        notes = [where] if where else []
        isolated = sandbox.namespaces_available()
        if not isolated:
            notes.append("workers ran without OS isolation on this machine (no PID, mount and network namespace: "
                         "that needs root and util-linux `unshare`): a submission could see and signal other "
                         "processes and reach the network; `python -m grading doctor` lists what is active")
        work = sandbox.new_workdir()
        try:
            sub = work / "submission"
            notes += sandbox.copy_submission(root, sub)
            lib = sandbox.worker_lib(work / "lib")
            guard = (sandbox.GraderFiles([REPO / "grading", REPO / "attnlib", REPO / "capstone", self.hidden])
                     if self.check_files else None)
            released = self.release or released_steps()
            wanted = steps or sorted(STEPS)
            todo = [n for n in wanted if n in released and n in self.config.steps]
            threads = self.threads or max(1, (os.cpu_count() or 1) // min(self.jobs, max(1, len(todo))))
            results: dict[int, StepResult] = {}
            for n in wanted:
                mod, title = STEPS[n]
                if n not in released or n not in self.config.steps:
                    results[n] = StepResult(n, mod, title, S_NOT_RELEASED,
                                            message="not part of this release" if n not in released
                                            else "not in grading/config.toml")

            def one(n):
                left = deadline - time.monotonic() if deadline else None
                if left is not None and left < 5:
                    return self._unfinished(n, S_OUT_OF_TIME, (
                        f"not graded: the grading run's {self.budget_s:g} s budget ran out before this step "
                        "started (the steps before it took that long); the steps graded before it keep their points"))
                try:
                    return self.grade_step(n, sub, lib, work, threads, guard, time_left=left)
                except Exception as exc:  # the grader's own bug: still a row, never a lost grade
                    mod, title = STEPS[n]
                    return StepResult(n, mod, title, S_GRADER, message=f"grader error: {type(exc).__name__}: {exc}")

            def so_far():
                pending = {n: self._unfinished(n, S_OUT_OF_TIME, "not graded: the grading run stopped before "
                                               "this step finished (over the autograder's time limit?)")
                           for n in todo if n not in results}
                rows = {**results, **pending}
                return Grade(str(impl), [rows[n] for n in sorted(rows)], time.monotonic() - t0, self.has_gpu,
                             list(notes), isolated)

            if on_step:
                on_step(so_far())
            with ThreadPoolExecutor(self.jobs) as pool:
                futures = [pool.submit(one, n) for n in todo]
                for fut in as_completed(futures):
                    res = fut.result()
                    results[res.step] = res
                    if on_step:
                        on_step(so_far())
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if deadline and any(r.status == S_OUT_OF_TIME for r in results.values()):
            notes.append(f"the grading run's {self.budget_s:g} s budget ran out: steps marked 'out of time' "
                         "were not graded")
        return Grade(str(impl), [results[n] for n in sorted(results)], time.monotonic() - t0, self.has_gpu, notes,
                     isolated)

    # -- one step -------------------------------------------------------------
    def grade_step(self, n: int, sub: Path, lib: Path, work: Path, threads: int,
                   guard: sandbox.GraderFiles | None, time_left: float | None = None) -> StepResult:
        t0 = time.monotonic()
        mod, title = STEPS[n]
        sc = self.config.steps[n]
        spec = STEP_SPECS[n]
        res = StepResult(n, mod, title, S_FAILED)
        if step_needs_gpu(n) and not self.has_gpu:
            res.status = S_NEEDS_GPU
            res.groups = [GroupResult(g, graded=False, note="needs a GPU") for g in sc.groups]
            res.message = "no CUDA GPU here: not graded on this machine (and not counted)"
            return res
        if not (sub / f"{mod}.py").exists():
            res.status = S_MISSING
            res.groups = [GroupResult(g) for g in sc.groups]
            for gr in res.groups:
                gr.graded = not (gr.group.needs_gpu and not self.has_gpu)
            res.message = f"{mod}.py is missing from the submission"
            return res
        items, skipped = build_items(n, sc.groups, self.has_gpu)
        _sdpa_expectations(items)
        env = {"TRITON_INTERPRET": "1"} if spec.runs_on == "triton" and not self.has_gpu else {}
        timeout_s = sc.timeout_s if time_left is None else min(sc.timeout_s, time_left)
        by_budget = self.budget_s if timeout_s < sc.timeout_s else None
        run = sandbox.run_worker(base=work / f"step{n:02d}", lib=lib, step=n, root=sub, items=items,
                                 rules=spec.rules, timeout_s=timeout_s, memory_mb=sc.memory_mb,
                                 threads=threads, has_gpu=self.has_gpu, env_extra=env,
                                 user=self.worker_user, guard=guard, cache=self.cache)
        res.max_rss_mb = run.max_rss_mb
        groups = {g.name: GroupResult(g) for g in sc.groups}
        for g in skipped:
            groups[g.name].graded = False
            groups[g.name].note = "needs a GPU: not graded here (and not counted)"

        # Whatever went wrong for the whole step
        step_problem = None
        if run.rejected:
            step_problem = (S_REJECTED, f"the worker's output was rejected: {run.rejected}. Only plain tensors "
                                        "and values are accepted; the whole step scores 0")
        elif run.tampered:
            step_problem = (S_REJECTED, "the submission changed the grader's own files while it ran ("
                                        + ", ".join(run.tampered[:5]) + "): the whole step scores 0")
        imp_err = (run.import_rec or {}).get("error")

        ev = Evaluator(self.config.diagnose_first)
        fwd_bug: dict[int, CheckResult] = {}     # item -> its failed forward check, for the backward's report
        ran_ok = set()
        lost_status, lost_msg = None, None
        for i, it in enumerate(items):
            rec = run.records.get(i)
            if rec is not None and not rec.get("error") and rec.get("tensors") is not None:
                ran_ok.add(i)
            for c in it.checks:
                if step_problem:
                    cr = CheckResult(c.group, c.name, FAILED, step_problem[1])
                elif imp_err:
                    st = NOT_IMPLEMENTED if imp_err.get("type") == "NotImplementedError" else ERROR
                    cr = CheckResult(c.group, c.name, st, "importing the step failed: "
                                     + f"{imp_err.get('type')}: {imp_err.get('message', '')}\n{imp_err.get('traceback', '')}".rstrip())
                elif rec is None:
                    if lost_msg is None:
                        lost_status, lost_msg = _lost_message(run, items, timeout_s, sc.memory_mb, by_budget)
                    cr = CheckResult(c.group, c.name, LOST, lost_msg)
                else:
                    rec.setdefault("tensors", {})
                    rec.setdefault("meta", {})
                    cr = ev.evaluate(c, it, rec)
                    if c.what in ("o", "ring_o") and cr.status == FAILED:
                        fwd_bug[i] = cr
                    elif c.what in ("grads", "ring_grads") and cr.status == FAILED and i in fwd_bug:
                        f = fwd_bug[i]
                        cr.message += (f"\n  the forward is wrong on this input too (see the {f.group} group): fix it first"
                                       + (f"; likely bug there: {f.likely_bug}" if f.likely_bug else ""))
                groups[c.group].checks.append(cr)
                if c.what == "time" and cr.passed:
                    res.leaderboard.append({"name": f"Step {n:02d} fwd+bwd ms ({c.name})",
                                            "value": round(float(rec["meta"]["ms"]), 4), "order": "asc"})

        # Points
        for gr in groups.values():
            if not gr.graded or not gr.checks:
                gr.points = 0.0
                continue
            frac = gr.n_passed / len(gr.checks)
            if gr.group.all_or_nothing:
                frac = math.floor(frac)
            gr.points = round(gr.group.points * frac, 4)
        res.groups = list(groups.values())
        # Nothing pays before the forward is right somewhere on this device: a stub whose CUDA kernel
        # returns whatever its TODO leaves in memory still passes the input checks, and must score 0.
        # Step 05's warm-ups pay on their own: each tests one helper the student wrote (a stub's
        # raises), so a student with the helpers done and the kernel not yet gets their points.
        forward = [gr for gr in res.groups if gr.graded and gr.checks and gr.group.kind == "forward"]
        if forward and not any(gr.n_passed for gr in forward):
            for gr in res.groups:
                if gr.points and gr.group.kind != "warmup":
                    gr.points = 0.0
                    gr.note = "pays once the forward is right on at least one input"

        # Rules: any broken rule zeroes the step
        # An import that failed on a forbidden call (SDPA blocked at the dispatcher, the worker's absent reference)
        # broke that rule: say so.
        guard_at_import = (run.import_rec or {}).get("guard", {})
        forbidden_at_import = bool(imp_err) and (
            ("no_sdpa" in spec.rules and int(guard_at_import.get("sdpa_import", 0)) > 0)
            or ("no_reference" in spec.rules and int(guard_at_import.get("reference", 0)) > 0))
        if not step_problem and (not imp_err or forbidden_at_import):
            # The rules are about attention; a warm-up's launches are not the forward's (and are counted apart).
            ran_ok_checks = {i for i in ran_ok if items[i].checks and items[i].kind != "warmup"}
            cache = self.cache or work / "cache"
            observed = {"inductor_files": _count_files(cache / "inductor"),
                        "triton_files": _count_files(cache / "triton") if self.has_gpu else None}
            res.rules = evaluate_rules(spec.rules, items, run.records, ran_ok_checks, observed,
                                       import_guard=(run.import_rec or {}).get("guard"))
        broken = [r for r in res.rules if not r.ok]
        if broken:
            for gr in res.groups:
                gr.points = 0.0
                gr.note = "step scored 0: a rule was broken"

        # Status and the first failure
        all_checks = [c for gr in res.groups if gr.graded for c in gr.checks]
        failing = [c for c in all_checks if not c.passed]
        if step_problem:
            res.status, res.message = step_problem
            for gr in res.groups:
                gr.points = 0.0
        elif imp_err and imp_err.get("type") != "NotImplementedError" and not (forbidden_at_import and broken):
            res.status = S_IMPORT
            res.message = f"importing {mod} failed: {imp_err.get('type')}: {imp_err.get('message', '')}"
        elif (failing and all(c.status == NOT_IMPLEMENTED for c in failing)
              and not any(c.passed for gr in res.groups if gr.graded and gr.group.kind == "forward"
                          for c in gr.checks)):
            # The step's own code is not there: whatever passes runs given code (an earlier step's
            # kernel through attention_with_lse, say), and a rule "broken" by code that never ran
            # says nothing. Nothing pays before the forward is right (above).
            res.status = S_NOT_IMPL
            res.message = failing[0].message
        elif broken:
            res.status = S_RULE
            res.message = "; ".join(f"{RULES[r.rule]}: {r.message}" for r in broken)
        elif not failing:
            res.status = S_PASSED
        elif lost_msg:
            res.status = lost_status
            first = failing[0]
            res.message = lost_msg if first.status == LOST else f"{first.group} {first.name}: {first.summary}"
        else:
            res.status = S_FAILED
            first = failing[0]
            res.message = f"{first.group} {first.name}: {first.summary}"
        if res.status != S_PASSED:
            res.leaderboard = []        # speed counts only for a step that is right
        res.seconds = time.monotonic() - t0
        return res


def grade(impl, config: Config, **kwargs) -> Grade:
    steps = kwargs.pop("steps", None)
    return Grader(config, **kwargs).grade(impl, steps)
