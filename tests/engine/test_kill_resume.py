"""kill -9 in the middle of a DP run, then ``secure-fed resume``: the same final metrics, ε and
``metrics.jsonl`` as an uninterrupted run (``privacy.noise_seed`` makes the two comparable)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import REPO

DP_RUN = [
    "--set", "training.rounds=30", "--set", "evaluation.every=5", "--set", "output.checkpoint_every=1",
    "--set", "output.progress=false", "--set", "device=cpu",
    "--set", 'protocols=["dp"]', "--set", "algorithm.normalize_gamma=false",
    "--set", 'privacy.instance={"noise_multiplier": 1.0, "sample_rate": 0.2}',
    "--set", 'privacy.client={"noise_multiplier": 0.8, "clip_norm": 1.0}',
    "--set", "training.client_fraction=0.5", "--set", "training.sampling=poisson",
    "--set", "privacy.noise_seed=2024",
]  # fmt: skip


def _cli(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "secure_fed.cli", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)  # fmt: skip


def _lines(run: Path) -> list[dict]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    for x in lines:
        x.pop("wall_seconds", None)
    return lines


def test_kill_9_then_resume_matches_an_uninterrupted_run(tmp_path):
    full, killed = tmp_path / "full", tmp_path / "killed"
    p = _cli("run", "--out", str(full), *DP_RUN)
    assert p.wait(timeout=300) == 0, p.stdout.read()

    p = _cli("run", "--out", str(killed), *DP_RUN)
    metrics = killed / "metrics.jsonl"
    deadline = time.time() + 240
    while time.time() < deadline and p.poll() is None:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= 8:
            break
        time.sleep(0.02)
    assert p.poll() is None, "the run finished before it could be killed"
    p.send_signal(signal.SIGKILL)
    assert p.wait(timeout=30) == -signal.SIGKILL
    assert not (killed / "summary.json").exists() and len(metrics.read_text().splitlines()) < 30

    r = _cli("resume", str(killed))
    out, _ = r.communicate(timeout=300)
    assert r.returncode == 0, out
    assert "resuming" in out

    a, b = (json.loads((d / "summary.json").read_text()) for d in (full, killed))
    assert a["final"] == b["final"] and a["rounds_completed"] == b["rounds_completed"] == 30
    assert a["privacy"] == b["privacy"]
    assert _lines(full) == _lines(killed)
