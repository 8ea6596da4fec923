"""``pld``: Google's ``dp-accounting`` privacy-loss-distribution accountant (Meiser & Mohammadi 2018; Koskela et al.
2020; Doroshenko et al. 2022), the ε of exactly what ``PLDAccountant`` composes for
``SelfComposedDpEvent(PoissonSampledDpEvent(q, GaussianDpEvent(σ)), steps)`` per entry.

Stated discretisation: add/remove-one neighbours (``NeighboringRelation.ADD_OR_REMOVE_ONE``; the PLD holds both
directions and ε is the larger), privacy-loss values on a grid of :data:`VALUE_DISCRETIZATION_INTERVAL` = 1e-4
(dp-accounting's default), pessimistic rounding (each loss rounded up, dp-accounting's default ``pessimistic_estimate``)
and its default tail truncation (the truncated mass counted as infinite loss, i.e. added to δ): an upper bound of the
mechanism's ε. Against dp-accounting's PLD at a 10 times finer grid (1e-5) it was +2.0e-7 to +4.1e-6 on the four
histories of ``benchmarks/accountants.py --fine`` (ε 3.1 to 53) and −1.1e-5 at σ 0.45, q 1, 60 steps (ε 220.7).

What is slow is cached: the one-step PLD of each (σ, q) (:func:`one_step_pld`, 0.3 s at q 0.1 on one idle core) and
its ``self_compose`` over n steps (:func:`composed_pld`, 0.15-0.3 s at 100-1,000 steps), both least-recently-used with
a few entries (each holds arrays of 10^5 to 10^7 floats), and ε per (history, δ) (:func:`pld_epsilon`). A training
run's budget check after each step therefore self-composes one entry anew (a new step count) and reuses the rest:
0.56 s a check at σ 1, q 0.1 after 100 steps (``benchmarks/accountants.py``, 2 shared cores).

σ calibration with ``pld`` (:func:`protocols.dp.accountant.calibrate_sigma`): σ is solved by RDP (Opacus's bisection),
as for every accountant, then verified by PRV and PLD, and raised where either still exceeds the target. On every
history measured the PLD ε is below RDP's, so the RDP-calibrated σ holds and is returned unchanged: ``pld`` then
stops and reports with its (smaller) ε, and does not lower σ.

Range: past :data:`PLD_MAX_RDP_EPSILON` of RDP ε RDP's ε is reported, flagged (``epsilon_bound``), as for ``prv``:
the PLD's support grows with ε (at q 1, 60 steps: 4.1 s and about 240 MB at RDP ε 229, σ 0.45; 32 s and about 1.1 GB
at RDP ε 3,412, σ 0.1; 2 shared cores).
"""

from __future__ import annotations

import functools

import dp_accounting
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from protocols.dp.accountants.base import Accountant, Entry

#: the privacy-loss grid of every PLD here (dp-accounting's default)
VALUE_DISCRETIZATION_INTERVAL = 1e-4

#: the largest RDP ε whose PLD ε is computed (beyond it, RDP's ε: see the module)
PLD_MAX_RDP_EPSILON = 300.0

_ADD_OR_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE


@functools.lru_cache(maxsize=8)
def one_step_pld(sigma: float, q: float) -> pld_lib.PrivacyLossDistribution:
    """The PLD of one Poisson-subsampled Gaussian step (σ, q), as ``PLDAccountant`` builds it for the event."""
    return pld_lib.from_gaussian_mechanism(
        standard_deviation=sigma,
        value_discretization_interval=VALUE_DISCRETIZATION_INTERVAL,
        sampling_prob=q,
        neighboring_relation=_ADD_OR_REMOVE,
    )


@functools.lru_cache(maxsize=4)
def composed_pld(sigma: float, q: float, steps: int) -> pld_lib.PrivacyLossDistribution:
    """The PLD of ``steps`` steps at (σ, q): the one-step PLD self-composed, as ``PLDAccountant`` does."""
    return one_step_pld(sigma, q).self_compose(steps)


@functools.lru_cache(maxsize=4096)
def pld_epsilon(entries: tuple[Entry, ...], delta: float) -> float:
    """The PLD ε at δ of a non-empty tuple of (σ, q, steps) entries (composed in their order)."""
    total = composed_pld(*entries[0])
    for entry in entries[1:]:
        total = total.compose(composed_pld(*entry))
    return float(total.get_epsilon_for_delta(delta))


class PLDAccountant(Accountant):
    """dp-accounting's PLD accountant (the module's docstring), RDP's bound past :data:`PLD_MAX_RDP_EPSILON`."""

    name, title = "pld", "PLD"
    max_rdp_epsilon = PLD_MAX_RDP_EPSILON

    def _epsilon(self, entries: tuple[Entry, ...], delta: float) -> float:
        return pld_epsilon(entries, delta)


__all__ = ["PLDAccountant", "PLD_MAX_RDP_EPSILON", "VALUE_DISCRETIZATION_INTERVAL", "composed_pld", "one_step_pld", "pld_epsilon"]
