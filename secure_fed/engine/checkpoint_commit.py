"""One checkpoint's files, made current together: a redo record (``private/checkpoints/commit.json``) is the commit point.

A checkpoint is several files (the server's ``last.pt``, the clients' ``clients.pt``, the server's secrets, each
callback's files) that must be of one round. :func:`commit_files` writes every file in full under a temporary name
(``NAME.tmp``, flushed to disk), then writes the record naming them (atomically, by rename: this is the commit),
then moves each file in place and removes the record. A crash before the record leaves the previous checkpoint
whole (the ``.tmp`` files are ignored); a crash after it, while the files are moved, is completed by
:func:`finish_commit` before any checkpoint is read: the moves are redone from the record, so the files are again
all of the committed round. The run directory's lock (:func:`lock_run_dir`) keeps a second process out meanwhile.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from secure_fed.errors import SecureFedError
from secure_fed.run_files import CHECKPOINT_COMMIT


@contextlib.contextmanager
def lock_run_dir(run_dir: Path):
    """Hold an exclusive lock on ``run_dir`` (``fcntl.flock`` on ``RUN_DIR/.lock``, created with the directory) while
    a run writes there: two processes training into one directory (a resume started while the run still goes)
    would interleave their checkpoints. The second is refused with one line; the lock ends with the process."""
    import fcntl

    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / ".lock", "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SecureFedError(f"{run_dir} is in use by another secure-fed process (a run or a resume); wait for it "
                                 "to end, or give another --out") from None  # fmt: skip
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, write) -> None:
    with open(path, "wb") as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())


def _move(src: Path, dst: Path) -> None:
    """One file of a committed checkpoint into place (a rename; a test interrupts it to stand for a crash)."""
    src.replace(dst)


def commit_files(ckpt_dir: Path, files: Iterable[tuple[str, Any]], round_: int) -> None:
    """Save ``files`` (name, state) in ``ckpt_dir`` as one checkpoint of round ``round_``: all or none current."""
    files = list(files)
    for name, state in files:  # the slow part: a crash here leaves the previous checkpoint whole
        _write_synced(ckpt_dir / f"{name}.tmp", lambda fh, s=state: torch.save(s, fh))
    record = ckpt_dir / CHECKPOINT_COMMIT
    doc = json.dumps({"round": round_, "files": [name for name, _ in files]}).encode()
    _write_synced(record.with_name(record.name + ".tmp"), lambda fh: fh.write(doc))
    record.with_name(record.name + ".tmp").replace(record)  # the commit point
    _fsync_dir(ckpt_dir)
    finish_commit(ckpt_dir)


def finish_commit(ckpt_dir: Path) -> bool:
    """Complete a commit a crash interrupted (its record is still there): move its remaining files in place and
    remove the record. Returns whether there was one. Idempotent; a no-op without a record."""
    record = ckpt_dir / CHECKPOINT_COMMIT
    if not record.is_file():
        return False
    try:
        names = json.loads(record.read_text())["files"]
    except (ValueError, KeyError, TypeError):
        raise SecureFedError(f"{record}: not a readable checkpoint commit record; restore it, or start a new run") from None
    for name in names:
        tmp = ckpt_dir / f"{name}.tmp"
        if tmp.is_file():  # not yet moved (a moved one has no .tmp left)
            _move(tmp, ckpt_dir / name)
    _fsync_dir(ckpt_dir)
    record.unlink()
    return True
