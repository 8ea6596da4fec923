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

from protocols.dp.accountants.base import Accountant, Entry
from protocols.dp.accountants.rdp_curves import LARGEST_ORDER_WARNING, rdp_curve, rdp_curve_epsilon, rdp_epsilon


class RDPAccountant(Accountant):
    """The RDP accountant at the ledger's orders (the module's docstring)."""

    name, title, opacus_name, bounds_every_calibration = "rdp", "RDP", "rdp", True

    def _epsilon(self, entries: tuple[Entry, ...], delta: float) -> float:
        return rdp_epsilon(entries, delta)


__all__ = ["LARGEST_ORDER_WARNING", "RDPAccountant", "rdp_curve", "rdp_curve_epsilon", "rdp_epsilon"]
