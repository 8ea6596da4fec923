import re

import numpy as np
import pytest

from secure_fed.config import build_plan
from secure_fed.data import SyntheticSpec, load_registered, make_synthetic
from secure_fed.engine import Experiment
from secure_fed.errors import DataError
from tests.conftest import small_config


def test_missing_dataset_names_path_and_fetch_command(tmp_path):
    with pytest.raises(DataError) as exc:
        load_registered("bibtex", tmp_path)
    msg = str(exc.value)
    assert str(tmp_path / "mulan" / "bibtex" / "bibtex-train.arff") in msg
    assert "secure-fed data download bibtex" in msg


def test_check_data_files_names_a_registered_datasets_missing_file_without_loading(tmp_path, monkeypatch):
    from secure_fed.data.from_config import check_data_files
    from secure_fed.data.registry import REGISTRY

    monkeypatch.delenv("SECURE_FED_DATA", raising=False)
    plan = build_plan(small_config("dataset.name=bibtex"))
    with pytest.raises(DataError) as exc:
        check_data_files(plan.dataset, str(tmp_path))
    with pytest.raises(DataError) as loader:  # the loader's own line, word for word
        load_registered("bibtex", tmp_path)
    assert str(exc.value) == str(loader.value)
    monkeypatch.setenv("SECURE_FED_DATA", str(tmp_path))  # no --data-root: the environment's root
    with pytest.raises(DataError, match=re.escape(str(tmp_path / "mulan" / "bibtex" / "bibtex-train.arff"))):
        check_data_files(plan.dataset)
    with pytest.raises(DataError, match=re.escape(str(tmp_path / "given"))):  # the given root before the environment
        check_data_files(plan.dataset, str(tmp_path / "given"))
    rooted = build_plan(small_config("dataset.name=bibtex", f"dataset.root={tmp_path / 'own'}")).dataset
    with pytest.raises(DataError, match=re.escape(str(tmp_path / "own"))):  # the config's root before the environment
        check_data_files(rooted)
    for name in REGISTRY["bibtex"].files:  # present (not read): no error
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    check_data_files(plan.dataset, str(tmp_path))
    check_data_files(build_plan(small_config()).dataset, str(tmp_path / "none"))  # generated: no files to check


def test_root_from_environment(monkeypatch, data_root):
    monkeypatch.setenv("SECURE_FED_DATA", str(data_root))
    assert load_registered("emotions").train.num_instances == 391


def _write_arff(path, split, label_names):
    x, y = split.features.toarray(), split.labels.toarray()
    lines = ["@relation own"] + [f"@attribute {n} {{0,1}}" for n in label_names]
    lines += [f"@attribute feat{j} numeric" for j in range(x.shape[1])] + ["@data"]
    lines += [",".join([*(str(int(v)) for v in y[i]), *(f"{v:.6f}" for v in x[i])]) for i in range(len(x))]
    path.write_text("\n".join(lines) + "\n")


def _write_xc(path, split):
    x, y = split.features.toarray(), split.labels.toarray()
    rows = [f"{x.shape[0]} {x.shape[1]} {y.shape[1]}"]
    for i in range(len(x)):
        labs = ",".join(str(j) for j in np.flatnonzero(y[i]))
        feats = " ".join(f"{j}:{x[i, j]:.6f}" for j in np.flatnonzero(x[i]))
        rows.append(f"{labs} {feats}")
    path.write_text("\n".join(rows) + "\n")


@pytest.mark.parametrize("fmt", ["arff", "xc"])
def test_own_dataset_by_path_runs_end_to_end(tmp_path, fmt):
    """A dataset that is not in the registry, given by file paths only (labels stored first)."""
    ds = make_synthetic(SyntheticSpec(num_train=120, num_test=60, num_features=6, num_labels=4, num_groups=2), seed=3)
    names = [f"tag{i}" for i in range(4)]
    if fmt == "arff":
        _write_arff(tmp_path / "own-train.arff", ds.train, names)
        _write_arff(tmp_path / "own-test.arff", ds.test, names)
        xml = "".join(f'<label name="{n}"></label>' for n in names)
        (tmp_path / "own.xml").write_text(f'<labels xmlns="http://mulan.sourceforge.net/labels">{xml}</labels>')
        files = [
            f"dataset.train={tmp_path}/own-train.arff",
            f"dataset.test={tmp_path}/own-test.arff",
            f"dataset.labels={tmp_path}/own.xml",
        ]
    else:
        _write_xc(tmp_path / "own_train.txt", ds.train)
        _write_xc(tmp_path / "own_test.txt", ds.test)
        files = [f"dataset.train={tmp_path}/own_train.txt", f"dataset.test={tmp_path}/own_test.txt"]
    cfg = small_config(f"dataset.format={fmt}", "dataset.name=own", *files, "training.rounds=2")
    exp = Experiment(build_plan(cfg), run_dir=tmp_path / "run")
    np.testing.assert_allclose(exp.dataset.train.features.toarray(), ds.train.features.toarray(), atol=1e-5)
    np.testing.assert_array_equal(exp.dataset.train.labels.toarray(), ds.train.labels.toarray())
    result = exp.run(progress=False)
    assert result.summary["rounds_completed"] == 2
    assert result.summary["dataset"] == "own"


def test_real_dense_dataset_runs_with_the_mlp(data_root, tmp_path):
    cfg = small_config("dataset.name=emotions", f"dataset.root={data_root}", "model.name=auto", "training.rounds=2")
    exp = Experiment(build_plan(cfg), run_dir=tmp_path)
    assert exp.dataset.feature_kind == "dense" and len(exp.fed.clients) == 6
    res = exp.run(progress=False)
    assert res.summary["dataset"] == "emotions" and np.isfinite(res.summary["final"]["P@1"])
