"""``algorithm.name: label_prior``, the "label prior only" baseline: one module (secure_fed/algorithms/label_prior.py)
and its entry point (found in pyproject.toml by ``secure_fed.plugins.source_entry_points``, no install needed).

Against independent computations: non-private, its prior is the training split's label counts and its P@k is the
precision of the k most frequent training labels on the test split, both computed here with numpy from the raw data;
every instance gets the same scores and the rounds change nothing. Under ``dp`` with ``privacy.label_prior`` the prior
is the dp layer's one noisy release (never the exact counts) and the run's ε is that release's."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from secure_fed.engine import Experiment
from secure_fed.errors import ConfigError
from tests.conftest import small_config, small_plan


def precision_at(freq: np.ndarray, y_test, k: int) -> float:
    """P@k (percent) of predicting the k most frequent training labels for every test instance."""
    top = np.argsort(-freq, kind="stable")[:k]
    y = sp.csr_matrix(y_test)
    return 100.0 * float(np.asarray(y[:, top].sum(axis=1)).mean()) / k


def _run(tmp_path, *ov):
    e = Experiment(small_plan("algorithm.name=label_prior", *ov), run_dir=tmp_path)
    res = e.run(progress=False)
    return e, res


def _check_prior_run(e, res, freq: np.ndarray) -> None:
    """Scores: the same for every test instance, ∝ ``freq`` (its largest |value| 1); P@1, P@3 as numpy's."""
    scores = e.model_scores(e.theta, e.fed.x_test)
    np.testing.assert_allclose(scores, np.broadcast_to(scores[0], scores.shape), rtol=0, atol=1e-6)
    np.testing.assert_allclose(scores[0], freq / np.abs(freq).max(), rtol=0, atol=1e-5)
    srt = np.sort(freq)[::-1]
    assert srt[2] > srt[3] and srt[0] > srt[1]  # no tie at the top: the ranking, hence P@k, is determined
    for k in (1, 3):
        assert res.summary["final"][f"P@{k}"] == pytest.approx(precision_at(freq, e.fed.y_test, k), abs=1e-9)


@pytest.mark.parametrize("setting", ["positive_only", "general"])
def test_non_private_prior_is_the_training_label_counts(tmp_path, setting):
    ov = ["training.rounds=2"]
    if setting == "general":  # full label vectors on each client, scores from a linear head's bias
        ov += ["partition.name=iid", "partition.num_clients=4", "model.family=linear_head"]
    e, res = _run(tmp_path, *ov)
    freq = np.asarray(e.dataset.train.labels.sum(axis=0), dtype=float).ravel()
    np.testing.assert_array_equal(e.algorithm.counts.numpy(), freq)
    _check_prior_run(e, res, freq)


@pytest.mark.data
def test_bibtex_p_at_1_is_the_most_frequent_labels_precision(tmp_path):
    e, res = _run(tmp_path, "dataset.name=bibtex", "training.rounds=1", "evaluation.every=1")
    y_train = e.dataset.train.labels
    freq = np.asarray(y_train.sum(axis=0), dtype=float).ravel()
    assert y_train.shape[1] == 159
    _check_prior_run(e, res, freq)


def test_under_dp_the_prior_is_the_layers_one_noisy_release(tmp_path):
    """The algorithm reads the dp layer's released histogram (the exact counts never reach it); the run's ε is the
    release's one Gaussian step (every other channel is data-free: the clients do not train)."""
    from protocols.dp.accountant import epsilon_of

    sigma, m = 1.0, 3
    e, res = _run(tmp_path, 'protocols=["dp"]', "training.rounds=2",
                  f'privacy.label_prior={{"noise_multiplier": {sigma}, "max_labels_per_instance": {m}}}')  # fmt: skip
    layer = e.stack.by_name()["dp"]
    released = layer.released["label_counts"]
    np.testing.assert_array_equal(e.algorithm.counts.numpy(), released.numpy())
    exact = np.asarray(e.dataset.train.labels.sum(axis=0), dtype=float).ravel()
    assert np.abs(e.algorithm.counts.numpy() - exact).max() > 0.1  # noised (std σ√m ≈ 1.7 a count)
    _check_prior_run_scores(e, released.numpy())
    priv = res.summary["privacy"]
    want = epsilon_of([(sigma, 1.0, 1)], 1e-5, "rdp")
    assert priv["epsilon"] == pytest.approx(want, rel=1e-9)
    assert priv["units"]["instance"]["adversaries"]["observer"]["why"].endswith("composes label_prior")


def _check_prior_run_scores(e, freq: np.ndarray) -> None:
    scores = e.model_scores(e.theta, e.fed.x_test)
    np.testing.assert_allclose(scores, np.broadcast_to(freq / np.abs(freq).max(), scores.shape), rtol=0, atol=1e-5)


def test_without_the_mechanism_its_statistic_is_an_unnoised_step():
    """Its declared statistic is a channel of its own: with no plugin that releases it, validate's plan names it
    un-noised (ε ∞); with privacy.label_prior it is covered."""
    from protocols.dp.run_graph import planned_unnoised_steps
    from secure_fed.algorithms.registry import algorithm_specs

    caps = algorithm_specs()["label_prior"].capabilities
    cfg = small_config('protocols=["dp"]', "algorithm.name=fedaws", 'privacy.client={"noise_multiplier": 1.0}')
    steps = planned_unnoised_steps(cfg.privacy, capabilities=caps)
    assert [s["step"] for s in steps] == ["statistic_label_counts"]
    cfg = small_config('protocols=["dp"]', "algorithm.name=label_prior",
                       'privacy.label_prior={"noise_multiplier": 1.0, "max_labels_per_instance": 2}')  # fmt: skip
    assert planned_unnoised_steps(cfg.privacy, capabilities=caps) == []


def test_client_level_noise_is_refused_its_clients_do_not_train():
    with pytest.raises(ConfigError, match="privacy.client noises the clients' training updates, which label_prior"):
        small_config('protocols=["dp"]', "algorithm.name=label_prior", 'privacy.client={"noise_multiplier": 1.0}')


def test_its_spec_and_a_config_naming_it_import_no_torch():
    import subprocess
    import sys

    code = ("import sys\nfrom secure_fed.config import load_config\n"
            "load_config(None, ['algorithm.name=label_prior', 'protocols=[\"dp\"]', "
            "'privacy.label_prior={\"noise_multiplier\": 1, \"max_labels_per_instance\": 2}'])\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-500:]
