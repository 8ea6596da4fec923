"""The RDP curves and their conversion that every accountant shares: the proven one-step curve of the Poisson-subsampled
discrete Gaussian at the ledger's orders (:data:`~protocols.dp.mechanisms.RDP_ORDERS`), a history's ε by RDP (the
reference bound past another accountant's range) and Opacus's RDP → (ε, δ) conversion. The ``rdp`` accountant
(:mod:`protocols.dp.accountants.rdp`) is these curves behind the accountant interface; this module imports no
accountant, so the interface (:mod:`protocols.dp.accountants.base`) may use it."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterable

import numpy as np
from opacus.accountants.analysis import rdp as privacy_analysis

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


def rdp_epsilon(history: Iterable[tuple[float, float, int]], delta: float) -> float:
    """The RDP ε of a (σ, q, steps) history at δ (0 for an empty one)."""
    history = list(history)
    if not history:
        return 0.0
    return rdp_curve_epsilon(sum([rdp_curve(float(s), float(q)) * n for s, q, n in history]), delta)


__all__ = ["LARGEST_ORDER_WARNING", "rdp_curve", "rdp_curve_epsilon", "rdp_epsilon"]
