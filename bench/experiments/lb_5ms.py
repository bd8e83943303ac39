"""Experiment: which tiles, launch orders and dP placements take step 06 toward 5.0 ms in CS336's harness?

Question. Issue 12 asks for <= 5.0 ms at CS336's leaderboard shape (B=1, H=16, N=16384, D=64, bf16, causal,
forward + backward, timed as CS336's README times it: ``torch.compile(FlashAttentionTriton.apply)``,
``o.sum().backward()``, the mean of ``do_bench(rep=10000, warmup=1000)``). Step 06 ran 5.37 ms there at 05f8bc2
(forward 1.36, dK/dV 2.51, dQ 1.44, preprocess 0.03). A copy of the dK/dV kernel in
``triton_dkdv_variants.py`` ran 1.06x faster with every head's heaviest key tiles first and without the early
dP. Step 06 now has both as config keys (``EARLY_DP``, ``HEADS_FIRST`` for the dK/dV and dQ kernels; step 05's
forward takes ``HEADS_FIRST``): how much does each pay in step 06 itself, what do the dQ kernel's and the
forward's tiles and orders give, and what does the best combination time in CS336's harness?

Method. Step 05 / 06 themselves (solutions/), each variant a ``config=`` dict: first checked at a small shape
(B=2, H=3, N=1000, D=64, bf16, causal) against the float64 reference (max error of O / dQ / dK / dV over the
table's own; a reordering must not change it by more than rounding), then timed at the leaderboard shape
(``do_bench`` median, rep 200 ms): the forward alone (``step05.forward``) and the backward alone
(``step06.backward``: preprocess, dK/dV, dQ). Then CS336's harness (``bench.gpu_check.cs336_leaderboard``'s
code, rep 3000 ms here) with the table as committed, the best forward + backward found, and SDPA's FLASH and
cuDNN backends in the same process; each variant enters the compiled call by replacing
``step05.dense_fwd_config`` / ``step06.bwd_config`` (with ``torch._dynamo.reset()`` between, since the
forward's config is read when the graph is traced).

    python bench/experiments/lb_5ms.py --out DIR          # an H200: about 3-4 minutes

Answer (two runs on two H200s, 2026-12-01 17:05 and 17:11 UTC; results/h200/triton/lb_5ms_1201_1705.json, .log
and lb_5ms_1201_1711.json, .log). Heads first pays in every kernel: the forward 1.327 -> 1.272 ms (1.258 in the
second run), the backward 3.951 -> 3.812 with the dK/dV kernel's, 3.83 -> 3.75 and 3.91 -> 3.82 with the dQ
kernel's. Four 4-warp programs of 32x64 an SM beat two 8-warp programs of 32x128 by about 1% (3.775-3.794 vs
3.822-3.831). The early dP is within 0.5% either way once several programs share an SM; without heads first
turning it off cost 4% (3.951 -> 4.104). No other forward or dQ tile, TMA at D=64 (1.337-1.367 vs 1.258-1.327),
nor the atomic dQ (4.28-5.53) paid. CS336's harness (rep 3000 ms in the first run, 10000 in the second):
05f8bc2's tables 5.33 ms, all of the above 5.06 (first run; cuDNN 4.47) and 5.14-5.16 (second; cuDNN 4.55):
5.0 not reached. Step 06 and step 05 took these tables (23218fc); `make gpu-check` measured them at 5.08 and
5.18 ms on two more H200s. What is left is inside each program: the softmax waits on every wgmma
(`triton_fwd_overlap.py`: Triton keeps no product in flight across the exponentials).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

T0 = time.time()


def log(msg):
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


FWD_TABLE = dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)
FWD_VARIANTS = {
    "table 128x64 w8 s3": FWD_TABLE,
    "table + heads-first": dict(FWD_TABLE, HEADS_FIRST=True),
    "128x64 w8 s4": dict(FWD_TABLE, num_stages=4),
    "128x64 w8 s2": dict(FWD_TABLE, num_stages=2),
    "128x128 w8 s3": dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3),
    "128x128 w8 s2": dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2),
    "128x64 w4 s3": dict(FWD_TABLE, num_warps=4),
    "64x64 w4 s3": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),
    "64x128 w4 s3": dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=3),
}

DKDV_OLD = dict(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=4, maxnreg=128, EARLY_DP=True, HEADS_FIRST=False)
DQ_TABLE = dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)


def bwd_variants(table):
    """name -> backward config (dq_mode separate); table = step 06's own config at the shape."""
    base = dict(pre=table["pre"], dq_mode="separate")
    dkdv_new, dq = table["dkdv"], table["dq"]
    out = {
        "dkdv as at 05f8bc2 (early dP, tiles first)": dict(base, dkdv=DKDV_OLD, dq=dq),
        "dkdv heads-first only": dict(base, dkdv=dict(DKDV_OLD, HEADS_FIRST=True), dq=dq),
        "dkdv no early dP only": dict(base, dkdv=dict(DKDV_OLD, EARLY_DP=False), dq=dq),
        "table (dkdv both)": dict(base, dkdv=dkdv_new, dq=dq),
        "dkdv 32x128 w8 s3 r128": dict(base, dkdv=dict(dkdv_new, num_stages=3), dq=dq),
        "dkdv 32x64 w4 s4 r128": dict(base, dkdv=dict(dkdv_new, BLOCK_N=64, num_warps=4), dq=dq),
        "dkdv 64x128 w8 s3 r128": dict(base, dkdv=dict(dkdv_new, BLOCK_M=64, num_stages=3), dq=dq),
        "dkdv 16x128 w8 s4 r128": dict(base, dkdv=dict(dkdv_new, BLOCK_M=16), dq=dq),
    }
    for name, d in {
        "dq early dP": dict(DQ_TABLE, EARLY_DP=True),
        "dq heads-first": dict(DQ_TABLE, HEADS_FIRST=True),
        "dq early dP + heads-first": dict(DQ_TABLE, EARLY_DP=True, HEADS_FIRST=True),
        "dq 128x64 w8 s4": dict(DQ_TABLE, num_stages=4),
        "dq 128x64 w8 s2": dict(DQ_TABLE, num_stages=2),
        "dq 128x128 w8 s2": dict(DQ_TABLE, BLOCK_N=128, num_stages=2),
        "dq 64x64 w4 s3": dict(DQ_TABLE, BLOCK_M=64, num_warps=4),
        "dq 128x32 w4 s3": dict(DQ_TABLE, BLOCK_N=32, num_warps=4),
        "dq 64x128 w4 s3": dict(DQ_TABLE, BLOCK_M=64, BLOCK_N=128, num_warps=4),
    }.items():
        out[name] = dict(base, dkdv=dkdv_new, dq=d)
    return out


# Round 2 (after round 1's answer): heads-first everywhere, the dK/dV tiles around round 1's best
# (32x64 on 4 warps, four programs an SM), dQ's near-ties with heads-first, and the atomic dQ
# (FlashAttention-2's way: no second pass, one fp32 add of each key tile's share of dQ).
FWD_VARIANTS_2 = {
    "table + heads-first": dict(FWD_TABLE, HEADS_FIRST=True),
    "128x64 w8 s4 + hf": dict(FWD_TABLE, num_stages=4, HEADS_FIRST=True),
    "64x64 w4 s3 + hf": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3, HEADS_FIRST=True),
    "64x128 w4 s3 + hf": dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=3, HEADS_FIRST=True),
    "64x64 w4 s4 + hf": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=4, HEADS_FIRST=True),
}


def bwd_variants_2(table):
    base = dict(pre=table["pre"], dq_mode="separate")
    hf = dict(EARLY_DP=False, HEADS_FIRST=True)
    dq_hf = dict(DQ_TABLE, HEADS_FIRST=True)
    kv = dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=4, maxnreg=128, **hf)
    out = {
        "table (dq tiles first)": dict(base, dkdv=table["dkdv"], dq=dict(DQ_TABLE, HEADS_FIRST=False)),
        "table dkdv + dq hf": dict(base, dkdv=table["dkdv"], dq=dq_hf),
        "dkdv 32x64 w4 s4 r128 + dq hf": dict(base, dkdv=kv, dq=dq_hf),
        "dkdv 32x64 w4 s3 r128 + dq hf": dict(base, dkdv=dict(kv, num_stages=3), dq=dq_hf),
        "dkdv 32x64 w4 s5 r128 + dq hf": dict(base, dkdv=dict(kv, num_stages=5), dq=dq_hf),
        "dkdv 32x64 w4 s4 r128 early dP + dq hf": dict(base, dkdv=dict(kv, EARLY_DP=True), dq=dq_hf),
        "dkdv 64x64 w4 s3 r128 + dq hf": dict(base, dkdv=dict(kv, BLOCK_M=64, num_stages=3), dq=dq_hf),
        "dkdv 16x64 w4 s4 r128 + dq hf": dict(base, dkdv=dict(kv, BLOCK_M=16), dq=dq_hf),
        "dkdv 32x64 w4 s4 r168 + dq hf": dict(base, dkdv=dict(kv, maxnreg=168), dq=dq_hf),
    }
    for name, d in {
        "dq 64x64 w4 s3 hf": dict(DQ_TABLE, BLOCK_M=64, num_warps=4, HEADS_FIRST=True),
        "dq 64x128 w4 s3 hf": dict(DQ_TABLE, BLOCK_M=64, BLOCK_N=128, num_warps=4, HEADS_FIRST=True),
        "dq 128x64 w8 s4 hf": dict(DQ_TABLE, num_stages=4, HEADS_FIRST=True),
        "dq 64x64 w4 s4 hf": dict(DQ_TABLE, BLOCK_M=64, num_warps=4, num_stages=4, HEADS_FIRST=True),
    }.items():
        out[name] = dict(base, dkdv=kv, dq=d)
    for name, d in {
        "atomic 32x128 w8 s4 r128": dict(table["dkdv"]),
        "atomic 64x128 w8 s3": dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=3, **hf),
        "atomic 32x64 w4 s4 r128": dict(kv),
        "atomic 64x128 w8 s3 early dP": dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=3, HEADS_FIRST=True),
    }.items():
        out[name] = dict(pre=table["pre"], dq_mode="atomic", dkdv=d, dq=DQ_TABLE)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--harness-rep-ms", type=int, default=3000)
    ap.add_argument("--round", type=int, default=1, choices=(1, 2))
    ap.add_argument("--smoke", action="store_true",
                    help="a CPU under TRITON_INTERPRET=1: tiny shapes, wall-clock timing, no compile (checks the script)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    import torch
    import torch.nn.functional as F
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attnlib.loader import load_step
    from attnlib.reference import reference_attention, reference_backward

    s5, s6 = load_step(5, "solutions"), load_step(6, "solutions")
    dev, dt = ("cpu", torch.float16) if args.smoke else ("cuda", torch.bfloat16)
    gpu = torch.cuda.get_device_name() if dev == "cuda" else "cpu (smoke)"
    result = dict(machine=gpu, torch=torch.__version__, triton=triton.__version__,
                  date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), shape="B=1 H=16 N=16384 D=64 bf16 causal",
                  fwd={}, bwd={}, check={}, harness={})

    # -- the check shape ---------------------------------------------------------------------------------
    g = torch.Generator(device=dev).manual_seed(0)
    cn = 100 if args.smoke else 1000
    cq, ck, cv = (torch.randn(2, 3, cn, 64, device=dev, dtype=dt, generator=g) for _ in range(3))
    cdo = torch.randn(2, 3, cn, 64, device=dev, dtype=dt, generator=g)
    ref_o = reference_attention(cq, ck, cv, True)[0]
    ref_g = reference_backward(cq, ck, cv, cdo, True)
    cscale = 64 ** -0.5

    def err(a, b):
        return float((a.double() - b.double()).abs().max())

    def check_fwd(cfg):
        o, _ = s5.forward(cq, ck, cv, True, cscale, config=cfg)
        return err(o, ref_o)

    def check_bwd(cfg):
        o, lse = s5.forward(cq, ck, cv, True, cscale)
        gr = s6.backward(cq, ck, cv, o, lse, cdo, True, cscale, config=cfg, dq_mode=cfg.get("dq_mode"))
        return max(err(a, b) / max(float(b.abs().max()), 1e-6) for a, b in zip(gr, ref_g))

    # -- the leaderboard shape --------------------------------------------------------------------------
    torch.manual_seed(0)
    B, H, N, D = (1, 2, 256, 64) if args.smoke else (1, 16, 16384, 64)
    q, k, v, do = (torch.randn(B, H, N, D, device=dev, dtype=dt) for _ in range(4))
    scale = D ** -0.5
    o, lse = s5.forward(q, k, v, True, scale)
    table = s6.bwd_config(N, N, D, torch.bfloat16, True, "cuda", B * H)
    result["bwd_table"] = {k_: v_ for k_, v_ in table.items() if k_ != "fused"}
    fwd_table = s5.dense_fwd_config(N, N, D, torch.bfloat16, True, "cuda", B * H) if not args.smoke else FWD_TABLE
    result["fwd_table"] = fwd_table

    def bench(fn, rep=200, warmup=50):
        if args.smoke:
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3
        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep))

    base_fwd_err = check_fwd(fwd_table)
    for name, cfg in (FWD_VARIANTS if args.round == 1 else FWD_VARIANTS_2).items():
        try:
            e = check_fwd(cfg)
            ok = e <= 1.5 * base_fwd_err + 1e-3
            ms = bench(lambda: s5.forward(q, k, v, True, scale, config=cfg)) if ok else None
            result["fwd"][name] = dict(cfg=cfg, err=e, ok=ok, ms=ms)
            log(f"fwd  {name:<40} err {e:.2e} {'ok ' if ok else 'BAD'} {ms if ms is None else f'{ms:.3f} ms'}")
        except Exception as e:  # noqa: BLE001 - a config that fails to compile is a row, not the end
            result["fwd"][name] = dict(cfg=cfg, error=f"{type(e).__name__}: {str(e)[:300]}")
            log(f"fwd  {name:<40} ERROR {type(e).__name__}: {str(e)[:200]}")
    try:
        ms = bench(lambda: s5.forward(q, k, v, True, scale, tma=True))
        e = err(s5.forward(cq, ck, cv, True, cscale, tma=True)[0], ref_o)
        result["fwd"]["tma=True (table tiles)"] = dict(ms=ms, err=e, ok=e <= 1.5 * base_fwd_err + 1e-3)
        log(f"fwd  tma=True (table tiles) err {e:.2e} {ms:.3f} ms")
    except Exception as e:  # noqa: BLE001
        log(f"fwd  tma ERROR {type(e).__name__}: {str(e)[:200]}")

    base_bwd_err = check_bwd(table)
    for name, cfg in (bwd_variants if args.round == 1 else bwd_variants_2)(table).items():
        try:
            e = check_bwd(cfg)
            ok = e <= 1.5 * base_bwd_err + 1e-3
            ms = bench(lambda: s6.backward(q, k, v, o, lse, do, True, scale, config=cfg, dq_mode=cfg["dq_mode"])) \
                if ok else None
            result["bwd"][name] = dict(cfg=cfg, err=e, ok=ok, ms=ms)
            log(f"bwd  {name:<40} err {e:.2e} {'ok ' if ok else 'BAD'} {ms if ms is None else f'{ms:.3f} ms'}")
        except Exception as e:  # noqa: BLE001
            result["bwd"][name] = dict(cfg=cfg, error=f"{type(e).__name__}: {str(e)[:300]}")
            log(f"bwd  {name:<40} ERROR {type(e).__name__}: {str(e)[:200]}")
    (args.out / "lb_5ms.json").write_text(json.dumps(result, indent=1, default=str))

    # -- best combination: the fastest forward, the fastest dkdv row, the fastest dq row ------------------
    def fastest(rows, prefix=""):
        good = {n: r for n, r in rows.items() if r.get("ok") and r.get("ms") and n.startswith(prefix)
                and "cfg" in r}
        return min(good.items(), key=lambda x: x[1]["ms"]) if good else (None, None)

    fbest_name, fbest = fastest(result["fwd"])
    if args.round == 1:
        kv_rows = {n: r for n, r in result["bwd"].items() if not n.startswith("dq ")}
        dq_rows = {n: r for n, r in result["bwd"].items() if n.startswith("dq ") or n == "table (dkdv both)"}
    else:
        kv_rows = {n: r for n, r in result["bwd"].items() if n.startswith(("dkdv", "table"))}
        dq_rows = {n: r for n, r in result["bwd"].items()
                   if n.startswith("dq ") or n == "dkdv 32x64 w4 s4 r128 + dq hf"}
    kbest_name, kbest = fastest(kv_rows)
    qbest_name, qbest = fastest(dq_rows)
    best_bwd = dict(table, dkdv=kbest["cfg"]["dkdv"], dq=qbest["cfg"]["dq"], dq_mode="separate")
    best_bwd.pop("fused", None)
    e = check_bwd(best_bwd)
    ms = bench(lambda: s6.backward(q, k, v, o, lse, do, True, scale, config=best_bwd))
    result["bwd"]["best dkdv + best dq"] = dict(cfg=best_bwd, err=e, ok=e <= 1.5 * base_bwd_err + 1e-3, ms=ms,
                                                from_=[kbest_name, qbest_name])
    log(f"bwd  best: {kbest_name} + {qbest_name}: err {e:.2e} {ms:.3f} ms")
    obest_name, obest = fastest(result["bwd"])          # any row, the atomic ones included
    result["best"] = dict(fwd=fbest_name, fwd_cfg=fbest["cfg"], bwd=best_bwd, any_bwd=obest_name)

    # -- CS336's harness ----------------------------------------------------------------------------------
    orig_fwd_cfg, orig_bwd_cfg = s5.dense_fwd_config, s6.bwd_config
    hq, hk, hv = torch.randn(3, H, N, D, device=dev, dtype=dt, requires_grad=True)

    def sdpa(q, k, v, is_causal):
        return F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=is_causal)[0]

    def harness(name, fn, backends, fwd_cfg=None, bwd_cfg=None):
        torch._dynamo.reset()
        s5.dense_fwd_config = (lambda *a, **kw: dict(fwd_cfg)) if fwd_cfg else orig_fwd_cfg
        s6.bwd_config = (lambda *a, **kw: dict(bwd_cfg)) if bwd_cfg else orig_bwd_cfg
        f = torch.compile(fn) if fn is not sdpa and not args.smoke else fn

        def step():
            out = f(hq, hk, hv, True)
            out.sum().backward()
        try:
            with sdpa_kernel(backends):
                ms = bench(step, rep=args.harness_rep_ms, warmup=500)
        except Exception as e:  # noqa: BLE001
            ms = f"error: {type(e).__name__}: {str(e)[:200]}"
        hq.grad = hk.grad = hv.grad = None
        result["harness"][name] = ms
        log(f"CS336 harness {name:<44} {ms}")
        s5.dense_fwd_config, s6.bwd_config = orig_fwd_cfg, orig_bwd_cfg

    if args.smoke:
        result["bwd_table"] = table = s6.bwd_config(N, N, D, dt, True, "cpu", B * H)
    every = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    apply = s6.FlashAttentionTriton.apply
    old_bwd = dict(table, dkdv=DKDV_OLD)
    harness("sdpa_flash", sdpa, [SDPBackend.FLASH_ATTENTION])
    harness("sdpa_cudnn", sdpa, [SDPBackend.CUDNN_ATTENTION])
    if args.round == 1:
        harness("step06 as at 05f8bc2 (dkdv early dP, tiles first)", apply, every, bwd_cfg=old_bwd)
        harness("step06 table", apply, every)
        harness("step06 best fwd + best bwd", apply, every, fwd_cfg=fbest["cfg"], bwd_cfg=best_bwd)
        harness("step06 table fwd + best bwd", apply, every, bwd_cfg=best_bwd)
    else:
        round1 = dict(table, dkdv=dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=4, maxnreg=128,
                                       EARLY_DP=False, HEADS_FIRST=True), dq=dict(DQ_TABLE, HEADS_FIRST=True))
        round1.pop("fused", None)
        harness("step06 round 1's best (fwd hf, dkdv 32x64 w4 s4 r128, dq hf)", apply, every,
                fwd_cfg=dict(FWD_TABLE, HEADS_FIRST=True), bwd_cfg=round1)
        harness("step06 round 2's best fwd + best dkdv + best dq", apply, every, fwd_cfg=fbest["cfg"], bwd_cfg=best_bwd)
        if obest_name != "best dkdv + best dq":
            harness(f"step06 best fwd + {obest_name}", apply, every, fwd_cfg=fbest["cfg"],
                    bwd_cfg=result["bwd"][obest_name]["cfg"])
        harness("step06 table", apply, every)
    harness("sdpa_flash again", sdpa, [SDPBackend.FLASH_ATTENTION])
    result["total_s"] = time.time() - T0
    (args.out / "lb_5ms.json").write_text(json.dumps(result, indent=1, default=str))
    log(f"wrote {args.out / 'lb_5ms.json'}")


if __name__ == "__main__":
    main()
