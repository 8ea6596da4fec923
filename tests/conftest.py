"""Shared fixtures. Tests that need the Mulan data use ``data_root``: they skip
when the data is absent on a developer machine, and FAIL under CI (CI=true)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from secure_fed.config import load_config

REPO = Path(__file__).resolve().parents[1]

#: Overrides that shrink the embedded default to a sub-second experiment.
SMALL = [
    "training.rounds=4",
    "evaluation.every=2",
    "output.progress=false",
    "output.checkpoint_every=2",
    "dataset.synthetic.num_train=400",
    "dataset.synthetic.num_test=200",
    "dataset.synthetic.num_labels=8",
    "dataset.synthetic.num_groups=2",
    "dataset.synthetic.num_features=16",
    "dataset.synthetic.feature_noise=0.6",
    "model.embedding_dim=16",
    "model.hidden_dims=[32]",
    "device=cpu",
]


def small_config(*overrides: str):
    return load_config(overrides=[*SMALL, *overrides])


def _data_root() -> Path | None:
    env = os.environ.get("SECURE_FED_DATA")
    for cand in ([Path(env)] if env else []) + [REPO.parent / "shared" / "datasets"]:
        if (cand / "mulan" / "bibtex" / "bibtex-train.arff").is_file():
            return cand.resolve()
    return None


@pytest.fixture(scope="session")
def data_root() -> Path:
    root = _data_root()
    if root is None:
        msg = "Mulan data not found: set SECURE_FED_DATA or run `secure-fed data download NAME`"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return root


@pytest.fixture(scope="session")
def bibtex(data_root):
    from secure_fed.data import load_registered

    return load_registered("bibtex", data_root)
