"""Sparse input rows through the engine: a run on XC files with ``model.sparse_input`` true equals the same run on
dense rows (the reference), and the option's misuse is a one-line error."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from secure_fed.config import build_plan, load_config, load_plan
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


def _plan(xc_files, *over):
    return build_plan(_cfg(xc_files, *over))


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
        exp = Experiment(_plan(xc_files, f"algorithm.name={algorithm}", f"model.sparse_input={str(sparse).lower()}"),
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
    exp = Experiment(_plan(xc_files), run_dir=tmp_path)
    assert not isinstance(exp.fed.clients[0].x, SparseRows)  # 1% of EURLex: far under the 1 GiB of dense copies


def test_sparse_input_true_needs_sparse_text_on_sparse_data(tmp_path, xc_files):
    with pytest.raises(ConfigError, match=r"model.sparse_input=true .* dataset 'synthetic' has dense features"):
        Experiment(load_plan(overrides=[*SMALL, "model.sparse_input=true"]), run_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"model.sparse_input=true .* model.name=mlp"):
        Experiment(_plan(xc_files, "model.name=mlp", "model.sparse_input=true"), run_dir=tmp_path / "b")


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
        exp = Experiment(build_plan(cfg), run_dir=tmp_path / mode)
        runs[mode] = (exp.run(progress=False), exp)
    (a, ea), (b, eb) = runs["auto"], runs["false"]
    assert ea.trainer.row_sparse_updates and not eb.trainer.row_sparse_updates
    for n in ea.theta:
        assert torch.equal(ea.theta[n], eb.theta[n]), n
    assert torch.equal(ea.W, eb.W)
    assert a.summary["final"] == b.summary["final"]
    table = next(n for n, t in ea.theta.items() if t.shape[1] == ea.dataset.train.features.shape[1])
    raw = build_dataset(ea.plan, None).train.features.tocsr()
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
    exp = Experiment(build_plan(cfg), run_dir=tmp_path)
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
        Experiment(_plan(xc_files, "model.sparse_input=true", "protocols=[secure_aggregation]", "training.sparse_updates=true"),
                   run_dir=tmp_path)  # fmt: skip


def test_row_sparse_local_training_keeps_each_clients_own_table(xc_files, tmp_path):
    """``local``: every client starts from its own θ (a different tensor each), so the working table must be
    reloaded for each one; row-sparse and dense updates give the same per-client models (AmAP/WmAP, every round)."""
    runs = {}
    for mode in ("auto", "false"):
        cfg = _cfg(xc_files, "algorithm.name=local", "model.family=linear_head", "partition.name=iid",
                   "partition.num_clients=3", "model.sparse_input=true", f"training.sparse_updates={mode}",
                   "training.rounds=3", "evaluation.every=1", "training.client_fraction=1.0")  # fmt: skip
        exp = Experiment(build_plan(cfg), run_dir=tmp_path / mode)
        runs[mode] = (exp.run(progress=False), exp)
    (a, ea), (b, eb) = runs["auto"], runs["false"]
    assert ea.trainer.row_sparse_updates
    rows = [(r["AmAP"], r["WmAP"]) for r in a.history]
    assert rows == [(r["AmAP"], r["WmAP"]) for r in b.history]
    for c_a, c_b in zip(ea.fed.clients, eb.fed.clients, strict=True):
        for n, t in c_a.state["theta"].items():
            assert torch.equal(t, c_b.state["theta"][n]), n


def test_a_dense_run_refuses_a_row_sparse_update(xc_files, tmp_path):
    """Where updates must be dense (here secure aggregation), the guard refuses touched columns from a client."""
    from secure_fed.errors import PrivacyViolation
    from secure_fed.models.sparse_rows import RowSparseDelta

    exp = Experiment(_plan(xc_files, "model.sparse_input=true", "protocols=[secure_aggregation]"), run_dir=tmp_path)
    table = next(n for n, t in exp.theta.items() if t.shape[1] == exp.dataset.train.features.shape[1])
    delta = {n: torch.zeros_like(t) for n, t in exp.theta.items()}
    delta[table] = RowSparseDelta(torch.tensor([0]), torch.zeros(1, exp.theta[table].shape[0]), tuple(exp.theta[table].shape))
    with pytest.raises(PrivacyViolation, match="theta_delta"):
        exp.guard.check_up(0, {"theta_delta": delta, "num_examples": 1, "loss": 0.0})
    delta[table] = torch.zeros_like(exp.theta[table])
    exp.guard.check_up(0, {"theta_delta": delta, "num_examples": 1, "loss": 0.0})  # the dense one passes


def test_a_row_sparse_update_packs_like_its_dense_update():
    """The flat vector a secure sum adds (UpdateLayout.flatten) is the same for an update and its dense form."""
    from secure_fed.engine.aggregation import UpdateLayout
    from secure_fed.models.sparse_rows import RowSparseDelta

    theta = {"w": torch.zeros(3, 5), "b": torch.zeros(3)}
    layout = UpdateLayout.for_model(theta, 0, 0)
    d = RowSparseDelta(torch.tensor([1, 4]), torch.arange(6.0).reshape(2, 3), (3, 5))
    dense = torch.zeros(3, 5)
    dense[:, 1], dense[:, 4] = torch.tensor([0.0, 1.0, 2.0]), torch.tensor([3.0, 4.0, 5.0])
    base = {"num_examples": 2, "loss": 0.5}
    a = layout.flatten({"theta_delta": {"w": d, "b": torch.ones(3)}, **base}, "num_examples")
    b = layout.flatten({"theta_delta": {"w": dense, "b": torch.ones(3)}, **base}, "num_examples")
    np.testing.assert_array_equal(a, b)
