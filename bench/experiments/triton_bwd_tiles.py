"""Experiment: registers and occupancy of the backward kernels at D = 128 (step 06) and in step 08's dQ.

Question. Compiled for sm_90 without a GPU (``--aot-check``), two backward kernels run one program per SM
or spill where another tile or a register cap would not:

  * step 06's dK/dV kernel at D = 128 (64x128 tiles, 8 warps, 2 stages): 254 registers causal, one
    program per SM; not causal 255 and **28 bytes a thread spilled (48 reloaded)**. 32x64 on 4 warps
    compiles to 238 / 225 registers, no spill, two programs per SM; 32x128 on 8 warps to 220 / 255, no
    spill, one program. The D = 128 rows are where step 06 is furthest from cuDNN (0.71-0.73x forward +
    backward, issue 17's table);
  * step 08's dQ kernel at D = 64 (step 06's 128x64 tiles, 8 warps): 136-139 registers, one program per
    SM, where step 06's own dQ kernel fits in 128 (two). Capped at 128 (``maxnreg``) it compiles with
    no spill. Step 09's dQ, the same situation, ran about 6% faster capped
    (bench/experiments/sparse_bwd_tiles.py).

Which pays on the H200? Each variant's gradients are checked against the table's on the timed inputs
(the same maths on other tiles: max |diff| <= 2e-2 in bf16), then the backward is timed (do_bench,
median), beside the forward and SDPA's cuDNN and FLASH backends (forward + backward) in the same run.

Answer (H200, 2026-12-01, main at f9d30fa; results/h200/triton/bwd_tiles.json, bwd_tiles.log). Every
variant's gradients equal the table's (max |diff| 0):

  * step 06 at D = 128: **no**. The table's 64x128 tiles (one program per SM, spilling) stay fastest at
    every shape: backward 2.18 / 3.62 / 7.67 / 14.51 ms (B=4 N=4k causal, not; B=1 N=16k causal, not)
    against 2.22 / 4.18 / 8.00 / 16.31 on 32x64 tiles, 4 warps, and 2.45 / 3.96 / 8.58 / 15.71 on
    32x128, 8 warps. Two programs per SM do not pay for tiles that read K/V's partner rows twice as often;
    the gap to cuDNN at D = 128 (0.71-0.77x forward + backward here) is not occupancy of this kind.
  * step 08's dQ: **yes, a little**. On the 16k-token ragged batch (D = 64): backward 1.142 / 1.742 ms
    (causal / not) with the table, 1.061 / 1.677 capped at 128 registers, **1.043 / 1.659 on 64x64 tiles,
    4 warps**: 5-9%. Step 08 now takes 64x64 on 4 warps for its dQ at D <= 64 in 16 bits on a GPU.

Kernels: the steps' own (solutions/, through attnlib.loader); only the tile table is replaced, through
``backward(..., config=)`` for step 06 and ``bwd_config`` in step 08's module for step 08.

    python bench/experiments/triton_bwd_tiles.py --aot-check        # no GPU: registers, spills, programs per SM
    python bench/experiments/triton_bwd_tiles.py --out DIR          # a Hopper GPU, about 1-2 minutes
    python bench/experiments/triton_bwd_tiles.py --cpu-check        # no GPU: the same run, tiny, fp32, interpreter
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import os

T0 = time.time()
CPU = "--cpu-check" in sys.argv
if CPU:
    os.environ["TRITON_INTERPRET"] = "1"          # before triton is imported
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "experiments"))

import torch  # noqa: E402
import triton  # noqa: E402

from attnlib.loader import load_step  # noqa: E402

S6_D128 = {                                   # replaces step 06's "dkdv" entry
    "table": None,
    "dkdv-32x64w4": dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=3),
    "dkdv-32x128w8": dict(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=2),
}
S8_DQ = {                                     # replaces step 08's "dq" entry (D <= 64)
    "table": None,
    "dq-cap128": dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, maxnreg=128),
    "dq-64x64w4": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),
}


DEV = "cpu" if CPU else "cuda"
DT = torch.float32 if CPU else torch.bfloat16


def s6_config(s6, N, D, causal, bh, dkdv):
    cfg = dict(s6.bwd_config(N, N, D, DT, causal, DEV, bh), dq_mode="separate")
    return cfg if dkdv is None else dict(cfg, dkdv=dkdv)


class _S8Table:
    """Step 08's ``bwd_config`` with its dQ entry replaced while the context lasts."""

    def __init__(self, s8, dq, device=DEV):
        self.s8, self.dq, self.device, self.real = s8, dq, device, s8.bwd_config

    def __enter__(self):
        real, dq, dev = self.real, self.dq, self.device
        self.s8.bwd_config = lambda nq, nk, d, dt, c, _dev, bh=1: (
            real(nq, nk, d, dt, c, dev, bh) if dq is None else dict(real(nq, nk, d, dt, c, dev, bh), dq=dq))

    def __exit__(self, *exc):
        self.s8.bwd_config = self.real


def varlen_batch(tokens=16384, seed=0):
    from bench.varlen_gpu import lengths
    ns = [70, 33, 130] if CPU else lengths(tokens, seed)
    cu = torch.tensor([0] + torch.tensor(ns).cumsum(0).tolist(), dtype=torch.int32)
    return ns, cu


def aot_check():
    import triton_dkdv_variants as tv
    from triton_lb_variants import record_launches
    s6, s8 = load_step(6, "solutions"), load_step(8, "solutions")
    print(tv.AOT_HEADER)
    B, H, N, D = 4, 16, 4096, 128
    q, k, v, o, do = (torch.empty(B, H, N, D, dtype=torch.bfloat16) for _ in range(5))
    lse = torch.empty(B, H, N, dtype=torch.float32)
    for causal in (True, False):
        for name, dkdv in S6_D128.items():
            c = s6_config(s6, N, D, causal, B * H, dkdv)
            log, _ = record_launches(s6, lambda: s6.backward(q, k, v, o, lse, do, causal, D ** -0.5, config=c,
                                                             dq_mode="separate"), run=False)
            for kn, kern, grid, args, kw in log:
                if "dkdv" in kn:
                    i = tv.aot_compile(tv.Launch(kn, kern, grid, args, kw))
                    print(tv.aot_line(f"s06 D128 {'c' if causal else 'f'} {name}", i), flush=True)
    ns, cu = varlen_batch()
    T, mx, D = int(cu[-1]), max(ns), 64
    q, k, v, o, do = (torch.empty(T, H, D, dtype=torch.bfloat16) for _ in range(5))
    lse = torch.empty(H, T, dtype=torch.float32)
    s8.fwd_config = (lambda real: lambda nq, nk, d, dt, c, dev, bh=1: real(nq, nk, d, dt, c, "cuda", bh))(s8.fwd_config)
    for causal in (True, False):
        for name, dq in S8_DQ.items():
            with _S8Table(s8, dq):
                log, _ = record_launches(s8, lambda: s8.backward(q, k, v, o, lse, do, cu, cu, mx, mx, causal,
                                                                 D ** -0.5), run=False)
            for kn, kern, grid, args, kw in log:
                if "dq" in kn:
                    i = tv.aot_compile(tv.Launch(kn, kern, grid, args, kw))
                    print(tv.aot_line(f"s08 D64 {'c' if causal else 'f'} {name}", i), flush=True)
    return 0


def bench(fn):
    if CPU:                                       # the interpreter: run it once, time nothing
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    return float(triton.testing.do_bench(fn, warmup=25, rep=100))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--budget-s", type=float, default=120)
    ap.add_argument("--aot-check", action="store_true")
    ap.add_argument("--cpu-check", action="store_true")
    args = ap.parse_args()
    if args.aot_check:
        return aot_check()
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from bench.core import machine_info
    s5, s6, s8 = load_step(5, "solutions"), load_step(6, "solutions"), load_step(8, "solutions")
    out = {"machine": machine_info(), "dtype": "bfloat16", "step06_d128": [], "step08_dq": []}

    def save():
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "bwd_tiles.json").write_text(json.dumps(out, indent=1) + "\n")

    for (B, H, N) in ([(1, 1, 96)] if CPU else [(4, 16, 4096), (1, 16, 16384)]):
        for causal in (True, False):
            if time.time() - T0 > args.budget_s:
                break
            D = 32 if CPU else 128
            torch.manual_seed(0)
            q, k, v = (torch.randn(B, H, N, D, device=DEV, dtype=DT) for _ in range(3))
            do = torch.randn_like(q)
            scale = D ** -0.5
            o, lse = s5.forward(q, k, v, causal, scale)
            row = {"B": B, "H": H, "N": N, "D": D, "causal": causal,
                   "fwd_ms": bench(lambda: s5.forward(q, k, v, causal, scale))}
            for name, be in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
                qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))

                def fb():
                    with sdpa_kernel(be):
                        F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal).backward(do)
                try:
                    row[f"{name}_fwd_bwd_ms"] = bench(fb)
                except Exception as exc:  # noqa: BLE001 - cuDNN has no CPU kernel: --cpu-check records it
                    row[f"{name}_fwd_bwd_ms"] = float("nan")
                    row[f"{name}_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            base = s6.backward(q, k, v, o, lse, do, causal, scale, config=s6_config(s6, N, D, causal, B * H, None),
                               dq_mode="separate")
            row["variants"] = {}
            for name, dkdv in S6_D128.items():
                c = s6_config(s6, N, D, causal, B * H, dkdv)
                r = {}
                try:
                    got = s6.backward(q, k, v, o, lse, do, causal, scale, config=c, dq_mode="separate")
                    r["max_abs_vs_table"] = max(float((a - b).abs().max()) for a, b in zip(got, base))
                    if r["max_abs_vs_table"] <= 2e-2:
                        r["bwd_ms"] = bench(lambda: s6.backward(q, k, v, o, lse, do, causal, scale, config=c,
                                                                dq_mode="separate"))
                        r["fwd_bwd_vs_cudnn"] = round(row["sdpa_cudnn_fwd_bwd_ms"] / (row["fwd_ms"] + r["bwd_ms"]), 3)
                except Exception as exc:  # noqa: BLE001 - recorded per variant
                    r["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                row["variants"][name] = r
            out["step06_d128"].append(row)
            print(row, flush=True)
            save()
    ns, cu = varlen_batch()
    cu = cu.to(DEV)
    T, mx, H, D = int(cu[-1]), max(ns), (2 if CPU else 16), (32 if CPU else 64)
    for causal in (True, False):
        torch.manual_seed(0)
        q, k, v = (torch.randn(T, H, D, device=DEV, dtype=DT) for _ in range(3))
        do = torch.randn_like(q)
        scale = D ** -0.5
        o, lse = s8.forward(q, k, v, cu, cu, mx, mx, causal, scale)
        with _S8Table(s8, None):
            base = s8.backward(q, k, v, o, lse, do, cu, cu, mx, mx, causal, scale)
        row = {"lengths": ns, "H": H, "D": D, "causal": causal, "variants": {}}
        for name, dq in S8_DQ.items():
            r = {}
            try:
                with _S8Table(s8, dq):
                    got = s8.backward(q, k, v, o, lse, do, cu, cu, mx, mx, causal, scale)
                    r["max_abs_vs_table"] = max(float((a - b).abs().max()) for a, b in zip(got, base))
                    if r["max_abs_vs_table"] <= 2e-2:
                        r["bwd_ms"] = bench(lambda: s8.backward(q, k, v, o, lse, do, cu, cu, mx, mx, causal, scale))
            except Exception as exc:  # noqa: BLE001 - recorded per variant
                r["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            row["variants"][name] = r
        out["step08_dq"].append(row)
        print({k2: v2 for k2, v2 in row.items() if k2 != "lengths"}, flush=True)
        save()
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
