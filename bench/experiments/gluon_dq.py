"""Experiment: step 06's dQ kernel in Gluon (TMA ring of K/V tiles, asynchronous wgmma): does it beat the Triton dQ
kernel, the part of step 06's backward that ncu finds furthest from the tensor pipe at D=128?

Question. Step 06's backward on Hopper is three kernels: Delta, the Gluon dK/dV kernel (solutions/gluon_dkdv.py),
and the Triton dQ kernel, which recomputes S and dP (three products a pair of tiles). ncu at N=4096 causal
(results/h200/triton/ncu_c4k/) puts the dQ kernel at 37-44% of the backward, its tensor pipe busy 65.8% of cycles at
D=64 and 57.7% at D=128 (Triton 3.6 waits for each ``tl.dot`` right after issuing it; the Gluon dK/dV kernel, at
64.1%, does not). Issue 17's forward + backward target (>= 0.90x cuDNN) is missed by most at D=128 (0.76-0.84x in
results/h200/grid_1203b/). Putting dQ into the dK/dV kernel lost (results/h200/triton/gluon_dkdv_dq_1203/); this
asks the other way: the same dQ kernel written in Gluon, with S and dP issued together and the exponentials run
while dP is on the tensor cores, every operand staged by TMA.

Method. ``_gluon_dq`` (written here, in solutions/gluon_dkdv.py since the answer below): one program per (query tile of BLOCK_M rows, head), the heaviest causal tiles first (as step
06's dQ kernel orders them); Q and dO loaded once by TMA; K and V tiles of BLOCK_N keys through a STAGES-deep TMA
ring. Per key tile j:

    issue  S = Q K_j^T  and  dP = dO V_j^T
    wait (1 left)  -> P = exp2(S * scale*log2e - LSE*log2e)   (masked on the diagonal tiles)  while dP runs
    wait (0 left)  -> dS = P (dP - D)
    issue  dQ += dS K_j  (dS from registers) ;  wait (0 left) ; refill buffer j with tile j + STAGES

Every product is waited for in its iteration (gluon_dkdv's comment says why: a product in flight across the back
edge made ptxas serialize every wgmma). After the loop dQ x scale is cast and stored.
(1) dQ against the float64 reference beside step 06's dQ error (bf16, D 64 and 128, causal N 1024 and not N 4096; fp16
once); twice, bitwise equal (no atomics: it must be deterministic).
(2) do_bench median in one run: the dQ kernel alone, step 06's Triton dQ kernel (its table's tiles, launched as
``backward`` launches it) against each variant; and the whole backward as step 06 ships it against the same
backward with the Gluon dQ kernel in place of the Triton one (Delta and dK/dV launched as step 06 launches them),
beside cuDNN's backward: bf16, FlashAttention's grid (B = 16384/N, H = 2048/D) at N 4096, 8192, 16384, D 64 and 128,
causal and not, and the leaderboard shape.

    python bench/experiments/gluon_dq.py --out DIR      # an H200: about 3 minutes
    python bench/experiments/gluon_dq.py --aot-check    # no GPU: compile for sm_90a, registers, spills, waits
(not under TRITON_INTERPRET=1: Gluon has no interpreter)

Answer: **yes at D=128, no at D=64.** One H200, 2026-12-03 14:40 UTC (the kernel of 7930943, then in this file;
results/h200/triton/gluon_dq_1203/): every variant right (dQ's error equal to step 06's to the digit, bitwise
repeatable). The dQ kernel alone against step 06's Triton one (the better of its two timings): D=128 "d128 64x64 s2
w4" **1.11x, 1.17x, 1.16x causal at N 4096/8192/16384, 1.04x, 1.09x, 1.12x without a mask**; "128x64 s2 w8"
0.93-1.08x, three stages 0.77-0.91x (one program an SM), 128-key tiles 0.81-0.98x. The whole backward with it (Delta,
the Gluon dK/dV kernel, this dQ kernel) against step 06's as shipped (the better of two runs): 1.03x, 1.02x, 1.06x
causal, 0.95x, 1.03x, 1.05x without a mask (at N=4096 the two step 06 runs differ by 5%): 0.76-0.81x cuDNN's
backward where step 06's runs read 0.71-0.78x, except 0.71x at N=4096 without a mask. D=64: the best, "d64 128x64 s3 w8"
(the Triton kernel's tiles), 0.88-0.97x the Triton kernel; smaller and larger tiles 0.63-0.93x. So step 06's
solution runs this kernel (moved into solutions/gluon_dkdv.py, ``DQ_TILES``, ``launch_dq_if_covered``) at D=128 from
N=4096, and keeps its Triton dQ kernel at D=64.

Round 2 (``--round 2``, 2026-12-03 14:40 UTC, one H200, e4c09ff; results/h200/triton/gluon_dq_1203/gluon_dq_round2.*):
gluon_dkdv_overlap's round-4 kernel with ``CARRY_DQ`` (Triton's own schedule: dQ's product left in flight across the
back edge, waited for with the next S; 170-178 registers at D=128, 138 at D=64, where capped at 128 ptxas serializes
it) beside round 1's best at each D. **No**: at D=128 it ties round 1's tiles at N=4096 and causal N=8192
(1.02-1.18x the Triton dQ kernel against 1.02-1.19x in the same run) and loses from there (0.87-1.07x against
1.10-1.17x); at D=64 0.62-0.83x. Round 1's kernel stays. The same run times step 06 as it ships since 8e2d34e (the Gluon dQ pass at
D=128): its backward 0.74-0.82x cuDNN's at D=128. Under ncu at N=4096 causal D=128 (results/h200/triton/ncu_c4k_dq/)
the shipped ``_gluon_dq`` keeps the tensor pipe 76% busy (the Triton kernel 58%): 0.780 ms against 0.995.
"""

from __future__ import annotations

import argparse
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

from bench.experiments import gpu_run  # noqa: E402
from solutions.gluon_dkdv import _gluon_dq, descriptors  # noqa: E402  (the kernel lives in the solution since 12-03)

REC = gpu_run.Record("gluon_dq")
T0 = time.time()
LOG2E = 1.4426950408889634
# name -> (D, BLOCK_M queries a program, BLOCK_N keys a step, STAGES, num_warps, maxnreg). Step 06's Triton dQ
# tiles: 128x64 on 8 warps at D=64, 64x32 on 4 warps at D=128. " carry": gluon_dkdv_overlap's round-4 dQ kernel
# with ``CARRY_DQ`` (Triton's own schedule: dQ's product left in flight across the back edge, waited for with the
# next S; measured at D=64 on the leaderboard shape only, 0.96-0.97x step 06's), here at this file's tiles (round 2).
VARIANTS = {
    "d64 128x64 s3 w8": (64, 128, 64, 3, 8, None),
    "d64 64x64 s3 w4": (64, 64, 64, 3, 4, None),
    "d64 64x64 s2 w4": (64, 64, 64, 2, 4, None),
    "d64 128x128 s2 w8": (64, 128, 128, 2, 8, None),
    "d128 64x64 s2 w4": (128, 64, 64, 2, 4, None),
    "d128 64x64 s3 w4": (128, 64, 64, 3, 4, None),
    "d128 128x64 s2 w8": (128, 128, 64, 2, 8, None),
    "d128 64x128 s2 w4": (128, 64, 128, 2, 4, None),
    "d128 64x64 s2 w4 carry": (128, 64, 64, 2, 4, None),
    "d128 64x64 s3 w4 carry": (128, 64, 64, 3, 4, None),
    "d64 128x64 s3 w8 carry": (64, 128, 64, 3, 8, None),
    "d64 128x64 s2 w8 carry": (64, 128, 64, 2, 8, None),
}
ROUNDS = {1: [x for x in VARIANTS if not x.endswith(" carry")],
          2: ["d128 64x64 s2 w4", "d128 64x64 s2 w4 carry", "d128 64x64 s3 w4 carry",
              "d64 128x64 s3 w8", "d64 128x64 s3 w8 carry", "d64 128x64 s2 w8 carry"]}
# (capped at 128 registers so that two 8-warp programs share an SM, "d64 128x64 s3 w8 carry" has ptxas serialize its
# wgmmas: --aot-check, 2026-12-03; not run)
DEFAULT = ROUNDS[1]


def kernel_of(variant):
    """(kernel, its extra options) of a variant: the solution's ``_gluon_dq``, or round 4's with ``CARRY_DQ``."""
    if variant.endswith(" carry"):
        from gluon_dkdv_overlap import _gluon_dq as round4
        return round4, dict(OVERLAP=True, CARRY_DQ=True, DP_WITH_S=True)
    return _gluon_dq, {}


def log(msg):
    REC.log(f"[{time.time() - T0:6.1f}s] {msg}")


# %% Host -----------------------------------------------------------------------------------------------------

def check_inputs(q, k, v, do, variant):
    if not (q.dim() == 4 and q.shape == k.shape == v.shape == do.shape):
        raise ValueError(f"gluon_dq takes q, k, v, dO of one shape (B, H, N, D), got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}, {tuple(do.shape)}")
    if q.dtype not in (torch.float16, torch.bfloat16) or len({t.dtype for t in (q, k, v, do)}) != 1:
        raise ValueError("gluon_dq takes 16-bit q, k, v, dO of one dtype")
    B, H, N, D = q.shape
    d, bm, bn = VARIANTS[variant][:3]
    if D != d or N % max(bm, bn):
        raise ValueError(f"gluon_dq variant {variant!r} takes D={d} and N a multiple of {max(bm, bn)}, "
                         f"got D={D}, N={N}")
    if not all(t.is_contiguous() for t in (q, k, v, do)):
        raise ValueError("gluon_dq takes contiguous (B, H, N, D) q, k, v, dO")


def launch_args(q, k, v, do, lse, delta, causal, variant, dq=None):
    """(grid, args, kwargs, dq) of one launch; tensors may be on the CPU (the compile report). ``lse``: natural-log
    float32, (B*H, N) or (B, H, N) contiguous; ``delta`` the same shape."""
    B, H, N, D = q.shape
    _, bm, bn, stages, warps, maxnreg = VARIANTS[variant]
    descs = descriptors(q, k, v, do, bm, bn)
    dq = torch.empty_like(q) if dq is None else dq
    scale = D ** -0.5
    kwargs = dict(HEAD_DIM=D, BLOCK_M=bm, BLOCK_N=bn, STAGES=stages, IS_CAUSAL=bool(causal), num_warps=warps,
                  **kernel_of(variant)[1])
    if maxnreg:
        kwargs["maxnreg"] = maxnreg
    args = (*descs, lse, delta, dq, N, scale, scale * LOG2E)
    return (B * H, N // bm), args, kwargs, dq


def dq_gluon(q, k, v, do, lse, delta, causal, variant):
    check_inputs(q, k, v, do, variant)
    grid, args, kwargs, dq = launch_args(q, k, v, do, lse, delta, causal, variant)
    kernel_of(variant)[0][grid](*args, **kwargs)
    return dq


# %% Without a GPU: the sm_90a compile ------------------------------------------------------------------------

def compile_sm90(variant: str, causal: bool):
    from gluon_fwd_overlap import compile_for_sm90
    d = VARIANTS[variant][0]
    q = torch.empty(1, 2, 1024, d, dtype=torch.bfloat16)
    lse = torch.empty(2, 1024, dtype=torch.float32)
    grid, args, kwargs, _ = launch_args(q, q, q, q, lse, lse, causal, variant)
    return compile_for_sm90(kernel_of(variant)[0], args, kwargs)


def report(variant: str, causal: bool) -> dict:
    """Registers, spills and whether ptxas serialized the wgmmas (gluon_dkdv_overlap's ``ptxas_report``, sm_90a), the
    PTX's wgmma waits and wgmma instructions, shared memory."""
    from gluon_dkdv_overlap import ptxas_report
    from gluon_fwd_overlap import wgmma_waits
    ck = compile_sm90(variant, causal)
    ptx = ck.asm["ptx"]
    r = ptxas_report(ptx)
    return {"regs": r["regs"], "spill": [int(x) for x in r["spills"].split("/")] if r["spills"] else None,
            "serialized": r["serialized"], "waits": wgmma_waits(ptx),
            "wgmma": len(re.findall(r"wgmma\.mma_async", ptx)), "smem_kb": ck.metadata.shared // 1024}


def aot_check(names) -> int:
    rows, failures = {}, 0
    for name in names:
        name, _, own_mask = name.partition("@")      # "NAME@causal" / "NAME@full": that mask alone
        for causal in ((own_mask == "causal",) if own_mask else (True, False)):
            key = f"{name} {'causal' if causal else 'full'}"
            try:
                rows[key] = report(name, causal)
            except Exception as e:  # noqa: BLE001
                failures += 1
                rows[key] = f"FAIL {type(e).__name__}: {str(e)[:1500]}"
            print(f"{key:<28} {rows[key]}", flush=True)
    print(json.dumps(rows))
    return 1 if failures else 0


# %% On a GPU -------------------------------------------------------------------------------------------------

class Step06:
    """Step 06's backward as it ships, and its three launches one by one (Delta, dK/dV, dQ), launched as
    ``backward`` launches them, so that the Triton dQ kernel can be timed alone and replaced."""

    def __init__(self, q, k, v, do, causal):
        from attnlib.loader import load_step
        from solutions import gluon_dkdv
        self.s5, self.s6, self.gk = load_step(5, "solutions"), load_step(6, "solutions"), gluon_dkdv
        self.q, self.k, self.v, self.do, self.causal = q, k, v, do, causal
        B, H, N, D = q.shape
        self.sc = D ** -0.5
        self.o, lse = self.s5.forward(q, k, v, causal, self.sc)
        self.lse = lse.reshape(B * H, N).contiguous()
        self.delta = q.new_empty((B * H, N), dtype=torch.float32)
        self.dk, self.dv, self.dq = torch.empty_like(k), torch.empty_like(v), torch.empty_like(q)
        self.cfg = self.s6.bwd_config(N, N, D, q.dtype, causal, "cuda", B * H)
        if not self.gk.takes(q, k, v, do, causal):
            raise RuntimeError(f"step 06's Gluon dK/dV kernel does not take this shape: "
                               f"{self.gk.not_covered(q, k, v, do, 'separate', causal)}")

    def shipped(self):
        return self.s6.backward(self.q, self.k, self.v, self.o, self.lse, self.do, self.causal, self.sc)

    def pre_dkdv(self):
        s6, (B, H, N, D) = self.s6, self.q.shape
        bm = self.cfg["pre"]["BLOCK_M"]
        s6._bwd_preprocess[(triton.cdiv(N, bm), B * H)](
            self.o, self.do, self.delta, *self.o.stride(), *self.do.stride(), H, N,
            HEAD_DIM=D, BLOCK_M=bm, BLOCK_D=D)
        self.gk.launch(self.q, self.k, self.v, self.do, self.lse, self.delta, self.dk, self.dv, self.causal, self.sc)

    def dq_triton(self):
        s6, (B, H, N, D) = self.s6, self.q.shape
        c = {"EARLY_DP": False, "HEADS_FIRST": False, **self.cfg["dq"]}
        kern = s6.configured(s6._bwd_dq_kernel, c)
        kern[s6._grid(triton.cdiv(N, c["BLOCK_M"]), B * H, c["HEADS_FIRST"])](
            self.q, self.k, self.v, self.do, self.lse, self.delta, self.dq,
            *self.q.stride(), *self.k.stride(), *self.v.stride(), *self.do.stride(), *self.dq.stride(),
            H, N, N, self.sc, self.sc * LOG2E,
            HEAD_DIM=D, BLOCK_D=D, IS_CAUSAL=self.causal, DOT_PRECISION=s6._dot_precision(self.q.dtype),
            **s6.tiles(c))
        return self.dq

    def dq_gluon(self, variant):
        return dq_gluon(self.q, self.k, self.v, self.do, self.lse, self.delta, self.causal, variant)

    def with_gluon_dq(self, variant):
        self.pre_dkdv()
        return self.dq_gluon(variant), self.dk, self.dv


def correctness(names) -> dict:
    from attnlib.reference import reference_backward
    rows, wrong = [], 0
    # without a mask N=4096: the Gluon dK/dV kernel (the backward's other half) starts there
    cases = [((2, 4, 1024, d), True, torch.bfloat16) for d in (64, 128)] + [((1, 2, 4096, d), False, torch.bfloat16) for d in (64, 128)]
    cases += [((1, 2, 1024, 64), True, torch.float16), ((1, 2, 1024, 128), True, torch.float16)]
    for (b, h, n, d), causal, dt in cases:
        g = torch.Generator(device="cpu").manual_seed(0)
        q, k, v, do = (torch.randn(b, h, n, d, generator=g).to("cuda", dt) for _ in range(4))
        ref = reference_backward(q, k, v, do, causal)
        s6 = Step06(q, k, v, do, causal)
        base = [float((x.double() - r).abs().max()) for x, r in zip(s6.shipped(), ref)]
        s6.pre_dkdv()
        tri = float((s6.dq_triton().double() - ref[0]).abs().max())
        case = f"B{b} H{h} N{n} D{d} {'causal' if causal else 'full'} {str(dt)[6:]}"
        for name in names:
            if VARIANTS[name][0] != d:
                continue
            try:
                got = s6.with_gluon_dq(name)
                again = s6.dq_gluon(name).clone()
                torch.cuda.synchronize()
                e = [float((x.double() - r).abs().max()) for x, r in zip(got, ref)]
                ok = e[0] <= 1.5 * base[0] + 1e-3 and all(math.isfinite(x) for x in e)
                steady = torch.equal(got[0], again)
            except Exception as ex:  # noqa: BLE001
                e, ok, steady = f"{type(ex).__name__}: {str(ex)[:300]}", False, False
            wrong += not (ok and steady)
            rows.append({"case": case, "variant": name, "err": e, "step06": base, "triton_dq_alone": tri,
                         "ok": ok, "repeatable": steady})
            log(f"  {case:<30} {name:<20} "
                + (e if isinstance(e, str) else "dQ {:.1e} dK {:.1e} dV {:.1e}".format(*e))
                + f"  (step 06 dQ {base[0]:.1e}, its dQ kernel alone {tri:.1e}) "
                + ("ok" if ok and steady else "WRONG"))
    return {"rows": rows, "wrong": wrong}


def timing(names, budget_s: float) -> dict:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    shapes = [("leaderboard", 1, 16, 16384, 64, True)] + [
        ("grid", 16384 // n, 2048 // d, n, d, c) for d in (128, 64) for c in (True, False) for n in (4096, 8192, 16384)]
    out = []
    for label, b, h, n, d, causal in shapes:
        if time.time() - T0 > budget_s:
            log(f"  budget reached: {label} N{n} D{d} and after not timed")
            break
        mine = [x for x in names if VARIANTS[x][0] == d]
        q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        s6 = Step06(q, k, v, do, causal)
        s6.pre_dkdv()
        bench = lambda fn: round(float(triton.testing.do_bench(fn, warmup=25, rep=200)), 4)   # noqa: E731
        alone = {"triton dq": bench(s6.dq_triton)}
        for name in mine:
            alone[name] = bench(lambda: s6.dq_gluon(name))
        alone["triton dq again"] = bench(s6.dq_triton)
        whole = {"step06": bench(s6.shipped)}
        for name in mine:
            whole[name] = bench(lambda: s6.with_gluon_dq(name))
        whole["step06 again"] = bench(s6.shipped)
        qg, kg, vg = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            og = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
        whole["cudnn"] = bench(lambda: torch.autograd.grad(og, (qg, kg, vg), do, retain_graph=True))
        t_dq = min(alone["triton dq"], alone["triton dq again"])
        s06 = min(whole["step06"], whole["step06 again"])
        row = {"shape": f"{label} B{b} H{h} N{n} D{d} {'causal' if causal else 'full'}", "dq_ms": alone,
               "bwd_ms": whole,
               "dq_vs_triton": {x: round(t_dq / alone[x], 3) for x in mine},
               "bwd_vs_step06": {x: round(s06 / whole[x], 3) for x in mine},
               "bwd_vs_cudnn": {x: round(whole["cudnn"] / t, 3) for x, t in whole.items() if x != "cudnn"}}
        out.append(row)
        REC.result.setdefault("timing_rows", []).append(row)
        REC.save()
        log(f"  {row['shape']:<34} dQ alone: " + "  ".join(f"{x} {t:.3f}" for x, t in alone.items()))
        log(f"  {'':34} backward: " + "  ".join(f"{x} {t:.3f}" for x, t in whole.items()))
        log(f"  {'':34} dQ vs Triton: " + "  ".join(f"{x} {r:.2f}" for x, r in row["dq_vs_triton"].items())
            + "   backward vs cuDNN: " + "  ".join(f"{x} {r:.2f}" for x, r in row["bwd_vs_cudnn"].items()))
    return {"rows": out}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--aot-check", action="store_true", help="no GPU: compile for sm_90a and report")
    ap.add_argument("--variants", default=None, help=f"comma-separated, of {', '.join(VARIANTS)}")
    ap.add_argument("--budget-s", type=float, default=200)
    ap.add_argument("--round", type=int, default=1, choices=sorted(ROUNDS),
                    help="1: the first run's tiles; 2: round 4's kernel with dQ's product left in flight across the "
                         "loop (carry) beside round 1's best at each D")
    args = ap.parse_args()
    names = args.variants.split(",") if args.variants else ROUNDS[args.round]
    if unknown := [x for x in names if x.partition("@")[0] not in VARIANTS]:
        ap.error(f"--variants: unknown {unknown}")
    if args.aot_check:
        return aot_check(names)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        ap.error("a Hopper GPU (or --aot-check)")
    if args.out is None:
        ap.error("--out DIR on a GPU")
    # Step 06 as it ships on Hopper (its Gluon dK/dV kernel), which gpu_run.Record would turn off by default.
    os.environ["ATTN_GLUON_DKDV"] = os.environ["ATTN_GLUON_FWD"] = "1"
    REC.open(args.out, ROOT)
    REC.result["gpu"] = torch.cuda.get_device_name()
    REC.part("1 correctness")(lambda: correctness(names))()
    rows = REC.result["parts"]["1 correctness"].get("rows", [])
    right = [n for n in names if rows and all(r["ok"] and r["repeatable"] for r in rows if r["variant"] == n)]
    log(f"timing the variants right in every case: {right or 'none'}")
    if right:
        REC.part("2 timing")(lambda: timing(right, args.budget_s))()
    log(f"wrote {REC.json_path}")
    return 0 if right else 1


if __name__ == "__main__":
    sys.exit(main())
