"""Experiment: how much of a call to step 06 / step 09 is the host's (Python, the operator, Triton's launcher)?

Question. On the H200, step 09's forward took the same 0.16 ms at N = 8k and 16k (window 256), and its
forward + backward about 1.3 ms more than its tiles explain (results/h200/sparse/README.md); the capstone
GPT with step 06 is host-bound at context 1k-4k (results/h200/capstone/README.md). Is that time the
host's, and where does it go?

Method. For each implementation and shape: (1) the GPU's time, do_bench's median (events around each
call, as the benches time it; where the host is slower than the GPU this is the host's time too);
(2) the host's time per call, with no synchronisation inside the loop (``perf_counter`` over
``--calls`` calls, then one synchronize: the launch path alone when the GPU keeps up); (3) the GPU
kernels of one call from torch.profiler (the sum of their device times); (4) cProfile of the host path
over ``--calls`` calls at the smallest shape, the top functions by own time, into ``cprofile_*.txt``.

    python bench/experiments/host_overhead.py --out DIR          # a GPU, about 1 minute

Answer: see results/h200/host/README.md (filled from this file's JSON after a run).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _impls():
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from solutions import step06_triton_bwd as s6
    from solutions import step09_sparse as s9

    def sdpa(backend):
        def f(q, k, v, causal):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return f

    impls = {
        "sdpa-flash": sdpa(SDPBackend.FLASH_ATTENTION),
        "step06": lambda q, k, v, causal: s6.attention(q, k, v, causal),
        "step06.apply": lambda q, k, v, causal: s6.FlashAttentionTriton.apply(q, k, v, causal),
        "step09-w256": lambda q, k, v, causal: s9.attention_sparse(q, k, v, 256, 0, causal),
        "step09-w256-g64": lambda q, k, v, causal: s9.attention_sparse(q, k, v, 256, 64, causal),
    }
    return impls


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--layers", action="store_true", help="only the layers of one step 06 call, small shape")
    ap.add_argument("--engine", action="store_true", help="only the autograd engine variants, small shape")
    ap.add_argument("--yappi", action="store_true", help="with --engine: profile step 06's call on every thread "
                    "(yappi, wall clock) into yappi_step06.txt; pip install yappi (a wheel in .whl/ for the device)")
    args = ap.parse_args()
    if args.layers:
        return layers(Path(args.out), args.calls)
    if args.engine:
        return engine(Path(args.out), args.calls, args.yappi)
    import torch
    import triton
    from torch.profiler import ProfilerActivity, profile

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    impls = _impls()
    shapes = [(1, 8, 256, 64), (4, 8, 4096, 64), (1, 16, 8192, 64), (1, 16, 16384, 64)]
    rows = []
    for shape in shapes:
        B, H, N, D = shape
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        do = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        for name, f in impls.items():
            if name.startswith("step09") and N < 1024:
                continue
            for mode in ("fwd", "fwd+bwd"):
                def call(f=f, mode=mode):
                    if mode == "fwd":
                        with torch.no_grad():
                            f(q, k, v, True)
                    else:
                        o = f(q, k, v, True)
                        o.backward(do)
                row = {"impl": name, "shape": list(shape), "mode": mode}
                try:
                    for _ in range(3):
                        call()
                    torch.cuda.synchronize()
                    row["do_bench_ms"] = float(triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median",
                                                                       grad_to_none=[q, k, v]))
                    n = args.calls if N <= 4096 else 20
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(n):
                        call()
                    t1 = time.perf_counter()
                    torch.cuda.synchronize()
                    t2 = time.perf_counter()
                    row["host_ms_per_call"] = (t1 - t0) / n * 1e3
                    row["wall_ms_per_call"] = (t2 - t0) / n * 1e3
                    with profile(activities=[ProfilerActivity.CUDA]) as prof:
                        call()
                        torch.cuda.synchronize()
                    kern = [(e.key, e.device_time_total / e.count / 1e3, e.count)
                            for e in prof.key_averages() if e.device_time_total > 0]
                    row["kernels"] = [{"name": k_[:90], "ms": round(ms, 4), "count": c} for k_, ms, c in kern]
                    row["kernel_ms_sum"] = round(sum(ms * c for _, ms, c in kern), 4)
                    if shape == shapes[0] or (name.startswith("step09") and shape == shapes[2]):
                        pr = cProfile.Profile()
                        pr.enable()
                        for _ in range(50):
                            call()
                        pr.disable()
                        torch.cuda.synchronize()
                        s = io.StringIO()
                        st = pstats.Stats(pr, stream=s)
                        st.sort_stats("tottime").print_stats(30)
                        st.sort_stats("cumulative").print_stats(40)
                        (out / f"cprofile_{name}_{mode.replace('+', '-')}_{N}.txt").write_text(s.getvalue())
                    q.grad = k.grad = v.grad = None
                except Exception as e:          # record and go on
                    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                print(json.dumps({k_: v_ for k_, v_ in row.items() if k_ != "kernels"}), flush=True)
                rows.append(row)
                (out / "host_overhead.json").write_text(json.dumps(
                    {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                     "rows": rows}, indent=1))


def host_ms(f, calls, warmup=10):
    """Host milliseconds per call of ``f``: ``warmup`` calls, then ``calls`` with no synchronisation inside
    the loop (the launch path alone while the GPU keeps up)."""
    import torch
    for _ in range(warmup):
        f()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        f()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return round((t1 - t0) / calls * 1e3, 4)


def layers(out, calls):
    """Host time per call of each layer of step 06's call, and cProfile of each (main thread)."""
    import torch
    from solutions import step06_triton_bwd as s6

    out.mkdir(parents=True, exist_ok=True)
    q, k, v = (torch.randn(1, 8, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    do = torch.randn_like(q)
    scale = 0.125
    o, lse = s6.attention_with_lse(qd, kd, vd, True)

    def full(threads=True):
        def f():
            with torch.autograd.set_multithreading_enabled(threads):
                torch.autograd.grad(s6.attention(q, k, v, True), (q, k, v), do)
        return f
    steps = {
        "fwd: step05 forward() direct": lambda: s6.triton_forward(qd, kd, vd, True, scale),
        "fwd: fwd_op": lambda: s6.fwd_op(qd, kd, vd, True, scale),
        "fwd: attention (grad)": lambda: s6.attention(q, k, v, True),
        "bwd: backward() direct": lambda: s6.backward(qd, kd, vd, o, lse, do, True, scale),
        "bwd: bwd_op": lambda: s6.bwd_op(qd, kd, vd, o, lse, do, True, scale, None),
        "fwd+bwd: autograd.grad": full(True),
        "fwd+bwd: autograd.grad, no autograd thread": full(False),
    }
    rows = {}
    for i, (name, f) in enumerate(steps.items()):
        rows[name] = host_ms(f, calls, warmup=5)
        print(f"{name:45s} host {rows[name]:.4f} ms/call", flush=True)
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(50):
            f()
        pr.disable()
        s = io.StringIO()
        st = pstats.Stats(pr, stream=s)
        st.sort_stats("tottime").print_stats(25)
        st.sort_stats("cumulative").print_stats(40)
        (out / f"layer{i}.txt").write_text(name + "\n" + s.getvalue())
    (out / "layers.json").write_text(json.dumps({"host_ms_per_call": rows, "gpu": torch.cuda.get_device_name(),
                                                 "torch": torch.__version__}, indent=1))


def profile_all_threads(f, calls, path):
    """yappi's wall-clock profile of ``calls`` calls of ``f`` on every thread (the autograd engine's device
    thread included, which cProfile in the calling thread cannot see), functions by total time, per thread."""
    import yappi
    yappi.set_clock_type("wall")
    yappi.clear_stats()
    yappi.start(builtins=True, profile_threads=True)
    for _ in range(calls):
        f()
    yappi.stop()
    text = io.StringIO()
    threads = yappi.get_thread_stats()
    threads.print_all(out=text)
    for t in threads:
        text.write(f"\n=== thread {t.id} ({t.name}), {t.ttot:.4f} s\n")
        yappi.get_func_stats(ctx_id=t.id).sort("ttot").print_all(
            out=text, columns={0: ("name", 90), 1: ("ncall", 8), 2: ("tsub", 8), 3: ("ttot", 8), 4: ("tavg", 8)})
    Path(path).write_text(text.getvalue())


def engine(out, calls, use_yappi=False):
    """Where the autograd engine's share of a step 06 call goes: Python Functions that keep one part each."""
    import torch
    import torch.nn.functional as F
    from solutions import step06_triton_bwd as s6

    out.mkdir(parents=True, exist_ok=True)
    shape = (1, 8, 256, 64)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    do = torch.randn_like(q)
    o0, lse0 = s6.triton_forward(qd, kd, vd, True, 0.125)

    class NoKernels(torch.autograd.Function):          # the Function machinery alone
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            return q.new_empty(q.shape)

        @staticmethod
        def backward(ctx, g):
            q, k, v = ctx.saved_tensors
            return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)

    class TritonFwdOnly(torch.autograd.Function):       # step 05's launcher in the forward, nothing in the backward
        @staticmethod
        def forward(ctx, q, k, v):
            o, lse = s6.triton_forward(q, k, v, True, 0.125)
            ctx.save_for_backward(q, k, v, o, lse)
            return o

        @staticmethod
        def backward(ctx, g):
            q, k, v, o, lse = ctx.saved_tensors
            return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)

    class TritonBwdOnly(torch.autograd.Function):       # step 06's launchers in the backward, saved O and LSE
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            return q.new_empty(q.shape)

        @staticmethod
        def backward(ctx, g):
            q, k, v = ctx.saved_tensors
            return s6.backward(q, k, v, o0, lse0, g, True, 0.125)

    class Both(torch.autograd.Function):                # both launchers, no operator, no checks
        @staticmethod
        def forward(ctx, q, k, v):
            o, lse = s6.triton_forward(q, k, v, True, 0.125)
            ctx.save_for_backward(q, k, v, o, lse)
            return o

        @staticmethod
        def backward(ctx, g):
            q, k, v, o, lse = ctx.saved_tensors
            return s6.backward(q, k, v, o, lse, g, True, 0.125)

    def grad_of(fn):
        return lambda: torch.autograd.grad(fn(), (q, k, v), do)

    variants = {
        "sdpa-flash autograd.grad": grad_of(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
        "NoKernels autograd.grad": grad_of(lambda: NoKernels.apply(q, k, v)),
        "TritonFwdOnly autograd.grad": grad_of(lambda: TritonFwdOnly.apply(q, k, v)),
        "TritonBwdOnly autograd.grad": grad_of(lambda: TritonBwdOnly.apply(q, k, v)),
        "Both autograd.grad": grad_of(lambda: Both.apply(q, k, v)),
        "step06 attention autograd.grad": grad_of(lambda: s6.attention(q, k, v, True)),
        "direct: forward() + backward()": lambda: s6.backward(qd, kd, vd, *s6.triton_forward(qd, kd, vd, True, 0.125),
                                                             do, True, 0.125),
        "direct: backward() only": lambda: s6.backward(qd, kd, vd, o0, lse0, do, True, 0.125),
        "direct: backward() only, no_grad": lambda: _no_grad(lambda: s6.backward(qd, kd, vd, o0, lse0, do, True, 0.125)),
        "direct: forward() only": lambda: s6.triton_forward(qd, kd, vd, True, 0.125),
    }
    variants["direct: backward() only, q k v requiring grad"] = lambda: s6.backward(q, k, v, o0, lse0, do, True, 0.125)
    import gc
    rows = {}
    for gc_mode in ("gc on", "gc off", "gc frozen"):
        gc.enable()
        gc.unfreeze() if hasattr(gc, "unfreeze") else None
        gc.collect()
        if gc_mode == "gc off":
            gc.disable()
        elif gc_mode == "gc frozen":
            gc.freeze()
        for name in ("sdpa-flash autograd.grad", "Both autograd.grad", "step06 attention autograd.grad",
                     "direct: forward() + backward()"):
            rows[f"{name}, {gc_mode}"] = host_ms(variants[name], calls)
        gc.enable()
    counts = {}
    for name in ("sdpa-flash autograd.grad", "step06 attention autograd.grad"):
        gc.collect()
        before = gc.get_stats()
        for _ in range(calls):
            variants[name]()
        after = gc.get_stats()
        counts[name] = [a["collections"] - b["collections"] for a, b in zip(after, before)]
    print("gc collections per generation over", calls, "calls:", counts, flush=True)
    for _ in range(2):                                   # twice: the second pass is the one kept
        for name, f in variants.items():
            rows[name] = host_ms(f, calls)
    for name, ms in rows.items():
        print(f"{name:40s} host {ms:.4f} ms/call", flush=True)
    if use_yappi:
        profile_all_threads(variants["step06 attention autograd.grad"], calls, out / "yappi_step06.txt")
        profile_all_threads(variants["direct: forward() + backward()"], calls, out / "yappi_direct.txt")

        def one_thread():          # the backward on this thread: seen whether or not yappi hooks the engine's
            with torch.autograd.set_multithreading_enabled(False):
                variants["step06 attention autograd.grad"]()
        profile_all_threads(one_thread, calls, out / "yappi_step06_one_thread.txt")
    (out / "engine.json").write_text(json.dumps({"host_ms_per_call": rows, "shape": shape, "gc_collections": counts,
                                                 "gpu": torch.cuda.get_device_name(), "torch": torch.__version__},
                                                indent=1))


def _no_grad(f):
    import torch
    with torch.no_grad():
        return f()


if __name__ == "__main__":
    main()
