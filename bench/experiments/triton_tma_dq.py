"""Experiment: does dQ by Hopper's TMA reduce-add (no second pass) take step 06 below 5.0 ms in CS336's harness?

Question. Step 06's backward recomputes S and dP in a second kernel for dQ (7 tile products per pair of tiles
against 5): ncu (results/h200/triton/ncu/) puts cuDNN's backward lead at about that 1.39x of tensor work. The
way around it, FlashAttention-2's, is for each key tile's program to add its share of dQ into an fp32
buffer; with ``tl.atomic_add`` (a red.global per element) that was slower (4.28 ms backward against 3.77 at
the leaderboard shape, lb_5ms). FlashAttention-3 adds whole tiles with the TMA unit's bulk reduce
(``cp.reduce.async.bulk.tensor``), which Triton 3.6 emits for ``desc.atomic_add`` on a tensor descriptor:
step 06's ``dq_mode="atomic_tma"``. Is it right (every case against float64, beside the deterministic
mode's error), how fast is the backward with which dK/dV tiles, at the leaderboard shape and over
FlashAttention's grid, and what does CS336's harness time with it?

Method. Step 06 itself (solutions/), each variant a ``config=`` dict. (1) correctness: shapes with odd
lengths, Nq != Nk, a head dim that is not a power of two, fp32/fp16/bf16, causal and not, an expanded
(stride-0) dO, several dK/dV tiles; each mode's max error over the reference's max, "atomic_tma" against
"separate" at the same case. (2) the leaderboard shape (B=1, H=16, N=16384, D=64, bf16, causal): the
backward alone (``step06.backward``, do_bench median, rep 300 ms) for "separate" (the table), "atomic"
(pointers) and "atomic_tma" over dK/dV tiles. (3) FlashAttention's grid (B = 16384/N, H = 2048/D, N 1k/4k/16k,
D 64/128, causal and not): the backward, "separate" against "atomic_tma" with the table's dK/dV tiles and
two others. (4) CS336's harness (``bench.gpu_check.cs336_leaderboard``'s code, rep 3000 ms): SDPA's FLASH and
cuDNN, step 06's table, step 06 with the best "atomic_tma" tiles, the table again.

    python bench/experiments/triton_tma_dq.py --out DIR          # an H200: about 3-4 minutes

Answer (one H200, 2026-12-01 23:46 UTC at e25d6fe, the mode's commit; results/h200/triton/tma_dq_1201_2346.json,
.log). Right: 35 of 36 cases give atomic_tma the second pass's very error (dQ's max error equal to three digits:
the fp32 order changes nothing visible in bf16/fp16/fp32), the 36th a tile set that does not fit (128x128 at
D=128: 296 KB of shared memory, a launch error, not a wrong result). Not at the leaderboard shape: the best
dK/dV tiles with the reduce (64x64, 4 warps, no register cap) 3.91 ms against the second pass's 3.76-3.78; at
the second pass's own tiles (32x64, 4 warps, capped at 128 registers) 5.33 ms; pointer atomics 5.52. CS336's
harness: 5.33 ms with it against 5.09-5.11 for the table (cuDNN 4.50). Over the grid it pays only at D=128
causal with N >= 4096: 1.02x (N=4096) and 1.11x (N=16384) the second pass with the table's 64x128 dK/dV tiles;
0.62-0.99x at D=64, 0.88-0.96x at D=128 not causal. Step 06's table takes it there (``bwd_config``), the
second pass everywhere else and under ``torch.use_deterministic_algorithms``. Why not at D=64 was not
profiled; one difference: the bytes reduced per FLOP are 4 / (10 BLOCK_N) whatever D (a BLOCK_M x D fp32 share per
five BLOCK_M x BLOCK_N x D products), and the fast D=64 dK/dV tiles hold 64 keys where D=128's hold 128.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.experiments import gpu_run  # noqa: E402

REC = gpu_run.Record("triton_tma_dq")
log = REC.log

HF = dict(EARLY_DP=False, HEADS_FIRST=True)
DKDV_TILES = {        # name -> dK/dV config for "atomic_tma" (its BLOCK_M is also the reduce's box)
    "32x64 w4 s4 r128": dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=4, maxnreg=128, **HF),
    "32x64 w4 s3 r128": dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=3, maxnreg=128, **HF),
    "64x64 w4 s3 r128": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3, maxnreg=128, **HF),
    "64x64 w4 s3": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3, **HF),
    "16x64 w4 s4 r128": dict(BLOCK_M=16, BLOCK_N=64, num_warps=4, num_stages=4, maxnreg=128, **HF),
    "32x128 w8 s4 r128": dict(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=4, maxnreg=128, **HF),
    "64x128 w8 s3 r128": dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=3, maxnreg=128, **HF),
    "64x128 w8 s3": dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=3, **HF),
    "64x128 w8 s2": dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=2, **HF),
    "128x128 w8 s2": dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2, **HF),
    "64x128 w8 s3 early dP": dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=3, EARLY_DP=True,
                                  HEADS_FIRST=True),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--harness-rep-ms", type=int, default=3000)
    ap.add_argument("--skip-grid", action="store_true")
    args = ap.parse_args()
    REC.open(args.out, ROOT)

    import torch
    import torch.nn.functional as F
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attnlib.loader import load_step
    from attnlib.reference import reference_backward

    s5, s6 = load_step(5, "solutions"), load_step(6, "solutions")
    R = REC.result
    R["gpu"] = torch.cuda.get_device_name()
    R["triton"] = triton.__version__

    def bench(fn, rep=300, warmup=50):
        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep))

    def rel_err(got, ref):
        return max(float((a.double() - b.double()).abs().max()) / max(float(b.abs().max()), 1e-6)
                   for a, b in zip(got, ref))

    @REC.part("1 correctness")
    def correctness():
        tile_sets = [None, DKDV_TILES["64x128 w8 s3"], DKDV_TILES["16x64 w4 s4 r128"], DKDV_TILES["128x128 w8 s2"]]
        shapes = [  # B, H, Nq, Nk, D, causal, dtype, expanded dO
            (2, 3, 1000, 1000, 64, True, torch.bfloat16, False),
            (2, 3, 1000, 1000, 64, False, torch.bfloat16, False),
            (1, 2, 777, 777, 128, True, torch.float16, False),
            (1, 2, 513, 513, 40, True, torch.bfloat16, False),
            (1, 2, 300, 700, 64, False, torch.float16, False),
            (1, 2, 700, 300, 64, False, torch.bfloat16, False),
            (1, 2, 256, 256, 32, True, torch.float32, False),
            (1, 4, 1024, 1024, 64, True, torch.bfloat16, True),
            (3, 2, 129, 129, 16, True, torch.float16, False),
        ]
        rows = []

        def cases():
            for (B, H, nq, nk, D, causal, dt, expanded) in shapes:
                for tiles in tile_sets:
                    tag = f"B{B} H{H} Nq{nq} Nk{nk} D{D} {'causal' if causal else 'full'} {dt} " \
                          f"{'expanded dO ' if expanded else ''}tiles {tiles and (tiles['BLOCK_M'], tiles['BLOCK_N'])}"

                    def check(B=B, H=H, nq=nq, nk=nk, D=D, causal=causal, dt=dt, expanded=expanded, tiles=tiles,
                              tag=tag):
                        g = torch.Generator(device="cuda").manual_seed(nq * 7 + D)
                        q = torch.randn(B, H, nq, D, device="cuda", dtype=dt, generator=g)
                        k, v = (torch.randn(B, H, nk, D, device="cuda", dtype=dt, generator=g) for _ in range(2))
                        do = (torch.ones(1, 1, 1, 1, device="cuda", dtype=dt).expand(B, H, nq, D) if expanded
                              else torch.randn(B, H, nq, D, device="cuda", dtype=dt, generator=g))
                        scale = D ** -0.5
                        o, lse = s5.forward(q, k, v, causal, scale)
                        ref = reference_backward(q, k, v, do, causal)
                        table = s6.bwd_config(nq, nk, D, dt, causal, "cuda", B * H)
                        sep = s6.backward(q, k, v, o, lse, do, causal, scale, dq_mode="separate")
                        cfg = dict(table, dkdv=tiles) if tiles else table
                        tma = s6.backward(q, k, v, o, lse, do, causal, scale, config=cfg, dq_mode="atomic_tma")
                        e_sep, e_tma = rel_err(sep, ref), rel_err(tma, ref)
                        e_dq = (rel_err(sep[:1], ref[:1]), rel_err(tma[:1], ref[:1]))
                        rows.append(dict(case=tag, err_separate=e_sep, err_atomic_tma=e_tma,
                                         dq_err_separate=e_dq[0], dq_err_atomic_tma=e_dq[1]))
                        log(f"  {tag:<78} separate {e_sep:.2e}  atomic_tma {e_tma:.2e} (dQ {e_dq[0]:.2e} / {e_dq[1]:.2e})")
                        # fp32 accumulation in another order: the same error, not a different one
                        if not e_tma <= 1.5 * e_sep + 1e-3:
                            raise AssertionError(f"atomic_tma error {e_tma:.3e} against separate's {e_sep:.3e}")
                    yield tag, check
        rec = gpu_run.check_cases(cases(), log)
        rec["errors"] = rows
        return rec
    correctness()

    B, H, N, D = 1, 16, 16384, 64
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    scale = D ** -0.5
    o, lse = s5.forward(q, k, v, True, scale)
    table = s6.bwd_config(N, N, D, torch.bfloat16, True, "cuda", B * H)
    R["lb_table"] = {k_: v_ for k_, v_ in table.items() if k_ != "fused"}

    def time_bwd(cfg, mode, qq=q, kk=k, vv=v, oo=o, ll=lse, dd=do, causal=True):
        sc = qq.shape[-1] ** -0.5
        return bench(lambda: s6.backward(qq, kk, vv, oo, ll, dd, causal, sc, config=cfg, dq_mode=mode))

    @REC.part("2 leaderboard shape, backward")
    def leaderboard_bwd():
        rows = {}
        for name, cfg, mode in [("separate (table)", table, "separate"),
                                ("atomic pointers (table dK/dV)", table, "atomic"),
                                *[(f"atomic_tma {n}", dict(table, dkdv=t), "atomic_tma") for n, t in DKDV_TILES.items()],
                                ("separate (table) again", table, "separate")]:
            try:
                ms = time_bwd(cfg, mode)
                rows[name] = dict(ms=round(ms, 4), dkdv=cfg["dkdv"], mode=mode)
                log(f"  {name:<40} {ms:.3f} ms")
            except Exception as e:  # noqa: BLE001 -- a tile set that does not compile is a row
                rows[name] = dict(error=f"{type(e).__name__}: {str(e)[:300]}")
                log(f"  {name:<40} ERROR {type(e).__name__}: {str(e)[:300]}")
        return {"rows": rows}
    leaderboard_bwd()
    lb_rows = R["parts"]["2 leaderboard shape, backward"].get("rows", {})
    tma_rows = {n: r for n, r in lb_rows.items() if n.startswith("atomic_tma") and "ms" in r}
    best_name = min(tma_rows, key=lambda n: tma_rows[n]["ms"]) if tma_rows else None
    R["best_lb_tma"] = best_name
    best_dkdv = tma_rows[best_name]["dkdv"] if best_name else None

    @REC.part("3 grid, backward")
    def grid():
        rows = []
        for D_ in (64, 128):
            for N_ in (1024, 4096, 16384):
                for causal in (True, False):
                    B_, H_ = 16384 // N_, 2048 // D_
                    g = torch.Generator(device="cuda").manual_seed(1)
                    qq, kk, vv, dd = (torch.randn(B_, H_, N_, D_, device="cuda", dtype=torch.bfloat16, generator=g)
                                      for _ in range(4))
                    oo, ll = s5.forward(qq, kk, vv, causal, D_ ** -0.5)
                    tab = s6.bwd_config(N_, N_, D_, torch.bfloat16, causal, "cuda", B_ * H_)
                    row = dict(B=B_, H=H_, N=N_, D=D_, causal=causal)
                    cands = [("separate", tab, "separate"), ("atomic_tma table", tab, "atomic_tma"),
                             ("atomic_tma 64x128 w8 s3", dict(tab, dkdv=DKDV_TILES["64x128 w8 s3"]), "atomic_tma")]
                    if best_dkdv and best_name != "atomic_tma 64x128 w8 s3":
                        cands.append(("atomic_tma lb best", dict(tab, dkdv=best_dkdv), "atomic_tma"))
                    for name, cfg, mode in cands:
                        try:
                            row[name] = round(time_bwd(cfg, mode, qq, kk, vv, oo, ll, dd, causal), 4)
                        except Exception as e:  # noqa: BLE001
                            row[name] = f"error: {type(e).__name__}: {str(e)[:200]}"
                    sep = row["separate"]
                    log(f"  D={D_:<3} N={N_:<5} {'causal' if causal else 'full  '} " + "  ".join(
                        f"{n} {v_:.3f}" + (f" ({sep / v_:.2f}x)" if isinstance(v_, float) and n != "separate" else "")
                        if isinstance(v_, float) else f"{n} {v_}" for n, v_ in row.items()
                        if n not in ("B", "H", "N", "D", "causal")))
                    rows.append(row)
                    del qq, kk, vv, dd, oo, ll
        return {"rows": rows}
    if not args.skip_grid:
        grid()

    @REC.part("4 CS336 harness")
    def harness():
        orig = s6.bwd_config
        hq, hk, hv = torch.randn(3, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)

        def sdpa(q, k, v, is_causal):
            return F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=is_causal)[0]
        every = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                 SDPBackend.MATH]
        out = {}

        def run(name, fn, backends, bwd_cfg=None):
            torch._dynamo.reset()
            s6.bwd_config = (lambda *a, **kw: dict(bwd_cfg)) if bwd_cfg else orig
            f = fn if fn is sdpa else torch.compile(fn)

            def step():
                f(hq, hk, hv, True).sum().backward()
            try:
                with sdpa_kernel(backends):
                    out[name] = round(bench(step, rep=args.harness_rep_ms, warmup=500), 4)
            except Exception as e:  # noqa: BLE001
                out[name] = f"error: {type(e).__name__}: {str(e)[:200]}"
            finally:
                s6.bwd_config = orig
            hq.grad = hk.grad = hv.grad = None
            log(f"  {name:<50} {out[name]}")

        apply = s6.FlashAttentionTriton.apply
        run("sdpa_flash", sdpa, [SDPBackend.FLASH_ATTENTION])
        run("sdpa_cudnn", sdpa, [SDPBackend.CUDNN_ATTENTION])
        run("step06 table", apply, every)
        if best_dkdv:
            run(f"step06 {best_name}", apply, every, dict(table, dkdv=best_dkdv, dq_mode="atomic_tma"))
        run("step06 table again", apply, every)
        run("sdpa_cudnn again", sdpa, [SDPBackend.CUDNN_ATTENTION])
        return out
    harness()
    R["total_s"] = round(time.time() - gpu_run_T0, 1)
    REC.save()
    log(f"wrote {REC.json_path}")


gpu_run_T0 = time.time()

if __name__ == "__main__":
    main()
