"""``secure-fed data synth-xc``: XC files with a benchmark's shape, read back by the XC reader."""

from __future__ import annotations

import numpy as np
import pytest

from secure_fed.data import read_xc
from secure_fed.data.synth_xc import SHAPES, scaled_shape, synth_xc
from secure_fed.errors import DataError
from tests.test_cli import cli


def test_files_have_the_published_shape_scaled(tmp_path):
    shape = synth_xc("eurlex-4k", out=tmp_path, scale=0.1, seed=3)
    pub = SHAPES["eurlex-4k"]
    tr, te = read_xc(tmp_path / "train.txt"), read_xc(tmp_path / "test.txt")
    assert tr.features.shape == (round(pub.train * 0.1), pub.features) and te.features.shape[0] == round(pub.test * 0.1)
    assert tr.labels.shape[1] == shape.labels == round(pub.labels * 0.1)
    per_row = tr.labels.nnz / tr.labels.shape[0]
    assert 0.85 * pub.labels_per_instance <= per_row <= 1.05 * pub.labels_per_instance
    assert 0.8 * pub.nnz_per_row <= tr.features.nnz / tr.features.shape[0] <= 1.1 * pub.nnz_per_row
    counts = np.sort(np.asarray(tr.labels.sum(0)).ravel())[::-1]
    assert counts[0] > 20 * np.median(counts)  # Zipf: a head of frequent labels, a long tail
    assert (tr.features.data > 0).all()
    again = tmp_path / "again"
    synth_xc("eurlex-4k", out=again, scale=0.1, seed=3)
    assert (again / "train.txt").read_bytes() == (tmp_path / "train.txt").read_bytes()  # seeded


def test_bad_shape_or_scale_is_an_error_before_writing(tmp_path):
    with pytest.raises(DataError, match="unknown shape"):
        scaled_shape("eurlex", 0.1)
    r = cli("data", "synth-xc", "--like", "amazoncat-13k", "--scale", "2", "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and r.stderr.startswith("error: synth-xc: --scale") and "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()


def test_cli_writes_and_refuses_to_overwrite(tmp_path):
    r = cli("data", "synth-xc", "--like", "amazon-670k", "--scale", "0.0005", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert read_xc(tmp_path / "train.txt").labels.shape[1] == round(670_091 * 0.0005)
    r = cli("data", "synth-xc", "--like", "amazon-670k", "--scale", "0.0005", "--out", str(tmp_path))
    assert r.returncode == 2 and "already exists" in r.stderr
