"""DP-FTRL's noise: the binary tree mechanism over the rounds' clipped sums, and its accounting.

Kairouz, McMahan, Song, Thakkar, Thakurta & Xu, "Practical and Private (Deep) Learning without Sampling or
Shuffling" (ICML 2021): the server releases noisy *prefix sums* of the rounds' clipped sums and the model is
θ_t = θ_0 + η·(noisy prefix sum of Δ)/(public divisor) (FTRL form; with ``server_optimizer: fedavg`` the engine's
x ← x + η·Δ_t on the released increments Δ_t = prefix_t − prefix_{t−1} is exactly that). No client sampling, so no
amplification by sampling is used: every round's cohort is every client.

The tree. Leaves are rounds 0, 1, …, R−1 of one tree (the run's rounds split into trees of R =
``privacy.client.tree_restart_every`` rounds, the paper's restart; default one tree). Node (h, j) is the dyadic interval
of leaves [j·2^h, (j+1)·2^h); the prefix of the first t leaves is the sum of the nodes of t's binary representation
(:func:`prefix_nodes`, popcount(t) nodes), so only nodes with j even are ever used, each first at t = (j+1)·2^h. Each
used node's noise is a discrete Gaussian of std σ·(C + γ√d) on the public grid γ from the server's
:class:`~protocols.randomness.SecretStream`, addressed by (tree, h, j, tensor), so a resumed run redraws the same.
The noise of prefix t is the sum of its nodes' noises: variance popcount(t)·σ²(C + γ√d)² per coordinate.

Accounting (exact for the participation it states). A node is one Gaussian mechanism released at round (j+1)·2^h
whose inputs were chosen before (adaptively, from earlier releases), with L2 sensitivity m·C for a client that
contributes to m of its leaves. Adaptive composition: ρ = Σ_nodes m_v²/(2σ²), i.e. one Gaussian mechanism with
noise multiplier σ/√K, K = Σ m_v² (:func:`gaussian_equivalents`, in units of C²). The ledger records K as K steps of
the Gaussian at σ (RDP and PRV compose identical Gaussians exactly).

* A client in ONE leaf of a tree of n leaves (the paper's case: each example once per epoch, tree restarted each
  epoch: the paper's Appendix D, dp_accounting's ``SingleEpochTreeAggregationDpEvent``) is in at most ⌈log2(n+1)⌉
  used nodes: K = ⌈log2(n+1)⌉ per tree (:func:`single_participation_equivalents`).
* Here every client is in EVERY round (no schedule in the engine yet): a node of 2^h leaves holds 2^h of its
  contributions, so K = Σ_used nodes 4^h — about (2/3)·R² per tree of R rounds, against R for R independent rounds
  (R = 1 restarts the tree every round: K = rounds, the plain Gaussian DP-FedAvg with no sampling). With full
  participation the tree does not beat independent noise; its gain needs each client in few leaves of a tree.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from protocols.dp.client_dp import released_sums
from protocols.dp.discrete_gaussian import grid_noise, snap
from protocols.dp.tree_counts import full_participation_sq, gaussian_equivalents  # noqa: F401 (re-exported)
from protocols.randomness import SecretStream

Node = tuple[int, int]  #: (level h, index j): the leaves [j·2^h, (j+1)·2^h)


def tree_depth(leaves: int) -> int:
    """⌈log2(n+1)⌉: the levels of a tree over n leaves, and the most used nodes one leaf is in."""
    return max(0, int(leaves)).bit_length()


def prefix_nodes(t: int) -> list[Node]:
    """The nodes whose sum is the prefix of the first ``t`` leaves: one per set bit of t, highest first."""
    nodes, start = [], 0
    for h in range(int(t).bit_length() - 1, -1, -1):
        if t >> h & 1:
            nodes.append((h, start >> h))
            start += 1 << h
    return nodes


def released_nodes(t: int) -> list[Node]:
    """Every node some prefix of at most ``t`` leaves uses (j even, (j+1)·2^h ≤ t)."""
    return [(h, j) for h in range(int(t).bit_length()) for j in range(0, (t >> h), 2)]


def sensitivity_sq(participation: set[int] | list[int], t: int) -> int:
    """K = Σ over the nodes released by prefix t of (the client's leaves in the node)²: the squared L2 sensitivity
    of all released nodes together, in units of C² (a client contributing ≤ C to each leaf in ``participation``)."""
    leaves = sorted(int(x) for x in participation if 0 <= int(x) < t)
    total = 0
    for h, j in released_nodes(t):
        lo, hi = j << h, (j + 1) << h
        m = sum(1 for x in leaves if lo <= x < hi)
        total += m * m
    return total


def single_participation_equivalents(leaves: int, trees: int = 1) -> int:
    """K for a client in one leaf of each of ``trees`` trees of ``leaves`` leaves (the paper's restart case):
    ⌈log2(n+1)⌉ a tree."""
    return trees * tree_depth(leaves)


def zcdp_rho(noise_multiplier: float, equivalents: int) -> float:
    """ρ = K/(2σ²): the zCDP of the whole run (Bun & Steinke 2016, Prop. 1.6, composed)."""
    return equivalents / (2.0 * noise_multiplier**2)


def zcdp_epsilon(rho: float, delta: float) -> float:
    """(ε, δ) from ρ-zCDP by Canonne, Kamath & Steinke 2020 (Prop. 12 / the conversion the paper's code uses):
    inf over α > 1 of ρα + (log(1/δ) + (α−1)·log(1−1/α) − log α)/(α−1), on a fine grid of α."""
    a = 1.0 + np.arange(1, 1_000_000) * 1e-3
    eps = rho * a + (math.log(1.0 / delta) + (a - 1.0) * np.log1p(-1.0 / a) - np.log(a)) / (a - 1.0)
    return max(0.0, float(eps.min()))


class TreeNoise:
    """The server's node noises for one released tensor family, drawn once each from its secret stream and kept
    while a prefix still uses them (a resumed run redraws those it needs: each draw is addressed by its node)."""

    def __init__(self, stream: SecretStream, label: str):
        self.stream, self.label = stream, label
        self._cache: dict[tuple[int, int, int, str], torch.Tensor] = {}

    def node(self, tree: int, node: Node, name: str, numel: int, std: float, grid: float) -> torch.Tensor:
        key = (tree, node[0], node[1], name)
        if key not in self._cache:
            label = f"{self.label} tree {tree} node h{node[0]} j{node[1]} {name}"
            self._cache[key] = grid_noise(numel, std, grid, self.stream, label)
        return self._cache[key]

    def prefix(self, tree: int, t: int, name: str, numel: int, std: float, grid: float) -> torch.Tensor:
        """The noise of prefix ``t`` of tree ``tree``: the sum of its nodes' noises (float64, CPU, flat)."""
        out = torch.zeros(numel, dtype=torch.float64)
        for nd in prefix_nodes(t):
            out += self.node(tree, nd, name, numel, std, grid)
        return out

    def increment(self, round_idx: int, tree_rounds: int, name: str, numel: int, std: float, grid: float) -> torch.Tensor:
        """noise(prefix through this round) − noise(prefix through the last): what this round's release adds. A new
        tree starts from 0 (the finished tree's total noise stays in the model, as its prefix did)."""
        tree, pos = divmod(int(round_idx), int(tree_rounds))
        new = self.prefix(tree, pos + 1, name, numel, std, grid)
        old = self.prefix(tree, pos, name, numel, std, grid)
        keep = {(tree, h, j, name) for h, j in prefix_nodes(pos + 1)}
        for key in [k for k in self._cache if k[3] == name and k not in keep]:
            del self._cache[key]
        return new - old


def tree_release(
    agg, *, clip_norm: float, noise_multiplier: float, noise: TreeNoise, round_idx: int, tree_rounds: int, noise_rows: bool
) -> None:
    """This round's release, in place on ``agg``'s sums: the clipped sum (the tree's leaf ``round_idx``) rounded to
    the public grid γ (sensitivity C over all the released coordinates), plus the tree's noise increment, so that
    the model, which adds every round's release, holds the noisy prefix sum (FTRL form)."""
    sums, grid, std = released_sums(agg, noise_rows=noise_rows, clip_norm=clip_norm, noise_multiplier=noise_multiplier)
    for n, s in sums.items():
        inc = noise.increment(round_idx, tree_rounds, n, s.numel(), std, grid).reshape(s.shape).to(s.device)
        s.copy_(snap(s, grid).add_(inc))


__all__ = [
    "TreeNoise", "full_participation_sq", "gaussian_equivalents", "prefix_nodes", "released_nodes", "sensitivity_sq",
    "single_participation_equivalents", "tree_depth", "tree_release", "zcdp_epsilon", "zcdp_rho",
]  # fmt: skip
