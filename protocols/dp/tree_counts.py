"""DP-FTRL's tree counts (Kairouz et al. 2021), torch-free: the Gaussian equivalents K of a run whose clients are in
every round, which the client unit's ledger and the declared tree mechanism both compose
(:mod:`protocols.dp.tree_aggregation` releases the tree's nodes)."""

from __future__ import annotations


def full_participation_sq(t: int) -> int:
    """:func:`protocols.dp.tree_aggregation.sensitivity_sq` of a client in every one of the first ``t`` leaves, in
    closed form: the used nodes of level h number ⌊(⌊t/2^h⌋ + 1)/2⌋, each holding 2^h of its contributions."""
    return sum(((t >> h) + 1) // 2 * 4**h for h in range(int(t).bit_length()))


def gaussian_equivalents(rounds: int, tree_rounds: int) -> int:
    """K after ``rounds`` rounds with every client in every round, trees of ``tree_rounds`` rounds: the run is one
    Gaussian mechanism of noise multiplier σ/√K (ρ-zCDP with ρ = K/(2σ²))."""
    full, rest = divmod(int(rounds), int(tree_rounds))
    return full * full_participation_sq(tree_rounds) + full_participation_sq(rest)


__all__ = ["full_participation_sq", "gaussian_equivalents"]
