"""Metrics from label blocks (secure_fed.metrics.blocks) equal the whole-matrix metrics, ties included, and the
engine picks them for a test split too large for one matrix."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.metrics import average_precision_score

from secure_fed.config import load_plan
from secure_fed.metrics import evaluate_scores
from secure_fed.metrics.blocks import column_average_precision, evaluate_label_blocks, topk_order


def _case(seed: int, ties: bool):
    rng = np.random.default_rng(seed)
    n, C = int(rng.integers(5, 120)), int(rng.integers(3, 200))
    s = rng.normal(size=(n, C))
    if ties:
        s = np.round(s, 1)  # many equal scores: the tie conventions must agree
    y = (rng.random((n, C)) < 0.06).astype(np.int8)
    y[0, 0] = 1
    return s, y


@pytest.mark.parametrize("seed", range(8))
def test_blocks_equal_the_whole_matrix(seed):
    s, y = _case(seed, ties=seed % 2 == 1)
    full = evaluate_scores(s, y, ks=(1, 3, 5), threshold=0.2)
    for block in (1, 7, y.shape[1]):
        calls: list[slice] = []

        def scores(sl, calls=calls):
            calls.append(sl)
            return s[:, sl]

        got = evaluate_label_blocks(scores, sp.csr_matrix(y), ks=(1, 3, 5), threshold=0.2, block=block)
        assert max(sl.stop - sl.start for sl in calls) <= block  # never more than a block at a time
        assert got.keys() == full.keys()
        for k, v in full.items():
            assert got[k] == pytest.approx(v, rel=1e-12, abs=1e-12, nan_ok=True), (block, k)


def test_precision_at_k_from_blocks_matches_an_independent_ranking():
    """P@k against a ranking made here with np.lexsort (score descending, then label id), not the module's own."""
    s, y = _case(5, ties=True)
    order = np.lexsort((np.broadcast_to(np.arange(s.shape[1]), s.shape), -s), axis=1)
    for k in (1, 3):
        ref = 100 * np.take_along_axis(y, order[:, :k], axis=1).sum(axis=1).mean() / k
        got = evaluate_label_blocks(lambda sl: s[:, sl], y, ks=(k,), block=4)[f"P@{k}"]
        assert got == pytest.approx(ref, rel=1e-12)


def test_column_ap_matches_scikit_learn_with_ties():
    rng = np.random.default_rng(3)
    s = np.round(rng.normal(size=(300, 20)), 1)
    y = (rng.random((300, 20)) < 0.2).astype(int)
    ours = column_average_precision(s, y)
    ref = [average_precision_score(y[:, j], s[:, j]) for j in range(20)]
    np.testing.assert_allclose(ours, ref, rtol=1e-12)


def test_micro_ap_matches_scikit_learn():
    s, y = _case(11, ties=True)
    got = evaluate_label_blocks(lambda sl: s[:, sl], y, block=5)
    assert got["O-AP"] == pytest.approx(100 * average_precision_score(y.ravel(), s.ravel()), rel=1e-12)


def test_topk_breaks_ties_by_lower_label_id():
    s = np.array([[0.5, 0.9, 0.9, 0.1, 0.9]])
    ids = np.arange(5)[None, :]
    assert topk_order(s, ids, 2).tolist() == [[1, 2]]
    assert topk_order(s, ids, 4).tolist() == [[1, 2, 4, 0]]
    # ids need not be positions: the merge of two blocks ranks by score, then by id
    assert np.take_along_axis(ids[:, ::-1], topk_order(s, ids[:, ::-1], 2), axis=1).tolist() == [[0, 2]]


def test_engine_evaluates_in_label_blocks_when_the_matrix_is_large(tmp_path, monkeypatch):
    """With the block budget forced small, a run's metrics come from label blocks and equal the whole-matrix ones."""
    from secure_fed.engine import Experiment
    from secure_fed.metrics import blocks
    from tests.conftest import SMALL

    exp = Experiment(load_plan(overrides=[*SMALL, "training.rounds=2"]), run_dir=tmp_path)
    exp.run(progress=False)
    whole = exp.evaluate()
    used = []
    real = blocks.evaluate_label_blocks
    monkeypatch.setattr(blocks, "BLOCK_ELEMENTS", 64)
    monkeypatch.setattr(blocks, "evaluate_label_blocks", lambda *a, **k: used.append(1) or real(*a, block=3, **k))
    blocked = exp.evaluate()
    assert used, "the blocked path was not taken"
    for k, v in whole.items():
        assert blocked[k] == pytest.approx(v, rel=1e-6, abs=1e-6), k


def test_centred_scores_from_label_blocks_equal_the_centred_whole_matrix(tmp_path, monkeypatch):
    """``evaluation.center_scores``: the engine's metrics are those of the model's raw scores with each row's mean
    subtracted (computed here), on the whole matrix and from label blocks (whose first pass sums each row)."""
    from secure_fed.engine import Experiment
    from secure_fed.engine.evaluation import model_scores
    from tests.conftest import SMALL, whole_and_blocked_metrics

    plan = load_plan(overrides=[*SMALL, "training.rounds=2", "evaluation.center_scores=true", "evaluation.threshold=0.2"])
    exp = Experiment(plan, run_dir=tmp_path)
    exp.run(progress=False)
    raw = model_scores(exp.model, exp.model.theta, exp.fed.x_test).astype(np.float64)
    y = exp.fed.y_test.toarray()
    ks, th = tuple(exp.plan.evaluation.ks), exp.plan.evaluation.threshold
    expected = evaluate_scores(raw - raw.mean(axis=1, keepdims=True), y, ks=ks, threshold=th)
    uncentred = evaluate_scores(raw, y, ks=ks, threshold=th)
    whole, blocked = whole_and_blocked_metrics(exp, monkeypatch)
    for k in ("P@1", "P@3", "nDCG@3", "mAP", "O-AP"):
        assert whole[k] == pytest.approx(expected[k], abs=1e-4), k
        assert blocked[k] == pytest.approx(expected[k], abs=1e-4), k
    for k in ("C-P", "C-R", "C-F1", "O-P", "O-R", "O-F1"):  # the threshold metrics read the raw scores
        assert whole[k] == pytest.approx(uncentred[k], abs=1e-4), k
        assert blocked[k] == pytest.approx(uncentred[k], abs=1e-4), k
    assert whole["P@1"] == pytest.approx(uncentred["P@1"], abs=1e-4)
    assert abs(whole["mAP"] - uncentred["mAP"]) > 1e-3  # centring is not a no-op on this model
