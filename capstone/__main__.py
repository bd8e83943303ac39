"""Train the capstone GPT with the course's attention.

    python -m capstone train                                 # CPU: tiny model, the dispatcher falls back
    python -m capstone train --attn step06 --size small --dtype bf16 --steps 200 --compile   # a GPU
    torchrun --nproc-per-node 2 -m capstone train --attn step06 --size small --dtype bf16    # DDP, 2 GPUs
    torchrun --nproc-per-node 2 -m capstone train --parallel fsdp --size small --dtype bf16  # FSDP2, 2 GPUs
    python -m capstone explain --size small --dtype bf16     # which attention auto picks here, and why

Prints the loss on a progress bar with tokens/s; ``--out run.json`` keeps the loss of every step
and the timing. ``--attn``: auto, step07, step06, step04, math, or a baseline (sdpa-flash,
sdpa-cudnn, sdpa, naive). ``--dtype fp16`` trains under autocast with a gradient scaler, ``bf16``
under autocast without one, ``fp32`` without autocast.

Under torchrun (WORLD_SIZE > 1; NCCL on GPUs, gloo on a CPU) ``--parallel ddp`` (the default) wraps the
model in DistributedDataParallel; ``--parallel fsdp`` shards it with FSDP2 (``fully_shard``: each block,
then the root; parameters become DTensors, sharded on dim 0, gathered around each block's forward and
backward; gradients reduce-scattered). Each rank trains on its own slice of one global batch of
``--batch x world`` sequences, and the loss recorded is the mean over ranks: the loss of that global
batch, what one process training on the whole batch records (tests/test_capstone_dist.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

from . import data, dispatch
from .model import GPT, SIZES, config

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def parse(argv=None):
    ap = argparse.ArgumentParser(prog="python -m capstone", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["train", "explain"])
    ap.add_argument("--attn", default="auto")
    ap.add_argument("--code", default=None, help="steps, solutions or a folder (default $ATTN_IMPL or solutions)")
    ap.add_argument("--size", default="tiny", choices=sorted(SIZES))
    ap.add_argument("--context", type=int, default=None, help="tokens per sequence (default: the size's)")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step (per process)")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--dtype", default="fp32", choices=sorted(DTYPES))
    ap.add_argument("--compile", action="store_true", help="torch.compile(model, fullgraph=True)")
    ap.add_argument("--compile-mode", default=None, choices=["default", "reduce-overhead", "max-autotune-no-cudagraphs"],
                    help="with --compile: torch.compile's mode (reduce-overhead: CUDA graphs, for a host-bound step)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None)
    ap.add_argument("--parallel", default=None, choices=["ddp", "fsdp"],
                    help="under torchrun: DDP (default) or FSDP2 (fully_shard per block, then the root)")
    ap.add_argument("--out", type=Path, default=None, help="write the run (losses, timing) as JSON here")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    return ap.parse_args(argv)


def _progress(n, quiet):
    if quiet:
        return None
    try:
        from tqdm import tqdm
        return tqdm(total=n, file=sys.stderr, unit="step")
    except ImportError:
        return None


def _wrap(model, parallel, device, compile=False):
    """The model as ``parallel`` trains it: DDP, or FSDP2 on each block and then the root.

    FSDP2 with ``compile``: each block is compiled (fullgraph) before it is sharded, torchtitan's
    order. Compiling the sharded root with fullgraph=True fails: Dynamo skips FSDP2's hooks
    ("Attempted to call function marked as skipped", torch 2.13, CPU/gloo, 2026-11-30).
    """
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    # The mesh on the training device, named: fully_shard's default mesh takes the machine's
    # accelerator, so `--device cpu` on a GPU machine set CUDA device = local rank (two gloo ranks
    # on an H200: "invalid device ordinal" on rank 1; gpu-check of 2026-12-01).
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    # The blocks first, so each is its own all-gather / reduce-scatter group; the root then holds what
    # is left (embeddings, the tied head, the final norm). Autocast works on the gathered fp32
    # parameters as it does without FSDP (no MixedPrecisionPolicy: the same numerics as DDP).
    for block in model.blocks:
        if compile:
            block.compile(fullgraph=True)
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def train(args, hook=None):
    """Train; return (run, model): run is what --out writes.

    ``hook(i)``, if given, runs before step i and once more with i = steps after the last: the bench
    starts and stops a profiler there.
    """
    if args.compile_mode and not args.compile:      # before anything is built (under torchrun: before any rank waits)
        raise SystemExit("capstone train: --compile-mode needs --compile")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if world > 1:
        import torch.distributed as dist
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    parallel = (getattr(args, "parallel", None) or "ddp") if world > 1 else "none"
    torch.manual_seed(args.seed)
    cfg = config(args.size, attn=args.attn, code=args.code)
    if args.context:
        cfg.context = args.context
    model = GPT(cfg).to(device)
    amp = DTYPES[args.dtype]
    autocast = (lambda: torch.autocast(device.type, dtype=amp)) if amp else contextlib.nullcontext
    if parallel == "fsdp":
        # Each rank checks only its shard of the gradients for inf/NaN: ShardedGradScaler all-reduces
        # found_inf, so every rank skips (or takes) the same steps.
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
        scaler = ShardedGradScaler(device.type, enabled=amp == torch.float16)
    else:
        scaler = torch.amp.GradScaler(device.type, enabled=amp == torch.float16)
    stream = data.batches(data.corpus(), args.batch, cfg.context, seed=args.seed, rank=rank, world=world)

    # Decide the attention eagerly (imports, a build, a trial call) before anything is compiled.
    x, y = next(stream)
    with torch.no_grad(), autocast():
        model(x[:1].to(device))
    h = cfg.d_model // cfg.heads
    probe = torch.empty(1, cfg.heads, cfg.context, h, device=device, dtype=amp or torch.float32)
    choice = dispatch.choose(probe, probe, probe, True, args.attn, args.code)
    if world > 1:
        model = _wrap(model, parallel, device, compile=args.compile)
    # After the wrap: FSDP2 replaces the parameters by DTensors, and the optimizer must hold those.
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    step_fn = (torch.compile(model, fullgraph=True, mode=args.compile_mode)
               if args.compile and parallel != "fsdp" else model)

    losses, times = [], []
    bar = _progress(args.steps, args.quiet or rank != 0)
    tokens = args.batch * cfg.context * world
    for i in range(args.steps):
        if hook is not None:
            hook(i)
        if i:
            x, y = next(stream)
        x, y = x.to(device), y.to(device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with autocast():
            _, loss = step_fn(x, y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        loss = loss.detach()
        if world > 1:       # the global batch's loss: each rank's mean over the same number of tokens
            loss = loss.clone()
            torch.distributed.all_reduce(loss)
            loss /= world
        losses.append(float(loss))
        if not math.isfinite(losses[-1]):
            raise FloatingPointError(f"step {i}: the loss is {losses[-1]} ({choice.impl}, {args.dtype})")
        if bar is not None:
            bar.set_postfix(loss=f"{losses[-1]:.3f}", tok_s=f"{tokens / times[-1]:,.0f}")
            bar.update()
    if hook is not None:
        hook(args.steps)
    if bar is not None:
        bar.close()
    steady = times[len(times) // 5:] or times      # the first steps compile and warm up
    run = {"attn": args.attn, "chose": choice.impl, "passed_over": choice.passed_over, "size": args.size,
           "context": cfg.context, "batch": args.batch, "world": world,
           "parallel": parallel, "dtype": args.dtype,
           "compile": args.compile, "compile_mode": args.compile_mode, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "losses": losses,
           "step_ms": [round(1000 * t, 3) for t in times],
           "tokens_per_s": round(tokens * len(steady) / sum(steady), 1), "ms_per_step": round(1000 * sum(steady) / len(steady), 3),
           "ms_per_step_median": round(1000 * sorted(steady)[len(steady) // 2], 3)}
    if rank == 0:
        how = f"{args.dtype}{', compiled' if args.compile else ''}{f' ({args.compile_mode})' if args.compile_mode else ''}" + (f", {parallel} x {world}" if world > 1 else "")
        print(f"{choice.impl} ({how}): loss {losses[0]:.3f} -> "
              f"{losses[-1]:.3f} in {args.steps} steps, {run['tokens_per_s']:,.0f} tokens/s")
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(run, indent=1) + "\n")
    return run, getattr(model, "module", model)


def main(argv=None):
    args = parse(argv)
    if args.command == "explain":
        cfg = config(args.size)
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        h = cfg.d_model // cfg.heads
        q = torch.zeros(1, cfg.heads, args.context or cfg.context, h, device=device,
                        dtype=DTYPES[args.dtype] or torch.float32)
        print(dispatch.explain(q, q, q, True, args.code))
        return 0
    train(args)
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        # Every rank leaves together, then at once. Left to interpreter exit, one gloo rank now and then
        # aborted after training had finished ("terminate called without an active exception", SIGABRT:
        # make test, 2026-12-01), and it still did about one run in three with destroy_process_group()
        # after the barrier (tests/test_capstone_dist.py, fsdp-bf16, on a CPU): a gloo worker thread still
        # joinable when the process group is destroyed. Everything this run writes is written by now
        # (train() wrote --out); attnlib/dist.py's workers leave the same way.
        dist.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
