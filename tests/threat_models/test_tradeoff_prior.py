"""``secure-fed tradeoff``: the "label prior only" row (``--prior auto``) and the study's table of P@1 / P@3 / mAP."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

from tests.conftest import SMALL

REPO = Path(__file__).resolve().parents[2]
BASE = ["protocols=[dp]", 'privacy.local={"batch_sample_rate": 0.5, "target_epsilon": 4.0, "max_labels_per_instance": 3}']


def test_the_prior_row_releases_its_counts_at_each_epsilon_with_the_configs_bound():
    """label_prior is read without a training unit; at a finite ε its statistic's mechanism gets the target and the
    config's contribution bound m; at ε = ∞ it runs without the dp layer."""
    from protocols.config_sections import PrivacyConfig
    from secure_fed.config import load_plan
    from threat_models.tradeoff_points import method_base, point_overrides, statistic_mechanism

    assert statistic_mechanism("label_prior") == "label_prior" and statistic_mechanism("fedaws") is None
    base = method_base(None, BASE, "label_prior")
    for eps in (2.0, math.inf):
        plan = load_plan(overrides=[*BASE, *point_overrides(base, method="label_prior", eps=eps, seed=0, unit="instance",
                                                            attacks=[])])  # fmt: skip
        p = plan.part(PrivacyConfig)
        assert plan.algorithm.name == "label_prior" and p.local is None and p.instance is None and p.client is None
        if math.isinf(eps):
            assert "dp" not in plan.protocols
        else:
            assert "dp" in plan.protocols and p.label_prior.target_epsilon == 2.0
            assert p.label_prior.max_labels_per_instance == 3  # the config's bound, not a default


def test_a_study_has_the_prior_row_its_table_and_the_map_plot(tmp_path):
    out = tmp_path / "study"
    sets = [x for o in [*SMALL, "training.rounds=1", "evaluation.every=1", *BASE] for x in ("--set", o)]
    args = [sys.executable, "-m", "secure_fed.cli", "tradeoff", "--methods", "fedaws", "--epsilons", "4,inf", "--seeds",
            "0", "--workers", "1", "--reference", "none", *sets, "--out", str(out)]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert sorted((r["method"], r["target_epsilon"]) for r in rows) == [
        ("fedaws", "4.0"), ("fedaws", "inf"), ("label_prior", "4.0"), ("label_prior", "inf")]  # fmt: skip
    prior = {r["target_epsilon"]: r for r in rows if r["method"] == "label_prior"}
    assert 0 < float(prior["4.0"]["epsilon"]) <= 4.0 and prior["inf"]["epsilon"] == "inf"
    # the table: one line per method, each cell the seeds' mean of P@1 / P@3 / mAP, equal to the runs' own numbers
    table = (out / "table.md").read_text()
    assert table.startswith("P@1 / P@3 / mAP, mean over seeds")
    for r in rows:
        cell = f"{float(r['P@1']):.1f} / {float(r['P@3']):.1f} / {float(r['mAP']):.1f} (1)"
        line = next(x for x in table.splitlines() if x.startswith(f"| {r['method']} |"))
        assert cell in line
    assert (out / "utility_vs_epsilon.png").is_file() and (out / "map_vs_epsilon.png").is_file()
    none = subprocess.run([*args[:-2], "--prior", "none", "--out", str(tmp_path / "bare")], capture_output=True, text=True,
                          cwd=REPO)  # fmt: skip
    assert none.returncode == 0, none.stderr[-3000:]
    assert {r["method"] for r in csv.DictReader((tmp_path / "bare" / "results.csv").open())} == {"fedaws"}
