"""``natural``: the client of every training instance read from a file (a real, recorded federation)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from secure_fed.data.dataset import MultiLabelSplit
from secure_fed.data.partitions.base import ClientShard, Partitioner, shards_from_assignment
from secure_fed.errors import ConfigError


def read_client_ids(path: str | Path, *, num_rows: int) -> np.ndarray:
    """The client id of each training row: a text/CSV file with one non-negative integer per line.

    Blank lines are allowed only at the end. Every problem is a one-line :class:`ConfigError` naming the file.
    """
    where = f"partition.client_ids_file {path}"
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{where}: not found" if not path.exists() else f"{where}: not a file")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"{where}: cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not UTF-8 text; expected one integer per line") from None
    lines = text.splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    ids = np.empty(len(lines), dtype=np.int64)
    for i, line in enumerate(lines):
        item = line.strip()
        try:
            ids[i] = int(item)
        except ValueError:
            raise ConfigError(f"{where}: line {i + 1} ({item[:40]!r}) is not an integer (one client id per line)") from None
        except OverflowError:
            raise ConfigError(f"{where}: line {i + 1} ({item[:40]!r}) is out of range") from None
        if ids[i] < 0:
            raise ConfigError(f"{where}: line {i + 1} ({item[:40]!r}) is negative; client ids are integers >= 0")
    if len(ids) != num_rows:
        raise ConfigError(f"{where}: has {len(ids)} client ids but the training split has {num_rows} instances (one per line)")
    return ids


class Natural(Partitioner):
    """Client ``c`` holds the training rows whose line in ``client_ids_file`` reads ``c``.

    The distinct ids, in increasing order, become clients ``0..K-1`` (so ids need not be contiguous).
    With ``num_clients`` given, the file must hold exactly that many distinct ids.

    :meth:`assign` (inherited) spreads validation/test rows uniformly at random, equal-sized: the file
    covers the training split only.
    """

    name = "natural"
    description = "each training instance's client read from partition.client_ids_file (one integer per line)"

    def __init__(self, client_ids_file: str | Path | None, *, num_clients: int | None = None):
        if client_ids_file is None:
            raise ConfigError("partition.name=natural needs partition.client_ids_file (one client id per training instance)")
        self.client_ids_file, self.expected_clients = client_ids_file, num_clients

    def partition(self, split: MultiLabelSplit, rng: np.random.Generator) -> list[ClientShard]:
        ids = read_client_ids(self.client_ids_file, num_rows=split.num_instances)
        distinct, client = np.unique(ids, return_inverse=True)
        if self.expected_clients is not None and len(distinct) != self.expected_clients:
            raise ConfigError(
                f"partition.client_ids_file {self.client_ids_file}: holds {len(distinct)} distinct client ids but "
                f"partition.num_clients={self.expected_clients}"
            )
        self.num_clients = len(distinct)
        self.client_ids = distinct
        return shards_from_assignment(client.ravel(), self.num_clients)
