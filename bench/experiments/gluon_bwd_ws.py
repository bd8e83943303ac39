"""Experiment: a backward shaped like FlashAttention-3's, in Gluon: one warp-specialized kernel computing dQ, dK and
dV in five products, dQ added by the TMA unit's bulk reduce. Does it beat step 06's two kernels (seven products)?

Question. Step 06's backward gives the tensor cores 1.40x cuDNN's work (seven products against five: its dQ pass
recomputes S and dP), and issue 17's forward + backward target (>= 0.90x cuDNN) is met in 2 of 12 cells
(results/h200/issue17_targets/). A five-product kernel in Gluon lost twice (gluon_dkdv_dq.py rounds 1 and 2:
0.66-0.91x step 06's backward): one warpgroup a program, 64 keys, 141-151 registers so three programs an SM, every
program adding a whole dQ tile per 64 keys, and heads first in the grid, so the programs resident together add
into as many heads' dQ as there are programs. FlashAttention-3 differs in each of these: 128 keys a CTA on two
consumer warpgroups, a producer warp loading Q and dO by TMA, the registers moved to the consumers (setmaxnreg),
and a head's key tiles side by side. This asks whether that shape, in Gluon, takes the five products past step 06.

Method. ``_gluon_bwd_ws``: one CTA a (key block of 128, batch x head), the grid key blocks first (a head's CTAs side
by side; causal, the heaviest key block of a head first). ``gl.warp_specialize`` splits it into
    loader (1 warp, 24 registers)  K and V (two 64-key tiles) once; Q_i and dO_i (BLOCK_M rows) by TMA into STAGES
                                   buffers, each refilled once both consumers hand it back (``empty``, count 2)
    consumer w (4 warps, w = 0, 1) its own 64 keys, per query tile i, step 06's Gluon dK/dV order (S^T_i and dP^T_i
                                   issued together, P^T_i under dP^T_i, dV, dS^T_i under dV, dK) and a fifth product,
                                   dQ_i(w) = dS_i(w) K(w) (BLOCK_M x D over its 64 keys: dS^T_i(w) stored to shared
                                   memory and read transposed); every product waited for in the iteration; Q_i, dO_i
                                   handed back; dQ_i(w), scaled, staged in shared memory (fp32, DQ_BUFS buffers) and
                                   added to an fp32 (B*H*N, D) buffer by one bulk reduce (gluon_dkdv_dq.py's
                                   ``tma_reduce_add``), ``tma.store_wait(DQ_BUFS - 1)`` before a buffer is written again
Under a causal mask consumer 1 skips the query tile wholly above its keys (it hands the buffer back unread). After
the kernel dQ is the buffer cast (one elementwise kernel). D = rowsum(dO * O) by step 06's own preprocess kernel.
(1) dQ, dK, dV against the float64 reference beside step 06's errors (bf16 D 64 and 128, causal and not; fp16
once), dK and dV bitwise repeatable. (2) the backward alone, do_bench median, against step 06's ``backward`` as it
ships (twice) and cuDNN's, in the same run: the CS336 leaderboard shape and FlashAttention's grid (B = 16384/N,
H = 2048/D) at N 4096, 8192, 16384, D 64 and 128, causal and not.

    python bench/experiments/gluon_bwd_ws.py --out DIR     # an H200: about 2 minutes
    python bench/experiments/gluon_bwd_ws.py --aot-check   # no GPU: compile for sm_90a, registers, spills, waits
(not under TRITON_INTERPRET=1: Gluon has no interpreter)

Answer: **yes, with one dQ a CTA.** Two runs on one H200, 2026-12-03 23:41 and 23:49 UTC (bdb33f0, 02f2a52;
results/h200/triton/gluon_bwd_ws_1203/, gluon_bwd_ws_1203_r2/), every variant right (step 06's errors to the digit
against float64, dK and dV repeatable). Mode 0 ("ws", each consumer adding its own share over 64 keys: two reduces a
CTA a query tile) ran 0.91-1.06x step 06's backward at D=64 (D by PyTorch in that run) and 1.00-1.09x with step 06's
preprocess; mode 1 ("alt": both consumers' dS^T shared, consumer i % 2 making dQ_i over the CTA's 128 keys, one reduce)
**1.09-1.21x step 06 and 0.93-1.04x cuDNN at D=64** (the leaderboard shape 3.222 ms against 3.622 and cuDNN's 3.153:
1.12x and 0.98x); mode 2 ("split", D=128: each consumer half of dQ_i's columns) with two dQ buffers 1.05-1.25x step 06
but 0.99x at causal N=16384, 0.81-0.94x cuDNN, one dQ buffer 0.92-0.94x causal. At D=128 the consumers spill (28-216 B
a thread, causal the most; not serialized). Step 06's solution runs "alt m64 s2 q1" (D=64) and "split m64 s2 q2"
(D=128) from N=4096 since ca58451 (``BWD_TILES``, ``hopper_bwd``); at N 1024 and 2048 they ran 1.06-1.27x (2026-12-04
00:05 UTC, results/h200/triton/gluon_bwd_ws_1204_short/), so from 0417e43 it starts at N=1024 (``BWD_MIN_LEN``).

Round 3 (``--round 3``, 2026-12-04 03:11 UTC on one H200, results/h200/triton/gluon_bwd_ws_1204_r3/): the one target
cell still missed was D=128 causal
N=4096 (0.874x cuDNN forward + backward, results/h200/issue17_targets_1204/), and at D=128 the consumers spill under a
causal mask: ptxas (sm_90a) 176 B stored a thread, 28 without a mask. Removing the mask's code takes it to 12, so the
mask is most of it. Two switches of the solution's kernel, off as it ships (its PTX unchanged, debug lines aside, in
all eight builds of modes 0-2 at D 64 and 128, causal and not): ``LOCAL_MASK`` (the mask from the tile's own indices,
key n0 + r <= query start_m + c as r <= c + start_m - n0: 92 B) and ``DS_FIRST`` (dS^T computed before dV is issued,
FlashAttention-3's order: with LOCAL_MASK 72 B). Do they pay at D=128 causal, and cost nothing at D=64?
    python bench/experiments/gluon_bwd_ws.py --round 3 --out DIR
Answer: **both pay at D=128 causal, 1.06-1.12x the kernel without them at every N from 1024 to 16384** (N=4096:
1.573 ms against 1.750, cuDNN 1.504); LOCAL_MASK alone 1.08-1.11x at N 1024-8192 but 0.99x at 16384. Elsewhere within
the run's noise (0.93-1.03x; without a mask LOCAL_MASK is the same code and still read 0.94x once). Step 06 sets both
at D=128 causal only since 0417e43 (``BWD_SWITCHES``); issue 17's forward + backward target is then met in 12 of 12
cells (results/h200/issue17_targets_1204b/).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "experiments"))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402

from bench.experiments import gpu_run  # noqa: E402
from gluon_dkdv_dq import step06_backward  # noqa: E402
# The kernel is step 06's since its second run: solutions/gluon_dkdv.py, which step 06's solution launches on Hopper
# (``BWD_TILES``: this experiment's best variants).
from solutions.gluon_dkdv import _gluon_bwd_ws, bwd_launch_args  # noqa: E402

REC = gpu_run.Record("gluon_bwd_ws")
T0 = time.time()
LOG2E = 1.4426950408889634
# How a CTA's dQ_i is made (DQ_MODE):
#   0 "ws"    each consumer its share over its own 64 keys, dQ_i(w) = dS_i(w) K(w) (BLOCK_M x D), and adds it: two
#             bulk reduces a CTA a query tile
#   1 "alt"   both consumers' dS^T_i in shared memory (an mbarrier says when both are there, another when they may be
#             overwritten); consumer i % 2 makes the whole dQ_i over the CTA's 128 keys and adds it: one reduce a
#             query tile, half the adds to L2 of mode 0 (FlashAttention-3 makes one dQ a CTA too)
#   2 "split" the same dS^T_i shared, each consumer makes half of dQ_i's columns over all 128 keys, dS_i K[:, half]
#             (FlashAttention-3's split at D=128): the accumulator half mode 0's, two reduces of half a tile
# name -> (BLOCK_M queries a step, STAGES, DQ_BUFS, DQ_MODE, maxnreg, consumer registers, loader registers). Three
# warpgroups' worth of registers a CTA (the loader warp is allocated a warpgroup's): 3 x 128 x 168 <= 65536, one CTA
# an SM. Shared memory at D=128: K, V 64 KB, Q, dO 32 KB a stage, dS^T 16 KB (32 shared), dQ 32 KB a buffer a
# consumer (16 split).
VARIANTS = {"ws m64 s2 q2": (64, 2, 2, 0, 168, 240, 24), "ws m64 s3 q2": (64, 3, 2, 0, 168, 240, 24),
            "ws m64 s2 q1": (64, 2, 1, 0, 168, 240, 24),
            "alt m64 s2 q1": (64, 2, 1, 1, 168, 240, 24), "alt m64 s3 q1": (64, 3, 1, 1, 168, 240, 24),
            "split m64 s2 q1": (64, 2, 1, 2, 168, 240, 24), "split m64 s2 q2": (64, 2, 2, 2, 168, 240, 24),
            # Round 3 (run 2026-12-04, gluon_bwd_ws_1204_r3/; "split m64 s2 q2 lm ds" ships at D=128 causal): the
            # tiles with the kernel's two switches, a dict after the tiles.
            # LOCAL_MASK: the causal mask from the tile's own indices (key n0 + r <= query start_m + c as
            # r <= c + start_m - n0) instead of global offsets; DS_FIRST: dS^T computed before dV is issued
            # (FlashAttention-3's order). ptxas (sm_90a, --aot-check) at D=128 causal: 176 B spilled a thread as
            # shipped, 92 with LOCAL_MASK, 72 with both (without a mask 28 in every form); D=64 none in any.
            "split m64 s2 q2 lm": (64, 2, 2, 2, 168, 240, 24, {"LOCAL_MASK": True}),
            "split m64 s2 q2 lm ds": (64, 2, 2, 2, 168, 240, 24, {"LOCAL_MASK": True, "DS_FIRST": True}),
            "alt m64 s2 q1 lm": (64, 2, 1, 1, 168, 240, 24, {"LOCAL_MASK": True}),
            "alt m64 s2 q1 lm ds": (64, 2, 1, 1, 168, 240, 24, {"LOCAL_MASK": True, "DS_FIRST": True})}
ROUND3 = {64: ["alt m64 s2 q1", "alt m64 s2 q1 lm", "alt m64 s2 q1 lm ds"],
          128: ["split m64 s2 q2", "split m64 s2 q2 lm", "split m64 s2 q2 lm ds"]}
DEFAULT = {64: ["ws m64 s2 q2", "ws m64 s3 q2", "alt m64 s2 q1", "alt m64 s3 q1"],
           128: ["split m64 s2 q1", "split m64 s2 q2"]}


def log(msg):
    REC.log(f"[{time.time() - T0:6.1f}s] {msg}")


# %% Host -----------------------------------------------------------------------------------------------------

def check_inputs(q, k, v, do):
    if not (q.dim() == 4 and q.shape == k.shape == v.shape == do.shape):
        raise ValueError(f"gluon_bwd_ws takes q, k, v, dO of one shape (B, H, N, D), got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}, {tuple(do.shape)}")
    if q.dtype not in (torch.float16, torch.bfloat16) or len({t.dtype for t in (q, k, v, do)}) != 1:
        raise ValueError("gluon_bwd_ws takes 16-bit q, k, v, dO of one dtype")
    B, H, N, D = q.shape
    if D not in (64, 128) or N % 128:
        raise ValueError(f"gluon_bwd_ws takes D 64 or 128 and N a multiple of 128 (an experiment's limits), got "
                         f"D={D}, N={N}")
    if not all(t.is_contiguous() for t in (q, k, v, do)):
        raise ValueError("gluon_bwd_ws takes contiguous (B, H, N, D) q, k, v, dO")


def launch_args(q, k, v, do, lse, delta, causal, variant, dk=None, dv=None):
    """(grid, args, kwargs, dk, dv, dq_acc) of one launch of the solution's kernel with ``variant``'s tiles; tensors
    may be on the CPU (the compile report)."""
    dk = torch.empty_like(q) if dk is None else dk
    dv = torch.empty_like(q) if dv is None else dv
    tiles, switches = VARIANTS[variant][:7], (VARIANTS[variant][7:] or [{}])[0]
    grid, args, kwargs, dq_acc = bwd_launch_args(q, k, v, do, lse, delta, dk, dv, causal, q.shape[-1] ** -0.5,
                                                 tiles=tiles)
    return grid, args, {**kwargs, **switches}, dk, dv, dq_acc


@functools.cache
def _step06():
    from attnlib.loader import load_step
    return load_step(6, "solutions")


def backward(q, k, v, o, lse, do, causal, variant):
    """(dQ, dK, dV) of one backward: D by step 06's own preprocess kernel, the kernel, dQ cast. ``lse``: (B, H, N)
    natural-log float32."""
    check_inputs(q, k, v, do)
    B, H, N, D = q.shape
    delta = torch.empty(B * H, N, device=q.device, dtype=torch.float32)
    _step06()._bwd_preprocess[(triton.cdiv(N, 64), B * H)](o, do, delta, *o.stride(), *do.stride(), H, N,
                                                           HEAD_DIM=D, BLOCK_M=64, BLOCK_D=D)
    grid, args, kwargs, dk, dv, dq_acc = launch_args(q, k, v, do, lse.contiguous(), delta, causal, variant)
    _gluon_bwd_ws[grid](*args, **kwargs)
    return dq_acc.view(q.shape).to(q.dtype), dk, dv       # scaled in the kernel


# %% Without a GPU: the sm_90a compile ------------------------------------------------------------------------

def compile_sm90(variant: str, d: int, causal: bool):
    from gluon_fwd_overlap import compile_for_sm90
    q = torch.empty(1, 2, 1024, d, dtype=torch.bfloat16)
    lse = torch.empty(1, 2, 1024, dtype=torch.float32)
    grid, args, kwargs, *_ = launch_args(q, q, q, q, lse, lse, causal, variant)
    return compile_for_sm90(_gluon_bwd_ws, args, kwargs)


def report(variant: str, d: int, causal: bool) -> dict:
    """ptxas's registers and spills (sm_90a, the kernel's cap: the consumers' setmaxnreg is in the PTX), the PTX's
    wgmma and their waits, bulk reduces and their waits, named barriers, setmaxnreg, shared memory."""
    from gluon_dkdv_overlap import ptxas_report
    from gluon_fwd_overlap import wgmma_waits
    ck = compile_sm90(variant, d, causal)
    ptx = ck.asm["ptx"]
    r = ptxas_report(ptx)
    return {"regs": r["regs"], "spill": [int(x) for x in r["spills"].split("/")] if r["spills"] else None,
            "serialized": r["serialized"], "waits": wgmma_waits(ptx),
            "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)),
            "tma_reduce_add": len(re.findall(r"cp\.reduce\.async\.bulk\.tensor\.[\w:.]*\.add\b", ptx)),
            "bulk_waits": sorted(int(x) for x in re.findall(r"cp\.async\.bulk\.wait_group\.read\s+(\d+)", ptx)),
            "named_barriers": sorted(set(re.findall(r"bar\.sync\s+(\d+),\s*(\d+)", ptx))),
            "setmaxnreg": sorted(set(re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx))),
            "smem_kb": ck.metadata.shared // 1024}


def aot_check(names_by_d) -> int:
    """Compile every ``names_by_d[D]`` variant for sm_90a (a name written "NAME@causal" or "NAME@full": that mask
    alone) and print ``report``'s figures, the last line all of them as JSON."""
    rows, failures = {}, 0
    for d, names in names_by_d.items():
        for name in names:
            name, _, own_mask = name.partition("@")
            for causal in ((own_mask == "causal",) if own_mask else (True, False)):
                key = f"{name} D{d} {'causal' if causal else 'full'}"
                try:
                    rows[key] = report(name, d, causal)
                except Exception as e:  # noqa: BLE001
                    failures += 1
                    rows[key] = f"FAIL {type(e).__name__}: {str(e)[:1500]}"
                print(f"{key:<28} {rows[key]}", flush=True)
    print(json.dumps(rows))
    return 1 if failures else 0


# %% On a GPU -------------------------------------------------------------------------------------------------

def correctness(names_by_d) -> dict:
    from attnlib.reference import reference_backward
    rows, wrong = [], 0
    cases = [((2, 4, 1024, d), c, torch.bfloat16) for d in (64, 128) for c in (True, False)]
    cases += [((1, 2, 1024, 64), True, torch.float16), ((1, 2, 384, 128), True, torch.bfloat16)]
    for (b, h, n, d), causal, dt in cases:
        g = torch.Generator(device="cpu").manual_seed(0)
        q, k, v, do = (torch.randn(b, h, n, d, generator=g).to("cuda", dt) for _ in range(4))
        ref = reference_backward(q, k, v, do, causal)
        o, lse, s6 = step06_backward(q, k, v, do, causal)
        base = [float((x.double() - r).abs().max()) for x, r in zip(s6(), ref)]
        case = f"B{b} H{h} N{n} D{d} {'causal' if causal else 'full'} {str(dt)[6:]}"
        for name in names_by_d[d]:
            try:
                got = backward(q, k, v, o, lse, do, causal, name)
                again = backward(q, k, v, o, lse, do, causal, name)
                torch.cuda.synchronize()
                e = [float((x.double() - r).abs().max()) for x, r in zip(got, ref)]
                ok = all(x <= 1.5 * y + 1e-3 and math.isfinite(x) for x, y in zip(e, base))
                # the reduces add in any order: dQ may differ in its last bits between runs, dK and dV may not
                steady = all(torch.equal(a, b) for a, b in zip(got[1:], again[1:]))
            except Exception as ex:  # noqa: BLE001
                e, ok, steady = f"{type(ex).__name__}: {str(ex)[:300]}", False, False
            wrong += not (ok and steady)
            rows.append({"case": case, "variant": name, "err": e, "step06": base, "ok": ok, "dkdv_repeatable": steady})
            log(f"  {case:<30} {name:<14} "
                + (e if isinstance(e, str) else "dQ {:.1e} dK {:.1e} dV {:.1e}".format(*e))
                + "  (step 06 dQ {:.1e} dK {:.1e} dV {:.1e}) ".format(*base)
                + ("ok" if ok and steady else "WRONG"))
    return {"rows": rows, "wrong": wrong}


def timing(names_by_d, budget_s: float, lengths=(4096, 8192, 16384), leaderboard=True) -> dict:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    shapes = [("leaderboard", 1, 16, 16384, 64, True)] if leaderboard else []
    shapes += [("grid", 16384 // n, 2048 // d, n, d, c) for d in (64, 128) for c in (True, False)
               for n in lengths]
    out = []
    for label, b, h, n, d, causal in shapes:
        names = names_by_d[d]
        if not names:
            continue
        if time.time() - T0 > budget_s:
            log(f"  budget reached: {label} D{d} N{n} and after not timed")
            break
        q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        o, lse, s6 = step06_backward(q, k, v, do, causal)
        bench = lambda fn: round(float(triton.testing.do_bench(fn, warmup=25, rep=200)), 4)   # noqa: E731
        ms = {"step06": bench(s6)}
        for name in names:
            ms[name] = bench(lambda: backward(q, k, v, o, lse, do, causal, name))
        ms["step06 again"] = bench(s6)
        qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            og = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
        ms["cudnn"] = bench(lambda: torch.autograd.grad(og, (qg, kg, vg), do, retain_graph=True))
        s06 = min(ms["step06"], ms["step06 again"])
        row = {"shape": f"{label} B{b} H{h} N{n} D{d} {'causal' if causal else 'full'}", "ms": ms,
               "vs_step06": {x: round(s06 / t, 3) for x, t in ms.items() if x in names},
               "vs_cudnn": {x: round(ms["cudnn"] / t, 3) for x, t in ms.items() if x != "cudnn"}}
        out.append(row)
        REC.result.setdefault("timing_rows", []).append(row)
        REC.save()
        log(f"  {row['shape']:<34} " + "  ".join(f"{x} {t:.3f}" for x, t in ms.items()))
        log(f"  {'':34} vs step 06: " + "  ".join(f"{x} {r:.2f}" for x, r in row["vs_step06"].items())
            + "   vs cuDNN: " + "  ".join(f"{x} {r:.2f}" for x, r in row["vs_cudnn"].items()))
    return {"rows": out}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--aot-check", action="store_true", help="no GPU: compile for sm_90a and report")
    ap.add_argument("--variants64", default=None, help=f"comma-separated, of {', '.join(VARIANTS)} (D=64)")
    ap.add_argument("--variants128", default=None, help="the same for D=128 ('' for none)")
    ap.add_argument("--budget-s", type=float, default=150)
    ap.add_argument("--lengths", default="4096,8192,16384", help="N of FlashAttention's grid timed (B = 16384/N)")
    ap.add_argument("--no-leaderboard", action="store_true", help="not the CS336 leaderboard shape")
    ap.add_argument("--round", type=int, default=1, choices=(1, 3),
                    help="1: the modes (runs 1-2); 3: the shipped tiles with LOCAL_MASK and DS_FIRST")
    args = ap.parse_args()
    base = ROUND3 if args.round == 3 else DEFAULT
    names_by_d = {d: (base[d] if a is None else [x for x in a.split(",") if x])
                  for d, a in ((64, args.variants64), (128, args.variants128))}
    if unknown := [x for d in names_by_d for x in names_by_d[d] if x.partition("@")[0] not in VARIANTS]:
        ap.error(f"unknown variants {unknown}")
    if args.aot_check:
        return aot_check(names_by_d)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        ap.error("a Hopper GPU (or --aot-check)")
    if args.out is None:
        ap.error("--out DIR on a GPU")
    # Step 06 as it ships on Hopper (its Gluon kernels), which gpu_run.Record would turn off by default.
    os.environ["ATTN_GLUON_DKDV"] = os.environ["ATTN_GLUON_FWD"] = "1"
    REC.open(args.out, ROOT)
    REC.result["gpu"] = torch.cuda.get_device_name()
    REC.part("1 correctness")(lambda: correctness(names_by_d))()
    rows = REC.result["parts"]["1 correctness"].get("rows", [])
    right = {d: [n for n in names_by_d[d]
                 if all(r["ok"] and r["dkdv_repeatable"] for r in rows if r["variant"] == n and f" D{d} " in r["case"])
                 and any(r["variant"] == n and f" D{d} " in r["case"] for r in rows)]
             for d in (64, 128)}
    log(f"timing the variants right in every case: {right}")
    if any(right.values()):
        lengths = tuple(int(x) for x in args.lengths.split(","))
        REC.part("2 timing")(lambda: timing(right, args.budget_s, lengths, not args.no_leaderboard))()
    log(f"wrote {REC.json_path}")
    return 0 if all(right[d] or not names_by_d[d] for d in (64, 128)) else 1


if __name__ == "__main__":
    sys.exit(main())
