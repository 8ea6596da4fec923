"""Where a run directory keeps what (torch-free): released files at its top, the operator's under ``private/``.

Released (``config.yaml``, ``metrics.jsonl``, ``summary.json``): public facts, metrics of the released model on
the test split, the privacy report; the released ``config.yaml`` leaves out every setting marked secret (the seeds
of DP noise and of secure aggregation's graph, :mod:`secure_fed.secret_settings`). Operator-only (``private/``,
do not release): the operator's full config (``private/config.yaml``, the one a resume, an audit or a sweep reads),
every party's checkpoint (``private/checkpoints/``: θ and W of every round saved, the label sets, the private
diagnostics, the secrets), statistics of private data, and everything an audit computes from the members
(``private/attacks.json``: each attack's scores, its members' MIA curves, the training-set size;
``private/roc.png``). ``secure-fed export`` writes the one release-safe model file.
"""

from __future__ import annotations

import os
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
#: the folder of every party's checkpoint files, under ``private/``
CHECKPOINTS_DIR = "checkpoints"
#: the run's config as given (with its secret settings), under ``private/``; the released ``config.yaml`` is its
#: public part
CONFIG_FILE = "config.yaml"
#: the released per-round record and the run's released summary (the release writers' file names)
METRICS_FILE, SUMMARY_FILE = "metrics.jsonl", "summary.json"
#: the name the release gate gives the file ``secure-fed export`` writes (its path is the operator's choice)
EXPORT_FILE = "export"
#: ``private/checkpoints/commit.json``: a checkpoint written in full but not yet moved in place (a crash in the moves);
#: resuming completes it (:mod:`secure_fed.engine.checkpoint_commit`)
CHECKPOINT_COMMIT = "commit.json"


#: the public time every released file of a private selection carries (``os.utime``): 1980-01-01 00:00 UTC, the
#: earliest a ZIP archive stores. When the files were written would tell how many candidates were trained first
RELEASE_MTIME = 315532800


def stamp_released(root: str | Path, mtime: int = RELEASE_MTIME) -> int:
    """Set the access and modification times of ``root`` and of every file and folder under it, except under a
    ``private/`` folder (operator-only), to the public ``mtime``; returns how many it set. Links are not followed."""
    root = Path(root)
    count = 0
    for here, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != PRIVATE_DIR]
        for name in files + dirs:
            os.utime(Path(here) / name, (mtime, mtime), follow_symlinks=False)
            count += 1
    os.utime(root, (mtime, mtime), follow_symlinks=False)  # last: stamping inside a folder leaves its own time alone
    return count + 1


def private_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / PRIVATE_DIR


def checkpoint_dir(run_dir: str | Path) -> Path:
    """Every party's checkpoint files (operator-only): ``RUN/private/checkpoints/``."""
    return private_dir(run_dir) / CHECKPOINTS_DIR


def released_config_path(run_dir: str | Path) -> Path:
    """The released config, less its secret settings: ``RUN/config.yaml``."""
    return Path(run_dir) / CONFIG_FILE


def operator_config_path(run_dir: str | Path) -> Path:
    """The config the run was made with, secrets included (operator-only): ``RUN/private/config.yaml``; what a
    resume, an audit and a sweep's reuse check read."""
    return private_dir(run_dir) / CONFIG_FILE


def attacks_path(run_dir: str | Path) -> Path:
    """The run's audit results (operator-only): ``RUN/private/attacks.json``."""
    return private_dir(run_dir) / ATTACKS_FILE


def holds_checkpoint(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds a checkpoint to continue: ``private/checkpoints/last.pt``, or one committed but not
    yet moved in place (its first, interrupted by a crash)."""
    ckpt = checkpoint_dir(run_dir)
    return (ckpt / "last.pt").is_file() or (ckpt / CHECKPOINT_COMMIT).is_file()
