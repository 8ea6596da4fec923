"""File-system checks shared by the CLI and the engine, with one-line errors."""

from __future__ import annotations

import os
from pathlib import Path

from secure_fed.errors import SecureFedError


def check_writable_dir(path: str | Path, *, what: str = "output directory") -> Path:
    """Refuse, before anything is written, a directory that cannot be created or written.

    Nothing is created here: the nearest existing ancestor must be a writable directory, and the
    path itself, if it exists, must be one.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise SecureFedError(f"{what} {path} exists and is not a directory")
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise SecureFedError(f"{what} {path} cannot be created: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise SecureFedError(f"{what} {path} cannot be {'written' if probe == path else 'created'}: {probe} is not writable")
    return path
