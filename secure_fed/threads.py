"""torch's intra-op threads for a run (``training.threads``) and OpenMP's wait policy.

**Threads.** ``training.threads: auto`` (the default) picks :func:`auto_threads`: the CPUs this process may run on
(``os.sched_getaffinity``, not the machine's count: a container or ``taskset`` gives fewer), less the CPUs that the
run's other processes keep busy (Flower's simulated nodes: :func:`secure_fed.engine.flower.simulation.ray_cpus`),
less one for everything else on the machine, at least 1, and never more than torch's count when the run starts (a
caller that set fewer keeps them: ``OMP_NUM_THREADS``, the worker share of ``tradeoff --workers``, the experiment
scripts and pytest-xdist, each of which sets ``torch.set_num_threads`` in its workers). A number is used as given.

Why one less: a parallel region waits for its slowest thread, so a thread that shares its core with another busy
process stalls every region; with libgomp's default spinning the embedded default run took 3.2–5.7 s a round at
two threads beside other work on the project's 2-core machine, against 0.33 s with one (issue 53). With passive
waiting, one thread was faster there than two while the machine's other work was moderate; beside a busy process on
each core two threads were faster, presumably because they take a larger share of the contended cores, which ``auto`` does not
reach for (``benchmarks/threads.py``; docs/performance.md has the figures).

**Wait policy.** OpenMP threads that finish a region spin for a while before sleeping; beside other busy processes
the spinning takes the cores they need. torch's Linux wheels bring GNU OpenMP (libgomp, which MKL's threading uses
too), and it reads ``OMP_WAIT_POLICY`` (and ``GOMP_SPINCOUNT``, which overrides the policy's spin count) once, when
torch is imported. :func:`set_wait_policy` sets ``OMP_WAIT_POLICY=PASSIVE`` (spin count 0) in the environment
unless the user set either variable; ``import secure_fed`` calls it, so the CLI and the Python API set it before
they import torch, and every process they start inherits it. ``KMP_BLOCKTIME`` is Intel OpenMP's setting; the
wheels do not load that runtime. This module does not import torch.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from secure_fed.plan import RunPlan

#: the environment variable libgomp reads for its wait policy, and the value this package sets
WAIT_POLICY_VAR, WAIT_POLICY = "OMP_WAIT_POLICY", "PASSIVE"
#: libgomp's spin count before a waiting thread sleeps; where the user sets it, it overrides the wait policy
SPINCOUNT_VAR = "GOMP_SPINCOUNT"

_policy_source: str | None = None  # who set the wait policy this process's torch read (set_wait_policy)


def set_wait_policy(environ: dict[str, str] | None = None, *, torch_imported: bool | None = None) -> str:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` in ``environ`` (``os.environ``) unless the user set it or ``GOMP_SPINCOUNT``;
    returns (and, for ``os.environ``, remembers for :func:`wait_policy_record`) who set what torch reads:
    ``secure-fed``, ``user``, or ``too late`` where torch was imported before (the policy then holds only for the
    processes this one starts)."""
    env = os.environ if environ is None else environ
    imported = "torch" in sys.modules if torch_imported is None else torch_imported
    if WAIT_POLICY_VAR in env or SPINCOUNT_VAR in env:
        source = "user"
    else:
        env[WAIT_POLICY_VAR] = WAIT_POLICY
        source = "too late" if imported else "secure-fed"
    if environ is None:
        global _policy_source
        if _policy_source is None:  # the first call is the one before torch's import
            _policy_source = source
    return source


def wait_policy_record() -> dict[str, str | None]:
    """What this process's OpenMP waits with, for ``summary.json`` and ``validate``: the two variables as set, and
    who set them (``secure-fed``: before torch was imported; ``user``; ``too late``: torch was imported first, so
    this process runs with libgomp's default spinning)."""
    return {
        WAIT_POLICY_VAR: os.environ.get(WAIT_POLICY_VAR),
        SPINCOUNT_VAR: os.environ.get(SPINCOUNT_VAR),
        "set_by": _policy_source or "nobody",
    }


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity; the machine's count where the platform has no affinity)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)  # pragma: no cover - macOS, Windows


def flower_cpus(nodes: int, client_cpus: float, cpus: int) -> int:
    """The CPUs Flower's simulation gives Ray: those this process may run on (``cpus``), and no more than ``nodes``
    ClientApps of ``client_cpus`` each use (:func:`secure_fed.engine.flower.simulation.ray_cpus`)."""
    return max(1, min(cpus, math.ceil(nodes * client_cpus)))


def other_processes_cpus(plan: RunPlan, num_clients: int, cpus: int) -> int:
    """The CPUs the run's other processes keep busy: Flower's simulated nodes (``backend: flower``), else none (the
    in-process executors, sequential and vectorised, train in this process)."""
    if plan.backend != "flower":
        return 0
    return flower_cpus(plan.flower.num_supernodes or num_clients, plan.flower.client_cpus, cpus)


def auto_threads(*, cpus: int, others: int = 0, ceiling: int | None = None) -> tuple[int, str]:
    """``training.threads: auto``: ``cpus`` (the process may use) less ``others`` (CPUs the run's other processes
    keep busy) less one, at least 1 and at most ``ceiling`` (torch's count before the run); and why, in words."""
    free = max(1, cpus - others)
    n = max(1, free - 1)
    why = f"{cpus} usable CPU{'s' if cpus != 1 else ''}"
    if others:
        why += f", {others} for the run's other processes"
    if free > 1:
        why += ", one left for the rest of the machine"
    if ceiling is not None and ceiling < n:
        n, why = ceiling, why + f"; capped at torch's {ceiling} set before the run"
    return n, why


def resolve_threads(setting: int | str, *, others: int = 0, ceiling: int | None = None,
                    cpus: int | None = None) -> tuple[int, str]:  # fmt: skip
    """The torch threads ``training.threads`` asks for, and why: a number as given, ``auto`` by :func:`auto_threads`
    (``cpus``: :func:`usable_cpus` when None)."""
    if setting != "auto":
        return int(setting), "training.threads"
    return auto_threads(cpus=usable_cpus() if cpus is None else cpus, others=others, ceiling=ceiling)


@contextlib.contextmanager
def run_threads(plan: RunPlan, num_clients: int) -> Iterator[dict[str, Any]]:
    """Set torch's threads to what ``plan.training.threads`` picks for a run of ``num_clients`` clients, and put back
    the count before it on leaving; yields the record ``summary.json`` keeps (:func:`threads_record`)."""
    import torch

    before = torch.get_num_threads()
    record = threads_record(plan, num_clients, ceiling=before)
    torch.set_num_threads(record["torch_threads"])
    try:
        yield record
    finally:
        torch.set_num_threads(before)


def threads_record(plan: RunPlan, num_clients: int, *, ceiling: int | None = None, cpus: int | None = None) -> dict[str, Any]:
    """What ``training.threads`` picks here, with the wait policy: ``setting`` (as the config wrote it),
    ``torch_threads``, ``why``, the usable ``cpus`` and :func:`wait_policy_record`'s fields. A run's plan holds the
    count resolved when the run was built (:func:`secure_fed.model_choices.resolve_client_choices`), read as it is."""
    cpus = usable_cpus() if cpus is None else cpus
    t = plan.training
    if t.threads != "auto":  # a number: as given, or what ``auto`` resolved to when the run was built
        n, why = int(t.threads), t.threads_why
    else:
        n, why = resolve_threads(t.threads, others=other_processes_cpus(plan, num_clients, cpus), ceiling=ceiling, cpus=cpus)
    setting = "auto" if t.threads_auto else t.threads
    return {"setting": setting, "torch_threads": n, "why": why, "cpus": cpus, "wait_policy": wait_policy_record()}


def threads_line(record: dict[str, Any]) -> str:
    """``validate``'s line on the threads a run would use here and the OpenMP wait policy."""
    wp = record["wait_policy"]
    policy = f"{WAIT_POLICY_VAR}={wp[WAIT_POLICY_VAR]}" if wp[WAIT_POLICY_VAR] else f"{WAIT_POLICY_VAR} unset"
    if wp[SPINCOUNT_VAR] is not None:
        policy += f", {SPINCOUNT_VAR}={wp[SPINCOUNT_VAR]}"
    n = record["torch_threads"]
    picked = f"{record['setting']} → {n} torch thread{'s' if n != 1 else ''} ({record['why']})"
    return f"threads: {picked}; {policy} (set by {wp['set_by']})"


def env_threads_ceiling(environ: dict[str, str] | None = None) -> int | None:
    """torch's thread count at a run's start as the environment fixes it before torch is imported: a positive integer
    ``OMP_NUM_THREADS``, else None (torch's default: a thread per core)."""
    value = (os.environ if environ is None else environ).get("OMP_NUM_THREADS", "")
    return int(value) if value.strip().isdigit() and int(value) > 0 else None
