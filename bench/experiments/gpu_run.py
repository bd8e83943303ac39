"""What step 07's CUDA experiments (cuda_v4_wgmma.py, cuda_v5.py, cuda_v6.py, cuda_bwd_wgmma.py) share
on the GPU: the record of one run -- every line printed and written to NAME.log, NAME.json rewritten
after every part, parts that record their error and never raise, the run's metadata -- and
compute-sanitizer over the script's own ``--sanitize-child`` mode, and the loop that checks every case
against the reference (``check_cases``). The Triton experiments that change one piece of a step's kernels
share two more: ``rebuild`` (a step's function over other globals, so a variant reuses the step's own code)
and ``cs336_harness`` (CS336's leaderboard harness with step 06's backward replaced, alternated with the
table, the SM clock and power of each run). The compile reports (no GPU needed) share ``triton_tool``.

    REC = gpu_run.Record("cuda_v6")          # module level; RESULT = REC.result, log = REC.log, ...
    REC.open(args.out, REPO)                 # in main(), on the GPU
    @REC.part("2 correctness")
    def correctness(): ...
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
import types
from datetime import datetime
from pathlib import Path


def triton_tool(name: str) -> str | None:
    """The ``ptxas`` / ``cuobjdump`` Triton itself compiles with, or None: its knobs honour TRITON_PTXAS_PATH,
    which torch's Inductor sets to torch/bin/ptxas where a CUDA 13 wheel ships one. Triton writes the PTX
    version of the ptxas it uses, so another ptxas can refuse it: at 6f691db on the H200 the PTX said 9.0 (torch's
    ptxas 13.0) and Triton's bundled 12.8 ptxas answered "Unsupported .version 9.0", and every register report failed."""
    from triton import knobs
    try:
        return getattr(knobs.nvidia, name).path
    except (AttributeError, RuntimeError):
        return None


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
        # The experiments measure step 06's Triton kernels, as they did before its solution took a Gluon dK/dV
        # kernel on Hopper (solutions/gluon_dkdv.py): off unless the run asks for it (ATTN_GLUON_DKDV=1).
        os.environ.setdefault("ATTN_GLUON_DKDV", "0")
        # Likewise step 05's forward, whose solution hands N >= 8192 to a Gluon kernel on Hopper (solutions/gluon_fwd.py).
        os.environ.setdefault("ATTN_GLUON_FWD", "0")
        meta = {"torch": torch.__version__, "cuda": torch.version.cuda, "argv": sys.argv,
                "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                "ATTN_GLUON_DKDV": os.environ["ATTN_GLUON_DKDV"], "ATTN_GLUON_FWD": os.environ["ATTN_GLUON_FWD"]}
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


def rebuild(fn, g: dict):
    """``fn`` (a plain function: a ``@triton.jit``'s ``.fn`` or a launcher's ``__wrapped__``) with the same code
    over the globals ``g``. A variant of a step's kernel is the step's own code with one name changed in a copy
    of its module's globals, so the two cannot drift apart."""
    new = types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__annotations__ = dict(fn.__annotations__)       # Triton reads tl.constexpr from the annotations
    new.__qualname__, new.__module__, new.__doc__ = fn.__qualname__, fn.__module__, fn.__doc__
    return new


def smi_means(path: Path, t0: datetime, t1: datetime) -> dict:
    """Mean SM clock (MHz) and power (W) of nvidia-smi's samples between t0 and t1 (``nvidia-smi
    --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,... --format=csv -lms 100``)."""
    clk, pw = [], []
    with open(path) as fh:
        for r in list(csv.reader(fh))[1:]:
            try:
                t = datetime.strptime(r[0].strip(), "%Y/%m/%d %H:%M:%S.%f")
            except ValueError:
                continue
            if t0 <= t <= t1:
                clk.append(int(r[1].split()[0]))
                pw.append(float(r[3].split()[0]))
    if not clk:
        return {}
    return {"sm_mhz": round(sum(clk) / len(clk)), "watts": round(sum(pw) / len(pw)), "samples": len(clk)}


def cs336_harness(rec: Record, out: Path, variants, rep_ms: int, budget_s: float, t0: float,
                  key: str = "harness") -> dict:
    """CS336's leaderboard harness: ``torch.compile(FlashAttentionTriton.apply)`` of step 06 on
    ``q, k, v = torch.randn(3, 16, 16384, 64, bf16, requires_grad=True)``, ``f(q, k, v, True).sum().backward()``,
    the mean of ``triton.testing.do_bench(rep=rep_ms, warmup=500)``; cuDNN's SDPA first and last, the table
    before and after every variant. ``variants``: ``(name, backward)`` pairs, ``backward`` a function with
    step 06's ``backward`` signature that replaces it for that run (the backward operator is opaque to the
    compiler and calls ``backward`` at run time; the compiled forward stays the table's). A variant is not
    started after ``budget_s`` seconds from ``t0``. Rows go to ``rec.result[key]``, saved after each run,
    with nvidia-smi's mean SM clock and power over the run."""
    import torch
    import torch.nn.functional as F
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attnlib.loader import load_step
    s6 = load_step(6, "solutions")
    smi_path = Path(out) / "smi.csv"
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu",
                            "--format=csv", "-lms", "100"], stdout=open(smi_path, "w"), stderr=subprocess.DEVNULL)
    hq, hk, hv = torch.randn(3, 16, 16384, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    every = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    real_bwd = s6.backward
    rows = []

    def run(name, bwd=None, cudnn=False):
        torch._dynamo.reset()
        s6.backward = bwd or real_bwd
        f = (lambda q, k, v, c: F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=c)[0]) \
            if cudnn else torch.compile(s6.FlashAttentionTriton.apply)

        def step():
            f(hq, hk, hv, True).sum().backward()
        try:
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION] if cudnn else every):
                for _ in range(2):
                    step()
                torch.cuda.synchronize()
                ta = datetime.now()
                ms = round(float(triton.testing.do_bench(step, rep=rep_ms, warmup=500)), 4)
                tb = datetime.now()
            row = {"name": name, "ms": ms, **smi_means(smi_path, ta, tb)}
        except Exception as e:  # noqa: BLE001
            row = {"name": name, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        finally:
            s6.backward = real_bwd
        rows.append(row)
        rec.log(f"  {name:<18} {row.get('ms', row.get('error'))}  {row.get('sm_mhz', '?')} MHz {row.get('watts', '?')} W")
        rec.result[key] = rows
        rec.save()

    try:
        run("sdpa_cudnn", cudnn=True)
        run("table")
        for name, bwd in variants:
            if time.time() - t0 > budget_s:
                rec.log(f"  budget reached: {name} and after not timed")
                break
            run(name, bwd)
            run("table")
        run("sdpa_cudnn again", cudnn=True)
    finally:
        smi.terminate()
    return {"table_ms": [r["ms"] for r in rows if r["name"] == "table" and "ms" in r]}
