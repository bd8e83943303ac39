"""Experiment: does warp specialization (a TMA producer warp, consumer warpgroups on their own 64 query rows) take the
Gluon forward past step 05 toward cuDNN on Hopper?

Question. ``gluon_fwd_overlap.py`` wrote FlashAttention-3's intra-warpgroup order in Gluon (S_j waited for alone,
its softmax under P_{j-1} V_{j-1}) in a kernel whose every warp also issues the TMA loads and waits at a CTA-wide
barrier before refilling a buffer: 0.95-1.03x step 05 at D=64, 0.87-0.92x at D=128. What FlashAttention-3 and
cuDNN add on top is warp specialization: one producer warp that only issues TMA loads, running ahead of the
consumers by as many stages as shared memory holds, and consumer warpgroups that never wait for one another
(each owns 64 query rows of the CTA's tile, shares the CTA's K and V buffers, and hands a buffer back by an
mbarrier arrive once its products reading it are done), with the registers moved from the producer to the
consumers (``setmaxnreg``: Gluon's ``worker_num_regs`` and the kernel's ``maxnreg``). Triton 3.6 has
``gl.warp_specialize`` on Hopper. Does it pay, against the non-specialized Gluon kernel, step 05, and cuDNN?

Method. One kernel (``_gluon_fwd_ws``): ``gl.warp_specialize`` with the default partition as consumer warpgroup 0
(``num_warps=4``), NUM_WG - 1 consumer partitions of 4 warps and one loader partition of 1 warp. Q by TMA into
NUM_WG 64-row buffers; K and V into STAGES buffers, each with a ``ready`` mbarrier (the TMA's bytes) and an
``empty`` one (NUM_WG arrivals, one per consumer once P V of that tile is waited for). Each consumer runs
``gluon_fwd_overlap``'s intra-warpgroup order on its 64 rows and stores its O and LSE. Causal: every consumer
steps through the CTA's key tiles (the buffer protocol needs all of them), masking its own diagonal; N need not be a
multiple of the tiles (the last key tile masked past N, the rows past N not stored). (1) O and LSE
against the float64 reference beside step 05's errors (bf16, causal and not, D 64 at N=1024 and D 128 at N=4096;
fp16 once). (2) forward only, do_bench median (rep 300 ms), bf16: the CS336 leaderboard shape and FlashAttention's
grid at N 4096 and 16384 (B = 16384/N, H = 2048/D), each variant beside step 05, ``gluon_fwd_overlap``'s best
("overlap 128x64 s3 w8") and cuDNN's SDPA forward in the same run.

    python bench/experiments/gluon_fwd_ws.py --out DIR [--round 2]    # an H200: about 3 minutes
    python bench/experiments/gluon_fwd_ws.py --aot-check   # no GPU: compile every variant for sm_90a
(not under TRITON_INTERPRET=1; tests/test_experiment_gluon_fwd_ws.py compiles in a subprocess.)

Answer: yes at N=16384, no at N=4096. One H200, 2026-12-03 06:16 UTC (25ed783's kernel; results/h200/triton/
gluon_fwd_ws_1203/). Every variant right (O and LSE at step 05's errors, bf16 and fp16, ragged N 1088 and 4032) and
bitwise repeatable. At N=16384 against step 05 (the faster of its two timings) and cuDNN in the same run: D=64
three consumer warpgroups with 128-key tiles ("ws 3wg n128 s2") 1.08x causal (2.521 against 2.711 ms; 0.99x cuDNN),
1.14x not (4.564 against 5.198; **1.06x cuDNN**); D=128 two warpgroups, three stages ("ws 2wg n128 s3") 1.04x causal
(1.01x cuDNN), 1.09x not (0.99x cuDNN). The leaderboard shape level (1.268 against 1.277, cuDNN 1.265). At N=4096
it loses or ties: D=64 causal 0.99x step 05 at best, not causal 1.02x; D=128 0.96x causal, 1.03x not. Ping-pong
(consumers issuing in turns) ran 0.95-1.06x the same kernel without it: it paid (1.05x) only at D=128 N=16384 with
two stages, where three stages without it ran faster still (1.949 against 2.288 ms causal); two stages at D=128 and 64-key tiles lost everywhere. So
step 05's solution hands N >= 16384 on Hopper to this kernel at those two tile sets (solutions/gluon_fwd.py); since
round 2's run, N >= 8192.

Round 2 (``--round 2``): the same partitions made persistent (``_gluon_fwd_ws_persistent``: one CTA an SM walking
work tiles, the loader running on into the next tile's Q and K/V while the consumers finish this one), against round
1's best and step 05 at N 4096, 8192 and 16384: does it take N=4096 past step 05 and toward cuDNN, and where should
MIN_LEN be? ``--aot-check --round 2``: no spill but 24 B at D=64 causal with three consumer warpgroups.
Answer: only without a causal mask at D=64. One H200, 2026-12-03 08:15 UTC (bbdc6c7's tree;
results/h200/triton/gluon_fwd_ws_1203_round2/), every variant right. "pers 3wg n128 s3" at D=64 not causal: 1.159,
2.225, 4.362 ms at N 4096/8192/16384 against round 1's 1.261, 2.265, 4.441 and step 05's 1.317, 2.626, 5.146
(**1.04x, 1.08x, 1.10x cuDNN**). Causal it loses to round 1 (0.81-0.98x cuDNN against 0.83-1.00x) and at D=128 it
runs 8-18% slower than round 1 everywhere (not profiled). Causal N=4096
stays at step 05's 0.83x (D=64) and 0.90x (D=128) cuDNN: neither round moves it. The same run timed round 1's
shipped tiles at N=8192 for the first time: 1.07x step 05 at D=64 causal, 1.16x not, 1.01x and 1.07x at D=128, so
step 05's solution takes the kernel from N=8192 (MIN_LEN) under a causal mask; without one from N=4096 since 12-03
(FULL_MIN_LEN: there round 1's tiles ran 1.04x step 05 at D=64 and 1.07x at D=128 in this run, 1.02x and 1.03x in
round 1's). And at D=64 without a causal mask step 05 runs the persistent kernel since 12-03 ("pers 3wg n128 s3",
``PERSISTENT_TILES`` in solutions/gluon_fwd.py, where the kernel now lives; this file imports it).

Round 3 (``--round 3``; run 2026-12-03 13:52 UTC on one H200, 4a90375, results/h200/triton/gluon_fwd_ws_1203_round3/): causal attention at N=4096 is the forward's
largest gap left (0.86x cuDNN at D=64 in results/h200/grid_1203c/), and ncu there (results/h200/triton/ncu_c4k/)
finds step 05 issue-bound on its own loads, which a TMA producer would take off the consumers, while round 1's kernel
loses at that length to its per-CTA cost (one CTA an SM: nothing overlaps a CTA's Q load, ring fill and epilogue)
and round 2's persistent form lost under the mask. Here round 1's kernel with two CTAs an SM (``ws 2wg n64 s2
r80``: maxnreg 80, consumers 104, 64-key tiles, two stages, 48 KB), so that one CTA's prologue and epilogue run
beside the other's loop; D=64, N 4096 and 8192, causal and not, against round 1's tiles, the persistent kernel,
step 05 and cuDNN. ``--aot-check --quick --masks causal,full --variants "ws 2wg n64 s2 r80"`` (ptxas 13.0, no GPU):
80 registers, 48 B spilled (96 consumers: 144 B), setmaxnreg 24 and 104, each consumer's P V left in flight under
its softmax (one ``wgmma.wait_group 1`` each).
Answer: **no.** Every variant right. D=64 causal N=4096: "ws 2wg n64 s2 r80" 0.854 ms, 0.78x cuDNN (0.665), against
step 05's Triton kernel 0.803-0.807 (0.82-0.83x), round 1's "ws 2wg n128 s3" 0.803 (0.83x), the persistent kernel
0.831; it is the slowest Gluon variant at every shape of the round (0.85-0.95x cuDNN elsewhere). Two CTAs an SM do
not hide the per-CTA cost at this length; the causal N=4096 forward stays step 05's Triton kernel (0.82-0.83x
cuDNN in this run, D=128 0.84-0.89x).

Round 4 (``--round 4``, run at 8458cf3; gone since the skip shipped): under a causal mask every consumer computed
every key tile of its CTA, also those wholly past its own rows' diagonal: with three warpgroups and 128-key tiles
that is 11% of the products and exponentials at N=4096 (rows past N included), 4% at 8192, 2% at 16384; with two
warpgroups none. ``_gluon_fwd_ws_skip`` is the
solution's kernel with consumers that compute only the key tiles their rows see and hand the rest of the CTA's
buffers back once filled (``_skip_consumer``; the loader is the solution's). Does the causal forward at N=4096 (0.82x
cuDNN at D=64, 0.93x at D=128 in results/h200/grid_1203e/) and D=64 N=8192 (0.90x) gain, against the same tiles
without the skip, step 05 and cuDNN, N 4096-16384, causal only? ``--aot-check``: at the shipped tiles the same
registers (128 at D=64), no spill, one ``wgmma.wait_group 1`` a consumer, as the kernel without the skip. If the
skip pays only where tensor work is saved, a 3-warpgroup row gains at most ~10% at N=4096 and the 2-warpgroup rows
nothing: the rest of the causal gap is then per-CTA cost, not wasted work.
Answer: **a little, not enough.** One H200, 2026-12-03 18:22 UTC, 32f81f9's tree (results/h200/triton/
gluon_fwd_ws_1203_round4/); every variant right and repeatable. With three warpgroups the skip ran 1.01-1.03x the
same tiles without it at 128-key tiles (D=64 causal, N 4096-16384 and the leaderboard shape) and 1.03-1.09x at
64-key tiles for N <= 8192; with two warpgroups (nothing to skip) 0.98-1.00x at D=64 and 0.92-1.07x at D=128. The
gaps: D=64 causal N=4096 best 0.843x cuDNN against step 05's 0.836x; N=8192 "skip 3wg n128 s2" 0.945x against the
shipped kernel's 0.929x. Wasted work is not what holds the causal N=4096 forward back. Shipped the session after
(1-2% at N >= 8192, where step 05 takes this kernel under a causal mask): the solution's ``_ws_consumer`` skips
wherever a CTA holds more rows than a key tile (``SKIP_PAST_DIAGONAL``: three warpgroups and 128-key tiles, D=64),
so the kernel at D=128's tiles (two warpgroups, 128 keys) compiles as before; round 4's copy is in git history.

Round 5 (``--round 5``): the solution's kernel with the skip, at round 4's shapes (causal, N 4096-16384), against step
05 and cuDNN in the same run: do round 4's ratios hold once it is the solution's own consumer?
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import (  # noqa: E402
    mbarrier, tma, warpgroup_mma, warpgroup_mma_wait)

from bench.experiments import gpu_run  # noqa: E402
from bench.experiments import gluon_fwd_overlap as gfo  # noqa: E402
from solutions.gluon_fwd import _gluon_fwd_ws, _gluon_fwd_ws_persistent  # noqa: E402
from solutions.gluon_fwd import launch_args as _solution_launch_args  # noqa: E402
from solutions.gluon_fwd import persistent_launch_args  # noqa: E402

REC = gpu_run.Record("gluon_fwd_ws")
log = REC.log
T0 = time.time()
LOG2E = 1.4426950408889634


# %% The kernel -----------------------------------------------------------------------------------------------
# Step 05's since this experiment's first run: solutions/gluon_fwd.py holds ``_gluon_fwd_ws`` (and the partitions
# ``_ws_loader``, ``_ws_consumer``); this file times its variants.

# Round 2: the same partitions made persistent (``_gluon_fwd_ws_persistent``, ``_pers_loader``, ``_pers_consumer``,
# ``_tile_coords``): written here, in solutions/gluon_fwd.py since step 05 runs it at D=64 without a causal mask.

# Round 4: under a causal mask every consumer of ``_gluon_fwd_ws`` computed every key tile of its CTA, including the
# ones wholly past its own 64 rows' diagonal (with three warpgroups and 128-key tiles at N=4096, 11% of the products
# and exponentials were of fully masked scores or of rows past N). Round 4's ``_skip_consumer`` computed only the key
# tiles its rows see, then handed the rest of the CTA's buffers back untouched. Since round 4 the solution's
# ``_ws_consumer`` does that itself (SKIP_PAST_DIAGONAL); the copy and its ``skip ...`` variants are in git history
# (8458cf3). Round 5 times the solution's kernel with it at round 4's shapes.

# %% Host ---------------------------------------------------------------------------------------------------

VARIANTS = {
    # name: (NUM_WG, BLOCK_N, STAGES, maxnreg, consumer regs, loader regs, PINGPONG). A warpgroup is the unit of
    # registers: (NUM_WG + 1) warpgroups x 128 threads x maxnreg <= 65536; the default partition (consumer 0) gets
    # what is left.
    "ws 2wg n128 s2": (2, 128, 2, 168, 240, 24, False),
    "ws 2wg n128 s3": (2, 128, 3, 168, 240, 24, False),
    "ws 2wg n64 s3": (2, 64, 3, 168, 240, 24, False),
    "ws 2wg n64 s4": (2, 64, 4, 168, 240, 24, False),
    "ws 3wg n128 s2": (3, 128, 2, 128, 160, 24, False),
    "ws 3wg n64 s3": (3, 64, 3, 128, 160, 24, False),
    "ws 2wg n128 s2 pp": (2, 128, 2, 168, 240, 24, True),
    "ws 2wg n64 s3 pp": (2, 64, 3, 168, 240, 24, True),
    "ws 3wg n128 s2 pp": (3, 128, 2, 128, 160, 24, True),
    # Round 3: two CTAs an SM (3 warpgroups x 128 threads x 80 registers = 30720, under half the SM's 65536), so one
    # CTA's prologue and epilogue run beside the other's main loop; 64-key tiles, two stages (48 KB of shared memory).
    "ws 2wg n64 s2 r80": (2, 64, 2, 80, 104, 24, False),
}
# Round 2: persistent (``_gluon_fwd_ws_persistent``), (NUM_WG, BLOCK_N, STAGES, maxnreg, consumer regs, loader regs).
PERSISTENT = {
    "pers 3wg n128 s2": (3, 128, 2, 128, 160, 24),
    "pers 3wg n128 s3": (3, 128, 3, 128, 160, 24),
    "pers 2wg n128 s2": (2, 128, 2, 168, 240, 24),
    "pers 2wg n128 s3": (2, 128, 3, 168, 240, 24),
}
ROUNDS = {1: [v for v in VARIANTS if "r80" not in v],
          2: ["ws 3wg n128 s2", "ws 2wg n128 s3"] + list(PERSISTENT),    # round 1's best (step 05's since), persistent
          3: ["ws 3wg n128 s2", "ws 2wg n128 s3", "ws 2wg n64 s2 r80", "pers 3wg n128 s3"],   # two CTAs an SM
          5: ["ws 3wg n128 s2", "ws 2wg n128 s3", "ws 3wg n64 s3"]}   # round 4's shapes, the consumers skipping since
GLUON_BASELINE = "overlap 128x64 s3 w8"     # gluon_fwd_overlap's best kernel (not warp-specialized)


def check_inputs(q, k, v):
    if not (q.dim() == 4 and q.shape == k.shape == v.shape):
        raise ValueError(f"gluon_fwd_ws takes q, k, v of one shape (B, H, N, D), got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.dtype not in (torch.float16, torch.bfloat16) or not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"gluon_fwd_ws takes 16-bit q, k, v of one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    B, H, N, D = q.shape
    if D not in (64, 128) or N % 64:
        raise ValueError(f"gluon_fwd_ws takes D 64 or 128 and N a multiple of 64 (an experiment's limits), "
                         f"got D={D}, N={N}")
    if not all(t.is_contiguous() for t in (q, k, v)):
        raise ValueError("gluon_fwd_ws takes contiguous (B, H, N, D) q, k, v")


def fits(variant: str, d: int) -> bool:
    """Shared memory: Q's NUM_WG 64-row blocks (two sets when persistent) and STAGES K and V tiles within Hopper's
    227 KB."""
    wg, bn, stages = (PERSISTENT.get(variant) or VARIANTS[variant])[:3]
    if wg == 3 and d == 128:
        return False        # the consumers' 160 registers spill ~830 B at D=128 (--aot-check)
    if "r80" in variant and d == 128:
        return False        # 104 registers a consumer thread cannot hold a 64x128 fp32 O at D=128
    q_sets = 2 if variant in PERSISTENT else 1
    return (q_sets * wg * 64 * d + stages * 2 * bn * d) * 2 + 1024 <= 227 * 1024


def applies(variant: str, d: int, causal: bool) -> bool:
    """Whether the variant is run at this head dim and mask: ``fits`` (every variant runs under both masks)."""
    return fits(variant, d)


def launch_args(q, k, v, causal, variant, o=None, lse=None):
    """(grid, args, kwargs, o, lse) of one launch; tensors may be on the CPU (the compile report)."""
    B, H, N, D = q.shape
    o = torch.empty_like(q) if o is None else o
    lse = torch.empty(B, H, N, device=q.device, dtype=torch.float32) if lse is None else lse
    if variant in PERSISTENT:
        grid, args, kwargs = persistent_launch_args(q, k, v, o, lse, D ** -0.5, PERSISTENT[variant], causal)
        return grid, args, kwargs, o, lse
    wg, bn, stages, maxnreg, cregs, lregs, pp = VARIANTS[variant]
    grid, args, kwargs = _solution_launch_args(q, k, v, o, lse, causal, D ** -0.5,
                                               (wg, bn, stages, maxnreg, cregs, lregs), pingpong=pp)
    return grid, args, kwargs, o, lse


def forward(q, k, v, causal, variant):
    check_inputs(q, k, v)
    grid, args, kwargs, o, lse = launch_args(q, k, v, causal, variant)
    kernel(variant)[grid](*args, **kwargs)
    return o, lse


def kernel(variant: str):
    """The ``@gluon.jit`` kernel a variant launches."""
    return _gluon_fwd_ws_persistent if variant in PERSISTENT else _gluon_fwd_ws


# %% (1) correctness ---------------------------------------------------------------------------------------

def correctness(names) -> dict:
    from attnlib.loader import load_step
    from attnlib.reference import reference_attention
    s5 = load_step(5, "solutions")
    rows, wrong = [], 0
    # N 1088 and 4032: neither a multiple of 128 keys nor of 192 rows (the last tiles' masks); 4096 at D=128.
    cases = [((2, 4, 1088, 64), c, torch.bfloat16) for c in (True, False)] + \
        [((1, 4, 4096, 128), c, torch.bfloat16) for c in (True, False)] + \
        [((1, 2, 4032, 128), False, torch.bfloat16), ((1, 2, 2048, 64), True, torch.float16)]
    for (b, h, n, d), causal, dt in cases:
        g = torch.Generator(device="cpu").manual_seed(0)
        q, k, v = (torch.randn(b, h, n, d, generator=g).to("cuda", dt) for _ in range(3))
        ro, rl = reference_attention(q, k, v, causal)
        o5, l5 = s5.forward(q, k, v, causal, d ** -0.5)
        base = (float((o5.double() - ro).abs().max()), float((l5.double() - rl).abs().max()))
        case = f"B{b} H{h} N{n} D{d} {'causal' if causal else 'full'} {str(dt)[6:]}"
        for name in names:
            if not applies(name, d, causal):
                continue
            try:
                o, lse = forward(q, k, v, causal, name)
                torch.cuda.synchronize()
                e = (float((o.double() - ro).abs().max()), float((lse.double() - rl).abs().max()))
                ok = all(x <= 1.5 * y + 1e-3 for x, y in zip(e, base)) and all(math.isfinite(x) for x in e)
                # The same call again: a race between the loader and the consumers shows as a result that changes.
                o2, _ = forward(q, k, v, causal, name)
                torch.cuda.synchronize()
                same = bool(torch.equal(o, o2))
                ok = ok and same
            except Exception as ex:  # noqa: BLE001
                e, ok, same = f"{type(ex).__name__}: {str(ex)[:300]}", False, None
            wrong += not ok
            rows.append({"case": case, "variant": name, "err": e, "step05": base, "repeatable": same, "ok": ok})
            log(f"  {case:<30} {name:<18} {e if isinstance(e, str) else f'O {e[0]:.1e} LSE {e[1]:.1e}'}"
                f"  (step 05 O {base[0]:.1e} LSE {base[1]:.1e}) {'' if same else 'NOT REPEATABLE '}"
                f"{'ok' if ok else 'WRONG'}")
    return {"rows": rows, "wrong": wrong}


# %% (2) timing ---------------------------------------------------------------------------------------------

def timing(budget_s: float, names, lengths=(4096, 16384), masks=(True, False)) -> dict:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attnlib.loader import load_step
    s5 = load_step(5, "solutions")
    shapes = [("leaderboard", 1, 16, 16384, 64, True)] + [
        ("grid", 16384 // n, 2048 // d, n, d, c) for d in (64, 128) for c in masks for n in lengths]
    rows = []
    for label, b, h, n, d, causal in shapes:
        if time.time() - T0 > budget_s:
            log(f"  budget reached: {label} B{b} H{h} N{n} D{d} and after not timed")
            break
        q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        row = {"shape": f"{label} B{b} H{h} N{n} D{d} {'causal' if causal else 'full'}", "ms": {}}

        def bench(fn):
            fn()
            return round(float(triton.testing.do_bench(fn, rep=300)), 4)
        row["ms"]["step05"] = bench(lambda: s5.forward(q, k, v, causal, d ** -0.5))
        try:
            row["ms"]["gluon " + GLUON_BASELINE] = bench(lambda: gfo.forward(q, k, v, causal, GLUON_BASELINE))
        except Exception as ex:  # noqa: BLE001
            row["ms"]["gluon " + GLUON_BASELINE] = f"{type(ex).__name__}: {str(ex)[:200]}"
        for name in names:
            if not applies(name, d, causal):
                continue
            try:
                row["ms"][name] = bench(lambda: forward(q, k, v, causal, name))
            except Exception as ex:  # noqa: BLE001
                row["ms"][name] = f"{type(ex).__name__}: {str(ex)[:200]}"
        row["ms"]["step05 again"] = bench(lambda: s5.forward(q, k, v, causal, d ** -0.5))
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]), torch.no_grad():
            row["ms"]["cudnn"] = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
        s05 = min(row["ms"]["step05"], row["ms"]["step05 again"])
        row["vs_cudnn"] = {x: round(row["ms"]["cudnn"] / t, 3) for x, t in row["ms"].items()
                           if isinstance(t, float) and x != "cudnn"}
        row["vs_step05"] = {x: round(s05 / t, 3) for x, t in row["ms"].items() if isinstance(t, float)
                            and x not in ("cudnn", "step05", "step05 again")}
        rows.append(row)
        log(f"  {row['shape']:<34} " + "  ".join(f"{x} {t if isinstance(t, str) else f'{t:.3f}'}"
                                                  for x, t in row["ms"].items()))
        log(f"  {'':34} vs cuDNN: " + "  ".join(f"{x} {r:.2f}" for x, r in row["vs_cudnn"].items()))
        REC.result["timing_rows"] = rows
        REC.save()
    return {"rows": len(rows)}


# %% --aot-check --------------------------------------------------------------------------------------------

def compile_sm90(variant: str, d: int, causal: bool):
    """The kernel of ``variant`` compiled for sm_90a without a GPU (``gluon_fwd_overlap.compile_for_sm90``)."""
    q = torch.empty(1, 2, 1024, d, dtype=torch.bfloat16)
    grid, args, kwargs, _, _ = launch_args(q, q, q, causal, variant)
    return gfo.compile_for_sm90(kernel(variant), args, kwargs)


def report(variant: str, d: int, causal: bool) -> dict:
    """Registers (ptxas, per the kernel's maxnreg), spills, shared memory, the setmaxnreg values in the PTX and its
    wgmma waits."""
    import re
    ck = compile_sm90(variant, d, causal)
    ptx = ck.asm["ptx"]
    out = {"smem_kb": ck.metadata.shared // 1024, "waits": gfo.wgmma_waits(ptx),
           "setmaxnreg": sorted({int(m) for m in re.findall(r"setmaxnreg\.\w+\.sync\.aligned\.u32\s+(\d+)", ptx)}),
           # mbarrier waits and arrives written in the PTX (not executed): the skip's hand-back loop adds one of each
           # to every consumer
           "mbarrier": {"wait": len(re.findall(r"mbarrier\.try_wait", ptx)),
                        "arrive": len(re.findall(r"mbarrier\.arrive", ptx))}}
    ptxas = gpu_run.triton_tool("ptxas")
    if ptxas:
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / "k.ptx"
            p.write_text(ptx)
            r = subprocess.run([ptxas, "-v", "--gpu-name=sm_90a", str(p), "-o", str(p) + ".o"],
                               capture_output=True, text=True)
            mr = re.search(r"Used (\d+) registers", r.stderr)
            ms_ = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)
            if r.returncode or not mr:
                raise RuntimeError(f"ptxas on {variant} D={d}: {r.stderr[-1500:]}")
            out["regs"] = int(mr.group(1))
            out["spill"] = [int(ms_.group(1)), int(ms_.group(2))] if ms_ else None
            out["ptxas_warnings"] = [ln for ln in r.stderr.splitlines() if "warning" in ln.lower()]
    return out


def aot_check(names, quick=False, masks=None) -> int:
    """Compile ``names`` for sm_90a (D 64 and 128, causal and not; ``quick``: D=64 causal alone, or D=64 with
    ``masks``, a subset of ("causal", "full"); a name written "NAME@causal" or "NAME@full" under that mask alone) and
    print ``report``'s figures, the last line all of them as JSON."""
    failures = 0
    rows = {}
    for name in names:
        name, _, own_mask = name.partition("@")
        for d in ((64,) if quick else (64, 128)):
            if not fits(name, d):
                continue
            if own_mask or masks:
                causals = tuple(m == "causal" for m in ([own_mask] if own_mask else masks))
            else:
                causals = (True,) if quick else (True, False)
            for causal in causals:
                if not applies(name, d, causal):
                    continue
                key = f"{name} D{d} {'causal' if causal else 'full'}"
                try:
                    rows[key] = report(name, d, causal)
                except Exception as e:  # noqa: BLE001
                    failures += 1
                    rows[key] = f"FAIL {type(e).__name__}: {str(e)[:1500]}"
                print(f"{key:<34} {rows[key]}", flush=True)
    print(json.dumps(rows))
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path)
    ap.add_argument("--aot-check", action="store_true", help="no GPU: compile for sm_90a and report")
    ap.add_argument("--quick", action="store_true", help="with --aot-check: D=64 causal only")
    ap.add_argument("--masks", default=None, help="with --aot-check --quick: D=64 under these masks, of causal,full")
    ap.add_argument("--budget-s", type=float, default=240)
    ap.add_argument("--variants", default=None, help="comma-separated names of VARIANTS or PERSISTENT (default: "
                                                     "the round's)")
    ap.add_argument("--round", type=int, default=1, choices=sorted(ROUNDS),
                    help="1: the first run's variants; 2: persistent, beside round 1's best, N 4096-16384; "
                         "3: two CTAs an SM at D=64, N 4096-8192; 5: causal, N 4096-16384, the consumers skipping "
                         "the key tiles past their diagonal (round 4's copy shipped; the copy is in git history)")
    args = ap.parse_args()
    names = args.variants.split(",") if args.variants else ROUNDS[args.round]
    if args.aot_check:
        masks = args.masks.split(",") if args.masks else None
        if masks and not set(masks) <= {"causal", "full"}:
            ap.error(f"--masks: causal and/or full, got {args.masks}")
        return aot_check(names, args.quick, masks)
    if not torch.cuda.is_available():
        ap.error("a Hopper GPU (or --aot-check)")
    if args.out is None:
        ap.error("--out DIR on a GPU")
    REC.open(args.out, ROOT)
    REC.result["gpu"] = torch.cuda.get_device_name()

    @REC.part("1 correctness")
    def part1():
        r = correctness(names)
        REC.result["right_variants"] = sorted({x["variant"] for x in r["rows"]} -
                                              {x["variant"] for x in r["rows"] if not x["ok"]})
        return r
    part1()
    right = REC.result.get("right_variants", [])
    timed = [x for x in names if x in right]
    log(f"timing the variants right in every case: {timed or 'none'}")

    @REC.part("2 forward timing")
    def part2():
        lengths = {2: (4096, 8192, 16384), 3: (4096, 8192), 5: (4096, 8192, 16384)}.get(args.round, (4096, 16384))
        masks = (True,) if args.round == 5 else (True, False)     # round 5: where the consumers skip, a causal mask
        return timing(args.budget_s, timed, lengths, masks)
    if timed:
        part2()
    REC.save()
    log(f"wrote {REC.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
