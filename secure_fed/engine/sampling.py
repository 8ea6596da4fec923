"""Who trains in a round, and the seed of each client's local shuffling."""

from __future__ import annotations

import math

import numpy as np

from secure_fed.participation import cyclic_cohort, cyclic_period


def client_seed(seed: int, round_idx: int, cid: int) -> int:
    return int(np.random.SeedSequence([seed, round_idx, cid]).generate_state(1)[0])


def cohort_size(training, num_clients: int) -> int:
    """Clients a fixed-size round samples (``TrainingConfig.cohort_size``)."""
    return training.cohort_size(num_clients)


def sample_clients(
    sizes: np.ndarray,
    fraction: float,
    how: str,
    seed: int,
    round_idx: int,
    uniforms: np.ndarray | None = None,
    *,
    size: int | None = None,
) -> np.ndarray:
    """Client ids for one round: ``size`` (default ``ceil(fraction·N)``) without replacement (uniform or ∝ size),
    Poisson (each client independently with probability ``fraction``), or cyclic (the fixed group of the round).

    ``uniforms`` (one per client) replaces the public seed's draws for Poisson sampling: a DP layer passes draws
    from the server's secret, since amplification by sampling needs a sample the adversary cannot recompute."""
    n = len(sizes)
    if how == "cyclic":  # a public schedule: the ids ≡ round (mod P), P = 1/fraction (secure_fed.participation)
        if (period := cyclic_period(fraction)) is None:
            raise ValueError(f"cyclic sampling needs client_fraction = 1/P for a whole number P, not {fraction}")
        return cyclic_cohort(n, period, round_idx)
    rng = np.random.default_rng([seed, 7, round_idx])
    if how == "poisson":  # each client independently with probability `fraction` (what DP accounting assumes)
        if fraction >= 1.0:
            return np.arange(n)
        u = rng.random(n) if uniforms is None else np.asarray(uniforms)
        return np.flatnonzero(u < fraction)
    m = max(1, math.ceil(fraction * n)) if size is None else size
    if m >= n:
        return np.arange(n)
    p = sizes / sizes.sum() if how == "proportional" else None
    return np.sort(rng.choice(n, size=m, replace=False, p=p))


__all__ = ["client_seed", "cohort_size", "sample_clients"]
