"""The cyclic participation schedule (``training.sampling: cyclic``), dependency-free: the config validates it, the
engine draws the cohort by it, and the banded matrix mechanism's accounting (:mod:`protocols.dp.banded_mf`) assumes it."""

from __future__ import annotations

import numpy as np


def cyclic_period(client_fraction: float) -> int | None:
    """P = 1/client_fraction when that is a whole number (to 1e-9), else None."""
    p = round(1.0 / float(client_fraction))
    return p if p >= 1 and abs(p * float(client_fraction) - 1.0) <= 1e-9 else None


def cyclic_cohort(num_clients: int, period: int, round_idx: int) -> np.ndarray:
    """Round ``round_idx``'s clients under the cyclic schedule of period P: the ids c ≡ round (mod P), so every client
    trains in the rounds g, g + P, g + 2P, … of its group g = c mod P (a public function of the round)."""
    return np.arange(int(round_idx) % int(period), int(num_clients), int(period))


__all__ = ["cyclic_cohort", "cyclic_period"]
