"""A differentially private run from Python, at a target ε, and its privacy report.

FedAvg on the embedded synthetic default with client-level DP (DP-FedAvg: each client's whole update clipped to
``clip_norm``, Gaussian noise on the sum, σ calibrated so that the run ends at ``--epsilon``). Prints the released
model's test metrics, then the privacy report the run released: ε with δ, the unit it covers, and per adversary
what that ε holds against (the observer of the released model; the server, which sees each clipped update before
it adds the noise, has ε = ∞ with the server's noise).

    python examples/dp_run.py --epsilon 4 --out runs/dp-example        # 20 rounds, about a minute on 2 cores
    python examples/dp_run.py --small --out /tmp/dp-example             # 2 rounds of a smaller problem (the test)
"""

from __future__ import annotations

import argparse
import math

import secure_fed

#: a smaller synthetic problem (8 clients, 400 training instances), for a quick try or a test
SMALL = {
    "dataset": {"synthetic": {"num_train": 400, "num_test": 200, "num_features": 16, "num_labels": 8, "num_groups": 2}},
    "model": {"embedding_dim": 16, "hidden_dims": [32]},
}


def fmt(eps) -> str:
    """ε as the report gives it (a float, or "inf" in JSON), three decimals."""
    eps = float(eps)
    return "∞" if math.isinf(eps) else f"{eps:.3f}"


def print_privacy(privacy: dict) -> None:
    print(f"privacy: ε = {fmt(privacy['epsilon'])}, δ = {privacy['delta']:g}, unit: {privacy['unit']}")
    for unit, report in privacy.get("units", {}).items():
        print(f"  {unit} unit ({report['scope']}): ε = {fmt(report['epsilon'])} at δ = {report['delta']:g}, "
              f"σ = {report['noise_multiplier']:.3f}, {report['steps']} steps, {report['accountant']} accountant")  # fmt: skip
        for who, adv in report.get("adversaries", {}).items():
            print(f"    against the {who}: ε = {fmt(adv['epsilon'])} ({adv['why']})")
        for gap in report.get("not_covered", []):
            print(f"    not covered: {gap}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epsilon", type=float, default=4.0, help="target ε of the client unit (δ = 1e-5)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--small", action="store_true", help="2 rounds of a smaller problem (seconds)")
    parser.add_argument("--out", default="runs/dp-example", help="the run directory (must not hold a run)")
    args = parser.parse_args()

    config = {
        "algorithm": {"name": "fedavg"},
        "training": {"rounds": 2 if args.small else args.rounds},
        "evaluation": {"every": 2 if args.small else 5},
        "output": {"progress": False},
        "protocols": ["dp"],
        "privacy": {"delta": 1e-5, "client": {"clip_norm": 1.0, "target_epsilon": args.epsilon}},
        **(SMALL if args.small else {}),
    }
    result = secure_fed.run(config, run_dir=args.out)
    print(f"status: {result.status}, run directory: {result.run_dir}")
    print("metrics: " + ", ".join(f"{k} {v:.2f}" for k, v in result.metrics.items() if k in ("P@1", "P@3", "nDCG@3", "mAP")))
    print_privacy(result.privacy)


if __name__ == "__main__":
    main()
