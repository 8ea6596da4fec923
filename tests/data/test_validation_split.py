"""``dataset.evaluate_on: validation``: a validation split carved from the training split (the recipe is chosen on it,
never on the test split), its rows held out of training, the same rows for every run seed, and the metrics computed
on it released with no DP mechanism on them (ε = ∞ for those fields, said out loud)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from secure_fed.config import load_plan
from secure_fed.data.from_config import build_dataset, validation_dataset
from secure_fed.engine import Experiment
from secure_fed.errors import DataError
from tests.conftest import SMALL


def _rows(split) -> set[bytes]:
    x = split.features.toarray() if hasattr(split.features, "toarray") else split.features
    return {x[i].tobytes() + split.labels[i].toarray().tobytes() for i in range(split.num_instances)}


def test_the_validation_rows_are_training_rows_held_out(monkeypatch):
    full = build_dataset(load_plan(overrides=SMALL))
    ds = build_dataset(load_plan(overrides=[*SMALL, "dataset.evaluate_on=validation", "dataset.validation_fraction=0.25"]))
    n = full.train.num_instances
    assert ds.test.num_instances == int(0.25 * n) and ds.train.num_instances == n - int(0.25 * n)
    # the validation rows and the rest partition the training split; nothing of the test split is read
    assert _rows(ds.test) | _rows(ds.train) == _rows(full.train)
    assert not (_rows(ds.test) & _rows(ds.train)) and not (_rows(ds.test) & _rows(full.test))
    assert "validation (held-out training rows)" in ds.describe()
    other = build_dataset(load_plan(overrides=[*SMALL, "dataset.evaluate_on=validation", "dataset.split_seed=5"]))
    assert _rows(other.test) != _rows(ds.test)
    # split_seed draws the rows, never the run seed (the synthetic data itself depends on the run seed, so spy)
    import secure_fed.data.from_config as fc

    seen = []
    monkeypatch.setattr(fc, "validation_dataset", lambda d, f, s: seen.append((f, s)) or validation_dataset(d, f, s))
    for seed in (0, 3):
        fc.build_dataset(load_plan(overrides=[*SMALL, f"seed={seed}", "dataset.evaluate_on=validation"]))
    assert seen == [(0.2, 0), (0.2, 0)]


def test_a_split_that_would_be_empty_is_one_line():
    ds = build_dataset(load_plan(overrides=SMALL))
    with pytest.raises(DataError, match="leaves an empty split"):
        validation_dataset(ds, 1e-6, 0)


def test_validation_metrics_are_released_with_no_mechanism_on_them(tmp_path, monkeypatch):
    monkeypatch.delenv("SECURE_FED_STRICT_RELEASE", raising=False)  # a NO_MECHANISM field is said, never raised
    plan = load_plan(overrides=[*SMALL, "training.rounds=1", "evaluation.every=1", "dataset.evaluate_on=validation"])
    Experiment(plan, run_dir=tmp_path).run(progress=False)
    summary = json.loads((tmp_path / "summary.json").read_text())
    line = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert np.isfinite(line["P@1"])
    findings = " ".join(map(str, summary["privacy"].get("findings", summary["privacy"].values())))
    assert "P@1" in findings and "no DP mechanism" in findings
    assert str(summary["privacy"]["epsilon"]) in ("inf", "∞") and summary["final"]["P@1"] == line["P@1"]
    # the tags themselves: every metric on the validation rows, in the metrics line and in summary.json, has none
    from secure_fed.engine.evaluation import tagged_metric
    from secure_fed.release import NO_MECHANISM, PROTECTED

    assert tagged_metric("P@1", 1.0, on_validation=True).why == NO_MECHANISM
    assert tagged_metric("P@1", 1.0, on_validation=True).tag == PROTECTED and tagged_metric("P@1", 1.0).tag != PROTECTED
