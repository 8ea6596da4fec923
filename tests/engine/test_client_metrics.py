"""The general setting's metrics (``secure_fed/engine/evaluation.py``, ``ClientEvaluation`` in callbacks.py):
GmAP scores the server's model on each client's own test rows, AmAP/WmAP each client's own model after its local
training; both are recomputed here with scikit-learn from the models themselves (the released θ; θ + the client's
logged update)."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score

from secure_fed.engine import Experiment
from tests.conftest import small_plan

GENERAL = ["model.family=linear_head", "partition.name=cmda", "partition.num_clients=5", "partition.kmodes_inits=2",
           "training.client_lr=0.1"]  # fmt: skip


def _sk_client_map(scores: np.ndarray, y: np.ndarray) -> float | None:
    """Macro AP over the labels with a positive and a negative in the rows (sklearn), percent; None if none."""
    cols = [j for j in range(y.shape[1]) if 0 < y[:, j].sum() < len(y)]
    if not cols:
        return None
    return 100 * float(np.mean([average_precision_score(y[:, j], scores[:, j]) for j in cols]))


def _scores(exp: Experiment, theta: dict[str, torch.Tensor], x: torch.Tensor) -> np.ndarray:
    """Logits of a copy of the linear-head module with parameters θ loaded by hand (not ``model_scores``)."""
    net = copy.deepcopy(exp.worker).eval()
    with torch.no_grad():
        for n, p in net.named_parameters():
            p.copy_(theta[n])
        return net(x).numpy()


def _spread(values: list[float]) -> tuple[float, float, float]:
    v = np.asarray(values)
    return float(v.mean()), float(v.std()), float(v.min())


def test_gmap_is_the_released_models_map_on_each_clients_test_rows(tmp_path):
    exp = Experiment(small_plan(*GENERAL, "algorithm.name=fedavg", "training.rounds=3", "evaluation.every=3"), run_dir=tmp_path)
    res = exp.run(progress=False)
    rows = exp.fed.client_test
    assert len(rows) == 5 and sorted(np.concatenate(rows).tolist()) == list(range(len(exp.fed.y_test.toarray())))  # a partition
    scores = _scores(exp, exp.theta, exp.fed.x_test)
    maps = [m for r in rows if len(r) and (m := _sk_client_map(scores[r], exp.fed.y_test.toarray()[r])) is not None]
    assert len(maps) >= 2
    final = res.summary["final"]
    mean, std, worst = _spread(maps)
    assert final["GmAP"] == pytest.approx(mean, abs=1e-6)
    assert final["GmAP_std"] == pytest.approx(std, abs=1e-6) and final["GmAP_worst"] == pytest.approx(worst, abs=1e-6)


@pytest.mark.parametrize("algo", ["fedavg", "flag"])
def test_amap_scores_each_clients_own_model_after_its_local_training_on_its_own_test_rows(tmp_path, algo):
    """One round: a client's own model is θ₀ + its update (read from the logged plaintext uplink)."""
    exp = Experiment(small_plan(*GENERAL, f"algorithm.name={algo}", "training.rounds=1", "output.log_messages=true"),
                     run_dir=tmp_path)  # fmt: skip
    theta0 = {n: t.clone() for n, t in exp.theta.items()}
    res = exp.run(progress=False)
    maps = []
    for m in (m for m in exp.messages if m["direction"] == "up"):
        c = exp.fed.clients[m["client"]]
        own = {n: theta0[n] + m["message"]["theta_delta"][n] for n in theta0}
        got = _sk_client_map(_scores(exp, own, c.eval_x), c.eval_y)
        if got is not None:
            maps.append(got)
    assert len(maps) >= 2
    mean, std, worst = _spread(maps)
    final = res.summary["final"]
    assert final["AmAP"] == pytest.approx(mean, abs=1e-6) and final["AmAP_std"] == pytest.approx(std, abs=1e-6)
    assert final["WmAP"] == pytest.approx(worst, abs=1e-6)
    assert abs(final["AmAP"] - final["GmAP"]) > 1e-3  # the clients' own models, not the server's


def test_amap_stays_private_under_dp(tmp_path):
    ov = [*GENERAL, "algorithm.name=fedavg", "training.rounds=2", "evaluation.every=1", 'protocols=["dp"]',
          'privacy.client={"noise_multiplier": 0.5, "clip_norm": 1.0}']  # fmt: skip
    Experiment(small_plan(*ov), run_dir=tmp_path).run(progress=False)
    released = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    private = [json.loads(x) for x in (tmp_path / "private" / "diagnostics.jsonl").read_text().splitlines()]
    assert all("GmAP" in r and "AmAP" not in r and "WmAP" not in r for r in released)
    assert all("AmAP" in r and "WmAP" in r for r in private)


def test_every_method_is_scored_on_the_same_clients_test_rows(tmp_path):
    rows = {}
    for algo in ("fedavg", "flag", "local", "centralised"):
        exp = Experiment(small_plan(*GENERAL, f"algorithm.name={algo}"), run_dir=tmp_path / algo)
        rows[algo] = exp.fed.client_test
    for algo in ("flag", "local", "centralised"):
        assert all(np.array_equal(a, b) for a, b in zip(rows["fedavg"], rows[algo], strict=True)), algo


def test_rounds_to_target_is_the_first_evaluated_round_reaching_it(tmp_path):
    ov = [*GENERAL, "algorithm.name=fedavg", "training.rounds=4", "evaluation.every=1", "evaluation.target_metric=mAP"]
    exp = Experiment(small_plan(*ov), run_dir=tmp_path / "probe")
    res = exp.run(progress=False)
    curve = [h["mAP"] for h in res.history]
    target = sorted(curve)[len(curve) // 2]  # reached, but not necessarily in round 1
    first = 1 + next(i for i, v in enumerate(curve) if v >= target)
    exp = Experiment(small_plan(*ov, f"evaluation.target_value={target}"), run_dir=tmp_path / "run")
    summary = exp.run(progress=False).summary
    assert summary["target"] == {"metric": "mAP", "value": target, "rounds_to_target": first}
    exp = Experiment(small_plan(*ov, "evaluation.target_value=100"), run_dir=tmp_path / "never")
    never = exp.run(progress=False).summary["target"]
    assert never["rounds_to_target"] is None and "note" not in never
    # a metric no round reports: null too, with a note saying so (it would read as "never reached")
    exp = Experiment(small_plan(*ov, "evaluation.target_value=1", "evaluation.target_metric=bogus"), run_dir=tmp_path / "b")
    bogus = exp.run(progress=False).summary["target"]
    assert bogus["rounds_to_target"] is None and "no evaluated round reports 'bogus'" in bogus["note"]
