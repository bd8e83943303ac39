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
# # Step 10 — attention across GPUs: ring attention on `torch.distributed`
#
# Steps 04–07 made one GPU's attention fast and its memory linear in $N$. At 128k tokens and beyond,
# one *sequence* no longer fits one GPU: not the attention matrix (FlashAttention never builds it)
# but the activations every layer keeps for the backward. Context parallelism splits the sequence
# over $W$ GPUs. Each rank keeps its rows of $Q$; the blocks of $K$ and $V$ travel around a ring.
#
# In this notebook you will:
# 1. count the memory of one long sequence, and what splitting it buys;
# 2. weigh the two designs, the ring against DeepSpeed-Ulysses' all-to-all, by their arithmetic;
# 3. see why causal attention needs the zigzag layout (drawn);
# 4. run your ring on 2 processes (gloo on a CPU) and check every rank against the float64 reference;
# 5. decide when to use PyTorch's own `context_parallel` instead.

# %%
# The one switch: "steps" runs your code (steps/), "solutions" the course's, or a path to a folder like steps/.
import os
IMPL = os.environ.get("ATTN_IMPL", "steps")

from attnlib.nb import setup
load_step, device, small = setup(IMPL)

# %%
import math
import torch
import matplotlib.pyplot as plt
from attnlib import make_qkv, reference_attention
from attnlib.compare import assert_close
from attnlib.dist import RankGroup
from attnlib.ringcheck import RingCase, check_ring, load_ring, positions
step10 = load_ring(IMPL)

# %% [markdown]
# ## 1. The memory of one sequence
#
# A model with hidden size 4096, 32 layers, 32 heads of 128, in bf16. Per layer, training keeps (at
# least) the layer input, $Q, K, V, O$ and the MLP's input and its 4× wider intermediate for the
# backward: about $(1 + 4 + 1 + 4 + 4)\cdot N \cdot 4096$ values, with activation checkpointing of
# the MLP aside. The weights (8B parameters: 16 GB in bf16, plus optimizer state elsewhere) do not
# depend on $N$; the activations grow linearly with it. An H200 has 141 GB.

# %%
hidden, layers, bytes_per = 4096, 32, 2
per_token_per_layer = 14 * hidden * bytes_per        # the 14 tensors of width 4096 above, bf16
print(f"{'N':>8} | activations, 1 GPU | per GPU, W=2 | W=4 | W=8")
for n in (32_768, 131_072, 262_144, 1_048_576):
    gb = n * per_token_per_layer * layers / 1e9
    print(f"{n:>8} | {gb:15.0f} GB | {gb / 2:9.0f} GB | {gb / 4:4.0f} | {gb / 8:4.0f}")

# %% [markdown]
# At 256k tokens one GPU would need about 960 GB of activations for this model; split over 8 GPUs,
# 120 GB each. Tensor parallelism splits the *hidden* dimension instead, and pipeline parallelism the
# layers; neither shrinks the $N$ that one attention call sees. Context parallelism does: each GPU
# holds $N/W$ rows of every activation. Attention is the one layer where rows meet other rows, so it
# is the one layer that must communicate.
#
# ## 2. Ring or all-to-all: the arithmetic
#
# **Ring** (this step). Rank $r$ keeps its $N/W$ queries. In $W$ steps it computes attention against
# its own K/V block, then against the block that arrived from rank $r-1$, while it sends the block it
# holds to rank $r+1$. Per step, per GPU: compute $4 (N/W)^2 H d$ FLOPs (full attention; half of that
# on each later causal zigzag step), send $2\cdot(N/W)\cdot H_{kv} d$ values ($K$ and $V$). The hop is
# hidden when sending one block takes less time than computing one:
#
# $$\frac{4 (N/W) H_{kv} d}{\text{link bytes/s}} \le \frac{4 (N/W)^2 H d \cdot c}{\text{FLOP/s}}
# \iff \frac{N}{W} \ge \frac{\text{FLOP/s}}{\text{link bytes/s}}\cdot\frac{H_{kv}}{H}\cdot\frac1c$$
#
# with $c = 1$ for full attention and $c = 1/2$ for the causal zigzag's half blocks (bf16: 2 bytes a
# value, folded in the 4 on the left). The shard must be long enough; the head dimension cancels.
#
# **DeepSpeed-Ulysses** (all-to-all). Each rank also starts with $N/W$ rows of every head. One
# all-to-all turns that into *all* $N$ rows of $H/W$ heads; each rank runs ordinary single-GPU
# attention on its heads; a second all-to-all turns the output back. Per GPU it moves $Q, K, V$ and
# $O$ once, $(W-1)/W$ of each: about $4\cdot 2 (N/W) H d$ bytes, a volume that *falls* as $W$ grows
# (the ring's total, $(W-1)\cdot 4 (N/W) H_{kv} d$, stays near $4 N H_{kv} d$). But it cannot start
# the attention before the all-to-all ends (no overlap without splitting the heads further), $W$ can
# be at most the number of heads (with GQA, of KV heads, or K/V are replicated), and the all-to-all
# wants a fast all-to-all network (NVLink within a node; across nodes it is the slow part).

# %%
def ring_vs_ulysses(n, w, h=32, h_kv=32, d=128, flops=800e12, link=450e9, causal=True):
    """Per GPU, one attention forward: compute time, ring's per-step hop time, Ulysses' all-to-all time."""
    shard = n / w
    c = 0.5 if causal else 1.0
    compute = 4 * n * shard * h * d * c / flops                 # this GPU's share of the attention FLOPs
    hop = 2 * shard * h_kv * d * 2 / link                        # K and V of one block, bf16
    step_compute = 4 * shard * shard * h * d * c / flops         # one (half) block
    a2a = 4 * shard * h * d * 2 * (w - 1) / w / link             # Q, K, V, O once each
    return compute, hop, step_compute, a2a

# H200: bf16 matmul measured 808 TFLOP/s (README); NVLink 4: 450 GB/s each way per GPU.
print("break-even shard length (hop = one block's compute), H = H_kv:",
      f"full {800e12 / 450e9:.0f} tokens, causal zigzag {2 * 800e12 / 450e9:.0f}; with GQA H/H_kv = 4: 4x shorter")
print(f"\n{'N':>7} {'W':>2} | {'attention':>9} | ring: hop / block compute | Ulysses all-to-all")
for n in (32_768, 131_072, 262_144):
    for w in (2, 8):
        comp, hop, step, a2a = ring_vs_ulysses(n, w)
        print(f"{n:>7} {w:>2} | {1e3 * comp:7.1f} ms | {1e3 * hop:6.2f} / {1e3 * step:7.2f} ms"
              f" ({'hidden' if hop < step else 'exposed'}) | {1e3 * a2a:6.2f} ms, not overlapped")

# %% [markdown]
# At these lengths the ring's hop is well below one block's compute, so with overlap it is free,
# except at 32k on 8 GPUs: 4k-token shards are near the break-even, and the hop is barely hidden.
# The all-to-all moves fewer bytes but they sit on the critical path (a few percent of the attention
# time here, more across nodes). Production systems combine them: Ulysses within a node over heads,
# the ring across nodes over the sequence (USP, and torchtitan's CP on top of FSDP/TP). Attention's
# FLOPs grow as $N^2$ and the ring's bytes as $N$: the longer the sequence, the easier the overlap.
#
# ## 3. Causal attention and the zigzag layout
#
# With contiguous shards, rank 0's queries are the first $N/W$: they see only rank 0's keys. Rank
# $W-1$'s queries see everything. In a ring every rank waits for the slowest at each step, so the
# causal ring would take as long as full attention. Zigzag: cut the sequence into $2W$ chunks and
# give rank $r$ chunks $r$ and $2W-1-r$: one early, one late. Below, each tile of the causal mask
# (query chunk × key chunk) is coloured by the rank that computes it.

# %%
W = 4
def owner_grid(world, layout):
    """(2W x 2W) grid of query chunk x key chunk: the rank that computes the tile, -1 if masked."""
    c = 2 * world
    grid = torch.full((c, c), -1.0)
    for r in range(world):
        chunks = [2 * r, 2 * r + 1] if layout == "contiguous" else [r, 2 * world - 1 - r]
        for qc in chunks:
            grid[qc, : qc + 1] = r
    return grid

fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
for ax, layout in zip(axes[:2], ("contiguous", "zigzag")):
    g = owner_grid(W, layout)
    ax.imshow(torch.where(g < 0, torch.nan, g), cmap="tab10", vmin=0, vmax=9)
    for i in range(2 * W):
        for j in range(2 * W):
            if g[i, j] >= 0:
                ax.text(j, i, int(g[i, j]), ha="center", va="center", fontsize=8)
    ax.set_title(f"{layout}: which rank computes each tile")
    ax.set_xlabel("key chunk"); ax.set_ylabel("query chunk")
work = {layout: [(owner_grid(W, layout) == r).sum().item() for r in range(W)] for layout in ("contiguous", "zigzag")}
x = torch.arange(W)
axes[2].bar(x - 0.2, work["contiguous"], 0.4, label="contiguous")
axes[2].bar(x + 0.2, work["zigzag"], 0.4, label="zigzag")
axes[2].set_xlabel("rank"); axes[2].set_ylabel("chunk tiles computed (diagonal tiles count 1)")
axes[2].set_title(f"causal work per rank, W = {W}"); axes[2].legend()
plt.tight_layout(); plt.show()
print("tiles per rank, contiguous:", work["contiguous"], " zigzag:", work["zigzag"])

# %% [markdown]
# With zigzag, at ring step $s > 0$ rank $r$ holds the block of rank $src = r - s \bmod W$, and
# exactly one of two things is true (`_block_plan`):
# * $src < r$: chunk $src$ precedes both of rank $r$'s chunks and chunk $2W-1-src$ follows both:
#   **all of $r$'s rows against the first half of the block**, no mask;
# * $src > r$: both of $src$'s chunks fall between rank $r$'s two: **the second half of $r$'s rows
#   against the whole block**, no mask.
#
# Either way, half a block: every rank does the same work at every step. Step 0 is the shard's own
# block with the ordinary top-left causal mask. Your `shard` and `unshard`:

# %%
x = torch.arange(16.0)[None, None, :, None]                 # row i holds the number i
for r in range(2):
    print(f"rank {r} of 2 holds rows", step10.shard(x, 2, r, is_causal=True)[0, 0, :, 0].int().tolist())
shards = [step10.shard(x, 4, r, is_causal=True) for r in range(4)]
print("W = 4:", [s[0, 0, :, 0].int().tolist() for s in shards])
assert torch.equal(step10.unshard(shards, is_causal=True), x)

# %% [markdown]
# ## 4. The merge, then the ring on two processes
#
# Each step gives rank $r$ a partial result: $O_s$, normalized over the keys of one block, and its
# $\mathrm{LSE}_s$. Two partial results combine exactly (this is step 04's online softmax, one level
# up):
#
# $$L = \log(e^{L_a} + e^{L_b}),\qquad O = e^{L_a - L} O_a + e^{L_b - L} O_b = O_a + \sigma(L_b - L_a)(O_b - O_a)$$
#
# Take the larger LSE out before the exponentials: with large scores an LSE passes 88.7 and $e^L$
# overflows float32.

# %%
q, k, v = make_qkv(1, 2, 8, 30, 16)
(oa, la), (ob, lb) = (reference_attention(q, k[..., s, :], v[..., s, :]) for s in (slice(0, 11), slice(11, 30)))
o, lse = reference_attention(q, k, v)
for shift in (0.0, 100.0):
    out, new_lse = step10.merge(oa.float(), (la + shift).float(), ob.float(), (lb + shift).float())
    assert_close(out, o, name="merged O", dtype=torch.float32)
    assert_close(new_lse, lse + shift, name="merged LSE", dtype=torch.float32, row_dim=-1)
    print(f"LSEs shifted by {shift:g}: merged O and LSE match attention over all 30 keys")

# %% [markdown]
# Now the ring itself. `RankGroup` starts 2 processes joined by `torch.distributed` with the
# `gloo` backend (on GPUs it would be NCCL, one process per GPU, started by `torchrun`). Every rank
# draws the same sequence, takes its rows, calls `ring_attention` forward and backward; `check_ring`
# compares each rank's $O$, LSE, $dQ$, $dK$, $dV$ with its rows of the float64 reference and, when
# one is wrong, says which rank, which rows and which ring bug it looks like.

# %%
group = RankGroup(world=2)
group.start()
for case in (RingCase(batch=(1, 2), n=64, d=16, is_causal=False),
             RingCase(batch=(1, 2), n=64, d=16, is_causal=True),
             RingCase(batch=(1, 2), n=40, d=16, is_causal=True, gain=25.0)):
    check_ring(group, case)
    print(f"{case.id}: every rank's O, LSE, dQ, dK, dV match;",
          "; ".join(f"rank {r} holds rows {positions(case.n, 2, r, case.is_causal).tolist()[:3]}..." for r in range(2)))

# %% [markdown]
# ### Overlap
#
# In `ring_forward` each step *posts* the next hop (`Ring.send_recv`: one `batch_isend_irecv` with a
# send to $r+1$ and a receive from $r-1$) before computing on the block it holds, and waits for the
# hop only afterwards. In the backward, $K, V$ travel again, and $dK, dV$ travel one hop behind them
# with their own tags: each rank adds its share to the block's gradient and passes it on; the last
# hop brings each block's gradient home. `tests/test_step10_ring.py` checks the order of these
# events on every rank. On two H200s, `bench/ring_gpu.py` measures the same loop with NCCL and saves a
# profiler trace in which the NCCL send/receive kernels run on their own stream under the attention
# kernels (`torchrun --nproc-per-node 2 bench/ring_gpu.py`; results in `results/h200/ring/`).
#
# Below, that run on two H200s joined by NVLink: per GPU, the ring against step 06 alone on a
# sequence as long as its shard, and against one GPU doing the whole sequence. Read the last column
# before you promise anyone a longer context: each GPU holds half the sequence, yet its peak memory is
# *higher* than one GPU's on the whole of it. The float32 dQ and the float32 dK, dV travelling
# around the ring (one set being added to, the next arriving) outweigh the half the shard saves:
# `results/h200/ring/README.md` counts them tensor by tensor.

# %%
import json
from IPython.display import Image, display
from attnlib.nb import REPO
ring_results = REPO / "results" / "h200" / "ring" / "ring.json"
if ring_results.exists():
    run = json.loads(ring_results.read_text())
    print(f"{run['machine']['gpu']} x {run['world']}, {run['machine']['date']}; B=1 H=16 D=64 bf16 causal, fwd+bwd")
    print(f"{'N':>7} {'ring ms':>9} {'TFLOP/s/GPU':>12} {'x step06@shard':>15} {'speed-up':>9} {'peak MiB ring/one GPU':>22}")
    for r in run["rows"]:
        print(f"{r['N']:>7} {r['ring_ms']:>9.1f} {r['ring_tflops_per_gpu']:>12.0f} {r['ratio_to_step06_shard']:>15.2f} "
              f"{r['speedup_over_one_gpu']:>8.2f}x {r['ring_peak_mib_rank0']:>11.0f} / {r['step06_whole_peak_mib']:.0f}")
    display(Image(filename=str(ring_results.with_name("ring.png"))))
else:
    print("not measured yet (bench/ring_gpu.py)")

# %% [markdown]
# ## 5. PyTorch's own context parallelism
#
# `torch.distributed.tensor.experimental.context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2])`
# shards the buffers *in place* along the sequence (load-balanced: the same head-and-tail chunks as
# zigzag, for every call) and, inside the context, replaces the CUDA SDPA operators (flash,
# memory-efficient, cuDNN) with ring versions. K/V rotate by all-gather (the default: every block
# gathered after the first local step) or by all-to-all (`set_rotate_method("alltoall")`, a pass to
# the next rank per step, like our ring). Does it run here, on a CPU with gloo?

# %%
# torchrun starts 2 gloo processes; each runs SDPA inside context_parallel on its shard and compares
# its rows with the float64 reference (attnlib/ringcheck.py, _torch_cp_main).
group.close()
import subprocess, sys
run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "attnlib.ringcheck"],
                     cwd=REPO, capture_output=True, text=True, timeout=300,
                     env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1"))
print("\n".join(sorted(line for line in run.stdout.splitlines() if line.startswith("rank"))) or run.stderr[-2000:])

# %% [markdown]
# On a CPU (torch 2.13, gloo) full attention gives the right rows but does not go through the ring
# (the CPU SDPA operator is not one of the three it replaces), and causal raises
# `NotImplementedError` (*"Operator aten._scaled_dot_product_flash_attention_for_cpu.default does not
# have a sharding strategy registered"*). It is a GPU tool. (It runs under `torchrun` here, not inside
# `RankGroup`'s workers, where the `context_parallel` call hung on gloo; the ring's jobs run in both.)
#
# **Use `context_parallel`** when your model calls `F.scaled_dot_product_attention` and trains with
# torchtitan or FSDP2/TP on a `DeviceMesh`: no model change, the load balancing and the rotation are
# configuration, and its backward is tested with PyTorch's own kernels.
# **Write the ring yourself** (this step) when the attention kernel is yours (step 06's, a custom
# mask, a new precision), when you need to see or change the schedule (which hop overlaps which
# block, what dtype the gradients travel in), or when your stack is not DTensor. **Ulysses**, when
# the heads outnumber the GPUs and the GPUs share NVLink; the ring across nodes.

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
# - H. Liu, M. Zaharia, P. Abbeel, *Ring Attention with Blockwise Transformers for Near-Infinite
#   Context*, 2023; zhuzilin/ring-flash-attention (ring, zigzag and stripe schedules).
# - S. A. Jacobs et al., *DeepSpeed Ulysses*, 2023; PyTorch's `context_parallel`
#   (`torch.distributed.tensor.experimental`).
#
# ## Exercises
#
# 1. With contiguous causal shards on $W$ ranks, how much work does the last rank do against the
#    first, and what does the zigzag assignment (chunks $r$ and $2W - 1 - r$) give each rank?
# 2. When can the ring hide its communication: compare the bytes one hop sends with the FLOPs of the
#    block computed meanwhile, as a function of the shard length $N/W$.
