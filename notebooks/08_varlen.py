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
# # Step 08 — ragged batches and grouped-query attention
#
# Pre-training packs documents of every length into each batch, and every current model shares its
# key/value heads between several query heads (grouped-query attention, GQA). Both change what the
# kernel must know about its inputs, and neither needs a new algorithm: the tile loops of steps 05
# and 06 run unchanged, on the rows of one sequence and the K/V head of one group.
#
# In this notebook you will:
# 1. count what padding costs a batch of ragged sequences;
# 2. see the packed layout (`cu_seqlens`) and how a program finds its sequence;
# 3. check your `steps/step08_varlen.py` against the per-sequence float64 reference;
# 4. see why GQA needs no copy of K and V, and where its backward must sum;
# 5. read the recorded H200 figures (when a run has been committed).

# %%
# The one switch: "steps" runs your code (steps/), "solutions" the course's, or a path to a folder like steps/.
import os
IMPL = os.environ.get("ATTN_IMPL", "steps")

from attnlib.nb import setup
load_step, device, small = setup(IMPL)

# %%
import json
import torch
import matplotlib.pyplot as plt
from attnlib.compare import assert_close
from attnlib.reference import reference_attention, reference_backward
from attnlib.nb import REPO
step08 = load_step(8)
RESULTS = REPO / "results" / "h200"

# %% [markdown]
# ## 1. What padding costs
#
# Pad every sequence of a batch to its longest, and the attention work of sequence $b$ becomes
# $N_{\max}^2$ instead of $N_b^2$ (halved for causal either way). For lengths drawn uniformly
# between 128 and 4096, about 16k tokens a batch:

# %%
g = torch.Generator().manual_seed(0)
lengths = []
while sum(lengths) < 16384 - 128:
    lengths.append(int(torch.randint(128, 4097, (1,), generator=g)))
lengths[-1] -= max(0, sum(lengths) - 16384)
useful = sum(n * n for n in lengths)
padded = len(lengths) * max(lengths) ** 2
print(f"{len(lengths)} sequences, {sum(lengths)} tokens, longest {max(lengths)}")
print(f"attention work padded / packed: {padded / useful:.2f}x; pad tokens: {len(lengths) * max(lengths) - sum(lengths)}")

# %% [markdown]
# ## 2. The packed layout
#
# `q` is `(total_q, H, D)`: the sequences' tokens one after another. `cu_seqlens_q` holds the
# `batch + 1` offsets where each sequence starts (the cumulative sum of the lengths, from 0), and
# `max_seqlen_q` the longest, which sizes the grid: program `(i, b * H + h)` takes query tile `i` of
# sequence `b`, head `h`, and does nothing when `i * BLOCK_M` is past that sequence's end. Inside,
# `N_Q = cu_seqlens_q[b + 1] - cu_seqlens_q[b]` plays the role the dense kernels' `N_Q` played:
# the masks at the end of the sequence are the masks at the end of a dense matrix.

# %%
cu = [0] + torch.tensor(lengths).cumsum(0).tolist()
fig, ax = plt.subplots(figsize=(9, 1.4))
for b, (a, e) in enumerate(zip(cu, cu[1:])):
    ax.barh(0, e - a, left=a, color=f"C{b % 10}", edgecolor="white")
    ax.text((a + e) / 2, 0, str(e - a), ha="center", va="center", fontsize=7, color="white")
ax.set_yticks([]); ax.set_xlabel("packed row (token)"); ax.set_title("cu_seqlens: " + str(cu[:6])[:-1] + ", ...]")
plt.show()

# %% [markdown]
# ## 3. Check your kernels
#
# A ragged batch with a sequence of length 1, an empty one, one much longer than the rest, and
# 2 query heads per K/V head, against the float64 reference run one sequence at a time.

# %%
lq, lk, H, H_kv, D = ([5, 1, 0, 70, 33], [9, 1, 0, 64, 33], 4, 2, 32) if small else \
                     ([5, 1, 0, 700, 330], [9, 1, 0, 640, 330], 8, 2, 64)
dtype = torch.float32 if small else torch.bfloat16
gen = torch.Generator().manual_seed(0)
q = torch.randn(sum(lq), H, D, generator=gen).to(device, dtype).requires_grad_(True)
k = torch.randn(sum(lk), H_kv, D, generator=gen).to(device, dtype).requires_grad_(True)
v = torch.randn(sum(lk), H_kv, D, generator=gen).to(device, dtype).requires_grad_(True)
offsets = lambda ls: torch.tensor([0] + torch.tensor(ls).cumsum(0).tolist(), dtype=torch.int32, device=device)
cu_q, cu_k = offsets(lq), offsets(lk)
o = step08.attention_varlen(q, k, v, cu_q, cu_k, max(lq), max(lk), is_causal=True)
do = torch.randn_like(o)
o.backward(do)
G = H // H_kv
oq, ok = cu_q.tolist(), cu_k.tolist()
for b, (a, e, c, f) in enumerate(zip(oq, oq[1:], ok, ok[1:])):
    if e == a:
        print(f"sequence {b}: empty"); continue
    qs, ks, vs = q[a:e].transpose(0, 1), k[c:f].transpose(0, 1).repeat_interleave(G, 0), v[c:f].transpose(0, 1).repeat_interleave(G, 0)
    ref = reference_attention(qs, ks, vs, True)[0]
    dq, dk, dv = reference_backward(qs, ks, vs, do[a:e].transpose(0, 1), True)
    assert_close(o[a:e].transpose(0, 1), ref, name=f"O of sequence {b}")
    assert_close(q.grad[a:e].transpose(0, 1), dq, name=f"dQ of sequence {b}")
    assert_close(k.grad[c:f].transpose(0, 1), dk.view(H_kv, G, f - c, D).sum(1), name=f"dK of sequence {b}")
    print(f"sequence {b}: {e - a} queries, {f - c} keys: O, dQ, dK, dV match")

# %% [markdown]
# ## 4. Grouped-query attention: no copy, one sum
#
# Query head $h$ reads K/V head $h // G$: the forward needs nothing else, and a K/V head's tiles are
# read by $G$ programs (from L2, mostly). The KV cache of inference shrinks by $G$.
#
# The backward is where GQA costs thought: $dK$ and $dV$ of a K/V head are **sums** over its $G$
# query heads. Step 08's dK/dV program owns one (key tile, K/V head) and loops over the $G$ query
# heads, accumulating in its registers, so each dK/dV element is still written once, by one
# program, with no atomics. The alternative — dK per query head, summed afterwards — writes $G$
# times the memory.

# %% [markdown]
# ## 5. The recorded H200 figures
#
# `python bench/varlen_gpu.py --out results/h200/varlen` times a 16k-token ragged batch three ways:
# step 08 packed, SDPA's FLASH backend on the batch padded to its longest sequence, and dense step
# 06 on the same token count (its TFLOP/s are the kernels' ceiling here).

# %%
path = RESULTS / "varlen" / "varlen.json"
if path.exists():
    run = json.loads(path.read_text())
    print(run["machine"]["gpu"], run["machine"]["date"])
    for name in ("varlen", "padded", "dense"):
        print(f"{name:8s} {run['rows'][name]['ms']:7.3f} ms  {run['rows'][name]['useful_tflops']:6.1f} useful TFLOP/s")
    print("packed vs padded:", run["rows"]["varlen_vs_padded_speedup"], "x; packed TFLOP/s vs dense:",
          run["rows"]["varlen_vs_dense_tflops"])
    if "varlen_uniform" in run["rows"]:
        print(f"step 08 on the dense batch, packed: {run['rows']['varlen_uniform']['ms']:.3f} ms;",
              "forward alone, ms:", run["rows"]["forward_ms"])
else:
    print("no H200 run committed yet: python bench/varlen_gpu.py --out results/h200/varlen")

# %% [markdown]
# ### A sync per call
#
# The row `varlen_uniform` runs step 08 on exactly the dense row's work (8 sequences of 2048,
# packed). In the run at 4cbe841 (2026-12-01), its forward took **0.42 ms against dense step 06's 0.21** on the
# H200, with the same tiles and the same compiled code (same registers, same loop, checked by
# compiling both for sm_90). The difference was on the host: checking the values of `cu_seqlens`
# read them back with `.tolist()`, and each read is a **device synchronization**. The host then
# waits for the GPU at every call, and cannot queue the next launches while the kernels run: every
# microsecond of Python between calls becomes idle GPU time. This is why FlashAttention's
# `flash_attn_varlen_func` takes `max_seqlen` as a Python int instead of computing it from
# `cu_seqlens`. Step 08 now reads the values once per pair of tensors (one sync for all the checks),
# remembers the check while the same tensors come back unchanged (a model's layers and the backward
# pass the same ones), and never reads back offsets it built itself. `torch.cuda.set_sync_debug_mode("warn")`
# finds such syncs in your own code.

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
# - J. Ainslie et al., *GQA: Training Generalized Multi-Query Transformer Models from Multi-Head
#   Checkpoints*, 2023; N. Shazeer, *Fast Transformer Decoding: One Write-Head is All You Need*, 2019.
# - FlashAttention's `flash_attn_varlen_func`, for the packed layout this step copies.
#
# ## Exercises
#
# 1. The grid is sized for the longest sequence, so most programs of a batch with one long sequence
#    exit at once. How many programs launch for the batch of section 1 (tiles of 128 query rows,
#    H = 16), and how many do work?
# 2. FlashAttention aligns the causal mask of a varlen batch with $N_q \neq N_k$ at the bottom-right
#    (the last query sees every key); this course aligns it top-left, as SDPA does. Which index
#    computations of the kernels change, and which test would tell?
# 3. With $G = 8$ query heads per K/V head, what does the dK/dV program's loop over the group cost,
#    and what would one program per (key tile, query head) cost instead?
