"""``cmda``: clustering-based multi-label data allocation (FLAG/CMDA paper, §3.2 and Algorithm 1).

The binary training label vectors are clustered with k-modes (simple-matching dissimilarity, Huang
initialisation), one cluster per client; every split (training, validation, test) is then assigned to
clients with the same fitted centres, so each client has its own train/val/test drawn from its cluster.
"""

from __future__ import annotations

import numpy as np

from secure_fed.data.dataset import MultiLabelSplit
from secure_fed.data.partitions.base import ClientShard, Partitioner, shards_from_assignment
from secure_fed.errors import ConfigError


class CMDA(Partitioner):
    """k-modes clusters of the training label vectors, one client per cluster.

    Args:
        num_clients: number of clusters (``partition.num_clients``).
        n_init: k-modes restarts; the run with the lowest cost is kept (``partition.kmodes_inits``).
        seed: ``random_state`` of k-modes (the run seed). ``None`` draws one from the ``rng`` given to
            :meth:`partition`.

    As in the paper's Algorithm 1, the training rows are assigned with the fitted centres
    (``KModes.predict``), exactly as :meth:`assign` assigns the rows of any other split.
    """

    name = "cmda"
    description = "k-modes clusters of the label vectors, one client per cluster; val/test by the same centres"

    def __init__(self, num_clients: int, *, n_init: int = 5, seed: int | None = None):
        if num_clients < 1:
            raise ConfigError("partition.num_clients must be >= 1 for cmda")
        if n_init < 1:
            raise ConfigError("partition.kmodes_inits must be >= 1")
        self.num_clients, self.n_init, self.seed = num_clients, n_init, seed
        self._model = None

    @property
    def centres(self) -> np.ndarray:
        """The fitted cluster modes, shape ``(num_clients, num_labels)``, 0/1."""
        if self._model is None:
            raise RuntimeError("CMDA.centres: call partition() on the training split first")
        return np.asarray(self._model.cluster_centroids_, dtype=np.uint8)

    def partition(self, split: MultiLabelSplit, rng: np.random.Generator) -> list[ClientShard]:
        from kmodes.kmodes import KModes  # pulls in scikit-learn: only when cmda runs

        k, n = self.num_clients, split.num_instances
        if k > n:
            raise ConfigError(f"partition.num_clients={k} exceeds the {n} training instances (cmda)")
        y = _dense_labels(split)
        seed = self.seed if self.seed is not None else int(rng.integers(2**31 - 1))
        model = KModes(n_clusters=k, init="Huang", n_init=self.n_init, random_state=seed, n_jobs=1)
        model.fit(y)
        self._model = model
        clusters = self._predict(y)
        sizes = np.bincount(clusters, minlength=k)
        if len(model.cluster_centroids_) < k or np.any(sizes == 0):
            distinct = len(np.unique(y, axis=0))
            raise ConfigError(
                f"partition.name=cmda: k-modes left {int(np.sum(sizes == 0))} of partition.num_clients={k} clusters "
                f"empty (the training set has {distinct} distinct label vectors); lower partition.num_clients"
            )
        return shards_from_assignment(clusters, k)

    def assign(self, split: MultiLabelSplit, rng: np.random.Generator | None = None) -> list[ClientShard]:
        """The rows of another split, each to the client whose fitted centre is nearest (``KModes.predict``).

        ``rng`` is unused (the assignment is deterministic). A client may get no row of a small split.
        """
        if self._model is None:
            raise RuntimeError("CMDA.assign: call partition() on the training split first")
        width = self._model.cluster_centroids_.shape[1]
        if split.labels.shape[1] != width:
            raise ValueError(f"CMDA.assign: the split has {split.labels.shape[1]} labels, the fitted centres {width}")
        return shards_from_assignment(self._predict(_dense_labels(split)), self.num_clients)

    def _predict(self, y: np.ndarray) -> np.ndarray:
        if len(y) == 0:
            return np.zeros(0, dtype=np.int64)
        return np.asarray(self._model.predict(y), dtype=np.int64)


def _dense_labels(split: MultiLabelSplit) -> np.ndarray:
    return (split.labels.toarray() != 0).astype(np.uint8)
