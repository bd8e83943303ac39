"""Step 06 -- FlashAttention-2's backward pass as Triton kernels.

The forward (step 05) kept only O and the log-sum-exp L. The backward
recomputes the probabilities tile by tile from them, never storing P:

    P  = exp(S - L)          S = Q K^T * scale, recomputed
    dV = P^T dO              dP = dO V^T
    dS = P * (dP - D)        D = rowsum(dO * O)    (= rowsum(P * dP), cheaper)
    dQ = scale * dS K        dK = scale * dS^T Q

Three launches (two in the fused mode below):

1. ``_bwd_preprocess``: D for every query row, one pass over O and dO.
2. ``_bwd_dkdv_kernel``: one program per key tile (``_dkdv_tile``). It holds K_j
   and V_j on chip, loops over the query tiles that see them, and accumulates
   dK_j and dV_j in fp32 registers: they are finished when the loop ends, written
   once, no race.
3. dQ needs a sum over key tiles, but each key tile belongs to another program.
   Three ways, all here (``dq_mode``):
   * ``"separate"`` (default): ``_bwd_dq_kernel``, one program per query tile
     (``_dq_tile``), loops over key tiles like the forward. Recomputes S and dP a
     second time: 7 tile matrix products per (query tile, key tile) pair instead
     of 5, about 40% more arithmetic, but every dQ element is written once, by one
     program: deterministic, no atomics.
   * ``"fused"``: the same work as "separate" (the same 7 products per pair, the
     same deterministic writes), in one launch instead of two:
     ``_bwd_fused_kernel``'s program j does dK/dV of key tile j, then dQ of query
     tile j (as the Triton tutorial 06-fused-attention's ``_attn_bwd``). Causal,
     key tile j's work grows with N - j and query tile j's with j, so every
     program does about the same total: no short programs at the end of the
     launch, and no second launch that waits for the first to drain. Its cost:
     one num_warps / num_stages for both phases (the separate kernels tune them
     apart).
   * ``"atomic"``: ``_bwd_dkdv_kernel`` also computes ``dS K_j`` for each query
     tile and adds it into an fp32 dQ buffer with ``tl.atomic_add``. No
     recomputation, but (a) programs of the same head add into the same rows at
     the same time and wait on each other in L2 (contention), (b) fp32 addition
     in whatever order the programs arrive is not associative: the result can
     differ in the last bits from run to run (not deterministic), (c) an extra
     fp32 buffer and a conversion at the end. FlashAttention-2's CUDA code does
     this. Which is faster depends on the shape: ``bwd_config`` picks per shape
     from H200 measurements (results/h200/).
   * ``"atomic_tma"``: "atomic" with each share added as one tile by Hopper's TMA
     unit (``desc.atomic_add`` on a tensor descriptor of the fp32 buffer, which
     Triton lowers to ``cp.reduce.async.bulk.tensor``: the reduction happens in
     L2, the program's threads issue one instruction instead of an atomic per
     element). FlashAttention-3's way. sm_90+ only (Triton's interpreter lacks it:
     a ValueError on a CPU). The table's choice at D=128, causal, Nk >= 4096, where
     it ran 1.02-1.11x the second pass on the H200; not at the CS336 shape (D=64:
     3.91 ms against 3.76, bench/experiments/triton_tma_dq.py). Not deterministic:
     under ``torch.use_deterministic_algorithms(True)`` the table's choice becomes
     the second pass.

Causal: as in the forward, query tiles that see none of a key tile are skipped
(they come before the diagonal), tiles crossing the diagonal and the last
partial tiles are masked, all others run with no mask at all.

Coverage as step 05: any Nq, Nk, head dims 1..256, fp32 / fp16 / bf16, any
strides (dO too; one whose head dim is not contiguous, like the expanded dO of
``o.sum().backward()``, is copied once). ``FlashAttentionTriton`` is the complete
autograd Function (``apply(q, k, v, is_causal)``, as CS336 calls it): step 05's
forward kernel, these backward kernels, both as PyTorch operators (``fwd_op``,
``bwd_op``) so that a model calling them compiles with ``torch.compile(fullgraph=True)``.

Measured on an H200 (results/h200/grid/, 2026-11-30): forward + backward 1.23-1.42x
PyTorch's FlashAttention-2 backend over FlashAttention's bf16 grid for N >= 2048, below
cuDNN's backend. The CS336 leaderboard shape (B=1, H=16, N=16k, D=64, causal) took
5.29 ms in the course's harness (SDPA-FLASH 7.02, cuDNN 4.42, same run;
results/h200/leaderboard/) and 5.37 in CS336's own (results/h200/gpu-check/). It took
5.60 ms until the dK/dV kernel, then about 3 of the 4.3 ms backward at about 360 TFLOP/s,
got two changes (results/h200/triton/README.md): dP issued before the exponentials
(below, in ``_dkdv_inner``) and a 128-register cap so that two programs share an SM
(``bwd_config``): 2.50 ms. Then (results/h200/triton/lb_5ms_*.json) every head's heavy
tiles started first in all three kernels (``HEADS_FIRST``) and four 4-warp programs an SM
for dK/dV: 5.33 -> 5.06 and 5.34 -> 5.14 ms in CS336's harness on two H200s, 5.08 and 5.18
in two ``make gpu-check`` runs. The one-launch backward
(``dq_mode="fused"``) was 9% slower than the two kernels there (best tiles 4.66 ms
against 4.29, before those changes). TMA: step 05's forward takes its TMA kernel by default
at D=128 for N >= 2048 (``tma_by_default``), and dQ's reduce-add is TMA's at D=128 causal
(``"atomic_tma"``); together 1.04-1.10x forward + backward at D=128 causal N >= 4096
(results/h200/grid_1202/). Not done here: warp specialization (what cuDNN and
FlashAttention-3 use on Hopper); TMA alone did not speed up the D=64 forward
(results/h200/triton/fwd_tma.json).

On Hopper the course's solution hands dK/dV to a Gluon kernel where it applies (D 64 or 128,
16-bit, self-attention, N a multiple of 128 and, without a causal mask, at least 4096, dq_mode
"separate"; ``hopper_dkdv``): its four
products are issued asynchronously and waited for one at a time, so dP^T and dV run under the
exponentials (notebook 06 §11; 1.05x this dK/dV kernel at the leaderboard shape, CS336's harness
5.17 -> 5.06 and 5.08 -> 4.96 ms on two H200s; at D=128 the backward 1.01-1.10x, so there it is
preferred to the table's "atomic_tma", ``hopper_dkdv_takes``). ``ATTN_GLUON_DKDV=0`` turns it
off. Your step 06 runs the Triton kernel you write, on every GPU.
"""

import warnings

import torch
import triton
import triton.language as tl
from torch.library import wrap_triton

from attnlib import check_inputs
from attnlib.ops import configured, direct_launches, eager_fast, kernel_op, op_namespace, raise_if_stubbed, tiles

from .step05_triton_fwd import LOG2E, _dot_precision, _pow2_dim, as_bhnd, load_tile
from .step05_triton_fwd import forward as triton_forward
from .step05_triton_fwd import hopper_fwd_takes

LOG2E_C: tl.constexpr = tl.constexpr(LOG2E)


def hopper_dkdv(q4, k4, v4, do4, lse, delta, dk4, dv4, is_causal, scale, dq_mode) -> bool:
    """Where ``backward`` may hand dK/dV to another kernel: here none (False), so your Triton kernel runs on every
    GPU. The course's solution puts a Gluon kernel for Hopper here: notebook 06 §11 shows how it keeps its matrix
    products in flight under the exponentials and what that gains in CS336's harness."""
    return False


def hopper_dkdv_takes(q4, k4, v4, do4, is_causal) -> bool:
    """Whether ``hopper_dkdv`` would take these inputs with dq_mode "separate" (``backward`` then prefers that mode
    to its table's "atomic_tma"): here never."""
    return False


from .gluon_dkdv import launch_if_covered as hopper_dkdv  # noqa: E402,F811  # SOLUTION-ONLY
from .gluon_dkdv import takes as hopper_dkdv_takes  # noqa: E402,F811  # SOLUTION-ONLY


def hopper_dq(q4, k4, v4, do4, lse, delta, dq4, is_causal, scale) -> bool:
    """Where ``backward`` may hand its dQ pass (dq_mode "separate") to another kernel: here none (False), so your
    Triton dQ kernel runs on every GPU. The course's solution puts a Gluon dQ kernel for Hopper at D=128 here."""
    return False


from .gluon_dkdv import launch_dq_if_covered as hopper_dq  # noqa: E402,F811  # SOLUTION-ONLY


def hopper_bwd(q4, k4, v4, do4, lse, delta, dq4, dk4, dv4, is_causal, scale) -> bool:
    """Where ``backward`` may hand the whole of dQ, dK and dV to one kernel (its table's choice, no ``config`` or
    ``dq_mode`` asked for): here none (False), so your two Triton kernels run on every GPU. The course's solution
    puts a Gluon kernel for Hopper here, FlashAttention-3's shape: five products a tile where your two kernels
    compute seven, dQ added from the dK/dV loop by the TMA unit's bulk reduce (notebook 06 §11)."""
    return False


from .gluon_dkdv import launch_bwd_if_covered as hopper_bwd  # noqa: E402,F811  # SOLUTION-ONLY


# %% 1. D = rowsum(dO * O) -------------------------------------------------------

@triton.jit
def _bwd_preprocess(O, DO, DELTA,                       # O, dO (B, H, Nq, D); DELTA (B*H, Nq) fp32
                    stride_ob, stride_oh, stride_om, stride_od,
                    stride_dob, stride_doh, stride_dom, stride_dod,
                    H, N_Q,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    O += b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
    DO += b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
    DELTA += bh.to(tl.int64) * N_Q
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    o = load_tile(O, offs_m, offs_d, stride_om, stride_od, N_Q, HEAD_DIM, True, BLOCK_D != HEAD_DIM)
    do = load_tile(DO, offs_m, offs_d, stride_dom, stride_dod, N_Q, HEAD_DIM, True, BLOCK_D != HEAD_DIM)
    # >>> STUDENT: D = rowsum(o * do) computed in fp32 (convert both first); store it at DELTA + offs_m for rows < N_Q
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + offs_m, delta, mask=offs_m < N_Q)
    # <<< STUDENT


# %% 2. dK, dV (and dQ by atomics) -------------------------------------------------

@triton.jit
def _dkdv_inner(dk, dv, k, v,                            # fp32 accumulators (BLOCK_N, BLOCK_D); the K, V tiles
                Q, DO, LSE, DELTA, DQ,                   # this (batch, head)'s pointers; DQ: fp32 buffer (atomic)
                stride_qm, stride_qd, stride_dom, stride_dod, stride_dqm, stride_dqd,
                offs_n, offs_d,                          # key rows of this program, head-dim indices
                lo, hi, N_Q, N_K, qk_scale,              # query range [lo, hi) of this stage
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, PAD_D: tl.constexpr,
                MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, ATOMIC_DQ: tl.constexpr,
                DOT_PRECISION: tl.constexpr, EARLY_DP: tl.constexpr = True,
                TMA_DQ: tl.constexpr = False, bh=0):     # DQ a (B*H, Nq, BLOCK_D) fp32 descriptor; bh: its head
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = load_tile(Q, offs_m, offs_d, stride_qm, stride_qd, N_Q, HEAD_DIM, MASKED, PAD_D)
        do = load_tile(DO, offs_m, offs_d, stride_dom, stride_dod, N_Q, HEAD_DIM, MASKED, PAD_D)
        if MASKED:
            lse2 = tl.load(LSE + offs_m, mask=offs_m < N_Q, other=0.0) * LOG2E_C
            delta = tl.load(DELTA + offs_m, mask=offs_m < N_Q, other=0.0)
        else:
            lse2 = tl.load(LSE + offs_m) * LOG2E_C
            delta = tl.load(DELTA + offs_m)
        # dpT does not need P: issued here, its product runs on the tensor cores while the
        # exponentials below run on the SFU. Written after dv (its place in the math), the
        # compiler waits for dv and dpT together there, with nothing left to overlap. H200,
        # leaderboard shape, one program per SM: 2.62 -> 2.44 and 2.64 -> 2.49 ms in two runs;
        # D=128 grid: full attention 2-5% faster fwd+bwd, causal within 3%. With two programs
        # per SM (the causal D <= 64 table below) the other program already hides the wait:
        # 2.43 with it, 2.38 without (results/h200/triton/dkdv_variants_*.json, this
        # kernel's copy in bench/experiments/). In step 06 itself, with several programs an SM
        # and heavy tiles first, it no longer matters: 3.812 vs 3.831 ms backward at 32x128,
        # 3.790 vs 3.775 at 32x64 (results/h200/triton/lb_5ms_*.json); the table leaves it off
        # there (EARLY_DP=False), the plain order of the math.
        # >>> STUDENT: recompute P transposed, (BLOCK_N, BLOCK_M): sT = k @ q^T * qk_scale, and if EARLY_DP issue dpT = v @ do^T right after it (see the note above); pT = exp2(sT - lse2[None, :]); in a MASKED stage set pT to 0 where the query is >= N_Q or, if IS_CAUSAL, where key > query
        sT = tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * qk_scale
        if EARLY_DP:
            dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        pT = tl.math.exp2(sT - lse2[None, :])
        if MASKED:
            visible = offs_m[None, :] < N_Q
            if IS_CAUSAL:
                visible = visible & (offs_n[:, None] <= offs_m[None, :])
            pT = tl.where(visible, pT, 0.0)
        # <<< STUDENT
        if ATOMIC_DQ:
            # Keys past N_K were loaded as 0; drop them so no inf * 0 reaches dQ.
            pT = tl.where(offs_n[:, None] < N_K, pT, 0.0)
        # >>> STUDENT: dv += pT @ do (pT cast to do's dtype); if not EARLY_DP, dpT = v @ do^T now; dsT = pT * (dpT - delta[None, :]); dk += dsT @ q (dsT cast to q's dtype); the scale is applied once, after the loop
        dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=DOT_PRECISION)
        if not EARLY_DP:
            dpT = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        dsT = pT * (dpT - delta[None, :])
        dk = tl.dot(dsT.to(q.dtype), q, dk, input_precision=DOT_PRECISION)
        # <<< STUDENT
        if ATOMIC_DQ:
            # This key tile's share of dQ for these query rows (unscaled: the launcher scales it).
            dq = tl.dot(tl.trans(dsT.to(k.dtype)), k, input_precision=DOT_PRECISION)   # (BLOCK_M, BLOCK_D)
            if TMA_DQ:
                # One bulk reduce-add of the whole tile, done by the TMA unit in L2 (rows past Nq dropped).
                DQ.atomic_add([bh, start_m, 0], dq.reshape(1, BLOCK_M, dq.shape[1]))
            else:
                dq_ptrs = DQ + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd
                tl.atomic_add(dq_ptrs, dq, mask=(offs_m[:, None] < N_Q) & (offs_d[None, :] < HEAD_DIM),
                              sem="relaxed")
    return dk, dv


@triton.jit
def _dkdv_tile(Q, K, V, DO, LSE, DELTA, DK, DV, DQ,      # pointers to this (batch, head)'s matrices
               stride_qm, stride_qd, stride_kn, stride_kd, stride_vn, stride_vd,
               stride_dom, stride_dod, stride_dkn, stride_dkd, stride_dqm, stride_dqd,
               start_n, N_Q, N_K, scale, qk_scale,       # this tile's first key row
               HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
               IS_CAUSAL: tl.constexpr, ATOMIC_DQ: tl.constexpr, DOT_PRECISION: tl.constexpr,
               EARLY_DP: tl.constexpr = True, TMA_DQ: tl.constexpr = False, bh=0):
    """dK and dV of key rows [start_n, start_n + BLOCK_N): the loop over every query tile that sees them."""
    PAD_D: tl.constexpr = BLOCK_D != HEAD_DIM
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    # K_j and V_j: loaded once, on chip for the whole loop over query tiles.
    k = load_tile(K, offs_n, offs_d, stride_kn, stride_kd, N_K, HEAD_DIM, True, PAD_D)
    v = load_tile(V, offs_n, offs_d, stride_vn, stride_vd, N_K, HEAD_DIM, True, PAD_D)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)

    # >>> STUDENT: the query ranges: masked [lo, diag_end) (causal: lo = first query tile with a row >= start_n, diag_end = first tile start >= start_n + BLOCK_N - 1; not causal: both 0), unmasked [diag_end, q_full) with q_full = whole tiles below N_Q, masked tail [max(diag_end, q_full), N_Q)
    q_full = (N_Q // BLOCK_M) * BLOCK_M
    if IS_CAUSAL:
        lo = (start_n // BLOCK_M) * BLOCK_M
        diag_end = tl.minimum(tl.cdiv(start_n + BLOCK_N - 1, BLOCK_M) * BLOCK_M, N_Q)
    else:
        lo = 0
        diag_end = 0
    tail = tl.maximum(diag_end, q_full)
    # <<< STUDENT
    dk, dv = _dkdv_inner(dk, dv, k, v, Q, DO, LSE, DELTA, DQ,
                         stride_qm, stride_qd, stride_dom, stride_dod, stride_dqm, stride_dqd,
                         offs_n, offs_d, lo, diag_end, N_Q, N_K, qk_scale,
                         HEAD_DIM, BLOCK_M, PAD_D, True, IS_CAUSAL, ATOMIC_DQ, DOT_PRECISION, EARLY_DP, TMA_DQ, bh)
    dk, dv = _dkdv_inner(dk, dv, k, v, Q, DO, LSE, DELTA, DQ,
                         stride_qm, stride_qd, stride_dom, stride_dod, stride_dqm, stride_dqd,
                         offs_n, offs_d, diag_end, q_full, N_Q, N_K, qk_scale,
                         HEAD_DIM, BLOCK_M, PAD_D, False, IS_CAUSAL, ATOMIC_DQ, DOT_PRECISION, EARLY_DP, TMA_DQ, bh)
    dk, dv = _dkdv_inner(dk, dv, k, v, Q, DO, LSE, DELTA, DQ,
                         stride_qm, stride_qd, stride_dom, stride_dod, stride_dqm, stride_dqd,
                         offs_n, offs_d, tail, N_Q, N_Q, N_K, qk_scale,
                         HEAD_DIM, BLOCK_M, PAD_D, True, IS_CAUSAL, ATOMIC_DQ, DOT_PRECISION, EARLY_DP, TMA_DQ, bh)
    dk_ptrs = DK + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd
    dv_ptrs = DV + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd
    in_range = (offs_n[:, None] < N_K) & (offs_d[None, :] < HEAD_DIM)
    tl.store(dk_ptrs, (dk * scale).to(DK.dtype.element_ty), mask=in_range)
    tl.store(dv_ptrs, dv.to(DV.dtype.element_ty), mask=in_range)


@triton.jit
def _bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, DQ,                  # LSE, DELTA: (B*H, Nq) fp32; DQ: fp32 buffer or unused
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,       # dK and dV share one layout (both made here)
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    H, N_Q, N_K, scale, qk_scale,                         # softmax scale, and scale * log2(e)
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,                                # query rows per loop step
    BLOCK_N: tl.constexpr,                                # key rows per program
    BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr, ATOMIC_DQ: tl.constexpr, DOT_PRECISION: tl.constexpr,
    EARLY_DP: tl.constexpr,                               # dP = V dO^T issued before the exponentials (_dkdv_inner)
    HEADS_FIRST: tl.constexpr,                            # grid (B*H, key tiles) instead of (key tiles, B*H)
    TMA_DQ: tl.constexpr = False,                         # DQ: a host descriptor of the fp32 buffer (dq_mode "atomic_tma")
):
    scale = tl.cast(scale, tl.float32)           # fp64 when Inductor relaunches the kernel: step 05 says why
    qk_scale = tl.cast(qk_scale, tl.float32)
    # Causal: key tile 0 is seen by the most queries. Programs start in grid order (axis 0
    # fastest): HEADS_FIRST starts every head's tile 0, then every head's tile 1, ...: the heavy
    # tiles of all heads first and the light ones last, where they fill the gaps at the end.
    if HEADS_FIRST:
        pid_n = tl.program_id(1)
        bh = tl.program_id(0)
    else:
        pid_n = tl.program_id(0)
        bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    Q += b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    K += b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
    V += b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh
    DO += b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
    DK += b.to(tl.int64) * stride_dkb + h.to(tl.int64) * stride_dkh
    DV += b.to(tl.int64) * stride_dkb + h.to(tl.int64) * stride_dkh
    if not TMA_DQ:
        DQ += b.to(tl.int64) * stride_dqb + h.to(tl.int64) * stride_dqh
    LSE += bh.to(tl.int64) * N_Q
    DELTA += bh.to(tl.int64) * N_Q
    _dkdv_tile(Q, K, V, DO, LSE, DELTA, DK, DV, DQ,
               stride_qm, stride_qd, stride_kn, stride_kd, stride_vn, stride_vd,
               stride_dom, stride_dod, stride_dkn, stride_dkd, stride_dqm, stride_dqd,
               pid_n * BLOCK_N, N_Q, N_K, scale, qk_scale,
               HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_D, IS_CAUSAL, ATOMIC_DQ, DOT_PRECISION, EARLY_DP, TMA_DQ, bh)


# %% 3. dQ, second pass --------------------------------------------------------------

@triton.jit
def _dq_inner(dq, q, do, lse2, delta,                    # fp32 accumulator (BLOCK_M, BLOCK_D); this tile's data
              K, V, stride_kn, stride_kd, stride_vn, stride_vd,
              offs_m, offs_d, lo, hi, N_K, qk_scale,
              HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, PAD_D: tl.constexpr,
              MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
              EARLY_DP: tl.constexpr = False):
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        # >>> STUDENT: load the K and V tiles as step 05's forward loop does
        k = load_tile(K, offs_n, offs_d, stride_kn, stride_kd, N_K, HEAD_DIM, MASKED, PAD_D)
        v = load_tile(V, offs_n, offs_d, stride_vn, stride_vd, N_K, HEAD_DIM, MASKED, PAD_D)
        # <<< STUDENT
        # >>> STUDENT: recompute p = exp2(q @ k^T * qk_scale - lse2[:, None]) (masked as in the forward: 0 where key >= N_K or, causal, key > query); dp = do @ v^T (if EARLY_DP issued before the exp2, as in _dkdv_inner); ds = p * (dp - delta[:, None]); dq += ds @ k (ds cast to k's dtype)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
        if EARLY_DP:
            dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        p = tl.math.exp2(s - lse2[:, None])
        if MASKED:
            visible = offs_n[None, :] < N_K
            if IS_CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None])
            p = tl.where(visible, p, 0.0)
        if not EARLY_DP:
            dp = tl.dot(do, tl.trans(v), input_precision=DOT_PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=DOT_PRECISION)
        # <<< STUDENT
    return dq


@triton.jit
def _dq_tile(Q, K, V, DO, LSE, DELTA, DQ,                 # pointers to this (batch, head)'s matrices
             stride_qm, stride_qd, stride_kn, stride_kd, stride_vn, stride_vd,
             stride_dom, stride_dod, stride_dqm, stride_dqd,
             start_m, N_Q, N_K, scale, qk_scale,         # this tile's first query row
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
             IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, EARLY_DP: tl.constexpr = False):
    """dQ of query rows [start_m, start_m + BLOCK_M): the loop over the key tiles they see."""
    PAD_D: tl.constexpr = BLOCK_D != HEAD_DIM
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_tile(Q, offs_m, offs_d, stride_qm, stride_qd, N_Q, HEAD_DIM, True, PAD_D)
    do = load_tile(DO, offs_m, offs_d, stride_dom, stride_dod, N_Q, HEAD_DIM, True, PAD_D)
    lse2 = tl.load(LSE + offs_m, mask=offs_m < N_Q, other=0.0) * LOG2E_C
    delta = tl.load(DELTA + offs_m, mask=offs_m < N_Q, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    # >>> STUDENT: the key ranges [0, hi_full) unmasked and [hi_full, hi) masked, the same split as step 05's forward kernel
    if IS_CAUSAL:
        hi_full = (tl.minimum(start_m, N_K) // BLOCK_N) * BLOCK_N
        hi = tl.minimum(start_m + BLOCK_M, N_K)
    else:
        hi_full = (N_K // BLOCK_N) * BLOCK_N
        hi = N_K
    # <<< STUDENT
    dq = _dq_inner(dq, q, do, lse2, delta, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                   offs_m, offs_d, 0, hi_full, N_K, qk_scale,
                   HEAD_DIM, BLOCK_N, PAD_D, False, IS_CAUSAL, DOT_PRECISION, EARLY_DP)
    dq = _dq_inner(dq, q, do, lse2, delta, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                   offs_m, offs_d, hi_full, hi, N_K, qk_scale,
                   HEAD_DIM, BLOCK_N, PAD_D, True, IS_CAUSAL, DOT_PRECISION, EARLY_DP)
    dq_ptrs = DQ + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd
    tl.store(dq_ptrs, (dq * scale).to(DQ.dtype.element_ty),
             mask=(offs_m[:, None] < N_Q) & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def _bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    H, N_Q, N_K, scale, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
    EARLY_DP: tl.constexpr, HEADS_FIRST: tl.constexpr,     # as in _bwd_dkdv_kernel
):
    scale = tl.cast(scale, tl.float32)           # fp64 when Inductor relaunches the kernel: step 05 says why
    qk_scale = tl.cast(qk_scale, tl.float32)
    if HEADS_FIRST:
        pid_m = tl.program_id(1)
        bh = tl.program_id(0)
        n_tiles = tl.num_programs(1)
    else:
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        n_tiles = tl.num_programs(0)
    if IS_CAUSAL:
        pid_m = n_tiles - 1 - pid_m          # heaviest query tiles first, as in the forward
    b = bh // H
    h = bh % H
    Q += b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    K += b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
    V += b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh
    DO += b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
    DQ += b.to(tl.int64) * stride_dqb + h.to(tl.int64) * stride_dqh
    LSE += bh.to(tl.int64) * N_Q
    DELTA += bh.to(tl.int64) * N_Q
    _dq_tile(Q, K, V, DO, LSE, DELTA, DQ,
             stride_qm, stride_qd, stride_kn, stride_kd, stride_vn, stride_vd,
             stride_dom, stride_dod, stride_dqm, stride_dqd,
             pid_m * BLOCK_M, N_Q, N_K, scale, qk_scale,
             HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_D, IS_CAUSAL, DOT_PRECISION, EARLY_DP)


# %% 4. dK, dV and dQ in one launch -------------------------------------------------

@triton.jit
def _bwd_fused_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, DQ,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    H, N_Q, N_K, scale, qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M1: tl.constexpr, BLOCK_N1: tl.constexpr,       # dK/dV phase: query rows per step, key rows per program
    BLOCK_M2: tl.constexpr, BLOCK_N2: tl.constexpr,       # dQ phase: query rows per program, key rows per step
    BLOCK_D: tl.constexpr, IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Program ``pid``: dK, dV of key tile ``pid``, then dQ of query tile ``pid``.

    Causal, square: key tile j sees the queries after it (work ~ N - j), query tile j
    the keys before it (work ~ j): every program does about the same total when
    BLOCK_N1 == BLOCK_M2. The grid covers the longer of the two tile counts; a phase
    whose tile lies past its sequence is skipped.
    """
    scale = tl.cast(scale, tl.float32)           # fp64 when Inductor relaunches the kernel: step 05 says why
    qk_scale = tl.cast(qk_scale, tl.float32)
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    Q += b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    K += b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
    V += b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh
    DO += b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
    DK += b.to(tl.int64) * stride_dkb + h.to(tl.int64) * stride_dkh
    DV += b.to(tl.int64) * stride_dkb + h.to(tl.int64) * stride_dkh
    DQ += b.to(tl.int64) * stride_dqb + h.to(tl.int64) * stride_dqh
    LSE += bh.to(tl.int64) * N_Q
    DELTA += bh.to(tl.int64) * N_Q
    if pid * BLOCK_N1 < N_K:
        _dkdv_tile(Q, K, V, DO, LSE, DELTA, DK, DV, DQ,
                   stride_qm, stride_qd, stride_kn, stride_kd, stride_vn, stride_vd,
                   stride_dom, stride_dod, stride_dkn, stride_dkd, stride_dqm, stride_dqd,
                   pid * BLOCK_N1, N_Q, N_K, scale, qk_scale,
                   HEAD_DIM, BLOCK_M1, BLOCK_N1, BLOCK_D, IS_CAUSAL, False, DOT_PRECISION)
    if pid * BLOCK_M2 < N_Q:
        _dq_tile(Q, K, V, DO, LSE, DELTA, DQ,
                 stride_qm, stride_qd, stride_kn, stride_kd, stride_vn, stride_vd,
                 stride_dom, stride_dod, stride_dqm, stride_dqd,
                 pid * BLOCK_M2, N_Q, N_K, scale, qk_scale,
                 HEAD_DIM, BLOCK_M2, BLOCK_N2, BLOCK_D, IS_CAUSAL, DOT_PRECISION)


# %% Tile sizes --------------------------------------------------------------------
#
# Picked on an H200 by `bench/triton_gpu.py --tune` and `--sweep-leaderboard`
# (results/h200/): see step 05 for why a table. What the sweep showed:
#   * dK/dV: the program holds K_j, V_j and two fp32 accumulators of BLOCK_N x D;
#     128 keys x 64 dims over 4 warps is already 128 registers a thread, so the
#     query step is small (32 rows) or the warps double (D=128: 64 x 128 on 8 warps).
#   * dQ: the forward's shape (a query tile, key tiles streaming) with a third
#     matrix product; 128 x 64 on 8 warps at D=64, 64 x 32 on 4 warps at D=128.
#   * The table is flat near the top: on the leaderboard shape eight dK/dV and six
#     dQ candidates lie within 3% of the best, so there are no per-length entries.
#   * dq_mode: "atomic" was at most 3% faster (D=128, causal, N >= 8k) and up to 17%
#     slower (short sequences): every key tile adds a BLOCK_M x D fp32 tile into dQ
#     through L2, gigabytes of atomic traffic at N=16k. The deterministic second
#     pass is the default, except at D=128 causal Nk >= 4096, where the same adds done
#     by TMA ("atomic_tma") ran 1.02x (N=4096) and 1.11x (N=16384) the second pass
#     (results/h200/triton/tma_dq_1201_2346.json).
#   * "fused" (one launch for both): measured on the leaderboard shape only (ten tile
#     sets, results/h200/triton/lb_variants.json): 4.66-5.50 ms for the backward against
#     4.29 for the separate kernels. Its tiles are the dK/dV kernel's (BLOCK_M1 x BLOCK_N1)
#     and the dQ kernel's (BLOCK_M2 x BLOCK_N2), on one num_warps / num_stages for both
#     phases, which is what costs it: each phase wants its own. For D > 64 the entries
#     are the separate kernels' tiles on the larger warp count (not measured).

SWITCHES = ("EARLY_DP", "HEADS_FIRST")      # keys of bwd_config's entries that only step 06's two kernels take


def tiles_only(cfg):
    """``bwd_config``'s table without ``SWITCHES``: for other kernels that reuse its tiles (steps 08, 09)."""
    return {key: {k: v for k, v in val.items() if k not in SWITCHES} if isinstance(val, dict) else val
            for key, val in cfg.items()}


def fused_config(dkdv, dq):
    """The fused kernel's tiles from the two kernels' ones: dK/dV's tiles, dQ's tiles, dK/dV's warps and stages."""
    return dict(BLOCK_M1=dkdv["BLOCK_M"], BLOCK_N1=dkdv["BLOCK_N"], BLOCK_M2=dq["BLOCK_M"], BLOCK_N2=dq["BLOCK_N"],
                num_warps=dkdv["num_warps"], num_stages=dkdv["num_stages"])


def bwd_config(nq, nk, d, dtype, is_causal, device_type, bh=1):
    """Tiles and launch options: dict(dkdv=..., dq=..., fused=..., pre=..., dq_mode=...)."""
    bd = _pow2_dim(d)
    if device_type != "cuda":
        small = dict(BLOCK_M=32, BLOCK_N=32, num_warps=4, num_stages=1)
        return dict(dkdv=small, dq=small, fused=fused_config(small, small), pre=dict(BLOCK_M=32),
                    dq_mode="separate")
    if dtype == torch.float32:
        # FMA dots, operands in registers: small tiles (see step 05's fwd_config).
        t = 32 if bd <= 32 else 16
        small = dict(BLOCK_M=t, BLOCK_N=t, num_warps=4 if bd <= 64 else 8, num_stages=2)
        return dict(dkdv=small, dq=small, fused=fused_config(small, small), pre=dict(BLOCK_M=64),
                    dq_mode="separate")
    if bd <= 64:
        if is_causal:
            # maxnreg (a launch option) caps registers per thread at 128 so that several programs
            # share an SM (65536 registers): uncapped this kernel takes 150-190 and runs alone. Two
            # 8-warp programs of 32x128 took the dK/dV kernel from 2.82 ms (64x128 w8 s4) to 2.50
            # (H200, results/h200/triton/dkdv_variants_0224.json). At the leaderboard shape, whole
            # backward (results/h200/triton/lb_5ms_*.json, two runs on two H200s): every head's
            # heavy key tiles first 3.95 -> 3.81 ms; the dQ kernel's too, 3.83 -> 3.75 and 3.91 ->
            # 3.82; four 4-warp programs of 32x64 instead of two of 32x128, 3.82 -> 3.78 (s3 and s4
            # within 0.2%), though under the cap ptxas spills 24 bytes a thread there (40 B reloaded;
            # `bench/experiments/triton_dkdv_variants.py --aot-check`); the early dP within 0.5%. Not measured at other causal
            # shapes than the leaderboard's; the grid's causal D=64 rows will use these tiles too.
            dkdv = dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=4, maxnreg=128,
                        EARLY_DP=False, HEADS_FIRST=True)
            dq = dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, HEADS_FIRST=True)
        else:
            dkdv = dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=4)
            dq = dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
        # The best fused tiles at the leaderboard shape (4.66 ms; the tutorial's 32x128 / 128x32
        # took 5.02): still 9% behind the separate kernels there.
        fused = dict(BLOCK_M1=64, BLOCK_N1=64, BLOCK_M2=64, BLOCK_N2=64, num_warps=4, num_stages=3)
    elif bd <= 128:
        dkdv = dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=2)
        dq = dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=3)
        fused = dict(BLOCK_M1=64, BLOCK_N1=128, BLOCK_M2=128, BLOCK_N2=32, num_warps=8, num_stages=2)
        if is_causal and nk >= 4096:
            # dQ by TMA reduce-add: the backward 1.02x (N=4096) and 1.11x (N=16384) the second pass
            # at these tiles, 0.95x at N=1024, 0.88-0.95x not causal (H200, bf16, FlashAttention's
            # grid; results/h200/triton/tma_dq_*). Not deterministic: ``backward`` takes the
            # second pass instead on a GPU without TMA or under torch.use_deterministic_algorithms.
            return dict(dkdv=dkdv, dq=dq, fused=fused, pre=dict(BLOCK_M=128), dq_mode="atomic_tma")
    else:   # D = 256: the accumulators alone fill the registers; 8 warps share them without spilling
        dkdv = dict(BLOCK_M=16, BLOCK_N=64, num_warps=8, num_stages=2)
        dq = dict(BLOCK_M=64, BLOCK_N=32, num_warps=8, num_stages=2)
        fused = fused_config(dkdv, dq)
    return dict(dkdv=dkdv, dq=dq, fused=fused, pre=dict(BLOCK_M=128), dq_mode="separate")


# %% Launchers -----------------------------------------------------------------------

DQ_MODES = ("separate", "atomic", "fused", "atomic_tma")


def tma_dq_unsupported(q):
    """Why ``dq_mode="atomic_tma"`` cannot run on ``q``'s device (a sentence), or None when it can.

    The bulk reduce-add is a Hopper instruction (``cp.reduce.async.bulk.tensor``): an sm_90+ GPU.
    Triton 3.6's interpreter has no reduce for descriptors, so a CPU cannot run it at all.
    """
    if q.device.type != "cuda":
        return (f"dq_mode='atomic_tma' adds dQ tiles with Hopper's TMA reduce: it needs a CUDA GPU, sm_90 or newer "
                f"(Triton's interpreter has no descriptor reduce), got a {q.device.type} tensor; use dq_mode='atomic'")
    major, minor = torch.cuda.get_device_capability(q.device)
    if major < 9:
        return (f"dq_mode='atomic_tma' needs an sm_90 or newer GPU (Hopper); {torch.cuda.get_device_name(q.device)} "
                f"is sm_{major}{minor}; use dq_mode='atomic'")
    return None


def _grid(tiles_, bh, heads_first):
    """The launch grid: (tiles, B*H), or (B*H, tiles) when every head's tile i starts before any tile i+1."""
    return (bh, tiles_) if heads_first else (tiles_, bh)


@direct_launches
def backward(q, k, v, o, lse, do, is_causal, scale, config=None, dq_mode=None):
    """``(dQ, dK, dV)`` from the saved forward tensors and the upstream gradient ``do``.

    ``config`` overrides ``bwd_config``: a dict with ``pre`` and, by ``dq_mode``,
    ``dkdv`` and ``dq`` (separate), ``dkdv`` (atomic) or ``fused`` (BLOCK_M1, BLOCK_N1,
    BLOCK_M2, BLOCK_N2, num_warps, num_stages; without it, ``fused_config(dkdv, dq)``).
    """
    raise_if_stubbed(_bwd_dkdv_kernel)
    table_choice = config is None and dq_mode is None       # what ``hopper_bwd`` may take over
    if do.stride(-1) != 1:
        # o.sum().backward() hands us an expanded dO with every stride 0 (CS336's harness does
        # exactly that). The kernels take any strides, but loads along a head dim that is not
        # contiguous cannot be vectorized: one copy costs far less than the slow loads.
        do = do.contiguous()
    q4, k4, v4, o4, do4 = (as_bhnd(t) for t in (q, k, v, o, do))
    B, H, nq, d = q4.shape
    nk = k4.shape[2]
    bd = _pow2_dim(d)
    cfg = config or bwd_config(nq, nk, d, q.dtype, is_causal, q.device.type, B * H)
    if dq_mode is None and cfg["dq_mode"] == "atomic_tma" and (
            torch.are_deterministic_algorithms_enabled() or tma_dq_unsupported(q)
            or hopper_dkdv_takes(q4, k4, v4, do4, is_causal)):
        # The table's choice (not asked for by name), where it cannot run, must not, or where a dK/dV kernel
        # for Hopper and a second dQ pass are faster (D=128 causal N >= 4096: 1.015-1.037x on an H200).
        dq_mode = "separate"
    dq_mode = dq_mode or cfg["dq_mode"]
    if dq_mode not in DQ_MODES:
        raise ValueError(f"dq_mode must be one of {DQ_MODES}, got {dq_mode!r}")
    if dq_mode in ("separate", "fused") and "dq" not in cfg and not cfg.get("fused"):
        # An atomic mode's config may hold the dK/dV tiles only (as the docstring allows); the switch above turns
        # it into a second dQ pass (deterministic mode, no TMA, the Hopper kernel), whose tiles are the table's.
        cfg = {**cfg, "dq": bwd_config(nq, nk, d, q.dtype, is_causal, q.device.type, B * H)["dq"]}
    if dq_mode in ("atomic", "atomic_tma") and torch.are_deterministic_algorithms_enabled():
        # As PyTorch's own nondeterministic ops do under torch.use_deterministic_algorithms(True).
        why = (f"step06 backward: dq_mode={dq_mode!r} adds dQ with atomics, in an order (and so to last bits) "
               f"that changes from run to run, and torch.use_deterministic_algorithms(True) is on: "
               f"pass dq_mode='separate' or 'fused', or None (the table's choice, then deterministic)")
        if not torch.is_deterministic_algorithms_warn_only_enabled():
            raise RuntimeError(why)
        warnings.warn(why, stacklevel=2)
    tma_dq = dq_mode == "atomic_tma"
    if tma_dq and tma_dq_unsupported(q):
        raise ValueError(f"step06 backward: {tma_dq_unsupported(q)}")
    prec = _dot_precision(q.dtype)
    lse = lse.reshape(B * H, nq).contiguous()     # the kernels index it as (B*H, nq), row stride nq: a row slice of a longer LSE (the ring passes lse[..., rows]) is a view with another stride
    delta = q.new_empty((B * H, nq), dtype=torch.float32)
    dk, dv = k.new_empty(k.shape), v.new_empty(v.shape)
    if dq_mode == "atomic":
        dq = q.new_zeros(q.shape, dtype=torch.float32)
    elif not tma_dq:
        dq = q.new_empty(q.shape)
    else:
        dq = None          # atomic_tma: the kernel adds into dq_acc (below) through a descriptor
    dk4, dv4 = as_bhnd(dk), as_bhnd(dv)
    dq4 = as_bhnd(dq) if dq is not None else q4       # atomic_tma: only dq4's strides are passed, and the kernel ignores them
    if tma_dq:
        # (B*H, Nq, BLOCK_D) fp32, zeroed: each key tile's program reduce-adds its (BLOCK_M, BLOCK_D)
        # share into it through a descriptor (box [1, BLOCK_M, BLOCK_D]: a tile never crosses a head).
        from triton.tools.tensor_descriptor import TensorDescriptor
        dq_acc = q.new_zeros((B * H, nq, bd), dtype=torch.float32)
        dq_desc = TensorDescriptor(dq_acc, list(dq_acc.shape), list(dq_acc.stride()),
                                   [1, cfg["dkdv"]["BLOCK_M"], bd])
    pre = configured(_bwd_preprocess, {})
    bm = cfg["pre"]["BLOCK_M"]
    wrap_triton(pre)[(triton.cdiv(nq, bm), B * H)](
        o4, do4, delta, *o4.stride(), *do4.stride(), H, nq,
        HEAD_DIM=d, BLOCK_M=bm, BLOCK_D=bd)
    if table_choice and dq_mode == "separate" and hopper_bwd(q4, k4, v4, do4, lse, delta, dq4, dk4, dv4, is_causal,
                                                             scale):
        return dq, dk, dv
    if dq_mode == "fused":
        # One program per key tile and query tile: as many as the longer of the two sequences needs.
        c = cfg.get("fused") or fused_config(cfg["dkdv"], cfg["dq"])
        grid = (max(triton.cdiv(nk, c["BLOCK_N1"]), triton.cdiv(nq, c["BLOCK_M2"])), B * H)
        fused = configured(_bwd_fused_kernel, c)
        wrap_triton(fused)[grid](
            q4, k4, v4, do4, lse, delta, dk4, dv4, dq4,
            *q4.stride(), *k4.stride(), *v4.stride(), *do4.stride(), *dk4.stride(), *dq4.stride(),
            H, nq, nk, scale, scale * LOG2E,
            HEAD_DIM=d, BLOCK_D=bd, IS_CAUSAL=is_causal, DOT_PRECISION=prec, **tiles(c))
    elif not hopper_dkdv(q4, k4, v4, do4, lse, delta, dk4, dv4, is_causal, scale, dq_mode):
        c = {"EARLY_DP": True, "HEADS_FIRST": False, **cfg["dkdv"]}
        dkdv = configured(_bwd_dkdv_kernel, c)
        wrap_triton(dkdv)[_grid(triton.cdiv(nk, c["BLOCK_N"]), B * H, c["HEADS_FIRST"])](
            q4, k4, v4, do4, lse, delta, dk4, dv4, dq_desc if tma_dq else dq4,
            *q4.stride(), *k4.stride(), *v4.stride(), *do4.stride(), *dk4.stride(), *dq4.stride(),
            H, nq, nk, scale, scale * LOG2E,
            HEAD_DIM=d, BLOCK_D=bd, IS_CAUSAL=is_causal, ATOMIC_DQ=dq_mode in ("atomic", "atomic_tma"),
            DOT_PRECISION=prec, TMA_DQ=tma_dq, **tiles(c))
    if dq_mode == "separate" and not hopper_dq(q4, k4, v4, do4, lse, delta, dq4, is_causal, scale):
        c = {"EARLY_DP": False, "HEADS_FIRST": False, **cfg["dq"]}
        dq_kernel = configured(_bwd_dq_kernel, c)
        wrap_triton(dq_kernel)[_grid(triton.cdiv(nq, c["BLOCK_M"]), B * H, c["HEADS_FIRST"])](
            q4, k4, v4, do4, lse, delta, dq4,
            *q4.stride(), *k4.stride(), *v4.stride(), *do4.stride(), *dq4.stride(),
            H, nq, nk, scale, scale * LOG2E,
            HEAD_DIM=d, BLOCK_D=bd, IS_CAUSAL=is_causal, DOT_PRECISION=prec, **tiles(c))
    # The atomic modes' fp32 sums, scaled and cast in one pass: torch.mul into a 16-bit out= computes in
    # fp32 and writes the cast result (on a GPU one kernel: 6 bytes an element, where (dq * scale).to(...)
    # reads and writes an fp32 copy first, 14).
    if dq_mode == "atomic":
        dq = torch.mul(dq, scale, out=q.new_empty(q.shape))
    if tma_dq:
        dq = q.new_empty(q.shape)
        torch.mul(dq_acc.view(B, H, nq, bd)[..., :d], scale, out=as_bhnd(dq))
    return dq, dk, dv


# %% The operators, autograd and the public API ----------------------------------------
#
# Two PyTorch operators (attnlib/ops.py says why torch.compile needs them):
#   torch.ops.<namespace>.step06_fwd(q, k, v, is_causal, scale) -> (O, LSE)   step 05's kernel, a triton_op
#   torch.ops.<namespace>.step06_bwd(q, k, v, o, lse, do, is_causal, scale, dq_mode) -> (dQ, dK, dV), opaque
# step06_fwd's autograd formula calls step06_bwd, so the operator trains by itself (inside a
# compiled model too); FlashAttentionTriton, the autograd.Function that students, tests and
# CS336's harness call, is a thin layer over the same two. (step06_fwd_opaque is step06_fwd
# registered opaque, for the inputs step 05 hands to another kernel: run_fwd picks it.)

def _fwd_fake(q, k, v, is_causal, scale):
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


def _fwd_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
              scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return triton_forward(q, k, v, is_causal, scale)


def _bwd_fake(q, k, v, o, lse, do, is_causal, scale, dq_mode):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _bwd_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
              do: torch.Tensor, is_causal: bool, scale: float,
              dq_mode: str | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return backward(q, k, v, o, lse, do, is_causal, scale, dq_mode=dq_mode)


NAMESPACE = op_namespace(__name__)
# Opaque: compiled graphs call `backward` above, which launches with bwd_config's `maxnreg`;
# Inductor's own relaunch drops it (attnlib/ops.py: 3.20 ms instead of 2.47 for dK/dV).
bwd_op = kernel_op(f"{NAMESPACE}::step06_bwd", _bwd_impl, fake=_bwd_fake, opaque=True)
run_bwd = eager_fast(bwd_op, _bwd_impl)      # the operator when compiled, its launchers in eager mode (attnlib/ops.py)


def _setup_context(ctx, inputs, output):
    q, k, v, is_causal, scale = inputs[:5]
    ctx.save_for_backward(q, k, v, *output)
    ctx.is_causal, ctx.scale = is_causal, scale
    ctx.dq_mode = inputs[5] if len(inputs) > 5 else None


def _backward(ctx, do, _dlse=None):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = run_bwd(q, k, v, o, lse, do, ctx.is_causal, ctx.scale, ctx.dq_mode)
    return dq, dk, dv, None, None


fwd_op = kernel_op(f"{NAMESPACE}::step06_fwd", _fwd_impl, fake=_fwd_fake,
                   backward=_backward, setup_context=_setup_context)
# Opaque, for inputs step 05's ``hopper_fwd`` takes (a kernel Inductor cannot see: step 05's run_fwd says why).
fwd_op_opaque = kernel_op(f"{NAMESPACE}::step06_fwd_opaque", _fwd_impl, fake=_fwd_fake,
                          backward=_backward, setup_context=_setup_context, opaque=True)
_RUN_FWD = {False: eager_fast(fwd_op, _fwd_impl), True: eager_fast(fwd_op_opaque, _fwd_impl)}


def run_fwd(q, k, v, is_causal, scale):
    """``fwd_op``, or ``fwd_op_opaque`` where step 05's ``hopper_fwd`` takes the inputs (chosen while Dynamo
    traces); the operator when compiled, its launcher in eager mode (attnlib/ops.py, ``eager_fast``)."""
    return _RUN_FWD[hopper_fwd_takes(q, k, v, is_causal)](q, k, v, is_causal, scale)


class FlashAttentionTriton(torch.autograd.Function):
    """Forward: step 05's kernel. Backward: the kernels above. Both as the operators above.

    ``apply(q, k, v, is_causal=False, scale=None, dq_mode=None)`` -> O; saves q, k, v, O and
    exactly one LSE tensor (float32, ``(..., Nq)``).
    """

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False, scale=None, dq_mode=None):
        scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale, where="step06 FlashAttentionTriton")
        # >>> STUDENT: o, lse = run_fwd(q, k, v, is_causal, scale) (step 05's kernel: the operator fwd_op when compiled, its launcher in eager mode); save q, k, v, o, lse for the backward (ctx.save_for_backward) and is_causal, scale, dq_mode on ctx; return o
        o, lse = run_fwd(q, k, v, is_causal, scale)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal, ctx.scale, ctx.dq_mode = is_causal, scale, dq_mode
        return o
        # <<< STUDENT

    @staticmethod
    def backward(ctx, do):
        return *_backward(ctx, do), None


def attention(q, k, v, is_causal=False, scale=None, dq_mode=None):
    """The course contract, forward and backward in Triton.

    ``dq_mode``: None (the tuned choice), "separate" (a second pass, deterministic),
    "atomic" (fp32 atomic adds) or "fused" (dK/dV and dQ in one launch, deterministic).
    """
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale, where="step06 attention")
    if dq_mode is not None and dq_mode not in DQ_MODES:
        raise ValueError(f"step06 attention: dq_mode must be one of {DQ_MODES} or None, got {dq_mode!r}")
    return FlashAttentionTriton.apply(q, k, v, is_causal, scale, dq_mode)


def attention_with_lse(q, k, v, is_causal=False, scale=None):
    """``(O, LSE)`` from step 05's forward kernel, with no autograd."""
    scale = check_inputs(q, k, v, is_causal=is_causal, scale=scale, where="step06 attention_with_lse")
    return triton_forward(q, k, v, is_causal, scale)
