"""Contribution bounding: what a run releases about its privacy is a function of config and public facts.

The neighbouring-data test: a data set D, D minus its instance with the most labels, and D plus an instance with more
labels than any other. Every released field of ``summary.json`` and ``metrics.jsonl`` other than the model's metrics
(σ, steps, scope, group sizes, ε, counts) must be identical on all three, for the instance, client and local units.
Before the public bound, σ and the steps followed the data's largest label count, and these runs released different
privacy blocks.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from secure_fed.config import build_plan
from secure_fed.data import MultiLabelSplit
from secure_fed.data.bounding import bound_labels, bounding_key, kept_labels
from secure_fed.data.from_config import build_dataset
from secure_fed.engine import Experiment
from tests.conftest import small_config
from tests.engine.test_released_files import EVAL

# ------------------------------------------------------------------ the rule


def _labels(rows: list[list[int]], width: int) -> sp.csr_matrix:
    r = [i for i, row in enumerate(rows) for _ in row]
    c = [lab for row in rows for lab in row]
    return sp.csr_matrix((np.ones(len(r), dtype=np.int8), (r, c)), shape=(len(rows), width))


def test_rows_within_the_bound_are_unchanged_and_others_keep_m_of_their_own_labels():
    rng = np.random.default_rng(0)
    rows = [sorted(rng.choice(12, size=int(rng.integers(1, 9)), replace=False).tolist()) for _ in range(60)]
    y = _labels(rows, 12)
    x = sp.csr_matrix(rng.random((60, 5)).astype(np.float32))
    out, n = bound_labels(y, x, 3, "keep_hashed", bounding_key(0))
    assert n == sum(len(r) > 3 for r in rows) > 0
    for i, row in enumerate(rows):
        got = out[i].indices.tolist()
        if len(row) <= 3:
            assert got == row
        else:
            assert len(got) == 3 and set(got) <= set(row)
    dropped, n2 = bound_labels(y, x, 3, "drop", bounding_key(0))
    assert n2 == n
    for i, row in enumerate(rows):
        assert dropped[i].indices.tolist() == (row if len(row) <= 3 else [])


def test_the_kept_labels_of_an_instance_depend_on_that_instance_alone():
    """Removing or adding other instances, or moving the instance to another row, keeps its labels the same."""
    rng = np.random.default_rng(1)
    rows = [sorted(rng.choice(20, size=9, replace=False).tolist()) for _ in range(30)]
    x = sp.csr_matrix(rng.random((30, 6)).astype(np.float32))
    key = bounding_key(3)
    full, _ = bound_labels(_labels(rows, 20), x, 4, "keep_hashed", key)
    sub = [5, 17, 2]  # a neighbouring set: the others removed, the order changed
    part, _ = bound_labels(_labels([rows[i] for i in sub], 20), x[sub], 4, "keep_hashed", key)
    for j, i in enumerate(sub):
        assert part[j].indices.tolist() == full[i].indices.tolist()
    # the choice is spread over the labels (not the first m): an independent count over many instances
    firsts = sum(full[i].indices.tolist() == rows[i][:4] for i in range(30))
    assert firsts < 5
    # and it follows the documented hash of the instance and each label
    assert kept_labels(x, 0, np.array(rows[0]), 4, key).tolist() == full[0].indices.tolist()


def test_a_bound_below_one_and_an_unknown_rule_are_refused():
    y = _labels([[0, 1]], 2)
    with pytest.raises(ValueError, match="at least 1"):
        bound_labels(y, np.zeros((1, 2), np.float32), 0, "keep_hashed", bounding_key(0))
    with pytest.raises(ValueError, match="unknown bounding rule"):
        bound_labels(y, np.zeros((1, 2), np.float32), 1, "truncate", bounding_key(0))


# ------------------------------------------------------------------ the neighbouring-data test

UNITS = {
    "instance": [
        'protocols=["dp"]', "algorithm.normalize_gamma=false",
        'privacy.instance={"target_epsilon": 4, "sample_rate": 0.2, "max_labels_per_instance": 3}',
        'privacy.local={"batch_sample_rate": 0.5}',
    ],
    "client": [
        "algorithm.name=fedaws", 'protocols=["dp"]',
        'privacy.client={"target_epsilon": 4, "clip_norm": 0.5, "max_labels_per_instance": 3}',
    ],
    "local": [
        "algorithm.name=fedaws", 'protocols=["dp"]',
        'privacy.local={"target_epsilon": 4, "batch_sample_rate": 0.5, "max_labels_per_instance": 3}',
    ],
}  # fmt: skip


def neighbours(ds):
    """(D, D minus its instance with the most labels, D plus an instance with more labels than any other)."""
    tr = ds.train
    counts = np.diff(sp.csr_matrix(tr.labels).indptr)
    top = int(np.argmax(counts))
    keep = np.flatnonzero(np.arange(tr.num_instances) != top)
    minus = dataclasses.replace(ds, train=MultiLabelSplit(tr.features[keep], sp.csr_matrix(tr.labels)[keep]))
    width = min(tr.labels.shape[1], int(counts.max()) + 2)
    extra_y = sp.csr_matrix((np.ones(width, dtype=np.int8), (np.zeros(width, int), np.arange(width))),
                            shape=(1, tr.labels.shape[1]))  # fmt: skip
    stack = sp.vstack if sp.issparse(tr.features) else np.concatenate
    plus_x = stack([tr.features, tr.features[top : top + 1]])
    plus = dataclasses.replace(ds, train=MultiLabelSplit(sp.csr_matrix(plus_x) if sp.issparse(tr.features) else plus_x,
                                                         sp.vstack([tr.labels, extra_y]).tocsr()))  # fmt: skip
    assert np.diff(plus.train.labels.indptr).max() > counts.max()
    return {"D": ds, "D-": minus, "D+": plus}


def released_privacy_fields(run_dir: Path) -> dict:
    """Every released field but the model's metrics: summary.json without ``final``/``W_mean_cos`` and metrics.jsonl
    lines without the evaluation metrics."""
    summary = json.loads((run_dir / "summary.json").read_text())
    summary.pop("final", None)
    summary.pop("W_mean_cos", None)
    lines = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        doc = json.loads(line)
        lines.append({k: v for k, v in doc.items() if k not in EVAL and k != "W_mean_cos"})
    return {"summary": summary, "metrics": lines}


@pytest.mark.parametrize("unit", list(UNITS))
def test_neighbouring_data_sets_release_identical_privacy_fields(tmp_path, unit):
    cfg = small_config("training.rounds=2", "evaluation.every=2", *UNITS[unit])
    sets = neighbours(build_dataset(build_plan(cfg)))
    released = {}
    for name, ds in sets.items():
        Experiment(build_plan(cfg), run_dir=tmp_path / name.replace("+", "plus").replace("-", "minus"), dataset=ds).run(
            progress=False
        )
        released[name] = released_privacy_fields(tmp_path / name.replace("+", "plus").replace("-", "minus"))
    assert released["D"]["summary"]["privacy"]["units"], "the run released no privacy report"
    assert released["D-"] == released["D"]
    assert released["D+"] == released["D"]


BIBTEX = ["dataset.name=bibtex", "training.rounds=1", "evaluation.every=1", "evaluation.max_test=50", "device=cpu",
          "model.name=sparse_text", "model.hidden_dims=[16]", "model.embedding_dim=16", "model.embed_dim=16",
          "output.checkpoint_every=1"]  # fmt: skip
BIBTEX_UNITS = {
    "instance": ['protocols=["dp"]', "algorithm.normalize_gamma=false",
                 'privacy.instance={"target_epsilon": 4, "sample_rate": 0.1, "expected_batch_size": 488, '
                 '"clip_norm": 1000.0, "max_labels_per_instance": 2}'],
    "client": ["algorithm.name=fedaws", 'protocols=["dp"]',
               'privacy.client={"target_epsilon": 4, "clip_norm": 0.5, "max_labels_per_instance": 2}'],
    "local": ["algorithm.name=fedaws", 'protocols=["dp"]',
              'privacy.local={"target_epsilon": 4, "batch_sample_rate": 1.0, "max_labels_per_instance": 2}'],
}  # fmt: skip


@pytest.mark.data
@pytest.mark.parametrize("unit", list(BIBTEX_UNITS))
def test_bibtex_and_its_neighbours_release_identical_privacy_fields(tmp_path, data_root, unit):
    """Bibtex (its largest label count, 28, held by one instance), Bibtex without that instance, and Bibtex with an
    instance of 30 labels: one round each, the same released fields but the model's metrics."""
    from secure_fed.config import load_config

    cfg = load_config(overrides=[*BIBTEX, *BIBTEX_UNITS[unit]])
    sets = neighbours(build_dataset(build_plan(cfg), str(data_root)))
    assert np.diff(sets["D"].train.labels.indptr).max() == 28
    released = {}
    for name, ds in sets.items():
        run = tmp_path / name.replace("+", "plus").replace("-", "minus")
        Experiment(build_plan(cfg), run_dir=run, dataset=ds).run(progress=False)
        released[name] = released_privacy_fields(run)
    assert released["D-"] == released["D"]
    assert released["D+"] == released["D"]


def test_one_instance_written_two_ways_keeps_the_same_labels():
    """A CSR row with an explicit zero and a duplicated entry is the same instance as its canonical form."""
    labels = np.arange(10)
    a = sp.csr_matrix((np.array([1.0, 2.0]), np.array([1, 4]), np.array([0, 2])), shape=(1, 6))
    b = sp.csr_matrix((np.array([0.0, 2.0, 0.5, 0.5]), np.array([0, 4, 1, 1]), np.array([0, 4])), shape=(1, 6))
    key = bounding_key(0)
    assert kept_labels(a, 0, labels, 3, key).tolist() == kept_labels(b, 0, labels, 3, key).tolist()


def test_a_label_the_bound_empties_keeps_its_client_and_the_run_starts_either_way(tmp_path):
    """Whether a run starts must not depend on one instance: a label held only by an instance above the bound loses it
    (drop), and its client stays, with no data; the neighbour without that instance releases the same fields."""
    cfg = small_config("training.rounds=2", "evaluation.every=2", "algorithm.name=fedaws", 'protocols=["dp"]',
                       'privacy.client={"target_epsilon": 4, "clip_norm": 0.5, "max_labels_per_instance": 2}',
                       "privacy.over_bound=drop")  # fmt: skip
    ds = build_dataset(build_plan(cfg))
    y = sp.csr_matrix(ds.train.labels).tolil()
    top = int(np.argmax(np.diff(sp.csr_matrix(ds.train.labels).indptr)))
    last = y.shape[1] - 1
    for i in range(y.shape[0]):  # the last label: held by the top instance only, which has more than 2 labels
        if i != top:
            y[i, last] = 0
    y[top, last] = 1
    ds = dataclasses.replace(ds, train=MultiLabelSplit(ds.train.features, y.tocsr()))
    assert len(y.rows[top]) > 2
    sets = neighbours(ds)
    released = {}
    for name in ("D", "D-"):
        run = tmp_path / name.replace("-", "minus")
        exp = Experiment(build_plan(cfg), run_dir=run, dataset=sets[name])
        assert len(exp.fed.shards[last].indices) == 0  # the client of the emptied label, with no data
        assert exp.run(progress=False).summary["status"] == "completed"
        released[name] = released_privacy_fields(run)
    assert released["D-"] == released["D"]
