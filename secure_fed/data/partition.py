"""Compatibility alias: the partitioners live in :mod:`secure_fed.data.partitions`."""

from secure_fed.data.partitions import PARTITIONERS, ClientShard, Partitioner, build_partitioner

__all__ = ["PARTITIONERS", "ClientShard", "Partitioner", "build_partitioner"]
