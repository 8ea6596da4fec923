"""A run directory's released history, as the reports read it: the evaluated rounds of ``metrics.jsonl`` and
``summary.json`` (absent while the run is in progress)."""

from __future__ import annotations

import json
from pathlib import Path

from secure_fed.errors import SecureFedError


def load_run(run_dir: Path) -> tuple[list[dict], dict | None]:
    """``(evaluated rounds, summary or None)``; a running run's half-written last line is skipped."""
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        raise SecureFedError(f"{run_dir}: no metrics.jsonl (is this a run directory?)")
    lines = []
    raw = [x for x in metrics.read_text().splitlines() if x.strip()]
    for i, line in enumerate(raw):
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(raw) - 1:  # only a running run's last line may be half-written
                raise SecureFedError(f"{metrics}:{i + 1}: not a JSON line") from None
    history = [h for h in lines if "mAP" in h]  # evaluated rounds (mAP is computed at every evaluation)
    summary_path = run_dir / "summary.json"
    summary = None
    if summary_path.is_file():
        try:
            summary = json.loads(summary_path.read_text())
        except json.JSONDecodeError:
            raise SecureFedError(f"{summary_path}: not valid JSON") from None
    return history, summary
