"""``flower-superlink`` with a longer SQLite busy timeout: how :class:`~secure_fed.engine.flower.deployment.LocalDeployment`
starts its SuperLink (the pragma matters when the state is in a database file, ``--database``; in memory it is
harmless).

Flower 1.42 opens its SQLite state with ``PRAGMA busy_timeout = 5000``: a write that waits more than 5 s for the
database's lock fails with ``database is locked``, and the Fleet API answers the SuperNode's request with a 500.
A SuperNode does not retry a 500 (only 502/503/504 and transport errors): a failed ``push-messages`` loses the
reply, and the round drops that node's clients at the stage's deadline, a dropout no fault schedule asked for. With
16 nodes on 2 cores pushing 25 MB masked inputs (Bibtex FedALC under SecAgg+, through ``push-object``), writers
waited past 5 s and a node's reply was lost this way. Here the SuperLink runs unchanged but for that pragma
(:data:`BUSY_TIMEOUT_MS`); every other pragma is Flower's. A request that waits longer than the SuperNode's HTTP
timeout (30 s in Flower 1.42) ends on the node as a read timeout, which Flower retries (a repeated push is accepted
once); the waiting request still holds one of the SuperLink's worker threads until its write is done.

    python -m secure_fed.engine.flower.superlink_launcher [flower-superlink's arguments]
"""

from __future__ import annotations

import sys

#: how long a SuperLink's SQLite write waits for the lock before it fails (Flower's default: 5,000 ms)
BUSY_TIMEOUT_MS = 120_000


def with_busy_timeout(pragmas: tuple[tuple[str, str], ...], ms: int) -> tuple[tuple[str, str], ...]:
    """``pragmas`` with ``busy_timeout`` set to ``ms`` (added if absent), the others as they are."""
    if ms <= 0:
        raise ValueError(f"a busy timeout is a positive number of milliseconds, got {ms}")
    out = tuple((k, str(ms)) if k == "busy_timeout" else (k, v) for k, v in pragmas)
    return out if any(k == "busy_timeout" for k, _ in out) else (("busy_timeout", str(ms)), *out)


def install_busy_timeout(ms: int = BUSY_TIMEOUT_MS) -> None:
    """Make every SQLite connection Flower's SQL state opens in this process use ``busy_timeout = ms``."""
    from flwr.supercore import constant, sql_mixin

    pragmas = with_busy_timeout(constant.SQLITE_PRAGMAS, ms)
    constant.SQLITE_PRAGMAS = pragmas
    sql_mixin.SQLITE_PRAGMAS = pragmas  # read at each connection by sql_mixin._set_sqlite_pragmas


def main() -> None:
    install_busy_timeout()
    print(f"secure-fed: SuperLink SQLite busy_timeout {BUSY_TIMEOUT_MS} ms", flush=True)
    from flwr.superlink.cli import flower_superlink

    sys.argv[0] = "flower-superlink"
    sys.exit(flower_superlink())


if __name__ == "__main__":
    main()
