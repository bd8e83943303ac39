"""Run a step's worker in its own process, and read back what it wrote without trusting it.

Per step: a fresh directory with the task (settings only, no input), an empty
``out/``, a private HOME, TMPDIR and cwd; the worker is ``python -I`` in its own
session (process group), with an address-space cap (CPU), no core dumps, a
file-size cap, a wall-clock timeout and a resident-memory watchdog. The inputs go
down its stdin one item at a time, after its import (``_Channel``), and each
record in ``out/`` is read back when its item is acknowledged: regular files only,
size-capped, ``torch.load(weights_only=True)``, then a schema check that admits
plain tensors and plain values, nothing else. When the worker ends -- finished,
crashed, killed -- the whole process group is killed.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
import pwd
import re
import select
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
    """A private copy of what the worker imports (attnlib/, capstone/, grading/worker.py): a submission
    that patches or rewrites "attnlib" changes this copy, never the grader's."""
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copytree(REPO / "attnlib", dst / "attnlib", ignore=shutil.ignore_patterns("__pycache__"))
    # No reference in the worker: every comparison happens in the grader, so the worker's copy of
    # attnlib.reference only raises. Unwrapping the rule's counter (__wrapped__) or reloading the
    # module then finds nothing to call (issue 14, hole 2: 10/10 that way before).
    shutil.copyfile(REPO / "grading" / "worker_reference.py", dst / "attnlib" / "reference.py")
    shutil.copytree(REPO / "capstone", dst / "capstone", ignore=shutil.ignore_patterns("__pycache__"))
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
    progress: str = ""                             # the item in flight when the worker stopped, if any
    sent: int = 0                                  # items sent to the worker
    in_flight: int | None = None                   # the item sent and not yet acknowledged
    stderr_tail: str = ""
    rejected: str | None = None
    tampered: list = field(default_factory=list)
    # memory probe's item index -> (MiB when it was sent, the highest seen while it was in flight): the resident
    # memory of the worker's whole process tree, read by the grader from /proc, which the worker cannot
    # change (a memory probe's soft address-space cap it can lift: grading/README.md)
    item_rss: dict = field(default_factory=dict)


BOOT = """\
import resource, sys
for _lim, _val in {limits!r}:
    resource.setrlimit(_lim, (_val, _val))
sys.dont_write_bytecode = True
sys.path.insert(0, {repo!r})
from grading.worker import finish, main
finish(main())
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


_PROC_CHILDREN: bool | None = None


def _kids(pid: int) -> list[int]:
    """``pid``'s children, from /proc/<pid>/task/<tid>/children: every thread's, since a child forked by a
    thread is listed under that thread."""
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:                                # gone
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
        except (OSError, ValueError):              # the thread ended meanwhile
            continue
    return out


def _tree_rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and all its descendants: forked children share one cap.

    The watchdog calls this every 20-50 ms while a worker runs. The descendants are walked down from
    ``pid`` through /proc/<pid>/task/<tid>/children (Linux 3.5+, CONFIG_PROC_CHILDREN), which reads
    the worker's few processes; reading every process's /proc/<pid>/stat to find the parents cost
    2.5 ms of the grader's CPU a call with 68 processes on the machine (more on a busy one): 5% of a
    core through every grade, 12% during a memory probe (measured 2026-12-03). The same processes are
    found either way (an orphan reparented outside the tree is lost to both); where the kernel has no
    children file, the scan."""
    global _PROC_CHILDREN
    if _PROC_CHILDREN is None:
        _PROC_CHILDREN = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
    kids = _children() if not _PROC_CHILDREN else None
    total, todo, seen = 0.0, [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        total += _rss_mb(p)
        todo.extend(kids.get(p, []) if kids is not None else _kids(p))
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
# The loopback interface of the worker's own network namespace, brought up before anything else
# runs (as root: a worker user is only taken on by the command after it): step 10's gloo ranks,
# child processes of the worker, connect to each other over it. The namespace has no other
# interface, so this reaches no process outside the worker's namespace, and no network. Through
# the SIOCSIFFLAGS ioctl (IFF_UP | IFF_RUNNING), so iproute2 need not be installed; `python -S`:
# a few milliseconds. "$1" is the worker's interpreter. A failure leaves the loopback down (step
# 10's ring group then says it needs a process group) and the rest of the sandbox as it was.
LOOPBACK_UP = ('"$1" -I -S -c \'import fcntl, socket, struct; fcntl.ioctl(socket.socket(socket.AF_INET, '
               'socket.SOCK_DGRAM), 0x8914, struct.pack("16sH14x", b"lo", 0x41))\' 2>/dev/null; ')
READ_ONLY = LOOPBACK_UP + 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" "$0" && exec "$@"'


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


_LOOPBACK: bool | None = None


def loopback_in_namespace() -> bool:
    """Can a process inside the worker's network namespace listen on 127.0.0.1 (step 10's gloo
    ranks)? Outside a namespace the machine's own loopback serves. (Probed once.)"""
    global _LOOPBACK
    if _LOOPBACK is None:
        _LOOPBACK = True
        if namespaces_available():
            try:
                with tempfile.TemporaryDirectory() as d:
                    probe = subprocess.run(UNSHARE + ["sh", "-c", READ_ONLY, d, sys.executable, "-I", "-S", "-c",
                                                      "import socket; socket.create_server(('127.0.0.1', 0))"],
                                           capture_output=True, timeout=20)
                _LOOPBACK = probe.returncode == 0
            except (OSError, subprocess.SubprocessError):
                _LOOPBACK = False
    return _LOOPBACK


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
        ("a loopback for step 10's gloo ranks (inside the worker's namespace: no network)", loopback_in_namespace(),
         "SIOCSIFFLAGS on lo, as root, before the worker starts" if ns else "the machine's own loopback"),
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


def _frame(item) -> bytes:
    """One item for the worker's stdin: 8 bytes of length, then its task dict as torch.save writes it."""
    buf = io.BytesIO()
    torch.save(item.task(), buf)
    data = buf.getvalue()
    return len(data).to_bytes(8, "big") + data


END_FRAME = (0).to_bytes(8, "big")
MAX_ACK_LINE = 64


class _Channel:
    """The grader's side of the worker's channel: items out on the worker's stdin, one at a time,
    each after the worker acknowledged the one before (grading/worker.py is the other side).

    The grader reads a record back the moment its item is acknowledged, before it sends the next
    item, and reads no later version of it: so record i is fixed before item i + 1 leaves the grader,
    and nothing of a later input -- the hidden groups' are last -- can be in it, even from a
    submission that takes over the worker's end of the channel.
    """

    def __init__(self, items: list, out: Path, run: WorkerRun, items_w: int, ack_r: int):
        self.items, self.out, self.run = items, out, run
        self.items_w, self.ack_r = items_w, ack_r
        self.pending = b""
        self.rss = None                    # () -> the worker tree's resident MiB, set by _watch
        self.expect: str | None = "I"      # the acknowledgement that moves things on
        self.partial = b""
        os.set_blocking(items_w, False)

    def is_probe(self, i: int) -> bool:
        """Item ``i`` is a memory probe: a call given a cap of ``headroom_mb`` above what the worker held."""
        return bool(getattr(self.items[i], "extra", {}).get("headroom_mb"))

    def wanted(self):
        r = [self.ack_r] if self.ack_r is not None else []
        w = [self.items_w] if self.items_w is not None and self.pending else []
        return r, w

    def on_readable(self) -> bool:
        """Read acknowledgements; False once the record read back was rejected."""
        try:
            data = os.read(self.ack_r, 4096)
        except BlockingIOError:
            return True
        except OSError:
            data = b""
        if not data:                               # every holder of the write end is gone
            os.close(self.ack_r)
            self.ack_r = None
            return True
        *lines, self.partial = (self.partial + data).split(b"\n")
        self.partial = self.partial[-MAX_ACK_LINE:]
        for line in lines:
            if self.expect is None or line.decode("ascii", "replace").strip() != self.expect:
                continue                           # not the acknowledgement awaited: ignored
            if not self._seal(self.expect):
                return False
            self._next()
        return True

    def _seal(self, which: str) -> bool:
        run = self.run
        try:
            if which == "I":
                run.import_rec = _read_record(self.out / "import.pt")
            else:
                run.records[int(which)] = _read_record(self.out / f"{which}.pt")
        except FileNotFoundError:
            pass                                   # acknowledged, never written: no result
        except Rejected as exc:
            run.rejected = str(exc)
            return False
        return True

    def _next(self):
        run = self.run
        if run.sent < len(self.items):
            self.pending = _frame(self.items[run.sent])
            self.expect = str(run.sent)
            run.in_flight = run.sent
            if self.rss is not None and self.is_probe(run.sent):
                now = self.rss()
                run.item_rss[run.sent] = (now, now)
            run.sent += 1
        else:
            self.pending, self.expect, run.in_flight = END_FRAME, None, None

    def on_writable(self):
        try:
            n = os.write(self.items_w, self.pending[:2 ** 16])
            self.pending = self.pending[n:]
        except BlockingIOError:
            return
        except OSError:                            # the worker is gone (EPIPE): nothing more to send
            self.pending = b""
        if not self.pending and self.expect is None:
            self.close_items()

    def close_items(self):
        if self.items_w is not None:
            os.close(self.items_w)
            self.items_w = None

    def close(self):
        self.close_items()
        if self.ack_r is not None:
            os.close(self.ack_r)
            self.ack_r = None


def run_worker(*, base: Path, lib: Path, step: int, root: Path, items: list, rules, timeout_s: float,
               memory_mb: int, threads: int, has_gpu: bool, env_extra: dict | None = None,
               user: str | None = None, guard: GraderFiles | None = None,
               cache: Path | None = None) -> WorkerRun:
    """Run one step's items in a fresh worker under ``base`` (created here).

    The task file holds settings only; the items go to the worker over its stdin, one at a time,
    after its import (``_Channel``). ``cache``: compile caches (Inductor, Triton, extensions);
    default a folder private to this submission, since a cache shared with other submissions
    could be poisoned by one of them.
    """
    import resource
    cache = cache or base.parent / "cache"
    for sub in ("out", "cwd", "home", "tmp"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    for sub in ("inductor", "triton", "torch_extensions"):
        (cache / sub).mkdir(parents=True, exist_ok=True)
    items_r, items_w = os.pipe()
    ack_r, ack_w = os.pipe()
    task = {"step": step, "root": str(root), "out_dir": str(base / "out"), "threads": threads,
            "rules": list(rules), "ack_fd": ack_w}
    torch.save(task, base / "task.pt")
    limits = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_FSIZE, MAX_FILE_BYTES)]
    if not has_gpu:   # a CUDA context maps far more address space than it uses: the watchdog caps RSS there
        limits.append((resource.RLIMIT_AS, int(memory_mb) * 2 ** 20))
    cmd = [sys.executable, "-I", "-c", BOOT.format(limits=limits, repo=str(lib)), str(base / "task.pt")]
    kwargs = {}
    pw = pwd.getpwnam(user) if user else None
    namespaced = namespaces_available() and (pw is None or shutil.which("setpriv") is not None)
    if pw is not None:
        # The worker user may write only its own step folder and the caches; it reads the rest.
        for p in [base, cache, *base.rglob("*"), *cache.rglob("*")]:
            os.chown(p, pw.pw_uid, pw.pw_gid)
        if namespaced:
            # The namespace is set up as root (unshare, the loopback, the read-only mount); the user is
            # taken on by the last command, setpriv (util-linux, like unshare). Popen(user=...) would
            # drop root before unshare, which then fails: every worker "crashed" (2026-11-30).
            cmd = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups", "--"] + cmd
        else:
            kwargs.update(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
    if namespaced:
        cmd = UNSHARE + ["sh", "-c", READ_ONLY, str(Path(lib).resolve())] + cmd
    run = WorkerRun()
    t0 = time.monotonic()
    try:
        with open(base / "stdout.txt", "wb") as out_f, open(base / "stderr.txt", "wb") as err_f:
            proc = subprocess.Popen(cmd, cwd=base / "cwd",
                                    env=worker_env(base, cache, threads, env_extra or {}, has_gpu),
                                    stdin=items_r, stdout=out_f, stderr=err_f, pass_fds=(ack_w,),
                                    start_new_session=True, close_fds=True, **kwargs)
    finally:
        os.close(items_r)
        os.close(ack_w)
    chan = _Channel(items, base / "out", run, items_w, ack_r)
    try:
        status, ru = _watch(proc, chan, run, t0, timeout_s, memory_mb)
    finally:
        chan.close()
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
    run.progress = "" if run.in_flight is None else str(run.in_flight)
    _collect(run, base / "out", len(items))
    return run


def _watch(proc, chan: _Channel, run: WorkerRun, t0: float, timeout_s: float, memory_mb: int):
    """Feed the worker and watch it until it ends: wall clock, resident memory of its whole process
    tree, and the channel. Returns wait4's (status, rusage)."""
    delay, last_rss = 0.02, 0.0
    chan.rss = lambda: _tree_rss_mb(proc.pid)
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        now = time.monotonic()
        # a memory probe in flight: sampled every 20 ms (an N x N matrix lives for the hundreds of ms its
        # products take), else every 50
        probe = run.in_flight is not None and chan.is_probe(run.in_flight)
        if now - t0 > timeout_s:
            run.timed_out = True
        elif now - last_rss > (0.02 if probe else 0.05):
            last_rss = now
            rss = _tree_rss_mb(proc.pid)
            run.memory_killed = rss > memory_mb
            if run.in_flight in run.item_rss:
                start, peak = run.item_rss[run.in_flight]
                run.item_rss[run.in_flight] = (start, max(peak, rss))
        if run.timed_out or run.memory_killed or run.rejected:
            _kill_group(proc.pid)
            _, status, ru = os.wait4(proc.pid, 0)
            break
        r, w = chan.wanted()
        try:
            readable, writable, _ = select.select(r, w, [], delay)
        except InterruptedError:
            continue
        if writable:
            chan.on_writable()
        if readable and not chan.on_readable():
            continue                               # rejected: killed at the top of the loop
        delay = 0.02 if (readable or writable or probe) else min(delay * 1.5, 0.2)
    _kill_group(proc.pid)                          # whatever it left behind in its group
    return status, ru


def _read_record(path: Path) -> dict:
    """load_record, with a link or an unreadable file turned into a rejection."""
    try:
        return load_record(path)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Rejected("an output file is a symbolic link") from None
        raise Rejected(f"an output file could not be read: {exc}") from None


def _collect(run: WorkerRun, out: Path, n: int):
    """What only the end of the run can tell: the import's record when it failed (no item was sent),
    the record of the item in flight when the worker stopped, and whether it finished."""
    try:
        st = os.lstat(out)
        if not stat.S_ISDIR(st.st_mode):
            run.rejected = "the output folder was replaced by something else"
    except FileNotFoundError:
        run.rejected = "the output folder was removed"
    if not run.rejected:
        try:
            if run.import_rec is None and run.sent == 0:
                run.import_rec = _read_record(out / "import.pt")
            if run.in_flight is not None and run.in_flight not in run.records:
                run.records[run.in_flight] = _read_record(out / f"{run.in_flight}.pt")
        except FileNotFoundError:
            pass
        except Rejected as exc:
            run.rejected = str(exc)
        if not run.rejected and run.sent == n and run.in_flight is None:
            try:
                run.done = _read_record(out / "done.pt").get("n") == n
            except FileNotFoundError:
                pass
            except Rejected as exc:
                run.rejected = str(exc)
    if run.rejected:
        run.records.clear()
        run.import_rec = None
    for i, rec in run.records.items():          # the grader's own measure, never the worker's word
        if isinstance(rec, dict):
            rec.pop("outside", None)
            if i in run.item_rss:
                rec["outside"] = {"rss_start_mb": run.item_rss[i][0], "rss_peak_mb": run.item_rss[i][1]}


def new_workdir(prefix="grading-") -> Path:
    d = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(d, 0o711)
    return d
