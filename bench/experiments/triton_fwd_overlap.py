"""Experiment: does issuing the next tile's Q K^T before this tile's softmax speed up step 05's forward on Hopper?

Question. Compiled for sm_90, step 05's loop over key tiles is ``D(s) W0 D(r)``: the Q K^T product
(wgmma, K from shared memory), a wait for it at once (``pendings = 0``), the exponentials, then P V left
in flight. Inside one program the tensor cores and the exponentials take turns; only the second program
on the SM (122 registers: two fit) fills the gaps. FlashAttention-3 overlaps them inside one warpgroup
("intra-warpgroup overlapping of softmax and GEMMs"): S_{j+1} = Q K_{j+1}^T is issued before the softmax
of S_j, so the exponentials of tile j run while the tensor cores compute tile j+1. Written in Triton, does
its compiler keep that product in flight across the loop's back edge (a wait that leaves one pending,
``W1``), and does it pay at the CS336 leaderboard shape and in the grid, against cuDNN in the same run?

Answer (the compile report, ``--aot-check``, Triton 3.6 for sm_90, 2026-12-01; not timed): **no, Triton
does not keep it in flight.** The ttgir of the overlap loop issues ``s_next`` (``warp_group_dot ... isAsync
= true``) and waits for it at once, ``warp_group_dot_wait %s_next ... {pendings = 0}``, before the first
exp2, the same ``D(s) W0 D(r)`` as step 05: Triton's Hopper pipeliner leaves a product in flight across the
back edge only when it is an accumulator (what dK/dV's products get, "D(r) D(r)" at the end of step 06's
loop), not a product the next step reads. Meanwhile the second S tile costs registers: 169 at D=64
(step 05: 112), one program per SM instead of two, so the overlap would also lose the second program
that now fills the gaps. Not timed: the schedule it meant to create is not there. What is left in Triton
for this overlap is warp specialization (``tl.range(..., warp_specialize=True)``: NaN with 3 stages, 1.2-1.3x
slower with 2 in triton_fwd_tma.py); FlashAttention-3's intra-warpgroup overlap needs ``wgmma`` issued and
waited by hand: step 07's CUDA v4 (issue 17).

    D64 c step05             112        0/0    64K    2    16     16   68  176   60  D(s) W0 D(r)
    D64 c overlap            169        0/0    72K    1     8     20   68  176   60  D(s) W0 D(r)
    D128 c step05            166        0/0   112K    2     8     24   68  272   60  D(s) W0 D(r)
    D128 c overlap           218        0/0   128K    1     4     32   68  272   60  D(s) W0 D(r)

How the kernel differs from step 05's ``_attn_fwd_kernel`` (solutions/step05_triton_fwd.py): the same
kernel, calling step 05's own helpers (``load_tile``, ``store_tile``, ``key_range``, ``_fwd_inner`` for
the masked stage), except that with ``OVERLAP`` the unmasked stage runs ``_fwd_inner_overlap``: a
prologue computes S for the first tile, and each step issues S of the next tile (K loaded with a row
mask, so the step past the last tile reads zeros and its product is thrown away: one extra Q K^T per
program), then does the softmax and P V of the current one. The scale is applied where S is consumed,
so nothing waits on the product in the step that issues it. Checked against step 05 and the float64
reference before timing.

    python bench/experiments/triton_fwd_overlap.py --aot-check        # no GPU: compile for sm_90, loop schedules
    python bench/experiments/triton_fwd_overlap.py --out DIR          # a Hopper GPU: check, then time (~1-2 min)
    python bench/experiments/triton_fwd_overlap.py --cpu-check        # no GPU: Triton's interpreter, tiny sizes
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

T0 = time.time()
if "--cpu-check" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"          # before triton is imported
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "experiments"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from attnlib.loader import load_step  # noqa: E402

S5 = load_step(5, "solutions")
load_tile, store_tile, key_range, _fwd_inner = S5.load_tile, S5.store_tile, S5.key_range, S5._fwd_inner
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)


@triton.jit
def _fwd_inner_overlap(acc, l_i, m_i, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                       offs_d, lo, hi, N_K, qk_scale,
                       HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, PAD_D: tl.constexpr,
                       DOT_PRECISION: tl.constexpr):
    """Step 05's unmasked stage with S of the next tile issued before the softmax of this one."""
    offs_n = lo + tl.arange(0, BLOCK_N)
    k = load_tile(K, offs_n, offs_d, stride_kn, stride_kd, N_K, HEAD_DIM, True, PAD_D)
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)          # unscaled: scaled where used
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        v = load_tile(V, offs_n, offs_d, stride_vn, stride_vd, N_K, HEAD_DIM, False, PAD_D)
        k_next = load_tile(K, offs_n + BLOCK_N, offs_d, stride_kn, stride_kd, N_K, HEAD_DIM, True, PAD_D)
        s_next = tl.dot(q, tl.trans(k_next), input_precision=DOT_PRECISION)
        s = s * qk_scale
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)
        m_i = m_new
        s = s_next
    return acc, l_i, m_i


@triton.jit
def _fwd_overlap_kernel(
    Q, K, V, O, LSE,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    H, N_Q, N_K, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr, OVERLAP: tl.constexpr,
):
    PAD_D: tl.constexpr = BLOCK_D != HEAD_DIM
    qk_scale = tl.cast(qk_scale, tl.float32)
    pid_m = tl.program_id(0)
    if IS_CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    Q += b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    K += b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
    V += b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh
    O += b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
    LSE += bh.to(tl.int64) * N_Q
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = load_tile(Q, offs_m, offs_d, stride_qm, stride_qd, N_Q, HEAD_DIM, True, PAD_D)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    hi_full, hi = key_range(start_m, N_K, BLOCK_M, BLOCK_N, IS_CAUSAL)
    if OVERLAP:
        acc, l_i, m_i = _fwd_inner_overlap(acc, l_i, m_i, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                                           offs_d, 0, hi_full, N_K, qk_scale, HEAD_DIM, BLOCK_N, PAD_D,
                                           DOT_PRECISION)
    else:
        acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                                   offs_m, offs_d, 0, hi_full, N_K, qk_scale,
                                   HEAD_DIM, BLOCK_N, PAD_D, False, IS_CAUSAL, DOT_PRECISION)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, K, V, stride_kn, stride_kd, stride_vn, stride_vd,
                               offs_m, offs_d, hi_full, hi, N_K, qk_scale,
                               HEAD_DIM, BLOCK_N, PAD_D, True, IS_CAUSAL, DOT_PRECISION)
    store_tile(O, acc * (1.0 / l_i)[:, None], offs_m, offs_d, stride_om, stride_od, N_Q, HEAD_DIM)
    tl.store(LSE + offs_m, (m_i + tl.math.log2(l_i)) * LN2, mask=offs_m < N_Q)


class Launch:
    """One launch of the experiment's kernel, kept so it can be timed again or compiled without a GPU."""

    def __init__(self, q, k, v, causal, overlap, cfg):
        self.q, self.k, self.v = (S5.as_bhnd(t) for t in (q, k, v))
        B, H, nq, d = self.q.shape
        self.o = torch.empty_like(self.q)
        self.lse = torch.empty(B * H, nq, dtype=torch.float32, device=q.device)
        self.grid = (triton.cdiv(nq, cfg["BLOCK_M"]), B * H)
        self.args = (self.q, self.k, self.v, self.o, self.lse, *self.q.stride(), *self.k.stride(), *self.v.stride(),
                     *self.o.stride(), H, nq, self.k.shape[2], d ** -0.5 * 1.4426950408889634)
        self.kwargs = dict(HEAD_DIM=d, BLOCK_D=S5._pow2_dim(d), IS_CAUSAL=causal,
                           DOT_PRECISION=S5._dot_precision(q.dtype), OVERLAP=overlap, **cfg)
        if os.environ.get("TRITON_INTERPRET") == "1":
            self.kwargs.pop("maxnreg", None)

    def __call__(self):
        _fwd_overlap_kernel[self.grid](*self.args, **self.kwargs)
        return self.o, self.lse


def variants(nq, nk, d, dtype, causal, device):
    cfg = S5.fwd_config(nq, nk, d, dtype, causal, device, 1 if device == "cpu" else 16)
    return {"step05": (False, cfg), "overlap": (True, cfg),
            "overlap-cap168": (True, dict(cfg, maxnreg=168))}


def aot_check():
    import triton_dkdv_variants as tv
    print(tv.AOT_HEADER)
    for d in (64, 128):
        for causal in (True, False):
            q, k, v = (torch.empty(1, 16, 16384, d, dtype=torch.bfloat16) for _ in range(3))
            for name, (ov, cfg) in variants(16384, 16384, d, torch.bfloat16, causal, "cuda").items():
                ln = Launch(q, k, v, causal, ov, cfg)
                i = tv.aot_compile(tv.Launch(name, _fwd_overlap_kernel, ln.grid, ln.args, ln.kwargs))
                print(tv.aot_line(f"D{d} {'c' if causal else 'f'} {name}", i), flush=True)
    return 0


def check(device, dtype, shapes):
    """Every variant against the float64 reference (and step 05's own output): True when all pass."""
    from attnlib import make_qkv
    from attnlib.compare import assert_close
    from attnlib.reference import reference_attention
    ok = True
    for (B, H, N, D) in shapes:
        for causal in (False, True):
            q, k, v = make_qkv(B, H, N, N, D, dtype=dtype, device=device)
            ref, ref_lse = reference_attention(q, k, v, is_causal=causal)
            for name, (ov, cfg) in variants(N, N, D, dtype, causal, device).items():
                o, lse = Launch(q, k, v, causal, ov, cfg)()
                try:
                    assert_close(o, ref, name=f"O {name} N={N} D={D} causal={causal}")
                    assert_close(lse.view(B, H, N), ref_lse, name="LSE", dtype=torch.float32)
                    print(f"ok   {name:16s} N={N} D={D} causal={causal}", flush=True)
                except AssertionError as e:
                    ok = False
                    print(f"FAIL {name:16s} N={N} D={D} causal={causal}: {str(e).splitlines()[0]}", flush=True)
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--budget-s", type=float, default=120)
    ap.add_argument("--aot-check", action="store_true")
    ap.add_argument("--cpu-check", action="store_true")
    args = ap.parse_args()
    if args.aot_check:
        return aot_check()
    if args.cpu_check:
        return 0 if check("cpu", torch.float32, [(1, 2, 96, 16), (1, 1, 80, 32)]) else 1
    if not check("cuda", torch.bfloat16, [(2, 4, 1024, 64), (2, 4, 1024, 128)]):
        return 1
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from bench.core import machine_info
    out = {"machine": machine_info(), "dtype": "bfloat16", "rows": []}
    for (B, H, N, D) in [(1, 16, 16384, 64), (4, 16, 4096, 64), (1, 16, 16384, 128), (4, 16, 4096, 128)]:
        for causal in (True, False):
            if time.time() - T0 > args.budget_s:
                break
            q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            flops = 4 * B * H * N * N * D / (2 if causal else 1)
            row = {"B": B, "H": H, "N": N, "D": D, "causal": causal}
            for name, (ov, cfg) in variants(N, N, D, torch.bfloat16, causal, "cuda").items():
                ln = Launch(q, k, v, causal, ov, cfg)
                row[name] = float(triton.testing.do_bench(ln, warmup=25, rep=200))
            for name, be in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
                with sdpa_kernel(be):
                    row[name] = float(triton.testing.do_bench(
                        lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), warmup=25, rep=200))
            row["tflops"] = {k2: round(flops / v2 / 1e9, 1) for k2, v2 in row.items() if isinstance(v2, float)}
            out["rows"].append(row)
            print(row, flush=True)
            if args.out:
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / "fwd_overlap.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
