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
# # Step 02 — `torch.compile`: fusion without a new algorithm
#
# `torch.compile` traces step 01's `naive_attention` into a graph; Inductor then generates kernels that
# fuse the elementwise work (scale, mask, softmax) and calls a library for the matrix products.
#
# In this notebook you will:
# - compile the naive attention (in `steps/step02_compile.py`) and check it;
# - read the code Inductor generated: what fused and what did not;
# - see that the N × N buffer is still there, so memory stays O(N²);
# - measure what compiling and recompiling cost.

# %%
# The one switch: "steps" runs your code (steps/), "solutions" the course's, or a path to a folder like steps/.
import os
IMPL = os.environ.get("ATTN_IMPL", "steps")

from attnlib.nb import setup
load_step, device, small = setup(IMPL)
from attnlib.nb import median_ms as nb_median_ms

import re, time, torch
import matplotlib.pyplot as plt
from attnlib import make_qkv
from attnlib.checks import check_attention
step01, step02 = load_step(1), load_step(2)

# %%
q, k, v = make_qkv(2, 4, 100, 33, 64, device=device)
for causal in (False, True):
    check_attention(step02.attention, q, k, v, is_causal=causal)
print("step 02 matches the reference")

# %% [markdown]
# ## What fused
#
# `run_and_get_code` returns the source Inductor wrote. Kernel definitions (`cpp_fused_*` on a CPU,
# `triton_*` on a GPU) are the fused pieces; `extern_kernels.bmm`/`mm` are the library matrix
# products; `empty_strided` lines are the buffers it allocates.

# %%
from torch._inductor.utils import run_and_get_code
torch._dynamo.reset()
N = 256
q, k, v = make_qkv(2, 4, N, N, 64, device=device)
fn = torch.compile(step01.naive_attention)
_, codes = run_and_get_code(fn, q, k, v, True, 0.125)
code = "\n".join(codes)
kernels = sorted(set(re.findall(r"def ((?:cpp|triton)_\w+)\(|^(\w*cpp_fused\w*) = ", code, re.M)))
fused = sorted({a or b for a, b in kernels})
externs = sorted(set(re.findall(r"extern_kernels\.(\w+)", code)))
print("fused kernels :", fused)
print("library calls :", externs)
bufs = re.findall(r"empty_strided\w*\(\(([^)]*)\)", code)
print("buffers       :", bufs)


# %% [markdown]
# Look at the buffers: one of them is `(8, 256, 256)` — (B·H) × N × N, the scores of every head. The softmax fused with the
# scale and the mask, but its input (the output of the first `bmm`) and its output (the input of the
# second) still live in memory. Compilation changes the constant, not the O(N²).
#
# ## What it buys, and what it costs
#
# Time eager against compiled across N (median of several runs after warm-up), then the cost of a
# recompile when the shape changes and the graph was compiled for static shapes.

# %%
def median_ms(f, reps=5):
    return nb_median_ms(f, device, reps)

Ns = [128, 256, 512, 1024] if small else [1024, 2048, 4096, 8192]
eager, comp = [], []
with torch.no_grad():
    for n in Ns:
        q, k, v = make_qkv(2, 4, n, n, 64, device=device)
        eager.append(median_ms(lambda: step01.attention(q, k, v, is_causal=True)))
        comp.append(median_ms(lambda: step02.attention(q, k, v, is_causal=True)))
for n, e, c in zip(Ns, eager, comp):
    print(f"N={n:5d}  eager {e:8.2f} ms  compiled {c:8.2f} ms  speed-up {e / c:4.2f}x")
plt.figure(figsize=(5, 3.2))
plt.plot(Ns, eager, "o-", label="eager (step 01)"); plt.plot(Ns, comp, "o-", label="compiled (step 02)")
plt.xscale("log", base=2); plt.yscale("log"); plt.xlabel("N"); plt.ylabel("ms (forward)")
plt.legend(); plt.tight_layout(); plt.show()

# %%
# Recompiles: a static-shape graph is recompiled for every new N; dynamic=True compiles once.
import torch._inductor.config as inductor_config
for dynamic in (False, True):
    torch._dynamo.reset()
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    f = torch.compile(step01.naive_attention, dynamic=dynamic)
    times = []
    # The on-disk cache would hide the compile time we want to see.
    with torch.no_grad(), inductor_config.patch(fx_graph_cache=False):
        for n in (64, 96, 128):
            q, k, v = make_qkv(1, 2, n, n, 32, device=device)
            t = time.perf_counter(); f(q, k, v, False, 0.17); times.append(time.perf_counter() - t)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] - before
    print(f"dynamic={dynamic!s:5}: first calls at N=64, 96, 128 took "
          + ", ".join(f"{t:.2f}s" for t in times) + f"; {graphs} graph(s) compiled")

# %% [markdown]
# With static shapes every new N pays a compile (seconds); with `dynamic=True` only the first call
# does (PyTorch also switches to dynamic shapes by itself after the first recompile). Training with one
# sequence length never notices; serving with many lengths does.

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
# Answers: `solutions/EXERCISES.md` (not in the student copy).
#
# 1. The compiled function is called with a new sequence length. What happens with `dynamic=True`,
#    and what with `dynamic=False`?
# 2. Compiling fuses the scale, the mask and the softmax into fewer kernels. Does the peak memory
#    stop growing as $N^2$? Why or why not?
