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


# One look per implementation in every panel and every figure: the course's steps in solid
# lines, PyTorch's own (SDPA backends, naive, compiled) dashed.
ORDER = ["naive", "compiled", "sdpa-math", "sdpa-efficient", "sdpa-flash", "sdpa-cudnn",
         "step04", "step04-compiled", "step05", "step06", "step07"]
_PALETTE = plt.get_cmap("tab20").colors


def style(impl):
    i = ORDER.index(impl) if impl in ORDER else len(ORDER) + sum(map(ord, impl)) % 7
    own = impl.startswith("step")
    return dict(color=_PALETTE[(2 * i) % 20 if i < 10 else (2 * i + 1) % 20],
                linestyle="-" if own else "--", marker="o" if own else "s")


def _order(impls):
    return sorted(impls, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))


def _title(rows, what):
    m = rows[0].machine if rows else {}
    dates = sorted({r.machine.get("date", "") for r in rows})
    when = dates[0] if len(dates) == 1 else f"{len(dates)} runs, {dates[0]} to {dates[-1]}"
    return f"{what}\n{m.get('gpu') or 'CPU'}, torch {m.get('torch')}, {when}"


def plot_lines(rows, key, path, *, ylabel, logy=True, panels):
    """One panel per (title, match-dict) in ``panels``; a line per implementation, against N."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    for ax, (title, match) in zip(axes[0], panels):
        series = _series(rows, key, **match)
        for impl in _order(series):
            pts = series[impl]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=impl, ms=3, **style(impl))
        ax.set_xscale("log", base=2)
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel("N")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    legend = {}                                  # one legend for every panel, below them
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(lab, h)
    if legend:
        labels = _order(legend)
        fig.legend([legend[k] for k in labels], labels, loc="lower center", ncol=min(len(labels), 11), fontsize=8)
    fig.suptitle(_title(rows, ylabel), fontsize=9)
    fig.tight_layout(rect=(0, 0.1 if legend else 0, 1, 1))
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
    for impl in _order(_series(rows, "tflops", **match)):
        ai, tf = [], []
        for r in rows:
            if r.impl == impl and r.status == "ok" and r.tflops and all(getattr(r, k) == v for k, v in match.items()):
                bytes_ = 4 * r.B * r.H * r.N * r.D * (2 if r.dtype in ("bfloat16", "float16") else 4)
                flops = r.tflops * 1e12 * r.ms * 1e-3
                ai.append(flops / bytes_)
                tf.append(r.tflops)
        st = style(impl)
        ax.plot(ai, tf, st["marker"], color=st["color"], label=impl, ms=4)
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
