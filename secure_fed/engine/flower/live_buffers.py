"""The largest live buffers of this process: numpy arrays, torch tensors, ``bytes``/``bytearray``, found from the
garbage collector's objects, and who holds each. A ClientApp worker logs them after every task when
``SECURE_FED_WORKER_MEMLOG=1`` (:mod:`.clientapp_worker`), to show what a node's memory is made of.

numpy arrays and ``bytes`` are not tracked by the collector themselves, so they are found as the referents of the
objects it tracks (a dict, a list, an object's ``__dict__``); a buffer held only by C code, or only through a local
variable of a running frame, is not seen. Arrays are counted once per owner of their memory (a view counts as its
base), tensors once per storage. A scan of a worker's few hundred thousand objects takes about a second: a
diagnostic, off by default.
"""

from __future__ import annotations

import gc
import os
import sys
import warnings
from typing import Any

#: the environment variable that turns a worker's log of its largest buffers on
MEMLOG_ENV = "SECURE_FED_WORKER_MEMLOG"


def _buffer(obj: Any) -> tuple[int, int, str] | None:
    """``(key, bytes, description)`` of a buffer object, or None: the key identifies the memory (counted once)."""
    import numpy as np

    if isinstance(obj, np.ndarray):
        base = obj
        while isinstance(base.base, np.ndarray):
            base = base.base
        if base.base is not None:  # memory owned by another kind of object (e.g. bytes, a torch storage)
            return None
        return id(base), base.nbytes, f"ndarray {base.dtype}{list(base.shape)}"
    if isinstance(obj, (bytes, bytearray)):
        return id(obj), len(obj), type(obj).__name__
    torch = sys.modules.get("torch")  # tensors exist only where torch is imported
    if torch is not None and isinstance(obj, torch.Tensor) and obj.layout == torch.strided and obj.device.type == "cpu":
        storage = obj.untyped_storage()
        return storage.data_ptr(), storage.nbytes(), f"tensor {str(obj.dtype).removeprefix('torch.')}{list(obj.shape)}"
    return None


def largest_buffers(limit: int = 10, *, min_bytes: int = 1 << 20) -> list[dict[str, Any]]:
    """The ``limit`` largest live buffers of at least ``min_bytes``, largest first: ``{"mib", "what", "held_by"}``
    (``held_by``: the type of one tracked object that refers to it; its own type when none does)."""
    found: dict[int, tuple[int, str, str]] = {}

    def note(obj: Any, holder: Any) -> None:
        b = _buffer(obj)
        if b is not None and b[1] >= min_bytes and b[0] not in found:
            found[b[0]] = (b[1], b[2], type(holder).__name__)

    with warnings.catch_warnings():  # a type check on a library's deprecated alias object warns
        warnings.simplefilter("ignore")
        objects = gc.get_objects()
        for holder in objects:
            for obj in gc.get_referents(holder):
                note(obj, holder)
        for obj in objects:  # a tracked buffer (a tensor) no tracked object refers to
            note(obj, obj)
    top = sorted(found.values(), reverse=True)[:limit]
    return [{"mib": round(n / 2**20, 1), "what": what, "held_by": by} for n, what, by in top]


def memlog_on() -> bool:
    """Whether this process logs its largest buffers (:data:`MEMLOG_ENV` set to 1)."""
    return os.environ.get(MEMLOG_ENV, "") == "1"


__all__ = ["MEMLOG_ENV", "largest_buffers", "memlog_on"]
