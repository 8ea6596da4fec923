"""Plots: ROC curves on log axes, and attack success against ε."""

from __future__ import annotations

import math
from pathlib import Path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def roc_plot(curves: dict[str, dict[str, list[float]]], path: str | Path, *, title: str = "membership inference") -> Path:
    """``curves``: label → {"fpr": [...], "tpr": [...]}; log–log axes with the chance diagonal."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(4.6, 4.2))
    for label, c in curves.items():
        ax.plot(c["fpr"], [max(t, 1e-5) for t in c["tpr"]], label=label, lw=1.4)
    grid = [10 ** (-4 + 4 * i / 50) for i in range(51)]
    ax.plot(grid, grid, "k--", lw=0.8, label="chance")
    ax.set(
        xscale="log",
        yscale="log",
        xlim=(1e-4, 1),
        ylim=(1e-4, 1.05),
        xlabel="false positive rate",
        ylabel="true positive rate",
        title=title,
    )
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def success_vs_epsilon(series: dict[str, list[tuple[float, float]]], path: str | Path, *, chance: dict[str, float] | None = None,
                       ylabel: str = "attack success") -> Path:  # fmt: skip
    """``series``: metric label → [(ε, value)]; ε = ∞ is drawn at the right edge."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.2, 3.8))
    finite = [e for pts in series.values() for e, _ in pts if math.isfinite(e)]
    inf_x = (max(finite) * 2.5) if finite else 1.0
    for label, pts in series.items():
        pts = sorted(pts, key=lambda p: p[0])
        xs = [e if math.isfinite(e) else inf_x for e, _ in pts]
        line = ax.plot(xs, [v for _, v in pts], "o-", label=label)[0]
        if chance and label in chance:
            ax.axhline(chance[label], color=line.get_color(), ls=":", lw=0.9)
    ticks = sorted(set([e for e in finite] + [inf_x]))
    ax.set_xscale("log")
    ax.set_xticks(ticks, [f"{t:.3g}" if t != inf_x else "∞" for t in ticks])
    ax.set(xlabel="ε (accountant, client unit)", ylabel=ylabel, title="attack success against ε (dotted: chance)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path
