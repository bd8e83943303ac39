"""Experiment: does a persistent step 05 forward (one program per SM slot, looping over query tiles in a causal-balanced order) pay?

Question. Step 05 launches one program per (query tile, batch x head) and lets the hardware start them in grid
order; causal launches start every head's heaviest query tile first (``HEADS_FIRST``). Issue 17 lists
"persistent scheduling with a causal-balanced tile order" among the Hopper techniques: a grid of exactly as
many programs as the SMs hold at once, each looping over tiles, so no program is launched late into a tail and
the order of the work is the kernel's, not the block scheduler's. In the same run, step 05 loses more to
cuDNN at N=4096 causal (0.84x) than at N=16384 (0.92x) (``results/h200/triton/fwd_lazy_rescale_1202.log``): more,
shorter programs, more of each spent in its prologue and epilogue, a tail. Does a persistent kernel close
any of that, and which order: (a) "stride", the tiles in step 05's heads-first heaviest-first order, program p
taking tiles p, p + P, p + 2P, ...; (b) "snake", the same order dealt back and forth (round r gives tile
r P + p to program p when r is even, to program P - 1 - p when odd), so that a program given a heavy tile in
one round gets a light one in the next?

Method. The kernel (``_attn_fwd_persistent``) is step 05's pointer kernel (``_attn_fwd_kernel``) with its body
inside a loop over tiles: the loop over key tiles, the helpers (``load_tile``, ``key_range``, ``_fwd_inner``,
``finish_rows``, ``store_tile``) and the tiles (``dense_fwd_config``) are step 05's own, imported from
solutions/. (1) O and LSE against the float64 reference beside step 05's error on the same inputs (bf16,
fp16; causal and not; odd lengths, Nq != Nk). (2) forward only, do_bench median (rep 300 ms), bf16, D=64 (the
pointer kernel's head dim: D=128 runs the TMA kernel): FlashAttention's grid at N 4096 and 16384 (B = 16384/N,
H = 32), causal and not, and the CS336 leaderboard shape (B=1 H=16 N=16384 causal); at each shape step 05,
the variants (P = 1 and 2 programs per SM x stride / snake; P = 2 capped at 128 registers, since the loop over
tiles takes the kernel to 170-198 registers, one 8-warp program an SM, where step 05's 110-122 allow two), step 05
again, cuDNN.

    python bench/experiments/triton_fwd_persistent.py --out DIR     # an H200: about a minute
    python bench/experiments/triton_fwd_persistent.py --small       # CPU: Triton's interpreter, part (1) only
    python bench/experiments/triton_fwd_persistent.py --aot-check   # no GPU: compile for sm_90, registers

Answer: no; step 05 stays as it is. One H200 (132 SMs), 2026-12-02 06:51 UTC, the working tree of ba71068 with
this file (results/h200/triton/fwd_persistent_1202.json, .log): every variant right (16 cases, O and LSE within
1.5x step 05's error) and slower than step 05 at every shape timed. The fastest, snake P=2 capped at 128
registers: 0.946x at the leaderboard shape (1.276 ms against 1.35), 0.963-0.970x causal, 0.895-0.917x not
causal; stride at the same cap 0.90-0.92x; uncapped (one program an SM) 0.66-0.82x. The order matters where the
mask makes tiles unequal -- snake over stride 1.05x causal, 1.00x not -- but the loop over tiles costs more than
the tail it removes: 48-76 registers a thread, and at the cap 4-40 bytes spilled (--aot-check). Step 05 against
cuDNN in the run: 0.85 (N=4096 causal), 0.93 (the other grid shapes), 1.00 (leaderboard).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

if not torch.cuda.is_available() and "--aot-check" not in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from attnlib.loader import load_step  # noqa: E402
from attnlib.ops import configured, tiles  # noqa: E402
from bench.experiments import gpu_run  # noqa: E402

S5 = load_step(5, "solutions")
load_tile, store_tile, key_range, finish_rows, _fwd_inner = (
    S5.load_tile, S5.store_tile, S5.key_range, S5.finish_rows, S5._fwd_inner)

REC = gpu_run.Record("triton_fwd_persistent")
log = REC.log
T0 = time.time()

STRIDE, SNAKE = 0, 1


@triton.jit
def _attn_fwd_persistent(
    Q, K, V, O, LSE,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    H, BH, N_Q, N_K, N_TILES_M,                            # heads, batch x heads, lengths, query tiles a head
    qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    IS_CAUSAL: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ORDER: tl.constexpr,                                   # STRIDE or SNAKE
):
    """Step 05's ``_attn_fwd_kernel`` looping over tiles: tile t of the heads-first order is query tile
    t // BH (the last first when causal) of batch x head t % BH, as step 05's grid with HEADS_FIRST."""
    PAD_D: tl.constexpr = BLOCK_D != HEAD_DIM
    qk_scale = tl.cast(qk_scale, tl.float32)
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    total = N_TILES_M * BH
    rounds = tl.cdiv(total, P)
    for r in range(0, rounds):
        if ORDER == 1:
            t = r * P + tl.where(r % 2 == 0, pid, P - 1 - pid)
        else:
            t = r * P + pid
        if t < total:
            pid_m = t // BH
            if IS_CAUSAL:
                pid_m = N_TILES_M - 1 - pid_m
            bh = t % BH
            b = bh // H
            h = bh % H
            Qh = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
            Kh = K + b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
            Vh = V + b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh
            Oh = O + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
            Lh = LSE + bh.to(tl.int64) * N_Q
            start_m = pid_m * BLOCK_M
            offs_m = start_m + tl.arange(0, BLOCK_M)
            offs_d = tl.arange(0, BLOCK_D)
            q = load_tile(Qh, offs_m, offs_d, stride_qm, stride_qd, N_Q, HEAD_DIM, True, PAD_D)
            m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
            l_i = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
            hi_full, hi = key_range(start_m, N_K, BLOCK_M, BLOCK_N, IS_CAUSAL)
            acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, Kh, Vh, stride_kn, stride_kd, stride_vn, stride_vd,
                                       offs_m, offs_d, 0, hi_full, N_K, qk_scale,
                                       HEAD_DIM, BLOCK_N, PAD_D, False, IS_CAUSAL, DOT_PRECISION)
            acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, Kh, Vh, stride_kn, stride_kd, stride_vn, stride_vd,
                                       offs_m, offs_d, hi_full, hi, N_K, qk_scale,
                                       HEAD_DIM, BLOCK_N, PAD_D, True, IS_CAUSAL, DOT_PRECISION)
            o, lse = finish_rows(acc, l_i, m_i)
            store_tile(Oh, o, offs_m, offs_d, stride_om, stride_od, N_Q, HEAD_DIM)
            tl.store(Lh + offs_m, lse, mask=offs_m < N_Q)


def forward_persistent(q, k, v, is_causal, scale, per_sm=2, order=SNAKE, config=None, maxnreg=None):
    """``(O, LSE)`` as step 05's ``forward`` (pointer kernel), from ``per_sm`` programs per SM (a CPU: 4 programs)."""
    q4, k4, v4 = S5.as_bhnd(q), S5.as_bhnd(k), S5.as_bhnd(v)
    B, H, nq, d = q4.shape
    nk = k4.shape[2]
    o = q.new_empty(q.shape)
    lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
    o4 = S5.as_bhnd(o)
    cfg = dict(config or S5.dense_fwd_config(nq, nk, d, q.dtype, is_causal, q.device.type, B * H))
    cfg.pop("HEADS_FIRST", None)
    if maxnreg:
        cfg["maxnreg"] = maxnreg
    n_tiles_m = triton.cdiv(nq, cfg["BLOCK_M"])
    slots = torch.cuda.get_device_properties(q.device).multi_processor_count * per_sm if q.is_cuda else 4
    grid = (min(slots, n_tiles_m * B * H),)
    configured(_attn_fwd_persistent, cfg)[grid](
        q4, k4, v4, o4, lse, *q4.stride(), *k4.stride(), *v4.stride(), *o4.stride(),
        H, B * H, nq, nk, n_tiles_m, scale * S5.LOG2E,
        HEAD_DIM=d, BLOCK_D=S5._pow2_dim(d), IS_CAUSAL=is_causal, DOT_PRECISION=S5._dot_precision(q.dtype),
        ORDER=order, **tiles(cfg))
    return o, lse


VARIANTS = {f"{name} P={p}": dict(per_sm=p, order=o) for p in (1, 2) for name, o in (("stride", STRIDE), ("snake", SNAKE))}
# The loop over tiles takes the kernel from 110-122 registers to 170-198 (--aot-check): one 8-warp program an SM
# where step 05 runs two. Capped at 128, two fit again.
VARIANTS.update({f"{name} P=2 r128": dict(per_sm=2, order=o, maxnreg=128) for name, o in (("stride", STRIDE), ("snake", SNAKE))})


def step05_pointer(q, k, v, causal, scale):
    return S5.forward(q, k, v, causal, scale, tma=False)


# %% (1) correctness ---------------------------------------------------------------------------------------

def correctness(small: bool, device: str) -> dict:
    from attnlib.reference import reference_attention
    dts = [torch.float32, torch.float16] if small else [torch.bfloat16, torch.float16]
    shapes = [(1, 2, 100, 100, 64), (2, 1, 77, 130, 32)] if small else \
        [(2, 3, 1000, 1000, 64), (1, 4, 999, 1531, 64), (2, 2, 4096, 4096, 64), (1, 3, 700, 700, 128)]
    variants = {"snake P=2": VARIANTS["snake P=2"], "stride P=1": VARIANTS["stride P=1"]} if small else VARIANTS
    rows, wrong = [], 0
    for (b, h, nq, nk, d) in shapes:
        for causal in (True, False):
            for dt in dts:
                g = torch.Generator().manual_seed(0)
                q, k, v = (torch.randn(b, h, n, d, generator=g).to(device=device, dtype=dt) for n in (nq, nk, nk))
                ro, rl = reference_attention(q, k, v, causal)

                def err(fn):
                    o, lse = fn(q, k, v, causal, d ** -0.5)
                    return float((o.double() - ro).abs().max()), float((lse.double() - rl).abs().max())
                base = err(step05_pointer)
                row = {"case": f"B{b} H{h} Nq{nq} Nk{nk} D{d} {'causal' if causal else 'full'} {str(dt)[6:]}",
                       "step05": base}
                bad = []
                for name, kw in variants.items():
                    e = err(lambda *a, kw=kw: forward_persistent(*a, **kw))
                    row[name] = e
                    if not all(x <= 1.5 * y + 1e-3 for x, y in zip(e, base)):
                        bad.append(name)
                wrong += bool(bad)
                rows.append(row)
                worst = max((row[n][0] for n in variants), default=0)
                log(f"  {row['case']:<40} step05 O/LSE {base[0]:.1e}/{base[1]:.1e}  variants' worst O {worst:.1e}"
                    f"  {'WRONG: ' + ', '.join(bad) if bad else 'ok'}")
    return {"rows": rows, "wrong": wrong}


# %% (2) timing ---------------------------------------------------------------------------------------------

def timing(budget_s: float) -> dict:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    shapes = [("leaderboard", 1, 16, 16384, True)] + [("grid", 16384 // n, 32, n, c) for c in (True, False)
                                                       for n in (4096, 16384)]
    rows = []
    for name, b, h, n, causal in shapes:
        if time.time() - T0 > budget_s:
            log(f"  budget reached: {name} B{b} H{h} N{n} and after not timed")
            break
        q, k, v = (torch.randn(b, h, n, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        sc = 64 ** -0.5
        fns = [("step05", step05_pointer)] + [(vn, lambda *a, kw=kw: forward_persistent(*a, **kw))
                                             for vn, kw in VARIANTS.items()] + [("step05 again", step05_pointer)]
        row = {"shape": f"{name} B{b} H{h} N{n} D64 {'causal' if causal else 'full'}", "ms": {}}
        for label, f in fns:
            f(q, k, v, causal, sc)
            row["ms"][label] = round(float(triton.testing.do_bench(lambda: f(q, k, v, causal, sc), rep=300)), 4)
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]), torch.no_grad():
            row["ms"]["cudnn"] = round(float(triton.testing.do_bench(
                lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), rep=300)), 4)
        s05 = min(row["ms"]["step05"], row["ms"]["step05 again"])
        row["speedup"] = {vn: round(s05 / row["ms"][vn], 3) for vn in VARIANTS}
        best = max(row["speedup"], key=row["speedup"].get)
        row["step05_vs_cudnn"] = round(row["ms"]["cudnn"] / s05, 3)
        row["best"], row["best_vs_cudnn"] = best, round(row["ms"]["cudnn"] / row["ms"][best], 3)
        rows.append(row)
        log(f"  {row['shape']:<34} step05 {row['ms']['step05']:.3f}/{row['ms']['step05 again']:.3f}  "
            + " ".join(f"{vn} {x:.3f}x" for vn, x in row["speedup"].items())
            + f"  cuDNN {row['ms']['cudnn']:.3f} (step05 {row['step05_vs_cudnn']:.2f}, {best} {row['best_vs_cudnn']:.2f})")
        REC.result["timing_rows"] = rows
        REC.save()
    return {"rows": len(rows)}


def aot_check() -> int:
    """Compile the persistent kernel and step 05's for sm_90 (no GPU) at the leaderboard shape: registers,
    spills, shared memory, programs an SM (``triton_fwd_pipelined.aot_compile``)."""
    sys.path.insert(0, str(ROOT / "bench" / "experiments"))
    from triton_fwd_pipelined import aot_compile
    q = torch.empty(1, 16, 16384, 64, dtype=torch.bfloat16)
    lse = torch.empty(1, 16, 16384)
    fails = 0
    for causal in (True, False):
        cfg = S5.dense_fwd_config(16384, 16384, 64, torch.bfloat16, causal, "cuda", 16)
        opts = {k: cfg[k] for k in ("num_warps", "num_stages")}
        t = {k: v for k, v in tiles(cfg).items() if k != "HEADS_FIRST"}
        common = (q, q, q, q, lse, *q.stride(), *q.stride(), *q.stride(), *q.stride())
        kw = dict(HEAD_DIM=64, BLOCK_D=64, IS_CAUSAL=causal, DOT_PRECISION="tf32", **t, **opts)
        rows = [("step05", S5._attn_fwd_kernel, (128, 16), common + (16, 16384, 16384, 0.18),
                 dict(kw, HEADS_FIRST=cfg.get("HEADS_FIRST", False))),
                ("persistent snake", _attn_fwd_persistent, (264,), common + (16, 16, 16384, 16384, 128, 0.18),
                 dict(kw, ORDER=SNAKE)),
                ("persistent snake r128", _attn_fwd_persistent, (264,), common + (16, 16, 16384, 16384, 128, 0.18),
                 dict(kw, ORDER=SNAKE, maxnreg=128))]
        for name, kern, grid, a, k in rows:
            try:
                i = aot_compile(kern, grid, a, k)
                print(f"{'causal' if causal else 'full':7s} {name:18s} regs {i.get('regs')} spill "
                      f"{i.get('spill_stores')}/{i.get('spill_loads')} smem {i['shared_bytes'] // 1024}K "
                      f"programs/SM {i.get('ctas_per_sm')}", flush=True)
            except Exception as e:  # noqa: BLE001
                fails += 1
                print(f"{name}: FAIL {type(e).__name__}: {str(e)[:300]}")
    return 1 if fails else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--small", action="store_true", help="CPU: Triton's interpreter, correctness only")
    ap.add_argument("--budget-s", type=float, default=200)
    ap.add_argument("--aot-check", action="store_true", help="no GPU: compile for sm_90 and report registers")
    args = ap.parse_args()
    if args.aot_check:
        return aot_check()
    if args.small or not torch.cuda.is_available():
        r = correctness(True, "cpu")
        print(f"{r['wrong']} wrong")
        return 1 if r["wrong"] else 0
    if args.out is None:
        ap.error("--out DIR on a GPU")
    REC.open(args.out, ROOT)
    REC.result["gpu"] = torch.cuda.get_device_name()
    REC.result["sms"] = torch.cuda.get_device_properties(0).multi_processor_count

    @REC.part("1 correctness")
    def part1():
        r = correctness(False, "cuda")
        if r["wrong"]:
            raise AssertionError(f"{r['wrong']} cases with a wrong variant: not timed")
        return r
    part1()
    if not REC.result["parts"]["1 correctness"]["ok"]:
        log("not timed: part 1 failed")
        return 1

    @REC.part("2 forward timing")
    def part2():
        return timing(args.budget_s)
    part2()
    REC.save()
    log(f"wrote {REC.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
