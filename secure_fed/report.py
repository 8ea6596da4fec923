"""``secure-fed report``: plots and a table from finished (or running) run directories."""

from __future__ import annotations

import json
from pathlib import Path

from secure_fed.errors import SecureFedError
from secure_fed.run_files import PRIVACY_RECORD


def load_run(run_dir: Path) -> tuple[list[dict], dict | None]:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        raise SecureFedError(f"{run_dir}: no metrics.jsonl (is this a run directory?)")
    lines = []
    raw = [x for x in metrics.read_text().splitlines() if x.strip()]
    for i, line in enumerate(raw):
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(raw) - 1:  # only a running run's last line may be half-written
                raise SecureFedError(f"{metrics}:{i + 1}: not a JSON line") from None
    history = [h for h in lines if "mAP" in h]  # evaluated rounds (mAP is computed at every evaluation)
    summary_path = run_dir / "summary.json"
    summary = None
    if summary_path.is_file():
        try:
            summary = json.loads(summary_path.read_text())
        except json.JSONDecodeError:
            raise SecureFedError(f"{summary_path}: not valid JSON") from None
    return history, summary


def report(run_dirs: list[Path], *, out: Path | None = None) -> Path:
    """Plot P@1, P@5, mAP and the collapse measure against round; print a final-metrics table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(rd, *load_run(rd)) for rd in run_dirs]
    ks = sorted({k for _, hist, _ in runs for h in hist for k in h if k.startswith("P@")}, key=lambda k: int(k[2:]))
    panels = [(k, f"{k} (%)") for k in ks[:2]] + [("mAP", "mAP (%)"), ("W_mean_cos", "mean pairwise cos(W)")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    cols = [*ks, "mAP", "W_mean_cos"]
    print(f"{'run':<40} {'rounds':>6} " + " ".join(f"{c if c != 'W_mean_cos' else 'cos(W)':>7}" for c in cols) + "  ε")
    for rd, history, summary in runs:
        label = rd.name
        rounds = [h["round"] for h in history]
        for ax, (key, _) in zip(axes, panels, strict=False):
            ax.plot(rounds, [h.get(key, float("nan")) for h in history], label=label)
        last = history[-1] if history else {}
        eps = (summary or {}).get(PRIVACY_RECORD, {}).get("epsilon", "?")
        print(
            f"{label:<40} {last.get('round', 0):>6} " + " ".join(f"{last.get(k, float('nan')):>7.2f}" for k in cols) + f"  {eps}"
        )
    for ax, (_, ylabel) in zip(axes, panels, strict=False):
        ax.set(xlabel="round", ylabel=ylabel)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    out = out or (run_dirs[0] / "report.png")
    out.parent.mkdir(parents=True, exist_ok=True)  # only once every run has loaded
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
