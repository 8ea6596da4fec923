"""Shared helpers for the experiment scripts: cached, resumable runs in worker processes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

EXPERIMENTS = Path(__file__).resolve().parent
CONFIGS = EXPERIMENTS / "configs"


def run_cached(config_path: str, overrides: list[str], run_dir: str, data_root: str | None, threads: int) -> dict[str, Any]:
    """Run one config in a worker process, through the CLI's cache (:func:`secure_fed.plugin_api.attacks.run_cached`)."""
    import torch

    torch.set_num_threads(threads)
    from secure_fed.config import load_plan
    from secure_fed.plugin_api.attacks import run_cached as run

    return with_timing(run(load_plan(config_path, overrides), run_dir, data_root=data_root), run_dir)


def with_timing(summary: dict[str, Any], run_dir: str | Path) -> dict[str, Any]:
    """The summary plus the run's wall-clock figures, which live in ``private/summary.json`` (timing tracks how
    many clients trained, so it is not released); summaries written before that keep their own."""
    private = Path(run_dir) / "private" / "summary.json"
    if private.is_file():
        p = json.loads(private.read_text())
        return {**summary, "wall_seconds": p["wall_seconds"], "seconds_per_round": p["seconds_per_round"]}
    return summary


def history(run_dir: str | Path) -> list[dict[str, Any]]:
    """The evaluated rounds of a run (metrics.jsonl has one line per round; metrics on evaluation rounds)."""
    path = Path(run_dir) / "metrics.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    return [h for h in lines if "P@1" in h]


def default_workers() -> int:
    return max(1, min(2, os.cpu_count() or 1))


def run_jobs(jobs: list[tuple[str, list[str], str, str | None, int]], workers: int) -> None:
    """Run ``(config, overrides, run_dir, data_root, threads)`` jobs through :func:`run_cached` in ``workers``
    processes, printing each run directory as it finishes (in job order)."""
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(workers) as pool:
        futures = [(job[2], pool.submit(run_cached, *job)) for job in jobs]
        for i, (rd, fut) in enumerate(futures, 1):
            fut.result()
            print(f"[{i}/{len(futures)}] {rd}", flush=True)
