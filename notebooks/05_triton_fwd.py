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
# # Step 05 — the forward pass as a Triton kernel
#
# Step 04 ran FlashAttention-2's forward as PyTorch operations on tiles: every tile operation was a
# separate kernel that wrote its result to memory. A Triton kernel is one program per tile of
# queries that keeps the Q tile, the running max $m$, the running sum $\ell$ and the output
# accumulator **on chip** for the whole loop over key tiles, and writes only $O$ and the LSE.
#
# In this notebook you will:
# 1. write a one-tile attention kernel, launch it, and watch it fail when the keys need two tiles;
# 2. print from inside a kernel (on a laptop, Triton runs kernels in its *interpreter*);
# 3. see why the kernel works in base 2 (`exp2`, with $\log_2 e$ folded into the scale);
# 4. write the kernel's pieces first, each tested alone (warm-ups: a tile load, one key tile of the
#    online softmax, the key range of a query tile);
# 5. check your `steps/step05_triton_fwd.py` against the float64 reference;
# 6. count the causal tiles that are skipped and the ones that are masked;
# 7. see what tile sizes, warps and pipeline stages do on an H200, and the recorded speeds (section 8);
# 8. see how the order in which the GPU meets the tiles decides what L2 holds (section 9).
#
# Without a GPU, `setup()` sets `TRITON_INTERPRET=1` before anything imports Triton: kernels then
# run as NumPy code, one program after another (slow, but you can print and step through them).
# The interpreter's bf16 `tl.dot` is wrong, so on a CPU use fp32 or fp16.

# %%
# The one switch: "steps" runs your code (steps/), "solutions" the course's, or a path to a folder like steps/.
import os
IMPL = os.environ.get("ATTN_IMPL", "steps")

from attnlib.nb import setup
load_step, device, small = setup(IMPL)

# %%
import json, math, os
import torch
import triton
import triton.language as tl
import matplotlib.pyplot as plt
from attnlib import make_qkv, reference_attention
from attnlib.checks import check_attention, check_lse
from attnlib.compare import assert_close, CompareError
from attnlib.nb import REPO
step05 = load_step(5)
RESULTS = REPO / "results" / "h200"
print("Triton", triton.__version__, "| interpreter:", os.environ.get("TRITON_INTERPRET") == "1")


# %% [markdown]
# ## 1. A one-tile kernel
#
# The smallest useful Triton program: `tl.program_id(0)` says which tile of query rows this program
# owns; `tl.arange` builds the row and column indices; `tl.load` with a **mask** reads the rows that
# exist (and `other=0.0` for the rest, so a partial last tile is safe); `tl.dot` multiplies tiles.
# If every key fits in one tile of `BLOCK_N` rows, a plain softmax over that tile is the whole job.

# %%
@triton.jit
def one_tile_kernel(Q, K, V, O, N_Q, N_K, scale,
                    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)      # this program's query rows
    keys = tl.arange(0, BLOCK_N)                                     # ALL the keys: one tile
    d = tl.arange(0, D)
    q = tl.load(Q + rows[:, None] * D + d[None, :], mask=rows[:, None] < N_Q, other=0.0)
    k = tl.load(K + keys[:, None] * D + d[None, :], mask=keys[:, None] < N_K, other=0.0)
    v = tl.load(V + keys[:, None] * D + d[None, :], mask=keys[:, None] < N_K, other=0.0)
    s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale       # (BLOCK_M, BLOCK_N)
    s = tl.where(keys[None, :] < N_K, s, float("-inf"))             # padded keys are not keys
    p = tl.exp(s - tl.max(s, 1)[:, None])
    o = tl.dot(p, v, input_precision="ieee") / tl.sum(p, 1)[:, None]
    tl.store(O + rows[:, None] * D + d[None, :], o, mask=rows[:, None] < N_Q)


def one_tile_attention(q, k, v, BLOCK_M=16, BLOCK_N=64):
    # q, k, v: (N, D) contiguous fp32, one head
    o = torch.empty_like(q)
    grid = (triton.cdiv(q.shape[0], BLOCK_M),)
    one_tile_kernel[grid](q, k, v, o, q.shape[0], k.shape[0], q.shape[1] ** -0.5,
                          D=q.shape[1], BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    return o


q, k, v = (t[0, 0].contiguous() for t in make_qkv(1, 1, 40, 40, 32, device=device))
assert_close(one_tile_attention(q, k, v), reference_attention(q, k, v)[0], name="O")
print("40 keys in one tile of 64: matches the reference")

# %% [markdown]
# With 100 keys the tile of 64 sees only the first 64, and the answer is silently wrong. Making
# `BLOCK_N` as large as N does not scale: the S tile lives in registers, and a GPU program has a few
# hundred registers per thread. The fix is step 04's loop over key tiles with the online softmax,
# which is exactly what `_fwd_inner` in `step05_triton_fwd.py` does.

# %%
q, k, v = (t[0, 0].contiguous() for t in make_qkv(1, 1, 40, 100, 32, device=device))
try:
    assert_close(one_tile_attention(q, k, v), reference_attention(q, k, v)[0], name="O",
                 context="100 keys, one tile of 64")
except CompareError as e:
    print(str(e).splitlines()[0])
    print(str(e).splitlines()[1])


# %% [markdown]
# ## 2. Printing inside a kernel
#
# - `tl.static_print(...)` runs when the kernel is **compiled**: it shows types, shapes and
#   `constexpr` values (in the interpreter, at every launch).
# - `tl.device_print("name", x)` runs when the kernel **runs**, in every program. On a GPU the
#   output comes from the device after the kernel finishes (in a terminal; Jupyter may not show it).
# - In the interpreter the kernel is ordinary Python: `print(x)` and `breakpoint()` work too. Launch
#   one program (`grid = (1,)`) and a tiny input, or you will read thousands of lines.
#
# Here, the online-softmax statistics of one row, tile by tile:

# %%
@triton.jit
def running_max_kernel(X, N, BLOCK: tl.constexpr):
    m = tl.full([1], float("-inf"), tl.float32)
    l = tl.zeros([1], tl.float32)
    for start in range(0, N, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(X + offs, mask=offs < N, other=float("-inf"))
        tl.static_print("the tile:", x)                      # a type and a shape, at compile time
        m_new = tl.maximum(m, tl.max(x, 0))
        l = l * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), 0)
        m = m_new
        tl.device_print("m, l after this tile", m, l)      # values, at run time


x = torch.tensor([0.5, -1.0, 2.0, 0.0, 3.5, 1.0, -2.0, 3.0], device=device)
running_max_kernel[(1,)](x, x.numel(), BLOCK=4)
if device == "cuda":
    torch.cuda.synchronize()
print("torch:  m =", x.max().item(), " l =", torch.exp(x - x.max()).sum().item())

# %% [markdown]
# ## 3. Why base 2
#
# $e^{x} = 2^{x \log_2 e}$. The kernel multiplies the scores by `scale * log2(e)` once (the scale
# multiply was there anyway), keeps $m$ in base-2 units and calls `exp2`, which is the GPU's native
# special-function instruction (`MUFU.EX2`; `exp` is `exp2` plus a multiply). The maximum and the
# sum do not care about the base, so only the stored LSE is converted back:
# $\mathrm{LSE} = (m_2 + \log_2 \ell)\,\ln 2$.

# %%
s = torch.randn(6, dtype=torch.float64) * 3
LOG2E = 1 / math.log(2)
s2 = s * LOG2E                                           # scores in base-2 units
m2 = s2.max()
l = torch.exp2(s2 - m2).sum()
print("softmax, base e:", torch.softmax(s, 0)[:3].numpy())
print("softmax, base 2:", (torch.exp2(s2 - m2) / l)[:3].numpy())
print("LSE:", torch.logsumexp(s, 0).item(), "=", ((m2 + torch.log2(l)) * math.log(2)).item())

# %% [markdown]
# ## 4. Warm-ups: the kernel's pieces, one at a time
#
# The kernel is three helpers you write and a loop that calls them: `load_tile` (a tile of a strided
# matrix, masked at its edges), `online_softmax_tile` (one key tile of the online softmax) and
# `key_range` (which key tiles a query tile visits, and which of them need a mask). Each has a
# warm-up in `step05_triton_fwd.py`: a tiny kernel that calls that helper alone, and a launcher that
# returns what it computed, so you can test a helper the moment it is written, in the spirit of
# Triton-Puzzles. `attnlib/warmups.py` holds each helper's spec in PyTorch (float64) and a check
# that says where a result is wrong and what the likely bug is; `pytest -m step05
# tests/test_step05_warmups.py` runs them all, and the grader's `warmups` group pays for them even
# before the kernel works.
#
# **`load_tile`.** A 5 x 7 matrix inside a buffer of NaN: a tile that runs past its last row must
# read 0 there, never the NaN next door.

# %%
from attnlib import warmups
buf = torch.full((8, 12), float("nan"), device=device)
x = buf[1:6, 2:9]                                     # 5 x 7, row stride 12: a view, not a copy
x.copy_(torch.arange(35.0).reshape(5, 7))
tile = step05.warmup_load_tile(x, 2, 0, 4, 8)         # rows 2-5, cols 0-7: past the last row and column
print(tile)
warmups.check_load_tile(tile.cpu(), x.cpu(), 2, 0, 4, 8)
print("load_tile: matches the spec")

# %% [markdown]
# **`online_softmax_tile`.** Sixteen queries meet 64 keys in two tiles of 32: the state `(m, l, acc)`
# after the first tile goes into the second. $m$ is in base-2 units (section 3); `acc / l` after the
# last tile is the attention output.

# %%
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(n, 16, generator=g) for n in (16, 64, 64))
state = None
for start_n in (0, 32):
    kt, vt = k[start_n:start_n + 32], v[start_n:start_n + 32]
    new = step05.warmup_online_softmax_tile(q.to(device), kt.to(device), vt.to(device), state,
                                            start_n=start_n, n_keys=64)
    new = tuple(t.cpu() for t in new)
    warmups.check_online_softmax(new, q, kt, vt, state, start_n=start_n, n_keys=64)
    state = new
    print(f"after keys {start_n}-{start_n + 31}: row 0 has m = {state[0][0]:.3f} (base 2), l = {state[1][0]:.3f}")
m, l, acc = (t.double() for t in state)
ref = torch.softmax(q.double() @ k.double().T * 16 ** -0.5, -1) @ v.double()
print(f"acc / l against softmax(q k^T * scale) v: max |err| = {(acc / l[:, None] - ref).abs().max():.2e}")

# %% [markdown]
# **`key_range`.** Causal, 100 queries and keys, 32-row query tiles, 16-key tiles: per query tile,
# `(hi_full, hi)`. Keys below `hi_full` run unmasked, `[hi_full, hi)` masked, the rest never.

# %%
ranges = step05.warmup_causal_key_range(100, 100, 32, 16, device=device)
warmups.check_key_range(ranges.cpu(), 100, 100, 32, 16)
for t, (hi_full, hi) in enumerate(ranges.tolist()):
    print(f"query rows {32 * t:3d}-{min(32 * t + 31, 99):3d}: keys [0, {hi_full}) unmasked, [{hi_full}, {hi}) masked")

# %% [markdown]
# ## 5. Check your kernel
#
# `attention_with_lse` returns $O$ and the LSE; both are compared with the float64 reference. The
# shapes are awkward on purpose: 17 and 100 rows are no multiple of a tile, $N_q \ne N_k$, and
# $D = 80$ is padded to 128 with masked loads. On a CPU the tiles are 32 x 32 (so these small inputs
# still cross several tiles); on a GPU the tuned table picks them.

# %%
dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if device == "cuda" else [])
for (B, H, nq, nk, d) in [(1, 2, 17, 17, 32), (1, 2, 100, 33, 32), (1, 3, 65, 65, 80)]:
    for dtype in dtypes:
        for causal in (False, True):
            q, k, v = make_qkv(B, H, nq, nk, d, dtype=dtype, device=device)
            o, lse = step05.attention_with_lse(q, k, v, is_causal=causal)
            check_attention(lambda *a, **kw: step05.attention_with_lse(*a, **kw)[0], q, k, v,
                            is_causal=causal, grads=False)
            check_lse(lse, q, k, v, is_causal=causal)
    print(f"q {(B, H, nq, d)}, k {(B, H, nk, d)}: O and LSE match in {[str(t)[6:] for t in dtypes]}")


# %% [markdown]
# ## 6. Which causal tiles run
#
# For the query tile starting at row `start_m`, the kernel splits the keys in two stages:
# `[0, hi_full)`, tiles that every row sees entirely (no mask at all), and `[hi_full, hi)`, the tiles
# the diagonal crosses (and the last partial tile), with a mask. Tiles past `hi` are never loaded.
# The same formulas as in the kernel, in Python:

# %%
def key_stages(start_m, n_k, BLOCK_M, BLOCK_N, causal):
    if causal:
        hi_full = (min(start_m, n_k) // BLOCK_N) * BLOCK_N
        hi = min(start_m + BLOCK_M, n_k)
    else:
        hi_full, hi = (n_k // BLOCK_N) * BLOCK_N, n_k
    return hi_full // BLOCK_N, -(-(hi - hi_full) // BLOCK_N)      # full tiles, masked tiles

N, BM, BN = 1000, 128, 64
n_tiles = -(-N // BN)
print(f"N = {N}, BLOCK_M = {BM}, BLOCK_N = {BN}: {n_tiles} key tiles")
full = masked = 0
for start_m in range(0, N, BM):
    f, m = key_stages(start_m, N, BM, BN, True)
    full, masked = full + f, masked + m
    print(f"  query rows {start_m:4d}-{min(start_m + BM, N) - 1:4d}: {f:2d} full + {m} masked, "
          f"{n_tiles - f - m:2d} skipped")
total = n_tiles * -(-N // BM)
print(f"causal computes {full + masked} of {total} tiles ({(full + masked) / total:.0%}); "
      f"only {masked} need a mask")

# %% [markdown]
# ## 7. Tile sizes, warps and stages (recorded on an H200)
#
# Four knobs, and no formula for them: `BLOCK_M` (query rows per program), `BLOCK_N` (keys per loop
# step), `num_warps` (threads per program / 32), `num_stages` (how many K/V tiles are loaded ahead,
# through `cp.async`, while the current one is computed). Registers bound the first two (the fp32
# accumulator is `BLOCK_M x D`, the scores `BLOCK_M x BLOCK_N`), shared memory bounds the stages.
# `python bench/triton_gpu.py --tune` timed every candidate on an H200; the winners are the table in
# `fwd_config`. On a GPU the next cell also times a few candidates live.

# %%
tuning = json.loads((RESULTS / "triton_gpu_tuning.json").read_text())
rows = [r for r in tuning["rows"] if r["kind"] == "fwd" and r["N"] == 8192]
fig, axes = plt.subplots(1, 2, figsize=(13, 4))
for ax, D in zip(axes, (64, 128)):
    sel = [r for r in rows if r["D"] == D]
    cfgs = sorted({tuple(r["config"]) for r in sel}, key=lambda c: c)
    for off, causal in ((-0.2, False), (0.2, True)):
        ms = [next(r["ms"] for r in sel if tuple(r["config"]) == c and r["causal"] == causal) for c in cfgs]
        ax.bar([i + off for i in range(len(cfgs))], ms, width=0.4, label="causal" if causal else "not causal")
    ax.set_xticks(range(len(cfgs)))
    ax.set_xticklabels([f"{c[0]}x{c[1]}\nw{c[2]} s{c[3]}" for c in cfgs], fontsize=8)
    B, H = 16384 // 8192, 2048 // D
    ax.set_title(f"forward, bf16, B={B} H={H} N=8192 D={D}: ms (lower is better)")
    ax.legend()
fig.suptitle(f"{tuning['machine']['gpu']}, {tuning['machine']['date']}, triton {tuning['machine']['triton']}")
plt.tight_layout()
plt.show()

# %%
if device == "cuda":
    from triton.testing import do_bench
    q, k, v = make_qkv(2, 32, 8192, 8192, 64, dtype=torch.bfloat16, device=device)
    for cfg in [(128, 64, 8, 3), (128, 64, 4, 3), (128, 64, 8, 2), (64, 64, 4, 3), (128, 128, 8, 3)]:
        c = dict(zip(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"), cfg))
        ms = do_bench(lambda: step05.forward(q, k, v, True, 0.125, config=c), return_mode="median")
        print(f"{cfg}: {ms:.3f} ms, {2 * 2 * 32 * 8192**2 * 64 / ms * 1e-9:.0f} TFLOP/s (causal)")
else:
    print("no GPU: the recorded H200 sweep above is the one to read")

# %% [markdown]
# ## 8. The recorded H200 figures
#
# bf16, FlashAttention's grid (16k tokens per batch: $B = 16384/N$, hidden 2048: $H = 2048/D$),
# forward only, TFLOP/s counted as FlashAttention counts them ($4BHN^2D$, halved when causal), with
# PyTorch's FLASH backend (FlashAttention-2) and cuDNN's backend timed in the same run
# (`results/h200/triton_gpu.json`, written by `bench/triton_gpu.py`).

# %%
data = json.loads((RESULTS / "triton_gpu.json").read_text())
m = data["machine"]
print(f"{m['gpu']}, torch {m['torch']}, triton {m['triton']}, {m['date']}\n")
by = {(r["impl"], r["mode"], r["B"], r["H"], r["N"], r["D"], r["causal"]): r for r in data["rows"]}
print(f"{'D':>4} {'causal':>7} {'N':>6} | {'Triton':>7} {'FLASH':>7} {'cuDNN':>7}  TFLOP/s | x FLASH")
for r in data["rows"]:
    if r["impl"] == "triton_step05" and r["suite"] == "grid":
        key = lambda i: by[(i, "fwd", r["B"], r["H"], r["N"], r["D"], r["causal"])]["tflops"]  # noqa: E731
        print(f"{r['D']:>4} {str(r['causal']):>7} {r['N']:>6} | {r['tflops']:7.0f} {key('sdpa_flash'):7.0f} "
              f"{key('sdpa_cudnn'):7.0f}          | {r['ratio_to_sdpa_flash']:.2f}")
fig, axes = plt.subplots(1, 4, figsize=(18, 3.8))
for ax, (D, causal) in zip(axes, [(64, False), (64, True), (128, False), (128, True)]):
    for impl in ("triton_step05", "sdpa_flash", "sdpa_cudnn"):
        pts = sorted((r["N"], r["tflops"]) for r in data["rows"] if r["impl"] == impl and r["mode"] == "fwd"
                     and r["D"] == D and r["causal"] == causal and r["suite"] == "grid")
        ax.plot(*zip(*pts), marker="o", label=impl)
    ax.set_xscale("log", base=2)
    ax.set_title(f"forward, D={D}, {'causal' if causal else 'not causal'}")
    ax.set_xlabel("N")
    ax.set_ylabel("TFLOP/s")
    ax.grid(alpha=0.3)
axes[0].legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# The Triton kernel beats PyTorch's FlashAttention-2 backend at every length (1.29-1.45x from
# N = 2048): FlashAttention-2's CUDA code was written for the A100 and uses its `mma.sync`
# instructions, while Triton compiles `tl.dot` to Hopper's `wgmma` (check with `cuobjdump --dump-sass`:
# `HGMMA`). cuDNN's backend is faster still: it uses Hopper's bulk tensor copies (TMA) and warp
# specialization (some warps only load, others only compute), which this kernel does not.
#
# How much would TMA alone buy? `bench/experiments/triton_fwd_tma.py` loads Q, K and V through Triton's tensor
# descriptors (Hopper's TMA) in an otherwise identical kernel. On the H200
# (`results/h200/triton/README.md`): nothing at D = 64 (1.341 against 1.347 ms on the leaderboard
# shape, same tiles); at D = 128 it makes 128 x 128 tiles pay, 1.13-1.17x faster than this kernel's
# table. Turning on Triton's warp specialization as well returned NaN with three pipeline stages and
# ran slower with two: on Hopper, in Triton 3.6, that part is not ready for this kernel.
#
# Which part of the D = 128 gain is the tile and which is TMA? Timed apart on the H200 (2026-12-01,
# `triton_fwd_tma.py --plan d128`, `results/h200/triton/fwd_tma_d128.log`; bf16, H = 16, ms):
#
# | D = 128 | causal, N = 16384 | not causal, 16384 | causal, 4096 (B = 4) | not causal, 4096 |
# |---|---|---|---|---|
# | this kernel, the table's tiles (64x64 causal, 128x64 not) | 2.293 | 4.566 | 0.649 | 1.198 |
# | this kernel, 128 x 128 tiles, 8 warps | 2.212 | 4.254 | 0.644 | 1.118 |
# | the same with TMA loads | 1.996 | 4.102 | 0.581 | 1.100 |
# | SDPA's cuDNN backend, same run | 1.919 | 3.505 | 0.519 | 0.847 |
#
# Both pay: the bigger tile 1.01-1.07x, TMA at that tile another 1.02-1.11x. This step now takes
# 128 x 128 tiles at D = 128 on a Hopper GPU (`dense_fwd_config`: three stages of 128-key K and V tiles
# need about 200 KB of shared memory, more than an A100's 163 KB).
#
# **TMA.** `attention(q, k, v, is_causal, tma=True)` runs a second kernel,
# `_attn_fwd_tma_kernel`: the same math through the same helpers you wrote (`key_range`,
# `online_softmax_tile`, `finish_rows`), but Q, K and V arrive and O leaves through 4-D tensor
# descriptors over (B, H, N, D) with a box of [1, 1, BLOCK, D]. A tile that runs past N comes back
# zero-filled from its own head (keys past N_K still need your mask: a zero key scores 0, not -inf),
# and a store past Nq is dropped. A descriptor asks more of its tensor than pointers do: an sm_90+ GPU,
# fp16/bf16/fp32, D a power of two from 16 to 256, a contiguous last dim, every other stride a multiple
# of 16 bytes; where any of that fails, `tma=True` raises a ValueError that says which, and never falls
# back to pointers quietly. The experiment's numbers above (TMA at the same 128 x 128 tiles 1.02-1.11x
# faster; against cuDNN 0.89-0.96x causal and 0.77-0.85x not, where pointer loads were 0.81-0.87x and
# 0.76-0.82x) were measured on the experiment's own kernel, which needs N to be a multiple of its
# tiles. This step's own TMA path, measured on the H200 (2026-12-01, `bench/experiments/triton_fwd_tma_course.py`,
# `results/h200/triton/fwd_tma_course_3f626a2.json`; bf16, B = 16384 / N, H = 2048 / D, each shape checked
# against the float64 reference first, at this step's own tiles):
#
# | | D = 64 | D = 128 |
# |---|---|---|
# | `tma=True` over pointer loads, N 4k-16k | 0.97-1.02x | **1.07-1.11x** |
# | pointer loads / cuDNN, same run | 0.90-0.96x | 0.81-0.87x |
# | `tma=True` / cuDNN | 0.90-0.94x | 0.88-0.96x |
#
# TMA pays where a tile is big (D = 128: 128 x 128 x 2 bytes per operand tile), not at D = 64, where the
# pointer kernel already keeps the tensor cores fed; the last 5-10% to cuDNN is what TMA does not give:
# warp specialization and the overlap of the softmax with the next product (issue 17).
#
# **TMA by default, where it was measured to pay.** With `tma=None` (the default) `forward` asks
# `tma_by_default`: 16-bit inputs, D = 128, both lengths at least `TMA_MIN_LEN` = 2048, an sm_90 GPU, and
# nothing `tma_unsupported` objects to. Why the length: the whole grid on the H200 with TMA at every
# length (2026-12-02, `results/h200/grid_1202/`, `step05` against `step05-ptr`, bf16, D = 128):
#
# | N | 512 | 1024 | 2048 | 4096 | 8192 | 16384 |
# |---|---|---|---|---|---|---|
# | TMA / pointers, not causal | 0.99x | 0.77x | 1.11x | 1.13x | 1.11x | 1.09x |
# | TMA / pointers, causal | 0.40x | 0.56x | 1.01x | 1.11x | 1.10x | 1.10x |
#
# Short sequences are many small programs that finish in microseconds: whatever a TMA launch adds
# (descriptors to build and fetch) is not paid back by faster tiles. The default now stops at 2048 (the
# rows below it run the pointer kernel again); `tma=True` still forces TMA anywhere it can run, and
# `tma=False` never uses it. From N = 4096 this step's forward was then 0.89-0.97x cuDNN at D = 128 (it had been 0.80-0.88x;
# section 9 has where it stands since).

# %% [markdown]
# ## 9. The order the GPU meets the tiles: L2
#
# Every program of a grid computes the same kind of tile, but not at the same time: the GPU starts the programs in
# grid order, axis 0 fastest, as SMs come free. Which (query tile, head) a program computes is the kernel's choice.
# In `step05_triton_fwd.py`, `program_tile(IS_CAUSAL, HEADS_FIRST, HEAD_GROUP)` makes it:
#
# - grid (query tiles, B*H): one head's tiles one after another;
# - `HEADS_FIRST`: grid (B*H, query tiles), every head's tile $i$ before any head's tile $i + 1$. Under a causal mask
#   the tiles are also reversed: the heaviest (the last rows, which see the most keys) start first, and the light ones
#   fill the end;
# - `HEAD_GROUP` = G > 0, with `HEADS_FIRST`: the heads are taken G at a time, heaviest tile first within a group,
#   one group after another. FlashAttention-3's tile scheduler does this, with a 32 MB budget.
#
# Why it matters: the query tiles of one head all read that head's K and V. If a head's K and V are still in L2 when
# its next tile starts, they come from L2; if not, from DRAM. At FlashAttention's grid ($B = 16384/N$, $H = 2048/D$),
# N = 4096, D = 64, there are 128 heads with 1 MB of K and V each: 128 MB, against the H200's 60 MB of L2. With every
# head in flight at once (`HEAD_GROUP=0`, what this step ran at D = 64 causal before), a head's K and V have left L2
# by the time its next tile starts. `head_group(n_keys, d, itemsize)` takes as many heads as keep their K and V within
# `L2_GROUP_BYTES` = 8 MB (at least one), and `dense_fwd_config` sets `HEADS_FIRST=True` and that `HEAD_GROUP` for
# 16-bit causal inputs on a GPU.
#
# The same arithmetic as `program_tile`, in Python, on a toy grid of 6 heads and 4 query tiles (causal). Read each
# line as the programs that start together, if 6 fit on the GPU at once:

# %%
def launch_order(n_bh, n_m, G, causal=True):
    """(head, query tile) of each program, in launch order, for HEADS_FIRST: grid (n_bh, n_m), axis 0 fastest.
    G = HEAD_GROUP; 0 means every head at once."""
    order = []
    for pid_m in range(n_m):            # axis 1: the slow one
        for bh in range(n_bh):          # axis 0: the fast one
            m, h = pid_m, bh
            if G > 0:
                start = pid_m * n_bh + bh                  # the program's place in the launch order
                group = start // (G * n_m)
                heads = min(G, n_bh - group * G)           # the last group may be smaller
                within = start - group * G * n_m
                m, h = within // heads, group * G + within % heads
            if causal:
                m = n_m - 1 - m                            # the heaviest tile first
            order.append((h, m))
    return order


n_bh, n_m = 6, 4
for G in (0, 1, 4):
    order = launch_order(n_bh, n_m, G)
    assert sorted(order) == [(h, m) for h in range(n_bh) for m in range(n_m)]    # every tile once
    print(f"HEAD_GROUP = {G}" + (" (every head at once)" if G == 0 else ""))
    for i in range(0, len(order), n_bh):
        print(f"  launch {i:2d}-{i + n_bh - 1:2d}: " + " ".join(f"({h},{m})" for h, m in order[i:i + n_bh]))

print(f"\nstep05.head_group(4096, 64, 2) = {step05.head_group(4096, 64, 2)}")
for n, d in ((2048, 64), (4096, 64), (4096, 128), (16384, 64), (16384, 128)):
    mb = 2 * n * d * 2 / 2**20                             # K and V of one head, bf16
    heads = (16384 // n) * (2048 // d)
    print(f"N = {n:5d}, D = {d:3d}: K + V {mb:3.1f} MB a head, {heads:3d} heads ({heads * mb:3.0f} MB) on "
          f"FlashAttention's grid, group of {step05.head_group(n, d, 2)}")

# %% [markdown]
# With `HEAD_GROUP = 0` a head's tile 2 starts 6 programs after its tile 3, once every other head's tile 3 has
# started: on the real grid, after 127 other heads have brought their K and V into L2. With `HEAD_GROUP = 1` a head's
# four tiles start one after another; with 4, four heads at a time, then a last group of two.
#
# ncu read the L2 on the H200 (2026-12-04): one forward of each order at D = 64 causal N = 4096 (B = 4, H = 32), under
# ncu's fixed clocks and one kernel at a time (`ncu --csv`, `results/h200/triton/fwd_tile_order_1204/round2/ncu_l2.csv`;
# that file stays out of the student release, so its figures are copied here). The Gluon kernel is the
# warp-specialized forward that the course's solution runs on Hopper (notebook 06 §11).
#
# | kernel, HEAD_GROUP | L2 hit rate | DRAM read | ncu time |
# |---|---|---|---|
# | Triton, every head at once (g0) | **11.65%** | 1.99 GB | 869 us |
# | Triton, g1 / g8 / g16 | 85.07% / 85.36% / 85.37% | 0.20 GB | 913 / 877 / 874 us |
# | Gluon, every head at once (g0) | **12.06%** | 1.56 GB | 916 us |
# | Gluon, g1 / g8 / g16 | 81.46% / 81.72% / 81.68% | 0.20 GB | 853 / 833 / 837 us |
#
# In groups, 0.20 GB is Q, K and V read once each (67 MB of Q, 134 MB of K and V). Every head at once, the kernels
# read K and V from DRAM 11 (Gluon) to 14 (Triton) times over.
#
# Outside ncu, with free clocks and the launches back to back, the time moves with the order.
# `bench/experiments/fwd_tile_order.py` timed both kernels under every group size, forward only, bf16, causal, at
# FlashAttention's grid: each variant twice (the second pass in reverse order), the faster of the two kept, cuDNN's
# SDPA forward in the same run. Two runs on one H200, 2026-12-04 (`results/h200/triton/fwd_tile_order_1204/round1/`
# and `round2/`, `fwd_tile_order.json`). "step 05" is this step as shipped at that run: in round 1 before the change,
# in round 2 after it (the Gluon kernel in `head_group`'s groups from N = 4096, the grouped Triton kernel below).
# Round 2 timed fewer groups than asked after its first shape (a bug in the script, fixed since): the plot shows the
# groups each row has.

# %%
runs = {rnd: json.loads((RESULTS / "triton" / "fwd_tile_order_1204" / f"round{rnd}" / "fwd_tile_order.json")
                        .read_text()) for rnd in (1, 2)}
cells = [(4096, 64), (4096, 128), (8192, 64), (8192, 128)]
fig, axes = plt.subplots(1, 4, figsize=(20, 4.2))
for ax, (N, D) in zip(axes, cells):
    shape = f"grid B{16384 // N} H{2048 // D} N{N} D{D} causal"
    rows = {rnd: next((r for r in run["timing_rows"] if r["shape"] == shape), None) for rnd, run in runs.items()}
    groups = sorted({int(k.split(" g")[1]) for r in rows.values() if r for k in r["best_ms"] if " g" in k})
    x = {g: i for i, g in enumerate(groups)}
    for rnd, r in rows.items():
        if r is None:
            continue
        b, style = r["best_ms"], "--" if rnd == 1 else "-"
        for kernel, color in (("triton", "C0"), ("gluon", "C1")):
            pts = [(x[g], b[f"{kernel} g{g}"]) for g in groups if f"{kernel} g{g}" in b]
            ax.plot(*zip(*pts), style, marker="o", color=color, label=f"{kernel}, round {rnd}")
        ax.axhline(b["cudnn"], linestyle=style, color="gray", label=f"cuDNN, round {rnd}")
        ax.plot([len(groups)], [b["step05"]], marker="*", markersize=14, color="C2" if rnd == 2 else "C3",
                linestyle="none", label=f"step 05 as shipped, round {rnd}")
    ax.set_xticks(range(len(groups) + 1))
    ax.set_xticklabels(["all" if g == 0 else str(g) for g in groups] + ["step 05"])
    ax.set_xlabel("HEAD_GROUP (heads at a time)")
    ax.set_ylabel("ms")
    ax.set_title(f"D={D}, N={N} (B={16384 // N}, H={2048 // D})")
    ax.grid(alpha=0.3)
axes[0].legend(fontsize=7)
fig.suptitle(f"{runs[2]['gpu']}, bf16, causal forward, 2026-12-04: ms against the tile order (lower is better)")
plt.tight_layout()
plt.show()

for N, D in cells:
    shape = f"grid B{16384 // N} H{2048 // D} N{N} D{D} causal"
    print(f"{shape}: ms (cuDNN's time / ours)")
    for rnd, run in runs.items():
        b = next(r for r in run["timing_rows"] if r["shape"] == shape)["best_ms"]
        line = f"  round {rnd}: cuDNN {b['cudnn']:.3f}, step 05 {b['step05']:.3f} ({b['cudnn'] / b['step05']:.2f}x)"
        for kernel in ("triton", "gluon"):
            best = min((k for k in b if k.startswith(kernel + " g") and k != kernel + " g0"), key=b.get)
            line += (f" | {kernel} all {b[kernel + ' g0']:.3f} ({b['cudnn'] / b[kernel + ' g0']:.2f}x),"
                     f" {best.split()[1]} {b[best]:.3f} ({b['cudnn'] / b[best]:.2f}x)")
        print(line)

# %% [markdown]
# The same on your GPU, if you have one: this step's Triton kernel (a `config` given, so no other kernel takes the
# call) at D = 64 causal N = 4096, every head at once against `head_group`'s groups. The tiles and the arithmetic are
# the same; the cell checks that O comes out the same bit for bit.

# %%
if device == "cuda":
    from triton.testing import do_bench
    B, H, N, D = 4, 32, 4096, 64
    q, k, v = make_qkv(B, H, N, N, D, dtype=torch.bfloat16, device=device)
    base = step05.dense_fwd_config(N, N, D, torch.bfloat16, True, "cuda", B * H)
    outs = {}
    for G in (0, step05.head_group(N, D, 2)):
        c = dict(base, HEADS_FIRST=True, HEAD_GROUP=G)
        outs[G] = step05.forward(q, k, v, True, 0.125, config=c)[0]
        ms = do_bench(lambda: step05.forward(q, k, v, True, 0.125, config=c), return_mode="median")
        print(f"HEAD_GROUP = {G:2d}{' (every head at once)' if G == 0 else ' (head_group)':22s}: {ms:.3f} ms")
    print("same O bit for bit:", torch.equal(*outs.values()))
else:
    print("no GPU: the recorded H200 figures above are the ones to read")

# %% [markdown]
# What it says (one H200, bf16, causal, 2026-12-04):
#
# - **The order was the gap at causal N = 4096.** Every head at once, the L2 hit rate was 11.65% (Triton) and 12.06%
#   (Gluon), and one forward read 1.99 and 1.56 GB from DRAM; in groups of 1, 8 or 16 heads, 85% and 81.5-81.7%, and
#   0.20 GB. Under ncu the Triton kernel's time hardly moved (869 us all at once, 874-913 us grouped; the Gluon kernel
#   916 -> 833-853 us); outside ncu it did.
# - D = 64, N = 4096: the Triton kernel 0.80 ms all at once (0.82x cuDNN), 0.70-0.71 ms in its best group (0.93x);
#   the Gluon kernel 0.77-0.80 ms (0.83-0.85x), 0.67-0.70 ms grouped (0.95-0.98x). This step as shipped after the
#   change: 0.661 ms, 0.99x cuDNN (round 2). D = 128, N = 4096: the Gluon kernel grouped 0.519-0.530 ms, 0.99-1.00x.
# - Groups of 1 to 16 heads are within a few percent of each other; every head at once is the outlier.
# - Issue 17's targets, timed right after in three alternated rounds (`results/h200/issue17_targets_1204c/`): this
#   step's forward is at least 0.95x cuDNN in 12 of 12 cells at the median (D = 128 causal N = 4096 at 0.993, 0.95-1.12
#   across the rounds), where it was 9 of 12 before (causal N = 4096 at 0.83x and 0.90x).
#
# An order is a knob with no FLOP in it: the same tiles, computed in another order, ran 1.03-1.17x faster here.
#
# The limit: this was measured on one H200. `L2_GROUP_BYTES` is a constant measured there (groups holding 8 to 16 MB
# of K and V were best); FlashAttention-3 uses 32 MB. A GPU with another L2 may want another number.
#
# **Next: step 06**, the backward pass as Triton kernels.

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
# - P. Tillet, H. T. Kung, D. Cox, *Triton: an intermediate language and compiler for tiled neural
#   network computations*, MAPL 2019, [doi:10.1145/3315508.3329973](https://doi.org/10.1145/3315508.3329973).
#
# ## Exercises
#
# Answers: `solutions/EXERCISES.md` (not in the student copy).
#
# 1. The kernel multiplies the scores by `scale * log2(e)` and calls `exp2`. Why is that the same
#    softmax, and what must happen to the LSE before it is stored?
# 2. Causal, $N = 4096$, `BLOCK_M = BLOCK_N = 64`: what fraction of the (query tile, key tile) pairs
#    does the kernel skip, and how many of the pairs it runs need a mask?
# 3. The K tile is loaded with `other=0.0` past $N_k$, but the scores of those padded keys are not set
#    to $-\infty$. What goes wrong in $O$, and in which rows?
