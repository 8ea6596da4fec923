"""File-system checks shared by the CLI and the engine, with one-line errors."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from secure_fed.errors import SecureFedError


def check_writable_dir(path: str | Path, *, what: str = "output directory") -> Path:
    """Refuse, before anything is written, a directory that cannot be created or written.

    Nothing is left behind here: the nearest existing ancestor must be a directory in which a file can be created
    (a probe file is created and removed again), and the path itself, if it exists, must be one.
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
    verb = "written" if probe == path else "created"
    if not os.access(probe, os.W_OK | os.X_OK):
        raise SecureFedError(f"{what} {path} cannot be {verb}: {probe} is not writable")
    try:  # os.access says yes to root everywhere; a file created and removed again says what the file system allows
        fd, name = tempfile.mkstemp(dir=probe, prefix=".secure-fed-probe-")
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        raise SecureFedError(f"{what} {path} cannot be {verb}: {probe} is not writable ({exc.strerror})") from None
    return path
