"""Experiment: what does scaling and casting the atomic modes' fp32 dQ in one pass save?

Question. Step 06's atomic dQ modes ("atomic", and "atomic_tma", the table's choice at D=128 causal Nk >= 4096)
sum dQ in fp32 and end with its scale and a cast to the inputs' dtype. Until 2026-12-02 that was
``(dq * scale).to(q.dtype)``: two passes, an fp32 copy written and read back (14 bytes an element); now it is
``torch.mul(dq, scale, out=<16-bit tensor>)``, one pass (6 bytes). How much of the backward is that, on the
grid's D=128 causal shapes?

Method. On an H200, bf16, the grid's shapes (B*N = 16384, H = 16, D = 128: 33.5 M elements at every N): both
forms on an fp32 buffer of dQ's shape, checked bitwise equal, timed by ``do_bench`` (median); then step 06's whole
backward with ``dq_mode="atomic_tma"`` at N = 4096 and 16384 for scale.

    python bench/experiments/dq_cast.py --out DIR        # an H200, under a minute

Answer: about 0.05 ms a backward, 0.7-2.4% of it. H200, 2026-12-02 ~03:20 UTC, the working tree of 4a5ca75
(results/h200/triton/dq_cast_1202.json, .log): the two forms bitwise equal; two passes 0.119 ms, one 0.067-0.068
at both N (33.5 M elements); step 06's backward with atomic_tma (the one pass included) 2.084 ms at N=4096 (B=4),
7.092 at N=16384 (B=1): 2.4% and 0.7% of it saved.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import torch
    import triton

    from attnlib.loader import load_step
    s5, s6 = load_step(5, "solutions"), load_step(6, "solutions")
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    lines = []
    for n in (4096, 16384):
        b, h, d = 16384 // n, 16, 128
        acc = torch.randn(b * h, n, d, device="cuda", dtype=torch.float32)
        out = torch.empty(b, h, n, d, device="cuda", dtype=torch.bfloat16)
        sc = d ** -0.5
        two = lambda: (acc.view(b, h, n, d) * sc).to(torch.bfloat16)        # noqa: E731
        one = lambda: torch.mul(acc.view(b, h, n, d), sc, out=out)          # noqa: E731
        assert torch.equal(two(), one()), "the one-pass form must give the two-pass form's bits"
        t2 = float(triton.testing.do_bench(two, rep=200))
        t1 = float(triton.testing.do_bench(one, rep=200))
        q, k, v, do = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        o, lse = s5.forward(q, k, v, True, sc)
        tb = float(triton.testing.do_bench(lambda: s6.backward(q, k, v, o, lse, do, True, sc, dq_mode="atomic_tma"),
                                           rep=300))
        row = dict(N=n, B=b, H=h, D=d, two_pass_ms=round(t2, 4), one_pass_ms=round(t1, 4), backward_ms=round(tb, 4),
                   saved_share_of_backward=round((t2 - t1) / (tb + t2 - t1), 4))
        res["rows"].append(row)
        lines.append(f"N={n} B={b}: two passes {t2:.3f} ms, one {t1:.3f} ms; backward (atomic_tma) {tb:.3f} ms: "
                     f"{row['saved_share_of_backward']:.1%} of it saved")
        print(lines[-1], flush=True)
    (args.out / "dq_cast.json").write_text(json.dumps(res, indent=1))
    (args.out / "dq_cast.log").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
