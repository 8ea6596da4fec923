"""``rdp``: the Rényi-DP accountant (Mironov 2017; the Poisson-subsampled Gaussian's RDP by Mironov, Talwar & Zhang
2019) over the ledger's orders :data:`~protocols.dp.mechanisms.RDP_ORDERS`, proven for the discrete Gaussian every
release draws (:mod:`protocols.dp.discrete_gaussian_accounting`: Opacus's value at the integer orders and at q = 1, a
log-convex interpolation at the fractional orders with q < 1).

ε of a history is the computation of Opacus's ``RDPAccountant.get_privacy_spent`` (the sum of each entry's RDP
curve times its steps, in history order, then Opacus's ``get_privacy_spent``) over :data:`RDP_ORDERS` (Opacus's
orders 1.1 … 63 and larger ones, up to 8192) with the proven curve, each one-step curve cached: every ledger query,
and every budget check of a long run, reuses it. RDP is also the reference bound of the other accountants past their range
(:attr:`~protocols.dp.accountants.base.Accountant.max_rdp_epsilon`) and the privacy graph's conversion of curves that
are no accountant's history.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterable

import numpy as np
from opacus.accountants.analysis import rdp as privacy_analysis

from protocols.dp.accountants.base import Accountant, Entry
from protocols.dp.discrete_gaussian_accounting import discrete_gaussian_subsampled_rdp
from protocols.dp.mechanisms import RDP_ORDERS

#: Opacus's note that the best Rényi order is the grid's largest: past :data:`RDP_ORDERS`' 8192 it means ε < 0.0014,
#: a valid bound whose looseness no report shows; and the PRV accountant raises it from the RDP bound it sizes its
#: domain with (Opacus's own orders), which is not the ε it reports. Filtered there, and only there.
LARGEST_ORDER_WARNING = {"message": "Optimal order is the largest alpha", "category": UserWarning}


@functools.lru_cache(maxsize=4096)
def rdp_curve(sigma: float, q: float) -> np.ndarray:
    """The RDP of one subsampled Gaussian step at :data:`RDP_ORDERS`, proven for the discrete Gaussian
    (:func:`protocols.dp.discrete_gaussian_accounting.discrete_gaussian_subsampled_rdp`; cached, read-only; RDP
    composes by adding these curves times the step counts)."""
    curve = discrete_gaussian_subsampled_rdp(sigma, q, RDP_ORDERS)
    curve.setflags(write=False)
    return curve


def rdp_curve_epsilon(rdp, delta: float) -> float:
    """ε at δ of an RDP curve over :data:`RDP_ORDERS` (Opacus's conversion; the largest-order note filtered, as above)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", **LARGEST_ORDER_WARNING)
        # a huge ε (a large group under client-level noise) is best at the smallest order: a valid, looser bound
        warnings.filterwarnings("ignore", message="Optimal order is the smallest alpha", category=UserWarning)
        eps, _ = privacy_analysis.get_privacy_spent(orders=RDP_ORDERS, rdp=rdp, delta=delta)
    return float(eps)


def rdp_epsilon(history: Iterable[Entry], delta: float) -> float:
    """The RDP ε of a (σ, q, steps) history at δ (0 for an empty one)."""
    history = list(history)
    if not history:
        return 0.0
    return rdp_curve_epsilon(sum([rdp_curve(float(s), float(q)) * n for s, q, n in history]), delta)


class RDPAccountant(Accountant):
    """The RDP accountant at the ledger's orders (the module's docstring)."""

    name, title, opacus_name, bounds_every_calibration = "rdp", "RDP", "rdp", True

    def _epsilon(self, entries: tuple[Entry, ...], delta: float) -> float:
        return rdp_epsilon(entries, delta)


__all__ = ["LARGEST_ORDER_WARNING", "RDPAccountant", "rdp_curve", "rdp_curve_epsilon", "rdp_epsilon"]
