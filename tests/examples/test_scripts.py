"""Every script in ``examples/`` runs with ``--small`` in a fresh process (cwd a temporary directory, the repository
on PYTHONPATH, a plugin it needs registered as ``pip install`` would), and its output says what the script shows."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.examples.conftest import PLUGINS, REPO, write_dist_info

EXAMPLES = REPO / "examples"


def run_script(tmp_path: Path, name: str, *args: str, path: tuple[str, ...] = ()) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *path])}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--small", "--out", str(tmp_path / "out"), *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def test_dp_run_reaches_its_target_epsilon_and_prints_the_report(tmp_path):
    out = run_script(tmp_path, "dp_run.py", "--epsilon", "3")
    privacy = summary(tmp_path / "out")["privacy"]
    eps = float(privacy["epsilon"])
    assert math.isfinite(eps) and 0 < eps <= 3.0 and privacy["unit"] == "client"
    assert f"privacy: ε = {eps:.3f}, δ = 1e-05, unit: client" in out
    assert "against the observer" in out and "against the server: ε = ∞" in out


def test_custom_layer_clips_every_update_the_server_receives(tmp_path):
    site = tmp_path / "site"
    write_dist_info(site, "clipping_layer")
    out = run_script(tmp_path, "custom_layer.py", "--max-norm", "0.05", path=(str(site), str(PLUGINS / "clipping_layer")))
    s = summary(tmp_path / "out")
    assert s["protocols"] == ["clipping", "dp"] and s["status"] == "completed"
    line = next(x for x in out.splitlines() if x.startswith("updates received:"))
    received, largest = int(line.split()[2].rstrip(",")), float(line.split()[5])
    assert received == 2 * s["num_clients"] and 0 < largest <= 0.05 * (1 + 1e-6), line


def test_custom_layer_without_the_plugin_says_how_to_install_it(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "custom_layer.py"), "--small", "--out", str(tmp_path / "out")],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error: ") and "pip install" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_custom_attack_writes_its_metric_to_the_runs_attacks_file(tmp_path):
    out = run_script(tmp_path, "custom_attack.py")
    doc = json.loads((tmp_path / "out" / "private" / "attacks.json").read_text())
    entry = doc["attacks"]["update_norm_size"]
    assert "skipped" not in entry, entry
    assert -1.0 <= entry["metrics"]["spearman"] <= 1.0 and entry["chance"] == {"spearman": 0.0}
    assert entry["details"]["clients"] == summary(tmp_path / "out")["num_clients"]
    assert "update_norm_size: " in out


def test_tradeoff_has_one_row_per_epsilon_each_within_its_target(tmp_path):
    out = run_script(tmp_path, "tradeoff_from_python.py")
    with open(tmp_path / "out" / "tradeoff.csv") as fh:
        rows = list(csv.DictReader(fh))
    targets = [float(r["target"]) for r in rows]
    assert targets == [1.0, 8.0, math.inf]
    for r in rows:
        eps, target = float(r["epsilon"]), float(r["target"])
        assert eps <= target and (math.isinf(eps) == math.isinf(target)), r
    sigmas = [float(r["sigma"]) for r in rows[:2]]
    assert sigmas[0] > sigmas[1] > 0  # a larger budget is calibrated to less noise (utility need not follow: 1 seed)
    assert (tmp_path / "out" / "tradeoff.png").stat().st_size > 1000
    assert len([x for x in out.splitlines() if x.strip() and x.split()[0] in ("1", "8", "inf")]) == 3


def test_flower_deployment_matches_the_in_process_run(tmp_path):
    pytest.importorskip("flwr")
    out = run_script(tmp_path, "flower_deployment.py")
    local, flower = summary(tmp_path / "out" / "in-process"), summary(tmp_path / "out" / "flower")
    assert local["status"] == flower["status"] == "completed"
    assert local["privacy"] == flower["privacy"]
    for k, v in local["final"].items():
        assert flower["final"][k] == pytest.approx(v, abs=1e-5), k
    assert "largest metric difference" in out
