"""Progress of a long phase on stderr: ``with phase("shadow models", total=16) as p: ... p.advance()``.

A phase that ends within :data:`QUIET_FOR` seconds prints nothing. After that, a line such as
``shadow models: 3/16 (19%), 1m20s elapsed, ETA 5m47s`` goes to stderr when work advances (at most once every
:data:`MIN_INTERVAL` seconds) and, from a heartbeat thread, at least every :data:`MAX_INTERVAL` seconds while the
phase runs, even when one step takes minutes; a phase that printed ends with one ``done`` line. The lines are plain
lines (no carriage returns), so a log file reads as well as a terminal. ``SECURE_FED_PROGRESS=0`` silences every
phase (stdout, where the results go, is never written). Torch-free; the timing logic reads an injectable clock.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TextIO, TypeVar

#: a phase shorter than this prints nothing
QUIET_FOR = 5.0
#: at most one line this often when work advances
MIN_INTERVAL = 5.0
#: at least one line this often while the phase runs (the heartbeat)
MAX_INTERVAL = 10.0

T = TypeVar("T")


def enabled() -> bool:
    """Whether phases print (``SECURE_FED_PROGRESS=0`` silences them)."""
    return os.environ.get("SECURE_FED_PROGRESS", "1").strip().lower() not in ("0", "false", "no", "off")


def duration(seconds: float) -> str:
    """``42s``, ``5m07s``, ``2h03m``."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Phase:
    """One phase's progress: ``done`` of ``total`` (None: unknown) steps since it started.

    ``clock``: seconds (monotonic); ``heartbeat``: start the thread that prints at least every ``max_interval``
    seconds (tests drive :meth:`tick` themselves instead)."""

    def __init__(self, name: str, total: int | None = None, *, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic, quiet_for: float = QUIET_FOR,
                 min_interval: float = MIN_INTERVAL, max_interval: float = MAX_INTERVAL, heartbeat: bool = True,
                 silent: bool | None = None):  # fmt: skip
        self.name, self.total, self.done = name, total, 0
        self.stream = stream
        self.clock = clock
        self.quiet_for, self.min_interval, self.max_interval = quiet_for, min_interval, max_interval
        self.silent = (not enabled()) if silent is None else silent
        self.start = clock()
        self.last: float | None = None  #: when the last line was printed (None: none yet)
        self.printed = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        if heartbeat and not self.silent:
            self._thread = threading.Thread(target=self._beat, name=f"progress: {name}", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ what the work calls
    def advance(self, n: int = 1) -> None:
        """``n`` more steps done; prints a line if one is due (at most every ``min_interval`` seconds)."""
        with self._lock:
            self.done += n
            self._maybe_print(self.clock(), self.min_interval)

    def tick(self) -> None:
        """The heartbeat: prints a line if none came for ``max_interval`` seconds (and the phase is past ``quiet_for``)."""
        with self._lock:
            self._maybe_print(self.clock(), self.max_interval)

    def close(self) -> None:
        """The phase ended: the heartbeat stops; a phase that printed anything prints its ``done`` line."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        with self._lock:
            if self.printed and not self.silent:
                self._emit(f"{self.name}: {self._count()} done in {duration(self.clock() - self.start)}")

    # ------------------------------------------------------------------ the line
    def line(self, now: float) -> str:
        """The progress line at time ``now``: done/total, elapsed and (with a total and a step done) the ETA."""
        elapsed = now - self.start
        text = f"{self.name}: {self._count()}, {duration(elapsed)} elapsed"
        if self.total and 0 < self.done < self.total:
            text += f", ETA {duration(elapsed / self.done * (self.total - self.done))}"
        return text

    def _count(self) -> str:
        if not self.total:
            return f"{self.done} done"
        return f"{self.done}/{self.total} ({100 * self.done // self.total}%)"

    def _maybe_print(self, now: float, interval: float) -> None:
        if self.silent or now - self.start < self.quiet_for:
            return
        if self.last is not None and now - self.last < interval:
            return
        self._emit(self.line(now))
        self.last = now

    def _emit(self, text: str) -> None:
        stream = self.stream if self.stream is not None else sys.stderr
        print(text, file=stream, flush=True)
        self.printed += 1

    def _beat(self) -> None:
        step = min(1.0, self.max_interval / 4)
        while not self._stop.wait(step):
            self.tick()

    def __enter__(self) -> Phase:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def phase(name: str, total: int | None = None, **kw) -> Phase:
    """A :class:`Phase` to use as a context manager: ``with phase("shadow models", total=16) as p: ... p.advance()``."""
    return Phase(name, total, **kw)


def track(items: Iterable[T], name: str, total: int | None = None, **kw) -> Iterator[T]:
    """Iterate over ``items`` as phase ``name``, one step per item (``total`` defaults to ``len(items)``)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with phase(name, total, **kw) as p:
        for item in items:
            yield item
            p.advance()
