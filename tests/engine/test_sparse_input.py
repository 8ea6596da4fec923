"""Sparse input rows through the engine: a run on XC files with ``model.sparse_input`` true equals the same run on
dense rows (the reference), and the option's misuse is a one-line error."""

from __future__ import annotations

import numpy as np
import pytest

from secure_fed.config import load_config
from secure_fed.data.synth_xc import synth_xc
from secure_fed.engine import Experiment
from secure_fed.errors import ConfigError
from secure_fed.models.sparse_rows import SparseRows
from tests.conftest import SMALL


@pytest.fixture(scope="module")
def xc_files(tmp_path_factory):
    out = tmp_path_factory.mktemp("xc")
    synth_xc("eurlex-4k", out=out, scale=0.01, seed=0)
    return out


def _cfg(xc_files, *over):
    return load_config(overrides=[
        *SMALL, f"dataset={{format: xc, train: {xc_files}/train.txt, test: {xc_files}/test.txt}}",
        "model.name=sparse_text", "model.embed_dim=16", "training.rounds=2", "training.client_fraction=0.5",
        # plain averaging on the server: FedAdam's normalised steps would magnify fp32 reassociation in near-zero entries
        "training.server_optimizer={name: fedavg, lr: 1.0}", *over,
    ])  # fmt: skip


@pytest.mark.parametrize("algorithm", ["fedavg", "fedaws", "fedalc"])
def test_sparse_rows_run_equals_dense_rows_run(xc_files, tmp_path, algorithm):
    runs = {}
    for sparse in (True, False):
        exp = Experiment(_cfg(xc_files, f"algorithm.name={algorithm}", f"model.sparse_input={str(sparse).lower()}"),
                         run_dir=tmp_path / str(sparse))  # fmt: skip
        assert isinstance(exp.fed.clients[0].x, SparseRows) == sparse
        assert isinstance(exp.fed.x_test, SparseRows) == sparse
        runs[sparse] = (exp.run(progress=False), exp)
    (a, ea), (b, eb) = runs[True], runs[False]
    for n in ea.theta:
        np.testing.assert_allclose(ea.theta[n].numpy(), eb.theta[n].numpy(), rtol=1e-5, atol=1e-6, err_msg=n)
    np.testing.assert_allclose(ea.W.numpy(), eb.W.numpy(), rtol=1e-5, atol=1e-6)
    for k in ("P@1", "P@3", "mAP"):
        assert a.summary["final"][k] == pytest.approx(b.summary["final"][k], abs=1e-3), k


def test_auto_keeps_small_data_dense(xc_files, tmp_path):
    exp = Experiment(_cfg(xc_files), run_dir=tmp_path)
    assert not isinstance(exp.fed.clients[0].x, SparseRows)  # 1% of EURLex: far under the 1 GiB of dense copies


def test_sparse_input_true_needs_sparse_text_on_sparse_data(tmp_path, xc_files):
    with pytest.raises(ConfigError, match=r"model.sparse_input=true .* dataset 'synthetic' has dense features"):
        Experiment(load_config(overrides=[*SMALL, "model.sparse_input=true"]), run_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"model.sparse_input=true .* model.name=mlp"):
        Experiment(_cfg(xc_files, "model.name=mlp", "model.sparse_input=true"), run_dir=tmp_path / "b")
