"""What a measurement is, how it is timed, and which implementations exist.

One row per measurement (``Row``); each row carries the machine it was measured on.
FLOPs are counted as FlashAttention counts them:

    forward   4 * B * H * Nq * Nk * D     two matrix products of 2*Nq*Nk*D each
    causal    half of that                only the lower triangle is computed
    backward  2.5 x forward               2.0 (four products) + 0.5 (recomputing S)
    fwd+bwd   3.5 x forward
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os
import platform
import statistics
import time
from dataclasses import dataclass, field

import torch

from attnlib import make_qkv
from attnlib.loader import load_step


@dataclass
class Row:
    impl: str
    mode: str                 # "fwd", "bwd" or "fwd+bwd"
    dtype: str
    B: int
    H: int
    N: int
    D: int
    causal: bool
    ms: float | None = None
    tflops: float | None = None
    peak_mib: float | None = None       # peak allocated during the measured call, inputs included
    mem_before_bwd_mib: float | None = None
    ratio_to_sdpa_flash: float | None = None
    status: str = "ok"                  # "ok", "oom", "unsupported: ...", "error: ..."
    suite: str = ""                     # "sweep", "grid" or "leaderboard"
    machine: dict = field(default_factory=dict)


def machine_info() -> dict:
    info = {
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        # step 06's dK/dV on Hopper: its Gluon kernel unless "0" (solutions/gluon_dkdv.py)
        "ATTN_GLUON_DKDV": os.environ.get("ATTN_GLUON_DKDV", "1"),
        # step 05's forward on Hopper at N >= 8192: its Gluon kernel unless "0" (solutions/gluon_fwd.py)
        "ATTN_GLUON_FWD": os.environ.get("ATTN_GLUON_FWD", "1"),
    }
    try:
        import triton
        info["triton"] = triton.__version__
    except Exception:
        info["triton"] = None
    return info


def flops(B, H, N, D, causal, mode, Nk=None):
    Nk = N if Nk is None else Nk
    f = 4.0 * B * H * N * Nk * D
    if causal:
        f /= 2
    return {"fwd": f, "bwd": 2.5 * f, "fwd+bwd": 3.5 * f}[mode]


def time_ms(fn, device) -> float:
    """Median milliseconds of ``fn()``: CUDA events through triton.testing.do_bench on a GPU
    (warm-up, L2 flushed between repeats), perf_counter after warm-up on a CPU."""
    if device == "cuda":
        from triton.testing import do_bench
        return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))
    fn()                                            # warm-up (and compile)
    times = []
    budget = time.perf_counter() + 0.5
    while len(times) < 3 or (len(times) < 15 and time.perf_counter() < budget):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


# --- implementations ------------------------------------------------------------------------

RECOMPILE_LIMIT = 64


def no_silent_eager():
    """Make torch.compile fail loudly instead of falling back to eager.

    Past ``recompile_limit`` recompilations of one function (8 by default), Dynamo warns once
    and runs the function *eagerly* from then on. A suite visits dozens of shapes; on the
    H200 grid (2026-11-30) the compiled naive attention hit the limit at N = 4096 and its
    rows there matched the eager ones to four digits. Here every shape may compile (up to
    ``RECOMPILE_LIMIT``), and past that the call raises, so a row says "error", never a
    wrong "compiled" time.
    """
    import torch._dynamo.config as dcfg
    dcfg.recompile_limit = max(dcfg.recompile_limit, RECOMPILE_LIMIT)
    dcfg.fail_on_recompile_limit_hit = True

def implementations(impl_root="solutions", device="cpu"):
    """name -> callable(q, k, v, is_causal) -> o, for every step and SDPA backend available."""
    no_silent_eager()
    impls = {}

    def add(name, step, **kw):
        try:
            mod = load_step(step, impl_root)
        except Exception as e:            # a step not written yet, a missing GPU
            impls[name] = f"unavailable: {type(e).__name__}: {e}"
            return
        attn = getattr(mod, kw.pop("fn", "attention"))
        impls[name] = lambda q, k, v, c, _a=attn, _kw=kw: _a(q, k, v, is_causal=c, **_kw)

    add("naive", 1)
    add("compiled", 2)
    for b in ("flash", "cudnn", "efficient", "math"):
        add(f"sdpa-{b}", 3, backend=b)
    add("step04", 4)
    add("step04-compiled", 4, fn="attention_compiled")
    add("step05", 5)                      # TMA where step 05's tma_by_default says (D=128, 16-bit, sm_90), else pointers
    add("step05-tma", 5, tma=True)        # TMA everywhere; a ValueError row ("unsupported: ...") where TMA cannot run
    add("step05-ptr", 5, tma=False)       # pointer loads everywhere
    add("step06", 6)
    add("step07", 7)
    add("step07-v4", 7, version=4)     # sm_90a only: a ValueError row elsewhere
    add("step07-v5", 7, version=5)
    add("step07-v6", 7, version=6)
    return impls


CPU_DEFAULT = ["naive", "compiled", "sdpa-flash", "sdpa-math", "step04"]
# Forward-only kernels: step 05's backward is step 04's PyTorch one (step 06 is its Triton backward), so its
# "fwd+bwd" time measures PyTorch, not the step (86 ms at N=4096 in the 12-01 grid): such rows are not timed.
FORWARD_ONLY = {"step05": "step 06", "step05-tma": "step 06", "step05-ptr": "step 06"}


def measure(name, fn, *, B, H, N, D, causal, dtype, device, modes=("fwd", "fwd+bwd"), machine=None, suite=""):
    """Measure one implementation at one shape; OOM and refusals become rows, not crashes."""
    rows = []
    base = dict(impl=name, dtype=str(dtype).replace("torch.", ""), B=B, H=H, N=N, D=D, causal=causal,
                machine=machine or {}, suite=suite)
    try:
        q, k, v = make_qkv(B, H, N, N, D, dtype=dtype, device=device, requires_grad=True)
        do = torch.randn_like(q)
    except torch.OutOfMemoryError:
        return [Row(mode=m, status="oom", **base) for m in modes]
    for mode in modes:
        row = Row(mode=mode, **base)
        if mode != "fwd" and name in FORWARD_ONLY:
            row.status = (f"unsupported: forward only (its backward is step 04's PyTorch one; "
                          f"{FORWARD_ONLY[name]} times the kernel's backward)")
            rows.append(row)
            continue
        try:
            if device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            if mode == "fwd":
                def run():
                    with torch.no_grad():
                        fn(q, k, v, causal)
            else:
                def run():
                    q.grad = k.grad = v.grad = None
                    fn(q, k, v, causal).backward(do)
            row.ms = time_ms(run, device)
            row.tflops = flops(B, H, N, D, causal, mode) / (row.ms * 1e-3) / 1e12
            if device == "cuda":
                row.peak_mib = torch.cuda.max_memory_allocated() / 2**20
                if mode != "fwd":
                    q.grad = k.grad = v.grad = None
                    torch.cuda.synchronize()
                    o = fn(q, k, v, causal)
                    torch.cuda.synchronize()
                    row.mem_before_bwd_mib = torch.cuda.memory_allocated() / 2**20
                    del o
        except torch.OutOfMemoryError:
            row.status = "oom"
        except torch._dynamo.exc.FailOnRecompileLimitHit:
            row.status = f"error: torch.compile recompiled more than {RECOMPILE_LIMIT} times (not timed eagerly)"
        except (RuntimeError, ValueError, NotImplementedError) as e:
            msg = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
            row.status = ("oom" if "out of memory" in msg.lower() else
                          f"unsupported: {msg}" if isinstance(e, (ValueError, NotImplementedError))
                          or "No available kernel" in msg or "No viable backend" in msg
                          else f"error: {msg}")
        finally:
            if device == "cuda":
                torch.cuda.empty_cache()
        rows.append(row)
    return rows


def add_ratios(rows):
    """Fill ratio_to_sdpa_flash: SDPA-FLASH's time at the same shape and mode over this row's time."""
    ref = {(r.suite, r.mode, r.dtype, r.B, r.H, r.N, r.D, r.causal): r.ms
           for r in rows if r.impl == "sdpa-flash" and r.ms}
    for r in rows:
        t = ref.get((r.suite, r.mode, r.dtype, r.B, r.H, r.N, r.D, r.causal))
        if t and r.ms:
            r.ratio_to_sdpa_flash = t / r.ms
    return rows


def save(rows, path_json, path_csv=None):
    data = [dataclasses.asdict(r) for r in rows]
    path_json.parent.mkdir(parents=True, exist_ok=True)
    path_json.write_text(json.dumps(data, indent=1))
    if path_csv:
        import csv
        cols = [f.name for f in dataclasses.fields(Row) if f.name != "machine"] + ["gpu", "torch", "triton", "date"]
        with open(path_csv, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(cols)
            for d in data:
                m = d.pop("machine")
                w.writerow([d[c] for c in cols[:-4]] + [m.get("gpu"), m.get("torch"), m.get("triton"), m.get("date")])


def load_rows(path):
    return [Row(**d) for d in json.loads(path.read_text())]


def table(rows) -> str:
    head = f"{'impl':16} {'mode':7} {'dtype':8} {'B':>3} {'H':>3} {'N':>6} {'D':>4} {'causal':6} " \
           f"{'ms':>9} {'TFLOP/s':>8} {'peak MiB':>9} {'x FLASH':>8}  status"
    lines = [head, "-" * len(head)]
    for r in rows:
        f = lambda x, p: "" if x is None else f"{x:.{p}f}"
        lines.append(f"{r.impl:16} {r.mode:7} {r.dtype:8} {r.B:3d} {r.H:3d} {r.N:6d} {r.D:4d} {str(r.causal):6} "
                     f"{f(r.ms, 3):>9} {'' if r.tflops is None else f'{r.tflops:.3g}':>8} {f(r.peak_mib, 0):>9} {f(r.ratio_to_sdpa_flash, 2):>8}  "
                     f"{'' if r.status == 'ok' else r.status[:60]}")
    return "\n".join(lines)


def measure_ceilings(device):
    """bf16 matmul TFLOP/s and device copy GB/s measured now, for the roofline."""
    if device != "cuda":
        return None
    from triton.testing import do_bench
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    t = do_bench(lambda: a @ b, return_mode="median")
    mm = 2 * n**3 / (t * 1e-3) / 1e12
    x = torch.empty(2**30, device="cuda", dtype=torch.uint8).random_()
    y = torch.empty_like(x)
    t = do_bench(lambda: y.copy_(x), return_mode="median")
    bw = 2 * x.numel() / (t * 1e-3) / 1e9
    del a, b, x, y
    return {"bf16_matmul_tflops": mm, "copy_gbps": bw}
