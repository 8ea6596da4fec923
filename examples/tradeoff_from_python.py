"""A small privacy/utility trade-off from Python: the same run at several target ε, a table and a plot.

FedAvg on the synthetic default with client-level DP, σ calibrated to each target ε (δ = 1e-5); ε = inf is the
same run without the ``dp`` layer. Prints one row per ε (the ε the run reached, σ, the released model's P@1 and
mAP) and saves ``tradeoff.png`` and ``tradeoff.csv`` in ``--out``. One seed per ε, so the curve is noisy: the
full study with seeds, methods and attacks is one command, ``secure-fed tradeoff`` (docs: Recipes).

    python examples/tradeoff_from_python.py --epsilons 1,2,4,8,inf --out runs/tradeoff-example
    python examples/tradeoff_from_python.py --small --out /tmp/tradeoff-example     # 3 ε, 2 rounds each
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

import secure_fed

SMALL = {
    "dataset": {"synthetic": {"num_train": 400, "num_test": 200, "num_features": 16, "num_labels": 8, "num_groups": 2}},
    "model": {"embedding_dim": 16, "hidden_dims": [32]},
}


def config_at(eps: float, rounds: int, small: bool) -> dict:
    """The run at target ``eps`` (inf: no dp layer)."""
    cfg = {
        "algorithm": {"name": "fedavg"},
        "training": {"rounds": rounds},
        "evaluation": {"every": rounds},
        "output": {"progress": False},
        **(SMALL if small else {}),
    }
    if math.isfinite(eps):
        cfg["protocols"] = ["dp"]
        cfg["privacy"] = {"delta": 1e-5, "client": {"clip_norm": 1.0, "target_epsilon": eps}}
    return cfg


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    finite = [r for r in rows if math.isfinite(r["target"])]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot([r["target"] for r in finite], [r["P@1"] for r in finite], "o-", label="client-level DP (δ = 1e-5)")
    for r in rows:
        if math.isinf(r["target"]):
            ax.axhline(r["P@1"], ls="--", color="gray", label="no DP (ε = ∞)")
    ax.set_xscale("log")
    ax.set_xlabel("target ε")
    ax.set_ylabel("P@1 (%)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilons", default="1,2,4,8,inf", help="comma-separated target ε; inf: without dp")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--small", action="store_true", help="ε 1, 8, inf; 2 rounds of a smaller problem each")
    parser.add_argument("--out", default="runs/tradeoff-example", help="directory for the runs, the table and the plot")
    args = parser.parse_args()
    epsilons = [1.0, 8.0, math.inf] if args.small else [float(e) for e in args.epsilons.split(",")]
    rounds = 2 if args.small else args.rounds
    out = Path(args.out)

    rows = []
    for eps in epsilons:
        result = secure_fed.run(config_at(eps, rounds, args.small), run_dir=out / "runs" / f"eps-{eps:g}")
        unit = result.privacy.get("units", {}).get("client", {})
        rows.append({
            "target": eps, "epsilon": float(result.privacy.get("epsilon", math.inf)), "delta": result.privacy.get("delta"),
            "sigma": unit.get("noise_multiplier", 0.0), "P@1": result.metrics["P@1"], "mAP": result.metrics["mAP"],
        })  # fmt: skip
    print(f"{'target ε':>9} {'ε reached':>10} {'σ':>7} {'P@1':>7} {'mAP':>7}")
    for r in rows:
        print(f"{r['target']:>9g} {r['epsilon']:>10.3f} {r['sigma']:>7.3f} {r['P@1']:>7.2f} {r['mAP']:>7.2f}")
    with open(out / "tradeoff.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, out / "tradeoff.png")
    print(f"wrote {out / 'tradeoff.csv'} and {out / 'tradeoff.png'}")


if __name__ == "__main__":
    main()
