"""Experiment: at the H200's power limit, do other tiles take step 06 closer to 5.0 ms in CS336's harness?

Question. ``lb_gaps.py`` found CS336's harness power-bound: every run holds the H200 at ~690 W of its 700, and
the GPU runs step 06's kernels at 1821 MHz on average against cuDNN's 1905-1910. Step 06's tables were chosen by
``do_bench`` medians of 200-300 ms (``lb_5ms.py``), much of which runs before the power limit bites (the power
ramps up over ~0.3 s). At the limit time follows energy: tiles that reload less (more keys per dK/dV program,
more queries per dQ program) or do fewer programs' worth of setup could win there even if they lost in the short
runs. Which tile sets are fastest in the harness itself, and at what clock?

Method. Each variant is step 06 with ``step05.dense_fwd_config`` / ``step06.bwd_config`` replaced by the
variant's tables (``torch._dynamo.reset()`` between), checked first at B=2 H=3 N=1000 D=64 bf16 causal against
the float64 reference (its error within 1.5x the table's), then timed in CS336's harness
(``torch.compile(FlashAttentionTriton.apply)``, ``q, k, v = torch.randn(3, 16, 16384, 64, bf16,
requires_grad=True)``, ``o.sum().backward()``, the mean of ``do_bench(rep, warmup=500)``), alternated with the
table (table, A, table, B, ...), cuDNN at the start and the end; ``nvidia-smi`` samples the SM clock and power
every 100 ms and each row gets the mean over its timing window.

    python bench/experiments/lb_power.py --out DIR          # an H200: about 4 minutes

Answer: no; the table stays. H200, 2026-12-02 ~02:08 UTC, the working tree of 25a1e97
(results/h200/triton/lb_power_1202.json, .log, _smi.csv): every variant right (max error 1.44e-02, the table's).
The table read 5.118-5.146 ms in its eight alternated runs (cuDNN 4.518 / 4.527); every variant slower: dK/dV
32x128 w8 s4 r128 (two programs an SM, the table before 12-01) 5.156 -- the nearest, at a higher clock (1878 MHz
against the table's 1826-1836) that does not make up for its time -- fwd 128x64 w4 5.239, dQ 64x64 w4 5.259,
fwd 128x128 5.348, dQ 128x128 w8 s2 5.589, dK/dV 64x128 w8 r128 5.982, dK/dV 64x64 w4 r128 7.578. (The power
column is each do_bench call's window, warm-up included: 603-640 W; the clocks are the point.) The short-run
tables hold at the power limit: the last 3% to 5.0 ms is not in a tile.

Round 2 (``--round 2``). The first round's 64x64 dK/dV tiles ran under the table's 128-register
cap, where ptxas spills 812 bytes a thread: that row (7.578 ms) measured the spills, not the tile. 64-query
steps halve the Q and dO tiles read per key-query pair and give every product of the loop N = 64 instead of
32. sm_90 compile report of step 06's dK/dV kernel at the leaderboard shape (12-02, Triton 3.6's ptxas, no
GPU; registers, spill stores / loads in bytes, programs an SM by registers and shared memory):
    table 32x64 w4 s4 r128    128 regs, 24/40 B spilled, 4 programs an SM (49 KB shared)
    64x64 w4 s3 r168          168 regs, 16/16 B,          3 programs (65 KB)
    64x64 w4 s2 r168          168 regs, 12/12 B,          3 programs (49 KB)
    64x64 w4 s3 uncapped      236 regs, none,             2 programs
    32x64 w4 s4 r168          162 regs, none,             3 programs
Question: does any of them beat the table in the harness, at the power limit?
Answer: no; the table stays. H200, 2026-12-02 06:35 UTC, ce393e0 (results/h200/triton/lb_power_r2_1202.json,
.log, _smi.csv): every variant right (max error 1.44e-02, the table's). The table read 5.096-5.125 ms in five
alternated runs (cuDNN 4.511 / 4.515); 64x64 w4 s3 r168 5.166 (1857 MHz against the table's 1828-1841),
32x64 w4 s4 r168 5.190, 64x64 w4 s2 r168 5.283, 64x64 uncapped 5.592 (1929 MHz, two programs an SM). With the
spills gone the 64-query tile comes within 1% of the table, no nearer: no tile or register cap tried in either
round takes step 06 to 5.0 ms in CS336's harness.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.experiments import gpu_run  # noqa: E402
from bench.experiments.gpu_run import smi_means  # noqa: E402,F401 -- lb_groups and tests read it here too

REC = gpu_run.Record("lb_power")
log = REC.log

HF = dict(HEADS_FIRST=True)


def variants(fwd_table: dict, bwd_table: dict, round_: int = 1) -> dict:
    """name -> (forward config or None for the table's, backward config or None). ``round_`` 2: the
    register caps of the 12-02 compile report (module header)."""
    kv, dq = dict(bwd_table["dkdv"]), dict(bwd_table["dq"])

    def bwd(dkdv=None, dq_=None):
        c = {k: v for k, v in bwd_table.items() if k != "fused"}
        dk = {k: v for k, v in dict(kv, **(dkdv or {})).items() if v is not None}     # None: the option dropped
        return dict(c, dkdv=dk, dq=dict(dq, **(dq_ or {})), dq_mode="separate")
    if round_ == 2:
        return {
            "dkdv 64x64 w4 s3 r168": (None, bwd(dict(BLOCK_M=64, num_stages=3, maxnreg=168))),
            "dkdv 64x64 w4 s2 r168": (None, bwd(dict(BLOCK_M=64, num_stages=2, maxnreg=168))),
            "dkdv 64x64 w4 s3 uncapped": (None, bwd(dict(BLOCK_M=64, num_stages=3, maxnreg=None))),
            "dkdv 32x64 w4 s4 r168": (None, bwd(dict(maxnreg=168))),
        }
    return {
        "dkdv 32x128 w8 s4 r128": (None, bwd(dict(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=4, maxnreg=128))),
        "dkdv 64x128 w8 s3 r128": (None, bwd(dict(BLOCK_M=64, BLOCK_N=128, num_warps=8, num_stages=3, maxnreg=128))),
        "dkdv 64x64 w4 s3 r128": (None, bwd(dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3, maxnreg=128))),
        "dq 128x128 w8 s2": (None, bwd(dq_=dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2))),
        "dq 64x64 w4 s3": (None, bwd(dq_=dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3))),
        "fwd 128x128 w8 s3": (dict(fwd_table, BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=3), None),
        "fwd 128x64 w4 s3": (dict(fwd_table, num_warps=4), None),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--harness-rep-ms", type=int, default=3000)
    ap.add_argument("--budget-s", type=float, default=270, help="start no new variant after this many seconds")
    ap.add_argument("--round", type=int, default=1, choices=(1, 2),
                    help="1: the tile sets of the 12-02 run; 2: the dK/dV register caps of the header's round 2")
    args = ap.parse_args()
    REC.open(args.out, ROOT)
    t_start = time.time()

    import torch
    import torch.nn.functional as F
    import triton
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attnlib.loader import load_step
    from attnlib.reference import reference_attention, reference_backward

    s5, s6 = load_step(5, "solutions"), load_step(6, "solutions")
    R = REC.result
    R["gpu"] = torch.cuda.get_device_name()
    smi_path = args.out / "smi.csv"
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu",
                            "--format=csv", "-lms", "100"], stdout=open(smi_path, "w"), stderr=subprocess.DEVNULL)
    B, N, D = 16, 16384, 64
    fwd_table = s5.dense_fwd_config(N, N, D, torch.bfloat16, True, "cuda", B)
    bwd_table = s6.bwd_config(N, N, D, torch.bfloat16, True, "cuda", B)
    R["fwd_table"], R["bwd_table"] = fwd_table, {k: v for k, v in bwd_table.items() if k != "fused"}
    V = variants(fwd_table, bwd_table, args.round)
    R["round"] = args.round

    @REC.part("1 correctness")
    def correctness():
        g = torch.Generator(device="cuda").manual_seed(0)
        cq, ck, cv, cdo = (torch.randn(2, 3, 1000, 64, device="cuda", dtype=torch.bfloat16, generator=g)
                           for _ in range(4))
        ref_o = reference_attention(cq, ck, cv, True)[0]
        ref_g = reference_backward(cq, ck, cv, cdo, True)
        sc = 64 ** -0.5

        def err(fc, bc):
            o, lse = s5.forward(cq, ck, cv, True, sc, config=fc) if fc else s5.forward(cq, ck, cv, True, sc)
            gr = s6.backward(cq, ck, cv, o, lse, cdo, True, sc, config=bc) if bc else \
                s6.backward(cq, ck, cv, o, lse, cdo, True, sc)
            return max([float((o.double() - ref_o).abs().max())]
                       + [float((a.double() - b).abs().max()) for a, b in zip(gr, ref_g)])
        base = err(None, None)
        out = {"table": base}
        log(f"  table: max error {base:.2e}")
        for name, (fc, bc) in list(V.items()):
            try:
                e = err(fc, bc)
                out[name] = e
                ok = e <= 1.5 * base + 1e-3
                log(f"  {name:<28} max error {e:.2e} {'ok' if ok else 'BAD: dropped'}")
            except Exception as ex:  # noqa: BLE001
                ok = False
                log(f"  {name:<28} ERROR {type(ex).__name__}: {str(ex)[:200]}: dropped")
            if not ok:
                V.pop(name)
        return {"errors": out}
    correctness()

    hq, hk, hv = torch.randn(3, B, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    orig_f, orig_b = s5.dense_fwd_config, s6.bwd_config
    every = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    rows = []

    def sdpa(q, k, v, is_causal):
        return F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=is_causal)[0]

    def harness(name, fc=None, bc=None, cudnn=False):
        torch._dynamo.reset()
        s5.dense_fwd_config = (lambda *a, **kw: dict(fc)) if fc else orig_f
        s6.bwd_config = (lambda *a, **kw: dict(bc)) if bc else orig_b
        f = sdpa if cudnn else torch.compile(s6.FlashAttentionTriton.apply)

        def step():
            f(hq, hk, hv, True).sum().backward()
        try:
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION] if cudnn else every):
                for _ in range(2):
                    step()
                torch.cuda.synchronize()
                t0 = datetime.now()
                ms = round(float(triton.testing.do_bench(step, rep=args.harness_rep_ms, warmup=500)), 4)
                t1 = datetime.now()
            row = {"name": name, "ms": ms, **smi_means(smi_path, t0, t1)}
        except Exception as e:  # noqa: BLE001
            row = {"name": name, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        finally:
            s5.dense_fwd_config, s6.bwd_config = orig_f, orig_b
        rows.append(row)
        log(f"  {name:<28} {row.get('ms', row.get('error'))}  {row.get('sm_mhz', '?')} MHz {row.get('watts', '?')} W  "
            f"[t={time.time() - t_start:.0f}s]")
        R["rows"] = rows
        REC.save()

    @REC.part("2 CS336 harness, alternated with the table")
    def timing():
        harness("sdpa_cudnn", cudnn=True)
        harness("table")
        for name, (fc, bc) in V.items():
            if time.time() - t_start > args.budget_s:
                log(f"  budget reached: {name} and after not timed")
                break
            harness(name, fc, bc)
            harness("table")
        harness("sdpa_cudnn again", cudnn=True)
        tables = [r["ms"] for r in rows if r["name"] == "table" and "ms" in r]
        return {"table_ms": tables}
    timing()
    smi.terminate()
    REC.save()
    log(f"wrote {REC.json_path}")


if __name__ == "__main__":
    main()
