"""``dirichlet``: label-skewed shards drawn from Dirichlet distributions, for single- and multi-label data."""

from __future__ import annotations

import numpy as np

from secure_fed.data.dataset import MultiLabelSplit
from secure_fed.data.partitions.base import ClientShard, Partitioner, shards_from_assignment
from secure_fed.errors import ConfigError


class Dirichlet(Partitioner):
    """Label skew: how each label's instances spread over clients is drawn from Dir(alpha).

    Single-label data (every training instance has exactly one label) keeps the usual scheme: for each
    class, its instances (shuffled) are cut into per-client chunks with proportions ``q_c ~ Dir(alpha·1_K)``.

    Multi-label data (any instance with zero or several labels): per label ``l`` a vector
    ``q_l ~ Dir(alpha·1_K)`` over the ``K`` clients is drawn; instance ``i`` with label set ``S_i`` goes to
    one client drawn from the mixture ``p_i = mean_{l in S_i} q_l`` (equivalently: pick one of its labels
    uniformly, then a client from that label's vector). An instance with no label goes to a client drawn
    uniformly. With one label per instance this is the single-label scheme in expectation, but with
    independent draws instead of exact proportions. Small ``alpha`` gives strong skew; a client may then
    be empty (as in the single-label scheme).

    :meth:`assign` (inherited) spreads validation/test rows uniformly at random, equal-sized: the skew
    applies to the training split only.
    """

    name = "dirichlet"
    description = "label skew: each label spread over clients by Dir(alpha); multi-label instances by a mixture"

    def __init__(self, num_clients: int, alpha: float):
        if num_clients < 1:
            raise ConfigError("partition.num_clients must be >= 1 for dirichlet")
        if alpha <= 0:
            raise ConfigError("partition.alpha must be > 0")
        self.num_clients, self.alpha = num_clients, alpha

    def partition(self, split: MultiLabelSplit, rng: np.random.Generator) -> list[ClientShard]:
        counts = np.asarray(split.labels.sum(axis=1)).ravel()
        if np.all(counts == 1):
            return self._single_label(split, rng)
        return self._multi_label(split, counts, rng)

    def _single_label(self, split: MultiLabelSplit, rng: np.random.Generator) -> list[ClientShard]:
        y = split.labels.tocsr().indices
        parts: list[list[int]] = [[] for _ in range(self.num_clients)]
        for c in np.unique(y):
            rows = rng.permutation(np.flatnonzero(y == c))
            props = rng.dirichlet(np.full(self.num_clients, self.alpha))
            cuts = (np.cumsum(props)[:-1] * len(rows)).astype(int)
            for i, chunk in enumerate(np.split(rows, cuts)):
                parts[i].extend(chunk.tolist())
        return [ClientShard(i, np.sort(np.asarray(p, dtype=np.int64))) for i, p in enumerate(parts)]

    def _multi_label(self, split: MultiLabelSplit, counts: np.ndarray, rng: np.random.Generator) -> list[ClientShard]:
        k = self.num_clients
        q = rng.dirichlet(np.full(k, self.alpha), size=split.labels.shape[1])  # (L, K): per label, a mix over clients
        weights = np.asarray(split.labels.astype(np.float64) @ q)  # (n, K): sum over each instance's labels
        weights[counts == 0] = 1.0
        cdf = np.cumsum(weights, axis=1)
        cdf /= cdf[:, -1:]
        cdf[:, -1] = 1.0  # guard against rounding: every uniform draw in [0, 1) falls on some client
        client = (cdf < rng.random(split.num_instances)[:, None]).sum(axis=1)
        return shards_from_assignment(client, k)
