"""The allocator settings an experiment makes (``secure_fed/engine/allocator.py``): memory a round frees is kept
for reuse, not given back and faulted in again. Measured in fresh processes (the settings are per process): the
free bytes glibc holds after a burst of allocations is freed (``mallinfo2``, bytes, whatever the page size) and the
kernel's count of minor page faults when the burst repeats (``getrusage``)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from secure_fed.engine.allocator import keep_freed_memory

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the settings exist on glibc only")

#: 8 tensors of 16 MiB allocated together and freed together, 5 times: the shape of a round's layer outputs. Prints
#: the MiB glibc holds free after the last burst, and the faults of the last 4 bursts over the pages they touch
PATTERN = """
import ctypes, json, resource, sys, torch
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] in ("experiment", "node_copy"):
    from secure_fed.engine import Experiment
    from tests.conftest import small_plan
    Experiment(small_plan(), run_dir=sys.argv[2], node_copy=sys.argv[1] == "node_copy")
def once():
    ts = [torch.ones(4 << 20) for _ in range(8)]
    del ts
once()
f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    once()
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / (4 * 8 * (16 << 20) / 4096)
from secure_fed.engine import allocator
print(json.dumps({"free_mib": libc.mallinfo2().fordblks / 2**20, "fault_share": faults, "applied": allocator._applied}))
"""


def _measure(mode: str, tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "THP_MEM_ALLOC"))}
    out = subprocess.run([sys.executable, "-c", PATTERN, mode, str(tmp_path / "run")], capture_output=True, text=True,
                         check=True, cwd=str(REPO), env=env)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_an_experiment_keeps_freed_memory_for_reuse(tmp_path):
    # the burst's 128 MiB stay with the process (measured: 224 MiB free, the burst plus the 64 MiB top pad), and the
    # next bursts reuse them (measured: 0 to 0.09 of their pages faulted in). The fault count is the whole process's:
    # on a loaded machine (CI's 4 workers) other work adds faults (0.19 seen once), never removes them, so the
    # least share of up to 3 fresh processes is the measure; the kept bytes are asked of every one
    shares = []
    for i in range(3):
        kept = _measure("experiment", tmp_path / str(i))
        assert kept["free_mib"] >= 128, kept
        shares.append(kept["fault_share"])
        if kept["fault_share"] < 0.15:
            break
    assert min(shares) < 0.15, shares
    # the control, glibc's defaults: the freed burst goes back to the kernel, wholly or in part from one process to
    # the next, and is faulted in again (measured: 0.27, 0.53 or 0.97 of the pages). With transparent huge pages on
    # for every mapping a fault maps 2 MiB, so the count says little there: the control is not asked of it
    plain = _measure("plain", tmp_path)
    if "[always]" not in _read("/sys/kernel/mm/transparent_hugepage/enabled"):
        assert plain["fault_share"] > 0.2, plain


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def test_the_settings_are_made_once_and_reported():
    first = keep_freed_memory()
    assert first == keep_freed_memory()
    assert first["trim_threshold"] >= 1 << 30 and first["mmap_threshold"] == 32 << 20


def test_a_refused_setting_is_a_warning_not_an_error(monkeypatch, caplog):
    """A C library that refuses a setting (a 32-bit glibc's mmap threshold limit is 512 KiB) leaves the run going,
    with one warning. Simulated: a stand-in for glibc whose ``mallopt`` refuses, in place of the real one."""
    from secure_fed.engine import allocator

    class Refusing:
        def __init__(self):
            self.mallopt = lambda *_: 0
            self.gnu_get_libc_version = lambda: b"2.36"

    monkeypatch.setattr(allocator, "_tried", False)
    monkeypatch.setattr(allocator, "_applied", None)
    monkeypatch.setattr(allocator.ctypes, "CDLL", lambda _name: Refusing())
    with caplog.at_level("WARNING", logger=allocator.__name__):
        assert allocator.keep_freed_memory() is None
    assert "refused mallopt mmap_threshold" in caplog.text


def test_a_nodes_copy_of_the_run_gives_freed_memory_back(tmp_path):
    """A Flower node's copy of the run (``node_copy``, one of many node processes on a machine) gives the freed burst
    back (measured: about 2 MiB left free in each of 5 processes), where an experiment keeps it (at least 128 MiB,
    above) and glibc's defaults keep it in some processes (measured: 146 MiB in 1 of 4). Every one of 3 fresh
    processes is asked."""
    copies = [_measure("node_copy", tmp_path / str(i)) for i in range(3)]
    assert max(c["free_mib"] for c in copies) < 32, copies
    if "[always]" not in _read("/sys/kernel/mm/transparent_hugepage/enabled"):  # a fault maps 2 MiB there (above)
        assert min(c["fault_share"] for c in copies) > 0.9, copies  # each burst mapped anew: nothing kept
    from secure_fed.engine.allocator import NODE_MMAP_THRESHOLD, NODE_TRIM_THRESHOLD

    node = {"mmap_threshold": NODE_MMAP_THRESHOLD, "trim_threshold": NODE_TRIM_THRESHOLD}
    assert all(c["applied"] == node for c in copies), copies
