"""Partitioners: how a training split is spread over clients.

Every partitioner returns a list of :class:`ClientShard`; a shard holds the
row indices a client owns and, when the setting restricts what a client
knows about labels, the one label it is told about.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from secure_fed.data.dataset import MultiLabelSplit
from secure_fed.errors import ConfigError


@dataclass(frozen=True)
class ClientShard:
    """The training rows a client holds.

    Attributes:
        client_id: index of the client.
        indices: row indices into the training split.
        label: in the positive-only setting, the single label this client
            knows (its class); ``None`` when clients see full label vectors.
    """

    client_id: int
    indices: np.ndarray
    label: int | None = None


class Partitioner(ABC):
    """Splits a training set over clients."""

    name: str = ""
    description: str = ""
    #: True when each client knows only its own label (positive-only setting).
    positive_only: bool = False

    @abstractmethod
    def partition(self, split: MultiLabelSplit, rng: np.random.Generator) -> list[ClientShard]: ...


class PositiveOnly(Partitioner):
    """One client per label; client c holds every instance that has label c."""

    name = "positive_only"
    description = "one client per label holding all instances with that label; it knows only its label"
    positive_only = True

    def partition(self, split: MultiLabelSplit, rng: np.random.Generator) -> list[ClientShard]:
        lab = split.labels.tocsc()
        shards = []
        for c in range(lab.shape[1]):
            rows = np.sort(lab.indices[lab.indptr[c] : lab.indptr[c + 1]]).astype(np.int64)
            shards.append(ClientShard(client_id=c, indices=rows, label=c))
        empty = [s.client_id for s in shards if len(s.indices) == 0]
        if empty:
            raise ConfigError(
                f"partition.name=positive_only: labels {empty[:5]} have no training instance, so their clients would hold no "
                "data (set dataset.drop_empty_labels: true to drop them)"
            )
        return shards


class IID(Partitioner):
    """Uniformly random, equal-sized shards with full label vectors."""

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


class Dirichlet(Partitioner):
    """Label-skewed shards for single-label data: class proportions per client ~ Dir(alpha)."""

    name = "dirichlet"
    description = "label skew for single-label data: each class spread over clients by Dir(alpha)"

    def __init__(self, num_clients: int, alpha: float):
        if num_clients < 1:
            raise ConfigError("partition.num_clients must be >= 1 for dirichlet")
        if alpha <= 0:
            raise ConfigError("partition.alpha must be > 0")
        self.num_clients, self.alpha = num_clients, alpha

    def partition(self, split: MultiLabelSplit, rng: np.random.Generator) -> list[ClientShard]:
        counts = np.asarray(split.labels.sum(axis=1)).ravel()
        if np.any(counts != 1):
            raise ConfigError(
                "partition.name=dirichlet needs single-label data, but "
                f"{int(np.sum(counts != 1))} training instances have != 1 label"
            )
        y = split.labels.tocsr().indices
        parts: list[list[int]] = [[] for _ in range(self.num_clients)]
        for c in np.unique(y):
            rows = rng.permutation(np.flatnonzero(y == c))
            props = rng.dirichlet(np.full(self.num_clients, self.alpha))
            cuts = (np.cumsum(props)[:-1] * len(rows)).astype(int)
            for i, chunk in enumerate(np.split(rows, cuts)):
                parts[i].extend(chunk.tolist())
        return [ClientShard(i, np.sort(np.asarray(p, dtype=np.int64))) for i, p in enumerate(parts)]


PARTITIONERS = {cls.name: cls for cls in (PositiveOnly, IID, Dirichlet)}


def build_partitioner(name: str, *, num_clients: int | None = None, alpha: float = 0.5) -> Partitioner:
    if name == "positive_only":
        return PositiveOnly()
    if name == "iid":
        return IID(num_clients or 10)
    if name == "dirichlet":
        return Dirichlet(num_clients or 10, alpha)
    raise ConfigError(f"partition.name: unknown partitioner '{name}'; known: {', '.join(PARTITIONERS)}")
