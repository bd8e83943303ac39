"""Step 08 on a GPU: a packed ragged batch against the same batch padded, and against dense step 06.

    python bench/varlen_gpu.py [--out results/h200/varlen] [--tokens 16384] [--seed 0]

A batch of about ``--tokens`` tokens made of sequence lengths drawn between 128 and 4096 (seeded),
H = 16, D = 64, bf16, causal, forward + backward (do_bench median), three ways:

  varlen      step 08 on the packed batch: no pad token exists
  padded      SDPA's FLASH backend on the batch padded to its longest sequence (causal top-left:
              a real query never sees a pad key, so the real rows are exact; the pads cost time)
  dense       step 06 on a dense batch of the same token count, N = 2048: the ceiling of the kernels
  varlen_uniform  step 08 on that dense batch packed (8 sequences of 2048): what finding a sequence
              costs the kernels, without the ragged schedule; and every row's forward alone

Checked before timing: step 08's output on every real row against the padded SDPA's. FLOPs are
FlashAttention's count per sequence (4 n^2 D H, halved for causal; backward 2.5x), so TFLOP/s of
ragged and dense batches compare.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from attnlib.loader import load_step  # noqa: E402
from bench.core import machine_info  # noqa: E402


def lengths(tokens, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    while sum(out) < tokens - 128:
        out.append(int(torch.randint(128, 4097, (1,), generator=g)))
        if sum(out) > tokens:
            out[-1] -= sum(out) - tokens
    return out


def fwd_bwd_flops(ns, H, D):
    fwd = sum(4 * n * n * D * H for n in ns) / 2          # causal
    return 3.5 * fwd                                      # forward + backward (2.5x)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench varlen")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", type=Path, default=None, metavar="FOLDER",
                    help="only redraw FOLDER/varlen.png from FOLDER/varlen.json (no GPU needed)")
    args = ap.parse_args(argv)
    if args.plot:
        print("wrote", plot(args.plot / "varlen.json", args.plot / "varlen.png"))
        return 0
    s6, s8 = load_step(6, "solutions"), load_step(8, "solutions")
    H, D, dt = 16, 64, torch.bfloat16
    ns = lengths(args.tokens, args.seed)
    total, nmax = sum(ns), max(ns)
    torch.manual_seed(0)
    q, k, v = (torch.randn(total, H, D, device="cuda", dtype=dt, requires_grad=True) for _ in range(3))
    do = torch.randn_like(q)
    cu = torch.tensor([0] + torch.tensor(ns).cumsum(0).tolist(), dtype=torch.int32, device="cuda")

    def pad(t):                                          # (total, H, D) -> (B, H, nmax, D), zeros past each end
        out = t.new_zeros(len(ns), nmax, H, D)
        for b, (a, n) in enumerate(zip(cu.tolist(), ns)):
            out[b, :n] = t[a:a + n]
        return out.transpose(1, 2).detach().requires_grad_(True)

    qp, kp, vp, dop = pad(q), pad(k), pad(v), pad(do).detach()
    with torch.no_grad():
        o8 = s8.attention_varlen(q, k, v, cu, cu, nmax, nmax, is_causal=True)
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            op = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True)
    err = max(float((o8[a:a + n] - op[b, :, :n].transpose(0, 1)).abs().max()) for b, (a, n) in enumerate(zip(cu.tolist(), ns)))
    print(f"{len(ns)} sequences, {total} tokens, longest {nmax}; max |O varlen - O padded SDPA| = {err:.3e}", flush=True)
    assert err < 0.05, "step 08 disagrees with padded SDPA: not timing"

    def varlen():
        s8.attention_varlen(q, k, v, cu, cu, nmax, nmax, is_causal=True).backward(do)

    def padded():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            F.scaled_dot_product_attention(qp, kp, vp, is_causal=True).backward(dop)

    N = 2048
    qd, kd, vd = (torch.randn(total // N, H, N, D, device="cuda", dtype=dt, requires_grad=True) for _ in range(3))
    dod = torch.randn_like(qd)

    def dense():
        s6.attention(qd, kd, vd, is_causal=True).backward(dod)

    rows = {}
    flops = {"varlen": fwd_bwd_flops(ns, H, D), "padded": fwd_bwd_flops(ns, H, D),
             "dense": fwd_bwd_flops([N] * (total // N), H, D)}
    for name, fn in (("varlen", varlen), ("padded", padded), ("dense", dense)):
        ms = float(triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median"))
        rows[name] = {"ms": round(ms, 4), "useful_tflops": round(flops[name] / ms / 1e9, 1)}
        print(name, rows[name], flush=True)
    # Where the gap to dense goes: step 08 on the dense batch's own lengths (packed, 8 x 2048: the kernels'
    # cost of finding a sequence, GQA's indexing, none of the schedule's), and each row's forward alone.
    nu = [N] * (total // N)
    cuu = torch.tensor([0] + torch.tensor(nu).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    qu, ku, vu = (t.detach().transpose(1, 2).reshape(-1, H, D).contiguous().requires_grad_(True) for t in (qd, kd, vd))
    dou = dod.transpose(1, 2).reshape(-1, H, D).contiguous()

    def uniform():
        s8.attention_varlen(qu, ku, vu, cuu, cuu, N, N, is_causal=True).backward(dou)

    ms = float(triton.testing.do_bench(uniform, warmup=50, rep=300, return_mode="median"))
    rows["varlen_uniform"] = {"ms": round(ms, 4), "useful_tflops": round(flops["dense"] / ms / 1e9, 1),
                              "what": f"step 08 on {len(nu)} packed sequences of {N}: the dense row's batch"}
    print("varlen_uniform", rows["varlen_uniform"], flush=True)
    fwd = {"varlen": lambda: s8.attention_varlen(q, k, v, cu, cu, nmax, nmax, is_causal=True),
           "varlen_uniform": lambda: s8.attention_varlen(qu, ku, vu, cuu, cuu, N, N, is_causal=True),
           "dense": lambda: s6.attention(qd, kd, vd, is_causal=True)}
    rows["forward_ms"] = {}
    with torch.no_grad():
        for name, fn in fwd.items():
            rows["forward_ms"][name] = round(float(triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")), 4)
    print("forward only, ms:", rows["forward_ms"], flush=True)
    rows["varlen_vs_padded_speedup"] = round(rows["padded"]["ms"] / rows["varlen"]["ms"], 3)
    rows["varlen_vs_dense_tflops"] = round(rows["varlen"]["useful_tflops"] / rows["dense"]["useful_tflops"], 3)
    print({k: rows[k] for k in ("varlen_vs_padded_speedup", "varlen_vs_dense_tflops")})
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "varlen.json").write_text(json.dumps(
            {"machine": machine_info(), "lengths": ns, "H": H, "D": D, "dtype": "bfloat16", "causal": True,
             "rows": rows, "max_abs_err_vs_padded": err}, indent=1) + "\n")
        print("wrote", plot(args.out / "varlen.json", args.out / "varlen.png"))
    return 0


def plot(src: Path, dst: Path) -> Path:
    """Forward + backward time of each row (and the forward alone where measured), one bar each."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    run = json.loads(Path(src).read_text())
    rows = run["rows"]
    names = [n for n in ("varlen", "varlen_uniform", "dense", "padded") if n in rows]
    label = {"varlen": "step 08, packed", "varlen_uniform": "step 08 on the\ndense batch, packed",
             "dense": "step 06, dense\n(same tokens)", "padded": "SDPA-FLASH,\npadded"}
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ms = [rows[n]["ms"] for n in names]
    bars = ax.bar([label[n] for n in names], ms, color=["C0", "C0", "C2", "C1"][:len(names)])
    fwd = rows.get("forward_ms", {})
    for b, n in zip(bars, names):
        ax.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{rows[n]['ms']:.2f} ms\n"
                f"{rows[n]['useful_tflops']:.0f} TFLOP/s", ha="center", va="bottom", fontsize=8)
        if n in fwd:
            ax.bar(b.get_x() + b.get_width() / 2, fwd[n], width=b.get_width() * 0.5, color="white",
                   edgecolor="black", hatch="//", label="forward alone" if n == names[0] else None)
    if fwd:
        ax.legend(fontsize=8)
    ax.set_ylabel("forward + backward, ms (do_bench median)")
    ax.set_ylim(0, max(ms) * 1.3)
    m = run.get("machine", {})
    ax.set_title(f"{len(run['lengths'])} sequences, {sum(run['lengths'])} tokens (longest {max(run['lengths'])}), "
                 f"H={run['H']} D={run['D']} bf16 causal\n{m.get('gpu', '?')}, {m.get('date', '')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    plt.close(fig)
    return dst


if __name__ == "__main__":
    sys.exit(main())
