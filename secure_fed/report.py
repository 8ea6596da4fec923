"""``secure-fed report``: plots and a table from finished (or running) run directories."""

from __future__ import annotations

import math
from pathlib import Path

from secure_fed.report_columns import epsilon_label, format_epsilon
from secure_fed.run_files import PRIVACY_RECORD
from secure_fed.run_history import load_run

__all__ = ["print_table", "report", "report_figure"]


def _epsilon_label(summary: dict | None, row: dict) -> str:
    """``ε = 4.0``: the released model's ε (the accountant's, ∞ when a step that shapes θ or W is un-noised), beside
    the run's target when they differ (:func:`~secure_fed.report_columns.epsilon_label`, as ``report.html`` writes
    it); the target for a run without a summary yet whose ledger is finite so far."""
    released = row.get("epsilon")
    if summary is None and not (isinstance(released, float) and math.isinf(released)):
        released = None
    return f"ε = {epsilon_label(released, row.get('target_epsilon'))}"


def report(run_dirs: list[Path], *, out: Path | None = None, warning: str | None = None, table: bool = True,
           vary: tuple[str, ...] = ()) -> Path:  # fmt: skip
    """Plot P@1, P@5, mAP and the collapse measure against round, every legend naming each run's ε (and the ``vary``
    settings' values); print the final metrics, grouped (setup, privacy, utility), unless ``table`` is false.
    ``warning``: the runs do not compare (written over the plot)."""
    import matplotlib.pyplot as plt

    fig, rows, metrics = report_figure(run_dirs, warning=warning, vary=vary)
    if table:
        print_table(rows, metrics)
    out = out or (run_dirs[0] / "report.png")
    out.parent.mkdir(parents=True, exist_ok=True)  # only once every run has loaded
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def report_figure(run_dirs: list[Path], *, warning: str | None = None, vary: tuple[str, ...] = ()):
    """``(figure, rows, metrics)``: the panels of ``report.png`` and the table's rows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from secure_fed.html_report import run_row
    from secure_fed.report_setup import setting

    runs = [(rd, *load_run(rd)) for rd in run_dirs]
    rows = [run_row(rd) for rd in run_dirs]
    ks = sorted({k for _, hist, _ in runs for h in hist for k in h if k.startswith("P@")}, key=lambda k: int(k[2:]))
    panels = [(k, f"{k} (%)") for k in ks[:2]] + [("mAP", "mAP (%)"), ("W_mean_cos", "mean pairwise cos(W)")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.9 if warning else 3.6))
    for (rd, history, summary), row in zip(runs, rows, strict=True):
        varied = "".join(f", {k} = {setting(rd, k)}" for k in vary)
        label = f"{rd.name} ({_epsilon_label(summary, row)}{varied})"
        rounds = [h["round"] for h in history]
        for ax, (key, _) in zip(axes, panels, strict=False):
            ax.plot(rounds, [h.get(key, float("nan")) for h in history], marker=".", label=label)
    for ax, (_, ylabel) in zip(axes, panels, strict=False):
        ax.set(xlabel="round", ylabel=ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)  # every panel names each run's ε
    if warning:
        fig.suptitle(f"warning: {warning}", color="crimson", fontsize=8, wrap=True)
    fig.tight_layout()
    return fig, rows, [*ks, "mAP", "W_mean_cos"]


def print_table(rows: list[dict], metrics: list[str]) -> None:
    """The final metrics, one line per run, the columns grouped: setup | privacy (unit, ε, δ, σ, accountant) | utility."""
    setup = f"{'run':<32} {'method':<10} {'seed':>4} {'rounds':>6}"
    privacy = f"{'unit':<9} {'ε':>5} {'δ':>7} {'σ':>7} {'accountant':<10}"
    names = " ".join(f"{m if m != 'W_mean_cos' else 'cos(W)':>7}" for m in metrics)
    print(f"{'setup':<{len(setup)}} | {PRIVACY_RECORD:<{len(privacy)}} | utility")
    print(f"{setup} | {privacy} | {names}")
    for r in rows:
        delta = r.get("delta")
        sigma = r.get("sigma")
        cells = [
            f"{str(r['run'])[:32]:<32} {str(r['method'])[:10]:<10} {str(r.get('seed', '')):>4} {r.get('rounds', 0):>6}",
            f"{str(r.get('unit') or '-'):<9} {format_epsilon(r.get('epsilon')):>5} "
            f"{(f'{delta:.0e}' if isinstance(delta, float) else '-'):>7} "
            f"{(f'{sigma:.3g}' if isinstance(sigma, float) else str(sigma or '-')):>7} {str(r.get('accountant') or '-'):<10}",
            " ".join(f"{_num(r.get(m)):>7.2f}" for m in metrics),
        ]
        print(" | ".join(cells))


def _num(v) -> float:
    return float(v) if isinstance(v, (int, float)) else float("nan")
