"""The proven RDP bound of the Poisson-subsampled discrete Gaussian against the continuous analysis, at a few points.

    python benchmarks/discrete_gaussian_bound.py [--delta 1e-5]

For each (σ, q, steps): ε at δ under the ledger's continuous-Gaussian RDP (Opacus, its default orders, fractional ones
included), the same at the integer orders 2..256 only, and the proven bound (Canonne–Kamath–Steinke's curve through
Zhu & Wang's Theorem 6, :mod:`protocols.dp.discrete_gaussian_accounting`); and the one-step RDP ratio proven/continuous
at α = 2, 8, 32.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opacus.accountants.analysis import rdp as privacy_analysis  # noqa: E402

from protocols.dp.accountant import epsilon_of  # noqa: E402
from protocols.dp.discrete_gaussian_accounting import (  # noqa: E402
    continuous_epsilon_at_integer_orders,
    discrete_gaussian_epsilon,
    discrete_gaussian_subsampled_rdp,
)

#: (σ, q, steps, what): Bibtex's W step as bibtex_fedalc_dp.yaml calibrates it, the recipe's W step, two DP-SGD points
POINTS = [
    (1.484, 0.1, 100, "bibtex_fedalc_dp.yaml's W step (calibrated σ)"),
    (20.0, 0.1, 1, "bibtex_private.yaml's W step"),
    (1.0, 0.01, 1000, "DP-SGD, q = 0.01, 1,000 steps"),
    (0.8, 0.25, 40, "DP-SGD, q = 0.25, 40 steps"),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delta", type=float, default=1e-5)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    for sigma, q, steps, what in POINTS:
        hist = [(sigma, q, steps)]
        cont = epsilon_of(hist, args.delta, "rdp")
        cont_int = continuous_epsilon_at_integer_orders(hist, args.delta)
        proven = discrete_gaussian_epsilon(hist, args.delta)
        ratios = []
        for a in (2, 8, 32):
            p = discrete_gaussian_subsampled_rdp(sigma, q, [a])[0]
            c = privacy_analysis.compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=[a])[0]
            ratios.append(f"α={a}: {p / c:.3f}")
        head = f"σ {sigma:g}, q {q:g}, {steps} steps ({what})"
        print(f"{head}: continuous ε {cont:.4f} (integer orders {cont_int:.4f}), proven ε {proven:.4f}, "
              f"ratio {proven / cont:.3f}; one-step RDP proven/continuous {', '.join(ratios)}")  # fmt: skip


if __name__ == "__main__":
    main()
