"""Labels that only the test split has (as in Mulan's medical and enron): dropped by default with a one-line
note, recorded in summary.json, train and test label spaces kept equal; FedALC trains without manual work."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from tests.conftest import REPO

LABELS = ["l0", "l1", "l2", "l3", "only_in_test"]


def _arff(rows: list[tuple[list[float], list[int]]]) -> str:
    head = ["@relation fixture"] + [f"@attribute f{i} numeric" for i in range(6)]
    head += [f"@attribute {n} {{0,1}}" for n in LABELS] + ["@data"]
    return "\n".join(head + [",".join(map(str, [*x, *y])) for x, y in rows]) + "\n"


def _fixture(tmp_path):
    rng = np.random.default_rng(0)

    def rows(n, allow_last):
        out = []
        for _ in range(n):
            y = (rng.random(5) < 0.4).astype(int)
            y[4] = int(allow_last and rng.random() < 0.5)
            if y.sum() == 0:
                y[rng.integers(4)] = 1
            out.append((np.round(rng.normal(size=6) + y[:4].sum(), 3).tolist(), y.tolist()))
        return out

    (tmp_path / "train.arff").write_text(_arff(rows(120, allow_last=False)))  # label 'only_in_test' never in training
    (tmp_path / "test.arff").write_text(_arff(rows(40, allow_last=True)))
    xml = "".join(f'<label name="{n}"></label>' for n in LABELS)
    (tmp_path / "labels.xml").write_text(
        f'<?xml version="1.0"?><labels xmlns="http://mulan.sourceforge.net/labels">{xml}</labels>'
    )


def _run(tmp_path, *extra):
    args = ["run", "--out", str(tmp_path / "run"), "--set", "dataset.format=arff",
            "--set", f"dataset.train={tmp_path / 'train.arff'}", "--set", f"dataset.test={tmp_path / 'test.arff'}",
            "--set", f"dataset.labels={tmp_path / 'labels.xml'}", "--set", "dataset.name=fixture",
            "--set", "algorithm.name=fedalc", "--set", "training.rounds=2", "--set", "evaluation.every=1",
            "--set", "model.hidden_dims=[16]", "--set", "model.embedding_dim=8", "--set", "device=cpu",
            "--set", "output.progress=false", *extra]  # fmt: skip
    return subprocess.run([sys.executable, "-m", "secure_fed.cli", *args], cwd=REPO, capture_output=True, text=True)


def test_fedalc_trains_on_data_with_a_label_absent_from_training(tmp_path):
    _fixture(tmp_path)
    r = _run(tmp_path)
    assert r.returncode == 0, r.stderr
    notes = [x for x in r.stdout.splitlines() if x.startswith("note: dropped")]
    assert len(notes) == 1 and "only_in_test" in notes[0]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["dropped_labels"] == ["only_in_test"] and summary["num_clients"] == 4
    assert summary["status"] == "completed" and np.isfinite(summary["final"]["mAP"])


def test_without_dropping_the_refusal_says_how_to_fix_it(tmp_path):
    _fixture(tmp_path)
    r = _run(tmp_path, "--set", "dataset.drop_empty_labels=false")
    err = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 2 and len(err) == 1 and "drop_empty_labels" in err[0] and "Traceback" not in r.stderr
    assert not (tmp_path / "run").exists()


def test_under_dp_every_label_is_kept_and_an_explicit_drop_is_refused(tmp_path):
    """Which labels have a training instance is private under dp (removing a label's only instance would drop it and
    change W's shape): auto keeps every label there, the empty label's client holds no data, and the run completes;
    dataset.drop_empty_labels: true with dp is one error line."""
    _fixture(tmp_path)
    dp = ["--set", "algorithm.name=fedavg", "--set", 'protocols=["dp"]',
          "--set", 'privacy.client={"noise_multiplier": 1.0, "clip_norm": 0.5}']  # fmt: skip
    r = _run(tmp_path, *dp)
    assert r.returncode == 0, r.stderr
    assert not [x for x in r.stdout.splitlines() if x.startswith("note: dropped")]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["dropped_labels"] == [] and summary["num_clients"] == 5 and summary["status"] == "completed"
    bad = _run(tmp_path, *dp, "--set", "dataset.drop_empty_labels=true", "--out", str(tmp_path / "bad"))
    err = [x for x in bad.stderr.splitlines() if x.strip()]
    assert bad.returncode == 2 and len(err) == 1 and "drop_empty_labels" in err[0] and not (tmp_path / "bad").exists()
