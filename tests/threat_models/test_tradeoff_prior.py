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
    rows_post = [*BASE, "evaluation.remove_shared_direction=true"]  # a recipe's row post-processing: not the prior's
    base = method_base(None, rows_post, "label_prior")
    for eps in (2.0, math.inf):
        plan = load_plan(overrides=[*rows_post, *point_overrides(base, method="label_prior", eps=eps, seed=0,
                                                                 unit="instance", attacks=[])])  # fmt: skip
        p = plan.part(PrivacyConfig)
        assert plan.algorithm.name == "label_prior" and p.local is None and p.instance is None and p.client is None
        assert not plan.evaluation.remove_shared_direction
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


def test_the_table_is_the_mean_over_the_runs_that_have_each_metric_in_epsilon_order():
    from threat_models.tradeoff import VALIDATION_NOTE, study_table

    rows = [
        {"method": "a", "target_epsilon": e, "P@1": p, "P@3": 1.0, "mAP": 2.0 * p}
        for e, p in [(8.0, 40.0), (8.0, 44.0), (1.0, 10.0), (1.0, 20.0), (math.inf, 50.0), (1.0, float("nan"))]
    ]
    rows.append({"method": "b", "target_epsilon": 1.0, "P@1": 5.0, "P@3": 4.0, "mAP": 3.0})  # fmt: skip
    table = study_table(rows)
    lines = table.splitlines()
    assert lines[2] == "| method | ε = 1 | ε = 8 | ε = inf |"
    assert lines[4] == "| a | 15.0 / 1.0 / 30.0 (2) | 42.0 / 1.0 / 84.0 (2) | 50.0 / 1.0 / 100.0 (1) |"
    assert lines[5] == "| b | 5.0 / 4.0 / 3.0 (1) | – | – |"
    assert VALIDATION_NOTE not in table and VALIDATION_NOTE in study_table(rows, validation=True)


def test_the_prior_takes_the_runs_one_bound_wherever_the_config_gives_it():
    from protocols.config_sections import PrivacyConfig
    from threat_models.tradeoff_points import method_base

    inst = ["protocols=[dp]", 'privacy.instance={"noise_multiplier": 20.0, "max_labels_per_instance": 5}',
            'privacy.local={"target_epsilon": 2.0}']  # fmt: skip
    p = method_base(None, inst, "label_prior").part(PrivacyConfig)
    assert p.label_prior.max_labels_per_instance == 5 and p.label_prior.target_epsilon == 2.0


def test_no_prior_row_at_the_client_unit_or_under_a_private_selection():
    import argparse

    from threat_models.tradeoff import prior_method

    def args(**kw):
        base = {"prior": "auto", "unit": "instance", "select": "none", "config": None, "overrides": BASE}
        return argparse.Namespace(**{**base, **kw})

    assert prior_method(args(), ["fedaws"])[0] == ["label_prior"]
    assert prior_method(args(unit="client"), ["fedaws"]) == ([], "no label-prior row under --unit client (its release "
                                                             "is accounted per instance)")  # fmt: skip
    assert prior_method(args(select="private"), ["fedaws"])[0] == []
    assert prior_method(args(prior="none"), ["fedaws"]) == ([], "")


def test_a_private_selection_on_a_validation_split_is_refused(tmp_path, capsys):
    """Its score would read training rows with no noise, outside the ε it reports."""
    from secure_fed.cli import main

    sets = [x for o in [*SMALL, *BASE, "dataset.evaluate_on=validation"] for x in ("--set", o)]
    code = main(["tradeoff", "--methods", "fedaws", "--epsilons", "4", "--seeds", "0", "--select", "private",
                 "--candidates", "training.client_lr=0.05,0.1", *sets, "--out", str(tmp_path / "s")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: --select private with dataset.evaluate_on validation")
    assert err.count("\n") == 1 and not (tmp_path / "s").exists()
