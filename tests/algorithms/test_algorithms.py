import torch

from secure_fed.engine import Experiment
from secure_fed.models import mean_pairwise_cosine
from tests.conftest import small_plan


def _run(tmp_path, *ov):
    exp = Experiment(small_plan(*ov), run_dir=tmp_path)
    W0 = exp.W.clone()
    res = exp.run(progress=False)
    return exp, W0, res


def test_fixed_variants_never_move_W_during_training(tmp_path):
    exp, W0, _ = _run(tmp_path / "a", "algorithm.name=fedavg_fixed")
    assert torch.equal(exp.W, W0)
    exp2 = Experiment(small_plan("algorithm.name=fedalc_fixed", "algorithm.fixed_steps=20"), run_dir=tmp_path / "b")
    exp2.setup()
    W_after_setup = exp2.W.clone()
    exp2.run(progress=False)
    assert torch.equal(exp2.W, W_after_setup)
    assert exp2.setup_facts["reg_fc_last"] < exp2.setup_facts["reg_fc_first"]


def test_fedavg_rows_move_only_for_participating_clients(tmp_path):
    exp = Experiment(small_plan("algorithm.name=fedavg", "training.client_fraction=0.25", "training.rounds=1"), run_dir=tmp_path)
    W0 = exp.W.clone()
    exp.setup()
    exp.train_round()
    moved = (exp.W - W0).norm(dim=1) > 0
    assert int(moved.sum()) == 2  # ceil(0.25 * 8) clients, one row each


def test_fedaws_keeps_rows_more_spread_than_fedavg(tmp_path):
    ov = ["training.rounds=15", "training.client_lr=0.2", "evaluation.every=15"]
    fedavg, _, _ = _run(tmp_path / "a", "algorithm.name=fedavg", *ov)
    fedaws, _, _ = _run(tmp_path / "b", "algorithm.name=fedaws", "algorithm.lam=100", "algorithm.reg_lr=1e-3", *ov)
    assert mean_pairwise_cosine(fedaws.W) < mean_pairwise_cosine(fedavg.W) - 0.05


def test_fedalc_learns_on_correlated_synthetic_data(tmp_path):
    ov = [
        "training.rounds=20",
        "evaluation.every=20",
        "training.client_lr=0.05",
        "training.server_optimizer.lr=3e-3",
        "algorithm.reg_lr=1e-3",
    ]
    _, _, res = _run(tmp_path, "algorithm.name=fedalc", *ov)
    # 8 labels: chance P@1 is about 1/8 * cardinality; learning must be far above it
    assert res.summary["final"]["P@1"] > 60


def test_oracle_is_one_client_with_all_labels(tmp_path):
    exp = Experiment(
        small_plan(
            "algorithm.name=oracle",
            "training.client_optimizer=adam",
            "training.client_lr=1e-2",
            "training.server_optimizer.name=fedavg",
            "training.server_optimizer.lr=1.0",
            "training.rounds=6",
        ),
        run_dir=tmp_path,
    )
    assert len(exp.fed.clients) == 1
    assert exp.fed.clients[0].known_labels.tolist() == list(range(8))
    res = exp.run(progress=False)
    assert res.summary["final"]["P@1"] > 60
