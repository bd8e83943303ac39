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
# # Step 01 — Naive attention, and the N × N matrix it needs
#
# $$O = \mathrm{softmax}\!\left(\frac{QK^\top}{\sqrt{D}} + M\right) V$$
#
# In this notebook you will:
# - write attention the textbook way (in `steps/step01_naive.py`) and check it against the float64 reference;
# - count the memory the score matrix takes, before measuring it;
# - see with `torch.profiler` where the time goes.
#
# Everything later in the course computes this same function; only the way it moves memory changes.

# %%
# The one switch: "steps" runs your code (steps/), "solutions" the course's, or a path to a folder like steps/.
import os
IMPL = os.environ.get("ATTN_IMPL", "steps")

from attnlib.nb import setup
load_step, device, small = setup(IMPL)

import math, torch
import matplotlib.pyplot as plt
from attnlib import make_qkv, reference_attention
from attnlib.checks import check_attention
step01 = load_step(1)

# %% [markdown]
# ## 1. Correct first
#
# `check_attention` runs your `attention` forward and backward and compares O, dQ, dK and dV with the
# float64 reference (`attnlib/reference.py`). On a mismatch it tells you where the error lives and, when
# it can, which classic bug it looks like.

# %%
dtype = torch.float32 if device == "cpu" else torch.float16
for nq, nk in [(17, 17), (100, 33), (1, 1)]:
    for causal in (False, True):
        q, k, v = make_qkv(2, 4, nq, nk, 64, dtype=dtype, device=device)
        check_attention(step01.attention, q, k, v, is_causal=causal)
print("step 01 matches the reference, forward and backward")


# %% [markdown]
# ## 2. Count the memory before measuring it
#
# The score matrix $S = QK^\top$ has $N_q \times N_k$ elements for every (batch, head). The softmax
# output $P$ has as many again, and autograd keeps $P$ for the backward. The CS336 sweep (batch 8, one
# head) runs out of memory at $N = 8192$:
#
# $8 \times 8192 \times 8192 \times 4$ bytes $= 2^{31}$ bytes $= 2$ GiB for $S$ alone in fp32.

# %%
def score_bytes(B, H, N, bytes_per=4):
    return B * H * N * N * bytes_per

print(f"[8, 8192, 8192] fp32: {score_bytes(8, 1, 8192) / 2**30:.2f} GiB")
Ns = [256, 1024, 4096, 8192, 16384]
plt.figure(figsize=(5, 3.2))
for name, b in [("fp32", 4), ("bf16", 2)]:
    plt.plot(Ns, [score_bytes(8, 1, n, b) / 2**30 for n in Ns], "o-", label=f"S in {name}")
plt.plot(Ns, [8 * n * 64 * 4 / 2**30 for n in Ns], "k--", label="Q (D=64, fp32), for scale")
plt.xscale("log", base=2); plt.yscale("log"); plt.xlabel("N"); plt.ylabel("GiB (batch 8, 1 head)")
plt.title("One N × N matrix against the inputs"); plt.legend(); plt.tight_layout(); plt.show()

# %% [markdown]
# Now measure it. On a GPU we read the allocator's peak; on a CPU we intercept every tensor the
# computation creates (a `TorchDispatchMode`) and report the largest one.

# %%
from torch.utils._python_dispatch import TorchDispatchMode

class LargestTensor(TorchDispatchMode):
    def __init__(self):
        super().__init__(); self.numel, self.op = 0, None
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and t.numel() > self.numel:
                self.numel, self.op = t.numel(), str(func)
        return out

N = 512 if small else 4096
q, k, v = make_qkv(1, 4, N, N, 64, device=device, requires_grad=True)
with LargestTensor() as seen:
    step01.attention(q, k, v, is_causal=True).sum().backward()
print(f"largest tensor: {seen.numel:,} elements from {seen.op} = B*H*N*N = {1*4*N*N:,}")
if device == "cuda":
    torch.cuda.reset_peak_memory_stats()
    step01.attention(q, k, v, is_causal=True).sum().backward()
    print(f"peak allocated: {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB")

# %% [markdown]
# ## 3. Where the time goes
#
# The naive version launches one operation after another — matmul, scale, mask, softmax, matmul — and
# each reads its input from memory and writes its output back. The profiler lists them.

# %%
from torch.profiler import profile, ProfilerActivity
acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
N = 256 if small else 4096
q, k, v = make_qkv(4, 8, N, N, 64, device=device, dtype=torch.float32 if small else torch.bfloat16)
for _ in range(3):
    step01.attention(q, k, v, is_causal=True)          # warm-up
with profile(activities=acts) as prof:
    for _ in range(5):
        step01.attention(q, k, v, is_causal=True)
key = "cuda_time_total" if device == "cuda" else "cpu_time_total"
print(prof.key_averages().table(sort_by=key, row_limit=10))

# %% [markdown]
# Read the table: the two matrix products (`aten::matmul`/`bmm`) dominate the arithmetic, but the
# softmax, the mask and the copies each take a full pass over an N × N tensor. Those passes are pure
# memory traffic, and they are what the next steps remove: step 02 fuses some of them, step 03 and
# FlashAttention (step 04 onwards) never write the N × N matrix at all.

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
# - A. Vaswani et al., *Attention Is All You Need*, 2017, [arXiv:1706.03762](https://arxiv.org/abs/1706.03762):
#   the formula at the top of this notebook.
#
# ## Exercises
#
# Answers: `solutions/EXERCISES.md` (not in the student copy).
#
# 1. How many bytes does the score matrix $S$ take for $B = 8$, $H = 16$, $N = 4096$ in bf16?
# 2. `torch.softmax` subtracts each row's max before the exponential. In fp16, what would $e^{12}$
#    be without it, and why does the subtraction not change the result?
# 3. With `is_causal=True` and $N_q > N_k$ (the mask aligned top-left), which query rows see every key?
