"""The ledger's proven RDP of the Poisson-subsampled discrete Gaussian against the continuous analysis and against
Zhu & Wang's general bound, at a few points.

    python benchmarks/discrete_gaussian_bound.py [--delta 1e-5]

For each (σ, q, steps): ε at δ under the continuous-Gaussian RDP (Opacus, the ledger's orders, fractional ones
included: the ledger before the proof), the ledger's proven ε (:mod:`protocols.dp.discrete_gaussian_accounting`:
Opacus's value at the integer orders, an interpolation at the fractional ones), and Zhu & Wang's Theorem 6 over
Canonne–Kamath–Steinke's curve (integer orders 2..256; the proven bound before); and the one-step RDP ratio
Zhu–Wang/proven at α = 2, 8, 32.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opacus.accountants.analysis import rdp as privacy_analysis  # noqa: E402

from protocols.dp.accountant import epsilon_of  # noqa: E402
from protocols.dp.discrete_gaussian_accounting import (  # noqa: E402
    INTEGER_ORDERS,
    continuous_epsilon,
    discrete_gaussian_subsampled_rdp,
    zhu_wang_discrete_gaussian_rdp,
)

#: (σ, q, steps, what): Bibtex's W step as bibtex_fedalc_dp.yaml calibrated it before the proof, the recipe's W step,
#: DP-SGD points, and a corner where the continuous optimum is a fractional order
POINTS = [
    (1.484, 0.1, 100, "bibtex_fedalc_dp.yaml's W step (σ calibrated before the proof)"),
    (20.0, 0.1, 1, "bibtex_private.yaml's W step"),
    (1.0, 0.01, 1000, "DP-SGD, q = 0.01, 1,000 steps"),
    (0.8, 0.25, 40, "DP-SGD, q = 0.25, 40 steps"),
    (0.8, 0.1, 1000, "q = 0.1, 1,000 steps, ε in the forties"),
    (0.47, 0.01, 10, "q = 0.01, 10 steps, ε ≈ 8"),
    (2.0, 1.0, 10, "no sampling (q = 1)"),
]


def zhu_wang_epsilon(hist, delta: float) -> float:
    rdp = sum(n * zhu_wang_discrete_gaussian_rdp(s, q, INTEGER_ORDERS) for s, q, n in hist)
    return float(privacy_analysis.get_privacy_spent(orders=list(INTEGER_ORDERS), rdp=rdp, delta=delta)[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--delta", type=float, default=1e-5)
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    for sigma, q, steps, what in POINTS:
        hist = [(sigma, q, steps)]
        cont, proven, zw = (
            continuous_epsilon(hist, args.delta),
            epsilon_of(hist, args.delta, "rdp"),
            zhu_wang_epsilon(hist, args.delta),
        )
        ratios = []
        for a in (2, 8, 32):
            z = zhu_wang_discrete_gaussian_rdp(sigma, q, [a])[0]
            p = discrete_gaussian_subsampled_rdp(sigma, q, [a])[0]
            ratios.append(f"α={a}: {z / p:.3f}" if np.isfinite(p) and p > 0 else f"α={a}: -")
        print(f"σ {sigma:g}, q {q:g}, {steps} steps ({what}): continuous ε {cont:.4f}, proven (ledger) ε {proven:.4f} "
              f"({100 * (proven / cont - 1):+.2f}%), Zhu–Wang ε {zw:.4f}; "
              f"one-step RDP Zhu–Wang/proven {', '.join(ratios)}")  # fmt: skip


if __name__ == "__main__":
    main()
