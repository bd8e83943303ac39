"""Experiment: which tiles and register cap make step 09's backward fastest, now that its ranges run in stages?

Question. Step 09's dK/dV kernel took step 06's table for causal D <= 64 (32x128 tiles on 8 warps, capped
at 128 registers so that two programs share an SM). Compiled for sm_90 (``--aot-check`` below, no GPU),
the old single loop with a per-tile ``if`` on the mask spilled 308 bytes a thread under that cap; walking
each range masked / unmasked / masked (the mask a compile-time flag, as step 06 walks the diagonal) brought
it to 56, and the dQ kernel runs at 180 registers, one program per SM, where step 06's runs two. Which
of these tiles / caps is fastest, per kernel, at the benchmark's shapes, and how does step 09 then stand
against FlexAttention in the same run?

Answer (one H200 run, 2026-12-01 05:30 UTC, with the stages and steps 05/06's tables, then named "table";
results/h200/sparse/sparse_bwd_tiles.json and .log; told in results/h200/sparse/README.md, "Fourth run").
Forward: step 05's 128x64 on 8 warps capped at 128 registers (no spill, two programs per SM) 1.25-1.33x
faster than uncapped (178 registers). dK/dV: 32x64 on 4 warps 1-14% faster than step 06's capped 32x128
(56 bytes of spills), which beat it uncapped by 12-16%. dQ: capped at 128 registers, about 6% faster.
All three went into step 09's ``sparse_fwd_config`` / ``sparse_bwd_config``; the variants are now named
against that table, with "step06-table" / "fwd-step05-table" for what the run called "table".

Forward follow-up (--fwd-only, one H200 run at 295108e, 2026-12-01 12:49 UTC;
results/h200/sparse/sparse_fwd_tiles_295108e.json and .log, the JSON renamed from sparse_bwd_tiles.json): do
FlexAttention's 128-key tiles (its forward at window 256: 128x128 on 4 warps, 255 registers,
sparse_vs_flex_ncu.py) help step 09's forward? No. N = 32768, window 256: the table (128x64, 8 warps, capped at
128 registers) 0.281 ms (0.87x FlexAttention), 128x64 on 4 warps 0.279, 128x128 on 4 warps 0.454, the same with
2 stages 0.347, 64x128 on 4 warps 0.378, 128x128 on 8 warps capped at 128 registers 0.318. At 32768 window 4096,
65536 window 256 with 64 global tokens and 65536 window 1024 the table is the fastest or within 1% (1.03x,
1.10x, 0.98x FlexAttention). At 16384 the rows measure the host (the same config 0.184 and 0.156 ms in one
row). The table stays; the forward's gap is in the instructions it issues (sparse_vs_flex_ncu.py's answer).

Kernels: step 09's own (solutions/, through attnlib.loader); only ``sparse_bwd_config`` is replaced for a
variant, so every variant runs the same code. Each variant's dQ, dK, dV are checked against the
table's on the timed shape before it is timed (same math, other tiles: max |diff| <= 2e-2 in bf16),
and the table's against FlexAttention's gradients.

    python bench/experiments/sparse_bwd_tiles.py --out DIR [--budget-s 150]   # an H200
    python bench/experiments/sparse_bwd_tiles.py --fwd-only --out DIR          # the forward variants only
    python bench/experiments/sparse_bwd_tiles.py --aot-check                    # no GPU: registers, spills
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

T0 = time.time()
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "experiments"))

import torch  # noqa: E402
import triton  # noqa: E402

from attnlib.loader import load_step  # noqa: E402

# Variants: what replaces step 09's table entry for one kernel ("dkdv" or "dq"); "table" replaces nothing.
# "step06-table" is what step 09 launched before it had a table of its own (step 06's causal D <= 64 tiles).
VARIANTS = {
    "table": {},
    "step06-table": {"dkdv": dict(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=4, maxnreg=128),
                     "dq": dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3)},
    "dkdv-nocap": {"dkdv": dict(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=4)},
    "dkdv-32x64w4": {"dkdv": dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=3)},
    "dkdv-64x64w4": {"dkdv": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)},
    "dq-cap128": {"dq": dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, maxnreg=128)},
    "dq-64x64w4": {"dq": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)},
    "dq-64x128w8": {"dq": dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=3)},
}
# The forward's: step 09's table is step 05's (causal D <= 64: 128x64 on 8 warps, 3 stages) capped at 128
# registers; each variant replaces all of it ("fwd-step05-table": the cap off).
FWD_VARIANTS = {
    "fwd-table": {},
    "fwd-step05-table": dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
    "fwd-cap128": dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, maxnreg=128),
    "fwd-128x128w8": dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3),
    "fwd-64x64w4": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),
    # 12-01 (--fwd-only): FlexAttention's own forward at window 256 runs 128x128 tiles on 4 warps, 255 registers,
    # two programs per SM (ncu, bench/experiments/sparse_vs_flex_ncu.py); 64-key tiles rescale the accumulator
    # twice as often per key.
    "fwd-128x128w4": dict(BLOCK_M=128, BLOCK_N=128, num_warps=4, num_stages=3),
    "fwd-128x128w4s2": dict(BLOCK_M=128, BLOCK_N=128, num_warps=4, num_stages=2),
    "fwd-64x128w4": dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=3),
    "fwd-128x128w8cap128": dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3, maxnreg=128),
    "fwd-128x64w4": dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3),
}


SHAPES = [(32768, 256, 0), (32768, 4096, 0), (65536, 256, 64), (65536, 1024, 0), (16384, 256, 0)]
H, D = 16, 64


def patched(s9, over):
    """``s9.sparse_bwd_config`` with ``over``'s kernels replaced (a context: the table comes back after)."""
    real = s9.sparse_bwd_config

    class _Ctx:
        def __enter__(self):
            s9.sparse_bwd_config = lambda nq, nk, d, dt, c, dev, bh=1: {**real(nq, nk, d, dt, c, dev, bh), **over}

        def __exit__(self, *exc):
            s9.sparse_bwd_config = real
    return _Ctx()


def aot_check():
    import triton_dkdv_variants as tv
    from triton_lb_variants import record_launches
    os.environ.pop("TRITON_INTERPRET", None)
    s9 = load_step(9, "solutions")
    fc, bc = s9.sparse_fwd_config, s9.sparse_bwd_config
    s9.sparse_fwd_config = lambda nq, nk, d, dt, c, dev, bh=1: fc(nq, nk, d, dt, c, "cuda", bh)
    N, W, G = 32768, 4096, 0
    q, k, v, o, do = (torch.empty(1, H, N, D, dtype=torch.bfloat16) for _ in range(5))
    lse = torch.empty(1, H, N, dtype=torch.float32)
    print(tv.AOT_HEADER)
    for name, over in VARIANTS.items():
        s9.sparse_bwd_config = lambda nq, nk, d, dt, c, dev, bh=1, over=over: {**bc(nq, nk, d, dt, c, "cuda", bh), **over}
        log, _ = record_launches(s9, lambda: s9.backward(q, k, v, o, lse, do, W, G, True, D ** -0.5), run=False)
        for kn, kern, grid, args, kw in log:
            if over and not any(x in kn for x in over):
                continue
            i = tv.aot_compile(tv.Launch(kn, kern, grid, args, kw))
            print(tv.aot_line(f"{name}:{kn.replace('_sparse_', '').replace('_kernel', '')}", i), flush=True)
    for name, cfg in FWD_VARIANTS.items():
        s9.sparse_fwd_config = lambda nq, nk, d, dt, c, dev, bh=1, cfg=cfg: cfg or fc(nq, nk, d, dt, c, "cuda", bh)
        log, _ = record_launches(s9, lambda: s9.forward(q, k, v, W, G, True, D ** -0.5), run=False)
        for kn, kern, grid, args, kw in log:
            i = tv.aot_compile(tv.Launch(kn, kern, grid, args, kw))
            print(tv.aot_line(f"{name}", i), flush=True)
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--budget-s", type=float, default=150)
    ap.add_argument("--aot-check", action="store_true")
    ap.add_argument("--fwd-only", action="store_true", help="only the forward variants (and FlexAttention's forward)")
    args = ap.parse_args()
    if args.aot_check:
        return aot_check()
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from bench.core import machine_info
    from bench.sparse_gpu import make_mask_mod
    s9 = load_step(9, "solutions")
    flex = torch.compile(flex_attention)
    out = {"machine": machine_info(), "H": H, "D": D, "dtype": "bfloat16", "causal": True,
           "variants": {k: v for k, v in VARIANTS.items()}, "rows": []}

    def save():
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "sparse_bwd_tiles.json").write_text(json.dumps(out, indent=1) + "\n")

    for N, w, g in SHAPES:
        if time.time() - T0 > args.budget_s:
            out["rows"].append({"N": N, "window": w, "n_global": g, "status": "skipped: budget"})
            continue
        torch._dynamo.reset()
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        do = torch.randn_like(q)
        scale = D ** -0.5
        row = {"N": N, "window": w, "n_global": g}
        o, lse = s9.forward(q, k, v, w, g, True, scale)
        base = s9.backward(q, k, v, o, lse, do, w, g, True, scale)
        # the table's gradients against FlexAttention's
        bm = create_block_mask(make_mask_mod(w, g), 1, 1, N, N, device="cuda")
        qf, kf, vf = (t.clone().requires_grad_() for t in (q, k, v))
        of = flex(qf, kf, vf, block_mask=bm)
        of.backward(do)
        row["table_vs_flex_max_abs"] = [float((a - b.grad).abs().max()) for a, b in zip(base, (qf, kf, vf))]

        def flex_fb():
            flex(qf, kf, vf, block_mask=bm).backward(do)
        row["flex_fwd_ms"] = float(triton.testing.do_bench(lambda: flex(q, k, v, block_mask=bm), warmup=25, rep=100))
        row["flex_fwd_bwd_ms"] = float(triton.testing.do_bench(flex_fb, warmup=25, rep=100))
        row["step09_fwd_ms"] = float(triton.testing.do_bench(lambda: s9.forward(q, k, v, w, g, True, scale),
                                                             warmup=25, rep=100))
        row["variants"] = {}
        for name, over in ({} if args.fwd_only else VARIANTS).items():
            r = {}
            try:
                with patched(s9, over):
                    got = s9.backward(q, k, v, o, lse, do, w, g, True, scale)
                    diff = max(float((a - b).abs().max()) for a, b in zip(got, base))
                    r["max_abs_vs_table"] = diff
                    if diff > 2e-2:
                        r["status"] = "mismatch: not timed"
                    else:
                        r["bwd_ms"] = float(triton.testing.do_bench(
                            lambda: s9.backward(q, k, v, o, lse, do, w, g, True, scale), warmup=25, rep=100))
                        r["fwd_bwd_vs_flex"] = round(row["flex_fwd_bwd_ms"] / (row["step09_fwd_ms"] + r["bwd_ms"]), 3)
                        r["status"] = "ok"
            except Exception as exc:  # noqa: BLE001 - recorded per variant
                r["status"] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            row["variants"][name] = r
            print(N, w, g, name, r, flush=True)
        row["fwd_variants"] = {}
        real_fc = s9.sparse_fwd_config
        for name, cfg in FWD_VARIANTS.items():
            r = {}
            try:
                s9.sparse_fwd_config = (lambda nq, nk, d, dt, c, dev, bh=1, cfg=cfg: cfg) if cfg else real_fc
                o2, _ = s9.forward(q, k, v, w, g, True, scale)
                r["max_abs_vs_table"] = float((o2 - o).abs().max())
                if r["max_abs_vs_table"] > 2e-2:
                    r["status"] = "mismatch: not timed"
                else:
                    r["fwd_ms"] = float(triton.testing.do_bench(lambda: s9.forward(q, k, v, w, g, True, scale),
                                                                warmup=25, rep=100))
                    r["fwd_vs_flex"] = round(row["flex_fwd_ms"] / r["fwd_ms"], 3)
                    r["status"] = "ok"
            except Exception as exc:  # noqa: BLE001 - recorded per variant
                r["status"] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            finally:
                s9.sparse_fwd_config = real_fc
            row["fwd_variants"][name] = r
            print(N, w, g, name, r, flush=True)
        row["fwd_vs_flex"] = round(row["flex_fwd_ms"] / row["step09_fwd_ms"], 3)
        out["rows"].append(row)
        print({k: v for k, v in row.items() if k not in ("variants", "fwd_variants")}, flush=True)
        save()
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
