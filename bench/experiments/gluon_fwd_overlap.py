"""Experiment: does Gluon (Triton's lower-level language) let the forward overlap the softmax with the tensor cores on Hopper, and does that pay against step 05 and cuDNN?

Question. Every Triton experiment on the forward ends at the same place: Triton 3.6 waits on each wgmma right
after issuing it, so a program's softmax runs while its tensor cores idle (``triton_fwd_overlap.py``,
``triton_fwd_pipelined.py``: no form of the loop written in Triton kept a product in flight and paid), and
ncu put step 05 at 56% tensor-busy cycles at D=128 against cuDNN's 75% (``results/h200/triton/ncu/``).
Triton's own persistent-matmul tutorial says of ``tl.range(..., warp_specialize=True)``: "This only works on
Blackwell right now. On older GPUs, this will use software pipelining." Triton 3.6 also ships Gluon
(``triton.experimental.gluon``), in which the kernel itself issues ``warpgroup_mma(..., is_async=True)`` and
says how many products may stay in flight (``warpgroup_mma_wait(num_outstanding=...)``), loads by TMA into
buffers it manages with mbarriers, and picks every layout. FlashAttention-3's intra-warpgroup order becomes
writable: issue S_j = Q K_j^T and O += P_{j-1} V_{j-1}, wait for S_j only, run the softmax of S_j while
P_{j-1} V_{j-1} is still on the tensor cores, then wait for it and rescale O. Does that order pay, against the
same Gluon kernel waiting on every product (``OVERLAP=False``: Triton's schedule, written by hand), against
step 05, and against cuDNN?

Method. One Gluon kernel (``_gluon_fwd``), one program per (query tile, batch x head), 4 or 8 warps (64 or 128
query rows, warps stacked along the rows), K and V by TMA into STAGES buffers with one mbarrier each, a
CTA-wide barrier before a buffer is refilled. P goes to the second product from registers (a dot-operand
layout of the accumulator's). Causal: the diagonal tiles masked, query tiles heaviest first. Inputs: (B, H, N, D)
contiguous, 16-bit, D 64 or 128, N a multiple of 128 (an experiment's limits; ``check_inputs`` refuses the
rest). (1) O and LSE against the float64 reference beside step 05's errors (bf16, causal and not, D 64 at N=1024
and D 128 at N=4096; fp16 for the two 128x64 variants). (2) forward only, do_bench median (rep 300 ms), bf16: FlashAttention's grid at N
4096 and 16384 (B = 16384/N, H = 2048/D) and the CS336 leaderboard shape, each variant beside step 05 and
cuDNN's SDPA forward in the same run.

    python bench/experiments/gluon_fwd_overlap.py --out DIR     # an H200: about 2 minutes
    python bench/experiments/gluon_fwd_overlap.py --aot-check   # no GPU: compile every variant for sm_90a
(not in a process where TRITON_INTERPRET=1: the interpreter replaces Triton's library functions, which Gluon
then cannot compile; tests/test_experiment_gluon_fwd_overlap.py compiles in a subprocess for that reason)

Answer: the order is writable, and at D=64 it does not pay; at D=128 it pays 1-9% but the Gluon kernel is still
slower than step 05's TMA kernel. Two runs on one H200, 2026-12-02 12:12 and 12:25 UTC, c616a64's and 1f5f7ff's
trees (results/h200/triton/gluon_1202/, gluon_1202_r2/: round 1, then ``--round 2``). Every variant right (O and
LSE errors equal to step 05's, bf16 and fp16). ptxas keeps the product in flight (``wgmma.wait_group 1``, no
serialization warning). Against the same kernel waiting on every product: D=64 0.96-1.04x (nothing), D=128
0.92-1.09x (1.01-1.09x with three stages). Against step 05: at D=64 the best (128x64, three stages, 8 warps)
1.02x at all five shapes in round 1 and 0.95-1.03x in round 2 (the run's noise), 1.00-1.01x cuDNN at the
leaderboard shape, as step 05 is; at D=128 the best (128x128, three stages) 0.87-0.92x step 05 (0.78-0.85x cuDNN).
Two stages cost: 128x64 on two ran 0.85-0.87x step 05 causal at D=64 and 0.58-0.70x at D=128 (0.98-1.02x not
causal at D=64). This kernel refills a buffer only after the products reading it are waited for, so with two the
next load has one iteration to land. What is left at D=128 is what FlashAttention-3 adds on top: a producer
warp and two consumer warpgroups taking turns (ping-pong), which this kernel does not do.
"""

from __future__ import annotations

import argparse
import math
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: E402
    mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor  # noqa: E402

from bench.experiments import gpu_run  # noqa: E402

REC = gpu_run.Record("gluon_fwd_overlap")
log = REC.log
T0 = time.time()
LOG2E = 1.4426950408889634


# %% The kernel ---------------------------------------------------------------------------------------------

@gluon.jit
def _gluon_fwd(q_desc, k_desc, v_desc, O, LSE, N, H, qk_scale,
               HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
               IS_CAUSAL: gl.constexpr, OVERLAP: gl.constexpr, num_warps: gl.constexpr):
    dtype: gl.constexpr = q_desc.dtype
    n_m = gl.cdiv(N, BLOCK_M)
    if IS_CAUSAL:
        # grid (B*H, query tiles), axis 0 fastest: every head's heaviest query tile first (step 05's HEADS_FIRST)
        pid = n_m - 1 - gl.program_id(1)
        bh = gl.program_id(0)
    else:
        pid = gl.program_id(0)
        bh = gl.program_id(1)
    start_m = pid * BLOCK_M
    row0 = bh * N                                # this head's first row in the (B*H*N, D) views

    # Layouts: the products' accumulators (warps stacked along the rows), P as the second product's A operand.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    q_smem = gl.allocate_shared_memory(dtype, q_desc.block_type.shape, q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)

    if IS_CAUSAL:
        hi = gl.minimum(start_m + BLOCK_M, N)
    else:
        hi = N
    n_tiles = gl.cdiv(hi, BLOCK_N)
    kv_bytes: gl.constexpr = 2 * k_desc.block_type.nbytes

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [row0 + start_m, 0], q_bar, q_smem)
    for s in gl.static_range(STAGES):
        go = s < n_tiles
        mbarrier.expect(ready.index(s), kv_bytes, pred=go)
        tma.async_copy_global_to_shared(k_desc, [row0 + s * BLOCK_N, 0], ready.index(s), k_smem.index(s), pred=go)
        tma.async_copy_global_to_shared(v_desc, [row0 + s * BLOCK_N, 0], ready.index(s), v_smem.index(s), pred=go)

    offs_m = start_m + gl.arange(0, BLOCK_M, layout=row_s)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_s)
    l_i = gl.full([BLOCK_M], 0.0, gl.float32, layout=row_s)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    mbarrier.wait(q_bar, phase=0)

    # Tile 0: S_0, its softmax (no O to rescale yet).
    mbarrier.wait(ready.index(0), phase=0)
    s_acc = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    s_acc = warpgroup_mma_wait(num_outstanding=0, deps=(s_acc,))
    # Scores stay unscaled; m_i is in scaled (base-2) units, and exp2(s * qk_scale - m) is one FFMA and an EX2.
    if IS_CAUSAL:
        offs_n = gl.arange(0, BLOCK_N, layout=col_s)
        s_acc = gl.where(offs_n[None, :] <= offs_m[:, None], s_acc, float("-inf"))
    m_i = gl.maximum(m_i, gl.max(s_acc, 1) * qk_scale)
    p = gl.exp2(s_acc * qk_scale - m_i[:, None])
    l_i = gl.sum(p, 1)
    p_op = gl.convert_layout(p.to(dtype), p_layout)

    for j in range(1, n_tiles):
        st = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(ready.index(st), phase=(j // STAGES) & 1)
        # S_j = Q K_j^T and O += P_{j-1} V_{j-1}, both issued; then S_j waited for alone (OVERLAP) or both.
        s_acc = warpgroup_mma(q_smem, k_smem.index(st).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        acc = warpgroup_mma(p_op, v_smem.index(prev), acc, is_async=True)
        if OVERLAP:
            s_acc = warpgroup_mma_wait(num_outstanding=1, deps=(s_acc,))
        else:
            s_acc, acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(s_acc, acc, p_op))
        # The softmax of S_j: with OVERLAP, P_{j-1} V_{j-1} is still on the tensor cores meanwhile.
        if IS_CAUSAL:
            if j * BLOCK_N + BLOCK_N > start_m:
                offs_n = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=col_s)
                s_acc = gl.where(offs_n[None, :] <= offs_m[:, None], s_acc, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s_acc, 1) * qk_scale)
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s_acc * qk_scale - m_new[:, None])
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        if OVERLAP:
            acc, p_op = warpgroup_mma_wait(num_outstanding=0, deps=(acc, p_op))
        acc = acc * gl.convert_layout(alpha, row_o)[:, None]
        p_op = gl.convert_layout(p.to(dtype), p_layout)
        # Buffer `prev` (K_{j-1}, V_{j-1}) is read by no product in flight now, in any warp: refill it.
        gl.thread_barrier()
        nxt = j - 1 + STAGES
        go = nxt < n_tiles
        mbarrier.expect(ready.index(prev), kv_bytes, pred=go)
        tma.async_copy_global_to_shared(k_desc, [row0 + nxt * BLOCK_N, 0], ready.index(prev), k_smem.index(prev), pred=go)
        tma.async_copy_global_to_shared(v_desc, [row0 + nxt * BLOCK_N, 0], ready.index(prev), v_smem.index(prev), pred=go)

    last = (n_tiles - 1) % STAGES
    acc = warpgroup_mma(p_op, v_smem.index(last), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    mbarrier.invalidate(q_bar)
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))

    # O = acc / l; LSE = (m + log2 l) * ln 2 (natural log, as step 05 returns it).
    acc = acc / gl.convert_layout(l_i, row_o)[:, None]
    rows_o = start_m + gl.arange(0, BLOCK_M, layout=row_o)
    cols_o = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    o_ptrs = O + (row0 + rows_o)[:, None].to(gl.int64) * HEAD_DIM + cols_o[None, :]
    gl.store(o_ptrs, acc.to(dtype))
    gl.store(LSE + row0 + offs_m, (m_i + gl.log2(l_i)) * 0.6931471805599453)


# %% Host ---------------------------------------------------------------------------------------------------

VARIANTS = {
    # name: (BLOCK_M, BLOCK_N, STAGES, num_warps, OVERLAP)
    "overlap 128x64 s2 w8": (128, 64, 2, 8, True),
    "no-overlap 128x64 s2 w8": (128, 64, 2, 8, False),
    "overlap 128x64 s3 w8": (128, 64, 3, 8, True),
    "overlap 128x128 s2 w8": (128, 128, 2, 8, True),
    "overlap 64x64 s3 w4": (64, 64, 3, 4, True),
    "no-overlap 64x64 s3 w4": (64, 64, 3, 4, False),
    # round 2 (--round 2): round 1's best against itself without the overlap, a fourth stage, 128-key tiles
    "no-overlap 128x64 s3 w8": (128, 64, 3, 8, False),
    "overlap 128x64 s4 w8": (128, 64, 4, 8, True),
    "overlap 128x128 s3 w8": (128, 128, 3, 8, True),
    "no-overlap 128x128 s3 w8": (128, 128, 3, 8, False),
}
ROUNDS = {1: list(VARIANTS)[:6],
          2: ["overlap 128x64 s3 w8", "no-overlap 128x64 s3 w8", "overlap 128x64 s4 w8", "overlap 128x128 s3 w8",
              "no-overlap 128x128 s3 w8"]}


def check_inputs(q, k, v):
    if not (q.dim() == 4 and q.shape == k.shape == v.shape):
        raise ValueError(f"gluon_fwd_overlap takes q, k, v of one shape (B, H, N, D), got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.dtype not in (torch.float16, torch.bfloat16) or not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"gluon_fwd_overlap takes 16-bit q, k, v of one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    B, H, N, D = q.shape
    if D not in (64, 128) or N % 128:
        raise ValueError(f"gluon_fwd_overlap takes D 64 or 128 and N a multiple of 128 (an experiment's limits), "
                         f"got D={D}, N={N}")
    if not all(t.is_contiguous() for t in (q, k, v)):
        raise ValueError("gluon_fwd_overlap takes contiguous (B, H, N, D) q, k, v")


def launch_args(q, k, v, causal, variant, o=None, lse=None):
    """(grid, args, kwargs) of one launch; tensors may be on the CPU (the compile report)."""
    check_inputs(q, k, v)
    bm, bn, stages, warps, overlap = VARIANTS[variant]
    B, H, N, D = q.shape
    gdt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    q2, k2, v2 = (t.view(B * H * N, D) for t in (q, k, v))
    q_layout = gl.NVMMASharedLayout.get_default_for([bm, D], gdt)
    kv_layout = gl.NVMMASharedLayout.get_default_for([bn, D], gdt)
    q_desc = TensorDescriptor(q2, list(q2.shape), list(q2.stride()), [bm, D], q_layout)
    k_desc = TensorDescriptor(k2, list(k2.shape), list(k2.stride()), [bn, D], kv_layout)
    v_desc = TensorDescriptor(v2, list(v2.shape), list(v2.stride()), [bn, D], kv_layout)
    o = torch.empty_like(q) if o is None else o
    lse = torch.empty(B, H, N, device=q.device, dtype=torch.float32) if lse is None else lse
    grid = (B * H, N // bm) if causal else (N // bm, B * H)
    args = (q_desc, k_desc, v_desc, o, lse, N, H, D ** -0.5 * LOG2E)
    kwargs = dict(HEAD_DIM=D, BLOCK_M=bm, BLOCK_N=bn, STAGES=stages, IS_CAUSAL=bool(causal), OVERLAP=overlap,
                  num_warps=warps)
    return grid, args, kwargs, o, lse


def forward(q, k, v, causal, variant):
    grid, args, kwargs, o, lse = launch_args(q, k, v, causal, variant)
    _gluon_fwd[grid](*args, **kwargs)
    return o, lse


# %% (1) correctness ---------------------------------------------------------------------------------------

def correctness(names) -> dict:
    from attnlib.loader import load_step
    from attnlib.reference import reference_attention
    s5 = load_step(5, "solutions")
    rows, wrong = [], 0
    # bf16 at two shapes, causal and not (the kernels the timing runs), fp16 once for the two 128x64 variants: every
    # new (variant, D, causal, dtype) is a compile of a few seconds.
    cases = [((2, 4, 1024, 64), c, torch.bfloat16, list(names)) for c in (True, False)] + \
        [((1, 4, 4096, 128), c, torch.bfloat16, list(names)) for c in (True, False)] + \
        [((1, 2, 2048, 64), True, torch.float16, list(names)[:2])]
    for (b, h, n, d), causal, dt, names in cases:
        g = torch.Generator(device="cpu").manual_seed(0)
        q, k, v = (torch.randn(b, h, n, d, generator=g).to("cuda", dt) for _ in range(3))
        ro, rl = reference_attention(q, k, v, causal)
        o5, l5 = s5.forward(q, k, v, causal, d ** -0.5)
        base = (float((o5.double() - ro).abs().max()), float((l5.double() - rl).abs().max()))
        case = f"B{b} H{h} N{n} D{d} {'causal' if causal else 'full'} {str(dt)[6:]}"
        for name in names:
            try:
                o, lse = forward(q, k, v, causal, name)
                torch.cuda.synchronize()
                e = (float((o.double() - ro).abs().max()), float((lse.double() - rl).abs().max()))
                ok = all(x <= 1.5 * y + 1e-3 for x, y in zip(e, base)) and all(math.isfinite(x) for x in e)
            except Exception as ex:  # noqa: BLE001
                e, ok = f"{type(ex).__name__}: {str(ex)[:300]}", False
            wrong += not ok
            rows.append({"case": case, "variant": name, "err": e, "step05": base, "ok": ok})
            log(f"  {case:<30} {name:<26} {e if isinstance(e, str) else f'O {e[0]:.1e} LSE {e[1]:.1e}'}"
                f"  (step 05 O {base[0]:.1e} LSE {base[1]:.1e}) {'ok' if ok else 'WRONG'}")
    return {"rows": rows, "wrong": wrong}


# %% (2) timing ---------------------------------------------------------------------------------------------

def timing(budget_s: float, names) -> dict:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attnlib.loader import load_step
    s5 = load_step(5, "solutions")
    shapes = [("leaderboard", 1, 16, 16384, 64, True)] + [
        ("grid", 16384 // n, 2048 // d, n, d, c) for d in (64, 128) for c in (True, False) for n in (4096, 16384)]
    rows = []
    for label, b, h, n, d, causal in shapes:
        if time.time() - T0 > budget_s:
            log(f"  budget reached: {label} B{b} H{h} N{n} D{d} and after not timed")
            break
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        row = {"shape": f"{label} B{b} H{h} N{n} D{d} {'causal' if causal else 'full'}", "ms": {}}

        def bench(fn):
            fn()
            return round(float(triton.testing.do_bench(fn, rep=300)), 4)
        row["ms"]["step05"] = bench(lambda: s5.forward(q, k, v, causal, d ** -0.5))
        for name in names:
            try:
                row["ms"][name] = bench(lambda: forward(q, k, v, causal, name))
            except Exception as ex:  # noqa: BLE001
                row["ms"][name] = f"{type(ex).__name__}: {str(ex)[:200]}"
        row["ms"]["step05 again"] = bench(lambda: s5.forward(q, k, v, causal, d ** -0.5))
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]), torch.no_grad():
            row["ms"]["cudnn"] = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
        s05 = min(row["ms"]["step05"], row["ms"]["step05 again"])
        row["vs_cudnn"] = {x: round(row["ms"]["cudnn"] / t, 3) for x, t in row["ms"].items()
                           if isinstance(t, float) and x != "cudnn"}
        row["vs_step05"] = {x: round(s05 / t, 3) for x, t in row["ms"].items() if isinstance(t, float)
                            and x not in ("cudnn", "step05", "step05 again")}
        rows.append(row)
        log(f"  {row['shape']:<34} " + "  ".join(f"{x} {t if isinstance(t, str) else f'{t:.3f}'}"
                                                  for x, t in row["ms"].items()))
        log(f"  {'':34} vs cuDNN: " + "  ".join(f"{x} {r:.2f}" for x, r in row["vs_cudnn"].items()))
        REC.result["timing_rows"] = rows
        REC.save()
    return {"rows": len(rows)}


# %% --aot-check --------------------------------------------------------------------------------------------

def compile_for_sm90(kern, args, kwargs):
    """A ``@gluon.jit`` kernel compiled for sm_90a without a GPU, for the launch ``kern[grid](*args, **kwargs)``
    (the binder Triton's launcher uses, on CPU tensors of the same dtypes and shapes: the same specialization):
    Triton's compiled kernel (``.asm["ptx"]``, ``.metadata``)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.experimental.gluon._runtime import GluonASTSource
    from triton.runtime.jit import create_function_from_signature
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kern.signature, kern.params, backend)
    bound, spec, opts = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kern._pack_args(backend, kwargs, bound, spec, opts)
    return triton.compile(GluonASTSource(kern, signature, constexprs, attrs), target=target, options=options.__dict__)


def compile_sm90(variant: str, d: int, causal: bool):
    """The kernel of ``variant`` compiled for sm_90a without a GPU (``compile_for_sm90``)."""
    q = torch.empty(1, 2, 1024, d, dtype=torch.bfloat16)
    grid, args, kwargs, _, _ = launch_args(q, q, q, causal, variant)
    return compile_for_sm90(_gluon_fwd, args, kwargs)


def wgmma_waits(ptx: str) -> dict:
    """``{pendings: count}`` of the ``wgmma.wait_group`` instructions in ``ptx`` (1: one product left in flight)."""
    waits = {}
    for m in re.finditer(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", ptx):
        waits[int(m.group(1))] = waits.get(int(m.group(1)), 0) + 1
    return waits


def aot_check() -> int:
    """Compile every variant for sm_90a without a GPU (D 64/128, causal and not): registers, spills, shared
    memory, and whether the main loop keeps a product in flight (``wgmma.wait_group.sync.aligned 1`` in PTX)."""
    ptxas = gpu_run.triton_tool("ptxas")      # the one that chose the PTX version, not the bundled one
    failures = 0
    print(f"{'variant':<26}{'D':>4} {'mask':<7}{'regs':>5}{'spill':>8}{'smem':>7}  waits in PTX (pendings: count)")
    for name in VARIANTS:
        for d in (64, 128):
            for causal in (True, False):
                try:
                    ck = compile_sm90(name, d, causal)
                    ptx = ck.asm["ptx"]
                    regs, spill = "?", "?"
                    if ptxas:
                        with tempfile.TemporaryDirectory() as tmp:
                            p = Path(tmp) / "k.ptx"
                            p.write_text(ptx)
                            r = subprocess.run([ptxas, "-v", "--gpu-name=sm_90a", str(p), "-o", str(p) + ".o"],
                                               capture_output=True, text=True)
                            mr = re.search(r"Used (\d+) registers", r.stderr)
                            ms_ = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)
                            regs = mr.group(1) if mr else "?"
                            spill = f"{ms_.group(1)}/{ms_.group(2)}" if ms_ else "?"
                    print(f"{name:<26}{d:>4} {'causal' if causal else 'full':<7}{regs:>5}{spill:>8}"
                          f"{ck.metadata.shared // 1024:>6}K  {wgmma_waits(ptx)}", flush=True)
                except Exception as e:  # noqa: BLE001
                    failures += 1
                    print(f"{name:<26}{d:>4} {'causal' if causal else 'full':<7}FAIL {type(e).__name__}: "
                          f"{str(e)[:600]}", flush=True)
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--aot-check", action="store_true", help="no GPU: compile for sm_90a and report")
    ap.add_argument("--budget-s", type=float, default=200)
    ap.add_argument("--variants", default=None, help="comma-separated names of VARIANTS to time (default: the round's)")
    ap.add_argument("--round", type=int, default=1, choices=sorted(ROUNDS), help="1: the first run's variants; 2: "
                                                                                 "the follow-up of round 1's best")
    ap.add_argument("--waits", action="store_true",
                    help="no GPU: print {variant: wgmma waits} as JSON for --variants (D=64, causal), compiled for sm_90a")
    args = ap.parse_args()
    if args.waits:
        import json
        names = args.variants.split(",") if args.variants else list(VARIANTS)
        print(json.dumps({n: wgmma_waits(compile_sm90(n, 64, True).asm["ptx"]) for n in names}))
        return 0
    if args.aot_check:
        return aot_check()
    if not torch.cuda.is_available():
        ap.error("a Hopper GPU (or --aot-check)")
    if args.out is None:
        ap.error("--out DIR on a GPU")
    REC.open(args.out, ROOT)
    REC.result["gpu"] = torch.cuda.get_device_name()

    @REC.part("1 correctness")
    def part1():
        r = correctness(ROUNDS[args.round])
        REC.result["round"] = args.round
        REC.result["right_variants"] = sorted({x["variant"] for x in r["rows"]} -
                                              {x["variant"] for x in r["rows"] if not x["ok"]})
        return r
    part1()
    right = REC.result.get("right_variants", [])
    names = [x for x in (args.variants.split(",") if args.variants else ROUNDS[args.round]) if x in right]
    log(f"timing the variants right in every case: {names or 'none'}")

    @REC.part("2 forward timing")
    def part2():
        return timing(args.budget_s, names)
    if names:
        part2()
    REC.save()
    log(f"wrote {REC.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
