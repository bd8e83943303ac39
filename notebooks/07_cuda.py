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
# # Step 07 — FlashAttention in hand-written CUDA, from the first kernel to tensor cores
#
# The algorithm of steps 04–06, once more, now as CUDA C++ kernels built into PyTorch with
# `torch.utils.cpp_extension`. Nine kernels, each kept, each checked against the float64 reference before
# it is timed (the `dev/cuda` habit of llm.c):
#
# | file (`steps/csrc/`) | version | what changes |
# |---|---|---|
# | `step07_fwd_v1.cu` | forward v1 | the source material's structure: Q/K/V tiles in shared memory, one thread per query row, online softmax state in registers, scalar fp32 |
# | `step07_fwd_v2.cu` | forward v2 | tensor cores: `mma.sync` m16n8k16 in fp16/bf16 with fp32 accumulation; P goes back to the tensor cores from registers |
# | `step07_fwd_v3.cu` | forward v3 | `cp.async` double buffering, `ldmatrix`, XOR-swizzled shared memory, 32 rows per warp, base-2 softmax, causal tiles scheduled longest first |
# | `step07_fwd_v4.cu` | forward v4 | v3 on Hopper's `wgmma` (sm_90a only): warpgroups of 64 rows, Q/K/V read by the tensor cores through shared-memory descriptors, P from registers (descriptors and `wgmma` wrappers in `step07_wgmma.cuh`, shared with v5) |
# | `step07_fwd_v5.cu` | forward v5 | v4 warp-specialized (sm_90a only): TMA loads by a producer warpgroup into an mbarrier ring, two consumer warpgroups, `setmaxnreg`, optional ping-pong |
# | `step07_fwd_v6.cu` | forward v6 | v5 with each tile's exponentials computed while the tensor cores still run the previous tile's P V (FlashAttention-3's intra-warpgroup overlap; sm_90a only; v5's producer, ring and epilogue in `step07_tma.cuh`) |
# | `step07_bwd.cu` | backward v1 | Delta, then a dK/dV kernel and a dQ kernel, scalar fp32 |
# | `step07_bwd_mma.cu` | backward v2 | the same split on tensor cores |
# | `step07_bwd_wgmma.cu` | backward v3 | v2 with its dK/dV kernel on `wgmma` (sm_90a only; Delta and dQ stay v2's) |
#
# In this notebook you will:
# - build the extension and read what each compiler flag costs;
# - walk the versions in order: what changed, why, and what it bought on an H200;
# - read the compiler's register and spill report, and the profiler's view of v3 next to FlashAttention-2.
#
# On a machine without a GPU the launch cells say so and skip; everything measured is read from
# `results/h200/`, recorded with the date and the GPU.

# %%
# The one switch: "steps" runs your code (steps/), "solutions" the course's, or a path to a folder like steps/.
import os
IMPL = os.environ.get("ATTN_IMPL", "steps")

from attnlib.nb import setup
load_step, device, small = setup(IMPL)

import json, re
import torch
import matplotlib.pyplot as plt
from attnlib import make_qkv
from attnlib.checks import check_attention, check_lse
from attnlib.loader import REPO
step07 = load_step(7)
on_gpu = device == "cuda"

RESULTS = REPO / "results" / "h200"
rows = json.loads((RESULTS / "step07_cuda.json").read_text())
m = rows[0]["machine"]
print(f"recorded results: {m['gpu']}, torch {m['torch']}, CUDA {m['cuda']}, {m['nvcc']}, {m['date']}")

def rec(impl, D, N, causal, mode="fwd"):
    for r in rows:
        if (r["impl"], r["D"], r["N"], r["causal"], r["mode"]) == (impl, D, N, causal, mode):
            return r
    return None

def show(impls, D=128, Ns=(1024, 4096, 16384), mode="fwd"):
    print(f"{mode}, bf16, D={D}: TFLOP/s (ratio to SDPA-FLASH, timed in the same run)")
    print(f"{'':14s}" + "".join(f"{('N=%d %s' % (N, c)):>22s}" for c in ('full', 'causal') for N in Ns))
    for impl in impls:
        cells = []
        for causal in (False, True):
            for N in Ns:
                r = rec(impl, D, N, causal, mode)
                cells.append(f"{'-':>22s}" if r is None else f"{r['tflops']:12.1f} (x{r['ratio_to_sdpa_flash']:.2f})")
        print(f"{impl:14s}" + "".join(cells))


# %% [markdown]
# ## 1. Two numbers first
#
# FlashAttention's standard benchmark grid keeps 16k tokens per batch ($B = 16384/N$) and a hidden size of
# 2048 ($H = 2048/D$). At $N = 16384$, $D = 128$ ($B = 1$, $H = 16$) the forward does two matrix products
# per head, $4BHN^2D$ FLOPs (half of that when causal), and must at least read Q, K, V and write O once.

# %%
B, H, N, D = 1, 16, 16384, 128
flops = 4 * B * H * N * N * D
bytes_min = 4 * B * H * N * D * 2                     # q, k, v read, o written, bf16
bf16_rate, bandwidth = 790e12, 4.3e12                  # measured on an H200 here (dense bf16 matmul, copy)
print(f"FLOPs {flops / 1e12:.2f} T -> {flops / bf16_rate * 1e3:.2f} ms at {bf16_rate / 1e12:.0f} TFLOP/s")
print(f"bytes {bytes_min / 1e6:.0f} MB -> {bytes_min / bandwidth * 1e3:.3f} ms at {bandwidth / 1e12:.1f} TB/s")
print(f"arithmetic intensity {flops / bytes_min:.0f} FLOP/byte: compute-bound by two orders of magnitude")
r = rec("sdpa-flash", 128, 16384, False)
print(f"SDPA-FLASH (FlashAttention-2) measured: {r['ms']:.2f} ms = {r['tflops']:.0f} TFLOP/s, "
      f"{r['tflops'] * 1e12 / bf16_rate:.0%} of the dense matmul rate")

# %% [markdown]
# So the question for every version is how busy it keeps the tensor cores. FlashAttention-2 reaches under half
# of the dense rate because it uses `mma.sync`, the Ampere-era instruction: Hopper's full rate needs `wgmma`
# and the TMA copy engine (FlashAttention-3). Our versions use `mma.sync` too, so FlashAttention-2 is the fair
# yardstick.
#
# ## 2. Building: `torch.utils.cpp_extension`
#
# `step07.build()` compiles `csrc/` into a Python module the first time (about 20 s on 16 cores) and loads
# it from the cache afterwards. The kernels (`.cu`) include only CUDA headers; `step07_binding.cpp` is the
# only file that includes torch. The flags:
#
# - `-O3`.
# - `--use_fast_math`: `expf`/`exp2f` become the hardware's `ex2.approx` (about 2 ulp, far below bf16's
#   3.9e-3 and fp16's 4.9e-4 rounding of every stored value), divisions become approximate reciprocals, fp32
#   denormals (below 1.2e-38) flush to zero — probabilities that small add nothing to a row sum near 1. Here
#   the float64 reference decides; elsewhere, measure before you trust it.
# - `-gencode arch=compute_90,code=sm_90` on an H100/H200 (`sm_80` on an A100): machine code for this chip
#   only, nothing JIT-compiled from PTX at load time.
# - The cache: `~/.cache/attn-course/attn_step07_<hash>` (or `$ATTN_BUILD_DIR`), the hash over every
#   source, the flags and torch's version. Edit a kernel and you get a fresh directory and a full rebuild,
#   never a stale module.

# %%
print("nvcc flags:", step07.NVCC_FLAGS + step07.arch_flags((9, 0)), "(+ cpp_extension's own)")
print("sources:", step07.SOURCES)
print("nvcc found:", step07.find_nvcc())
try:
    ext = step07.build()
    print("built:", ext.__name__)
except RuntimeError as err:          # no GPU (or no nvcc): a clear message, not a crash
    ext = None
    print("RuntimeError:", err)

# %% [markdown]
# The contract narrows here: head dims 64 and 128 only, fp16/bf16 on the tensor-core versions (fp32 on
# v1), CUDA tensors. Each refusal is a `ValueError` that says what is supported, raised before anything
# is built:

# %%
for what, call in [
    ("D=80", lambda: step07.attention(*make_qkv(1, 1, 8, D=80, dtype=torch.float16))),
    ("fp32 on v3", lambda: step07.attention(*make_qkv(1, 1, 8, D=64), version=3)),
    ("CPU tensors", lambda: step07.attention(*make_qkv(1, 1, 8, D=64), version=1)),
]:
    try:
        call()
    except ValueError as err:
        print(f"{what:12s} ValueError: {err}")


# %% [markdown]
# ## 3. Version 1: the source material's structure, in scalar fp32
#
# One CTA owns 64 query rows, one thread per row. Each thread keeps its row's running max $m$, running sum
# $\ell$ and unnormalized output $o[D]$ in registers; the CTA copies tiles of 32 keys and values into
# shared memory (as fp32) and every thread folds them into its state:
#
# $$m' = \max(m, \max_j s_j),\quad \ell' = e^{m - m'}\ell + \sum_j e^{s_j - m'},\quad
# o' = e^{m - m'} o + \sum_j e^{s_j - m'} v_j$$
#
# Two details that matter even here. The Q tile's rows are padded by one float, so 32 threads reading
# `Qs[row][d]` fall in 32 different banks. And the scores of a tile go to a per-thread row of shared memory,
# not a register array: the loop over keys is not unrolled, and a register array indexed at run time is
# placed in local memory (off-chip). The region you write in `steps/csrc/step07_fwd_v1.cu`:

# %%
# The region as it stands in the folder IMPL names: with "steps", your file (a TODO until you write
# it); with "solutions", the course's code. Nothing here reads solutions/ behind your back.
from attnlib.nb import show_region as region

print(region("step07_fwd_v1.cu", "online softmax"))


# %%
def check_version(version, dtypes, Ds=(64, 128)):
    if not on_gpu:
        print(f"no GPU here: skipping v{version}'s launch (the recorded H200 results follow)")
        return
    for dtype in dtypes:
        for D in Ds:
            for nq, nk in [(100, 100), (257, 129), (17, 300)]:
                for causal in (False, True):
                    q, k, v = make_qkv(2, 3, nq, nk, D, dtype=dtype, device=device)
                    attn = lambda q, k, v, is_causal, scale: step07.attention(
                        q, k, v, is_causal=is_causal, scale=scale, version=version)
                    check_attention(attn, q, k, v, is_causal=causal)
                    _, lse = step07.attention_with_lse(q, k, v, is_causal=causal, version=version)
                    check_lse(lse, q, k, v, is_causal=causal)
    print(f"v{version}: O, LSE, dQ, dK, dV match the float64 reference")

check_version(1, (torch.float32, torch.bfloat16))
show(["sdpa-flash", "step07-v1"], Ns=(512, 1024))

# %% [markdown]
# About 9 TFLOP/s at D=128: every multiply-add is one FFMA fed by shared-memory loads, on the fp32 units
# (67 TFLOP/s at best on this chip, and we are load-bound well before that). It is the baseline the other
# versions are checked against, and too slow to time past N=1024.
#
# ## 4. Version 2: tensor cores
#
# `mma.sync.aligned.m16n8k16` multiplies a 16×16 tile by a 16×8 tile for a whole warp in one instruction
# (4096 FLOPs), in fp16 or bf16 with fp32 accumulation. The work is now split by warps: 4 warps × 16 query
# rows per CTA, key tiles of 64. A warp's scores $S$ (16×64) and output $O$ (16×D) live spread over its 32
# threads in the fragment layout: with $g$ = lane/4 and $t$ = lane%4, a thread holds rows $g$ and $g+8$,
# columns $2t$ and $2t+1$ of every 8-column slice. So:
#
# - the row max and the row sum are per thread over its columns, then over the 4 threads of a quad with two
#   `__shfl_xor_sync` (offsets 1 and 2);
# - the C fragments of $S = QK^\top$ (16×8 slices) are laid out exactly as the A fragment of the next
#   product (16×16 slices): $P$ is rounded to 16 bits in registers and fed straight back, never stored.
#
# The region you write: the B fragment of $K^\top$ straight from shared memory.

# %%
print(region("step07_fwd_v2.cu", "load the two B registers"))
check_version(2, (torch.float16, torch.bfloat16))
show(["sdpa-flash", "step07-v1", "step07-v2"])

# %% [markdown]
# Six times v1, and a sixth of FlashAttention-2, flat in N. v2 was left simple on purpose; by reading it
# (it was not profiled) three things hold it back: its tiles are copied with ordinary loads, so the CTA waits
# for every copy between two barriers; its fragment loads are 32-bit (and V's 16-bit, two per register,
# since a B fragment wants two rows of one column); and its rows are neither padded nor swizzled, so at
# D=64 or 128 the 8 rows a warp reads at once start in the same bank: 8-way conflicts on every load.
#
# ## 5. Version 3: the production techniques
#
# 1. **`cp.async` double buffering.** Two stages of K and V in shared memory. At the top of iteration $j$ the
#    CTA starts copying tile $j+1$ into the other stage (global → shared, no registers in between, no
#    waiting) and computes on tile $j$ while it lands. One barrier per iteration instead of two.
# 2. **`ldmatrix`.** One instruction loads four 8×8 fragments for the warp, 16 bytes per lane;
#    `ldmatrix.trans` delivers V already in the B layout that v2 assembled from 16-bit loads.
# 3. **Swizzling.** A row of D 16-bit values is D/8 chunks of 16 bytes; chunk $c$ of row $r$ is stored at
#    chunk $c \oplus (r \bmod 8)$. The 8 rows an `ldmatrix` reads then sit in 8 different 4-bank groups: no
#    conflicts, and unlike padding no wasted bytes.
# 4. **32 rows per warp** (two m16 tiles; CTA tiles of 128 queries × 64 keys, FlashAttention-2's shape at
#    D=128): each K and V fragment read from shared memory feeds two `mma` instead of one.
# 5. **Unrolled loops, base-2 softmax** with the scale folded into one FFMA per score
#    ($e^{x s - m s} = 2^{x s \log_2 e - m s \log_2 e}$), row sums combined across the quad once, at the end.
# 6. **Causal scheduling.** The longest query tiles launch first, tiles wholly below the diagonal skip the
#    mask.
#
# The region you write is the prefetch:

# %%
print(region("step07_fwd_v3.cu", "prefetch"))
check_version(3, (torch.float16, torch.bfloat16))
show(["sdpa-flash", "step07-v2", "step07-v3"], D=128)
show(["sdpa-flash", "step07-v2", "step07-v3"], D=64)

# %% [markdown]
# ### Forward v4: `wgmma` (H100/H200 only)
#
# v3 gets to 0.97× of FlashAttention-2 with the Ampere instruction `mma.sync`. Hopper has its own:
# `wgmma.mma_async`, issued by a *warpgroup* (4 warps, 128 threads) for a 64 × N × 16 product, with the
# operands read by the tensor cores **straight from shared memory** (A may also come from registers), and
# asynchronous: the warps issue, go on, and wait for the result when they need it (`wgmma.fence`,
# `commit_group`, `wait_group`). v4 (`step07_fwd_v4.cu`) keeps v3's algorithm and its `cp.async` loads and
# changes the products:
#
# - S = Q K^T: both operands from shared memory. wgmma finds a tile through a 64-bit **descriptor**: the
#   start address, two byte strides (LBO, SBO) and a swizzle mode. The tiles use the 128-byte swizzle, v3's
#   XOR in blocks of 64 columns, so Q and K are "K-major" (D contiguous) as `cp.async` writes them.
# - O += P V: P from registers (the S accumulator's layout is, 16 keys at a time, the A operand's: the
#   FlashAttention-3 way); V is "MN-major" (its contiguous dimension is D, the output's), which the
#   instruction's transpose bit for B selects.
# - A CTA is two warpgroups, 128 query rows; tiles of 128 × 128 (config 0) or 128 × 64 (config 1).
#
# What it does not do yet (FlashAttention-3 does): TMA loads, producer/consumer warp specialization,
# overlapping one tile's softmax with the next tile's Q K^T; each wgmma batch is waited on at once.
# `bench/experiments/cuda_v4_wgmma.py` checks it (probes that name the wrong rows and columns if a
# descriptor is off, then the float64 grid, then compute-sanitizer's memcheck and racecheck) and times it
# beside v3, SDPA-FLASH and cuDNN. On the H200 (2026-12-01, `results/h200/step07_v4/`; bf16, B = 16384 / N,
# H = 2048 / D, N 4k-16k): every probe and all 80 reference cases right, no sanitizer error, and
#
# | TFLOP/s, ratio to cuDNN in the same run | D = 64 | D = 128 |
# |---|---|---|
# | v3 | 286-316 (0.67-0.69x) | 284-339 (0.54-0.56x) |
# | v4, 128 x 64 tiles (config 1) | 368-405 (**0.87-0.88x**) | 377-438 (0.69-0.79x) |
# | v4, 128 x 128 tiles (config 0) | 294-331 (0.69-0.75x) | 368-426 (0.67-0.76x) |
# | SDPA-FLASH | 281-308 (0.66-0.67x) | 306-351 (0.56-0.58x) |
#
# v4 is 1.27-1.29x v3 at D = 64 and 1.26-1.39x at D = 128, and passes SDPA-FLASH everywhere; cuDNN keeps
# 12-31% through what v4 does not have yet (TMA, warp specialization, softmax overlapped with the next
# product; section 7 reads it in the profiler). The region you write is the descriptor itself, in
# `step07_wgmma.cuh` (the descriptor and `wgmma` wrappers v4 and v5 share):

# %%
print(region("step07_wgmma.cuh", "pack the start address"))
if on_gpu and torch.cuda.get_device_capability() == (9, 0):
    check_version(4, (torch.float16, torch.bfloat16))
else:
    print("v4 runs on sm_90 (H100/H200) only: skipped here")

# %%
fig, axes = plt.subplots(1, 4, figsize=(16, 3.4), sharey=True)
Ns = sorted({r["N"] for r in rows})
for ax, (D, causal) in zip(axes, [(64, False), (64, True), (128, False), (128, True)]):
    for impl, style in [("sdpa-flash", "k--"), ("step07-v1", "o-"), ("step07-v2", "o-"), ("step07-v3", "o-")]:
        pts = [(N, rec(impl, D, N, causal)) for N in Ns]
        pts = [(N, r["tflops"]) for N, r in pts if r]
        if pts:
            ax.plot(*zip(*pts), style, label=impl)
    ax.set_xscale("log", base=2); ax.set_xlabel("N"); ax.set_title(f"D={D}, {'causal' if causal else 'not causal'}")
axes[0].set_ylabel("TFLOP/s (bf16 forward)"); axes[0].legend(fontsize=8)
fig.suptitle(f"{m['gpu']}, {m['date']}: 16k tokens, hidden 2048"); plt.tight_layout(); plt.show()

# %% [markdown]
# What each change bought, at N=16384 (bf16, not causal): v1 → v2 about 6×, v2 → v3 about 6×. v3 runs at
# 0.95–0.98× of SDPA-FLASH at D=128 for N ≥ 4096, causal or not (the course's target was 0.9×; the
# stretch goal of 1.0× is reached at D=64, 1.01–1.03×, not at D=128), and above it at short causal
# sequences, where launching the longest tiles first pays.
#
# The tile shape is a trade, and the benchmark times every shape v3 can launch (`config` of
# `FlashAttentionCUDA`; 0 is the default):

# %%
names = {0: "128x64, 4 warps x 32 rows", 1: "128x32, 4 warps x 32 rows", 2: "128x64, 8 warps x 16 rows",
         3: "128x128, 4 warps x 32 rows"}
for D in (64, 128):
    for c in step07.V3_CONFIGS[D]:
        impl = "step07-v3" + (f"-c{c}" if c else "")
        r1, r2 = rec(impl, D, 16384, False), rec(impl, D, 16384, True)
        print(f"D={D:3d} config {c} ({names[c]:27s}): {r1['tflops']:5.0f} TFLOP/s (x{r1['ratio_to_sdpa_flash']:.2f}), "
              f"causal {r2['tflops']:5.0f} (x{r2['ratio_to_sdpa_flash']:.2f})")

# %% [markdown]
# Sixteen rows per warp (config 2) costs about 10% at D=128; it reads K and V from shared memory twice as
# often per FLOP. Halving the key tile (config 1) saves 32 registers of scores but doubles the iterations, their
# barriers and their rescaling of O. At D=64, 128×128 tiles (config 3, FlashAttention-2's shape there) land within 2%
# of the default either way, so the default stays one shape for both head dims.
#
# ## 6. Registers and spills: `-Xptxas -v`
#
# The compiler's resource report costs no GPU and answers the first questions: how many registers, and did
# anything spill to local memory. Recorded with the same nvcc and flags as the build
# (`results/h200/step07_ptxas.txt`):
#
# ```
# nvcc -O3 --use_fast_math -gencode=arch=compute_90,code=sm_90 -std=c++17 -Xptxas -v -c step07_fwd_v3.cu
# ```

# %%
text = (RESULTS / "step07_ptxas.txt").read_text()
print(text.splitlines()[1])
kernel = None
for line in text.splitlines():
    if line.startswith("void "):
        kernel = re.sub(r"\(step07::\w+\)", "", line[5:])
    elif "spill stores" in line:
        spill = int(re.search(r"(\d+) bytes spill stores", line).group(1))
    elif line.startswith("Used") and kernel and "nv_bfloat16" in kernel:
        regs = int(re.search(r"Used (\d+) registers", line).group(1))
        print(f"  {kernel:62s} {regs:4d} registers, {spill:3d} bytes spilled")

# %% [markdown]
# v3 at D=128 uses all 255 registers a thread may have and spills 48 bytes. Its accumulator alone is
# $32 \times 128$ fp32 per warp = 128 registers per thread, plus 64 for the scores. The disassembly
# (`cuobjdump -sass`) shows where the spill lands: ten `LDL` per iteration, all in the prefetch's address
# arithmetic, none between the 256 `HMMA` of an iteration. 255 registers × 128 threads allow 2 CTAs (8
# warps) per SM, and its 96 KB of shared memory allow the same: the two limits agree, as they do for
# FlashAttention-2.
#
# ## 7. Profiling: `ncu`
#
# Nsight Compute reads the hardware counters for one launch. Leave the clocks as you find them
# (`--clock-control none`): the machine is shared, and locked clocks would not be the clocks you run at.
# The profile recorded here runs v3 and SDPA-FLASH on the same input (bf16, D=128, N=4096, B=4, H=16, not
# causal), skipping the warm-up launches:
#
# ```
# ncu --clock-control none -k regex:"fwd_v3|flash_fwd" --launch-skip 2 --launch-count 2 \
#     --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
#     python bench/cuda_gpu.py --profile-once
# ```
#
# Add `--set full -o v3` to save everything for the GUI, and `--import-source yes` with the `-lineinfo` the
# build already passes, to see the stalls line by line.

# %%
ncu = (RESULTS / "step07_ncu_v3_vs_sdpa_flash.txt").read_text()
blocks = re.split(r"\n  (?=void )", ncu)[1:]
keys = ["Duration", "Compute (SM) Throughput", "L1/TEX Cache Throughput", "Warp Cycles Per Issued Instruction",
        "Registers Per Thread", "Dynamic Shared Memory Per Block", "Theoretical Occupancy", "Achieved Occupancy"]
for b in blocks:
    name = "step07 v3" if "fwd_v3" in b.splitlines()[0] else "SDPA-FLASH (FlashAttention-2)"
    print(name)
    for k in keys:
        mm = re.search(re.escape(k) + r"\s+(\S+(?: \S+)?)\s+([\d.,]+)\n", b)
        if mm:
            print(f"  {k:38s} {mm.group(2):>10s} {mm.group(1)}")

# %% [markdown]
# The same occupancy (8 warps per SM, limited by registers and shared memory alike) and a similar load on the
# L1/shared-memory pipe (49% against 55%). v3 takes 6% longer, and its warps wait 4.8 cycles between two
# issued instructions against FlashAttention-2's 4.3; the largest stall ncu names for both is waiting on
# fixed-latency dependencies (1.6 and 1.3 of those cycles). That points at the order of instructions inside a
# warp rather than at the memory system; the sampled stall locations (`--set full`, source view) would say
# where.
#
# ### v3 and v4 against cuDNN: what the profiler says is left
#
# The same questions for the Hopper kernels (`bench/experiments/cuda_v3_v4_ncu.py`, one H200, 2026-12-01):
# one forward each of v3, v4 (128 x 64 tiles, the default) and cuDNN's SDPA kernel, bf16, not causal, B = 1,
# H = 2048 / D, N = 16384, at D = 64 and 128. The FLOP count is the same at both D: the tensor cores have the
# same products to compute in all six kernels. Two counters to read:
#
# - **tensor pipe active**: the share of the kernel's cycles the tensor pipe is busy
#   (`sm__pipe_tensor_cycles_active`, `mma.sync` and `wgmma` alike). Times the duration, it is how long the
#   tensor cores worked: the work they were given, whatever the kernel does around it.
# - **stall reasons**: for each issued instruction, how many cycles warps spent in each state
#   (`smsp__average_warps_issue_stalled_<reason>_per_issue_active.ratio`). They add up to the warp cycles per
#   issued instruction; `selected` is the issuing cycle itself, 1 for every kernel.
#
# ncu fixed the clocks (1.34-1.37 GHz, its default without `--clock-control`), so its durations are 1.1-1.3x
# those of the timing tables above: compare times only within this profile. The numbers, read from
# `results/h200/step07_v4/ncu/summary.json` (its README holds the full table, with v4's 128 x 128 tiles):

# %%
prof = json.loads((RESULTS / "step07_v4" / "ncu" / "summary.json").read_text())
pm = prof["machine"]
print(f"recorded: {pm['gpu']}, torch {pm['torch']}, CUDA {pm['cuda']}, {pm['date']}; "
      f"SM clock under ncu {min(k['sm_clock_ghz'] for k in prof['kernels']):.2f}-"
      f"{max(k['sm_clock_ghz'] for k in prof['kernels']):.2f} GHz")
picked = [k for k in prof["kernels"] if k["side"].split()[0] in ("v3", "v4-128x64", "cudnn")]
label = {"v3": "v3 (mma.sync)", "v4-128x64": "v4 (wgmma)", "cudnn": "cuDNN"}
print(f"{'':16s} {'D':>4s} {'ms':>6s} {'tensor':>7s} {'busy ms':>8s} {'gmma/hmma':>10s} {'XU':>6s} "
      f"{'inst 1e9':>9s} {'warps/SM':>9s}  top stalls (cycles per issued instruction)")
for k in picked:
    print(f"{label[k['side'].split()[0]]:16s} {k['D']:4d} {k['duration_ms']:6.2f} {k['tensor_pipe_active_pct']:6.1f}% "
          f"{k['tensor_busy_ms']:8.2f} {k['gmma_inst_pct']:4.1f}/{k['hmma_inst_pct']:4.1f}% {k['xu_pipe_pct']:5.1f}% "
          f"{k['instructions_issued_e9']:9.2f} {k['warps_per_sm']:9.1f}  "
          + ", ".join(f"{x} {v:.2f}" for x, v, _ in k["top_stalls"][:3]))

# %%
reasons = ["selected", "barrier", "wait", "not_selected", "mio_throttle", "long_scoreboard", "dispatch_stall",
           "math_pipe_throttle", "short_scoreboard", "gmma"]
names = [f"{label[k['side'].split()[0]]}\nD={k['D']}" for k in picked]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(16, 4.2))
x = range(len(picked))
busy = [k["tensor_busy_ms"] for k in picked]
idle = [k["duration_ms"] - k["tensor_busy_ms"] for k in picked]
ax1.bar(x, busy, color="tab:green", label="tensor pipe busy")
ax1.bar(x, idle, bottom=busy, color="lightgray", label="tensor pipe idle")
for i, k in enumerate(picked):
    ax1.text(i, k["duration_ms"] + 0.1, f"{k['tensor_pipe_active_pct']:.0f}%", ha="center", fontsize=9)
ax1.set_xticks(list(x), names, fontsize=8); ax1.set_ylabel("ms under ncu (clocks fixed)")
ax1.set_ylim(0, 1.12 * max(k["duration_ms"] for k in picked))
ax1.set_title("kernel time: tensor pipe busy vs idle (% = tensor pipe active)"); ax1.legend(fontsize=8)
bottom = [0.0] * len(picked)
for r in reasons + ["other"]:
    vals = [k["warp_cycles_per_issued_instruction"] - sum(k["stalls"][q] for q in reasons) if r == "other"
            else k["stalls"][r] for k in picked]
    ax2.bar(x, vals, bottom=bottom, label=r, color="lightgray" if r == "other" else None)
    bottom = [b + v for b, v in zip(bottom, vals)]
ax2.set_xticks(list(x), names, fontsize=8); ax2.set_ylabel("warp cycles per issued instruction")
ax2.set_title("where the warps' cycles go"); ax2.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
fig.suptitle(f"{pm['gpu']}, {pm['date']}: forward, bf16, N=16384, not causal, ncu"); plt.tight_layout(); plt.show()

# %% [markdown]
# Three things to read off it.
#
# - **wgmma does the same work in fewer tensor-pipe cycles.** v3 executes only `mma.sync` (the hmma
#   counter), v4 and cuDNN `wgmma` (gmma; their hmma counter is exactly half of it, the same instructions
#   counted against another peak). The green bars: every wgmma kernel keeps the tensor pipe busy about
#   3.0 ms for this work, v3 4.5 ms for the same FLOPs. That 1.5x is the saving `wgmma` offers; v4 runs
#   1.27-1.39x faster than v3.
# - **v4 gives the tensor cores as much work as cuDNN, and leaves them idle longer.** The gray bars: 3.9 and
#   3.6 ms idle in v4 against 2.9 and 1.0 in cuDNN; at D = 128 cuDNN keeps the pipe 75% busy, v4 45%. At
#   D = 64 the exponentials (the XU pipe) take as long as the products, about 3.1 ms in every kernel; cuDNN's
#   tensor and XU busy times add to more than its duration, so part of them must have overlapped, while v4's
#   add to less. A waiting warp costs nothing while a `wgmma` runs meanwhile; in v4 each warpgroup waits for
#   its product (`wait_group 0`), then does its softmax, then issues the next one.
# - **v4's largest stall is the barrier** (19% of warp cycles at D = 64, 30% at D = 128): its loop's one
#   `__syncthreads` per key tile, after its own `cp.async` copies. cuDNN stalls at barriers too (17% and
#   26%), so the stall alone is not the gap. But v4 also issues 1.3-1.5x cuDNN's instructions and waits on
#   the MIO queue 0.55 and 0.30 cycles per instruction against 0.04 and 0.02; cuDNN's TMA pipe is active and
#   v4's at 0: cuDNN's copies are one instruction a tile, v4's `cp.async` instructions of 16 bytes a thread,
#   issued by the warps that compute.
#
# Which points at the next version, at what FlashAttention-3 does: overlap each tile's softmax with the next
# tile's `wgmma` (within a warpgroup, or two consumer warpgroups taking turns), and load with TMA from a
# producer warp with a barrier per stage instead of one for the whole CTA. These counters do not say on which
# instruction v4's warps wait; ncu's source view (`--set full`, with the `-lineinfo` the build passes) would.
#
# ### Forward v5: warp specialization (H100/H200 only)
#
# v5 (`step07_fwd_v5.cu`) keeps v4's layout, descriptors and `wgmma` wrappers and splits the CTA's warps
# by **role**, as FlashAttention-3's Hopper forward does. A CTA is three warpgroups (384 threads; four in config 5),
# one CTA an SM:
#
# - **The producer** (warpgroup 0) only loads. One elected thread issues **TMA** copies
#   (`cp.async.bulk.tensor`: the Tensor Memory Accelerator copies a whole 64-column block of a tile from
#   global to shared memory, forms the addresses and applies v4's 128-byte swizzle itself, and zero-fills rows
#   past the sequence's end). It loads Q once, then K and V tile by tile into a **ring** of `STAGES`
#   shared-memory stages.
# - **The consumers** (warpgroups 1 and 2, 64 query rows each, as v4's two warpgroups) only compute: the
#   `wgmma` products, the mask, the online softmax.
#
# They meet on **mbarriers**, shared-memory barrier objects with a phase bit, two kinds per stage and tensor:
#
# - *full*: the producer arms it with `mbarrier.arrive.expect_tx` ("one arrival, and this many bytes to
#   come"); the TMA unit counts the bytes as they land (`complete_tx`), and the phase completes when all have.
#   A consumer waits on it (`try_wait.parity`) before it reads the stage.
# - *empty*: each of the 256 consumer threads arrives once it is done with the tile; the producer waits on it
#   before it overwrites the stage. Tile j uses stage `j % STAGES`, and the parity to wait for flips every
#   time round the ring. There is no `__syncthreads` in the main loop.
#
# **`setmaxnreg`** moves registers between roles: all 384 threads start with what the launch gives them
# (168 each with two consumers), then the producer drops to 24 (`setmaxnreg.dec`) and the consumers rise to 240
# (`setmaxnreg.inc`): 128 x 24 + 256 x 240 = 64512 of the SM's 65536, where v4's 256 threads had 255 at most.
# Inside a consumer, iteration j issues O += P_{j-1} V_{j-1} and S = Q K_j^T back to back and waits once for
# both. **Ping-pong** (configs 3 and 4) adds FlashAttention-3's schedule between the two consumers: two named
# barriers hand a turn back and forth, and a consumer issues its `wgmma` batch only in its turn, passing
# the turn on right after issuing, so the tensor cores run one warpgroup's products while the other does its
# softmax. Config 5 instead has three consumers (192-row tiles, 160 registers each).
#
# The pieces, read from the file at run time (your copy with IMPL = "steps"):

# %%
from attnlib.loader import impl_root

def excerpt(file, start, n=1):
    """n lines of csrc/<file> (in the folder IMPL names) from the first line containing `start`."""
    lines = (impl_root(IMPL) / "csrc" / file).read_text().splitlines()
    i = next(i for i, line in enumerate(lines) if start in line)
    return "\n".join(f"{i + 1 + k:4d}  {line}" for k, line in enumerate(lines[i:i + n]))

V5, TMA = "step07_fwd_v5.cu", "step07_tma.cuh"   # v5's kernel; the machinery v5 and v6 share
print("// the configs' register split\n" + excerpt(TMA, "static constexpr int PRODUCER_REGS", 3))
print("\n// one full and one empty barrier per stage for K and for V (arrivals expected: 1 producer, 128 a consumer)\n"
      + excerpt(TMA, "for (int s = 0; s < Cfg::STAGES; ++s) {", 6))
print("\n// the producer arms a full barrier with its byte count ...\n" + excerpt(TMA, "void mbar_expect_tx", 3))
print("\n// ... and TMA's copy completes the bytes on it\n" + excerpt(TMA, "void tma_load_3d", 6))
print("\n// the roles part: the producer gives registers back, the consumers take them\n"
      + excerpt(V5, "regs_dec<Cfg::PRODUCER_REGS>", 2) + "\n" + excerpt(V5, "regs_inc<Cfg::CONSUMER_REGS>", 1))
print("\n// a consumer, once its products are done, releases the stage to the producer\n"
      + excerpt(V5, "mbar_arrive(r.empty_k(st))", 2))
print("\n// ping-pong: wait for my turn, issue, hand the turn over\n"
      + excerpt(V5, "named_sync(1 + cw, 256)", 1) + "\n" + excerpt(V5, "named_arrive(2 - cw, 256)", 1))

# %% [markdown]
# The region you write is the producer's loop body: wait for the stage to be free, arm its full barrier,
# issue the TMA loads. It lives in `step07_tma.cuh`, with the rest of what v5 shares with v6 (next section):
# the ring, the tensor maps, the epilogue.

# %%
print(region("step07_tma.cuh", "wait until the consumers have released stage st"))
if on_gpu and torch.cuda.get_device_capability() == (9, 0):
    check_version(5, (torch.float16, torch.bfloat16))
else:
    print("v5 runs on sm_90 (H100/H200) only: skipped here")

# %% [markdown]
# `bench/experiments/cuda_v5.py --sanitize` checked and timed it on the H200 (2026-12-01, the tree of c7087a7,
# `results/h200/step07_v5/`, whose README has the tables): 336 of 336 cases against the float64 reference
# (bf16/fp16, both D, causal and not, every config, Nq != Nk among them), compute-sanitizer memcheck and
# racecheck clean. Its timing, one run, every config as a ratio to cuDNN timed in the same run (bf16,
# B = 16384 / N, H = 2048 / D):

# %%
def recorded_run(path):
    """A committed experiment run (bench/experiments/gpu_run.py's JSON): say where and how it ran, return
    (meta, its timing rows sorted by D, mask, N)."""
    run = json.loads(path.read_text())
    m, parts = run["meta"], run["parts"]
    ok = parts["2 correctness"]
    print(f"recorded: {m['gpu']}, torch {m['torch']}, CUDA {m['cuda']}, {m['date_utc']}, git {m['git']}; "
          f"reference {ok['n'] - ok['n_fail']}/{ok['n']}, memcheck rc {parts['4 sanitize']['memcheck']['rc']}, "
          f"racecheck rc {parts['4 sanitize']['racecheck']['rc']}")
    return m, sorted(parts["3 timing"]["rows"], key=lambda r: (r["D"], r["causal"], r["N"]))


def ratio_bars(rows, names, title, ylim, colors={}):
    """Per head dim, a bar per implementation (names: impl -> label) and shape: its ratio to cuDNN."""
    fig, axes = plt.subplots(1, 2, figsize=(16, 4.2), sharey=True)
    width = 0.8 / len(names)
    for ax, D in zip(axes, (64, 128)):
        rs = [r for r in rows if r["D"] == D]
        for i, impl in enumerate(names):
            ax.bar([j + (i - (len(names) - 1) / 2) * width for j in range(len(rs))],
                   [r["x_cudnn"].get(impl, 0) for r in rs], width, label=names[impl], color=colors.get(impl))
        ax.axhline(1.0, color="k", lw=0.8); ax.axhline(0.9, color="k", lw=0.8, ls=":")
        ax.set_xticks(range(len(rs)), [f"N={r['N']}\n{'causal' if r['causal'] else 'full'}" for r in rs], fontsize=8)
        ax.set_title(f"D={D}"); ax.set_ylim(*ylim)
    axes[0].set_ylabel("x cuDNN (same run)"); axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    fig.suptitle(title)
    plt.tight_layout(); plt.show()


vm, v5rows = recorded_run(RESULTS / "step07_v5" / "cuda_v5.json")
ratio_bars(v5rows, {"v4": "v4 (128x64, cp.async)", "v5-c0": "c0 128x64, 2 stages", "v5-c1": "c1 128x64, 4 stages",
                    "v5-c2": "c2 128x128 (default)", "v5-c3": "c3 128x64 ping-pong", "v5-c4": "c4 128x128 ping-pong",
                    "v5-c5": "c5 192x64, 3 consumers"},
           f"{vm['gpu']}, {vm['date_utc']}: forward v4 and v5 configs 0-5, bf16, ratio to cuDNN (one run)",
           (0.6, 1.02), {"v4": "gray"})

# %% [markdown]
# Technique by technique: each ratio of TFLOP/s isolates one change between two configs (the range is over
# N = 4096-16384):

# %%
def tfl(impl, D, causal):
    return [r["tflops"][impl] for r in v5rows if (r["D"], r["causal"]) == (D, causal)]

deltas = [("v5-c0", "v4", "TMA + producer + setmaxnreg (128x64; c0 vs v4)"),
          ("v5-c1", "v5-c0", "4 stages instead of 2 (c1 vs c0)"),
          ("v5-c2", "v5-c0", "128x128 tiles (c2 vs c0)"),
          ("v5-c3", "v5-c0", "ping-pong at 128x64 (c3 vs c0)"),
          ("v5-c4", "v5-c2", "ping-pong at 128x128 (c4 vs c2)"),
          ("v5-c5", "v5-c0", "three consumers (c5 vs c0)"),
          ("v5-c2", "v4", "v5's default against v4 (c2 vs v4)")]
shapes = [(64, False), (64, True), (128, False), (128, True)]
print(f"{'':48s}" + "".join(f"{'D=%d %s' % (D, 'causal' if c else 'full'):>16s}" for D, c in shapes))
for a, b, what in deltas:
    cells = []
    for D, c in shapes:
        x = [p / q for p, q in zip(tfl(a, D, c), tfl(b, D, c))]
        cells.append(f"{min(x):.2f}-{max(x):.2f}x".rjust(16))
    print(f"{what:48s}" + "".join(cells))

# %% [markdown]
# What it says (one run: a few percent between two configs is within what a second run could move):
#
# - **TMA, the producer and `setmaxnreg`** (config 0 against v4 at the same 128 x 64 tiles) pay at D = 128,
#   +15-17%, and cost 9-13% at D = 64. Config 0 runs one CTA an SM by construction; at D = 64 v4's 128 x 64
#   tiles ran two (15.8 warps an SM in the ncu profile above), which is one reading of the loss, not a
#   measurement: v5 has not been profiled.
# - **Four stages** (config 1) buy nothing at D = 64 and cost 10-11% at D = 128: two stages already keep the
#   consumers fed.
# - **128 x 128 tiles** (config 2) are the largest step, +18-20% at D = 64 and +3-8% at D = 128, where in v4
#   the same tiles lost (they cost v4 its second CTA an SM; v5 has one either way). Config 2 is v5's default:
#   0.91-0.98x cuDNN at D = 64, 0.84-0.95x at D = 128, against v4's 0.86-0.90x and 0.68-0.76x in the same run.
# - **Ping-pong** pays only at D = 128 without a mask, on 128 x 128 tiles (config 4: 0.94-0.95x cuDNN at
#   N = 4096 and 16384, but level with config 2 at N = 8192); elsewhere it is within a few percent, or costs
#   up to 9% (D = 64 causal).
# - **Three consumers** (config 5) help at D = 64 against config 0 (+7-15%) but stay below config 2.
#
# Still missing against cuDNN and FlashAttention-3: the softmax of one tile under a product still in flight
# inside one warpgroup (v6, next), a TMA store of O, persistent CTAs, cluster multicast of K and V.

# %% [markdown]
# ### Forward v6: the softmax under the product (H100/H200 only)
#
# In v5 a consumer issues $O \mathrel{+}= P_{j-1} V_{j-1}$ and $S_j = Q K_j^\top$, waits for **both**, then
# computes the softmax of $S_j$. While it computes exponentials its tensor cores have work only if the other
# consumer has a batch queued (ping-pong tries to arrange that, and paid in one corner only). FlashAttention-3
# (§3.2, "intra-warpgroup overlapping") keeps one product in flight **inside the same warpgroup**:
#
# 1. issue $S_j = Q K_j^\top$, then $O \mathrel{+}= P_{j-1} V_{j-1}$ (two commit groups, in this order);
# 2. `wgmma_wait<1>()`: wait until at most one group is pending. Groups retire in the order they were
#    committed, so the one left pending is the newer, $P_{j-1} V_{j-1}$: $S_j$ is ready. (Issued the other way
#    round, the same wait would leave $S_j$ pending, and the softmax would read registers the tensor cores may
#    still be writing: a race that neither the compiler nor `compute-sanitizer` reports, only the reference check);
# 3. mask, row max, `exp2`, row sums of $S_j$: the SFU and FMA pipes work while the tensor cores run $P V$;
# 4. `wgmma_wait<0>()`, then what touches $O$ or $P$: $O \mathrel{*}= \alpha$, pack $P_j$.
#
# v6 (`step07_fwd_v6.cu`) is v5 with exactly that loop: the producer, the ring, the tensor maps and the
# epilogue are v5's (`step07_tma.cuh`), and so is the register budget (one $S$ tile live, nothing in flight at
# the loop's back edge). Two things the machine code showed and the source alone does not: `ptxas` hoists a
# `wgmma` wait to the top of its basic block, above every exponential, unless something ends the block after
# them (v6 ends it with the wait on $V_j$'s mbarrier, needed next anyway), and an accumulator still in flight
# across the loop's back edge makes `ptxas` serialize every `wgmma` of the kernel (warning C7514). The test
# `tests/test_experiment_cuda_v6.py` reads the SASS: every `MUFU.EX2` of a tile is issued between the
# `HGMMA` group of $P V$ and the `WARPGROUP.DEPBAR` that retires it; in v5 none is. Your region is the loop
# body, in this order:

# %%
print(region("step07_fwd_v6.cu", "issue S_j (issue_s)"))
if on_gpu and torch.cuda.get_device_capability() == (9, 0):
    check_version(6, (torch.float16, torch.bfloat16))
else:
    print("v6 runs on sm_90 (H100/H200) only: skipped here")

# %% [markdown]
# `bench/experiments/cuda_v6.py --sanitize` checked and timed it on the H200 (2026-12-01, commit 29222e3, as an
# experiment whose config 2 kernels compile, instruction for instruction, to the course's;
# `results/h200/step07_v6/`): 196 of 196 cases against the float64 reference, compute-sanitizer memcheck and
# racecheck clean. The run also timed a second order, "S-next" (configs 6 and 7: the exponentials of tile $j$
# under $Q K_{j+1}^\top$, two $S$ tiles live), which did not make it into the course:

# %%
wm, v6rows = recorded_run(RESULTS / "step07_v6" / "cuda_v6.json")
ratio_bars(v6rows, {"sdpa-flash": "SDPA FLASH (FlashAttention-2)", "v5-c2": "v5 config 2 (128x128)",
                    "v6-c0": "v6 config 0 (128x64)", "v6-c2": "v6 config 2 (128x128, default)",
                    "v6-c6": "S-next 128x64 (left out)", "v6-c7": "S-next 128x128, D=64 (left out)"},
           f"{wm['gpu']}, {wm['date_utc']}: forward v5 and v6, bf16, ratio to cuDNN (one run)",
           (0.4, 1.1), {"sdpa-flash": "silver", "v5-c2": "gray"})

print(f"{'':34s}" + "".join(f"{'D=%d %s' % (D, 'causal' if c else 'full'):>16s}" for D, c in shapes))
for what, f in [("v6 config 2 / v5 config 2", lambda r: r["tflops"]["v6-c2"] / r["tflops"]["v5-c2"]),
                ("v6 config 2 / cuDNN", lambda r: r["x_cudnn"]["v6-c2"]),
                ("v5 config 2 / cuDNN", lambda r: r["x_cudnn"]["v5-c2"])]:
    cells = []
    for D, c in shapes:
        x = [f(r) for r in v6rows if (r["D"], r["causal"]) == (D, c)]
        cells.append(f"{min(x):.2f}-{max(x):.2f}x".rjust(16))
    print(f"{what:34s}" + "".join(cells))

# %% [markdown]
# What it says (one run, N = 4096-16384): the overlap is worth **3-12% over v5** at the same 128 x 128 tiles,
# and takes the forward to **0.91-1.06x cuDNN**: level with or faster than cuDNN at N >= 8192 causal and at
# D = 64 N = 16384, behind it at N = 4096 (0.91-0.95x). With 128 x 64 tiles (config 0) the $P V$ under
# which the exponentials hide is half as long, and v6 stays behind v5's default. The S-next order, which hides
# the exponentials under the *next* tile's $Q K^\top$ instead, keeps two $S$ tiles live and needs more waits: it
# was the slowest thing in the run (0.51-0.78x cuDNN).
#
# ## 8. The backward
#
# $$dV = P^\top dO,\quad dP = dO\,V^\top,\quad dS = P \circ (dP - \Delta),\ \Delta_i = \textstyle\sum_d dO_{id} O_{id},
# \quad dQ = s\, dS\, K,\quad dK = s\, dS^\top Q$$
#
# Both backward versions split the work the same way: a kernel computes $\Delta$; a kernel per block of keys
# walks the query tiles and accumulates $dK$ and $dV$; a kernel per block of queries walks the key tiles
# and accumulates $dQ$. Every gradient element has one owner: no atomics, a deterministic result, at the
# price of computing $S$ and $dP$ twice (seven products where FlashAttention-2, adding $dQ$ with atomics,
# does five). Version 2 runs every product on the tensor cores; in the dK/dV kernel a warp owns 16 keys and
# computes $S^\top = K Q^\top$ directly, so that $P^\top$ and $dS^\top$ come out in the A-fragment layout
# of $dV \mathrel{+}= P^\top dO$ and $dK \mathrel{+}= dS^\top Q$. Forward v1 is paired with backward v1,
# v2 and v3 with backward v2, the sm_90a forwards (v4 to v6) with backward v3 (below).

# %%
print(region("step07_bwd_mma.cu", "P^T = exp2"))
if on_gpu:
    for bwd in (1, 2):
        q, k, v = make_qkv(2, 3, 200, 150, 128, dtype=torch.bfloat16, device=device)
        attn = lambda q, k, v, is_causal, scale: step07.FlashAttentionCUDA.apply(
            q, k, v, is_causal, scale or 128 ** -0.5, 3, 0, bwd)
        check_attention(attn, q, k, v, is_causal=True)
        print(f"backward v{bwd}: dQ, dK, dV match the float64 reference")
else:
    print("no GPU here: skipping the backward's launch (the recorded H200 results follow)")
show(["sdpa-flash", "step07-bwd1", "step07-bwd2"], mode="bwd")

# %% [markdown]
# The tensor-core backward runs at 0.75–0.83× of FlashAttention-2's at N ≥ 4096 (0.92× and 1.04× at
# N=1024), 34× the scalar one. The FLOP count credits both with the same work, but the deterministic split
# does 7 products where FlashAttention-2 does 5: 1.4× the arithmetic, which is consistent with the gap (not
# measured apart from it).

# %% [markdown]
# ### Backward v3: dK/dV on `wgmma` (H100/H200 only)
#
# Against cuDNN's backward, v2 runs 0.43-0.52x on the H200 (the run below), and its dK/dV kernel, four of the
# seven products, is most of its time. Backward v3 (`step07_bwd_wgmma.cu`) keeps v2's split and its Delta and
# dQ kernels (reached through `bwd_mma_delta` / `bwd_mma_dq`), and writes the dK/dV kernel with forward v4's
# machinery (`step07_wgmma.cuh`). What `wgmma` changes in a backward:
#
# - **the M of every product is 64 keys of a warpgroup.** A CTA owns 128 keys (two warpgroups; v2: 64 keys,
#   4 warps x 16) and walks the query tiles of 64. $S^\top = K Q^\top$ and $dP^\top = V\,dO^\top$ are
#   `wgmma` SS, both operands read by the tensor cores from v4's swizzled shared memory through descriptors
#   (no `ldmatrix`), issued together and waited on once;
# - **$P^\top$ and $dS^\top$ go back from registers**, exactly as forward v4 feeds $P$: the fp32 accumulator of
#   $S^\top$ (then $dS^\top$) repacked to 16 bits is the A operand of `wgmma` RS for $dV \mathrel{+}= P^\top dO$
#   and $dK \mathrel{+}= dS^\top Q$;
# - **the B operand is read transposed.** $dO$ and $Q$ sit in shared memory K-major for $S^\top$ and $dP^\top$
#   (a row is a query's D values), but for $dV$ and $dK$ their K dimension is the queries, down the rows:
#   the same tile read MN-major (the instruction's `imm-trans-b` = 1, and the descriptor's leading offset
#   is the distance between 64-column blocks, BM x 128 bytes). Nothing is copied or transposed in memory;
# - dK and dV (64 x D a warpgroup) stay in registers: 254 registers a thread at D = 128, one 256-thread CTA
#   an SM (v2: two of 128).
#
# The region you write is those two RS products:

# %%
print(region("step07_bwd_wgmma.cu", "dV += P^T dO, then dK += dS^T Q"))
if on_gpu and torch.cuda.get_device_capability() == (9, 0):
    for dtype in (torch.float16, torch.bfloat16):
        for D in (64, 128):
            for nq, nk in [(100, 100), (257, 129), (17, 300)]:
                for causal in (False, True):
                    q, k, v = make_qkv(2, 3, nq, nk, D, dtype=dtype, device=device)
                    # forward v3 (any GPU) and backward v3: a mismatch here is the backward's
                    attn = lambda q, k, v, is_causal, scale, D=D: step07.FlashAttentionCUDA.apply(
                        q, k, v, is_causal, scale or D ** -0.5, 3, None, 3)
                    check_attention(attn, q, k, v, is_causal=causal)
    print("backward v3: dQ, dK, dV match the float64 reference (fp16, bf16; D 64, 128; causal and not; Nq != Nk)")
else:
    print("backward v3 runs on sm_90 (H100/H200) only: skipped here")

# %% [markdown]
# `bench/experiments/cuda_bwd_wgmma.py --sanitize` checked and timed the kernel on the H200 (2026-12-01, the
# tree of 29222e3, `results/h200/step07_bwd_wgmma/`, whose README has the full table): 112 of 112 cases
# against the float64 reference, compute-sanitizer memcheck and racecheck clean. Its timing, one run, bf16,
# B = 16384 / N, H = 2048 / D ("hybrid" is v3: v2's Delta and dQ with the `wgmma` dK/dV):

# %%
bwrun = json.loads((RESULTS / "step07_bwd_wgmma" / "cuda_bwd_wgmma.json").read_text())
bm, bp = bwrun["meta"], bwrun["parts"]
print(f"recorded: {bm['gpu']}, torch {bm['torch']}, CUDA {bm['cuda']}, {bm['date_utc']}, git {bm['git']}; "
      f"reference {bp['2 correctness']['n'] - bp['2 correctness']['n_fail']}/{bp['2 correctness']['n']}, "
      f"memcheck rc {bp['4 sanitize']['memcheck']['rc']}, racecheck rc {bp['4 sanitize']['racecheck']['rc']}")
print(f"{'D':>4} {'causal':>6} {'N':>6} {'dK/dV ms':>9} {'v3 ms':>7} {'v2 ms':>7} {'dK/dV / v2':>11} "
      f"{'v3 vs v2':>9} {'v3 TFLOP/s':>11} {'x cuDNN bwd: v3':>16} {'v2':>5} {'fwd+bwd v5+v3':>14} {'v5+v2':>6}")
for r in sorted(bp["3 timing"]["rows"], key=lambda r: (r["D"], r["causal"], r["N"])):
    ms, ra = r["ms"], r["ratios"]
    print(f"{r['D']:>4} {str(r['causal']):>6} {r['N']:>6} {ms['wgmma-dkdv-c0']:9.2f} {ms['hybrid-bwd-c0']:7.2f} "
          f"{ms['v2-bwd']:7.2f} {ra['wgmma-dkdv-c0/v2-bwd']:11.2f} {ms['v2-bwd'] / ms['hybrid-bwd-c0']:8.2f}x "
          f"{r['tflops']['hybrid-bwd-c0']:11.0f} {ra['x_cudnn_bwd[hybrid-bwd-c0]']:16.2f} "
          f"{ra['x_cudnn_bwd[v2-bwd]']:5.2f} {ra['x_cudnn_fwd+bwd[v5+hybrid-bwd-c0]']:14.2f} "
          f"{ra['x_cudnn_fwd+bwd[v5+v2-bwd]']:6.2f}")

# %% [markdown]
# What it says (one run): the `wgmma` dK/dV kernel takes 0.33-0.39 of v2's whole backward time, so the
# backward runs 1.19-1.36x faster than v2's, 0.53-0.64x cuDNN's backward (v2: 0.43-0.52x); forward v5 with it,
# 0.59-0.70x cuDNN's forward + backward (with v2: 0.49-0.58x). Delta and dQ, still v2's `mma.sync` kernels,
# are now 0.53-0.58 of v3's time: the next step is dQ itself, on `wgmma` or, as FlashAttention-2 and 3 do,
# accumulated with fp32 atomics inside the dK/dV kernel (five products instead of seven). Not done either:
# FlashAttention-3's TMA loads from a producer warpgroup with `setmaxnreg`, and the exponentials of one tile
# under the next tile's $S^\top$ / $dP^\top$.

# %% [markdown]
# ## 9. The extension as a PyTorch operator
#
# `torch.compile` cannot look inside compiled CUDA: a call into the extension (`build().fwd(...)`) is
# an opaque C++ function to Dynamo, which breaks the graph there (an error under `fullgraph=True`)
# and has no way to know the shapes of what comes back. Step 07 therefore wraps the extension in two
# `torch.library.custom_op`s (`attnlib/ops.py`, `extension_op`):
#
# - `step07_fwd(q, k, v, is_causal, scale, version, config) -> (O, LSE)` with a **fake**
#   implementation that returns empty tensors of the right shapes and dtypes: what the compiler
#   traces instead of the kernel;
# - `step07_bwd(q, k, v, o, lse, do, is_causal, scale, bwd_version) -> (dQ, dK, dV)`, and
#   `register_autograd` on `step07_fwd` so that the forward operator knows its gradient.
#
# `FlashAttentionCUDA.apply(q, k, v, is_causal)` is a thin `autograd.Function` over them: the call
# CS336's harness makes. `tests/test_ops.py` runs `torch.library.opcheck` on both operators and
# compiles a two-layer block with `fullgraph=True` on the GPU, forward and backward, fp16 and bf16.
# A C++ registration (`TORCH_LIBRARY` with a Meta kernel) would do the same from the binding; the
# Python registration keeps the extension's C++ free of it.

# %% [markdown]
# ## 10. Where this leaves the course
#
# | version | D=128, N=16384, bf16, not causal | over the previous |
# |---|---|---|
# | forward v1, scalar fp32 | ≈ 9 TFLOP/s (N=1024) | — |
# | forward v2, `mma.sync` | 55 TFLOP/s | ≈ 6× |
# | forward v3, `cp.async` + `ldmatrix` + swizzle + 32 rows/warp | 340 TFLOP/s, 0.97× SDPA-FLASH | ≈ 6× |
# | forward v4, `wgmma` from shared-memory descriptors (sm_90a), 128 x 64 tiles | 434 TFLOP/s, 0.71× cuDNN, 1.24× SDPA-FLASH | ≈ 1.3× |
# | forward v5, TMA + producer/consumer warpgroups + `setmaxnreg` (sm_90a), 128 x 128 tiles (config 4: ping-pong) | 521 TFLOP/s, 0.85× cuDNN (config 4: 580, 0.95×) | ≈ 1.2× (1.3×) |
# | forward v6, v5 + the exponentials under the previous tile's P V (sm_90a), 128 x 128 tiles | 605 TFLOP/s, 0.99× cuDNN, 1.84× SDPA-FLASH | ≈ 1.1× (v5 in the same run: 540) |
# | backward v1, scalar | 6.8 TFLOP/s (N=1024) | — |
# | backward v2, `mma.sync` | 231 TFLOP/s, 0.75× SDPA-FLASH | ≈ 34× |
# | backward v3, dK/dV on `wgmma` (sm_90a; Delta, dQ: v2's) | 285 TFLOP/s, 0.53× cuDNN's backward (own run: v2 236) | ≈ 1.2× |
#
# What is left, for the curious: v5 and v6 have FlashAttention-3's TMA loads, warp specialization, ping-pong
# and its intra-warpgroup overlap; not yet its TMA store of O, persistent CTAs or cluster multicast (its paper
# reports up to about 740 TFLOP/s in fp16 on an H100); a persistent grid would also help causal load balance
# (v6 is at 0.91-0.95x cuDNN at N = 4096, where the last wave of CTAs weighs most); the 48-byte spill of v3
# sits in the prefetch path.
#
# Issue 17 asked v6's forward for 0.90x cuDNN from N = 4096 (bf16, D 64 and 128, causal and not). Timed in four
# alternated rounds, v6 then cuDNN back to back (`results/h200/issue17_targets_1204d/`, 2026-12-04): 12 of 12 cells
# at the median, 11 in every round (0.94-1.05x); D = 128 without a mask at N = 4096 is the cell on the line (0.943x
# there, 0.873x in five rounds the day before, on the same code).
#
# To check your own kernels on a GPU:
#
# ```
# pytest tests/test_step07_cuda.py -m gpu          # every version, causal and not, awkward N
# python bench/cuda_gpu.py --out my_results.json   # validate, then the benchmark grid
# ```

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
# - NVIDIA, *CUDA C++ Programming Guide* (shared memory banks, `cp.async`) and the PTX ISA (`mma.sync`,
#   `ldmatrix`), [docs.nvidia.com/cuda](https://docs.nvidia.com/cuda/).
#
# ## Exercises
#
# Answers: `solutions/EXERCISES.md` (not in the student copy).
#
# 1. Version 1 pads each row of the Q tile in shared memory by one float. What happens without the
#    pad, for $D = 64$?
# 2. Version 3 copies the next key tile with `cp.async` into a second buffer while it computes on the
#    current one. What does that overlap buy, and when does it stop helping?
# 3. In version 5 the producer waits on `empty_k(st)` for parity `ph ^ 1` before it loads tile $j$ into
#    stage `st`. On its first pass over the ring no consumer has arrived on any empty barrier yet: why
#    does that wait return at once? And what would go wrong if the producer skipped the empty waits on
#    its later passes?
