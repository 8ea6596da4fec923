"""``prv``: Opacus's PRV accountant (Gopi, Lee & Wutschitz 2021: the privacy-loss random variables' distribution,
composed numerically), with Opacus's default ε error 0.01 (its ε is the estimate at δ − δ/1000 plus that margin, an
upper bound).

Its range: above :data:`PRV_MAX_RDP_EPSILON` of RDP ε, Opacus's PRV accountant returns inf or exhausts memory, so
the RDP ε is reported there instead (a valid upper bound of the same ε, looser than PRV would be), which
:meth:`~protocols.dp.accountants.base.Accountant.beyond_range` flags and the unit's report names (``epsilon_bound``).

Two warnings are filtered, and only these: with q = 1 Opacus's PRV evaluates ``np.log(1 - q)`` = log 0 = -inf on
purpose (the support bound of the privacy loss), handled correctly by the ``np.where`` around it, so numpy's "divide
by zero" carries no information; and the largest-order note of the RDP bound Opacus sizes the PRV's domain with,
which is not the ε reported (:data:`~protocols.dp.accountants.rdp.LARGEST_ORDER_WARNING`). Every other warning
reaches the caller.
"""

from __future__ import annotations

import warnings

from opacus.accountants import PRVAccountant as OpacusPRVAccountant

from protocols.dp.accountants.base import Accountant, Entry
from protocols.dp.accountants.rdp import LARGEST_ORDER_WARNING

#: the largest RDP ε of a history whose PRV ε is computed (beyond it the PRV accountant reports RDP's ε, a valid and
#: looser upper bound): Opacus's PRV accountant (its default ε error 0.01)
#: returned inf at RDP ε 937 (σ 0.2, q 1, 60 steps, δ 1e-5) and ran out of memory at 3,412 (σ 0.1); at RDP ε 455
#: (σ 0.3) it gave 442.5
PRV_MAX_RDP_EPSILON = 300.0

#: the cosmetic log(1 - q) warning at q = 1 (the module's docstring)
PRV_Q1_LOG_WARNING = {
    "message": "divide by zero encountered in log",
    "category": RuntimeWarning,
    "module": r"opacus\.accountants\.analysis\.prv\.prvs",
}


class PRVAccountant(Accountant):
    """Opacus's PRV accountant (the module's docstring), RDP's bound past :data:`PRV_MAX_RDP_EPSILON`."""

    name, title, opacus_name, bounds_every_calibration = "prv", "PRV", "prv", True
    max_rdp_epsilon = PRV_MAX_RDP_EPSILON

    def _epsilon(self, entries: tuple[Entry, ...], delta: float) -> float:
        acc = OpacusPRVAccountant()
        acc.history = list(entries)
        with warnings.catch_warnings():
            if any(q >= 1.0 for _, q, _ in entries):
                warnings.filterwarnings("ignore", **PRV_Q1_LOG_WARNING)
            warnings.filterwarnings("ignore", **LARGEST_ORDER_WARNING)
            return float(acc.get_epsilon(delta))


__all__ = ["PRV_MAX_RDP_EPSILON", "PRVAccountant"]
