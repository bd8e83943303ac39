"""Experiment: does running step 06's dQ kernel beside its dK/dV kernel (two CUDA streams) shorten the backward?

Question. Step 06's backward is three launches in one stream: the preprocess (Delta), dK/dV, dQ. The dQ kernel
needs nothing from dK/dV, only Delta, so the two could run side by side: the dQ kernel's programs would fill
the SMs that dK/dV's last, light programs leave idle, and there would be no kernel boundary between them. At
CS336's leaderboard shape (B=1, H=16, N=16384, D=64, bf16, causal) step 06 reads 5.06-5.18 ms in CS336's
harness against a target of 5.0 (issue 12); both kernels start every head's heaviest tiles first, so the tail
is expected to be small (under 1-2%). How much is it, in the backward alone and in CS336's harness?

Method. ``backward_two_streams`` is step 06's ``backward`` for ``dq_mode="separate"`` (its kernels, table and
launch arguments, imported from solutions/) with the dQ kernel launched on a side stream that waits for the
preprocess, and the main stream waiting for it before returning; ``--order dq-first`` launches the dQ kernel
before dK/dV instead. Each form is checked against step 06's own backward (bitwise: the same kernels on the
same inputs) and against float64, then timed at the leaderboard shape (``do_bench`` median, rep 300 ms)
alternately with step 06's backward, and in CS336's harness (``torch.compile(FlashAttentionTriton.apply)``,
``o.sum().backward()``, the mean of ``do_bench(rep, warmup)``) with step 06's ``backward`` replaced by it (the
backward operator is opaque: it calls the module's ``backward`` at run time), SDPA's cuDNN backend in the same
process.

    python bench/experiments/lb_streams.py --out DIR          # an H200: about 2 minutes
    python bench/experiments/lb_streams.py --smoke --out DIR  # a CPU (interpreter): the launch sequence only

Answer: no, about 1% of the backward and nothing in the harness. H200, 2026-12-02 01:50 UTC (the working tree of
2180ec1; results/h200/triton/lb_streams_1202.json, .log): 8/8 cases bitwise step 06's backward. The backward alone,
three alternated rounds: step 06 3.746 / 3.817 / 3.797 ms, dK/dV first with dQ beside it 3.713 / 3.736 / 3.787
(0.3-2.1% faster), dQ first 3.902-3.943 (slower). In CS336's harness: step 06 5.076 and 5.078 ms, two streams 5.065
(dK/dV first) and 5.062 (dQ first); cuDNN 4.481. Part 4 (torch.profiler over 20 harness steps): kernels 4.806 ms a
step -- dK/dV 2.194, dQ 1.234, forward 1.204, the harness's gradient accumulation 0.070 and stack of the three
gradients 0.047 (``q, k, v = torch.randn(3, ...)`` unbinds one leaf), the dO copy 0.022, the preprocess 0.020,
``o.sum()`` 0.013 -- against the harness's 5.08: ``lb_gaps.py`` asks where the rest goes (the clocks).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

from bench.experiments import gpu_run  # noqa: E402

REC = gpu_run.Record("lb_streams")
log = REC.log
_SIDE = {}


def backward_two_streams(q, k, v, o, lse, do, is_causal, scale, config=None, dq_mode=None, order="dkdv-first"):
    """Step 06's ``backward`` (dq_mode "separate") with the dQ kernel on a second stream (serial on a CPU)."""
    import torch
    import triton

    from attnlib.loader import load_step
    from attnlib.ops import configured, tiles
    s5, s6 = load_step(5, "solutions"), load_step(6, "solutions")
    LOG2E, _dot_precision, _pow2_dim, as_bhnd = s5.LOG2E, s5._dot_precision, s5._pow2_dim, s5.as_bhnd
    if do.stride(-1) != 1:
        do = do.contiguous()
    q4, k4, v4, o4, do4 = (as_bhnd(t) for t in (q, k, v, o, do))
    B, H, nq, d = q4.shape
    nk = k4.shape[2]
    bd = _pow2_dim(d)
    cfg = config or s6.bwd_config(nq, nk, d, q.dtype, is_causal, q.device.type, B * H)
    if (dq_mode or cfg["dq_mode"]) != "separate":
        raise ValueError("backward_two_streams runs the second-pass dQ only")
    prec = _dot_precision(q.dtype)
    lse = lse.reshape(B * H, nq).contiguous()
    delta = q.new_empty((B * H, nq), dtype=torch.float32)
    dk, dv, dq = k.new_empty(k.shape), v.new_empty(v.shape), q.new_empty(q.shape)
    dq4, dk4, dv4 = as_bhnd(dq), as_bhnd(dk), as_bhnd(dv)
    bm = cfg["pre"]["BLOCK_M"]
    configured(s6._bwd_preprocess, {})[(triton.cdiv(nq, bm), B * H)](
        o4, do4, delta, *o4.stride(), *do4.stride(), H, nq, HEAD_DIM=d, BLOCK_M=bm, BLOCK_D=bd)
    ckv = {"EARLY_DP": True, "HEADS_FIRST": False, **cfg["dkdv"]}
    cq = {"EARLY_DP": False, "HEADS_FIRST": False, **cfg["dq"]}

    def dkdv():
        configured(s6._bwd_dkdv_kernel, ckv)[s6._grid(triton.cdiv(nk, ckv["BLOCK_N"]), B * H, ckv["HEADS_FIRST"])](
            q4, k4, v4, do4, lse, delta, dk4, dv4, dq4,
            *q4.stride(), *k4.stride(), *v4.stride(), *do4.stride(), *dk4.stride(), *dq4.stride(),
            H, nq, nk, scale, scale * LOG2E,
            HEAD_DIM=d, BLOCK_D=bd, IS_CAUSAL=is_causal, ATOMIC_DQ=False, DOT_PRECISION=prec, **tiles(ckv))

    def dq_pass():
        configured(s6._bwd_dq_kernel, cq)[s6._grid(triton.cdiv(nq, cq["BLOCK_M"]), B * H, cq["HEADS_FIRST"])](
            q4, k4, v4, do4, lse, delta, dq4,
            *q4.stride(), *k4.stride(), *v4.stride(), *do4.stride(), *dq4.stride(),
            H, nq, nk, scale, scale * LOG2E,
            HEAD_DIM=d, BLOCK_D=bd, IS_CAUSAL=is_causal, DOT_PRECISION=prec, **tiles(cq))

    if not q.is_cuda:                       # the interpreter: one stream, the same launches
        dkdv()
        dq_pass()
        return dq, dk, dv
    main = torch.cuda.current_stream()
    side = _SIDE.setdefault(q.device, torch.cuda.Stream(q.device))
    side.wait_stream(main)                  # after the preprocess (and whatever made the inputs)
    if order == "dq-first":
        with torch.cuda.stream(side):
            dq_pass()
        dkdv()
    else:
        dkdv()
        with torch.cuda.stream(side):
            dq_pass()
    main.wait_stream(side)                  # everything after this call, frees included, comes after dQ
    return dq, dk, dv


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--smoke", action="store_true", help="a CPU under TRITON_INTERPRET=1: the launch sequence only")
    ap.add_argument("--harness-rep-ms", type=int, default=3000)
    args = ap.parse_args()
    REC.open(args.out, ROOT)

    import torch
    import triton
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attnlib.loader import load_step
    from attnlib.reference import reference_backward

    s5, s6 = load_step(5, "solutions"), load_step(6, "solutions")
    dev = "cpu" if args.smoke else "cuda"
    R = REC.result
    R["gpu"] = torch.cuda.get_device_name() if dev == "cuda" else "cpu (smoke)"
    orders = ("dkdv-first", "dq-first")

    @REC.part("1 correctness")
    def correctness():
        def cases():
            shapes = [(1, 2, 77, 32, True, torch.float32), (1, 2, 100, 16, False, torch.float16)] if args.smoke else \
                [(2, 3, 1000, 64, True, torch.bfloat16), (2, 3, 1000, 64, False, torch.bfloat16),
                 (1, 4, 4096, 64, True, torch.bfloat16), (1, 2, 777, 128, True, torch.float16)]
            for B, H, N, D, causal, dt in shapes:
                for order in orders:
                    def check(B=B, H=H, N=N, D=D, causal=causal, dt=dt, order=order):
                        g = torch.Generator(device=dev).manual_seed(N + D)
                        q, k, v, do = (torch.randn(B, H, N, D, device=dev, dtype=dt, generator=g) for _ in range(4))
                        sc = D ** -0.5
                        o, lse = s5.forward(q, k, v, causal, sc)
                        ref = s6.backward(q, k, v, o, lse, do, causal, sc, dq_mode="separate")
                        got = backward_two_streams(q, k, v, o, lse, do, causal, sc, order=order)
                        for name, a, b in zip(("dQ", "dK", "dV"), got, ref):
                            if not torch.equal(a, b):
                                raise AssertionError(f"{name} differs from step 06's own backward: max "
                                                     f"{(a.float() - b.float()).abs().max():.3e}")
                        r64 = reference_backward(q, k, v, do, causal)
                        err = max(float((a.double() - b.double()).abs().max()) for a, b in zip(got, r64))
                        log(f"  B{B} H{H} N{N} D{D} {'causal' if causal else 'full'} {dt} {order}: bitwise step 06's; "
                            f"max error against float64 {err:.2e}")
                    yield f"B{B} H{H} N{N} D{D} causal={causal} {dt} {order}", check
        return gpu_run.check_cases(cases(), log)
    correctness()
    if args.smoke:
        REC.save()
        return

    B, H, N, D = 1, 16, 16384, 64
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    sc = D ** -0.5
    o, lse = s5.forward(q, k, v, True, sc)

    @REC.part("2 leaderboard shape, backward")
    def backward_alone():
        rows = {}
        for rnd in range(3):                 # alternated: drift shows up as a difference between rounds
            for name, fn in [("step06 backward", lambda: s6.backward(q, k, v, o, lse, do, True, sc)),
                             *[(f"two streams, {od}", lambda od=od: backward_two_streams(q, k, v, o, lse, do, True, sc,
                                                                                          order=od)) for od in orders]]:
                ms = float(triton.testing.do_bench(fn, warmup=50, rep=300))
                rows.setdefault(name, []).append(round(ms, 4))
                log(f"  round {rnd} {name:<28} {ms:.3f} ms")
        return {"rows": rows}
    backward_alone()

    @REC.part("3 CS336 harness")
    def harness():
        orig = s6.backward
        hq, hk, hv = torch.randn(3, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        every = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                 SDPBackend.MATH]
        out = {}

        def run(name, fn, backends, bwd=None):
            torch._dynamo.reset()
            s6.backward = bwd or orig
            f = torch.compile(fn) if fn is s6.FlashAttentionTriton.apply else fn

            def step():
                f(hq, hk, hv, True).sum().backward()
            try:
                with sdpa_kernel(backends):
                    out[name] = round(float(triton.testing.do_bench(step, rep=args.harness_rep_ms, warmup=500)), 4)
            except Exception as e:  # noqa: BLE001
                out[name] = f"error: {type(e).__name__}: {str(e)[:200]}"
            finally:
                s6.backward = orig
            hq.grad = hk.grad = hv.grad = None
            log(f"  {name:<36} {out[name]}")

        def sdpa(q, k, v, is_causal):
            return F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=is_causal)[0]
        apply = s6.FlashAttentionTriton.apply
        run("sdpa_cudnn", sdpa, [SDPBackend.CUDNN_ATTENTION])
        run("step06", apply, every)
        for od in orders:
            run(f"step06, two streams, {od}", apply, every,
                bwd=lambda *a, od=od, **kw: backward_two_streams(*a, order=od, **kw))
        run("step06 again", apply, every)
        return out
    harness()

    @REC.part("4 CS336 harness, where the time goes")
    def breakdown():
        # Every CUDA kernel of 20 harness steps under torch.profiler (grads already there, as in do_bench's
        # loop: each step's AccumulateGrad adds into them), summed by name: which part is step 06's kernels
        # and which is the harness's own work (o.sum(), its expanded dO, the gradient accumulation).
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile
        torch._dynamo.reset()
        f = torch.compile(s6.FlashAttentionTriton.apply)
        hq, hk, hv = torch.randn(3, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)

        def step():
            f(hq, hk, hv, True).sum().backward()
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        n = 20
        t0 = time.perf_counter()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                step()
            torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1e3 / n
        rows = []
        for e in prof.key_averages():
            if e.device_type != DeviceType.CUDA:
                continue
            us = getattr(e, "self_device_time_total", None)
            us = us if us is not None else e.self_cuda_time_total
            if us > 0:
                rows.append((e.key[:90], e.count / n, us / n / 1e3))
        rows.sort(key=lambda r: -r[2])
        total = sum(r[2] for r in rows)
        for name, calls, ms in rows[:15]:
            log(f"  {ms:7.3f} ms  {calls:4.1f}/step  {name}")
        log(f"  kernels {total:.3f} ms a step; wall {wall:.3f} ms a step under the profiler")
        return {"kernels_ms": round(total, 4), "wall_ms_profiled": round(wall, 4),
                "rows": [{"kernel": r[0], "calls_per_step": r[1], "ms_per_step": round(r[2], 4)} for r in rows[:30]]}
    breakdown()
    REC.save()
    log(f"wrote {REC.json_path}")


if __name__ == "__main__":
    main()
