"""What step 07's CUDA experiments (cuda_v4_wgmma.py, cuda_v5.py, cuda_v6.py, cuda_bwd_wgmma.py) share
on the GPU: the record of one run -- every line printed and written to NAME.log, NAME.json rewritten
after every part, parts that record their error and never raise, the run's metadata -- and
compute-sanitizer over the script's own ``--sanitize-child`` mode, and the loop that checks every case
against the reference (``check_cases``).

    REC = gpu_run.Record("cuda_v6")          # module level; RESULT = REC.result, log = REC.log, ...
    REC.open(args.out, REPO)                 # in main(), on the GPU
    @REC.part("2 correctness")
    def correctness(): ...
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path


class Record:
    def __init__(self, name: str):
        self.name = name
        self.result: dict = {"parts": {}}
        self.out: Path | None = None
        self._log = None

    @property
    def json_path(self) -> Path | None:
        return None if self.out is None else self.out / f"{self.name}.json"

    def open(self, out: Path, repo: Path) -> None:
        """Start writing under ``out``: NAME.log from here on, NAME.json at every save; the metadata
        every run records (torch, CUDA, argv, date, the checkout's commit)."""
        import torch
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self._log = open(self.out / f"{self.name}.log", "w")
        meta = {"torch": torch.__version__, "cuda": torch.version.cuda, "argv": sys.argv,
                "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        try:
            meta["git"] = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                                         capture_output=True, text=True).stdout.strip()
        except Exception:  # noqa: BLE001 -- a copy without git still runs
            pass
        self.result["meta"] = meta

    def log(self, *a) -> None:
        line = " ".join(str(x) for x in a)
        print(line, flush=True)
        if self._log is not None:
            self._log.write(line + "\n")
            self._log.flush()

    def save(self) -> None:
        if self.out is not None:
            self.json_path.write_text(json.dumps(self.result, indent=1, default=str))

    def part(self, name: str):
        """Decorator: run a part, record ok/error and its seconds, never raise."""
        def deco(fn):
            def run(*a, **kw):
                t0 = time.time()
                self.log(f"\n=== {name}")
                try:
                    out = fn(*a, **kw)
                    self.result["parts"][name] = {"ok": True, "s": round(time.time() - t0, 1), **(out or {})}
                except Exception as e:  # noqa: BLE001 -- recorded, the next part still runs
                    tb = traceback.format_exc()
                    self.log(f"{name} FAILED: {type(e).__name__}: {e}\n{tb}")
                    self.result["parts"][name] = {"ok": False, "error": f"{type(e).__name__}: {e}",
                                                  "traceback": tb[-4000:], "s": round(time.time() - t0, 1)}
                self.save()
            return run
        return deco


def check_cases(cases, log) -> dict:
    """Run every case of ``cases`` (``(tag, check)`` pairs, ``check()`` raising when the kernel is wrong; a
    generator, so each case's inputs are made when it runs): a failure is recorded with its message and
    logged, and the next case runs. Returns the correctness part's record: ``n_fail``, ``n``, ``rows``."""
    rows, n_fail = [], 0
    for tag, check in cases:
        try:
            check()
            rows.append({"case": tag, "ok": True})
        except Exception as e:  # noqa: BLE001
            n_fail += 1
            rows.append({"case": tag, "ok": False, "error": str(e)[:2000]})
            log(f"  FAIL {tag}: {str(e)[:1500]}")
    log(f"correctness: {len(rows) - n_fail}/{len(rows)} cases match the float64 reference")
    return {"n_fail": n_fail, "n": len(rows), "rows": rows}


def sanitize(script: str, t_start: float, log, budget_s: float = 230.0) -> dict:
    """``script --sanitize-child`` under compute-sanitizer memcheck, then racecheck; each gets half of
    what is left of ``budget_s`` since ``t_start`` (30 s at least). {tool: {"rc", "tail"}}."""
    cs = shutil.which("compute-sanitizer")
    if cs is None:
        from torch.utils.cpp_extension import CUDA_HOME
        cand = Path(CUDA_HOME or "/usr/local/cuda") / "bin" / "compute-sanitizer"
        cs = str(cand) if cand.exists() else None
    if cs is None:
        raise FileNotFoundError("compute-sanitizer not found (PATH, $CUDA_HOME/bin)")
    out = {}
    for tool in ("memcheck", "racecheck"):
        r = subprocess.run([cs, "--tool", tool, "--error-exitcode", "3", sys.executable, script, "--sanitize-child"],
                           capture_output=True, text=True, timeout=max(30.0, (budget_s - (time.time() - t_start)) / 2),
                           env={**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"})
        tail = (r.stdout + r.stderr)[-3000:]
        out[tool] = {"rc": r.returncode, "tail": tail}
        log(f"  {tool}: rc {r.returncode}\n{tail[-1500:]}")
    return out
