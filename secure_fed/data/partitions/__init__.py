"""Partitioners: how a training split is spread over clients, and how other splits follow.

Every partitioner returns a list of :class:`ClientShard`; a shard holds the row indices a client owns
and, when the setting restricts what a client knows about labels, the one label it is told about.
:meth:`Partitioner.assign` gives the same clients their rows of a validation or test split.

=================  ====================================================  =====================================
name               training split                                        other splits (``assign``)
=================  ====================================================  =====================================
``positive_only``  one client per label, all rows with that label        same rule
``iid``            uniformly random, equal-sized                          uniformly random, equal-sized
``dirichlet``      label skew from Dir(alpha) (multi-label: a mixture)    uniformly random, equal-sized
``cmda``           k-modes clusters of the label vectors                  nearest fitted centre (same centres)
``natural``        client ids read from ``partition.client_ids_file``     uniformly random, equal-sized
=================  ====================================================  =====================================
"""

from __future__ import annotations

from pathlib import Path

from secure_fed.data.partitions.base import ClientShard, Partitioner
from secure_fed.data.partitions.cmda import CMDA
from secure_fed.data.partitions.dirichlet import Dirichlet
from secure_fed.data.partitions.natural import Natural, read_client_ids
from secure_fed.data.partitions.simple import IID, PositiveOnly
from secure_fed.errors import ConfigError

PARTITIONERS: dict[str, type[Partitioner]] = {cls.name: cls for cls in (PositiveOnly, IID, Dirichlet, CMDA, Natural)}

#: clients when ``partition.num_clients`` is not set (partitioners that need a count)
DEFAULT_NUM_CLIENTS = 10


def build_partitioner(
    name: str,
    *,
    num_clients: int | None = None,
    alpha: float = 0.5,
    kmodes_inits: int = 5,
    client_ids_file: str | Path | None = None,
    seed: int | None = None,
) -> Partitioner:
    """The partitioner ``name`` with its settings (the ``partition`` config section's fields).

    ``seed`` is the run seed; ``cmda`` uses it as k-modes' ``random_state`` (without it, one is drawn from
    the ``rng`` given to :meth:`Partitioner.partition`). ``natural`` takes its client count from the file;
    ``num_clients``, when given, must match it.
    """
    if name == "positive_only":
        return PositiveOnly()
    if name == "iid":
        return IID(num_clients or DEFAULT_NUM_CLIENTS)
    if name == "dirichlet":
        return Dirichlet(num_clients or DEFAULT_NUM_CLIENTS, alpha)
    if name == "cmda":
        return CMDA(num_clients or DEFAULT_NUM_CLIENTS, n_init=kmodes_inits, seed=seed)
    if name == "natural":
        return Natural(client_ids_file, num_clients=num_clients)
    raise ConfigError(f"partition.name: unknown partitioner '{name}'; known: {', '.join(PARTITIONERS)}")


def partitioner_from_config(partition, *, seed: int | None = None) -> Partitioner:
    """The partitioner a validated ``partition`` config section (:class:`PartitionConfig`) describes."""
    return build_partitioner(
        partition.name,
        num_clients=partition.num_clients,
        alpha=partition.alpha,
        kmodes_inits=partition.kmodes_inits,
        client_ids_file=partition.client_ids_file,
        seed=seed,
    )


__all__ = [
    "CMDA",
    "DEFAULT_NUM_CLIENTS",
    "IID",
    "PARTITIONERS",
    "ClientShard",
    "Dirichlet",
    "Natural",
    "Partitioner",
    "PositiveOnly",
    "build_partitioner",
    "partitioner_from_config",
    "read_client_ids",
]
