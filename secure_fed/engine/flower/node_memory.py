"""Memory per SuperNode as PSS: each of its processes' proportional set size, summed (Linux ``smaps_rollup``).

PSS counts a page shared by k processes as 1/k to each, so the nodes' PSS add up to what they use together (the
Python and torch libraries mapped by every node's processes are not counted 32 times, as RSS would). A node's
processes are its SuperNode and its ClientApp process (and, with Flower's ``flower-superexec``, the
``flwr-clientapp`` process of the task it runs at that moment).
"""

from __future__ import annotations

import threading
from pathlib import Path


def pss_kib(pid: int) -> int | None:
    """The process's PSS in KiB (``Pss:`` of ``/proc/PID/smaps_rollup``); None when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def node_pss_kib(pids: dict[int, list[int]]) -> dict[int, int]:
    """Each node's PSS in KiB: the sum over its live processes (``pids``: node → process ids)."""
    return {i: sum(v for pid in ps if (v := pss_kib(pid)) is not None) for i, ps in pids.items()}


class MemorySampler:
    """Samples ``pids_fn()`` (node → process ids, e.g. ``LocalDeployment.node_pids``) every ``every_s`` seconds
    in a thread while in use (a context manager); :meth:`summary` gives each node's peak and mean PSS."""

    def __init__(self, pids_fn, *, every_s: float = 2.0):
        self.pids_fn, self.every_s = pids_fn, every_s
        self.samples: list[dict[int, int]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> dict[int, int]:
        taken = node_pss_kib(self.pids_fn())
        self.samples.append(taken)
        return taken

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def __enter__(self) -> MemorySampler:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="pss-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def summary(self) -> dict[str, float]:
        """Over the nodes, in MiB: the mean and the largest of each node's peak PSS, the mean of each node's mean
        PSS (nodes with no live process in a sample, e.g. killed, skip that sample), and the number of samples."""
        nodes = sorted({i for s in self.samples for i in s})
        peaks, means = [], []
        for i in nodes:
            values = [s[i] for s in self.samples if s.get(i)]
            if values:
                peaks.append(max(values) / 1024)
                means.append(sum(values) / len(values) / 1024)
        if not peaks:
            return {"samples": len(self.samples)}
        return {"peak_mean_mib": sum(peaks) / len(peaks), "peak_max_mib": max(peaks), "mean_mib": sum(means) / len(means),
                "samples": len(self.samples)}  # fmt: skip


__all__ = ["MemorySampler", "node_pss_kib", "pss_kib"]
