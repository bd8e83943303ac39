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
# # Step 09 — sliding window + global tokens (block-sparse attention)
#
# At 64k tokens the causal score matrix has two billion entries per head; long-context models
# (Longformer, BigBird, Mistral's sliding window) keep only a band of width `window` around the
# diagonal, plus a few *global* tokens that see and are seen by everyone. A kernel that visits only
# the tiles with something visible does work proportional to $N \cdot \text{window}$, not $N^2$.
#
# In this notebook you will:
# 1. state the pattern once (`visible`), and draw it with the tiles a kernel visits;
# 2. count the work saved;
# 3. check your `steps/step09_sparse.py` against the float64 reference with the explicit mask;
# 4. see why a row can have seen nothing yet, and the one-line guard the online softmax needs.

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
from attnlib import make_qkv, make_dout
from attnlib.compare import assert_close
from attnlib.reference import reference_attention, reference_backward
from attnlib.nb import REPO
step09 = load_step(9)
RESULTS = REPO / "results" / "h200"

# %% [markdown]
# ## 1. One statement of the pattern
#
# $$\text{visible}(i, j) = |i - j| < w \;\lor\; j < g \;\lor\; i < g \quad(\land\; j \le i \text{ if causal})$$
#
# `visible` in `step09_sparse.py` is a `@triton.jit` function the kernels call on tiles of indices;
# its plain-Python body (`visible.fn`) runs on index tensors too, which is how `step09.mask` builds
# the boolean matrix the float64 reference uses. One statement, two uses: the idea behind
# FlexAttention's `mask_mod`. Below, the mask of a 96-token sequence and the 16 x 16 tiles a
# forward program visits (outlined: visited; shaded darker: masked boundary tiles).

# %%
N, w, g, T = 96, 12, 5, 16
m = step09.mask(N, N, w, g, True)
fig, ax = plt.subplots(figsize=(4.5, 4.5))
ax.imshow(m, cmap="Blues", vmin=0, vmax=1.6)
for i0 in range(0, N, T):
    for j0 in range(0, N, T):
        tile = m[i0:i0 + T, j0:j0 + T]
        if tile.any():
            ax.add_patch(plt.Rectangle((j0 - .5, i0 - .5), T, T, fill=not bool(tile.all()), alpha=0.15,
                                       edgecolor="k", facecolor="k", lw=0.8))
ax.set_xlabel("key j"); ax.set_ylabel("query i"); ax.set_title(f"window {w}, {g} global tokens, causal")
plt.show()
visited = sum(bool(m[i:i + T, j:j + T].any()) for i in range(0, N, T) for j in range(0, N, T))
print(f"tiles visited {visited} of {(N // T) ** 2}; fully visible (no mask): "
      f"{sum(bool(m[i:i + T, j:j + T].all()) for i in range(0, N, T) for j in range(0, N, T))}")

# %% [markdown]
# ## 2. The work saved
#
# Per query: `window` keys (half of a two-sided band when causal) plus the global ones, against $N$
# (or $N/2$) for dense attention; the ratio grows with $N$ at a fixed window:

# %%
for n in (8192, 16384, 65536):
    for win in (256, 4096):
        dense = n * (n + 1) / 2
        band = sum(min(i + 1, win) for i in range(0, n, 64)) * 64
        print(f"N {n:6d}, window {win:5d}: {dense / band:6.1f}x fewer score entries than causal dense")

# %% [markdown]
# ## 3. Check your kernels

# %%
B, H, n, D = (1, 2, 131, 16) if small else (2, 8, 2000, 64)
win, glob = (9, 5) if small else (256, 16)
dtype = torch.float32 if small else torch.bfloat16
q, k, v = make_qkv(B, H, n, n, D, dtype=dtype, device=device, requires_grad=True)
for causal in (False, True):
    q.grad = k.grad = v.grad = None
    o = step09.attention_sparse(q, k, v, win, glob, is_causal=causal)
    do = make_dout(o)
    o.backward(do)
    mk = step09.mask(n, n, win, glob, causal, device=device)
    ref, _ = reference_attention(q, k, v, mask=mk)
    assert_close(o, ref, name="O")
    for name, t, r in zip(("dQ", "dK", "dV"), (q, k, v), reference_backward(q, k, v, do, mask=mk)):
        assert_close(t.grad, r, name=name)
    print(f"{'causal' if causal else 'full  '}: O, dQ, dK, dV match the float64 reference")

# %% [markdown]
# ## 4. A row that has seen nothing yet
#
# Dense causal attention visits key 0 first, and every row sees key 0: after the first tile every
# running max $m$ is finite. Here a query tile's first visited key tile can lie entirely before some
# rows' windows: for those rows the tile's scores are all $-\infty$, the running max stays $-\infty$,
# and $\exp_2(s - m)$ becomes $\exp_2(-\infty + \infty)$ = NaN. The guard: where $m_\text{new}$ is
# still $-\infty$, subtract 0 instead; $p$ and $\alpha$ are then 0, as they should be.
#
# ## 5. On the H200: stages, registers, and FlexAttention
#
# The first version of these kernels ran one loop per range with an `if` on each tile: mask it or
# not. Correct, and slow: compiled for sm_90, the dK/dV kernel needed more registers than the 128 its
# tiles allow for two programs per SM and **spilled 308 bytes a thread** to local memory, and the
# forward and dQ kernels ran one program per SM. The fix is the one step 05 used for the causal
# diagonal: walk each range in three stages, masked / unmasked / masked, with `MASKED` a compile-time
# flag, so the interior stage carries no mask code at all. For a range of key tiles the full ones
# form one run, whose bounds are a few integer operations (`_full_keys`, `_full_queries`: a window
# edge, the diagonal, a global token's edge, the sequence's end); a bound that is off only costs
# speed when it is too tight and correctness when it is too loose, and the tests check both, tile by
# tile, against the explicit mask. Then tiles and register caps of its own (`sparse_fwd_config`,
# `sparse_bwd_config`), each measured on the H200 (`bench/experiments/sparse_bwd_tiles.py`).
# Below, the latest run against FlexAttention, and the one before the change.

# %%
path = RESULTS / "sparse" / "sparse.json"
if path.exists():
    run = json.loads(path.read_text())
    print(run["machine"]["gpu"], "| B=1 H=16 D=64 bf16 causal | step 09 against compiled FlexAttention, same pattern")
    print(f"{'N':>6} {'window':>6} {'global':>6} | {'fwd ms':>7} {'Flex':>7} {'x Flex':>6} | {'fwd+bwd':>7} {'Flex':>7} {'x Flex':>6}")
    for r in run["rows"]:
        if r.get("status") != "ok":
            print(f"{r['N']:>6} {r['window']:>6} {r['n_global']:>6} | {r.get('status')}")
            continue
        f, b = r["fwd"], r["fwd+bwd"]
        print(f"{r['N']:>6} {r['window']:>6} {r['n_global']:>6} | {f['step09_ms']:>7.3f} {f['flex_ms']:>7.3f} "
              f"{f['speedup_vs_flex']:>6.2f} | {b['step09_ms']:>7.3f} {b['flex_ms']:>7.3f} {b['speedup_vs_flex']:>6.2f}")
    print("results/h200/sparse/README.md: what changed run to run, and where the gap left is")
    before = RESULTS / "sparse" / "sparse_8e14917.json"
    if before.exists():
        print("\nx Flex before the split of the global tiles, the stages and step 09's own tiles (8e14917):")
        for r in json.loads(before.read_text())["rows"]:
            if r.get("status") == "ok" and r["N"] >= 16384:
                print(f"{r['N']:>6} {r['window']:>6} {r['n_global']:>6} | fwd {r['fwd']['speedup_vs_flex']:>5.2f}"
                      f" | fwd+bwd {r['fwd+bwd']['speedup_vs_flex']:>5.2f}")
else:
    print("no H200 run committed yet: python bench/sparse_gpu.py --out results/h200/sparse")

# %% [markdown]
# **What a masked tile costs.** At window 256 and no global token, four of the six key tiles a query tile
# visits run the masked stage, and FlexAttention's forward won (0.85x; results/h200/sparse/README.md).
# ncu said step 09's forward issued about 1.45x FlexAttention's instructions, with nothing waiting on
# memory. Which ones? No GPU is needed to look: Triton compiles for sm_90 on a laptop, and
# `bench/experiments/sparse_mask_sass.py` counts the instructions of every loop in the machine code. An
# unmasked iteration of the forward is 320 of them a thread (8 `HGMMA`, 34 `MUFU.EX2`, the softmax's
# arithmetic); a masked one was 780, and 369 without the window test. Most of the difference was `visible`
# written as `(q - k) < W` and `(k - q) < W`: a subtraction per *pair*. Work that depends only on the row
# belongs outside the per-pair arithmetic: `k > q - W` and `k < q + W` compute q - W and q + W once per row
# (q_idx is a column of rows), and the masked iteration drops to 612 (dQ 731 to 559). On the H200 the
# forward got 5-9% faster and the forward + backward 3-6% where the two timing passes agreed
# (`sparse_visible_ab.py`, all three forms in one process).
#
# Fewer instructions is not always faster. A third statement, one causal left edge per row
# (`(k > edge or k < g) and k <= q`), is shorter still in every kernel (forward 516) and made the forward
# another 3-10% faster, past FlexAttention at window 256, but the backward 6-18% *slower*: the count of a
# loop body does not say how the compiler schedules the matrix products around it. Step 09 keeps the
# second form; the third is an open question for a profiler (`--solutions` compiles another copy of the
# steps, so you can count your own).

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
# - I. Beltagy, M. Peters, A. Cohan, *Longformer: The Long-Document Transformer*, 2020.
# - M. Zaheer et al., *Big Bird: Transformers for Longer Sequences*, 2020.
# - PyTorch's FlexAttention (`torch.nn.attention.flex_attention`): `mask_mod` and `create_block_mask`.
#
# ## Exercises
#
# 1. `_full_keys` and `_full_queries` let interior tiles skip the mask. Roughly what fraction of the
#    visited tiles is masked, and how does it change with the window at a fixed tile size? Which
#    bound would you loosen by one, and which test catches it (`tests/test_step09_sparse.py`)?
# 2. Make global tokens *not* see everything (only be seen): which of `visible`, `_key_ranges` and
#    `_query_ranges` change? Which test fails first if you change only `visible`?
# 3. Dilated windows (every $d$-th key within $w \cdot d$): write its `visible`, and say which tiles
#    the schedule must visit and which can skip the mask.
