"""The accountant interface: a ledger of Poisson-subsampled Gaussian steps that answers "what is ε at δ".

An :class:`Accountant` holds ``history``, a list of (σ, q, steps) entries: ``steps`` steps of the Gaussian mechanism
of noise multiplier σ (noise std σ × the accounted L2 sensitivity) on a Poisson sample of rate q (q = 1: no
sampling), under add/remove-one neighbours. :meth:`Accountant.step` records steps (as Opacus's ``IAccountant.step``
does, merging a step into the last entry when (σ, q) is the same), :meth:`Accountant.compose` records a declared
mechanism's history, and :meth:`Accountant.get_epsilon` is the ε of the whole history at δ. Composition does not
depend on the order of the steps, so an entry may also be merged with any earlier one of the same (σ, q) (the
privacy unit's ledger does).

Nothing else is accepted: an accountant applies to histories of subsampled Gaussians only, and every mechanism of
:mod:`protocols.dp.mechanisms` gives its own unit's history in that form. A curve that is not such a history (the
group bound of :mod:`protocols.dp.group_bound`, an RDP curve only) is not an accountant's input: the privacy graph
converts it by RDP and says so (:mod:`protocols.dp.privacy_graph`, rule 5).

An accountant whose computation fails or runs out of memory at very large ε sets :attr:`Accountant.max_rdp_epsilon`:
past that RDP ε it reports RDP's ε instead, a valid (looser) upper bound of the same ε, and :meth:`beyond_range`
says so (the report's ``epsilon_bound``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import ClassVar

from protocols.dp.accountants.rdp_curves import rdp_epsilon  # the reference bound past an accountant's range

#: one ledger entry: (noise multiplier σ, sample rate q, steps)
Entry = tuple[float, float, int]


def check_entry(sigma: float, q: float, steps: int) -> Entry:
    """An entry as the accountants hold it (floats σ and q, an int count); ValueError outside σ ≥ 0, 0 < q ≤ 1,
    steps ≥ 0. σ = 0 is a noiseless step (the noiseless control): its history's ε is ∞."""
    sigma, q = float(sigma), float(q)
    if int(steps) != steps:
        raise ValueError(f"accountant entry: steps {steps!r} is not a whole number")
    steps = int(steps)
    if not (math.isfinite(sigma) and sigma >= 0.0 and 0.0 < q <= 1.0 and steps >= 0):
        raise ValueError(f"accountant entry: σ {sigma}, q {q}, steps {steps} out of range (σ ≥ 0, 0 < q ≤ 1, steps ≥ 0)")
    return sigma, q, steps


class Accountant:
    """The interface (Opacus's ``IAccountant``: ``step``, ``get_epsilon``, ``history``, ``mechanism``).

    Class attributes: ``name`` (the registry's key, ``privacy.accountant``'s value), ``title`` (as a report's sentence
    names it), ``opacus_name`` (the Opacus mechanism name whose ``get_noise_multiplier`` solves σ for it, if any),
    ``bounds_every_calibration`` (a calibrated σ keeps ε within the target by this accountant whichever accountant the
    run names: RDP and PRV), ``max_rdp_epsilon`` (see the module). Subclasses implement :meth:`_epsilon`."""

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    opacus_name: ClassVar[str | None] = None
    bounds_every_calibration: ClassVar[bool] = False
    max_rdp_epsilon: ClassVar[float | None] = None

    def __init__(self, history: Iterable[Entry] = ()):
        self.history: list[Entry] = [check_entry(*h) for h in history]

    def mechanism(self) -> str:
        """The accountant's name (Opacus's ``IAccountant.mechanism``)."""
        return self.name

    def step(self, sigma: float, q: float, steps: int = 1) -> None:
        """Record ``steps`` steps at (σ, q); merged into the last entry when that has the same (σ, q)."""
        sigma, q, steps = check_entry(sigma, q, steps)
        if steps == 0:
            return
        if self.history and self.history[-1][:2] == (sigma, q):
            self.history[-1] = (sigma, q, self.history[-1][2] + steps)
        else:
            self.history.append((sigma, q, steps))

    def compose(self, mechanism) -> None:
        """Record a declared mechanism's steps (:meth:`protocols.dp.mechanisms.DPMechanism.history`)."""
        for entry in mechanism.history():
            self.step(*entry)

    def entries(self) -> tuple[Entry, ...]:
        """The history as a hashable tuple of checked entries, without empty ones."""
        return tuple(e for e in (check_entry(*h) for h in self.history) if e[2] > 0)

    def beyond_range(self, delta: float) -> bool:
        """Whether the history's RDP ε at δ is past :attr:`max_rdp_epsilon`, where this accountant reports RDP's ε."""
        if self.max_rdp_epsilon is None:
            return False
        return rdp_epsilon(self.entries(), delta) > self.max_rdp_epsilon

    def get_epsilon(self, delta: float) -> float:
        """ε at δ of the history (0 for an empty one; ∞ once a noiseless step, σ = 0, is in it); RDP's ε past
        :attr:`max_rdp_epsilon`."""
        if not 0.0 < delta < 1.0:
            raise ValueError(f"δ {delta} out of range (0 < δ < 1)")
        entries = self.entries()
        if not entries:
            return 0.0
        if any(sigma == 0.0 for sigma, _, _ in entries):
            return math.inf
        if self.beyond_range(delta):
            return rdp_epsilon(entries, delta)
        return float(self._epsilon(entries, float(delta)))

    def _epsilon(self, entries: tuple[Entry, ...], delta: float) -> float:
        """ε at δ of a non-empty tuple of checked entries."""
        raise NotImplementedError(f"{type(self).__name__} computes no ε")


__all__ = ["Accountant", "Entry", "check_entry"]
