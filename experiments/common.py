"""Shared helpers for the experiment scripts: cached, resumable runs in worker processes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

EXPERIMENTS = Path(__file__).resolve().parent
CONFIGS = EXPERIMENTS / "configs"


def run_cached(config_path: str, overrides: list[str], run_dir: str, data_root: str | None, threads: int) -> dict[str, Any]:
    """Run one config unless ``run_dir/summary.json`` says it already completed; resume if a checkpoint exists."""
    import torch

    torch.set_num_threads(threads)
    from secure_fed.config import load_config
    from secure_fed.engine import Experiment

    out = Path(run_dir)
    cfg = load_config(config_path, overrides)
    done = out / "summary.json"
    if done.is_file():
        summary = json.loads(done.read_text())
        finished = summary.get("status") == "budget_exhausted" or summary.get("rounds_completed", 0) >= cfg.training.rounds
        if summary.get("status") in ("completed", "budget_exhausted") and finished:
            return summary
    exp = Experiment(cfg, run_dir=out, data_root=data_root)
    exp.resume()
    return exp.run(progress=False).summary


def history(run_dir: str | Path) -> list[dict[str, Any]]:
    """The evaluated rounds of a run (metrics.jsonl has one line per round; metrics on evaluation rounds)."""
    path = Path(run_dir) / "metrics.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    return [h for h in lines if "P@1" in h]


def default_workers() -> int:
    return max(1, min(2, os.cpu_count() or 1))
