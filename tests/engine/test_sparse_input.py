"""Sparse input rows through the engine: a run on XC files with ``model.sparse_input`` true equals the same run on
dense rows (the reference), and the option's misuse is a one-line error."""

from __future__ import annotations

import numpy as np
import pytest
import torch

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


def _uplinks(exp):
    return [m for m in exp.messages if m["direction"] == "up" and "theta_delta" in m["message"]]


@pytest.mark.parametrize("algorithm", ["fedavg", "fedalc"])
def test_row_sparse_updates_equal_dense_updates_exactly(xc_files, tmp_path, algorithm):
    """A plaintext update of the input table as the columns the client touched gives the same run, bit for bit, as
    the dense update; the wire carries exactly the columns of the client's own features (read from the raw file)."""
    from secure_fed.data.from_config import build_dataset
    from secure_fed.models.sparse_rows import RowSparseDelta

    runs = {}
    for mode in ("auto", "false"):
        cfg = _cfg(xc_files, f"algorithm.name={algorithm}", "model.sparse_input=true", f"training.sparse_updates={mode}",
                   "output.log_messages=true")  # fmt: skip
        exp = Experiment(cfg, run_dir=tmp_path / mode)
        runs[mode] = (exp.run(progress=False), exp)
    (a, ea), (b, eb) = runs["auto"], runs["false"]
    assert ea.trainer.row_sparse_updates and not eb.trainer.row_sparse_updates
    for n in ea.theta:
        assert torch.equal(ea.theta[n], eb.theta[n]), n
    assert torch.equal(ea.W, eb.W)
    assert a.summary["final"] == b.summary["final"]
    table = next(n for n, t in ea.theta.items() if t.shape[1] == ea.dataset.train.features.shape[1])
    raw = build_dataset(ea.cfg, None).train.features.tocsr()
    ups = _uplinks(ea)
    assert ups and all(isinstance(m["message"]["theta_delta"][table], RowSparseDelta) for m in ups)
    assert all(not isinstance(m["message"]["theta_delta"][table], RowSparseDelta) for m in _uplinks(eb))
    for m in ups[:5]:
        rows = ea.fed.shards[m["client"]].indices
        want = np.unique(raw[rows].nonzero()[1])
        np.testing.assert_array_equal(m["message"]["theta_delta"][table].cols.numpy(), want)


@pytest.mark.parametrize("layers", ["[secure_aggregation]", "[dp]"])
def test_layers_that_sum_or_clip_updates_get_dense_ones(xc_files, tmp_path, layers):
    from secure_fed.models.sparse_rows import RowSparseDelta

    extra = (
        ["privacy.client={noise_multiplier: 0.5, clip_norm: 1.0}", "training.aggregation=uniform", "training.sampling=poisson"]
        if "dp" in layers
        else []
    )
    cfg = _cfg(xc_files, "algorithm.name=fedavg", "model.sparse_input=true", f"protocols={layers}", "training.rounds=1",
               "output.log_messages=true", *extra)  # fmt: skip
    exp = Experiment(cfg, run_dir=tmp_path)
    assert not exp.trainer.row_sparse_updates
    replies, check_up = [], exp.guard.check_up

    def spy(cid, reply, *, record=True):  # the clients' plaintext replies, before the layers' client sides
        replies.append(reply)
        return check_up(cid, reply, record=record)

    exp.guard.check_up = spy
    exp.run(progress=False)
    seen = [v for r in replies if "theta_delta" in r for v in r["theta_delta"].values()]
    assert seen and not any(isinstance(v, RowSparseDelta) for v in seen)


def test_sparse_updates_true_under_a_secure_sum_is_refused(xc_files, tmp_path):
    with pytest.raises(ConfigError, match=r"training.sparse_updates=true: protocols \['secure_aggregation'\]"):
        Experiment(_cfg(xc_files, "model.sparse_input=true", "protocols=[secure_aggregation]", "training.sparse_updates=true"),
                   run_dir=tmp_path)  # fmt: skip
