"""The vectorised executor (``training.executor: vectorized``) inside the engine: same rounds as the sequential
reference under every algorithm and protocol layer, honest about what it did not batch, clean on errors."""

from __future__ import annotations

import json

import pytest
import torch

from secure_fed.algorithms.batched_sgd import relative_error
from secure_fed.config import build_plan
from secure_fed.engine import Experiment
from tests.conftest import small_config, small_plan

#: plain server averaging: FedAdam's first step is sign-like and would magnify rounding into lr-sized differences
PLAIN = ["training.server_optimizer={name: fedavg, lr: 1.0}", "training.rounds=2"]


def _after_rounds(tmp_path, name, *overrides, rounds=2, monkeypatch=None):
    if monkeypatch is not None:  # the same "OS randomness" for both runs (keys, salts, masks), so rounds compare
        import hashlib
        import os

        counter = iter(range(10**9))
        monkeypatch.setattr(os, "urandom", lambda n: hashlib.shake_256(str(next(counter)).encode()).digest(n))
    exp = Experiment(small_plan(*PLAIN, *overrides), run_dir=tmp_path / name)
    exp.setup()
    for _ in range(rounds):
        stats = exp.train_round()
    return exp, stats


def _theta_and_W(exp):
    out = {k: v.clone() for k, v in exp.theta.items()}
    if exp.W is not None:  # in label order (keyed hashing stores label l in row label_perm[l], under a fresh key)
        out["W"] = (exp.W[torch.as_tensor(exp.label_perm)] if exp.label_perm is not None else exp.W).clone()
    return out


CASES = [
    ("fedalc", []),
    ("fedaws", []),
    ("fedavg", []),
    ("fedalc", ['protocols=["keyed_hashing"]']),
    ("fedaws", ['protocols=["secure_aggregation"]']),
    (
        "fedalc",
        [
            'protocols=["dp"]',
            "privacy.noise_seed=7",
            "privacy.instance={noise_multiplier: 1.0}",
            "algorithm.normalize_gamma=false",
        ],
    ),
    ("fedavg", ['protocols=["dp"]', "privacy.noise_seed=7", "privacy.client={noise_multiplier: 1.0, clip_norm: 0.1}"]),
    (
        "fedalc",
        [
            'protocols=["keyed_hashing", "dp", "secure_aggregation"]',
            "privacy.noise_seed=7",
            "privacy.client={noise_multiplier: 0.5, noise: clients}",
        ],
    ),
    ("fedalc", ['protocols=["ckks"]']),
    ("fedavg", ["partition.name=iid", "partition.num_clients=5", "model.family=linear_head", "algorithm.loss=asl"]),
]


@pytest.mark.parametrize("algo,extra", CASES, ids=[f"{a}-{'-'.join(e) or 'plain'}" for a, e in CASES])
def test_vectorized_rounds_equal_the_sequential_rounds(tmp_path, monkeypatch, algo, extra):
    seq, s_stats = _after_rounds(tmp_path, "seq", f"algorithm.name={algo}", *extra, monkeypatch=monkeypatch)
    vec, v_stats = _after_rounds(
        tmp_path, "vec", f"algorithm.name={algo}", *extra, "training.executor=vectorized", monkeypatch=monkeypatch
    )
    assert vec.executor.batched > 0 and not vec.executor.unbatched
    assert relative_error(_theta_and_W(vec), _theta_and_W(seq)) < 1e-5
    assert v_stats["train_loss"] == pytest.approx(s_stats["train_loss"], rel=1e-4)
    assert v_stats["clients"] == s_stats["clients"]


def test_chunks_give_the_same_rounds(tmp_path):
    whole, _ = _after_rounds(tmp_path, "whole", "training.executor=vectorized")
    chunked, _ = _after_rounds(tmp_path, "chunked", "training.executor=vectorized", "training.chunk_clients=3")
    assert relative_error(_theta_and_W(chunked), _theta_and_W(whole)) < 1e-6


def test_what_is_not_batched_runs_on_the_reference_trainer_and_is_reported(tmp_path, caplog):
    dp_local = ["algorithm.name=fedaws", 'protocols=["dp"]', "privacy.noise_seed=7",
                "privacy.local={clip_norm: 1.0, target_epsilon: 8, batch_sample_rate: 0.5, "
                "max_labels_per_instance: 8}"]  # fmt: skip
    seq, _ = _after_rounds(tmp_path, "seq", *dp_local)
    with caplog.at_level("WARNING"):
        vec, _ = _after_rounds(tmp_path, "vec", *dp_local, "training.executor=vectorized")
    assert vec.executor.batched == 0
    assert vec.executor.unbatched == {"DP-SGD in client training": 2 * len(vec.fed.clients)}
    assert sum("DP-SGD in client training" in r.getMessage() for r in caplog.records) == 1  # once per reason
    for k, t in _theta_and_W(seq).items():  # the same reference code on the same draws: identical
        assert torch.equal(_theta_and_W(vec)[k], t)


def test_the_summary_says_how_the_clients_ran(tmp_path):
    cfg = small_config("training.rounds=1", "training.executor=vectorized")
    Experiment(build_plan(cfg), run_dir=tmp_path / "run").run(progress=False)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["executor"] == "vectorized"  # released: the name only
    private = json.loads((tmp_path / "run" / "private" / "summary.json").read_text())
    n = summary["num_clients"]  # counts of updates stay private (cohort sizes can be secret)
    assert private["executor"] == {"name": "vectorized", "updates_batched": n, "updates_one_at_a_time": {}}


def test_an_error_in_one_client_stops_the_round_and_leaves_no_client_paused(tmp_path):
    import gc

    import greenlet

    exp = Experiment(small_plan("training.executor=vectorized"), run_dir=tmp_path / "run")
    exp.setup()
    calls = []
    original = exp.algorithm.client_update

    def failing(payload, data, train):
        calls.append(data.client_id)
        if len(calls) == 3:
            raise RuntimeError("client 3 broke")
        return original(payload, data, train)

    exp.algorithm.client_update = failing
    with pytest.raises(RuntimeError, match="client 3 broke"):
        exp.train_round()
    gc.collect()
    paused = [g for g in gc.get_objects() if isinstance(g, greenlet.greenlet) and g and g is not greenlet.getcurrent()]
    assert paused == []
    assert exp.trainer.batching is exp.executor.batching and exp.executor.batching.clients == {}  # no client left routed


def test_an_unknown_executor_is_one_clear_config_error(tmp_path):
    from secure_fed.errors import ConfigError

    with pytest.raises(ConfigError, match="training.executor"):
        small_config("training.executor=parallel")
