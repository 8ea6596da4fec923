"""The C allocator's settings for a training process: freed memory is kept for the next round (a run's process),
or given back at once (a Flower node's process, one of many on a machine).

A round allocates and frees many tensors of 1–60 MB: a cohort's layer outputs in the vectorised executor, each
client's dense update, the aggregate. Under glibc's defaults a block above the mmap threshold (128 KiB, raised
dynamically up to 32 MiB) is mapped and unmapped each time, and free memory at the top of the heap beyond the trim
threshold (twice the mmap threshold) goes back to the kernel, so the next round faults every page in again, and
the kernel zeroes each one. Measured on a Bibtex FedALC round (159 clients, bf16, vectorised executor, 2 cores):
about 132,000 minor page faults a round (0.5 GB) under the defaults and about 160 with the settings below; train +
update time 0.65 → 0.46 s of the round (``/tmp`` script, ``resource.getrusage``; README, "Speed").

:func:`keep_freed_memory` raises both thresholds once per process. The cost: free memory at the top of the heap, up
to ``trim_threshold`` of it, is not returned to the kernel until the process ends, so a process's resident size
stays near its peak. It does nothing off glibc (macOS, musl), and says so in its return value.

:func:`give_back_freed_memory` is the other choice, for a process that is one of many on a machine (a Flower node's
ClientApp process with its copy of the run): a fixed mmap threshold of 1 MiB (so no longer raised dynamically), so
every block of a tensor's size is mapped and unmapped on its own, and a 32 MiB trim threshold. glibc's defaults do
not give a freed burst back reliably: once the dynamic threshold has risen to a tensor's size, its blocks come from
the heap and stay there when the heap's top is in use (measured with the burst of ``tests/engine/test_allocator.py``:
1.8 MiB or 146 MiB left free from one process to the next under the defaults, about 2 MiB in each of 5
processes with these settings). With node copies that give freed memory back (and make rows on read), 16 Bibtex
workers held 6.5 GB eleven minutes into a deployment's round 1, against 8.5 GB with the old copies.

A process takes one of the two, the first asked for.
"""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger(__name__)

#: glibc's ``mallopt`` parameter numbers (malloc.h)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
#: the mmap threshold set: the largest glibc's dynamic threshold reaches on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX); blocks
#: above it are still mapped and unmapped each time
MAX_MMAP_THRESHOLD = 32 << 20
#: a node process's mmap and trim thresholds (:func:`give_back_freed_memory`)
NODE_MMAP_THRESHOLD, NODE_TRIM_THRESHOLD = 1 << 20, 32 << 20

_applied: dict[str, int] | None = None
_tried = False


def keep_freed_memory(
    *, mmap_threshold: int = MAX_MMAP_THRESHOLD, trim_threshold: int = 1 << 30, top_pad: int = 64 << 20
) -> dict[str, int] | None:
    """Set glibc's mmap threshold, trim threshold and top pad for this process (once; later calls return what the
    first did). Returns the settings, or None where the C library is not glibc or refused a setting (nothing is
    raised: a run never stops for a performance setting; a refusal is logged as a warning)."""
    return _set_once({"mmap_threshold": mmap_threshold, "trim_threshold": trim_threshold, "top_pad": top_pad})


def give_back_freed_memory() -> dict[str, int] | None:
    """A node process's settings (:data:`NODE_MMAP_THRESHOLD`, :data:`NODE_TRIM_THRESHOLD`): freed tensors go back
    to the kernel at once. Once per process, as :func:`keep_freed_memory` (whichever is asked first holds)."""
    return _set_once({"mmap_threshold": NODE_MMAP_THRESHOLD, "trim_threshold": NODE_TRIM_THRESHOLD})


def _set_once(settings: dict[str, int]) -> dict[str, int] | None:
    global _applied, _tried
    if _tried:
        return _applied
    _tried = True
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # the process's own C library
        mallopt, version = libc.mallopt, libc.gnu_get_libc_version
    except (OSError, AttributeError):  # not glibc (musl has no gnu_get_libc_version)
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    version.restype = ctypes.c_char_p
    params = {"mmap_threshold": M_MMAP_THRESHOLD, "trim_threshold": M_TRIM_THRESHOLD, "top_pad": M_TOP_PAD}
    for name, value in settings.items():
        if mallopt(params[name], int(value)) != 1:  # e.g. a 32-bit glibc's smaller mmap threshold limit
            log.warning("note: glibc %s refused mallopt %s = %d; the allocator keeps its defaults for it",
                        version().decode(), name, value)  # fmt: skip
            return None
    log.debug("allocator: glibc %s set %s", version().decode(), settings)
    _applied = settings
    return settings


__all__ = ["give_back_freed_memory", "keep_freed_memory"]
