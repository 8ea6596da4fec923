"""The marks a local deployment's processes carry in their environment: which deployment and which part of it
(the SuperLink, node i) a process belongs to, and the live processes found by them (one pass over /proc). Read by
:mod:`secure_fed.engine.flower.deployment` to stop what it started and by
:mod:`secure_fed.engine.flower.node_faults` for a node that kills itself."""

from __future__ import annotations

import os
from pathlib import Path

#: the environment variable every process of one deployment carries (its value is the deployment's id)
MARKER = "SECURE_FED_DEPLOYMENT"
#: ... and the part of it a process belongs to (``<id>/superlink`` or ``<id>/node-<i>``: what a kill stops)
PART = "SECURE_FED_DEPLOYMENT_PART"
#: a node's state directory, in the environment of each of its processes
NODE_STATE = "SECURE_FED_NODE_STATE"


def processes_by(var: str) -> dict[str, list[int]]:
    """The live processes whose environment sets ``var``, by its value (one pass over /proc)."""
    needle = f"{var}=".encode()
    found: dict[str, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes()
            if needle not in env:
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state == "Z":
            continue
        for item in env.split(b"\0"):
            if item.startswith(needle):
                found.setdefault(item[len(needle) :].decode(errors="replace"), []).append(int(entry.name))
                break
    return found


def marked_processes(marker: str, *, var: str = MARKER) -> list[int]:
    """Ids of the live processes whose environment carries ``var=marker`` (default: ``MARKER``)."""
    return processes_by(var).get(marker, [])
