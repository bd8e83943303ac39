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
# # Step 03 — `F.scaled_dot_product_attention` and its backends
#
# One function, several implementations: FlashAttention-2 ("flash"), cuDNN ("cudnn"), memory-efficient
# ("efficient") and the plain composite ("math"). PyTorch picks the first that accepts the inputs.
#
# In this notebook you will:
# - call SDPA with an explicit backend (in `steps/step03_sdpa.py`);
# - ask which backend runs, and read why the others refuse;
# - time the backends against each other and against step 01.

# %%
# The one switch: "steps" runs your code (steps/), "solutions" the course's, or a path to a folder like steps/.
import os
IMPL = os.environ.get("ATTN_IMPL", "steps")

from attnlib.nb import setup
load_step, device, small = setup(IMPL)
from attnlib.nb import median_ms as nb_median_ms

import torch
import matplotlib.pyplot as plt
from attnlib import make_qkv
from attnlib.checks import check_attention
step01, step03 = load_step(1), load_step(3)
BACKENDS = ["flash", "cudnn", "efficient", "math"]

# %%
dtypes = [torch.float32] if device == "cpu" else [torch.float32, torch.float16, torch.bfloat16]
for dtype in dtypes:
    q, k, v = make_qkv(2, 4, 128, 128, 64, dtype=dtype, device=device)
    print(f"{str(dtype):15} chosen: {step03.chosen_backend(q, k, v, is_causal=True)}")
    for b in BACKENDS:
        why = step03.refusal_reasons(b, q, k, v, is_causal=True)
        if why:
            print(f"   {b:9} refuses: " + " | ".join(w.splitlines()[0][:110] for w in why))
        else:
            check_attention(lambda q, k, v, is_causal, scale: step03.attention(q, k, v, is_causal, scale, backend=b),
                            q, k, v, is_causal=True)
            print(f"   {b:9} accepts, and matches the reference")

# %% [markdown]
# Typical refusals on a GPU: flash needs fp16 or bf16 (fp32 goes to "efficient" or "math"), a head dim
# that is a multiple of 8 and at most 256; cuDNN needs a recent GPU and its own shape rules; any
# backend but "math" refuses some attention masks. On a CPU only "math" and a CPU "flash" exist.
#
# ## Time against N

# %%
import time
def median_ms(f, reps=5):
    return nb_median_ms(f, device, reps)

dtype = torch.float32 if small else torch.bfloat16
Ns = [128, 256, 512, 1024] if small else [1024, 2048, 4096, 8192, 16384]
rows = {}
with torch.no_grad():
    for n in Ns:
        q, k, v = make_qkv(1, 8, n, n, 64, dtype=dtype, device=device)
        rows.setdefault("naive (step 01)", []).append(median_ms(lambda: step01.attention(q, k, v, is_causal=True)))
        for b in BACKENDS:
            if not step03.refusal_reasons(b, q, k, v, is_causal=True):
                rows.setdefault(b, []).append(median_ms(lambda: step03.attention(q, k, v, True, backend=b)))
plt.figure(figsize=(5, 3.2))
for name, ts in rows.items():
    plt.plot(Ns[:len(ts)], ts, "o-", label=name)
plt.xscale("log", base=2); plt.yscale("log"); plt.xlabel("N"); plt.ylabel("ms (forward, causal)")
plt.legend(); plt.tight_layout(); plt.show()
for name, ts in rows.items():
    print(f"{name:16}", "  ".join(f"{t:8.2f}" for t in ts))

# %% [markdown]
# The fused backends never write the N × N matrix, so they also reach lengths where step 01 runs out of
# memory. Step 04 builds the algorithm behind "flash" yourself, in plain PyTorch, to see how.

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
# - PyTorch, `torch.nn.functional.scaled_dot_product_attention` and `torch.nn.attention.sdpa_kernel`
#   (the backends and their constraints), [pytorch.org/docs](https://pytorch.org/docs/stable/generated/torch.nn.functional.scaled_dot_product_attention.html).
#
# ## Exercises
#
# Answers: `solutions/EXERCISES.md` (not in the student copy).
#
# 1. On a GPU, the flash backend refuses fp32 inputs. Why, and which backends still take them?
# 2. You need an arbitrary boolean mask (`attn_mask`), not a causal one. Which backends can run it?
