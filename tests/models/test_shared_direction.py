"""``evaluation.remove_shared_direction``: the rows without their top singular direction, against numpy's SVD, and
the engine's metrics against scores computed here from the projected rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from secure_fed.config import load_plan
from secure_fed.metrics import evaluate_scores
from secure_fed.models.shared_direction import remove_shared_direction, shared_direction


def _rows_with_shared_direction(seed: int = 0, c: int = 12, d: int = 20, strength: float = 3.0):
    rng = np.random.default_rng(seed)
    u = rng.standard_normal(d)
    u /= np.linalg.norm(u)
    weights = strength * rng.uniform(0.5, 1.5, size=(c, 1))  # each row holds its own amount of the shared direction
    return rng.standard_normal((c, d)) + weights * u[None, :], u


def test_the_removed_direction_is_numpys_top_right_singular_vector():
    rows, _ = _rows_with_shared_direction()
    _, _, vt = np.linalg.svd(rows, full_matrices=False)
    v = vt[0]
    want = rows - np.outer(rows @ v, v)  # independent computation, float64
    got = remove_shared_direction(torch.from_numpy(rows)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    assert abs(abs(float(shared_direction(torch.from_numpy(rows)) @ torch.from_numpy(v))) - 1.0) < 1e-10
    np.testing.assert_allclose(got @ v, 0.0, atol=1e-10)  # nothing of it is left in any row


def test_rows_lose_the_direction_they_share_and_keep_the_rest():
    """Rows built as noise plus a shared direction u: before, every row leans towards u; after, none does, and the
    part of each row orthogonal to u is what it was (to within the SVD's estimate of u)."""
    rows, u = _rows_with_shared_direction(seed=1, c=200, d=16)
    before = np.abs(rows @ u) / np.linalg.norm(rows, axis=1)
    after_rows = remove_shared_direction(torch.from_numpy(rows).float()).double().numpy()
    after = np.abs(after_rows @ u) / np.linalg.norm(after_rows, axis=1)
    assert before.mean() > 0.5 and after.mean() < 0.05, (before.mean(), after.mean())
    keep = rows - np.outer(rows @ u, u)
    cos = np.sum(keep * after_rows, axis=1) / np.linalg.norm(keep, axis=1) / np.linalg.norm(after_rows, axis=1)
    assert cos.min() > 0.95, cos.min()


def test_dtype_and_shape_are_kept_and_bad_input_is_refused():
    rows = torch.randn(5, 3, dtype=torch.float32)
    out = remove_shared_direction(rows)
    assert out.dtype == torch.float32 and out.shape == (5, 3)
    with pytest.raises(ValueError, match="C, d"):
        remove_shared_direction(torch.zeros(0, 3))


def test_engine_metrics_score_with_the_projected_rows(tmp_path, monkeypatch):
    """Every metric (ranking and threshold, whole matrix and label blocks) is that of the cosine scores of the
    test embeddings against the rows minus their shared direction (computed here with numpy), centred per row for
    the ranking metrics; and they differ from the metrics of the rows as released."""
    from secure_fed.engine import Experiment
    from tests.conftest import SMALL, whole_and_blocked_metrics

    plan = load_plan(
        overrides=[*SMALL, "training.rounds=2", "evaluation.center_scores=true", "evaluation.remove_shared_direction=true",
                   "evaluation.threshold=0.1"]
    )  # fmt: skip
    exp = Experiment(plan, run_dir=tmp_path)
    exp.run(progress=False)
    model = exp.model
    with torch.no_grad():
        model.load_theta(model.theta)
        h = model.family.forward(model.encoder, exp.fed.x_test).double().numpy()
    W = model.W.double().numpy()
    _, _, vt = np.linalg.svd(W, full_matrices=False)
    Wp = W - np.outer(W @ vt[0], vt[0])

    def cosine(rows):
        return (h / np.linalg.norm(h, axis=1, keepdims=True)) @ (rows / np.linalg.norm(rows, axis=1, keepdims=True)).T

    y = exp.fed.y_test.toarray()
    ks, th = tuple(plan.evaluation.ks), plan.evaluation.threshold
    raw = cosine(Wp)
    expected = evaluate_scores(raw - raw.mean(axis=1, keepdims=True), y, ks=ks, threshold=th, threshold_scores=raw)
    released = cosine(W)
    unprojected = evaluate_scores(released - released.mean(axis=1, keepdims=True), y, ks=ks, threshold=th)
    whole, blocked = whole_and_blocked_metrics(exp, monkeypatch)
    for k in ("P@1", "P@3", "nDCG@3", "mAP", "O-AP", "C-F1", "O-F1"):
        assert whole[k] == pytest.approx(expected[k], abs=1e-4), k
        assert blocked[k] == pytest.approx(expected[k], abs=1e-4), k
    assert any(abs(expected[k] - unprojected[k]) > 1e-3 for k in ("P@1", "P@3", "mAP")), "the projection changed nothing"
