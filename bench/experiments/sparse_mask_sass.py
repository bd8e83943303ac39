"""Experiment: how many instructions does step 09's mask cost per key tile? (sm_90 SASS, no GPU needed)

Question. Under ncu (results/h200/sparse/sparse_vs_flex_ncu_5c8a7ee.csv) step 09's forward at window 256
issues about 1.45x the instructions of FlexAttention's and runs at 0.85x its speed; 128-key tiles did not
help (sparse_fwd_tiles_295108e.json). At window 256 four of a query tile's six key tiles run the masked
stage. What does one masked iteration cost against an unmasked one, and how much of it is ``visible``?

Method. Compile step 09's kernels for sm_90 without a GPU (Triton's own binder on CPU tensors of the
timed shape: B=1, H=16, N=32768, D=64, bf16, causal, window 256, no global token; the tile table of an
H200), disassemble with the cuobjdump Triton ships, and count the SASS instructions of every loop (a
backward branch to an earlier address closes a loop body). ``--solutions DIR`` compiles another copy of
the steps (a variant of ``visible`` in it, say).

Answer (2026-12-01, triton 3.6). Instructions per loop body, one iteration = one 128x64 key tile (forward,
8 warps) or 32x64 / 128x64 tiles (dK/dV / dQ), for three statements of ``visible`` (causal):

| kernel | unmasked stage | ``(q - k) < W & (k - q) < W``, then the global and causal terms (5ee4969) | ``k > q - W & k < q + W`` (124bc77) | causal form: ``(k > edge or k < G) and k <= q``, edge per row | no window test at all |
|---|---|---|---|---|---|
| forward | 319-326 | 780 | 612 | 513-516 | 369 |
| dQ | 266 | 731 | 559 | 463 | |
| dK/dV | 230-247 | 489-556 | 423-481 | 387-450 | |

A masked forward iteration cost 2.4x an unmasked one, and most of the difference was ``visible``'s
per-pair arithmetic: a subtraction per pair, then a compare, and the global and causal terms each one
more compare and logic operation per pair. Computing what depends on the row once per row (q - W, q + W:
q_idx is a column of rows) took a masked forward iteration from 780 to 612 instructions; writing the
causal pattern as one left edge per row (moved below key 0 for a global query) and k <= q, with the
global keys as one more term, to 513-516. A query tile at window 256 (two unmasked key tiles, four
masked) goes from about 3770 instructions to 2700 (-28%); dQ -37% per masked tile, dK/dV -19%. Timed on
the H200 (``sparse_visible_ab.py``, all three in one process): the row form's forward is 5-9% faster than
the pair form's, and the edge form's 3-10% faster again, but the edge form's backward is 6-18% slower than
the row form's though its loops are shorter here: instruction counts do not say how ptxas schedules the
products around them. Step 09 uses the row form (the fastest forward + backward).

    python bench/experiments/sparse_mask_sass.py                      # solutions/
    python bench/experiments/sparse_mask_sass.py --solutions DIR      # another copy of the steps
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)       # compiling for sm_90 needs the real compiler
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def loop_sizes(kern, args, kwargs):
    """Instructions of each loop body in the sm_90 SASS of one launch, in address order."""
    import triton
    import triton_dkdv_variants as tv
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kern.signature, kern.params, backend)
    bound, spec, opts = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kern._pack_args(backend, kwargs, bound, spec, opts)
    ck = triton.compile(ASTSource(kern, signature, constexprs, attrs), target=target, options=options.__dict__)
    with tempfile.TemporaryDirectory() as tmp:
        cub = Path(tmp) / "k.cubin"
        cub.write_bytes(ck.asm["cubin"])
        sass = subprocess.run([tv._triton_tool("cuobjdump"), "-sass", str(cub)], capture_output=True, text=True).stdout
    ins = [(int(m.group(1), 16), m.group(2)) for m in
           (re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line) for line in sass.splitlines()) if m]
    loops = []
    for addr, text in ins:
        m = re.search(r"BRA.*?(0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            start = int(m.group(1), 16)
            loops.append(sum(1 for a, _ in ins if start <= a <= addr))
    return len(ins), loops


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--solutions", default="solutions", help="the folder of steps to compile (default solutions/)")
    ap.add_argument("--window", type=int, default=256)
    args = ap.parse_args(argv)
    import torch
    from triton_lb_variants import record_launches

    from attnlib.loader import load_step
    s9 = load_step(9, args.solutions)
    fc, bc = s9.sparse_fwd_config, s9.sparse_bwd_config
    s9.sparse_fwd_config = lambda nq, nk, d, dt, c, dev, bh=1: fc(nq, nk, d, dt, c, "cuda", bh)
    s9.sparse_bwd_config = lambda nq, nk, d, dt, c, dev, bh=1: bc(nq, nk, d, dt, c, "cuda", bh)
    H, D, N, W, G = 16, 64, 32768, args.window, 0
    q, k, v, o, do = (torch.empty(1, H, N, D, dtype=torch.bfloat16) for _ in range(5))
    lse = torch.empty(1, H, N, dtype=torch.float32)
    log = record_launches(s9, lambda: s9.forward(q, k, v, W, G, True, D ** -0.5), run=False)[0]
    log += record_launches(s9, lambda: s9.backward(q, k, v, o, lse, do, W, G, True, D ** -0.5), run=False)[0]
    print(f"step 09 from {args.solutions}: B=1 H={H} N={N} D={D} bf16 causal window {W}, sm_90 SASS")
    for name, kern, grid, kargs, kw in log:
        total, loops = loop_sizes(kern, kargs, kw)
        print(f"  {name:28s} {total:5d} instructions; loop bodies {loops}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
