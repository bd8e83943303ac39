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
# # Step 04 — FlashAttention-2 in pure PyTorch
#
# Steps 01–03 computed attention with the full $N_q \times N_k$ score matrix in memory (or handed the
# job to PyTorch's fused kernels). This step computes the same function **one tile at a time**, in plain
# PyTorch, so every intermediate can be printed:
#
# - the forward walks over key tiles, keeping for each query row a running max $m$, a running sum $\ell$
#   and an output accumulator, rescaled whenever the max grows (the *online softmax*);
# - it saves only $Q, K, V, O$ and one number per row, $L = m + \log \ell$;
# - the backward rebuilds every probability from $L$, tile by tile.
#
# In this notebook you will:
# 1. work the online-softmax identity by hand on eight numbers, against `torch.softmax`;
# 2. check your `steps/step04_flash_torch.py` against the float64 reference;
# 3. see which causal tiles are skipped, and count the FLOPs saved;
# 4. measure peak memory and time against $N$, naive against tiled;
# 5. work out why the backward recomputes $P$ instead of storing it.

# %%
# The one switch: "steps" runs your code (steps/), "solutions" the course's, or a path to a folder like steps/.
import os
IMPL = os.environ.get("ATTN_IMPL", "steps")

from attnlib.nb import setup
load_step, device, small = setup(IMPL)

import math, time
import torch
import matplotlib.pyplot as plt
from attnlib import make_qkv, make_dout, reference_attention
from attnlib.checks import check_attention, check_lse
step01 = load_step(1)
step04 = load_step(4)
torch.backends.cuda.matmul.allow_tf32 = False     # fp32 means fp32 in the checks below

# %% [markdown]
# ## 1. The online softmax, by hand
#
# Softmax needs the row's maximum (for stability) and the row's sum before it can write one
# probability. The online version reads the row in blocks and keeps two numbers: the max $m$ seen
# so far and $\ell = \sum_j e^{s_j - m}$ over the scores seen so far. When a block raises the max from
# $m$ to $m'$, every term already in $\ell$ was computed against the old max and is too large by
# $e^{m' - m}$, so
#
# $$\ell' = e^{m - m'}\,\ell + \sum_{j \in \text{block}} e^{s_j - m'} .$$
#
# Eight scores, in blocks of three (the last block is partial on purpose):

# %%
s = torch.tensor([0.5, -1.0, 2.0, 0.0, 3.5, 1.0, -2.0, 3.0])
blocks = s.split(3)
m, l = torch.tensor(-math.inf), torch.tensor(0.0)
for i, b in enumerate(blocks):
    m_new = torch.maximum(m, b.max())
    alpha = torch.exp(m - m_new)                  # how much the old terms shrink
    l = alpha * l + torch.exp(b - m_new).sum()
    print(f"block {i} {b.tolist()}: max {m.item():5.2f} -> {m_new.item():4.2f}, "
          f"alpha = exp(m - m_new) = {alpha.item():.4f}, l = {l.item():.4f}")
    m = m_new

print(f"\nm = {m.item()} = max(s); l = {l.item():.6f} = sum(exp(s - max)) = {torch.exp(s - s.max()).sum().item():.6f}")
online = torch.exp(s - m) / l
print("max |online - torch.softmax| =", (online - torch.softmax(s, 0)).abs().max().item())
print(f"L = m + log(l) = {(m + torch.log(l)).item():.6f}; torch.logsumexp = {torch.logsumexp(s, 0).item():.6f}")

# %% [markdown]
# Attention needs more than the probabilities: it needs $\sum_j p_j v_j$. The same rescaling applies to
# an accumulator $a = \sum_j e^{s_j - m} v_j$, and the output is $a / \ell$ at the end. Here are the same
# eight scores with a value vector per key, folded block by block with **your**
# `online_softmax_update` and `finalize` (the functions in `steps/step04_flash_torch.py`), against
# `torch.softmax(s) @ v`. Then the same fold without the rescale, to see what the rescale is for.

# %%
v = torch.arange(16, dtype=torch.float32).reshape(8, 2)          # 8 keys, D = 2
m, l, acc = torch.full((1,), -math.inf), torch.zeros(1), torch.zeros(1, 2)
for sb, vb in zip(s.split(3), v.split(3)):
    m, l, acc = step04.online_softmax_update(m, l, acc, sb[None, :], vb)
o, lse = step04.finalize(m, l, acc)
print("online :", o[0].tolist(), " L =", round(lse.item(), 6))
print("softmax:", (torch.softmax(s, 0) @ v).tolist())

# The classic bug: forget to rescale the accumulator when the max grows.
m, l, acc = torch.tensor(-math.inf), torch.tensor(0.0), torch.zeros(2)
for sb, vb in zip(s.split(3), v.split(3)):
    m_new = torch.maximum(m, sb.max())
    p = torch.exp(sb - m_new)
    l = torch.exp(m - m_new) * l + p.sum()
    acc = acc + p @ vb                                           # <- no exp(m - m_new)
    m = m_new
print("no rescale of acc:", (acc / l).tolist(), " (wrong: the first block weighs e^1.5 too much)")

# %% [markdown]
# ## 2. Your implementation, checked
#
# `attention` processes all query tiles together and loops over key tiles only (the one loop the
# online softmax needs); `attention_loops` is the double loop, one $B_q \times B_k$ tile at a time, as one
# GPU program would. Both share your tile functions. Tile sizes that divide nothing, on purpose.

# %%
from functools import partial
for nq, nk in [(17, 17), (100, 33), (33, 100), (1, 1)]:
    q, k, v = make_qkv(2, 3, nq, nk, 32)
    for causal in (False, True):
        for fn in (step04.attention, step04.attention_loops):
            check_attention(partial(fn, block_q=16, block_k=8), q, k, v, is_causal=causal)
        _, lse = step04.attention_with_lse(q, k, v, is_causal=causal, block_q=16, block_k=8)
        check_lse(lse, q, k, v, is_causal=causal)
print("O, LSE, dQ, dK, dV match the float64 reference, both versions, causal and not")

# %% [markdown]
# ## 3. Causal: skip whole tiles, mask only the diagonal
#
# Query $i$ sees key $j$ only if $j \le i$. A tile whose every key comes after every query is all
# $-\infty$: it is **skipped**, not masked. A tile whose every key comes before every query needs no
# mask. Only the tiles the diagonal crosses build a small mask. The map below is
# `step04.causal_tile` for $N = 200$ and tiles of 32 (`.` skipped, `M` masked, `#` full; rows are
# query tiles, columns key tiles).

# %%
N, B = 200, 32
starts = range(0, N, B)
print("      keys " + "".join(f"{k0:>4}" for k0 in starts))
for q0 in starts:
    kinds = [step04.causal_tile(q0, min(q0 + B, N), k0, min(k0 + B, N)) for k0 in starts]
    print(f"q {q0:>3}-{min(q0 + B, N) - 1:<3}  " + "".join(f"{ {'skip': '.', 'mask': 'M', 'full': '#'}[x]:>4}" for x in kinds))

from torch.utils.flop_counter import FlopCounterMode
def matmul_flops(fn):
    with FlopCounterMode(display=False) as fc:
        fn()
    return fc.get_total_flops()
q, k, v = make_qkv(1, 2, 256, 256, 64, requires_grad=True)
f = {c: matmul_flops(lambda: step04.attention(q, k, v, is_causal=c, block_q=32, block_k=32).backward(make_dout(q)))
     for c in (False, True)}
print(f"\ncausal / full matmul FLOPs, forward + backward, N=256, tiles of 32: {f[True] / f[False]:.3f} "
      f"(T = 8 tiles a side: (T+1)/2T = {9 / 16:.3f})")

# %% [markdown]
# ## 4. Peak memory and time against N
#
# How memory is measured: on a GPU, the allocator's peak (`torch.cuda.max_memory_allocated`) minus
# what was allocated before the call. On a CPU there is no such counter, so we watch every operation
# with a `TorchDispatchMode`: each new storage adds its bytes, and a finalizer subtracts them when the
# storage is freed. The peak of that running total is the CPU's peak of live intermediates; the inputs
# are not counted. Forward and backward are measured together (`out.backward(dO)`).
#
# Time: on a GPU, the median of `triton.testing.do_bench`; on a CPU, the fastest of a few runs, because
# a shared CPU adds noise that only ever makes a run slower. Trust the GPU numbers for speed.

# %%
from attnlib.memory import LiveBytes          # counts live storages under a TorchDispatchMode

def fwd_bwd(fn, q, k, v, do):
    q.grad = k.grad = v.grad = None
    fn(q, k, v, is_causal=True).backward(do)

def peak_bytes(fn, q, k, v, do):
    if device == "cuda":
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fwd_bwd(fn, q, k, v, do); torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    with LiveBytes() as w:
        fwd_bwd(fn, q, k, v, do)
    return w.peak

def time_ms(fn, q, k, v, do):
    if device == "cuda":
        from triton.testing import do_bench
        return do_bench(lambda: fwd_bwd(fn, q, k, v, do), return_mode="median")
    # On a CPU shared with other work, the fastest of a few runs is the least disturbed one.
    fwd_bwd(fn, q, k, v, do)                       # warm-up
    ts, budget = [], time.perf_counter() + 0.5
    while len(ts) < 3 or (len(ts) < 7 and time.perf_counter() < budget):
        t = time.perf_counter(); fwd_bwd(fn, q, k, v, do); ts.append((time.perf_counter() - t) * 1e3)
    return min(ts)

H, D = (4, 64) if small else (16, 64)
Ns = [256, 512, 1024, 2048] if small else [1024, 2048, 4096, 8192, 16384]
dtype = torch.float32 if small else torch.bfloat16
impls = {"naive (step 01)": step01.attention,
         "step 04, Bk=64": partial(step04.attention, block_q=64, block_k=64)}
mem, ms = {n: [] for n in impls}, {n: [] for n in impls}
for N in Ns:
    q, k, v = make_qkv(1, H, N, N, D, dtype=dtype, device=device, requires_grad=True)
    do = make_dout(q)
    for name, fn in impls.items():
        mem[name].append(peak_bytes(fn, q, k, v, do) / 2**20)
        ms[name].append(time_ms(fn, q, k, v, do))
    print(f"N={N:6d}  " + "   ".join(f"{n}: {mem[n][-1]:8.1f} MiB {ms[n][-1]:8.1f} ms" for n in impls))

# %%
fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
for name in impls:
    a1.plot(Ns, mem[name], "o-", label=name)
    a2.plot(Ns, ms[name], "o-", label=name)
a1.plot(Ns, [H * n * n * torch.finfo(dtype).bits / 8 / 2**20 for n in Ns], "k:", label="one N×N matrix, all heads")
for a, t in ((a1, "peak memory of intermediates (MiB)"), (a2, "forward + backward (ms)")):
    a.set_xscale("log", base=2); a.set_yscale("log"); a.set_xlabel("N"); a.set_title(t); a.legend(fontsize=8)
fig.suptitle(f"B=1, H={H}, D={D}, {str(dtype).replace('torch.', '')}, causal, {device}")
plt.tight_layout(); plt.show()
r = mem["naive (step 01)"][-1] / mem["step 04, Bk=64"][-1]
print(f"at N={Ns[-1]}: naive needs {r:.0f}x the memory of step 04")

# %% [markdown]
# Read the two panels separately.
#
# - **Memory**: the naive line climbs with slope 2 on this log-log plot (quadratic); step 04's climbs with
#   slope 1: its largest intermediates are $N_q \times B_k$ strips, so doubling $N$ doubles them.
# - **Time**: do not read more into it than it says. Step 04 does at most the naive FLOPs in the
#   forward (half, causal: it skips the tiles above the diagonal, while step 01 computes them and masks
#   them) and more in the backward (it recomputes $S$), in many small operations launched from a Python
#   loop. On a CPU the cache-sized strips can win at large $N$; on a GPU a few large cuBLAS calls are hard
#   to beat from Python. Either way every operation of the loop still writes its strip to memory and
#   reads it back: keeping a tile on chip from the first matrix product to the last is what the Triton
#   and CUDA kernels of steps 05–07 add. `bench/step04_figures.py` measures both versions, compiled and
#   not, on a GPU.

# %% [markdown]
# ### What `dynamic=True` does not promise
#
# The compiled version (`attention_compiled`) hands each strip step to `torch.compile(..., dynamic=True)`
# so that one graph can serve every length and offset. It still compiles again whenever a guard recorded on
# an earlier call fails, and *duck sizing* records such guards: two sizes that are equal on a call get one
# symbol and are assumed equal from then on. At the tests' shapes (B=1, H=2, D=32, tiles of 16; N=100
# causal, then 17 queries against 40 keys) one process compiles 6 forward and 6 backward graphs (a CPU,
# torch 2.13, `TORCH_LOGS=recompiles`): no mask; the strip starting at row 0 (the whole tensor, contiguous);
# a later strip; a diagonal band that covers every row of its strip; and two that are coincidences -- a
# view's storage offset that happened to equal the tile size (16) or D (32). Dynamo duck-sizes storage
# offsets and no public switch turns that off. A version whose steps took whole tensors and integer offsets and
# sliced inside (tried on 2026-12-02) made 4 + 4 graphs, but compiled about 10% slower from a cold cache on a
# 2-core CPU, so the course keeps the views. Run with `TORCH_LOGS=recompiles` to watch it happen, and expect a compiled loop to
# compile more than once.

# %% [markdown]
# ### Recorded on an H200
#
# The same comparison at the sizes (B=1, H=16, D=64, causal, N = 1k, 4k, 16k, fp32 and bf16,
# with the compiled versions), run by `bench/step04_figures.py` on an H200 and committed in
# `results/h200/step04/`. Memory is what each call needs on top of its inputs.

# %%
import json
from IPython.display import Image, display
from attnlib.nb import REPO
fig_dir = REPO / "results" / "h200" / "step04"
rec = json.loads((fig_dir / "step04_figures.json").read_text())
print(f"{rec['machine']['gpu']}, torch {rec['machine']['torch']}\n")
print(f"{'impl':16s} {'mode':8s} {'dtype':9s} {'N':>6s} {'ms':>9s} {'peak MiB':>9s}")
for r in rec["rows"]:
    if r["N"] == 16384:
        ms = f"{r['ms']:9.1f}" if r["ms"] else f"{'-':>9s}"
        mib = f"{r['peak_mib']:9.0f}" if r["peak_mib"] else f"{'-':>9s}"
        print(f"{r['impl']:16s} {r['mode']:8s} {r['dtype']:9s} {r['N']:6d} {ms} {mib}  {'' if r['status'] == 'ok' else r['status']}")
display(Image(filename=str(fig_dir / "step04_figures.png"), width=900))


# %% [markdown]
# At N = 16k step 04 needs 23-73x less memory than naive attention (more in fp32, whose naive
# score matrices are twice as large), and its peak grows 16x from N = 1k to 16k: linear. It is not
# faster: at 16k it beats naive only in the fp32 forward (59 against 69 ms) and takes 1.2-2.7x
# naive's time elsewhere, since a Python loop of PyTorch calls cannot keep a tile on chip. Compiling
# its strip steps trims the forward + backward by 18% (206 to 169 ms) and its peak by 17-37%;
# compiling the naive version fuses the softmax and halves its time and memory, which stays
# quadratic.

# %% [markdown]
# ## 5. Why the backward recomputes P instead of storing it
#
# The backward needs $P$ to form $dV = P^\top dO$ and $dS = P \circ (dP - D)$. Storing it costs one
# $N \times N$ matrix per head; recomputing it costs one more matrix product $QK^\top$ and an `exp`,
# from $Q$, $K$ and the saved $L$. First, what autograd actually keeps, counted with a
# `saved_tensors_hooks` that adds up the bytes of everything saved for the backward:

# %%
def saved_bytes(fn, q, k, v):
    seen = {}                                      # one entry per storage: P is saved by two ops
    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes(); return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(q, k, v, is_causal=True)
    return sum(seen.values())

N = 1024
q, k, v = make_qkv(1, 4, N, N, 64, requires_grad=True)
print(f"saved for the backward at B=1, H=4, N={N}, D=64, fp32:")
print(f"  naive : {saved_bytes(step01.attention, q, k, v) / 2**20:7.2f} MiB  (P: {4 * N * N * 4 / 2**20:.0f} MiB, the N x N mask, Q, K, V)")
print(f"  step04: {saved_bytes(step04.attention, q, k, v) / 2**20:7.2f} MiB  (Q, K, V, O and L)")

# %% [markdown]
# Now the arithmetic at the size the course benchmarks, $B=1$, $H=16$, $N=16384$, $D=64$, in bf16 on an
# H200 (about 4.8 TB/s of HBM bandwidth and about 990 dense bf16 TFLOP/s; round numbers from the data
# sheet, not measured here):

# %%
B, H, N, D, bytes_per = 1, 16, 16384, 64, 2
hbm, tflops = 4.8e12, 990e12
P_bytes = B * H * N * N * bytes_per
L_bytes = B * H * N * 4
recompute_flops = 2 * B * H * N * N * D            # one more Q K^T in the backward
print(f"store P : {P_bytes / 2**30:6.2f} GiB held from forward to backward; "
      f"written once and read once: {2 * P_bytes / hbm * 1e3:.2f} ms of HBM traffic at best")
print(f"store L : {L_bytes / 2**20:6.2f} MiB")
print(f"recompute S = QK^T: {recompute_flops / 1e12:.2f} TFLOP = {recompute_flops / tflops * 1e3:.2f} ms at peak; "
      f"backward FLOPs go from 2.0x to 2.5x the forward's")
print(f"memory ratio P / L = {P_bytes / L_bytes:,.0f} (= N * bytes_per / 4)")

# %% [markdown]
# Recomputing costs about 25% more backward arithmetic and saves 8 GiB per layer, and on a GPU it is
# not even slower: moving $P$ through HBM twice takes longer than recomputing it from tiles that are
# already on chip. The one extra thing the forward must keep is $L$, one float per row.
#
# The last piece of the backward, $D_i = \sum_j P_{ij}\, dP_{ij}$, needs no $P$ either: since
# $O = PV$ and $dP = dO\,V^\top$, it equals $\sum_d dO_{id}\, O_{id}$ — one row-wise dot product of two
# $N \times D$ matrices, which is what your `delta` computes:

# %%
q, k, v = make_qkv(1, 2, 50, 40, 16, dtype=torch.float64)
o, L = reference_attention(q, k, v)
do = make_dout(o)
P = torch.exp(q @ k.transpose(-2, -1) / 4 - L[..., None])             # scale = 1/sqrt(16)
dP = do @ v.transpose(-2, -1)
print("max |rowsum(P * dP) - delta(O, dO)| =", ((P * dP).sum(-1) - step04.delta(o, do)).abs().max().item(),
      "(delta works in float32)")

# %% [markdown]
# ## 6. The backward, derived
#
# The forward, for one (batch, head): $S = \text{scale}\cdot QK^\top$, $P = \mathrm{softmax}(S)$ row by
# row, $O = PV$. Given $dO = \partial \mathcal{L} / \partial O$, walk it back one operation at a time.
#
# **Through $O = PV$.** A matrix product: $dV = P^\top dO$ and $dP = dO\, V^\top$.
#
# **Through the softmax.** Take one row: $p = \mathrm{softmax}(s)$, $p_j = e^{s_j} / \sum_k e^{s_k}$.
# Differentiating,
#
# $$\frac{\partial p_j}{\partial s_k} = p_j(\delta_{jk} - p_k), \qquad
# J = \mathrm{diag}(p) - p\,p^\top .$$
#
# The chain rule gives $ds_k = \sum_j dp_j\, \partial p_j / \partial s_k
# = p_k\, dp_k - p_k \sum_j p_j\, dp_j$, that is
#
# $$dS = P \circ (dP - D), \qquad D_i = \sum_j P_{ij}\, dP_{ij} .$$
#
# $D$ is one number per query row; section 5 showed it equals $\sum_d dO_{id}\, O_{id}$, so it needs no
# $P$. The row's $J$ is never built: $J^\top dp = p \circ (dp - p^\top dp)$ costs $O(N)$, not $O(N^2)$.
#
# **Through $S = \text{scale}\cdot QK^\top$.** Another product: $dQ = \text{scale}\cdot dS\,K$ and
# $dK = \text{scale}\cdot dS^\top Q$.
#
# **Tiles.** Every product above is a sum over keys ($dQ$) or over queries ($dK$, $dV$), so it splits
# over tiles: a tile of query rows and key rows contributes its share, and the shares add. With
# $P$ rebuilt from the saved $L$ ($P = e^{S - L}$, exact, no running max needed), one tile needs only
# its own rows of $Q$, $K$, $V$, $dO$, $L$ and $D$. That is `backward_tile`.
#
# First the Jacobian, checked against autograd on a row of four scores:

# %%
s_row = torch.tensor([0.3, -1.2, 2.0, 0.5], dtype=torch.float64)
p_row = torch.softmax(s_row, 0)
J = torch.diag(p_row) - torch.outer(p_row, p_row)
J_autograd = torch.autograd.functional.jacobian(lambda x: torch.softmax(x, 0), s_row)
print("max |J - autograd's Jacobian| =", (J - J_autograd).abs().max().item())
dp_row = torch.tensor([1.0, 0.0, -2.0, 0.5], dtype=torch.float64)
print("J^T dp           :", (J.T @ dp_row).tolist())
print("p * (dp - p . dp):", (p_row * (dp_row - p_row @ dp_row)).tolist())

# %% [markdown]
# Now **your** `backward_tile` alone, on a problem small enough to read: 3 query rows, 4 keys, $D = 2$,
# cut into two key tiles of 2. Each tile gets its rows of $K$, $V$; the query rows' $L$ and $D$ come
# from the whole row. The shares of $dQ$ must add up to autograd's $dQ$, and each tile's $dK$, $dV$
# are its own keys' gradients.

# %%
g = torch.Generator().manual_seed(0)
q3, k4, v4 = (torch.randn(n, 2, generator=g) for n in (3, 4, 4))      # float32, as the steps compute
do3 = torch.randn(3, 2, generator=g)
sc = 2 ** -0.5
o3, L3 = reference_attention(q3, k4, v4, scale=sc)                        # float64: the row's exact L
L3 = L3.float()
D3 = step04.delta(o3.float(), do3)

dq_sum = torch.zeros(3, 2)
dk_tiles, dv_tiles = [], []
for k0 in (0, 2):                                        # two key tiles of 2
    dq_t, dk_t, dv_t = step04.backward_tile(q3, k4[k0:k0 + 2], v4[k0:k0 + 2], do3, L3, D3, sc)
    dq_sum += dq_t
    dk_tiles.append(dk_t); dv_tiles.append(dv_t)

qa, ka, va = (t.double().requires_grad_() for t in (q3, k4, v4))
(torch.softmax(qa @ ka.T * sc, -1) @ va).backward(do3.double())
for name, mine, ref in (("dQ (sum of the 2 shares)", dq_sum, qa.grad),
                        ("dK (tiles side by side) ", torch.cat(dk_tiles), ka.grad),
                        ("dV (tiles side by side) ", torch.cat(dv_tiles), va.grad)):
    print(f"{name}: max |yours - autograd| = {(mine.double() - ref).abs().max().item():.1e}")

# %% [markdown]
# ## References
#
# - T. Dao, D. Y. Fu, S. Ermon, A. Rudra, C. Ré, *FlashAttention: Fast and Memory-Efficient Exact
#   Attention with IO-Awareness*, NeurIPS 2022, [arXiv:2205.14135](https://arxiv.org/abs/2205.14135):
#   tiling, the online softmax in the forward, recomputation in the backward.
# - T. Dao, *FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning*, 2023,
#   [arXiv:2307.08691](https://arxiv.org/abs/2307.08691): the loop order of this step, the saved
#   log-sum-exp, and $D$ computed once before the backward.
# - J. Shah, G. Bikshandi, Y. Zhang, V. Thakkar, P. Ramani, T. Dao, *FlashAttention-3*, 2024,
#   [arXiv:2407.08608](https://arxiv.org/abs/2407.08608): the same algorithm on Hopper.
# - M. Milakov, N. Gimelshein, *Online normalizer calculation for softmax*, 2018,
#   [arXiv:1805.02867](https://arxiv.org/abs/1805.02867): the running max and sum of section 1.
# - Triton's fused-attention tutorial, `python/tutorials/06-fused-attention.py` in
#   [triton-lang/triton](https://github.com/triton-lang/triton): this step as kernels (steps 05-06).
# - Stanford CS336, assignment 2 (systems),
#   [stanford-cs336/assignment2-systems](https://github.com/stanford-cs336/assignment2-systems):
#   FlashAttention-2 in PyTorch, then Triton, with the same $(O, L)$ contract.
#
# ## Exercises
#
# Answers: `solutions/EXERCISES.md` (not in the student copy).
#
# 1. Section 1 starts from $m = -\infty$, $\ell = 0$. What does `online_softmax_update` compute for a
#    row whose first key tile is entirely masked (every $s = -\infty$), and why must it not produce NaN?
# 2. $dS = P \circ (dP - D)$: show that every row of $dS$ sums to 0. What does that say about adding
#    the same constant to every score of a row?
# 3. The backward could store $P$ instead of $L$. For $B = 8$, $H = 16$, $N = 4096$ in bf16, how many
#    bytes is that per layer, against $L$?
