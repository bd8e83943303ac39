"""Step 10 on several GPUs: ring attention (NCCL) against one GPU's step 06 at the same shard length.

    torchrun --nproc-per-node 2 bench/ring_gpu.py                    # H200 x 2: N = 32k..256k, bf16, causal
    torchrun --nproc-per-node 2 bench/ring_gpu.py --lengths 32768 --reps 3
    torchrun --nproc-per-node 2 bench/ring_gpu.py --cpu-smoke        # gloo, fp32, tiny: checks the script runs

What it does, in order (llm.c's rule: check, then time):
  1. check: every rank runs ``ring_attention`` forward and backward on its zigzag shard of a small
     sequence (N=2048, H=2, D=64, bf16) and compares its O, LSE, dQ, dK, dV with its rows of the
     float64 reference (``attnlib.ringcheck.check_rank``); any mismatch stops the run.
  2. for each total length N, B=1, H=16, D=64, bf16, causal, forward + backward:
     * ring: ``ring_attention`` on each rank's N/W-row zigzag shard (step 06's kernels per block);
     * one GPU, shard length: step 06 on one sequence of N/W rows, on every GPU, in the same run;
     * one GPU, whole sequence: step 06 on all N rows (rank 0; ``--single-max`` bounds N): the time
       and peak memory the ring is splitting;
     Times: a fixed number of repeats (every rank must make the same NCCL calls, so no adaptive
     do_bench), each started after a barrier, CUDA events around one forward + backward, the median
     per rank, then the slowest rank (a ring step waits for the slowest). Peak memory per GPU from
     ``torch.cuda.max_memory_allocated``.
  3. a profiler trace of a few ring iterations at ``--trace-n`` (default: the shortest N, where the
     hops are hardest to hide), one Chrome trace per rank, and from it: time in NCCL kernels, the
     part of it no compute kernel overlaps ("exposed"), and the compute stream's idle fraction.

Throughput counts FLOPs as the rest of the course (bench/core.py: causal forward 2*B*H*N^2*D,
backward 2.5x): the ring's per-GPU TFLOP/s is the whole sequence's FLOPs / W / time. The ratio that
issue 16 asks for (>= 0.85) is ring TFLOP/s per GPU over step 06's TFLOP/s at the shard length.
Note that the ring's blocks after the first are unmasked half blocks (N/W x N/2W), which run faster
per FLOP than a causal block, so the ratio can exceed 1 without any trick.

"The sequence length that fits doubles": attention's memory is linear in N (steps 04-07 never
build N x N), so halving the per-GPU memory at the same N is the same statement; the JSON carries
both peaks. (Finding the largest N that fits directly would mean running attention at millions of
tokens, minutes per call at these FLOPs.)

Writes ``--out``/ring.json (rows + machine), ring.png, trace_rank{r}_N{n}.json. Run on two H200s on
2026-11-30: results/h200/ring/ (its README: the figures, and the bug the check stage caught first).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))                     # torchrun runs this file by path

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def log(msg):
    if dist.get_rank() == 0:
        print(f"[ring {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def barrier(device):
    if device.type == "cuda":
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()


def timed_ms(fn, device, reps, warmup, collective=True):
    """Median ms of ``fn()`` on this rank over ``reps`` repeats; with ``collective``, the slowest rank's."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(reps):
        if collective:
            barrier(device)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
    med = statistics.median(times)
    if not collective:
        return med
    t = torch.tensor([med], dtype=torch.float64, device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def peak_mib(fn, device):
    """Peak memory (MiB) allocated during one ``fn()``, inputs included; None on a CPU."""
    if device.type != "cuda":
        return None
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    sync(device)
    return torch.cuda.max_memory_allocated(device) / 2**20


def fwd_bwd(attn, q, k, v, dout):
    """One forward + backward of ``attn`` on leaf tensors (their grads reset first)."""
    def run():
        for t in (q, k, v):
            t.grad = None
        attn(q, k, v).backward(dout)
    return run


# --- the profiler trace and what it says about overlap ----------------------------------------

def _union(intervals):
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _length(intervals):
    return sum(b - a for a, b in intervals)


def _intersection(xs, ys):
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append([a, b])
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def overlap_from_trace(path):
    """From a Chrome trace: NCCL kernel time, its part under no compute kernel, compute idle fraction."""
    events = json.loads(Path(path).read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel" and "dur" in e]
    if not kernels:
        return {"kernels": 0, "note": "no GPU kernels in the trace (CPU run)"}
    comm = [[e["ts"], e["ts"] + e["dur"]] for e in kernels if "nccl" in e["name"].lower()]
    comp = [[e["ts"], e["ts"] + e["dur"]] for e in kernels if "nccl" not in e["name"].lower()]
    comm_u, comp_u = _union(comm), _union(comp)
    span = max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)
    hidden = _length(_intersection(comm_u, comp_u))
    return {
        "kernels": len(kernels),
        "span_ms": span / 1e3,
        "compute_busy_ms": _length(comp_u) / 1e3,
        "compute_idle_fraction": 1 - _length(comp_u) / span if span else None,
        "nccl_kernel_ms": _length(comm_u) / 1e3,
        "nccl_exposed_ms": (_length(comm_u) - hidden) / 1e3,
        "note": "NCCL kernels span the wait for the peer too; 'exposed' is NCCL time with no compute "
                "kernel running on this GPU, an upper bound on the communication the ring did not hide",
    }


# --- main --------------------------------------------------------------------------------------

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="32768,65536,131072,262144", help="total sequence lengths N")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--full", action="store_true", help="full attention instead of causal")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--single-max", type=int, default=262144, help="largest N for one GPU on the whole sequence")
    ap.add_argument("--trace-n", type=int, default=None, help="N of the profiler trace (default: the shortest)")
    ap.add_argument("--impl", default="solutions")
    ap.add_argument("--out", default=str(REPO / "results" / "h200" / "ring"))
    ap.add_argument("--cpu-smoke", action="store_true", help="gloo on the CPU, fp32, tiny sizes: the script runs")
    args = ap.parse_args(argv)

    cpu = args.cpu_smoke or not torch.cuda.is_available()
    if cpu and not args.cpu_smoke:
        raise SystemExit("no CUDA GPU: use --cpu-smoke (gloo, tiny sizes) to check the script")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cpu:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
        torch.set_num_threads(1)
    else:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
        torch.backends.cuda.matmul.allow_tf32 = False
    rank, world = dist.get_rank(), dist.get_world_size()
    os.environ["ATTN_IMPL"] = args.impl

    from attnlib.loader import load_step
    from attnlib.ringcheck import RingCase, check_rank, load_ring, positions, ring_job
    from bench.core import flops, machine_info
    step10 = load_ring(args.impl)
    kernel = "strips" if cpu else "triton"
    dtype = torch.float32 if cpu else torch.bfloat16
    causal = not args.full
    if cpu:
        lengths = [64 * world, 128 * world]
        B, H, D = 1, 2, 16
        args.reps, args.warmup, args.single_max = 2, 1, 1 << 30
    else:
        lengths = [int(x) for x in args.lengths.split(",")]
        B, H, D = args.batch, args.heads, args.dim
    if any(n % (2 * world) for n in lengths):
        raise SystemExit(f"every N must be a multiple of 2 x world = {2 * world}")
    # One device, no ring: step 06 on a GPU; on a CPU, step 04's strips (the ring's CPU kernel).
    solo = load_step(4 if cpu else 6, args.impl)
    single = lambda q, k, v: solo.attention(q, k, v, is_causal=causal)  # noqa: E731
    ring = lambda q, k, v: step10.ring_attention(q, k, v, is_causal=causal, kernel=kernel)  # noqa: E731

    # 1. check before timing
    check = RingCase(batch=(1, 2), n=2048 if not cpu else 32 * world, d=64 if not cpu else 16, is_causal=causal,
                     kernel=kernel, dtype=str(dtype).replace("torch.", ""), device=device.type, seed=1)
    check_rank(ring_job(rank, world, check), rank, world, check)
    log(f"check passed on every rank ({check.id}, {check.dtype}): starting the measurements")

    out = Path(args.out)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    rows = []
    g = torch.Generator(device="cpu").manual_seed(0)
    for n in lengths:
        shard = n // world
        idx = positions(n, world, rank, causal)
        # The whole sequence on the CPU; each GPU gets only what it would hold in training.
        q, k, v, dout = (torch.randn(B, H, n, D, generator=g) for _ in range(4))
        leaves = [t[..., idx, :].to(device, dtype).requires_grad_(True) for t in (q, k, v)]
        ring_fn = fwd_bwd(ring, *leaves, dout[..., idx, :].to(device, dtype))
        ring_ms = timed_ms(ring_fn, device, args.reps, args.warmup)
        ring_peak = peak_mib(ring_fn, device)
        del leaves, ring_fn
        first = [t[..., :shard, :].to(device, dtype).requires_grad_(True) for t in (q, k, v)]
        shard_fn = fwd_bwd(single, *first, dout[..., :shard, :].to(device, dtype))
        shard_ms = timed_ms(shard_fn, device, args.reps, args.warmup)
        del first, shard_fn
        whole_ms = whole_peak = None
        if n <= args.single_max:
            barrier(device)
            if rank == 0:
                whole = [t.to(device, dtype).requires_grad_(True) for t in (q, k, v)]
                whole_fn = fwd_bwd(single, *whole, dout.to(device, dtype))
                whole_ms = timed_ms(whole_fn, device, args.reps, args.warmup, collective=False)
                whole_peak = peak_mib(whole_fn, device)
                del whole, whole_fn
            barrier(device)
        f_whole = flops(B, H, n, D, causal, "fwd+bwd")
        f_shard = flops(B, H, shard, D, causal, "fwd+bwd")
        row = {
            "N": n, "world": world, "shard": shard, "B": B, "H": H, "D": D, "dtype": str(dtype).replace("torch.", ""),
            "causal": causal, "mode": "fwd+bwd", "kernel": kernel,
            "ring_ms": ring_ms, "ring_tflops_per_gpu": f_whole / world / ring_ms / 1e9,
            "step06_shard_ms": shard_ms, "step06_shard_tflops": f_shard / shard_ms / 1e9,
            "step06_whole_ms": whole_ms,
            "step06_whole_tflops": f_whole / whole_ms / 1e9 if whole_ms else None,
            "ring_peak_mib_rank0": ring_peak, "step06_whole_peak_mib": whole_peak,
        }
        row["ratio_to_step06_shard"] = row["ring_tflops_per_gpu"] / row["step06_shard_tflops"]
        row["speedup_over_one_gpu"] = whole_ms / ring_ms if whole_ms else None
        rows.append(row)
        log(f"N={n:>7} shard {shard}: ring {ring_ms:8.2f} ms ({row['ring_tflops_per_gpu']:6.1f} TFLOP/s per GPU), "
            f"{'step 06' if kernel == 'triton' else 'step 04'} alone at the shard {shard_ms:8.2f} ms ({row['step06_shard_tflops']:6.1f}): ratio "
            f"{row['ratio_to_step06_shard']:.3f}"
            + (f"; one device, whole N: {whole_ms:.2f} ms, speedup {row['speedup_over_one_gpu']:.2f}x" if whole_ms else "")
            + (f"; peak MiB ring {ring_peak:.0f} vs one GPU {whole_peak:.0f}" if whole_peak else ""))
        del q, k, v, dout
        if device.type == "cuda":
            torch.cuda.empty_cache()

    # 3. the trace
    from torch.profiler import ProfilerActivity, profile
    n = args.trace_n or min(lengths)
    leaves = [torch.randn(B, H, n // world, D, generator=g).to(device, dtype).requires_grad_(True) for _ in range(3)]
    fn = fwd_bwd(ring, *leaves, torch.randn(B, H, n // world, D, generator=g).to(device, dtype))
    fn()
    sync(device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    barrier(device)
    with profile(activities=acts) as prof:
        for _ in range(3):
            fn()
        sync(device)
    trace = out / f"trace_rank{rank}_N{n}.json"
    barrier(device)                                   # rank 0 made the folder
    prof.export_chrome_trace(str(trace))
    overlap = overlap_from_trace(trace)
    gathered = [None] * world
    dist.all_gather_object(gathered, overlap)
    log(f"trace of 3 ring iterations at N={n}: {trace.name} per rank; overlap: {gathered}")

    if rank == 0:
        result = {"machine": machine_info(), "world": world, "command": " ".join(sys.argv),
                  "rows": rows, "trace": {"N": n, "files": [f"trace_rank{r}_N{n}.json" for r in range(world)],
                                          "overlap_per_rank": gathered}}
        (out / "ring.json").write_text(json.dumps(result, indent=1))
        plot(rows, out / "ring.png", world)
        log(f"wrote {out / 'ring.json'} and {out / 'ring.png'}")
    dist.destroy_process_group()


def plot(rows, path, world):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ns = [r["N"] for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(ns, [r["ring_tflops_per_gpu"] for r in rows], "o-", label=f"ring, {world} GPUs (per GPU)")
    a.plot(ns, [r["step06_shard_tflops"] for r in rows], "s--", label="step 06, one GPU, N / W rows")
    w = [(r["N"], r["step06_whole_tflops"]) for r in rows if r["step06_whole_tflops"]]
    if w:
        a.plot(*zip(*w), "^:", label="step 06, one GPU, all N rows")
    a.set_xscale("log", base=2); a.set_xlabel("total sequence length N"); a.set_ylabel("TFLOP/s")
    a.set_title("forward + backward"); a.legend()
    b.plot(ns, [r["ratio_to_step06_shard"] for r in rows], "o-")
    b.axhline(0.85, color="gray", ls="--", label="target 0.85")
    b.set_xscale("log", base=2); b.set_xlabel("total sequence length N")
    b.set_ylabel("ring per GPU / step 06 at the shard length"); b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
