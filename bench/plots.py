"""Plots from result JSON alone: no GPU needed to redraw them."""

from __future__ import annotations

from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _series(rows, key, **match):
    out = defaultdict(list)
    for r in rows:
        if all(getattr(r, k) == v for k, v in match.items()) and r.status == "ok" and getattr(r, key) is not None:
            out[r.impl].append((r.N, getattr(r, key)))
    return {k: sorted(v) for k, v in out.items()}


def _title(rows, what):
    m = rows[0].machine if rows else {}
    return f"{what}\n{m.get('gpu') or 'CPU'}, torch {m.get('torch')}, {m.get('date', '')}"


def plot_lines(rows, key, path, *, ylabel, logy=True, panels):
    """One panel per (title, match-dict) in ``panels``; a line per implementation, against N."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    for ax, (title, match) in zip(axes[0], panels):
        for impl, pts in sorted(_series(rows, key, **match).items()):
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=impl, ms=3)
        ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel("N")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    if axes[0][-1].get_legend_handles_labels()[0]:
        axes[0][-1].legend(fontsize=7, loc="best")
    fig.suptitle(_title(rows, ylabel), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_roofline(rows, ceilings, path, *, match):
    """Each implementation at its ideal arithmetic intensity (FLOPs over the bytes of Q, K, V
    and O moved once) against the measured bf16 matmul peak and copy bandwidth."""
    if not ceilings:
        return None
    peak, bw = ceilings["bf16_matmul_tflops"], ceilings["copy_gbps"] / 1e3   # TB/s
    fig, ax = plt.subplots(figsize=(5.5, 4))
    xs = [2 ** i for i in range(0, 14)]
    ax.plot(xs, [min(peak, bw * x) for x in xs], "k-", lw=1, label=f"roof: {peak:.0f} TFLOP/s, {bw:.1f} TB/s")
    for impl, pts in sorted(_series(rows, "tflops", **match).items()):
        ai, tf = [], []
        for r in rows:
            if r.impl == impl and r.status == "ok" and r.tflops and all(getattr(r, k) == v for k, v in match.items()):
                bytes_ = 4 * r.B * r.H * r.N * r.D * (2 if r.dtype in ("bfloat16", "float16") else 4)
                flops = r.tflops * 1e12 * r.ms * 1e-3
                ai.append(flops / bytes_)
                tf.append(r.tflops)
        ax.plot(ai, tf, "o", label=impl, ms=4)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("FLOP per byte (Q, K, V, O moved once)")
    ax.set_ylabel("TFLOP/s")
    ax.legend(fontsize=7)
    ax.set_title(_title(rows, "roofline"), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
