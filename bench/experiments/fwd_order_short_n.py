"""Does step 05's causal forward pay for its heads in groups below N = 4096?

Question: the grid of 2026-12-04 11:58 (results/h200/grid_1204c/) read step 05's D=64 causal forward at N=1024
0.309 ms against 0.250 at 03:22, the one cell that moved; groups (HEAD_GROUP = head_group()) were only ever timed
from N = 2048 (fwd_tile_order_1204). This times, at FlashAttention's grid (B = 16384/N, H = 2048/D), bf16, causal,
N 512-2048, D 64 and 128: step 05 as shipped (its config, heads in groups), every head at once (HEAD_GROUP=0), one
head after another (HEADS_FIRST=False, D=128's order before), and cuDNN, in three alternated rounds, each timed by
the grid's own timer (``bench.core.time_ms``: do_bench median) with the grid's callables for step 05 and cuDNN.

    python bench/experiments/fwd_order_short_n.py --out DIR      # a GPU; writes DIR/fwd_order_short_n.json
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from attnlib.inputs import make_qkv
    from attnlib.loader import load_step
    from attnlib.reference import reference_attention
    from bench.core import implementations, machine_info, time_ms
    s5 = load_step(5, "solutions")
    impls = implementations("solutions", "cuda")

    def order(heads_first):          # step 05's own config, only the order changed (0: every head at once)
        def fn(q, k, v, c):
            B, H, N, D = q.shape
            cfg = dict(s5.dense_fwd_config(N, N, D, q.dtype, c, "cuda", B * H), HEADS_FIRST=heads_first, HEAD_GROUP=0)
            return s5.forward(q, k, v, c, D ** -0.5, config=cfg)[0]
        return fn

    # the grid's own callables for step 05 as shipped and cuDNN, timed by the grid's own timer (bench.core.time_ms)
    variants = {"shipped": impls["step05"], "all heads": order(True), "head by head": order(False),
                "cudnn": impls["sdpa-cudnn"]}
    rows = []
    for d in (64, 128):
        for n in (512, 1024, 2048):
            B, H = 16384 // n, 2048 // d
            q, k, v = make_qkv(B, H, n, n, d, dtype=torch.bfloat16, device="cuda")
            ref = reference_attention(q[:1], k[:1], v[:1], True)[0]       # float64, the first batch
            errs = {name: float((fn(q, k, v, True)[:1].double() - ref).abs().max()) for name, fn in variants.items()}
            times = {name: [] for name in variants}
            for _ in range(args.rounds):
                for name, fn in variants.items():
                    times[name].append(round(time_ms(lambda: fn(q, k, v, True), "cuda"), 4))
            med = {x: sorted(t)[len(t) // 2] for x, t in times.items()}
            row = {"B": B, "H": H, "N": n, "D": d, "head_group": s5.head_group(n, d, 2),
                   "config": s5.dense_fwd_config(n, n, d, torch.bfloat16, True, "cuda", B * H),
                   "ms": times, "median_ms": med, "max_err_vs_float64": errs,
                   "vs_cudnn": {x: round(med["cudnn"] / t, 3) for x, t in med.items() if x != "cudnn"}}
            rows.append(row)
            print(f"D={d} N={n} B={B} H={H} group={row['head_group']}: " +
                  " | ".join(f"{x} {m:.4f}" + (f" ({row['vs_cudnn'][x]:.2f}x)" if x != 'cudnn' else '')
                             for x, m in med.items()) + f" | err {max(errs.values()):.1e}", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = dict(machine_info(), date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), argv=sys.argv)
    (out / "fwd_order_short_n.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
