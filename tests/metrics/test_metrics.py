import numpy as np
import pytest
from sklearn.metrics import average_precision_score, ndcg_score, precision_recall_fscore_support

from secure_fed.metrics import (
    center_rows,
    evaluate_scores,
    macro_average_precision,
    micro_average_precision,
    ndcg_at_k,
    precision_at_k,
    threshold_metrics,
)


@pytest.fixture
def sy():
    rng = np.random.default_rng(0)
    scores = rng.uniform(-1, 1, size=(200, 15))  # continuous: no ties
    y = (rng.random((200, 15)) < 0.2).astype(int)
    y[np.arange(200), rng.integers(0, 15, 200)] = 1  # every instance has a label
    return scores, y


def test_precision_at_k_by_hand():
    s = np.array([[0.9, 0.1, 0.5, 0.3], [0.2, 0.8, 0.7, 0.1]])
    y = np.array([[1, 0, 0, 1], [0, 0, 1, 0]])
    assert precision_at_k(s, y, 1) == pytest.approx(0.5)
    assert precision_at_k(s, y, 3) == pytest.approx((2 / 3 + 1 / 3) / 2)


def test_ndcg_matches_sklearn(sy):
    s, y = sy
    for k in (1, 3, 5):
        assert ndcg_at_k(s, y, k) == pytest.approx(ndcg_score(y, s, k=k))


def test_average_precisions_match_sklearn(sy):
    s, y = sy
    assert macro_average_precision(s, y) == pytest.approx(average_precision_score(y, s, average="macro"))
    assert micro_average_precision(s, y) == pytest.approx(average_precision_score(y, s, average="micro"))


def test_macro_ap_with_ties_matches_sklearn(sy):
    s, y = sy
    s = np.round(s, 1)
    assert macro_average_precision(s, y) == pytest.approx(average_precision_score(y, s, average="macro"))


def test_threshold_metrics_match_sklearn(sy):
    s, y = sy
    pred = (s >= 0.5).astype(int)
    m = threshold_metrics(s, y, 0.5)
    cp, cr, _, _ = precision_recall_fscore_support(y, pred, average="macro", zero_division=0)
    op, orr, of1, _ = precision_recall_fscore_support(y, pred, average="micro", zero_division=0)
    assert m["C-P"] == pytest.approx(cp) and m["C-R"] == pytest.approx(cr)
    assert m["C-F1"] == pytest.approx(2 * cp * cr / (cp + cr))  # from macro P and R (FedLGT appendix)
    assert (m["O-P"], m["O-R"], m["O-F1"]) == pytest.approx((op, orr, of1))


def test_evaluate_scores_reports_percent_names(sy):
    s, y = sy
    out = evaluate_scores(s, y)
    for key in ("P@1", "P@3", "P@5", "nDCG@3", "mAP", "O-AP", "C-F1", "O-F1"):
        assert key in out
    assert out["P@1"] == pytest.approx(100 * precision_at_k(s, y, 1))
    perfect = evaluate_scores(y.astype(float), y)
    assert perfect["P@1"] == 100.0 and perfect["mAP"] == pytest.approx(100.0)


def test_centred_rows_keep_every_per_instance_ranking_and_rank_each_labels_instances_by_their_margin(sy):
    """``evaluation.center_scores``: P@k and nDCG@k are those of the raw scores; mAP is scikit-learn's macro AP of
    the scores minus each row's mean (computed here in a loop), and differs from the raw scores' mAP when the rows
    share a per-instance offset."""
    scores, y = sy
    rng = np.random.default_rng(1)
    offset = rng.normal(scale=3.0, size=(len(scores), 1))  # what every label of a row shares
    s = y + scores + offset  # scores that carry the labels, under a per-instance offset
    centred = center_rows(s)
    by_hand = np.array([[v - sum(row) / len(row) for v in row] for row in s.tolist()])
    np.testing.assert_allclose(centred, by_hand, rtol=0, atol=1e-12)
    raw, cen = evaluate_scores(s, y, ks=(1, 3)), evaluate_scores(centred, y, ks=(1, 3))
    for k in ("P@1", "P@3", "nDCG@1", "nDCG@3"):
        assert cen[k] == pytest.approx(raw[k], abs=1e-9), k
    expected = np.mean([average_precision_score(y[:, j], by_hand[:, j]) for j in range(y.shape[1])])
    assert cen["mAP"] == pytest.approx(100 * expected, abs=1e-9)
    assert cen["mAP"] > raw["mAP"] + 5  # the shared offset scrambled the raw per-label rankings
