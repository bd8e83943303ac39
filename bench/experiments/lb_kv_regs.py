"""Experiment: does step 06's dK/dV kernel run faster when its matrix products read K and V from registers instead of shared memory?

Question. At the CS336 leaderboard shape (B=1, H=16, N=16384, D=64, causal, bf16) step 06's dK/dV kernel runs
4 products at ~510 TFLOP/s where its dQ kernel runs 3 at ~670 (``lb_gaps_1202/``: 2.15 and 1.22 ms a step), and
it is where the backward loses to cuDNN. Its table's tiles (32 query rows a step against 64 keys, 4 warps,
four programs an SM) make K Q^T and V dO^T wgmma shapes of m64n32k16 with both operands in shared memory
(the compile report's ``D(s)``): each reads 2 KB of K or V and 1 KB of Q or dO for 16 clocks of tensor
work, about 190 bytes a clock against the SM's 128. Triton gives wgmma its A operand from registers when
the value does not come straight from a load; a select that changes nothing moves K and V into registers
once per program (``triton_dkdv_variants.py``'s ``V_IN_REGS`` / ``K_IN_REGS``). The compile report of the
copy in that file (``--aot-check``, sm_90, no GPU, 2026-12-02) at these tiles, causal: 128 registers and
52 B of spills for the control; with K and V in registers 84 B of spills at the 128 cap, 167 registers and
none at a 168 cap (three programs an SM), 206 uncapped (two). Not measured before at these tiles (the
11-30 run tried it at 64x128 on 8 warps, where shared memory was not the limit: no gain). Does it pay, in
the kernel and in CS336's harness?

Method. Step 06 itself (solutions/) with one name changed: ``_dkdv_tile`` is rebuilt over a copy of its
module's globals in which ``load_tile`` is this file's ``load_tile_in_registers`` (step 05's ``load_tile``,
then the select), so only K and V change (``_dkdv_tile`` loads nothing else; Q and dO are loaded in
``_dkdv_inner``, untouched); the dK/dV kernel and ``backward`` are rebuilt around it
(``gpu_run.rebuild``). (1) dQ, dK, dV against step 06's at the same tiles (bitwise: the products are the
same arithmetic wherever an operand comes from) and the float64 reference, bf16, causal and not, odd
lengths. (2) the leaderboard shape's backward alone (do_bench median, rep 300 ms), the table alternated
with each variant. (3) CS336's harness (``gpu_run.cs336_harness``) for the variants faster than the
table in (2), alternated with the table, SM clock and power of each run.

    python bench/experiments/lb_kv_regs.py --out DIR     # an H200: about 2-3 minutes
    python bench/experiments/lb_kv_regs.py --small       # CPU: Triton's interpreter, part (1) at small sizes

Answer: no; K and V stay in shared memory. One H200, 2026-12-02 11:26 UTC, the working tree of 8e59f24
(results/h200/triton/lb_kv_regs_1202.json, .log, _smi.csv). Every variant bitwise step 06's at its tiles (30
cases: bf16, causal and not, N 777-4096, D 40/64). The backward alone at the leaderboard shape, each between two
runs of the table (3.720-3.794 ms): K and V in registers 4.157 at the 128 cap (spills), 3.990 at 168 (three
programs an SM), 4.166 uncapped, 4.371 at 64x64 uncapped; the table's shared-memory operands at a 168 cap 3.837.
Slower by 6-16%: the operand bytes the select saves cost registers, and programs an SM are worth more at these
tiles than shared-memory bandwidth. No variant reached CS336's harness (the rule: only those faster alone); its
table read 5.090 ms at 1851 MHz, cuDNN 4.484 / 4.478.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from bench.experiments import gpu_run  # noqa: E402

REC = gpu_run.Record("lb_kv_regs")
log = REC.log
T0 = time.time()

step_load_tile = None          # step 05's load_tile, set by kv_regs_backward() before anything compiles


@triton.jit
def load_tile_in_registers(base, rows, cols, stride_row, stride_col, n_rows, n_cols,
                           CHECK_ROWS: tl.constexpr, CHECK_COLS: tl.constexpr):
    """Step 05's ``load_tile``, then a select that changes no value (rows past ``n_rows`` already read 0): the
    tile no longer comes straight from a load, so wgmma takes it from registers, not shared memory."""
    x = step_load_tile(base, rows, cols, stride_row, stride_col, n_rows, n_cols, CHECK_ROWS, CHECK_COLS)
    return tl.where(rows[:, None] < n_rows, x, 0.0)


@functools.cache
def kv_regs_backward():
    """Step 06's ``backward`` whose dK/dV kernel holds K and V in registers; everything else is step 06's own
    code (solutions/), rebuilt over copies of its module's globals."""
    global step_load_tile
    from attnlib.loader import load_step
    s6 = load_step(6, "solutions")
    step_load_tile = s6.load_tile
    g_tile = dict(vars(s6), load_tile=load_tile_in_registers)
    g = dict(vars(s6))
    g["_dkdv_tile"] = triton.jit(gpu_run.rebuild(s6._dkdv_tile.fn, g_tile))
    g["_bwd_dkdv_kernel"] = triton.jit(gpu_run.rebuild(s6._bwd_dkdv_kernel.fn, g))
    return s6.direct_launches(gpu_run.rebuild(s6.backward.__wrapped__, g))


def table(n, d, dtype, causal, device, bh):
    from attnlib.loader import load_step
    cfg = load_step(6, "solutions").bwd_config(n, n, d, dtype, causal, device, bh)
    return dict({k: v for k, v in cfg.items() if k != "fused"}, dq_mode="separate")


def with_dkdv(cfg, **dkdv):
    """``cfg`` with its dK/dV entry changed (a None value drops the option: ``maxnreg=None`` is uncapped)."""
    return dict(cfg, dkdv={k: v for k, v in dict(cfg["dkdv"], **dkdv).items() if v is not None})


# name -> (K and V in registers?, dK/dV changes to the table)
VARIANTS = {
    "kv-regs r128": (True, {}),
    "kv-regs r168": (True, dict(maxnreg=168)),
    "kv-regs uncapped": (True, dict(maxnreg=None)),
    "kv-regs 64x64 w4 s3 uncapped": (True, dict(BLOCK_M=64, num_stages=3, maxnreg=None)),
    "r168 (smem operands)": (False, dict(maxnreg=168)),
}


def backward_of(name):
    from attnlib.loader import load_step
    return kv_regs_backward() if VARIANTS[name][0] else load_step(6, "solutions").backward


# %% (1) correctness ---------------------------------------------------------------------------------------

def correctness(small: bool, device: str, names=tuple(VARIANTS)) -> dict:
    """Each variant's dQ, dK, dV against step 06's at the same tiles (must be bitwise equal) and against the
    float64 reference beside the table's error."""
    from attnlib.loader import load_step
    from attnlib.reference import reference_backward
    s5, s6 = load_step(5, "solutions"), load_step(6, "solutions")
    dt = torch.float32 if small else torch.bfloat16
    shapes = [(1, 2, 100, 64), (2, 1, 70, 32)] if small else [(2, 8, 1000, 64), (1, 4, 4096, 64), (2, 2, 777, 40)]
    rows, wrong = [], 0
    for (b, h, n, d) in shapes:
        for causal in (True, False):
            g = torch.Generator().manual_seed(0)
            q, k, v, do = (torch.randn(b, h, n, d, generator=g).to(device=device, dtype=dt) for _ in range(4))
            sc = d ** -0.5
            o, lse = s5.forward(q, k, v, causal, sc)
            ref = reference_backward(q, k, v, do, causal)
            base_cfg = table(n, d, dt, causal, "cuda" if device == "cuda" else "cpu", b * h)
            tab = s6.backward(q, k, v, o, lse, do, causal, sc, config=base_cfg)
            tab_err = max(float((x.double() - y).abs().max()) for x, y in zip(tab, ref))
            case = f"B{b} H{h} N{n} D{d} {'causal' if causal else 'full'} {str(dt)[6:]}"
            for name in names:
                regs, change = VARIANTS[name]
                cfg = with_dkdv(base_cfg, **change) if device == "cuda" else base_cfg
                want = s6.backward(q, k, v, o, lse, do, causal, sc, config=cfg) if change and device == "cuda" else tab
                got = backward_of(name)(q, k, v, o, lse, do, causal, sc, config=cfg)
                same = all(torch.equal(x, y) for x, y in zip(got, want))
                err = max(float((x.double() - y).abs().max()) for x, y in zip(got, ref))
                ok = same and err <= 1.5 * tab_err + 1e-3
                wrong += not ok
                rows.append({"case": case, "variant": name, "bitwise_step06": same, "max_err": err, "table_err": tab_err})
                log(f"  {case:<34} {name:<30} {'bitwise step 06' if same else 'DIFFERS from step 06'}  "
                    f"max err {err:.2e} (table {tab_err:.2e}) {'ok' if ok else 'WRONG'}")
    return {"rows": rows, "wrong": wrong}


# %% (2) kernels alone ------------------------------------------------------------------------------------

def compiled_facts(kernel) -> list:
    """Registers and spills of every binary Triton has compiled for ``kernel`` on this device."""
    out = []
    try:
        for cache in kernel.device_caches.values():
            for ck in cache[0].values():
                out.append({"regs": ck.n_regs, "spills": ck.n_spills, "maxnreg": ck.metadata.maxnreg,
                            "num_warps": ck.metadata.num_warps})
    except Exception as e:  # noqa: BLE001 -- facts only
        out.append({"error": f"{type(e).__name__}: {e}"})
    return out


def kernels(rep_ms: int) -> dict:
    from attnlib.loader import load_step
    s5, s6 = load_step(5, "solutions"), load_step(6, "solutions")
    B, H, N, D = 1, 16, 16384, 64
    q, k, v, do = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    sc = D ** -0.5
    o, lse = s5.forward(q, k, v, True, sc)
    base = table(N, D, q.dtype, True, "cuda", B * H)
    rows = []

    def time_bwd(name, bwd, cfg):
        ms = triton.testing.do_bench(lambda: bwd(q, k, v, o, lse, do, True, sc, config=cfg), rep=rep_ms)
        rows.append({"name": name, "bwd_ms": round(float(ms), 4)})
        log(f"  {name:<30} backward {ms:.3f} ms")
        REC.result["kernels"] = rows
        REC.save()
    time_bwd("table", s6.backward, base)
    for name, (regs, change) in VARIANTS.items():
        time_bwd(name, backward_of(name), with_dkdv(base, **change))
        time_bwd("table", s6.backward, base)
    tables = [r["bwd_ms"] for r in rows if r["name"] == "table"]
    ref = min(tables)
    faster = [r["name"] for r in rows if r["name"] != "table" and r["bwd_ms"] < 0.99 * ref]
    REC.result["compiled"] = {"step06": compiled_facts(s6._bwd_dkdv_kernel),
                              "kv_regs": compiled_facts(kv_regs_backward().__wrapped__.__globals__["_bwd_dkdv_kernel"])}
    log(f"  table {min(tables):.3f}-{max(tables):.3f} ms; faster than the table's best by 1%: {faster or 'none'}")
    log(f"  compiled dK/dV binaries: {REC.result['compiled']}")
    return {"table_ms": tables, "faster": faster}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--small", action="store_true", help="CPU: Triton's interpreter, correctness only")
    ap.add_argument("--rep-ms", type=int, default=300)
    ap.add_argument("--harness-rep-ms", type=int, default=3000)
    ap.add_argument("--budget-s", type=float, default=200)
    ap.add_argument("--harness-all", action="store_true", help="time every variant in the harness, not only the faster")
    args = ap.parse_args()
    if args.small or not torch.cuda.is_available():
        r = correctness(True, "cpu", names=("kv-regs r128",))
        print(f"{r['wrong']} wrong")
        return 1 if r["wrong"] else 0
    if args.out is None:
        ap.error("--out DIR on a GPU")
    REC.open(args.out, ROOT)
    REC.result["gpu"] = torch.cuda.get_device_name()

    @REC.part("1 correctness")
    def part1():
        r = correctness(False, "cuda")
        if r["wrong"]:
            raise AssertionError(f"{r['wrong']} wrong: not timed")
        return r
    part1()
    if not REC.result["parts"]["1 correctness"]["ok"]:
        log("not timed: part 1 failed")
        return 1

    @REC.part("2 leaderboard shape, backward alone")
    def part2():
        return kernels(args.rep_ms)
    part2()

    @REC.part("3 CS336 harness, alternated with the table")
    def part3():
        p2 = REC.result["parts"].get("2 leaderboard shape, backward alone", {})
        names = list(VARIANTS) if args.harness_all else p2.get("faster", [])[:3]
        if not names:
            log("  no variant faster than the table alone: the harness times nothing else")
        from attnlib.loader import load_step
        base = table(16384, 64, torch.bfloat16, True, "cuda", 16)
        s6 = load_step(6, "solutions")

        def pinned(name):
            cfg = with_dkdv(base, **VARIANTS[name][1])
            bwd = backward_of(name)

            def run(q, k, v, o, lse, do, is_causal, scale, config=None, dq_mode=None):
                if q.numel() != 16 * 16384 * 64:          # not the harness's shape: the table
                    return s6.backward(q, k, v, o, lse, do, is_causal, scale, config=config, dq_mode=dq_mode)
                return bwd(q, k, v, o, lse, do, is_causal, scale, config=cfg)
            return run
        return gpu_run.cs336_harness(REC, args.out, [(n, pinned(n)) for n in names], args.harness_rep_ms,
                                     args.budget_s, T0)
    part3()
    REC.save()
    log(f"wrote {REC.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
