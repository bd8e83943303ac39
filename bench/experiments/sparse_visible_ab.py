"""Experiment: which statement of step 09's ``visible`` is fastest on the H200, forward and backward?

Question. ``sparse_mask_sass.py`` counts what a masked key tile costs in sm_90 instructions for three ways of
writing the same pattern (causal): per pair, ``(q - k) < W & (k - q) < W`` then the global and causal terms
("pair", 5ee4969); bounds per row, ``k > q - W & k < q + W`` ("row", 124bc77); one left edge per row, moved
below key 0 for a global query, ``(k > edge | k < G) & k <= q`` ("edge", 76defa4). Fewer instructions in every
kernel, row to edge (forward 612 -> 516, dQ 559 -> 463, dK/dV 423-481 -> 387-450). On the H200 the edge form
ran the forward faster than the row form did an hour earlier (N 32k-64k, no global token: 0.92-0.93x -> 1.01-1.02x
FlexAttention at window 256), but its forward + backward read 9-13% slower at window 1024 and at 64k window 256,
on another machine, while FlexAttention's own times matched to 1%. Kernel or machine? All three forms in one
process, alternated, say.

Method. Three copies of ``solutions/`` (in a scratch folder) differing only in ``visible``'s body; step 09 from
each, loaded side by side. Per shape (B=1, H=16, D=64, bf16, causal): each copy's output checked against the
current one's, then forward and forward + backward timed with ``triton.testing.do_bench`` (median), the
copies in turn, twice (pair, row, edge, pair, row, edge); FlexAttention once as the yardstick.

Answer (one H200, 2026-12-01 15:07 UTC, main at 76defa4 with the edge form as solutions/; `results/h200/sparse/
sparse_visible_ab_76defa4.json`, `.log`). Kernel, not machine: in one process the edge form is the fastest
forward and the slowest backward. Median ms (two passes each; FlexAttention once):

| N, window, global | forward: pair / row / edge / Flex | forward + backward: pair / row / edge / Flex |
|---|---|---|---|
| 32k, 256, 0 | 0.282 / 0.257 / **0.234** / 0.242 | 1.14-1.29 / **1.08-1.11** / 1.12 / 1.159 |
| 32k, 1024, 0 | 0.495 / 0.470 / **0.459** / 0.484 | 2.11 / **2.04-2.06** / 2.20-2.29 / 2.189 |
| 64k, 256, 0 | 0.552 / 0.505 / **0.457** / 0.466 | 2.23 / **2.11** / 2.20 / 2.338 |
| 64k, 1024, 0 | 0.999 / 0.940-0.963 / **0.929-0.965** / 0.956 | 4.24-4.26 / **4.11** / 4.36-4.78 / 4.398 |
| 32k, 256, 64 | 0.297 / 0.273 / **0.251** / 0.332 | 1.48-1.68 / 1.62-1.68 / 1.84-1.89 / 2.499 |

The edge form saves 3-10% of the forward (at window 256 it takes step 09 from 0.92-0.94x to 1.02-1.03x
FlexAttention) and costs the backward kernels 6-18% (forward + backward minus forward: 0.84 -> 0.89 ms at 32k
window 256, 1.58 -> 1.79 at 1024, 3.16 -> 3.62 at 64k window 1024), though its dK/dV and dQ loops are shorter
in sm_90 code (sparse_mask_sass.py). Why is open: the count of a loop body says nothing of how ptxas
schedules the products around it, and only a profile of the two dK/dV kernels on the GPU would. Step 09
keeps the row form, the fastest forward + backward (training runs both); the edge form is the forward's lead.

    python bench/experiments/sparse_visible_ab.py --out DIR [--budget-s 150]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

BODY_START = "def visible("
FORMS = {
    "pair": ("    seen = ((q_idx - k_idx) < WINDOW) & ((k_idx - q_idx) < WINDOW)\n"
             "    seen = seen | (k_idx < N_GLOBAL) | (q_idx < N_GLOBAL)\n"
             "    if IS_CAUSAL:\n"
             "        seen = seen & (k_idx <= q_idx)\n"
             "    return seen\n"),
    "row": None,     # solutions/ as it is (since the answer below)
    "edge": ("    if IS_CAUSAL:\n"
             "        edge = q_idx - WINDOW - (q_idx < N_GLOBAL) * (q_idx + 1)\n"
             "        seen = ((k_idx > edge) | (k_idx < N_GLOBAL)) & (k_idx <= q_idx)\n"
             "    else:\n"
             "        seen = ((k_idx > (q_idx - WINDOW)) & (k_idx < (q_idx + WINDOW))) | (q_idx < N_GLOBAL) | (k_idx < N_GLOBAL)\n"
             "    return seen\n"),
}


def make_copy(form: str, dst: Path) -> Path:
    """A copy of solutions/ whose ``visible`` computes ``form``: the body between the STUDENT markers replaced."""
    shutil.copytree(ROOT / "solutions", dst, ignore=shutil.ignore_patterns("__pycache__", "csrc"))
    if FORMS[form] is None:
        return dst
    path = dst / "step09_sparse.py"
    text = path.read_text()
    start = text.index(BODY_START)
    open_ = text.index("\n", text.index("# >>> STUDENT", start)) + 1
    close = text.index("    # <<< STUDENT", open_)
    path.write_text(text[:open_] + FORMS[form] + text[close:])
    return dst


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=150)
    ap.add_argument("--shapes", default="32768:256:0,32768:1024:0,65536:256:0,65536:1024:0,32768:256:64")
    args = ap.parse_args(argv)
    import torch
    import triton
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from attnlib.loader import load_step
    from bench.core import machine_info
    from bench.sparse_gpu import make_mask_mod

    t0 = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    logf = open(args.out / "sparse_visible_ab.log", "w")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    tmp = Path(tempfile.mkdtemp(prefix="visible_ab_"))
    mods = {f: load_step(9, make_copy(f, tmp / f)) for f in FORMS}
    result = {"machine": machine_info(), "rows": []}
    H, D = 16, 64
    for shape in args.shapes.split(","):
        N, W, G = (int(x) for x in shape.split(":"))
        row = {"N": N, "window": W, "n_global": G}
        if time.monotonic() - t0 > args.budget_s:
            row["status"] = "skipped: budget"
            result["rows"].append(row)
            continue
        try:
            torch.manual_seed(0)
            q, k, v = (torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
            do = torch.randn_like(q)
            with torch.no_grad():
                ref = mods["row"].attention_sparse(q, k, v, W, G, is_causal=True)
                for f, m in mods.items():
                    err = float((m.attention_sparse(q, k, v, W, G, is_causal=True) - ref).abs().max())
                    row[f"{f}_max_abs_diff_vs_row"] = err
                    if err > 1e-2:
                        raise RuntimeError(f"form {f} differs from row by {err}")
            torch._dynamo.reset()
            flex = torch.compile(flex_attention)
            bm = create_block_mask(make_mask_mod(W, G), 1, 1, N, N, device="cuda")
            times = {}
            for mode in ("fwd", "fwd+bwd"):
                ctx = torch.no_grad() if mode == "fwd" else torch.enable_grad()
                with ctx:
                    for rep in range(2):
                        for f, m in mods.items():
                            def call(m=m):
                                o = m.attention_sparse(q, k, v, W, G, is_causal=True)
                                if mode != "fwd":
                                    o.backward(do)
                            times.setdefault(f"{mode} {f}", []).append(
                                round(float(triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median")), 4))

                    def theirs():
                        o = flex(q, k, v, block_mask=bm)
                        if mode != "fwd":
                            o.backward(do)
                    times[f"{mode} flex"] = [round(float(triton.testing.do_bench(theirs, warmup=25, rep=100,
                                                                                 return_mode="median")), 4)]
                q.grad = k.grad = v.grad = None
            row["ms"] = times
            row["status"] = "ok"
            log(f"N={N} W={W} G={G}: " + "; ".join(f"{key} {vals}" for key, vals in times.items()))
        except Exception as exc:  # noqa: BLE001 - recorded, the next shape goes on
            row["status"] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            log(f"N={N} W={W} G={G}: {row['status']}")
        result["rows"].append(row)
        (args.out / "sparse_visible_ab.json").write_text(json.dumps(result, indent=1) + "\n")
    log(f"done in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
