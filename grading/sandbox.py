"""Run a step's worker in its own process, and read back what it wrote without trusting it.

Per step: a fresh directory with the task (inputs), an empty ``out/``, a private
HOME, TMPDIR and cwd; the worker is ``python -I`` in its own session (process
group), with an address-space cap (CPU), no core dumps, a file-size cap, a
wall-clock timeout and a resident-memory watchdog. When it ends -- finished,
crashed, killed -- the whole process group is killed, and the grader reads
``out/``: regular files only, size-capped, ``torch.load(weights_only=True)``,
then a schema check that admits plain tensors and plain values, nothing else.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
STEP_FILE = re.compile(r"^step\d\d_\w+\.py$")
COPY_SUFFIXES = {".py", ".cu", ".cuh", ".cpp", ".cc", ".h", ".hpp", ".c", ".txt", ".json", ".toml"}
MAX_SUBMISSION_BYTES = 50 * 2 ** 20
MAX_RECORD_BYTES = 512 * 2 ** 20
MAX_FILE_BYTES = 2 * 2 ** 30          # RLIMIT_FSIZE of the worker: no single file above 2 GiB
TENSOR_DTYPES = {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool, torch.int64, torch.int32}


class Rejected(Exception):
    """The worker wrote something the grader will not accept (not plain data, too big, a link...)."""


# ---------------------------------------------------------------------------
# The submission
# ---------------------------------------------------------------------------

def find_submission_root(path: Path) -> Path:
    """The folder that holds the stepNN_*.py files: PATH, PATH/steps, or PATH's only subfolder with them."""
    path = Path(path)
    if any(STEP_FILE.match(p.name) for p in path.iterdir() if p.is_file()):
        return path
    if (path / "steps").is_dir():
        return path / "steps"
    subs = [d for d in path.iterdir() if d.is_dir() and not d.name.startswith((".", "__"))
            and any(STEP_FILE.match(p.name) for p in d.iterdir() if p.is_file())]
    return subs[0] if len(subs) == 1 else path


def copy_submission(src: Path, dst: Path) -> list[str]:
    """Copy the submission's source files (no links, no binaries, size-capped); returns notes."""
    notes, total = [], 0
    src = Path(src)
    dst.mkdir(parents=True, exist_ok=True)
    for dirpath, dirnames, filenames in os.walk(src, followlinks=False):
        rel = Path(dirpath).relative_to(src)
        if len(rel.parts) > 6:
            dirnames[:] = []
            continue
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in ("__pycache__", "build")]
        for name in filenames:
            p = Path(dirpath) / name
            st = os.lstat(p)
            if not stat.S_ISREG(st.st_mode) or p.suffix not in COPY_SUFFIXES:
                continue
            total += st.st_size
            if total > MAX_SUBMISSION_BYTES:
                notes.append(f"the submission is larger than {MAX_SUBMISSION_BYTES >> 20} MiB: {rel / name} "
                             "and later files were not copied")
                return notes
            (dst / rel).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p, dst / rel / name)
    if not (dst / "__init__.py").exists():
        (dst / "__init__.py").write_text("")
    return notes


# ---------------------------------------------------------------------------
# The grader's own files: a submission must not change them
# ---------------------------------------------------------------------------

class GraderFiles:
    """Hashes of the grader's sources (grading/, attnlib/, the hidden tests), to tell if a worker changed them.

    Detection only: a step whose worker changed them scores 0. Nothing is
    restored -- in a shared working tree a restore could undo a colleague's
    edit -- and compiled ``__pycache__`` files are not watched (other processes
    write them legitimately); grading/README.md says what that leaves open.
    """

    def __init__(self, roots):
        self.roots = [Path(r) for r in roots if r]
        self.hashes = self._read()

    def _read(self):
        out = {}
        for root in self.roots:
            for dirpath, dirnames, names in os.walk(root):
                dirnames[:] = [d for d in dirnames if d != "__pycache__"]
                for n in names:
                    p = Path(dirpath) / n
                    try:
                        with open(p, "rb") as f:
                            out[p] = hashlib.sha256(f.read()).hexdigest()
                    except OSError:
                        out[p] = "unreadable"
        return out

    def changed(self) -> list[str]:
        now = self._read()
        paths = {p for p in set(now) | set(self.hashes) if now.get(p) != self.hashes.get(p)}
        return sorted(str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p) for p in paths)


def worker_lib(dst: Path) -> Path:
    """A private copy of what the worker imports (attnlib/, grading/worker.py): a submission that
    patches or rewrites "attnlib" changes this copy, never the grader's."""
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copytree(REPO / "attnlib", dst / "attnlib", ignore=shutil.ignore_patterns("__pycache__"))
    (dst / "grading").mkdir()
    (dst / "grading" / "__init__.py").write_text("")
    shutil.copyfile(REPO / "grading" / "worker.py", dst / "grading" / "worker.py")
    return dst


# ---------------------------------------------------------------------------
# Reading back
# ---------------------------------------------------------------------------

def _validate(obj, depth=0, budget=None):
    budget = budget if budget is not None else [20000]
    budget[0] -= 1
    if budget[0] < 0 or depth > 8:
        raise Rejected("the output is nested too deeply or holds too many values")
    if obj is None or type(obj) in (bool, int, float):
        return
    if type(obj) is str:
        if len(obj) > 50000:
            raise Rejected("a string in the output is longer than 50000 characters")
        return
    if type(obj) in (list, tuple):
        for x in obj:
            _validate(x, depth + 1, budget)
        return
    if type(obj) is dict:
        for k, v in obj.items():
            if type(k) is not str:
                raise Rejected(f"a key of type {type(k).__name__} (only strings)")
            _validate(v, depth + 1, budget)
        return
    if type(obj) is torch.Tensor:
        if obj.layout != torch.strided or obj.device.type != "cpu" or obj.is_quantized:
            raise Rejected(f"a tensor with layout {obj.layout} on {obj.device} (only dense CPU tensors)")
        if obj.dtype not in TENSOR_DTYPES:
            raise Rejected(f"a tensor of dtype {obj.dtype}")
        if obj.numel() > 64 * 2 ** 20:
            raise Rejected(f"a tensor of {obj.numel()} elements")
        return
    raise Rejected(f"an object of type {type(obj).__module__}.{type(obj).__name__} (only plain tensors and values)")


def _read_regular(path: Path, limit: int) -> bytes:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise
    if not stat.S_ISREG(st.st_mode):
        raise Rejected(f"{path.name} is not a regular file (a link, a pipe?)")
    if st.st_size > limit:
        raise Rejected(f"{path.name} is {st.st_size} bytes (the limit is {limit})")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        return f.read(limit + 1)


def _why(exc: Exception) -> str:
    """The unpickler's reason, without torch's advice to load with weights_only=False."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))
    boiler = ("Weights only load failed", "Please file an issue", "Check the documentation", "In PyTorch 2.6")
    for line in text.splitlines():
        line = line.split("WeightsUnpickler error:", 1)[-1].strip()
        if line and not line.startswith(boiler):
            return line[:300]
    return f"{type(exc).__name__}"


def load_record(path: Path) -> dict:
    """Load one record the worker wrote, or raise Rejected / FileNotFoundError."""
    data = _read_regular(path, MAX_RECORD_BYTES)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")      # torch's note on the pickle protocol: not the student's business
            obj = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as exc:  # an UnpicklingError for anything that is not plain data
        raise Rejected(f"{path.name} is not plain tensors and values ({_why(exc)})") from None
    if type(obj) is not dict:
        raise Rejected(f"{path.name} holds a {type(obj).__name__}, not a record")
    _validate(obj)
    return obj


def read_text_tail(path: Path, n: int = 3000) -> str:
    try:
        data = _read_regular(path, 2 ** 31)
    except (Rejected, FileNotFoundError, OSError):
        return ""
    text = data[-n:].decode("utf-8", "replace")
    return "".join(c for c in text if c.isprintable() or c in "\n\t")


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------

@dataclass
class WorkerRun:
    records: dict = field(default_factory=dict)   # item index -> record
    import_rec: dict | None = None
    done: bool = False
    returncode: int | None = None
    signal: str | None = None
    timed_out: bool = False
    memory_killed: bool = False
    seconds: float = 0.0
    max_rss_mb: float = 0.0
    progress: str = ""
    stderr_tail: str = ""
    rejected: str | None = None
    tampered: list = field(default_factory=list)


BOOT = """\
import resource, sys
for _lim, _val in {limits!r}:
    resource.setrlimit(_lim, (_val, _val))
sys.dont_write_bytecode = True
sys.path.insert(0, {repo!r})
from grading.worker import main
sys.exit(main())
"""


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _children() -> dict[int, list[int]]:
    """ppid -> [pid] for every process this user can see."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _tree_rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and all its descendants: forked children share one cap."""
    kids = _children()
    total, todo, seen = 0.0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        total += _rss_mb(p)
        todo.extend(kids.get(p, []))
    return total


# ---------------------------------------------------------------------------
# OS isolation: a PID, mount and network namespace per worker
# ---------------------------------------------------------------------------
#
# With util-linux `unshare` and root (Gradescope's image, a CI container, an instructor's machine
# with sudo), each worker runs as PID 1 of its own PID namespace, with its own /proc (it cannot see
# or signal the grader, or open /proc/<grader>/fd/1), no network, and the grader's library
# (grading/, attnlib/, the hidden tests beside them) bind-mounted read-only. When the worker ends,
# the kernel kills everything left in its namespace: a detached daemon does not survive it.
# Elsewhere the worker runs as before (its own session, killed as a group), and `python -m grading
# doctor` says which protections are active.

_NAMESPACES: bool | None = None
UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc", "--net", "--kill-child"]
READ_ONLY = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" "$0" && exec "$@"'


def namespaces_available() -> bool:
    """Can this process give a worker its own PID, mount and network namespace? (Probed once.)"""
    global _NAMESPACES
    if _NAMESPACES is None:
        _NAMESPACES = False
        if os.environ.get("ATTN_GRADER_NO_NAMESPACES") != "1" and os.geteuid() == 0 and shutil.which("unshare"):
            try:
                with tempfile.TemporaryDirectory() as d:     # inside: PID 1, and the folder not writable
                    probe = subprocess.run(UNSHARE + ["sh", "-c", READ_ONLY, d, "sh", "-c",
                                                      'test $$ = 1 && ! touch "$0/probe" 2>/dev/null', d],
                                           capture_output=True, timeout=20)
                    _NAMESPACES = probe.returncode == 0 and not os.path.exists(os.path.join(d, "probe"))
                if _NAMESPACES and torch.cuda.is_available():     # and the GPU still answers inside
                    gpu = subprocess.run(UNSHARE + [sys.executable, "-c", "import sys, torch; "
                                                    "sys.exit(0 if torch.cuda.is_available() else 1)"],
                                         capture_output=True, timeout=120)
                    _NAMESPACES = gpu.returncode == 0
            except (OSError, subprocess.SubprocessError):
                _NAMESPACES = False
    return _NAMESPACES


def protections() -> list[tuple[str, bool, str]]:
    """(protection, active here, how) for `python -m grading doctor`."""
    ns = namespaces_available()
    return [
        ("own session, killed as a group at the end", True, "always"),
        ("address-space cap (CPU), file-size cap, no core dumps", True, "setrlimit in the worker"),
        ("wall-clock timeout and a resident-memory cap over the whole process tree", True, "the grader's watchdog"),
        ("own PID namespace: cannot see or signal the grader; no process survives the worker", ns,
         "unshare --pid --fork --mount-proc (needs root and util-linux)"),
        ("no network", ns, "unshare --net"),
        ("grader library read-only inside the worker", ns, "a read-only bind mount in the worker's mount namespace"),
        ("an unprivileged worker user can be given", os.geteuid() == 0, "--worker-user (the grader must be root)"),
    ]


def _kill_group(pgid: int):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def worker_env(base: Path, cache: Path, threads: int, extra: dict, has_gpu: bool) -> dict:
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(base / "home"), "TMPDIR": str(base / "tmp"), "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
        "TORCH_EXTENSIONS_DIR": str(cache / "torch_extensions"),
        "ATTN_BUILD_DIR": str(cache / "attn_build"),      # step 07's extension builds
    }
    for key in ("CUDA_VISIBLE_DEVICES", "CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH", "CC", "CXX",
                "TORCH_CUDA_ARCH_LIST", "MAX_JOBS"):
        if key in os.environ:
            env[key] = os.environ[key]
    if not has_gpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(extra)
    return env


def run_worker(*, base: Path, lib: Path, step: int, root: Path, items: list, rules, timeout_s: float,
               memory_mb: int, threads: int, has_gpu: bool, env_extra: dict | None = None,
               user: str | None = None, guard: GraderFiles | None = None,
               cache: Path | None = None) -> WorkerRun:
    """Run one step's items in a fresh worker under ``base`` (created here).

    ``cache``: compile caches (Inductor, Triton, extensions); default a folder
    private to this submission, since a cache shared with other submissions
    could be poisoned by one of them.
    """
    import resource
    cache = cache or base.parent / "cache"
    for sub in ("out", "cwd", "home", "tmp"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    for sub in ("inductor", "triton", "torch_extensions"):
        (cache / sub).mkdir(parents=True, exist_ok=True)
    task = {"step": step, "root": str(root), "out_dir": str(base / "out"), "threads": threads,
            "rules": list(rules), "items": [it.task() for it in items]}
    torch.save(task, base / "task.pt")
    limits = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, MAX_FILE_BYTES)]
    if not has_gpu:   # a CUDA context maps far more address space than it uses: the watchdog caps RSS there
        limits.append((resource.RLIMIT_AS, int(memory_mb) * 2 ** 20))
    cmd = [sys.executable, "-I", "-c", BOOT.format(limits=limits, repo=str(lib)), str(base / "task.pt")]
    if namespaces_available():
        cmd = UNSHARE + ["sh", "-c", READ_ONLY, str(Path(lib).resolve())] + cmd
    kwargs = {}
    if user:
        pw = pwd.getpwnam(user)
        kwargs.update(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
        # The worker user may write only its own step folder and the caches; it reads the rest.
        for p in [base, cache, *base.rglob("*"), *cache.rglob("*")]:
            os.chown(p, pw.pw_uid, pw.pw_gid)
    run = WorkerRun()
    t0 = time.monotonic()
    with open(base / "stdout.txt", "wb") as out_f, open(base / "stderr.txt", "wb") as err_f:
        proc = subprocess.Popen(cmd, cwd=base / "cwd", env=worker_env(base, cache, threads, env_extra or {}, has_gpu),
                                stdin=subprocess.DEVNULL, stdout=out_f, stderr=err_f,
                                start_new_session=True, close_fds=True, **kwargs)
        status, ru, delay = 0, None, 0.02
        while True:
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            elapsed = time.monotonic() - t0
            if elapsed > timeout_s:
                run.timed_out = True
            elif _tree_rss_mb(proc.pid) > memory_mb:
                run.memory_killed = True
            if run.timed_out or run.memory_killed:
                _kill_group(proc.pid)
                _, status, ru = os.wait4(proc.pid, 0)
                break
            time.sleep(delay)
            delay = min(delay * 1.5, 0.2)
        _kill_group(proc.pid)                  # whatever it left behind in its group
        proc.returncode = os.waitstatus_to_exitcode(status)
    run.seconds = time.monotonic() - t0
    run.max_rss_mb = (ru.ru_maxrss / 1024) if ru is not None else 0.0
    if os.WIFSIGNALED(status):
        run.signal = signal.Signals(os.WTERMSIG(status)).name
    else:
        run.returncode = os.WEXITSTATUS(status)
    if guard is not None:
        run.tampered = guard.changed()
    run.stderr_tail = read_text_tail(base / "stderr.txt")
    _collect(run, base / "out", len(items))
    return run


def _collect(run: WorkerRun, out: Path, n: int):
    try:
        st = os.lstat(out)
        if not stat.S_ISDIR(st.st_mode):
            run.rejected = "the output folder was replaced by something else"
            return
    except FileNotFoundError:
        run.rejected = "the output folder was removed"
        return
    run.progress = read_text_tail(out / "progress", 300).replace("\n", " ").strip()
    try:
        run.import_rec = load_record(out / "import.pt")
        for i in range(n):
            try:
                run.records[i] = load_record(out / f"{i}.pt")
            except FileNotFoundError:
                continue
        try:
            done = load_record(out / "done.pt")
            run.done = done.get("n") == n
        except FileNotFoundError:
            pass
    except FileNotFoundError:
        pass
    except Rejected as exc:
        run.rejected = str(exc)
        run.records.clear()
        run.import_rec = None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            run.rejected = "an output file is a symbolic link"
        else:
            run.rejected = f"an output file could not be read: {exc}"
        run.records.clear()


def new_workdir(prefix="grading-") -> Path:
    d = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(d, 0o711)
    return d
