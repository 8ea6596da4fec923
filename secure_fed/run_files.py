"""Where a run directory keeps what (torch-free): released files at its top, the operator's under ``private/``.

Released (``config.yaml``, ``metrics.jsonl``, ``summary.json``): public facts, metrics of the released model on
the test split, the privacy report. Operator-only (``private/``): statistics of private data, and everything an
audit computes from the members (``private/attacks.json``: each attack's scores, its members' MIA curves, the
training-set size; ``private/roc.png``). ``checkpoints/`` holds each party's state; ``secure-fed export`` writes
the one release-safe model file.
"""

from __future__ import annotations

from pathlib import Path

PRIVATE_DIR = "private"
ATTACKS_FILE = "attacks.json"
#: prefix of a table column computed from the members (an attack's score): operator-only, never in a released table
OPERATOR_PREFIX = "operator."
#: the key of the privacy ledger a run releases (the layers' report: ``summary.json``, each ``metrics.jsonl`` line, an
#: exported model); a record key, not the config section of the same name, which belongs to its plugin
PRIVACY_RECORD = "privacy"
#: the key of the audit's results in ``private/attacks.json`` (by attack name)
ATTACKS_RECORD = "attacks"
#: ``checkpoints/commit.json``: a checkpoint written in full but not yet moved in place (a crash in the moves);
#: resuming completes it (:mod:`secure_fed.engine.checkpoint_commit`)
CHECKPOINT_COMMIT = "commit.json"


def private_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / PRIVATE_DIR


def attacks_path(run_dir: str | Path) -> Path:
    """The run's audit results (operator-only): ``RUN/private/attacks.json``."""
    return private_dir(run_dir) / ATTACKS_FILE


def holds_checkpoint(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds a checkpoint to continue: ``checkpoints/last.pt``, or one committed but not yet
    moved in place (its first, interrupted by a crash)."""
    ckpt = Path(run_dir) / "checkpoints"
    return (ckpt / "last.pt").is_file() or (ckpt / CHECKPOINT_COMMIT).is_file()
