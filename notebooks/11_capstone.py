# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Capstone — the course's attention inside a GPT that trains
#
# Every step so far was checked as a function on random tensors. A kernel is ready for real use
# when a model trains with it: inside autograd and mixed precision, inside `torch.compile`, across
# processes, and with a fallback where it cannot run. This notebook trains a small GPT (`capstone/`)
# whose every attention call goes through a dispatcher over the course's steps.
#
# In this notebook you will:
# 1. ask the dispatcher what it would run here, and why it passed over the faster ones;
# 2. train the GPT with the course's attention and with SDPA's math backend, and compare the curves;
# 3. see what a step that is still a stub does to the model (nothing: it is passed over, with its hint);
# 4. read the commands for mixed precision, `torch.compile`, and two GPUs;
# 5. read what the H200 measured: attention's share of a step, tokens/s, and the loss curves.

# %%
# The one switch: "steps" runs your code (steps/), "solutions" the course's, or a path to a folder like steps/.
import os
IMPL = os.environ.get("ATTN_IMPL", "steps")

from attnlib.nb import setup
load_step, device, small = setup(IMPL)

# %%
import torch
import matplotlib.pyplot as plt
from capstone import dispatch
from capstone.__main__ import parse, train

# %% [markdown]
# ## 1. What runs here, and why
#
# `auto` tries step 07 (CUDA: sm_80+, fp16/bf16, D in {64, 128}), step 06 (Triton on a GPU), step 04
# (PyTorch, anywhere) and SDPA's math backend, in that order, and takes the first that can serve the
# inputs and passes a trial call. Each one passed over comes with its reason.

# %%
for dtype in ((torch.float32,) if small else (torch.float32, torch.bfloat16)):
    q = torch.zeros(1, 8, 256, 64, device=device, dtype=dtype)
    print(f"{str(dtype).replace('torch.', '')}:\n{dispatch.explain(q, q, q, True)}\n")

# %% [markdown]
# ## 2. Train it
#
# The data is the course's own text (its markdown and Python files, read as bytes): no download.
# Two runs from the same seed, on the same batches: the course's attention (`auto`) and SDPA's math
# backend. In fp32 the curves should lie on each other; they differ only by the rounding of the
# attention's arithmetic.

# %%
steps = 25 if small else 200
size = [] if small else ["--size", "small", "--dtype", "bf16"]
ours, _ = train(parse(["train", "--quiet", "--steps", str(steps), "--context", "128", *size]))
ref, _ = train(parse(["train", "--quiet", "--steps", str(steps), "--context", "128", "--attn", "math", *size]))
plt.figure(figsize=(6, 3.2))
plt.plot(ours["losses"], label=f"course ({ours['chose']})")
plt.plot(ref["losses"], "--", label="SDPA math")
plt.xlabel("step"); plt.ylabel("loss"); plt.legend(); plt.title("the same model, two attentions")
plt.show()
print(f"largest gap between the curves: {max(abs(a - b) for a, b in zip(ours['losses'], ref['losses'])):.2e}")
print(f"tokens/s: course {ours['tokens_per_s']:,.0f}, SDPA math {ref['tokens_per_s']:,.0f} (on a CPU these say little)")

# %% [markdown]
# ## 3. A step that is still a stub
#
# Point the dispatcher at pristine stubs and it falls back to SDPA's math backend, saying which
# region of which step is still to be written. A student's model trains from the first day and
# switches to their own kernels as they land.

# %%
import tempfile
from pathlib import Path
from attnlib import stubgen
with tempfile.TemporaryDirectory() as tmp:
    stubgen.write(stubgen.SOLUTIONS, Path(tmp) / "pristine", force=True) if stubgen.SOLUTIONS.is_dir() else None
    q = torch.zeros(1, 2, 32, 16)
    if (Path(tmp) / "pristine").is_dir():
        print(dispatch.explain(q, q, q, True, code=str(Path(tmp) / "pristine")))

# %% [markdown]
# ## 4. On a GPU
#
# ```bash
# python -m capstone explain --size small --dtype bf16
# python -m capstone train --attn step06 --size small --dtype bf16 --steps 200 --compile --out run.json
# python -m capstone train --attn sdpa-flash --size small --dtype bf16 --steps 200 --out ref.json
# python -m capstone train --attn step07 --size small --dtype fp16 --steps 200      # with a gradient scaler
# torchrun --nproc-per-node 2 -m capstone train --attn step06 --size small --dtype bf16   # DDP, NCCL
# ```
#
# `--compile` compiles the whole model with `fullgraph=True`: the course's kernels are registered
# operators (notebook 06, section 9), so nothing breaks the graph. The dispatcher decides eagerly,
# before compiling (a trial call, an extension build), and the compiled graph reads its decision.

# %% [markdown]
# ## 5. What the H200 measured
#
# The GPU runs behind `results/h200/capstone/README.md` (`bench/capstone_gpu.py`; model `small`: 6 layers,
# d_model 512, 8 heads of 64, bf16, 16,384 tokens a step). Three questions, one figure each.
#
# **Where does a training step's time go as the context grows?** Attention's share of the step's GPU
# kernel time (torch.profiler), and the tokens/s of the whole step with step 06 against SDPA-FLASH
# (after the host fixes of notebook 06, section 10):

# %%
import json
from attnlib.nb import REPO

RESULTS = REPO / "results" / "h200"
share_run = RESULTS / "capstone" / "capstone.json"
speed_run = RESULTS / "capstone" / "capstone_6607034.json"
if share_run.exists() and speed_run.exists():
    shares = json.loads(share_run.read_text())["attention_share"]
    speed = {(r["attn"], r["context"]): r for r in json.loads(speed_run.read_text())["speed"]
             if not r.get("compile") and "tokens_per_s" in r}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.6))
    for attn, style in (("sdpa-flash", "o-"), ("step06", "s--")):
        rows = sorted((r["context"], r["share"]) for r in shares if r["attn"] == attn)
        ax1.plot([c for c, _ in rows], [100 * x for _, x in rows], style, label=attn)
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("context")
    ax1.set_ylabel("attention, % of kernel time")
    ax1.set_title("attention's share of a training step")
    ax1.legend()
    contexts = sorted({c for a, c in speed if a == "step06"})
    for attn, style in (("sdpa-flash", "o-"), ("sdpa-cudnn", "^:"), ("step06", "s--")):
        ax2.plot(contexts, [speed[attn, c]["tokens_per_s"] / 1e3 if (attn, c) in speed else float("nan")
                            for c in contexts], style, label=attn)
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("context")
    ax2.set_ylabel("thousand tokens/s")
    ax2.set_title("a whole training step")
    ax2.legend()
    fig.tight_layout()
    plt.show()
    print("step 06 / SDPA-FLASH tokens/s:", ", ".join(
        f"{c}: {speed['step06', c]['tokens_per_s'] / speed['sdpa-flash', c]['tokens_per_s']:.2f}x" for c in contexts))
else:
    print("no H200 run committed yet: python bench/capstone_gpu.py --out results/h200/capstone")

# %% [markdown]
# Attention is a sixth of the kernel time at context 1k and two thirds at 16k: the longer the
# context, the more a faster attention kernel is worth to the whole step. At 1k the step is bound by
# the host, not the GPU, which is why step 06's faster kernels do not show there.
#
# **And with the whole model compiled on both sides?** `torch.compile(model, fullgraph=True)` removes
# most of the Python between kernels for both attentions, so what is left is closer to the kernels
# alone (`bench/capstone_gpu.py --parts d`):

# %%
compiled_run = RESULTS / "capstone" / "capstone_partd_4cbe841.json"
if compiled_run.exists():
    run = json.loads(compiled_run.read_text())
    for r in run["speed"]:
        print(f"{r['attn']:10s} compiled, context {r['context']:6d}: {r['ms_per_step']:6.2f} ms a step, "
              f"{r['tokens_per_s'] / 1e3:6.0f}k tokens/s")
    print("compiled step 06 / compiled SDPA-FLASH:", run["ratio_compiled_step06_over_compiled_sdpa_flash"])
else:
    print("no H200 run committed yet: python bench/capstone_gpu.py --parts d --out results/h200/capstone")

# %% [markdown]
# At 16k step 06's faster kernels carry the whole step (1.19x); at 4k the compiled step with step 06 is
# *slower* than with SDPA-FLASH (0.86x in this run), although its attention kernels take less GPU time.
# A profile of three compiled steps of each (`--parts bd`) says where the time goes: the GPU's kernel
# time against the step's wall time, and the host's busiest operations.

# %%
profiled = RESULTS / "capstone" / "capstone_bd_dg_295108e.json"
if profiled.exists():
    run = json.loads(profiled.read_text())
    for r in run["attention_share"]:
        steps = r["profiled_step_ms"]
        print(f"{r['attn']:10s} compiled, 4k: kernels {r['all_kernel_ms'] / len(steps):5.1f} ms a step "
              f"(attention {r['attention_kernel_ms'] / len(steps):4.1f}), wall {sorted(steps)[1]:5.1f} ms a step (median)")
        name, ms, calls = r["top_cpu_ops"][0]
        print(f"{'':10s} busiest on the host: {name[:60]}  {ms / calls:.2f} ms a call x {calls}")
    for r in run["speed"]:
        print(f"{r['attn']:10s} under CUDA graphs, context {r['context']:6d}: {r['tokens_per_s'] / 1e3:6.0f}k tokens/s")
    print("step 06 / SDPA-FLASH under CUDA graphs:", run["ratio_cudagraphs_step06_over_sdpa_flash"])
else:
    print("no H200 run committed yet: python bench/capstone_gpu.py --parts bd,dg --contexts 4096,16384")

# %% [markdown]
# With step 06 the GPU has *less* work per step (its attention kernels are faster) and still finishes
# later: it waits for the host. Step 06's backward is an opaque operator (a `custom_op`, so that its
# launches keep their register caps, which Inductor's relaunch would drop), so the compiled graph calls
# its Python launcher for every layer: about 0.4 ms of host time a call, three Triton launches of
# about 0.1 ms each (`bench/experiments/host_overhead.py --yappi`). SDPA-FLASH's backward is one C++
# call. CUDA graphs (`torch.compile(..., mode="reduce-overhead")`, `python -m capstone train --compile
# --compile-mode reduce-overhead`) record the kernels once and replay them without the host: then the
# kernels decide, and step 06 is ahead at 4k as well.
#
# **Can the compiler rescue naive attention?** The same model with step 01's attention (scores, mask,
# softmax, P V in PyTorch), the whole model compiled (`--parts an`):

# %%
naive_run = RESULTS / "capstone" / "capstone_an_124bc77.json"
if naive_run.exists():
    for r in json.loads(naive_run.read_text())["speed"]:
        print(f"naive, compiled, context {r['context']:6d}: {r['ms_per_step']:7.2f} ms a step, "
              f"{r['tokens_per_s'] / 1e3:6.0f}k tokens/s, peak {r['peak_gib']:5.1f} GiB")
else:
    print("no H200 run committed yet: python bench/capstone_gpu.py --parts an --out results/h200/capstone")

# %% [markdown]
# At 1k it can: the scores are small, Inductor fuses the mask and the softmax, and the step runs as fast as
# the fused kernels' eager steps did in another run (1.1-1.3M tokens/s). It cannot change what grows with N:
# 46 ms a step at 4k against 12-16 ms for the compiled fused kernels above, 150 ms at 16k against 24-29,
# where the scores and probabilities kept for the backward take 50 GiB.
#
# **Does the model learn the same with the course's kernel?** Two runs that differ only in the attention
# kernel round differently, and training amplifies the difference, most after a loss spike. A third
# implementation, SDPA's cuDNN backend, shows how far two *correct* kernels drift apart on the same run:
# step 06 passes when it stays within twice that spread.

# %%
curves_run = RESULTS / "capstone" / "capstone_curves_1ffb63e.json"
if curves_run.exists():
    curves = json.loads(curves_run.read_text())["loss_curves"]
    fig, axes = plt.subplots(1, len(curves), figsize=(11, 3.6), squeeze=False)
    for ax, (dtype, e) in zip(axes[0], curves.items()):
        for attn, style in (("sdpa-flash", "-"), ("step06", "--"), ("sdpa-cudnn", ":")):
            ax.plot(e[attn]["losses"], style, label=attn)
        ax.set_title(f"{dtype}: |step06 - FLASH| <= {e['max_abs_diff']:.3f}, |cuDNN - FLASH| <= {e['reference_spread']:.3f}")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.legend()
    fig.tight_layout()
    plt.show()
    for dtype, e in curves.items():
        print(f"{dtype}: within 2 x the spread of two correct kernels + 1e-3: {e['within_spread']}")
else:
    print("no H200 run committed yet: python bench/capstone_gpu.py --out results/h200/capstone --parts c")

# %% [markdown]
# **Does it scale past one GPU?** `torchrun --nproc-per-node 2 -m capstone train --parallel ddp|fsdp` on two
# H200s reached the same loss with DDP and with FSDP2 (`results/h200/capstone/ddp.json`, `fsdp.json`); for
# a 19M-parameter model FSDP2's gathers cost half the throughput, as they should where the model fits one
# GPU many times over.

# %% [markdown]
# ## References
#
# - T. Dao, D. Y. Fu, S. Ermon, A. Rudra, C. Ré, *FlashAttention: Fast and Memory-Efficient Exact
#   Attention with IO-Awareness*, 2022, [arXiv:2205.14135](https://arxiv.org/abs/2205.14135).
# - T. Dao, *FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning*, 2023,
#   [arXiv:2307.08691](https://arxiv.org/abs/2307.08691).
# - J. Shah, G. Bikshandi, Y. Zhang, V. Thakkar, P. Ramani, T. Dao, *FlashAttention-3: Fast and
#   Accurate Attention with Asynchrony and Low-precision*, 2024, [arXiv:2407.08608](https://arxiv.org/abs/2407.08608).
# - Triton's fused-attention tutorial, `python/tutorials/06-fused-attention.py` in
#   [triton-lang/triton](https://github.com/triton-lang/triton).
# - Stanford CS336, assignment 2 (systems),
#   [stanford-cs336/assignment2-systems](https://github.com/stanford-cs336/assignment2-systems).
#
# ## Exercises
#
# 1. Run section 2 on the stubs after finishing step 04's forward only: where does the dispatcher's
#    trial call fail, and what does it report?
# 2. At which context length does attention take about half of the FLOPs of a training step of the
#    `small` model (d_model 512)? Check it with `torch.profiler` on one step.
# 3. With SDPA-FLASH forced in the model, `torch.compile(model, fullgraph=True)` stopped with
#    "Attempted to call function marked as skipped" until the dispatcher imported step 03 when it chose
#    it rather than inside each call (`capstone/dispatch.py`, `_step`). Which call inside the traced
#    function did Dynamo refuse, and why is a decision made eagerly, before compiling, the fix?
