"""The label-free and the one-label-per-client partitioners: ``iid`` and ``positive_only``."""

from __future__ import annotations

import numpy as np

from secure_fed.data.dataset import MultiLabelSplit
from secure_fed.data.partitions.base import ClientShard, Partitioner
from secure_fed.errors import ConfigError


def _label_columns(split: MultiLabelSplit) -> list[np.ndarray]:
    lab = split.labels.tocsc()
    return [np.sort(lab.indices[lab.indptr[c] : lab.indptr[c + 1]]).astype(np.int64) for c in range(lab.shape[1])]


class PositiveOnly(Partitioner):
    """One client per label; client c holds every instance that has label c."""

    name = "positive_only"
    description = "one client per label holding all instances with that label; it knows only its label"
    positive_only = True

    #: a label without training instances keeps its client, with no data (set where a public contribution bound may
    #: have taken a label's last instances: whether a run starts must not depend on one instance)
    allow_empty: bool = False

    def partition(self, split: MultiLabelSplit, rng: np.random.Generator) -> list[ClientShard]:
        shards = [ClientShard(client_id=c, indices=rows, label=c) for c, rows in enumerate(_label_columns(split))]
        empty = [s.client_id for s in shards if len(s.indices) == 0]
        if empty and not self.allow_empty:
            raise ConfigError(
                f"partition.name=positive_only: labels {empty[:5]} have no training instance, so their clients would hold no "
                "data (set dataset.drop_empty_labels: true to drop them)"
            )
        self.num_clients = len(shards)
        return shards

    def assign(self, split: MultiLabelSplit, rng: np.random.Generator) -> list[ClientShard]:
        """Same rule as the training split: client c gets every row with label c (``rng`` is unused).

        A label no row of ``split`` has gives an empty shard, not an error.
        """
        return [ClientShard(client_id=c, indices=rows, label=c) for c, rows in enumerate(_label_columns(split))]


class IID(Partitioner):
    """Uniformly random, equal-sized shards with full label vectors.

    :meth:`assign` (inherited) spreads validation/test rows the same way: uniformly at random, equal-sized.
    """

    name = "iid"
    description = "uniformly random equal-sized shards; clients see full label vectors"

    def __init__(self, num_clients: int):
        if num_clients < 1:
            raise ConfigError("partition.num_clients must be >= 1 for iid")
        self.num_clients = num_clients

    def partition(self, split: MultiLabelSplit, rng: np.random.Generator) -> list[ClientShard]:
        if self.num_clients > split.num_instances:
            raise ConfigError(f"partition.num_clients={self.num_clients} exceeds the {split.num_instances} training instances")
        perm = rng.permutation(split.num_instances)
        return [ClientShard(i, np.sort(part)) for i, part in enumerate(np.array_split(perm, self.num_clients))]
