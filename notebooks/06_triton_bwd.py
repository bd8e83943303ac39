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
# # Step 06 — the backward pass as Triton kernels
#
# The forward saved $Q, K, V, O$ and one number per query row, the LSE $L$. The backward rebuilds
# every probability from it, tile by tile, and never stores $P$:
#
# $$P = e^{S - L},\quad dV = P^\top dO,\quad dP = dO\,V^\top,\quad dS = P \circ (dP - D),\quad
# dQ = \text{scale}\cdot dS\,K,\quad dK = \text{scale}\cdot dS^\top Q$$
#
# with $D = \mathrm{rowsum}(dO \circ O)$. Three kernels:
#
# 1. `_bwd_preprocess`: $D$ for every query row;
# 2. `_bwd_dkdv_kernel`: one program per **key** tile; it holds $K_j, V_j$ on chip, loops over the
#    query tiles that see them, and accumulates $dK_j, dV_j$ in registers: written once, no race;
# 3. $dQ$: either `_bwd_dq_kernel`, one program per query tile looping over key tiles (a second
#    pass), or atomic adds from inside the dK/dV kernel. Section 4 weighs the two.
#
# In this notebook you will check the identity behind $D$, see which tiles each dK/dV program
# visits, check your kernels, compare the two ways to get $dQ$, read the H200 figures, and see what
# each technique tried at the CS336 leaderboard shape paid (section 11).

# %%
# The one switch: "steps" runs your code (steps/), "solutions" the course's, or a path to a folder like steps/.
import os
IMPL = os.environ.get("ATTN_IMPL", "steps")

from attnlib.nb import setup
load_step, device, small = setup(IMPL)

# %%
import json, os
import torch
import matplotlib.pyplot as plt
from attnlib import make_qkv, make_dout, reference_attention, reference_backward
from attnlib.checks import check_attention
from attnlib.compare import assert_close
from attnlib.nb import REPO
step05, step06 = load_step(5), load_step(6)
RESULTS = REPO / "results" / "h200"
print("interpreter:", os.environ.get("TRITON_INTERPRET") == "1")

# %% [markdown]
# ## 1. Why $D = \mathrm{rowsum}(dO \circ O)$
#
# The softmax backward needs, for each row, $\sum_j P_{ij}\,dP_{ij}$: a sum over all **keys**, which
# no single key tile can compute. But $dP = dO\,V^\top$ and $O = P V$, so
# $\sum_j P_{ij}\,(dO\,V^\top)_{ij} = \sum_d dO_{id}\,(PV)_{id} = \sum_d dO_{id} O_{id}$: a sum over
# the head dimension of two tensors we already have. One cheap pass before the main kernels.

# %%
q, k, v = make_qkv(1, 1, 6, 9, 4, dtype=torch.float64)
dout = make_dout(q)
s = q @ k.transpose(-2, -1) * 4 ** -0.5
p = torch.softmax(s, -1)
o = p @ v
dp = dout @ v.transpose(-2, -1)
print("rowsum(P * dP):", (p * dp).sum(-1).flatten().numpy().round(6))
print("rowsum(dO * O):", (dout * o).sum(-1).flatten().numpy().round(6))


# %% [markdown]
# ## 2. What each dK/dV program visits (causal)
#
# Query row $i$ sees key $j$ when $j \le i$. The program for keys `[start_n, start_n + BLOCK_N)`
# starts at the first query tile holding a row $\ge$ `start_n` (earlier tiles see none of these keys:
# skipped), masks the tiles the diagonal crosses, runs the rest with no mask, and masks the last
# partial query tile. The kernel's formulas, in Python:

# %%
def query_stages(start_n, n_q, BLOCK_M, BLOCK_N, causal):
    cdiv = lambda a, b: -(-a // b)  # noqa: E731
    q_full = (n_q // BLOCK_M) * BLOCK_M
    if causal:
        lo = (start_n // BLOCK_M) * BLOCK_M
        diag_end = min(cdiv(start_n + BLOCK_N - 1, BLOCK_M) * BLOCK_M, n_q)
    else:
        lo = diag_end = 0
    tail = max(diag_end, q_full)
    n = lambda a, b: max(0, cdiv(b - a, BLOCK_M))  # noqa: E731
    return lo // BLOCK_M, n(lo, diag_end), n(diag_end, q_full), n(tail, n_q)

N, BM, BN = 300, 32, 64
print(f"N = {N}, {-(-N // BM)} query tiles of {BM} rows; key tiles of {BN} rows")
for start_n in range(0, N, BN):
    skipped, diag, full, tail = query_stages(start_n, N, BM, BN, True)
    print(f"  keys {start_n:3d}-{min(start_n + BN, N) - 1:3d}: {skipped} skipped, {diag} masked (diagonal), "
          f"{full} unmasked, {tail} masked (last partial tile)")

# %% [markdown]
# ## 3. Check your kernels
#
# `check_attention` runs forward and backward and compares $O, dQ, dK, dV$ with the float64
# reference, naming the classic bug if the result looks like one (a missing $D$, a missing scale,
# swapped $dK$/$dV$, a causal mask forgotten in the recomputation...). Both ways to get $dQ$:

# %%
dtypes = [torch.float32, torch.float16] + ([torch.bfloat16] if device == "cuda" else [])
for (B, H, nq, nk, d) in [(1, 2, 17, 17, 32), (1, 2, 50, 75, 32), (1, 1, 65, 65, 80)]:
    for dtype in dtypes:
        for causal in (False, True):
            for mode in ("separate", "atomic", "fused"):
                attn = lambda q, k, v, is_causal, scale, m=mode: step06.attention(q, k, v, is_causal, scale, dq_mode=m)  # noqa: E731
                check_attention(attn, *make_qkv(B, H, nq, nk, d, dtype=dtype, device=device), is_causal=causal)
    print(f"q {(B, H, nq, d)}, k {(B, H, nk, d)}: O, dQ, dK, dV match, all three dQ modes, {[str(t)[6:] for t in dtypes]}")

# %% [markdown]
# ## 4. dQ: a second pass, or atomics?
#
# $dQ_i = \text{scale}\sum_j dS_{ij} K_j$ sums over key tiles, but each key tile belongs to another
# dK/dV program. Two answers (and a third way to launch the first, below the table):
#
# | | second pass (`dq_mode="separate"`, default) | atomics (`dq_mode="atomic"`) |
# | --- | --- | --- |
# | work | recomputes $S$ and $dP$: 7 tile products per (query, key) tile pair instead of 5 (+40%) | 5 products + one atomic add of a `BLOCK_M x D` fp32 tile per pair |
# | memory traffic | reads Q, K, V, dO once more | every key tile adds into dQ: at N = 16k, D = 64, gigabytes of fp32 atomics through L2 |
# | contention | none: each dQ tile has one writer | programs of one head add into the same rows at the same time and queue in L2 |
# | determinism | bitwise reproducible | fp32 addition in arrival order is not associative: last bits change run to run |
# | extra memory | none | an fp32 dQ buffer, converted at the end |
#
# `dq_mode="fused"` is the second pass in the same launch as dK/dV, as Triton's tutorial kernel
# does it: program $j$ computes $dK_j, dV_j$ (key tile $j$), then $dQ_j$ (query tile $j$). Causal,
# key tile $j$ meets $N - j$ query tiles and query tile $j$ meets $j$ key tiles, so every program
# does about the same work. Same products, same determinism; the price is one `num_warps` and
# `num_stages` for two phases that would each pick their own.
#
# A fourth, `dq_mode="atomic_tma"`, is the atomic way done as FlashAttention-3 does it on Hopper: the
# program writes its `BLOCK_M x D` share to shared memory and one TMA instruction
# (`cp.reduce.async.bulk.tensor`, from Triton's `desc.atomic_add` on a tensor descriptor) adds the whole
# tile into dQ in L2, instead of every thread issuing an atomic per element. It needs an sm_90 GPU
# (Triton's interpreter has no such instruction: on a CPU it is refused with a ValueError). Measured in
# section 8's ledger: it beats the second pass only at D = 128, causal, N >= 4096 (1.02-1.11x), where
# step 06's table now picks it; at the CS336 shape (D = 64) it loses. Like any atomic dQ it is not
# deterministic, so under `torch.use_deterministic_algorithms(True)` the table's choice falls back to
# the second pass, and asking for `"atomic"` or `"atomic_tma"` by name raises PyTorch's usual error (a
# warning with `warn_only=True`).
#
# FlashAttention-2's CUDA code uses atomics; Triton's tutorial kernel uses a second pass. On an H200
# the second pass won nearly everywhere (below, a run of 2026-11-29, before the dK/dV changes of
# section 8; section 6 has step 06's current figures): the atomics cost more than the recomputation
# saves. On a GPU the next cell shows the determinism difference; the interpreter runs one program
# at a time, so there both are deterministic.

# %%
if device == "cuda":
    q, k, v = make_qkv(4, 8, 1024, 1024, 64, dtype=torch.bfloat16, device=device, requires_grad=True)
    dout = make_dout(q)
    for mode in ("separate", "atomic"):
        runs = [torch.autograd.grad(step06.attention(q, k, v, is_causal=True, dq_mode=mode), q, dout)[0]
                for _ in range(5)]
        same = all(torch.equal(runs[0], r) for r in runs[1:])
        diff = max((runs[0].float() - r.float()).abs().max().item() for r in runs[1:])
        print(f"{mode:9s}: dQ bitwise identical over 5 runs: {same}; max difference {diff:.2e}")
else:
    print("no GPU: the interpreter runs programs one after another, so atomics cannot race here")

# %%
data = json.loads((RESULTS / "triton_gpu.json").read_text())
sweep = json.loads((RESULTS / "triton_leaderboard_sweep.json").read_text())
m = data["machine"]
print(f"{m['gpu']}, torch {m['torch']}, triton {m['triton']}, {m['date']}: fwd+bwd TFLOP/s, bf16\n")
by = {(r["impl"], r["mode"], r["B"], r["H"], r["N"], r["D"], r["causal"]): r for r in data["rows"]}
print(f"{'D':>4} {'causal':>7} {'N':>6} | {'second pass':>11} {'atomics':>8} {'FLASH':>6} {'cuDNN':>6} | x FLASH")
for r in data["rows"]:
    if r["impl"] == "triton_step06_separate" and r["suite"] == "grid":
        g = lambda i: by[(i, "fwd+bwd", r["B"], r["H"], r["N"], r["D"], r["causal"])]["tflops"]  # noqa: E731
        print(f"{r['D']:>4} {str(r['causal']):>7} {r['N']:>6} | {r['tflops']:11.0f} {g('triton_step06_atomic'):8.0f} "
              f"{g('sdpa_flash'):6.0f} {g('sdpa_cudnn'):6.0f} | {r['ratio_to_sdpa_flash']:.2f}")
best = {r["kind"]: r for r in sweep["rows"] if r["kind"].startswith("fwd+bwd") or r["kind"].startswith("sdpa")}
print("\nCS336 leaderboard shape, B=1 H=16 N=16384 D=64 causal, fwd+bwd, best tiles of each (ms):",
      {k: round(v["ms"], 2) for k, v in best.items()}, "| target 5.36 ms")

# %% [markdown]
# (The atomic rows of the grid table reuse the dK/dV tiles tuned for the second pass; with its own
# best tiles atomic dQ comes within a few percent of the second pass, as the leaderboard line shows,
# but never clearly ahead.)
#
# ## 5. Tile sizes for the backward (recorded on an H200)
#
# Each dK/dV program keeps **two** fp32 accumulators of `BLOCK_N x D` plus $K_j$ and $V_j$, twice
# the forward's state, so its query step is small (32 rows at D = 64). Each point below is the
# whole backward's time with one kernel's tiles varied and the other kernel fixed.

# %%
tuning = json.loads((RESULTS / "triton_gpu_tuning.json").read_text())
fig, axes = plt.subplots(1, 3, figsize=(18, 4))
for ax, kind in zip(axes, ("dkdv", "dq", "atomic")):
    sel = [r for r in tuning["rows"] if r["kind"] == kind and r["N"] == 8192]
    cfgs = sorted({tuple(r["config"]) for r in sel})
    for D, causal, mk in [(64, False, "o"), (64, True, "s"), (128, False, "^"), (128, True, "v")]:
        ys = [next((r["ms"] for r in sel if tuple(r["config"]) == c and r["D"] == D and r["causal"] == causal),
                   float("nan")) for c in cfgs]
        ax.plot(range(len(cfgs)), ys, mk, label=f"D={D} {'causal' if causal else 'full'}")
    ax.set_xticks(range(len(cfgs)))
    ax.set_xticklabels([f"{c[0]}x{c[1]}\nw{c[2]} s{c[3]}" for c in cfgs], fontsize=7)
    ax.set_title({"dkdv": "dK/dV tiles (BLOCK_M queries x BLOCK_N keys)", "dq": "dQ tiles (BLOCK_M x BLOCK_N)",
                  "atomic": "dK/dV tiles with atomic dQ"}[kind] + ": backward ms, N=8192", fontsize=9)
    ax.grid(alpha=0.3)
axes[0].legend(fontsize=8)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## 6. The recorded H200 figures, forward + backward
#
# FlashAttention's grid from `python -m bench grid` (bf16, 16k tokens per batch, hidden 2048), several
# runs merged. Step 06's rows and SDPA's come from two runs, with the Gluon kernels of section 11: from N = 1024 the
# run of 2026-12-04 11:58 UTC (`results/h200/grid_1204c/`, the GPU code of 7605e06, where step 06's backward is the
# one-kernel backward at the end of section 11, with its round 3 switches, and its forward takes a causal mask's heads
# in groups that fit L2, section 11 and notebook 05 section 9), at N = 512 the run of 2026-12-03 20:25 (`results/h200/grid_1203f/`); each README
# gives the rows as ratios to cuDNN. The later runs' N = 512 rows were left out: there step 06's forward + backward
# read 15-25% slower than at 20:25 on code that had not changed (1.401 ms against 1.153 at D = 64 without a mask, at
# 03:22) while step 05's forward and both SDPA backends matched to 1-3%; such a call times the host (section 10), and
# the one-kernel backward starts at N = 1024. Step 07's rows (v3, its default) are 11:58's from N = 1024, 2026-12-03
# 17:01's at N = 512 (`results/h200/grid_1203e/`).

# %%
grid = json.loads((RESULTS / "grid" / "results.json").read_text())
dates = sorted({r["machine"]["date"] for r in grid if r["impl"] in ("step06", "sdpa-flash")})
print(grid[0]["machine"]["gpu"], "torch", grid[0]["machine"]["torch"], "| step 06 and SDPA-FLASH rows:", ", ".join(dates))
fig, axes = plt.subplots(1, 4, figsize=(18, 3.8))
for ax, (D, causal) in zip(axes, [(64, False), (64, True), (128, False), (128, True)]):
    for impl in ("step06", "step07", "sdpa-flash", "sdpa-cudnn"):
        pts = sorted((r["N"], r["tflops"]) for r in grid if r["impl"] == impl and r["mode"] == "fwd+bwd"
                     and r["D"] == D and r["causal"] == causal and r["status"] == "ok")
        ax.plot(*zip(*pts), marker="o", label=impl)
    ax.set_xscale("log", base=2)
    ax.set_title(f"fwd+bwd, D={D}, {'causal' if causal else 'not causal'}")
    ax.set_xlabel("N")
    ax.set_ylabel("TFLOP/s")
    ax.grid(alpha=0.3)
axes[0].legend(fontsize=8)
plt.tight_layout()
plt.show()
ratios = [r["ratio_to_sdpa_flash"] for r in grid if r["impl"] == "step06" and r["mode"] == "fwd+bwd" and r["N"] >= 2048]
print(f"step 06 fwd+bwd for N >= 2048: {min(ratios):.2f}-{max(ratios):.2f}x SDPA-FLASH of the same run")
gkey = lambda r: (r["mode"], r["B"], r["H"], r["N"], r["D"], r["causal"])   # noqa: E731
cudnn_ms = {gkey(r): r["ms"] for r in grid if r["impl"] == "sdpa-cudnn" and r["status"] == "ok"}
for D in (64, 128):
    x = [cudnn_ms[gkey(r)] / r["ms"] for r in grid
         if r["impl"] == "step06" and r["mode"] == "fwd+bwd" and r["D"] == D and r["N"] >= 4096 and r["status"] == "ok"]
    print(f"step 06 fwd+bwd for N >= 4096, D = {D}: {min(x):.2f}-{max(x):.2f}x cuDNN of the same run")

# %% [markdown]
# ## 7. Chasing the leaderboard: where the time goes
#
# The CS336 2025 leaderboard shape (B=1, H=16, N=16384, D=64, bf16, causal, forward + backward) was
# timed once more with every kernel alone and every `dq_mode` over several tile sets, each checked
# against the float64 reference first (`bench/experiments/triton_lb_variants.py`):

# %%
lb = json.loads((RESULTS / "triton" / "lb_variants.json").read_text())
m = lb["machine"]
print(f"{m['gpu']}, torch {m['torch']}, triton {m['triton']}, {m['date']}; target {lb['target_ms']} ms\n")
rows = {r["variant"]: r for r in lb["rows"] if r["status"] == "ok"}
for name in ("sdpa_flash fwd+bwd", "sdpa_cudnn fwd+bwd", "fwd+bwd autograd separate (best bwd)",
             "fwd+bwd autograd atomic (best bwd)", "fwd+bwd autograd fused (best bwd)"):
    r = rows[name]
    print(f"{name:40s} {r['ms']:6.2f} ms   x{r['ratio']:.2f} SDPA-FLASH")
print()
for name, r in rows.items():
    if name.startswith("fwd step05") or name.strip().startswith("kernel"):
        print(f"{name.strip():40s} {r['ms']:6.2f} ms")
for mode in ("separate", "atomic", "fused"):
    b = lb["best"].get(mode)
    if b:
        print(f"best {mode:8s} backward: {b['bwd_ms']:.2f} ms ({b['variant']})")

# %% [markdown]
# In that run, forward + backward ran 1.2-1.3x PyTorch's FlashAttention-2 backend from N = 2048,
# thanks again to Hopper's `wgmma` behind `tl.dot`, but the leaderboard shape took 5.60 ms, 4.5% over
# the CS336 leaderboard's 5.36. The breakdown says where to look: the dK/dV kernel took about 3.0 ms of
# the 4.3 ms backward, running its four products at about 360 TFLOP/s, while the dQ kernel ran its
# three at about 570. Fusing the two launches did not help (9% slower at its best tiles: one warp
# count for two phases), nor did loading the forward's tiles by TMA at D = 64
# (`bench/experiments/triton_fwd_tma.py`, results/h200/triton/).
#
# ## 8. Closing the gap: the dK/dV kernel
#
# Why would one kernel run at 360 TFLOP/s and its sibling at 570? Compile both for the H200 without
# one (`python bench/experiments/triton_dkdv_variants.py --aot-check` runs Triton's compiler and `ptxas` for
# sm_90 on a laptop) and read the register count: at 64x128 tiles on 8 warps the dK/dV kernel took
# 186 registers a thread, so an SM (65536 registers) holds **one** program of 256 threads; the dQ
# kernel took 128 and fits two. With one program per SM, every wait for a matrix product is a stall;
# with two, the other program's work fills it.
#
# Two changes, each tried on a copy of the kernel and checked against the float64 reference before
# it was timed (`bench/experiments/triton_dkdv_variants.py`):
#
# - **`maxnreg=128`** (a launch option): Triton asks `ptxas` to fit in 128 registers, so two 8-warp
#   programs share an SM. At 32x128 tiles it fits with no spills; at 64x128 it spills 300+ bytes.
# - **Issue dP early**: `dpT = v @ do^T` does not need P, so it can be issued right after `sT`; its
#   product then runs on the tensor cores while the exponentials run on the special-function units.
#   Written in the order of the math (after `dv += ...`), the compiler waits for both products at once.

# %%
runs = [json.loads((RESULTS / "triton" / f"dkdv_variants_{t}.json").read_text()) for t in ("0214", "0224")]
print("dK/dV kernel alone, B=1 H=16 N=16384 D=64 bf16 causal, ms; runs of", runs[0]["machine"]["date"], "and",
      runs[1]["machine"]["date"], "\n(step 06's rows in the second run already issue dP early)\n")
names = {}
for i, run in enumerate(runs):
    for r in run["rows"]:
        if r.get("kind") == "dkdv" and r.get("ms"):
            names.setdefault(r["row"], [None, None, r["config"]])[i] = r["ms"]
for name, (a, b, cfg) in names.items():
    print(f"{name:26s} {'' if a is None else f'{a:6.3f}':>7} {'' if b is None else f'{b:6.3f}':>7}   {cfg[:60]}")
lbr = json.loads((RESULTS / "leaderboard" / "results.json").read_text())
print("\nleaderboard shape, fwd+bwd:", {r["impl"]: round(r["ms"], 2) for r in lbr if r["ms"] and r["impl"] in
                                      ("step06", "sdpa-flash", "sdpa-cudnn")}, "| target 5.36 ms")

# %% [markdown]
# `2cta` (two programs per SM) won in both runs; `early-dp` helped every configuration with one program
# per SM, and cost a little with two (2.43 against 2.38 ms), where the other program already hides the
# wait. Step 06 took both: 32x128 tiles on 8 warps capped at 128 registers for causal D <= 64 (2.50 ms,
# against 2.82 for its previous tiles), and dP issued early everywhere (at D = 128, one program per SM,
# full attention gained 2-5% forward + backward, causal stayed within 3%). Forward + backward at the leaderboard shape went from 5.60 to **5.29 ms**,
# under the 5.36 target; cuDNN's backend (4.42 ms) stays ahead. One thing the table does not explain:
# step 06's own kernel is 7-12% slower than its copy with the same tiles and the same instruction
# counts. The copy assumes one contiguous layout; step 06 takes every stride. Finding out needs a
# profiler on the GPU (`ncu`), which is the natural next exercise.
# Section 11 follows the chase further, toward 5.0 ms, and lists every technique tried with what it paid.

# %% [markdown]
# ## 9. Inside `torch.compile`: why the kernels are registered operators
#
# People put attention inside compiled models, and CS336's leaderboard times
# `torch.compile(FlashAttention2.apply)`. `torch.compile` traces Python: it follows
# `FlashAttentionTriton.apply` into `forward`, and would follow the launcher into the kernel launch.
# Inductor then compiles **the user kernel again**, from its source, with its own idea of the
# arguments: a Python float such as `qk_scale` becomes `fp64`, not Triton's `fp32`. The scores, the
# running max and the accumulator follow into fp64, and the first `tl.dot(p, v, acc)` refuses an
# fp64 accumulator. What a student saw (H200, torch 2.11, before this step was an operator): an
# `InductorError` raised by Triton's compiler at the `tl.dot(p, v, acc)` of the online softmax, an
# assertion that the accumulator's type equals the product's output type (fp32). Inductor types Python floats of user
# kernels as fp64 (`torch/_inductor/codegen/triton_utils.py`, `signature_of`).
#
# The fix has two parts. The kernel casts its float arguments on entry (`tl.cast(qk_scale,
# tl.float32)`), and the launcher becomes a **PyTorch operator** (`attnlib/ops.py`):
#
# - `torch.library.triton_op("ns::step06_fwd", ...)` with `wrap_triton(kernel)[grid](...)`: a name,
#   a schema inferred from the type hints, and a body PyTorch can run on *fake* tensors (shapes and
#   dtypes only) to trace the graph; Inductor sees the kernels inside and launches them itself.
# - `register_autograd(backward, setup_context=...)`: the operator's gradient formula, so the
#   operator trains by itself; `FlashAttentionTriton` is now a thin `autograd.Function` over the
#   two operators, kept because it is what students, the tests and CS336's harness call.
# - `torch.library.opcheck(op, args)` (`tests/test_ops.py`) checks the registration: schema, fake,
#   autograd, and tracing with static and dynamic shapes.
#
# One measured exception: Inductor relaunches a `triton_op`'s kernels with `num_warps` and
# `num_stages` only, and drops `maxnreg`, the 128-register cap of section 8. Compiled that way the
# dK/dV kernel took 3.20 ms instead of 2.47 (table below), so `step06_bwd` is registered as an
# opaque `torch.library.custom_op` (Inductor calls our launcher, options and all); the forward,
# which needs no cap, stays a `triton_op`. Under Triton's CPU interpreter `wrap_triton` cannot
# trace at all, so there every operator is opaque.

# %%
for tag, label in (("", "both triton_op"), ("_opaque", "both opaque (ATTN_OPAQUE_OPS=1)")):
    path = RESULTS / "gpu-check" / f"cs336_harness{tag}.json"
    if path.exists():
        run = json.loads(path.read_text())
        kern = {k: v for k, v in run["profile_compiled"]["kernels_ms"].items() if k.startswith("_")}
        print(f"{label:34s} compiled apply + o.sum().backward(): {run['compiled']['mean']:.2f} ms;",
              ", ".join(f"{k} {v:.2f}" for k, v in kern.items()))

# %% [markdown]
# A second exception came with the Gluon forward of section 11. Inductor sees only the kernels a
# `triton_op` launches through `wrap_triton`; the Gluon kernel is launched another way, and while
# Inductor traces, the launcher holds fake tensors and declines it. So the compiled call ran the Triton
# forward where the eager call ran the Gluon one: in one H200 run of CS336's harness, 5.08 ms compiled
# as shipped against 4.99 with every operator opaque
# (`results/h200/gpu-check/cs336_fwd_opaque_bbdc6c7/`). Step 05 now registers its forward twice,
# as the `triton_op` and as an opaque `custom_op`, and `run_fwd` picks one while Dynamo traces:
# `hopper_fwd_takes(q, k, v, is_causal)` asks whether the other kernel would take these inputs (in your step it
# never does). Half of that question is about the device, and Dynamo treats
# `torch.cuda.get_device_capability` as a call to put into the graph (on a CPU-only torch 2.13 the
# compile then failed, running it on fake tensors); marked `torch.compiler.assume_constant_result`, the
# question is asked once while tracing and its answer kept as a constant (`tests/test_gluon_fwd.py`
# checks that the graph holds the operator the answer asks for; on the H200 that the compiled call runs
# the Gluon kernel, its output the eager call's).

# %%
for tag, label in (("", "step 05's forward a triton_op (as shipped at bbdc6c7)"), ("_opaque", "every operator opaque")):
    run = json.loads((RESULTS / "gpu-check" / "cs336_fwd_opaque_bbdc6c7" / f"cs336_harness{tag}.json").read_text())
    fwd = [k for k in run["profile_compiled"]["kernels_ms"] if "fwd" in k]
    print(f"{label:52s} compiled: {run['compiled']['mean']:.3f} ms, its forward kernel {fwd}")

# %% [markdown]
# A model that calls step 06, compiled whole (`fullgraph=True`: any graph break is an error), trains
# like the eager one; `tests/test_ops.py` checks this on every GPU run (fp16 and bf16, causal or
# not). Here, a two-layer block forward and backward, at a size the interpreter can afford on a CPU:

# %%
import torch.nn.functional as F

torch.manual_seed(0)
dim, heads, n = 64, 2, 48
w_qkv = torch.randn(dim, 3 * dim, device=device) * dim ** -0.5


def block(x, attn):
    B, T, C = x.shape
    for _ in range(2):
        q, k, v = (x @ w_qkv).view(B, T, 3, heads, C // heads).permute(2, 0, 3, 1, 4)
        x = x + attn(q, k, v, True).transpose(1, 2).reshape(B, T, C)
    return x


x = torch.randn(1, n, dim, device=device, requires_grad=True)
compiled = torch.compile(lambda x: block(x, step06.FlashAttentionTriton.apply), fullgraph=True)
y = compiled(x)
y.square().mean().backward()
x_ref = x.detach().clone().requires_grad_(True)
block(x_ref, lambda q, k, v, c: F.scaled_dot_product_attention(q, k, v, is_causal=c)).square().mean().backward()
print("compiled block with step 06 vs SDPA: max |dx| difference", f"{(x.grad - x_ref.grad).abs().max().item():.2e}")

# %% [markdown]
# ## 10. What an eager call costs the host
#
# A kernel time says nothing about the time a call takes when the host is slower than the GPU: the
# GPU waits for the next launch, and a timer around the call (`do_bench` included) measures the host.
# Small models and short sequences live there. Measured on the H200 machine
# (`bench/experiments/host_overhead.py`, `results/h200/host/README.md`), step 06's forward + backward at
# B=1, H=8, N=256 took **1.75 ms of host time for 0.03 ms of kernels**, and a training step of the
# capstone GPT at context 4k ran at 0.91x SDPA-FLASH's tokens/s although its attention kernels were faster.
# Two causes, each found by timing one layer of the call at a time:
#
# - `wrap_triton(kernel)[grid](...)` is what lets `torch.compile` see a kernel, and in eager mode
#   `triton_op` switches it off for its own calls. Outside them (the opaque backward operator, a
#   launcher called directly, the autograd thread) it stayed on, and each launch went through
#   PyTorch's higher-order-operator dispatch: about 0.25 ms of host time a launch. The launchers now
#   carry `@direct_launches` (`attnlib/ops.py`): real tensors launch at once, a tracer's fake tensors
#   still take the traced path.
# - The operator's own layers (dispatcher, autograd key, the custom op's output checks) cost 25-40 us a
#   call, and inside an `autograd.Function` an eager call needs none of them. The Functions call
#   `run_fwd` / `run_bwd` (`eager_fast`): the operator whenever Dynamo or AOTAutograd traces, its
#   Python function otherwise.
#
# The host time per forward + backward, before each change and after (ms), with the kernels' time:

# %%
host_runs = {c: RESULTS / "host" / f"host_overhead_{c}.json" for c in ("6b1bf5e", "8e14917", "6607034")}
if all(p.exists() for p in host_runs.values()):
    rows = {c: {(r["impl"], tuple(r["shape"]), r["mode"]): r for r in json.loads(p.read_text())["rows"]}
            for c, p in host_runs.items()}
    print(f"{'':12s} {'B x H x N x D':>16s}  {'before':>7s} {'direct':>7s} {'eager':>7s}  {'kernels':>8s}")
    for key, r in rows["6b1bf5e"].items():
        if key[2] == "fwd+bwd" and key[0] in ("sdpa-flash", "step06", "step09-w256"):
            hosts = [rows[c].get(key, {}).get("host_ms_per_call", float("nan")) for c in host_runs]
            print(f"{key[0]:12s} {'x'.join(map(str, key[1])):>16s}  " + " ".join(f"{h:7.2f}" for h in hosts)
                  + f"  {rows['6607034'][key]['kernel_ms_sum']:8.3f}")

# %% [markdown]
# The capstone GPT at context 4k went from 0.91x to 1.06x SDPA-FLASH's tokens/s. What is left is
# about 0.5 ms a call inside the autograd engine, where the same `backward()` runs about twice as
# slowly as called directly; SDPA's whole forward + backward costs the host 0.26 ms. Whole-model
# `torch.compile` removes the host's share altogether: 1.29x at 4k.

# %% [markdown]
# ## 11. What each Hopper-era technique paid, measured
#
# Section 8 brought the leaderboard shape under the 5.36 ms target; on 2026-12-01 the chase went on
# toward 5.0 ms in CS336's own harness (`torch.compile(FlashAttentionTriton.apply)`, `o.sum().backward()`,
# the mean of `do_bench`; section 9 says why the compiled call runs the same kernels). The rule: each
# technique is tried alone at that shape (B=1, H=16, N=16384, D=64, bf16, causal) on an H200, checked
# against the float64 reference before it is timed, and kept only if it pays. The cell below loads every
# one tried on steps 05 and 06 from `results/h200/triton/` (its README says what the older files hold and
# which command wrote them): `lb_5ms_1201_1705` and `lb_5ms_1201_1711` are two runs of
# `bench/experiments/lb_5ms.py` (its docstring gives the method) on two H200s, the second trying the
# neighbours of the first one's best; `dkdv_variants_*` are section 8's
# experiments on the dK/dV kernel and their repeat; `lb_variants` is section 7's run;
# `fwd_tma_course_3f626a2` times step 05's `tma=True` against its pointer loads; `fwd_pipelined_1201_1915` and
# `dkdv_pipelined_1201_1915` time the loops software-pipelined by hand (`bench/experiments/triton_fwd_pipelined.py`,
# `triton_dkdv_pipelined.py`: every form against step 05's / step 06's own kernel in the same run);
# `fwd_lazy_rescale_1202` skips the forward's rescale while no row's max has grown by more than TAU, as
# FlashAttention-4 does (`triton_fwd_lazy_rescale.py`); `fwd_persistent_1202` makes it persistent
# (`triton_fwd_persistent.py`); `lb_groups_1202` launches the heads a few at a time (`lb_groups.py`); `lb_kv_regs_1202`
# reads K and V from registers in step 06's own dK/dV kernel at the table's tiles (`lb_kv_regs.py`); `gluon_1202` and
# `gluon_1202_r2` write the forward and the dK/dV kernel in Gluon, Triton's lower-level language, where a kernel
# keeps products in flight itself (`gluon_fwd_overlap.py`, `gluon_dkdv_overlap.py`); `lb_power_1202` and `lb_power_r2_1202` time tile sets
# and register caps in CS336's harness itself, where the H200 runs at its power limit (`lb_power.py`). The rows of one
# technique differ in what was timed and in what they started from (the table at 01b9b00 already ran the
# dK/dV kernel heads first without the early dP); the columns say both.

# %%
import textwrap


def load(name):                                           # one file of results/h200/triton/
    return json.loads((RESULTS / "triton" / f"{name}.json").read_text())


lb5 = {t: load(f"lb_5ms_1201_{t}") for t in ("1705", "1711")}                 # bench/experiments/lb_5ms.py
kv_rows = {t: {r["row"]: r for r in load(f"dkdv_variants_{t}")["rows"]}         # triton_dkdv_variants.py
           for t in ("0214", "0224", "1201_1555")}
kv = {t: {name: r["ms"] for name, r in rows.items()} for t, rows in kv_rows.items()}
regs = {t: {name: (r["facts"] or {}).get("regs") for name, r in rows.items()} for t, rows in kv_rows.items()}
spills = {name: (r["facts"] or {}).get("spills") for name, r in kv_rows["0214"].items()}
kv_err = {c["name"]: c["x_s06"] for c in load("dkdv_variants_0214")["checks"]   # error / step 06's, causal
          if c["causal"] and "x_s06" in c}
lbv = load("lb_variants")                                                        # triton_lb_variants.py
tma = [r for r in load("fwd_tma_course_3f626a2")["rows"] if r["kind"] == "time"]  # triton_fwd_tma_course.py
fpipe = [r for r in load("fwd_pipelined_1201_1915")["rows"] if r["D"] == 64 and r["causal"]]  # triton_fwd_pipelined.py
kpipe = load("dkdv_pipelined_1201_1915")["rows"]                                   # triton_dkdv_pipelined.py
tdq = load("tma_dq_1201_2346")["parts"]                                             # triton_tma_dq.py
lazy = load("fwd_lazy_rescale_1202")["timing_rows"]                                  # triton_fwd_lazy_rescale.py
pers = load("fwd_persistent_1202")["timing_rows"]                                    # triton_fwd_persistent.py
kvr = load("lb_kv_regs_1202")["kernels"]                                             # lb_kv_regs.py
gluon = {(r, k): load(f"gluon_{r}/gluon_{k}_overlap")["timing_rows"]                    # gluon_{fwd,dkdv}_overlap.py
         for r in ("1202", "1202_r2") for k in ("fwd", "dkdv")}
gluon[("tiles_1202_r7", "dkdv")] = load("gluon_tiles_1202_r7/gluon_dkdv_overlap")["timing_rows"]   # --round 7
gluon[("fwd_ws_1203", "fwd")] = load("gluon_fwd_ws_1203/gluon_fwd_ws")["timing_rows"]      # gluon_fwd_ws.py
gluon[("fwd_ws_1203_r2", "fwd")] = load("gluon_fwd_ws_1203_round2/gluon_fwd_ws")["timing_rows"]   # --round 2


def ms(part, t, name):
    """A time of lb_5ms_1201_<t>.json: part "fwd" (forward alone), "bwd" (whole backward), "harness"."""
    r = lb5[t][part][name]
    return r["ms"] if isinstance(r, dict) else r


def lb5ms(part, t, a, b, note=""):        # one measurement: (timed, before ms, after ms, file, note)
    return {"fwd": "fwd", "bwd": "bwd", "harness": "fwd+bwd"}[part], ms(part, t, a), ms(part, t, b), \
        f"lb_5ms_1201_{t}", note


def dkdv(t, a, b, note="the copy"):   # the dK/dV kernel alone: step 06's own, or the experiment's copy of it
    return "dK/dV", kv[t][a], kv[t][b], f"dkdv_variants_{t}", note


def fastest(part, t, names):
    return min(names, key=lambda n: ms(part, t, n))


def tma_pair(D, causal=True, N=16384):
    """Step 05's pointer kernel -> its tma=True kernel at one shape, and the speed-up's range over all six."""
    r = next(r for r in tma if (r["D"], r["causal"], r["N"]) == (D, causal, N))
    x = [r["ms"]["step05"] / r["ms"]["step05-tma"] for r in tma if r["D"] == D]
    return ("fwd", r["ms"]["step05"], r["ms"]["step05-tma"], "fwd_tma_course_3f626a2",
            f"B=1 H={r['H']} D={D}; its six shapes {min(x):.2f}-{max(x):.2f}x")


def tma_dq(D, causal, N):
    """Step 06's second pass -> dq_mode="atomic_tma" at its table's dK/dV tiles, one shape of the grid."""
    r = next(r for r in tdq["3 grid, backward"]["rows"] if (r["D"], r["causal"], r["N"]) == (D, causal, N))
    return ("bwd", r["separate"], r["atomic_tma table"], "tma_dq_1201_2346",
            f"B={r['B']} H={r['H']} D={D} N={N}, {'causal' if causal else 'not causal'}")


def tma_dq_lb():
    """The leaderboard shape: the table's second pass -> the fastest atomic_tma tile set."""
    rows = tdq["2 leaderboard shape, backward"]["rows"]
    tma_rows = {n: r["ms"] for n, r in rows.items() if n.startswith("atomic_tma") and "ms" in r}
    name = min(tma_rows, key=tma_rows.get)
    return ("bwd", rows["separate (table)"]["ms"], tma_rows[name], "tma_dq_1201_2346",
            f"leaderboard shape, best of {len(tma_rows)} tile sets ({name[11:]})")


def pipelined(timed, rows, table, file, first):
    """Step 05's / 06's own kernel (its table) -> the fastest hand-pipelined form (any row but a control) and
    the form its compile report put first, in the same run."""
    t = {r["row"]: r["ms"] for r in rows}
    forms = [r for r in rows if r.get("variant", "control") != "control"]
    fast = min(forms, key=lambda r: r["ms"])
    return [(timed, t[table], fast["ms"], file, f"best of {len(forms)} forms: {fast['row']}"),
            (timed, t[table], t[first], file, f"{first} (the compile report's pick)")]


def lazy_rescale(tau):
    """Step 05 -> its loop with the rescale skipped below TAU, at the leaderboard shape; the range over all shapes."""
    s05 = {r["shape"]: min(r["step05"], r["step05 again"]) for r in lazy}
    x = [s05[r["shape"]] / r[f"tau{tau}"] for r in lazy]
    return ("fwd", s05[lazy[0]["shape"]], lazy[0][f"tau{tau}"], "fwd_lazy_rescale_1202",
            f"TAU {tau}; its {len(lazy)} shapes (D 64/128) {min(x):.2f}-{max(x):.2f}x")


def persistent(name):
    """Step 05 -> the persistent forward ``name`` at the leaderboard shape; its range over the five D=64 shapes."""
    s05 = lambda r: min(r["ms"]["step05"], r["ms"]["step05 again"])   # noqa: E731
    x = [r["speedup"][name] for r in pers]
    return ("fwd", s05(pers[0]), pers[0]["ms"][name], "fwd_persistent_1202",
            f"{name}; its {len(pers)} shapes {min(x):.2f}-{max(x):.2f}x")


d64 = load("fwd_d64_tiles_1202/triton_fwd_d64_tiles")["rows"]                     # triton_fwd_d64_tiles.py


def d64_tiles(name):
    """Step 05's table (the faster of its two timings) -> the D=64 tile set ``name`` at the leaderboard shape (the
    run's last row); its range over the run's five D=64 shapes."""
    r = d64[-1]
    x = [row["vs_table"][name] for row in d64]
    return ("fwd", min(r["ms"]["table"], r["ms"]["table again"]), r["ms"][name], "fwd_d64_tiles_1202",
            f"{name}; its {len(d64)} shapes {min(x):.2f}-{max(x):.2f}x")


def kv_regs_table_tiles():
    """Step 06's backward (its table) -> the fastest of its rebuilds with K and V in registers (the table's
    mean over the runs alternated with them), the leaderboard shape."""
    table = [r["bwd_ms"] for r in kvr if r["name"] == "table"]
    var = [r for r in kvr if r["name"].startswith("kv-regs")]
    b = min(var, key=lambda r: r["bwd_ms"])
    return ("bwd", sum(table) / len(table), b["bwd_ms"], "lb_kv_regs_1202",
            f"step 06 itself, best of {len(var)}: {b['name']} (the table's 32x64 w4)")


def gluon_row(kind, rnd, variant, against=None):
    """The leaderboard shape in a Gluon experiment's run: the step's own kernel (the faster of its two timings), or
    the same Gluon kernel waiting on every product (``against``), -> ``variant``."""
    r = gluon[(rnd, kind)][0]
    ms_ = r["ms"]
    step = "step05" if kind == "fwd" else "step06 dK/dV"
    before = ms_[against] if against else min(ms_[step], ms_[step + " again"])
    return ("fwd" if kind == "fwd" else "dK/dV", before, ms_[variant], f"gluon_{rnd}",
            f"{variant}, against {against or ('step 05' if kind == 'fwd' else 'step 06 kernel')}")


def at_power_limit(file):
    """CS336's harness itself, each variant between two runs of the table: the table's mean -> the best variant."""
    d = load(file)
    rows = [r for r in d.get("rows", d.get("harness", [])) if "ms" in r]
    table = [r["ms"] for r in rows if r["name"] == "table"]
    var = [r for r in rows if r["name"] != "table" and not r["name"].startswith("sdpa")]
    b = min(var, key=lambda r: r["ms"])
    return ("fwd+bwd", sum(table) / len(table), b["ms"], file,
            f"best of {len(var)}: {b['name']} ({b['sm_mhz']} MHz, the table {round(sum(r['sm_mhz'] for r in rows if r['name'] == 'table') / len(table))})")


tiles = {t: [n for n in lb5[t]["fwd"] if "x" in n and not n.startswith("table")] for t in lb5}
atomic = [n for n in lb5["1711"]["bwd"] if n.startswith("atomic")]
best = {m: lbv["best"][m]["bwd_ms"] for m in ("separate", "atomic", "fused")}

# (technique, kept, what it changes, [measurement, ...])
LEDGER = [
    ("fwd: heads first", "yes", "grid (B*H, query tiles): every head's heaviest query tiles start first",
     [lb5ms("fwd", "1705", "table 128x64 w8 s3", "table + heads-first")]),
    ("fwd: other tiles", "no", "BLOCK_M x BLOCK_N, warps, stages around the table's 128x64 w8 s3",
     [lb5ms("fwd", t, a, fastest("fwd", t, tiles[t]), f"best of {len(tiles[t])}: {fastest('fwd', t, tiles[t])}")
      for t, a in (("1705", "table 128x64 w8 s3"), ("1711", "table + heads-first"))]),
    ("fwd: bigger tiles, D=64", "no", "128x128 or 256x64 tiles (more K/V reuse), with TMA; a fourth stage",
     [d64_tiles("128x128 w8 s3 tma"), d64_tiles("256x64 w8 s3 tma"), d64_tiles("128x64 w8 s4 tma")]),
    ("fwd: TMA loads, D=64", "no", "Q, K, V by tensor descriptor (Hopper's TMA) instead of pointers",
     [lb5ms("fwd", "1705", "table 128x64 w8 s3", "tma=True (table tiles)", "step 05, the table's 128x64 w8 s3"),
      tma_pair(64)]),
    ("fwd: TMA loads, D=128", "N >= 2048", "the same at D=128 (not the leaderboard's D), 128x128 tiles",
     [tma_pair(128)]),
    ("fwd: pipelined by hand", "no", "the next tile's Q K^T in flight across the softmax (FA-3's order, end wait)",
     pipelined("fwd", fpipe, "step05 forward (its table)", "fwd_pipelined_1201_1915", "defer-end 128x32 w8")),
    ("fwd: lazy rescale (FA-4)", "no", "acc rescaled only when a row's max grew by > TAU (a max over rows, a branch)",
     [lazy_rescale(8), lazy_rescale(0)]),
    ("fwd: persistent", "no", "one program per SM slot looping over query tiles, dealt back and forth (snake)",
     [persistent("snake P=2 r128"), persistent("stride P=2 r128"), persistent("snake P=1")]),
    ("dK/dV: maxnreg=128", "yes", "a 128-register cap: two 8-warp 32x128 programs per SM instead of one",
     [dkdv(t, "step06 32x128 w8", "step06 32x128 w8 r128",
           f"step 06, {regs[t]['step06 32x128 w8']} -> {regs[t]['step06 32x128 w8 r128']} registers a thread")
      for t in ("0224", "1201_1555")]),
    ("dK/dV: early dP, 1/SM", "elsewhere", "V dO^T right after K Q^T, before the exponentials (off: causal D<=64)",
     [dkdv(t, "control", "early-dp", f"the copy, 64x128 w8, {regs[t]['control']} registers: one program per SM")
      for t in ("0214", "0224")]),
    ("dK/dV: K, V from registers", "no", "wgmma reads K and V from registers instead of shared memory",
     [dkdv("0214", "control", "kv-regs", f"the copy; error {kv_err['kv-regs']:.2f}x step 06's"),
      kv_regs_table_tiles()]),
    ("dK/dV: the tutorial's way", "no", "K scaled on the host, log2 LSE, Q^T loads, the diagonal in halves",
     [dkdv("0214", "control", "tutorial-64x128", f"the copy's tiles; error {kv_err['tutorial-64x128']:.2f}x step 06's"),
      dkdv("0214", "control", "tutorial-32x128", f"its own tiles, 32x128 w4 s5 ({spills['tutorial-32x128']} B spilled)")]),
    ("dK/dV: heads first", "yes", "grid (B*H, key tiles): every head's heaviest key tiles start first",
     [lb5ms("bwd", "1705", "dkdv as at 05f8bc2 (early dP, tiles first)", "dkdv heads-first only",
            "step 06, 32x128 w8 r128 (two per SM), early dP"),
      dkdv("1201_1555", "2cta-early-dp-rowgrid", "2cta-early-dp", "the copy, 32x128 w8 r128 (two per SM)"),
      dkdv("0214", "control", "heavy-first", "the copy, 64x128 w8 (one per SM)")]),
    ("dK/dV: no early dP, >1/SM", "yes, a wash", "dP after the exponentials again, where programs share an SM",
     [lb5ms("bwd", "1705", "dkdv as at 05f8bc2 (early dP, tiles first)", "dkdv no early dP only",
            "step 06, 32x128 w8, tiles first"),
      lb5ms("bwd", "1705", "dkdv heads-first only", "table (dkdv both)", "step 06, 32x128 w8, heads first"),
      lb5ms("bwd", "1711", "dkdv 32x64 w4 s4 r128 early dP + dq hf", "dkdv 32x64 w4 s4 r128 + dq hf",
            "step 06, 32x64 w4, heads first"),
      dkdv("0224", "2cta-early-dp", "2cta", "the copy, 32x128 w8, heads first"),
      dkdv("1201_1555", "2cta-early-dp", "2cta", "the copy, 32x128 w8, heads first")]),
    ("dK/dV: 32x64 w4 r128", "yes", "four 4-warp programs per SM instead of two 8-warp ones (32x128)",
     [lb5ms("bwd", "1705", "table (dkdv both)", "dkdv 32x64 w4 s4 r128"),
      lb5ms("bwd", "1711", "table dkdv + dq hf", "dkdv 32x64 w4 s4 r128 + dq hf")]),
    ("dK/dV: pipelined by hand", "no", "the next tile's K Q^T in flight across the exponentials (+ an end wait)",
     pipelined("dK/dV", kpipe, "step06 dK/dV (its table)", "dkdv_pipelined_1201_1915", "pipe-end 32x64 w4 r168")),
    ("dQ: heads first", "yes", "grid (B*H, query tiles): every head's heaviest query tiles start first",
     [lb5ms("bwd", "1705", "table (dkdv both)", "dq heads-first"),
      lb5ms("bwd", "1711", "table (dq tiles first)", "table dkdv + dq hf")]),
    ("dQ: early dP", "no", "dO V^T issued right after Q K^T in the dQ kernel",
     [lb5ms("bwd", "1705", "table (dkdv both)", "dq early dP", "tiles first"),
      lb5ms("bwd", "1705", "dq heads-first", "dq early dP + heads-first", "heads first")]),
    ("dQ: atomic (FA-2's way)", "no", "each key tile adds its share of dQ in fp32, no 2nd pass (dq_mode='atomic')",
     [("bwd", ms("bwd", "1711", "best dkdv + best dq"), ms("bwd", "1711", fastest("bwd", "1711", atomic)),
       "lb_5ms_1201_1711", f"best separate -> best of {len(atomic)} atomic ({fastest('bwd', '1711', atomic)[7:]})"),
      ("bwd", best["separate"], best["atomic"], "lb_variants", "best tiles of each, 2026-11-30")]),
    ("dQ: TMA reduce-add (FA-3)", "D=128 causal", "atomic dQ, each share added by one TMA bulk reduce (dq_mode='atomic_tma')",
     [tma_dq_lb(), tma_dq(128, True, 16384), tma_dq(128, True, 4096), tma_dq(128, False, 16384),
      tma_dq(64, True, 4096)]),
    ("dQ: one launch (fused)", "no", "dK/dV then dQ in one launch, as Triton's tutorial (dq_mode='fused')",
     [("bwd", best["separate"], best["fused"], "lb_variants", "best tiles of each, 2026-11-30")]),
    ("warp specialization", "no", "tl.range(..., warp_specialize=True): loads and math on separate warps",
     []),
    ("Gluon: dK/dV overlapped", "yes: Hopper", "Gluon (Triton 3.6): dP^T under the exponentials, dV under dS^T (D 64, 128)",
     [gluon_row("dkdv", "1202", "overlap 64x32 s3 w4 r128"), gluon_row("dkdv", "1202_r2", "overlap 64x32 s3 w4 r128"),
      gluon_row("dkdv", "1202_r2", "overlap 64x32 s3 w4 r128", against="no-overlap 64x32 s3 w4 r128")]),
    ("Gluon dK/dV: other tiles", "no", "128 keys on two warpgroups sharing Q / dO; the shipped tile unspilled (r168)",
     [gluon_row("dkdv", "tiles_1202_r7", v, against="overlap 64x32 s3 w4 r128")
      for v in ("overlap 128x32 s3 w8 r128", "overlap 64x32 s3 w4 r168")]),
    ("Gluon: forward overlapped", "no", "Gluon: the softmax of S_j under P_{j-1} V_{j-1} (FA-3's intra-warpgroup order)",
     [gluon_row("fwd", "1202", "overlap 128x64 s3 w8"), gluon_row("fwd", "1202_r2", "overlap 128x64 s3 w8"),
      gluon_row("fwd", "1202_r2", "overlap 128x64 s3 w8", against="no-overlap 128x64 s3 w8")]),
    ("Gluon: forward warp-specialized", "yes: N>=8k", "a TMA loader warp, consumer warpgroups of 64 rows, setmaxnreg",
     [gluon_row("fwd", "fwd_ws_1203", "ws 3wg n128 s2"),
      gluon_row("fwd", "fwd_ws_1203", "ws 3wg n128 s2 pp", against="ws 3wg n128 s2")]),
    ("Gluon: warp-specialized and persistent", "no", "one CTA an SM; the loader runs on into the next tile",
     [gluon_row("fwd", "fwd_ws_1203_r2", "pers 3wg n128 s3", against="ws 3wg n128 s2")]),
    ("tiles at the power limit", "no", "tile sets, then dK/dV register caps, timed in CS336's harness itself (~690 W)",
     [at_power_limit("lb_power_1202"), at_power_limit("lb_power_r2_1202")]),
    ("heads in groups (L2)", "no", "heads first within groups of G heads, one group after another (4G MB in flight)",
     [at_power_limit("lb_groups_1202")]),
    ("everything kept, together", "yes", "the table before -> each run's best fwd and bwd (1705's: the table since)",
     [lb5ms("harness", "1705", "step06 as at 05f8bc2 (dkdv early dP, tiles first)", "step06 best fwd + best bwd",
            "CS336's harness; from the table at 05f8bc2"),
      lb5ms("harness", "1711", "step06 table", "step06 round 2's best fwd + best dkdv + best dq",
            "CS336's harness; from the table at 01b9b00")]),
]

m = lb5["1705"]
print(f"{m['shape']}; {m['machine']}, torch {m['torch']}, triton {m['triton']}; x = before / after (> 1: faster)")
print(f"timed: fwd = step 05's forward alone, bwd = step 06's backward (preprocess, dK/dV, dQ), dK/dV = that kernel"
      f" alone,\n       fwd+bwd = CS336's harness; 'the copy' = bench/experiments/triton_dkdv_variants.py's kernel\n")
print(f"{'technique':28s} {'kept':12s} what it changes")
print(f"{'':4s}{'timed':8s} {'before -> after ms':>17s} {'x':>6s}  {'file':24s} note")
for name, kept, what, meas in LEDGER:
    print("-" * 114)
    print(f"{name:28s} {kept:12s} {what}")
    for timed, a, b, src, note in meas:
        print(f"{'':4s}{timed:8s} {a:7.3f} -> {b:6.3f} {a / b:5.2f}x  {src:24s} {note}")
    if not meas:
        print(f"{'':4s}{'fwd':8s} {'(no JSON)':>17s} {'':6s}  {'README.md':24s} results/h200/triton/README.md, below")

readme = (RESULTS / "triton" / "README.md").read_text()
ws = readme[readme.index("- Warp specialization"):].split("\n\n")[0]
print("\n" + textwrap.fill("results/h200/triton/README.md: " + " ".join(ws.replace("**", "").split())[2:], 114))
print("\nWhat step 05 and step 06 run at this shape now (their tables, as loaded):")
print(f"  {'fwd':8s}", step05.dense_fwd_config(16384, 16384, 64, torch.bfloat16, True, "cuda", 16))
cfg = step06.bwd_config(16384, 16384, 64, torch.bfloat16, True, "cuda", 16)
for k in ("dq_mode", "dkdv", "dq"):
    print(f"  {k:8s}", cfg[k])
print("\n`make gpu-check` on those tables, CS336's harness, fwd+bwd ms (the target: 5.0):")
for tag in ("_23218fc", ""):
    gc = json.loads((RESULTS / "gpu-check" / f"summary{tag}.json").read_text())
    lbm, h = gc["leaderboard_ms"], gc["leaderboard_ms"]["cs336_harness"]
    print(f"  {gc['gpu']} at {lbm['commit'][:7]}, {lbm['date']}: step 06 {h['step06']:.2f}, "
          f"cuDNN {h['sdpa_cudnn']:.2f}, SDPA-FLASH {h['sdpa_flash']:.2f}")

# %% [markdown]
# What paid has one cause: an SM kept busy while a program waits. A program that takes an SM's
# registers alone (the dK/dV kernel at 64x128 on 8 warps) stalls on every `wgmma` and every batch of
# exponentials unless its own instruction order hides the wait, which is what the early dP did there.
# Capped at 128 registers, two or four programs share the SM and the warp scheduler fills one program's
# wait with another's work: the cap paid most of anything here, and what the early dP gains shrinks once
# other programs hide the same wait (with heads first, a wash in step 06 itself; the table leaves it off
# there). Heads first pays
# at the other end of the launch: under a causal mask the last query tile sees every key tile and the
# first sees one (for dK/dV, the first key tile is seen by every query tile), programs start in grid
# order, and starting all heads' heavy tiles before any light one leaves only short programs for the
# last wave, so the SMs finish together instead of waiting on a few long ones (in the copy with one
# program per SM it paid nothing, which these runs do not explain). What is left is no longer
# a tile or an order (the second run tried the neighbours of the first run's best and found none clearly
# faster; eleven more tile sets and register caps, timed in CS336's harness itself with the H200 at its
# power limit, none faster either): step 06 reads 5.06-5.18 ms in CS336's harness on four H200s, against the 5.0 target and
# cuDNN's 4.48-4.56 in the same runs. What the compile reports pointed at was overlap inside a program, this tile's softmax running
# while the next tile's `wgmma` computes, and warp specialization, producer warps issuing TMA copies
# while consumer warpgroups only compute, which Triton 3.6's `warp_specialize` did not give step 05's
# forward (NaN at three stages, slower at two). The first, written by hand in Triton ("pipelined by hand"
# above), does keep a `wgmma` in flight under the exponentials, but costs registers and extra products, and
# every form ran slower than the course's kernels (forward 0.77x at best, dK/dV 0.90x): where several
# programs share an SM they already fill that wait; the kernels stay as they are. The profiler's view of that gap is on the CUDA side
# (`results/h200/step07_v4/ncu/README.md`, notebook 07): step 07's `wgmma` forward and cuDNN's keep the
# tensor pipe busy for the same time, but cuDNN runs part of its exponentials while its tensor pipe is
# busy and loads its tiles by TMA, where step 07's copies are instructions of the warps that compute.
#
# ### What ncu says about steps 05 and 06 themselves
#
# `bench/experiments/triton_ncu.py` asked `ncu` the same questions of this step's kernels and of cuDNN's, on the
# same inputs (one H200; `results/h200/triton/ncu/`). Tensor-busy time is the tensor pipe's share of the cycles
# times the kernel's duration: the work the tensor cores were given, however it was scheduled. (ncu fixes the SM
# clock lower than do_bench runs it: compare shares, and times within one profile.)

# %%
prof = json.loads((RESULTS / "triton" / "ncu" / "summary.json").read_text())
print(f"{prof['machine']['gpu']}, {prof['machine'].get('date', '')}: {prof['clock_note'][:60]}...")
print(f"{'side':22s} {'kernel':28s} {'ms':>7s} {'tensor':>7s} {'busy ms':>8s} {'XU':>6s} {'warps/SM':>8s}  top stalls")
for k in prof["kernels"]:
    print(f"{k['side']:22s} {k['kernel'][:28]:28s} {k['duration_ms']:7.3f} {k['tensor_pipe_active_pct']:6.1f}% "
          f"{k['tensor_busy_ms']:8.2f} {k['xu_pipe_pct']:5.1f}% {k['warps_per_sm']:8.1f}  "
          + ", ".join(f"{x} {v:.2f}" for x, v, _ in k["top_stalls"][:2]))
busy = lambda side: sum(k["tensor_busy_ms"] for k in prof["kernels"] if k["side"] == side)   # noqa: E731
print(f"\nbackward, tensor-busy ms: step 06 {busy('s06-bwd D=64 causal'):.2f}, cuDNN {busy('cudnn-bwd D=64 causal'):.2f} "
      f"({busy('s06-bwd D=64 causal') / busy('cudnn-bwd D=64 causal'):.2f}x)")

# %% [markdown]
# Three different answers:
#
# - **The leaderboard forward** (D = 64, causal) has nothing left to find: step 05 gives the tensor pipe the same
#   work as cuDNN and keeps it as busy.
# - **The D = 128 forward** does cuDNN's tensor work at 56% of the cycles against 75%: here the overlap is what is
#   missing, one 8-warp program an SM waiting on barriers and `wgmma`, where cuDNN's warp-specialized kernel keeps
#   the products going under the softmax (step 07's v5 and v6 do that in CUDA, notebook 07).
# - **The backward** keeps the tensor pipe as busy as cuDNN's, or busier, and still loses: it gives it 1.39x the
#   work. That is section 4's choice showing up in the profile: the dQ kernel recomputes $S$ and $dP$ (seven products
#   against five) so that every gradient element has one owner and the result is deterministic; cuDNN adds dQ with
#   atomics. At the leaderboard shape the extra products are about the whole of the backward's gap to cuDNN, and so
#   of the last 0.06 ms to the 5.0 ms target: closing it takes fewer products (atomics that cost less than they did
#   in Triton here, section 4), or a schedule Triton itself cannot write (Gluon, below).

# %% [markdown]
# The forward's largest gap that is left, after the Gluon kernels of the rest of this section, is causal attention
# at N = 4096 (0.86x cuDNN at D = 64, 0.94x at D = 128 in `results/h200/grid_1203c/`). The same profile there
# (`results/h200/triton/ncu_c4k/`, FlashAttention's grid as one batch, forward and backward), with two more columns:
# the instructions each kernel issued and how busy its issue slots were.

# %%
c4k = json.loads((RESULTS / "triton" / "ncu_c4k" / "summary.json").read_text())
print(f"{'side':30s} {'kernel':24s} {'busy ms':>8s} {'XU':>6s} {'instr 1e9':>9s} {'issue':>6s} {'LSU':>6s}  top stall")
for k in c4k["kernels"]:
    if k["tensor_busy_ms"] < 0.01:
        continue                      # the backward's small kernels (Delta, cuDNN's dQ conversion)
    print(f"{k['side']:30s} {k['kernel'][:24]:24s} {k['tensor_busy_ms']:8.3f} {k['xu_pipe_pct']:5.1f}% "
          f"{k['instructions_issued_e9']:9.3f} {k['issue_slots_busy_pct']:5.1f}% {k['lsu_pipe_pct']:5.1f}%  "
          f"{k['top_stalls'][0][0]}")
for d in (64, 128):
    b = {impl: sum(k["tensor_busy_ms"] for k in c4k["kernels"] if k["side"] == f"{impl}-bwd D={d} causal N=4096")
         for impl in ("s06", "cudnn")}
    print(f"backward D={d}: tensor-busy ms step 06 {b['s06']:.3f}, cuDNN {b['cudnn']:.3f} ({b['s06'] / b['cudnn']:.2f}x)")

# %% [markdown]
# At D = 64 step 05 does cuDNN's tensor work and its exponentials (the same busy time, the same XU share) in a third
# more instructions, its issue slots the busier, its warps' first stall `not_selected`: ready, and waiting for a slot
# another warp took. The extra instructions are its loads and their addresses (the LSU column): one program of 8 warps
# issues the copies and the math alike, where cuDNN gives the copies to a TMA producer. At D = 128 the instruction
# counts match and the tensor pipe is busy 53% of the cycles against 63%: the waits of one 8-warp program, as at
# N = 16384 above. The warp-specialized Gluon forward answers both, and wins from N = 8192; at N = 4096 under a causal
# mask its per-CTA cost outweighs what it saves. The backward is the 1.4x of the leaderboard shape again, at both D.

# %% [markdown]
# ### At the power limit: why the harness reads more than the kernels add up to
#
# One more measurement changes how to read every harness figure above. Under `torch.profiler`, the kernels of one
# CS336 harness step add up to about 4.81 ms (`bench/experiments/lb_streams.py`, part 4), yet the harness reads
# 5.08-5.13. `bench/experiments/lb_gaps.py` looked for the difference three ways at once: gaps where the GPU waited
# for the host (from the profiler's trace, each kernel tied to its launch call), the kernels' own durations after a
# pause and in a sustained run, and `nvidia-smi`'s SM clock and power every 100 ms.

# %%
import csv
from datetime import datetime

GAPS = RESULTS / "triton" / "lb_gaps_1202"
gaps = json.loads((GAPS / "lb_gaps.json").read_text())
with open(GAPS / "smi.csv") as fh:
    rows = [[c.strip() for c in r] for r in list(csv.reader(fh))[1:]]
t0 = datetime.strptime(rows[0][0], "%Y/%m/%d %H:%M:%S.%f")
t = [(datetime.strptime(r[0], "%Y/%m/%d %H:%M:%S.%f") - t0).total_seconds() for r in rows]
clock = [int(r[1].split()[0]) for r in rows]
watts = [float(r[3].split()[0]) for r in rows]
# The runs under load, in the script's order: each implementation's harness, then its 100 steps + profiled phases.
loaded, blocks = [w > 600 for w in watts], []
for i, on in enumerate(loaded):
    if on and (i == 0 or not loaded[i - 1]):
        blocks.append([i])
    elif on:
        blocks[-1].append(i)
names = ["step 06, harness", "step 06, sustained", "cuDNN, harness", "cuDNN, sustained"]
print(f"{gaps['gpu']}, {gaps['meta']['date_utc']}; idle {max(clock)} MHz")
for name, b in zip(names, blocks):
    print(f"  {name:18s} {sum(clock[i] for i in b) / len(b):6.0f} MHz  {sum(watts[i] for i in b) / len(b):5.0f} W")
for impl, label in (("step06", "step 06"), ("sdpa_cudnn", "cuDNN")):
    r = gaps["parts"][impl]
    a, s = r["after_pause"]["mean"], r["sustained"]["mean"]
    print(f"{label:8s} harness {r['harness_mean_ms']:.3f} ms; kernels busy {a['busy_us'] / 1e3:.3f} ms a step after a pause, "
          f"{s['busy_us'] / 1e3:.3f} sustained ({s['busy_us'] / a['busy_us'] - 1:+.1%}); "
          f"host gaps {a['host_gap_us']:.0f} us / {s['host_gap_us']:.0f} us")

fig, ax = plt.subplots(figsize=(9, 3))
ax.plot(t, clock, color="C0", label="SM clock (MHz)")
ax.set_xlabel("seconds into the run")
ax.set_ylabel("MHz")
ax2 = ax.twinx()
ax2.plot(t, watts, color="C3", alpha=0.5, label="power (W)")
ax2.set_ylabel("W")
for name, b in zip(names, blocks):
    ax.annotate(name, (t[b[0]], 1500), fontsize=8)
ax.set_ylim(1450, 2050)
ax.set_title("CS336's harness on an H200: the clock drops at 700 W, more for step 06 than for cuDNN")
fig.tight_layout()
plt.show()

# %% [markdown]
# The host is not it: in a sustained run no gap is the host's, and the ten launch boundaries of a step cost about
# 15 us together. (After a pause it is another story: the GPU waits about 0.23 ms a step while the autograd engine
# and the compiled backward reach step 06's operator, which is what a single call pays.) The clock is: every
# harness run draws the H200's 700 W, and the GPU lowers its clock to stay there. Doing the same job, cuDNN's
# kernels hold about 1.91 GHz, step 06's about 1.82, so step 06's kernels run 5% longer sustained than after a
# pause, cuDNN's 1%. At the power limit time follows energy: the dQ pass's recomputed products cost twice, once in
# time and once more in clock, and a benchmark that runs a few warm iterations after a pause flatters the kernel
# that does more work. Whatever closes the last step to 5.0 ms has to do less, not only do it faster.

# %% [markdown]
# ### What Triton cannot write, Gluon can: products left in flight
#
# Every Triton form above ends the same way: Triton 3.6 issues a `wgmma` and waits for it at once, so a program's
# exponentials never run under its own products (other programs on the SM are all that hide the wait). Triton
# 3.6 also ships **Gluon** (`triton.experimental.gluon`), the layer under it: the kernel allocates its shared
# memory, loads by TMA with its own mbarriers, picks every layout, and issues `warpgroup_mma(..., is_async=True)`
# then `warpgroup_mma_wait(num_outstanding=n, ...)` with the `n` it chooses. The dK/dV loop then becomes
# FlashAttention-3's order:
#
# ```
# issue  S^T_i = K Q_i^T ;  issue dP^T_i = V dO_i^T
# wait (1 left)            -> P^T_i = exp2(S^T_i - LSE)     while dP^T_i runs
# issue  dV += P^T_i dO_i
# wait (1 left)            -> dS^T_i = P^T_i (dP^T_i - D)   while dV runs
# issue  dK += dS^T_i Q_i ;  wait (0 left) ; refill tile i's buffer
# ```
#
# One trap, found by compiling for sm_90a without a GPU (`--aot-check`): leaving this loop's products in flight
# across its back edge (the next tile's `S^T` issued before this tile's `dV` and `dK` are waited for) makes `ptxas`
# serialize every `wgmma` of the kernel (its warning C7515), because the loop-carried accumulators are then copied
# by ordinary instructions while a product still owns them. One product can cross it: Triton's own dQ loop leaves
# `dQ += dS K` in flight into the next iteration (its TTGIR: the wait comes with the next `S`), and so does the
# Gluon dQ kernel of round 4, unserialized. `bench/experiments/gluon_dkdv_overlap.py` and
# `gluon_fwd_overlap.py` time each kernel against the same Gluon kernel waiting on every product and against this
# step's (one H200, two rounds):

# %%
for kind, step in (("dkdv", "step06 dK/dV"), ("fwd", "step05")):
    for rnd in ("1202", "1202_r2"):
        for r in gluon[(rnd, kind)]:
            if not (r["shape"].startswith("leaderboard") or ("N4096" in r["shape"] and "D64" in r["shape"])):
                continue
            best = max(r["vs_" + ("step06" if kind == "dkdv" else "step05")].items(), key=lambda kv: kv[1])
            print(f"{kind:5s} {rnd:8s} {r['shape'][:36]:36s} best {best[0]:28s} x{best[1]:.2f} against {step}")

# %% [markdown]
# The dK/dV kernel, where four products and the exponentials compete, gains from the overlap (1.02-1.10x against
# itself waiting; 1.01-1.05x against step 06's kernel at the leaderboard shape, 1.02-1.09x at N = 4096, more at
# D = 128), and is the first form of it to beat step 06's. The D = 64 forward gains nothing: its products are short
# against its exponentials, and the softmax is the work.
#
# Rounds 3 and 4 put the Gluon dK/dV kernel inside step 06's backward and ran CS336's harness, alternated with
# step 06 as it was, on two H200s; they also wrote the dQ kernel in Gluon, first with the exponentials under dP and
# the previous dQ product (139-149 registers: one 8-warp program an SM where Triton's dQ kernel fits two, 0.70-0.88x),
# then on Triton's own schedule (120 registers, 0.96-0.97x at the leaderboard shape): no.

# %%
for rnd in ("1202_r3", "1202_r4"):
    h = load(f"gluon_{rnd}/gluon_dkdv_overlap")["harness"]
    print(rnd, "  ".join(f"{r['name']} {r['ms']:.3f} ms ({r['sm_mhz']} MHz)" for r in h))

# %% [markdown]
# About 2% off the whole step, in the harness that matters: so the solution of this step now hands dK/dV to the
# Gluon kernel on a Hopper GPU, where it was measured (16-bit, self-attention, N a multiple of 128; without a causal
# mask, N >= 4096: round 6 below;
# `solutions/gluon_dkdv.py`, `hopper_dkdv` in the step; `ATTN_GLUON_DKDV=0` turns it off). Your step 06 keeps your
# Triton kernel on every GPU, and the grader grades that. What 5.0 ms still needs is less work, not only faster
# work: the dQ pass recomputes `S` and `dP`, and at the power limit that costs twice.
#
# At D = 128 the question was different: where it is causal and N >= 4096, this step adds dQ inside its dK/dV
# kernel (`atomic_tma`, above), so the Gluon kernel, which computes no dQ, must also pay for a second dQ pass.
# Round 5 timed the whole backward both ways on FlashAttention's grid (one H200, `gluon_d128_1202/`):

# %%
for r in load("gluon_d128_1202/gluon_dkdv_overlap")["d128_rows"]:
    print(f"{r['shape']:22s} step 06 as it was ({r['shipped_dq_mode']:10s}) {min(r['ms']['step06'], r['ms']['step06 again']):6.3f} ms"
          f"   Gluon 64x64 + dQ pass x{r['vs_step06']['overlap 64x64 s2 w4']:.3f}")

# %% [markdown]
# The Gluon kernel and a second pass win everywhere, by 1.5-3.7% where they replace `atomic_tma` and up to 10% where
# the step already ran two passes: so at D = 128 the solution takes them too, and prefers `"separate"` to its table's
# `atomic_tma` where the Gluon kernel takes the inputs (`hopper_dkdv_takes`).
#
# Below N = 4096 the grid's rows were less clear, so round 6 timed step 06's whole backward with the path off and on,
# alternated twice on one H200 (`gluon_short_n_1202/`, D = 64 and 128, N 512-4096):

# %%
for r in load("gluon_short_n_1202/gluon_dkdv_overlap")["short_n_rows"]:
    print(f"{r['shape']:26s} on/off x{r['on_over_off']:.3f}   " + "  ".join(f"{k} {v:.3f}" for k, v in r["ms"].items()))

# %% [markdown]
# Without a causal mask the path lost or tied below N = 4096: the kernel's gain on a short loop is less than what a
# launch with four TMA descriptors costs. With one, every key tile's loop is shorter still, yet it tied or won (the
# heavy early key tiles start first). So the path starts at N = 4096 without a causal mask (`FULL_MIN_LEN`) and has
# no floor with one. Differences under 3% here are within what the same shape read twice.

# %% [markdown]
# **The dQ pass at D = 128** (issue 17, 2026-12-03). Under `ncu` at N = 4096, causal (`ncu_c4k/`, read at the end
# of this section), the Triton dQ kernel at D = 128 keeps the tensor pipe busy 58% of its cycles, the Gluon dK/dV
# kernel beside it 64%. Rounds 3 and 4 had tried a Gluon dQ kernel at D = 64 only. `bench/experiments/gluon_dq.py`
# wrote it again on the dK/dV kernel's recipe (Q and dO loaded once, K and V through a TMA ring, `S` and `dP` issued
# together, `P = exp2(S - LSE)` computed while `dP` is on the tensor cores, then `dQ += dS K`) and timed it at both
# head dims on FlashAttention's grid, alone and inside the whole backward, against cuDNN's backward in the same run
# (one H200):

# %%
for r in load("gluon_dq_1203/gluon_dq")["timing_rows"]:
    best = max(r["dq_vs_triton"].items(), key=lambda kv: kv[1])[0]
    print(f"{r['shape'][:36]:36s} dQ kernel {best:18s} x{r['dq_vs_triton'][best]:.2f} the Triton one;"
          f"  backward x{r['bwd_vs_step06'][best]:.2f} step 06's, {r['bwd_vs_cudnn'][best]:.2f} cuDNN's")

# %% [markdown]
# At D = 128 the Gluon kernel wins at every shape: 1.04-1.17x the Triton dQ kernel, 1.02-1.06x the whole backward
# (0.95x at N = 4096 without a mask, where step 06's own two runs read 5% apart). At D = 64 it does not (0.88-0.97x
# with the Triton kernel's own tiles): that kernel already keeps the tensor pipe 66% busy; at D = 128 under `ncu`
# (N = 4096, causal, `ncu_c4k_dq/`) the Gluon kernel keeps it 76% busy where the Triton one kept 58%. So the solution runs
# `_gluon_dq` at D = 128 from N = 4096 (`DQ_TILES`, `hopper_dq` in the step) and keeps the Triton dQ kernel at
# D = 64. (Since the one-kernel backward at the end of this section, the two-kernel backward, and so this dQ kernel,
# runs on Hopper only where that one does not: below N = 1024, under deterministic algorithms, or with a `config` or
# `dq_mode` asked for.) The backward is still 0.76-0.81x cuDNN's at D = 128: the seven products against cuDNN's five are still
# paid, and putting dQ inside the dK/dV kernel with fp32 atomics lost (0.66-0.85x, `gluon_dkdv_dq_1203/`).

# %% [markdown]
# ### Warp specialization, in Gluon: the forward
#
# Everything above keeps one kind of warp: each loads its tiles, waits, multiplies, exponentiates. FlashAttention-3
# and cuDNN split a CTA's warps by job. One **loader warp** does nothing but issue TMA copies of K and V into a ring
# of shared-memory buffers, running ahead of the math by as many stages as fit; **consumer warpgroups** each own 64
# query rows of the CTA's tile and never wait for one another. Two mbarriers a buffer carry the hand-offs: `ready`
# (the TMA's bytes have landed) and `empty` (every consumer's products that read the buffer are done; each consumer
# arrives once). Since the loader needs almost no registers, `setmaxnreg` moves them to the consumers: 24 for the
# loader, 160-240 for each consumer. Triton 3.6 cannot write this (`tl.range(..., warp_specialize=True)` gave NaN or
# ran slower on Hopper, in the ledger); Gluon can: `gl.warp_specialize` takes each partition's function and
# arguments, and the warps and registers of each. Inside each consumer the loop is FlashAttention-3's intra-warpgroup order, as
# in the Gluon forward above. `bench/experiments/gluon_fwd_ws.py` timed nine variants (two or three consumer
# warpgroups, 64- or 128-key tiles, two to four stages, and with the consumers issuing their products in turns,
# FlashAttention-3's "ping-pong") beside step 05 and cuDNN in one run (one H200, `gluon_fwd_ws_1203/`):

# %%
ws = load("gluon_fwd_ws_1203/gluon_fwd_ws")
for r in ws["timing_rows"]:
    m = r["ms"]
    s05 = min(m["step05"], m["step05 again"])
    best = min((v for v in m if v.startswith("ws ") and isinstance(m[v], float)), key=lambda v: m[v])
    print(f"{r['shape']:38s} step 05 {s05:6.3f} ms ({m['cudnn'] / s05:.2f}x cuDNN)   best WS {best:18s} "
          f"{m[best]:6.3f} ms: x{s05 / m[best]:.2f} step 05, {m['cudnn'] / m[best]:.2f}x cuDNN")

# %% [markdown]
# At N = 16384 warp specialization pays: 1.04-1.14x step 05 and 0.99-1.06x cuDNN, past cuDNN without a causal mask at
# D = 64 (three consumer warpgroups, 192-row tiles). At N = 4096 it loses or ties: a CTA's loop is short, and the
# split's fixed costs (a CTA of four warpgroups, one of them mostly idle, barriers every tile) are not repaid. Ping-pong
# ran 0.95-1.06x the same kernel without it: it helped only where two stages starved the consumers (D = 128,
# N = 16384), and three stages without it were faster still; the warp schedulers interleave the consumers well
# enough by themselves. The leaderboard shape is level (1.27 ms either way, as cuDNN): the forward was never where
# step 06 trails cuDNN there.
#
# Round 2 asked whether the N = 4096 loss is the CTA's fixed cost: the same partitions made persistent (one CTA an
# SM walking the work tiles, the loader running on into the next tile's Q and K/V while the consumers finish this
# one), in a second run (`gluon_fwd_ws_1203_round2/`) that also timed N = 8192:

# %%
ws2 = load("gluon_fwd_ws_1203_round2/gluon_fwd_ws")
for r in ws2["timing_rows"]:
    m = r["ms"]
    s05 = min(m["step05"], m["step05 again"])
    shipped = "ws 3wg n128 s2" if " D64 " in r["shape"] else "ws 2wg n128 s3"
    pers = min((v for v in m if v.startswith("pers ") and isinstance(m[v], float)), key=lambda v: m[v])
    print(f"{r['shape']:38s} step 05 {m['cudnn'] / s05:.2f}x cuDNN   round 1 {shipped} {m['cudnn'] / m[shipped]:.2f}x"
          f"   best persistent ({pers}) {m['cudnn'] / m[pers]:.2f}x")

# %% [markdown]
# Persistence pays at D = 64 without a causal mask only (1.04-1.10x cuDNN from N = 4096); causal it trails round 1,
# and at D = 128 it runs 8-18% slower everywhere. Causal attention at N = 4096 stays at step 05's 0.83x (D = 64) and
# 0.90x (D = 128) cuDNN: neither round moves it, and it is this course's largest gap to cuDNN in the forward. At
# N = 8192 round 1's tiles beat step 05 in all four cases (1.01-1.16x); at N = 4096 without a causal mask too (1.04x
# at D = 64, 1.07x at D = 128; 1.02x and 1.03x in round 1's own run), with it not (0.95x, 0.98x). So the solution of
# step 05 hands the Gluon forward N >= 8192 under a causal mask (from N = 4096 since its heads go in groups: below)
# and N >= 4096 without one, on Hopper
# (`solutions/gluon_fwd.py`, `hopper_fwd` in the step; `ATTN_GLUON_FWD=0` turns it off): the round-1 kernel, except
# at D = 64 without a mask, where it runs the persistent one; below those lengths its Triton kernel; compiled too,
# through the opaque operator of section 9.
#
# Round 4 asked whether the causal consumers waste their time. Each of the three warpgroups stepped through every key
# tile of its CTA, also the tiles wholly past its own 64 rows' diagonal: 11% of the products and exponentials at
# N = 4096, 4% at 8192. A consumer that stops at its diagonal must still hand the CTA's later buffers back, each only
# once the loader has filled it (an arrive before the fill would count toward the buffer's previous use), or the
# loader waits forever for it. The variant against the same tiles without the skip, in one run; then, after it
# shipped (`SKIP_PAST_DIAGONAL` in `solutions/gluon_fwd.py`), the solution's kernel in round 5:

# %%
ws4 = load("gluon_fwd_ws_1203_round4/gluon_fwd_ws")
ws5 = {r["shape"]: r["ms"] for r in load("gluon_fwd_ws_1203_round5/gluon_fwd_ws")["timing_rows"]}
for r in ws4["timing_rows"]:
    m = r["ms"]
    if " D64 " not in r["shape"]:
        continue          # two warpgroups at D = 128: a 128-row CTA and 128-key tiles end on the diagonal together
    m5 = ws5[r["shape"]]
    print(f"{r['shape']:38s} round 4: skip x{m['ws 3wg n128 s2'] / m['skip 3wg n128 s2']:.3f} the same tiles,"
          f" {m['cudnn'] / m['skip 3wg n128 s2']:.2f}x cuDNN   round 5, shipped: {m5['cudnn'] / m5['ws 3wg n128 s2']:.2f}x"
          f" cuDNN")

# %% [markdown]
# 1.01-1.03x: about a quarter of what the saved products would give if time followed tensor work, so they were not
# what the consumers waited on. It ships where step 05 runs the kernel (causal, D = 64, N >= 8192), and takes
# D = 64 causal N = 8192 to about 0.96x cuDNN (0.97x in the grid `results/h200/grid_1203f/`; cuDNN's own time at that
# shape moves by 6% between runs). N = 4096 causal stays step 05's Triton kernel at 0.83x: what is left there is
# per-CTA cost, not wasted work.
#
# That last guess was wrong, and ncu had the clue all along (`results/h200/triton/ncu_c4k/`): step 05's D = 64
# forward at causal N = 4096 hit L2 on 12% of its reads, cuDNN on 84%. Both of the course's forwards started every
# head's heaviest query tile before any head's next (step 05's `HEADS_FIRST`, the Gluon kernel's grid), so every head
# was in flight at once: at FlashAttention's grid, N = 4096, D = 64, that is 128 heads with 1 MB of K and V each,
# against the H200's 60 MB of L2. FlashAttention-3's tile scheduler takes the heads in groups whose K and V fit in L2,
# heaviest tile first within a group. `bench/experiments/fwd_tile_order.py` timed both kernels under every group size
# (`HEAD_GROUP`; 0 = every head at once, 1 = one head after another), and ncu read the L2 (one H200, 2026-12-04,
# `results/h200/triton/fwd_tile_order_1204/`; notebook 05 section 9 has the whole story):

# %%
order = {rnd: {r["shape"]: r for r in load(f"fwd_tile_order_1204/round{rnd}/fwd_tile_order")["timing_rows"]}
         for rnd in (1, 2)}
for shape in ("grid B4 H32 N4096 D64 causal", "grid B4 H16 N4096 D128 causal", "grid B2 H32 N8192 D64 causal"):
    for rnd in (1, 2):
        b = order[rnd][shape]["best_ms"]
        groups = sorted((k for k in b if k.startswith("gluon g") and k != "gluon g0"), key=lambda k: b[k])
        print(f"{shape:32s} run {rnd}: Gluon every head at once {b['gluon g0']:.3f} ms ({b['cudnn'] / b['gluon g0']:.2f}x"
              f" cuDNN), best group ({groups[0].split()[1]}) {b[groups[0]]:.3f} ms ({b['cudnn'] / b[groups[0]]:.2f}x),"
              f" Triton {b['triton g0']:.3f} -> {min(b[k] for k in b if k.startswith('triton g') and k != 'triton g0'):.3f}")

# %% [markdown]
# The same tiles in another order: 1.13-1.17x faster at N = 4096 and 1.03-1.13x from N = 8192, the L2 hit rate 82-85%
# and 0.20 GB read from DRAM a forward instead of 1.6-2.0 GB. Groups of 1 to 16 heads are within a few percent of
# each other; every head at once is the outlier. So step 05 takes heads in groups whose K and V fit 8 MB
# (`head_group`, `L2_GROUP_BYTES`) for every 16-bit causal forward on a GPU, and its solution runs this Gluon kernel
# under a causal mask from N = 4096 (`MIN_LEN`). An order has no FLOP in it; the profiler's memory section, read
# before the stall reasons, would have found it a day earlier.

# %% [markdown]
# ### The whole backward in one kernel: FlashAttention-3's shape
#
# Count the products of one (query tile $i$, key tile $j$) pair. The dK/dV kernel makes four: $S^\top = K_j Q_i^\top$,
# $dP^\top = V_j\,dO_i^\top$, $dV_j \mathrel{+}= P^\top dO_i$, $dK_j \mathrel{+}= dS^\top Q_i$. The dQ pass owns query
# tile $i$ and never sees that $dS$ (nothing stores it), so it makes $S$ and $dP$ again before its own
# $dQ_i \mathrel{+}= dS\,K_j$: seven products of one size, 1.40x the tensor work of a kernel that makes $dQ_i$ from the
# $dS^\top$ it already holds. That is the 1.4x ncu measured against cuDNN above, and at the power limit it is paid
# twice. Five products cost what section 4 weighed: every key tile's program adds into the same rows of $dQ$, and
# the adds land in any order.
#
# Three attempts put the fifth product into step 06's own Gluon dK/dV kernel (one warpgroup, 64 keys a program,
# D = 64; `bench/experiments/gluon_dkdv_dq.py`), and lost (against step 06 at each shape's best tile set):
#
# 1. **fp32 atomics** (`results/h200/triton/gluon_dkdv_dq_1203/`): $dQ_i^\top = K_j^\top dS^\top$ added element by
#    element, 0.68-0.85x step 06's backward. With 64-key tiles every pair adds a whole `BLOCK_M x D` fp32 tile to
#    L2: 2.1e9 adds at the leaderboard shape.
# 2. **one TMA bulk reduce a tile** (`gluon_dkdv_dq_1203_round2/`): the tile staged in shared memory and added in L2
#    by the TMA unit, `cp.reduce.async.bulk.tensor ... .add`, as FlashAttention-3 adds it (Triton 3.6's Gluon builds
#    the op but has no function for it on Hopper; `tma_reduce_add` is the three-line builtin). 1.04-1.09x round 1's
#    adds, still 0.75-0.91x step 06: the adds were part of the loss, not all of it.
# 3. **a head's key tiles side by side** (`gluon_dkdv_dq_1203_round3/`): with heads first in the grid, the programs
#    resident together add into as many heads' dQ as there are programs, the whole fp32 buffer (134 MB on the grid at
#    D = 64) against a 50 MB L2. Turned round, 1.03-1.21x round 2, and still 0.85-0.97x step 06 (0.85-0.93x at 64x32).
#    What was left was the program's shape: 64 keys, 141-151 registers (three programs an SM), a dQ tile added per 64
#    keys.
#
# FlashAttention-3's backward has another shape (`bench/experiments/gluon_bwd_ws.py`, shipped as `_gluon_bwd_ws` in
# `solutions/gluon_dkdv.py`): one CTA a (128 keys, batch x head), a head's key blocks side by side (round 3's order;
# causal, the heaviest first), split by `gl.warp_specialize` as the forward above. A **loader warp** loads K and V
# once and $Q_i$, $dO_i$ by TMA through a ring of STAGES buffers (mbarriers `ready`, `empty`); two **consumer
# warpgroups** of 64 keys each run the Gluon dK/dV order of this section. The kernel launches at 168 registers a
# thread (3 x 128 x 168 <= 65536: one CTA an SM), and `setmaxnreg` gives the consumers 240 and the loader 24. Run 4
# (`gluon_bwd_ws_1203/`) let each consumer add its own share of $dQ_i$, over its 64 keys: two reduces a CTA a query
# tile, 0.93-1.06x step 06, level. Run 5 (`gluon_bwd_ws_1203_r2/`) made **one dQ a CTA**: both consumers' $dS^\top_i$
# go to shared memory (mbarriers `ds_full`, `ds_free`), and $dQ_i$ over all 128 keys is made once, by consumer
# $i \bmod 2$ ("alt", D = 64), or in two column halves, one a consumer ("split", D = 128, where a whole $dQ_i$
# accumulator does not fit beside dK and dV). Half the reduces into L2, each dQ product twice as deep, and at D = 64
# the consumers take the dQ work in turns. Consumer $w$'s query tile $i$, "alt":
#
# ```
# loader      K_0, V_0, K_1, V_1 once; per tile: wait empty[s]; TMA Q_i, dO_i into buffer s = i % STAGES -> ready[s]
# consumer w  wait ready[s]
#             issue  S^T = K_w Q_i^T ;  issue dP^T = V_w dO_i^T
#             wait (1 left)            -> P^T = exp2(S^T - LSE)      while dP^T runs
#             issue  dV_w += P^T dO_i
#             wait (1 left)            -> dS^T = P^T (dP^T - D)      while dV runs
#             wait ds_free ; dS^T (its 64 keys) -> shared memory ; arrive ds_full
#             issue  dK_w += dS^T Q_i
#             if w == i % 2:  wait ds_full ; issue dQ_i = dS_0 K_0 + dS_1 K_1 ; wait ; arrive ds_free
#                             scale * dQ_i -> shared memory (fp32) ; tma_reduce_add into dQ's fp32 buffer
#             wait (0 left) ; arrive empty[s]
# ```
#
# After the kernel, dQ is its fp32 buffer cast (one elementwise kernel). The reduces land in any order, so under
# `torch.use_deterministic_algorithms(True)` step 06 runs its two kernels, as it refuses its atomic modes. The backward
# alone in each attempt, against step 06's backward as it shipped in the same run (the faster of its two timings), at
# each attempt's best tile set; for run 5 the tiles step 06 now runs (`BWD_TILES`), also against cuDNN:

# %%
SHIPPED = {64: "alt m64 s2 q1", 128: "split m64 s2 q2"}         # BWD_TILES: what step 06 runs from N = 1024
ATTEMPTS = [  # (column, file under results/h200/triton/, the variants it counts)
    ("1 atomic", "gluon_dkdv_dq_1203/gluon_dkdv_dq", lambda v, D: True),
    ("2 reduce", "gluon_dkdv_dq_1203_round2/gluon_dkdv_dq", lambda v, D: v.endswith(" tma")),
    ("3 keys 1st", "gluon_dkdv_dq_1203_round3/gluon_dkdv_dq", lambda v, D: v.endswith(" kf")),
    ("4 FA-3 ws", "gluon_bwd_ws_1203/gluon_bwd_ws", lambda v, D: v.startswith("ws ")),
    ("5 ws", "gluon_bwd_ws_1203_r2/gluon_bwd_ws", lambda v, D: v.startswith("ws ")),
    ("5 one dQ", "gluon_bwd_ws_1203_r2/gluon_bwd_ws", lambda v, D: v == SHIPPED[D]),
]
attempt_rows = {col: {r["shape"]: r for r in load(f)["timing_rows"]} for col, f, _ in ATTEMPTS}


def head_dim(shape):
    return 128 if " D128 " in shape else 64


def vs_step06(col, keep, shape):
    """The attempt's best time against step 06's in its run (> 1: faster), or None where it did not time the shape."""
    r = attempt_rows[col].get(shape)
    x = [v for name, v in (r or {}).get("vs_step06", {}).items() if keep(name, head_dim(shape))]
    return max(x) if x else None


shapes = list(attempt_rows["5 one dQ"])                         # run 5 timed every shape, D = 128 too
print("backward alone, bf16, do_bench median, one H200; x = step 06's time / the attempt's (> 1: faster)")
print(f"{'shape':37s}" + "".join(f"{col:>11s}" for col, _, _ in ATTEMPTS) + f"{'x cuDNN':>9s}")
for shape in shapes:
    xs = [vs_step06(col, keep, shape) for col, _, keep in ATTEMPTS]
    cudnn = attempt_rows["5 one dQ"][shape]["vs_cudnn"][SHIPPED[head_dim(shape)]]
    print(f"{shape.replace('grid ', ''):37s}" + "".join(f"{'' if x is None else f'{x:.2f}':>11s}" for x in xs)
          + f"{cudnn:9.2f}")

fig, ax = plt.subplots(figsize=(9, 3.2))
picked = [s for s in shapes if s.startswith("leaderboard") or ("N16384 D64" in s and s.startswith("grid"))]
for k, shape in enumerate(picked):
    ys = [vs_step06(col, keep, shape) for col, _, keep in ATTEMPTS]
    xs = [i + (k - 1) * 0.27 for i in range(len(ATTEMPTS))]
    ax.bar(xs, ys, width=0.27, color=f"C{k}", label=shape.replace("grid ", ""))
    r = attempt_rows["5 one dQ"][shape]["ms"]
    ax.hlines(min(r["step06"], r["step06 again"]) / r["cudnn"], -0.5, len(ATTEMPTS) - 0.5, colors=f"C{k}",
              linestyles=":", linewidth=1)
ax.axhline(1.0, color="k", linewidth=0.8)
ax.set_xticks(range(len(ATTEMPTS)))
ax.set_xticklabels([col for col, _, _ in ATTEMPTS])
ax.set_ylim(0.6, 1.3)
ax.set_ylabel("x step 06's backward")
ax.set_title("five products, attempt by attempt (dotted: cuDNN in run 5; black: step 06's two kernels)", fontsize=9)
ax.legend(fontsize=8, loc="upper left")
fig.tight_layout()
plt.show()

# %% [markdown]
# Each change paid, and only the whole shape won. Compare the modes within one run: "ws" reads 1.02-1.09x in run 5
# where it read 0.93-1.06x in run 4, which computed $D$ with PyTorch (three small kernels) where run 5 used step 06's
# preprocess kernel; within run 5, one dQ a CTA is what takes D = 64 to 1.09-1.21x step 06 and 0.93-1.04x cuDNN
# (1.12x and 0.98x at the leaderboard shape). At D = 128 "split" runs 1.05-1.25x step 06 except causal N = 16384
# (0.99x), and 0.81-0.94x cuDNN: its consumers still spill (ptxas, `gluon_bwd_ws.py --aot-check`). Each figure is one
# run, and step 06's two timings in one run differ by 1-9%.
#
# **Round 3: the spills** (`gluon_bwd_ws.py --round 3`, `gluon_bwd_ws_1204_r3/`). A consumer has 240 registers a
# thread; what does not fit, ptxas spills: stores to local memory and loads back. At D = 64 nothing spills. At
# D = 128 a consumer's dK and dV alone, 64 x 128 fp32 each, take 128 of the 240; without a mask it spills 28 B a
# thread, under the causal mask 176 B (216 loaded back). The mask is the difference, so round 3 made the masked loop
# hold fewer registers: two constexpr switches of `_gluon_bwd_ws`, each a change to the consumer above.
#
# - `LOCAL_MASK`: the causal test in the tile's own indices. Key $n_0 + r$ ($n_0$ the warpgroup's first key) sees
#   query $m + c$ ($m$ the query tile's first row) when $n_0 + r \le m + c$, that is $r \le c + (m - n_0)$. With
#   global offsets, `offs_n` (the warpgroup's 64 key indices) is made before the loop and held through all of it,
#   only for the mask, and this tile's `offs_m` is compared with it. With `gl.arange(0, 64)` and
#   `gl.arange(0, BLOCK_M)`, a thread's $r$ and $c$ are its fixed places in the accumulator's layout, which the
#   compiler can rebuild from the thread's index, and what changes from tile to tile is one scalar, $m - n_0$.
#   FlashAttention-3's mask (`hopper/mask.h`) is written this way: thread 0's column indices, "known at compile
#   time", against one limit a row. 176 -> 92 B.
# - `DS_FIRST`: $dS^\top$ before $dV$ is issued. The order above issues $dV \mathrel{+}= P^\top dO_i$ with $P^\top$
#   in registers as its operand, then waits for $dP^\top$ and makes $dS^\top$ while $dV$ runs: the operand of a
#   product in flight stays live, beside $P^\top$ in fp32, $dP^\top$ and $dS^\top$. FlashAttention-3's backward
#   (`hopper/mainloop_bwd_sm90_tma_gmma_ws.hpp`) waits for both $S$ and $dP$ (`warpgroup_wait<0>`), writes
#   $dS = P \circ (dP - D)$ over $dP$'s registers, and only then converts $P$ and issues $dV$: it gives up running
#   the $dS$ arithmetic beside the $dV$ product and holds fewer tiles at once. 92 -> 72 B with both.
#
# Each variant against the same tiles without a switch ("plain") in the same run, at every N of the grid, D = 128
# causal in full (`short/`: N 1024 and 2048); then the kernel as step 06 runs it at N 1024 and 2048 against step
# 06's two kernels, and where step 06 stands:

# %%
# bench/experiments/gluon_bwd_ws.py --round 3: "lm" is LOCAL_MASK, "lm ds" both switches
r3 = [load("gluon_bwd_ws_1204_r3/short/gluon_bwd_ws"), load("gluon_bwd_ws_1204_r3/gluon_bwd_ws")]
r3_rows = sorted((r for run in r3 for r in run["timing_rows"]), key=lambda r: int(r["shape"].split(" N")[1].split()[0]))
print(f"round 3, one H200, {r3[1]['meta']['date_utc']} (N 1024, 2048: {r3[0]['meta']['date_utc']}): backward alone, "
      "ms, do_bench median; x = plain's time / the variant's (> 1: faster)")
print(f"{'D = 128, causal':28s}{'plain':>8s}{'lm':>8s}{'lm ds':>8s}{'x lm':>7s}{'x lm ds':>9s}{'cuDNN':>8s}")
x_rest, same_code = {"lm": [], "lm ds": []}, []
for r in r3_rows:
    v, ms = SHIPPED[head_dim(r["shape"])], r["ms"]
    x = {s: ms[v] / ms[f"{v} {s}"] for s in ("lm", "lm ds")}
    if r["shape"].endswith(" D128 causal"):
        print(f"  {r['shape'].replace('grid ', ''):26s}{ms[v]:8.3f}{ms[v + ' lm']:8.3f}{ms[v + ' lm ds']:8.3f}"
              f"{x['lm']:7.2f}{x['lm ds']:9.2f}{ms['cudnn']:8.3f}")
        continue
    for s in x:
        x_rest[s].append(x[s])
    if r["shape"].endswith(" full"):       # no mask: LOCAL_MASK has nothing to change, lm is plain's code
        same_code.append(x["lm"])
print(f"elsewhere (D = 64, or no mask; {len(x_rest['lm'])} shapes): " + ", ".join(
    f"x {s} {min(x_rest[s]):.2f}-{max(x_rest[s]):.2f}" for s in x_rest))
print(f"  without a mask, where lm compiles to plain's code: x lm {min(same_code):.2f}-{max(same_code):.2f}")

SWITCHED = {(128, True): " lm ds"}                                  # BWD_SWITCHES: the switches step 06 sets
print(f"\nN 1024 and 2048 ({r3[0]['meta']['date_utc']}), the kernel as step 06 runs it there:")
for r in r3[0]["timing_rows"]:
    D = head_dim(r["shape"])
    v = SHIPPED[D] + SWITCHED.get((D, r["shape"].endswith(" causal")), "")
    print(f"  {r['shape'].replace('grid ', ''):30s} x{r['vs_step06'][v]:.2f} step 06's two kernels, "
          f"{r['vs_cudnn'][v]:.2f}x cuDNN")

cgrid = json.loads((RESULTS / "grid" / "results.json").read_text())   # the course grid of section 6
ckey = lambda r: (r["mode"], r["B"], r["H"], r["N"], r["D"], r["causal"])   # noqa: E731
c_ms = {ckey(r): r["ms"] for r in cgrid if r["impl"] == "sdpa-cudnn" and r["status"] == "ok"}
s06 = [r for r in cgrid if r["impl"] == "step06" and r["mode"] == "fwd+bwd" and r["N"] >= 1024 and r["status"] == "ok"]
print(f"\nthe course grid ({s06[0]['machine']['date']}): step 06 fwd+bwd, cuDNN's time / ours in one run")
for D in (64, 128):
    for causal in (False, True):
        x = {r["N"]: c_ms[ckey(r)] / r["ms"] for r in s06 if (r["D"], r["causal"]) == (D, causal)}
        print(f"  D={D:3d} {'causal' if causal else 'no mask':8s}" + "".join(f"  N={n}: {x[n]:.2f}" for n in sorted(x)))
cells = [c_ms[ckey(r)] / r["ms"] for r in s06 if r["N"] >= 4096]
print(f"  from N = 4096 (issue 17's cells): {sum(x >= 0.90 for x in cells)} of {len(cells)} at 0.90 or more")

print("\nCS336's harness at the leaderboard shape (make gpu-check), fwd+bwd ms:")
for tag in ("_686a4fb", "_ca58451", ""):
    gc = json.loads((RESULTS / "gpu-check" / f"summary{tag}.json").read_text())
    lbm, h = gc["leaderboard_ms"], gc["leaderboard_ms"]["cs336_harness"]
    print(f"  {lbm['commit'][:7]}, {lbm['date']}: step 06 {h['step06']:.3f}, cuDNN {h['sdpa_cudnn']:.3f}, "
          f"SDPA-FLASH {h['sdpa_flash']:.3f}")

# %% [markdown]
# Both switches paid at D = 128 under a causal mask at every N, 1.06-1.12x plain; `LOCAL_MASK` alone did at N
# 1024-8192 and not at 16384. Elsewhere the variants read 0.91-1.03x, and that is the run's noise, not theirs:
# without a mask `LOCAL_MASK` compiles to plain's code and still read as low as 0.91x. So step 06 sets the switches
# where they measured (`BWD_SWITCHES`: D = 128, causal) and nowhere else. At N = 4096 the backward alone went from
# 0.86x cuDNN's to 0.96x.
#
# Step 06's solution runs this kernel on Hopper from N = 1024 wherever its table chooses (no `config` or
# `dq_mode` asked for; `BWD_TILES`, `BWD_SWITCHES`, `BWD_MIN_LEN`, the hook `hopper_bwd`; `ATTN_GLUON_DKDV=0` turns
# it off); your step 06 keeps your kernels. At N 1024 and 2048 it ran 1.05-1.27x step 06's two kernels, in the run
# above and in `gluon_bwd_ws_1204_short/` three hours before; in the grid of section 6 it takes step 06's forward +
# backward at N = 2048 from 0.76-0.84x cuDNN to 0.89-0.93x. At N = 1024 a causal call sits near the host's floor
# (section 10): 1.085 ms with this kernel, 1.087 with the two kernels (D = 64, `grid_1204b/`).
#
# Issue 17 asked for forward + backward at 0.90x cuDNN or better on the grid from N = 4096. The course grid is one run;
# timed as pairs, ours then cuDNN's, the ratio taken within each pair (`results/h200/issue17_targets_1204b/`, three
# rounds after round 3, medians; the five rounds of the day before in `results/h200/issue17_targets/`):
#
# | fwd+bwd / cuDNN | N 4096 | N 8192 | N 16384 |
# | --- | --- | --- | --- |
# | D = 64, no mask | 0.885 -> **1.031** | 0.923 -> **1.058** | 0.926 -> **1.055** |
# | D = 64, causal | 0.843 -> **0.946** | 0.885 -> **0.965** | 0.893 -> **0.991** |
# | D = 128, no mask | 0.805 -> **0.985** | 0.843 -> **0.974** | 0.851 -> **0.988** |
# | D = 128, causal | 0.819 -> **0.927** | 0.862 -> **0.977** | 0.859 -> **0.996** |
#
# Met in 12 of 12 cells, in every round, where 2 of 12 were the day before and 11 of 12 with run 5's kernel before
# round 3 (`issue17_targets_1204/`, two rounds). The cell that was left, D = 128 causal N = 4096, moved 0.874 ->
# 0.927, and round 3's switches are the only code that changed there; D = 128 causal N = 8192 and 16384 moved 0.911 ->
# 0.977 and 0.923 -> 0.996. (The forward's own target, 0.95x, stood at 9 of 12 in those rounds: not under a causal
# mask at N = 4096, 0.83x and 0.90x, and D = 64 causal N = 8192 at 0.935x. With the heads in groups, above, three
# rounds later the same day, `results/h200/issue17_targets_1204c/`: **12 of 12 at the median**, causal N = 4096 at
# 1.002x and 0.993x, D = 64 causal N = 8192 at 1.063x; forward + backward 12 of 12 in every round, the causal N = 4096
# cells at 0.99x and 0.98x; at the code the last complete `make gpu-check` passed, 7605e06,
# four rounds in `results/h200/issue17_targets_1204d/` read the same: the forward 12 of 12 at the median, forward +
# backward 12 of 12 in every round.) At the leaderboard shape, D = 64, where round 3 changes nothing, CS336's harness reads
# 4.48 ms for step 06 against cuDNN's 4.54, as in the first gpu-check with this kernel (ca58451): under the 5.0 ms
# this section chased, and faster than cuDNN. Fewer products, as the power-limit measurement said, not only faster ones.

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
# 1. dK and dV are computed by key tile; dQ by a second pass over query tiles. Why not add each key
#    tile's share of dQ in the first pass, and what would that need?
# 2. $D = \mathrm{rowsum}(dO \circ O)$ is accumulated in fp32 even for fp16 inputs. Give two reasons.
