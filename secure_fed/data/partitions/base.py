"""The shard type and the partitioner interface shared by every partitioner."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from secure_fed.data.dataset import MultiLabelSplit


@dataclass(frozen=True)
class ClientShard:
    """The rows of one split a client holds.

    Attributes:
        client_id: index of the client.
        indices: row indices into the split (sorted).
        label: in the positive-only setting, the single label this client
            knows (its class); ``None`` when clients see full label vectors.
    """

    client_id: int
    indices: np.ndarray
    label: int | None = None


class Partitioner(ABC):
    """Splits a training set over clients, then assigns other splits (validation, test) to the same clients.

    :meth:`partition` must run first: some partitioners (``cmda``, ``natural``) learn the clients from
    the training split.
    """

    name: str = ""
    description: str = ""
    #: True when each client knows only its own label (positive-only setting).
    positive_only: bool = False
    #: the number of clients; ``None`` until :meth:`partition` has run for partitioners that learn it
    num_clients: int | None = None

    @abstractmethod
    def partition(self, split: MultiLabelSplit, rng: np.random.Generator) -> list[ClientShard]:
        """The training split's rows, one shard per client."""

    def assign(self, split: MultiLabelSplit, rng: np.random.Generator) -> list[ClientShard]:
        """The rows of another split (validation or test), one shard per client.

        This default assigns the rows uniformly at random (seeded by ``rng``): a random permutation cut into
        ``num_clients`` equal-sized parts, whatever skew the training partition has. ``cmda`` and
        ``positive_only`` override it with their own rule. A shard may be empty when the split has fewer
        rows than there are clients.
        """
        if self.num_clients is None:
            raise RuntimeError(f"{type(self).__name__}.assign: call partition() on the training split first")
        perm = rng.permutation(split.num_instances)
        return shards_from_parts(np.array_split(perm, self.num_clients))


def shards_from_parts(parts: list[np.ndarray]) -> list[ClientShard]:
    """One shard per part, client ids in order, indices sorted int64."""
    return [ClientShard(i, np.sort(np.asarray(p, dtype=np.int64))) for i, p in enumerate(parts)]


def shards_from_assignment(client_of_row: np.ndarray, num_clients: int) -> list[ClientShard]:
    """Shards from a client index per row (rows in increasing order within each shard)."""
    order = np.argsort(client_of_row, kind="stable")
    cuts = np.cumsum(np.bincount(client_of_row, minlength=num_clients))[:-1]
    return [ClientShard(i, rows.astype(np.int64)) for i, rows in enumerate(np.split(order, cuts))]
