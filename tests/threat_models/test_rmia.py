"""RMIA (Zarifzadeh et al. 2024): the score against a pairwise count on hand-built likelihoods, the online and
offline Pr(x), a planted signal that RMIA finds beyond LOSS, chance without one, and the audit's real pipeline."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import expit
from sklearn.metrics import roc_auc_score

from secure_fed.config import load_plan
from secure_fed.plugin_api.attacks import build_experiment
from tests.conftest import SMALL
from tests.threat_models.test_membership_inference import _synthetic
from threat_models.attacks.membership_inference import MembershipInference, roc_summary
from threat_models.attacks.rmia_scores import pr_offline, pr_online, rmia_offline, rmia_online, rmia_score
from threat_models.attacks_section import attacks_of


def small_plan(*overrides: str):
    """The small test run's plan (``tests.conftest.SMALL``) with ``overrides``."""
    return load_plan(overrides=[*SMALL, *overrides])


def test_score_is_the_pairwise_fraction_on_hand_built_likelihoods():
    # targets x: Pr(x|θ) and Pr(x); population z likewise; ratio_x = 2, 1, 0.25; ratio_z = 0.5, 1, 4
    p_x, pr_x = np.array([0.8, 0.3, 0.05]), np.array([0.4, 0.3, 0.2])
    p_z, pr_z = np.array([0.1, 0.6, 0.8]), np.array([0.2, 0.6, 0.2])
    # x0 (2): ≥ 0.5 and ≥ 1 → 2/3; x1 (1): ≥ 0.5, = 1 → 2/3; x2 (0.25): none → 0
    np.testing.assert_allclose(rmia_score(p_x, pr_x, p_z, pr_z), [2 / 3, 2 / 3, 0.0])
    # γ = 2: LR(x, z) = ratio_x / ratio_z ≥ 2 → x0 against 0.5 and 1; x1 against 0.5; x2 none
    np.testing.assert_allclose(rmia_score(p_x, pr_x, p_z, pr_z, gamma=2.0), [2 / 3, 1 / 3, 0.0])


def test_score_equals_a_direct_pairwise_loop():
    rng = np.random.default_rng(0)
    p_x, pr_x, p_z, pr_z = (rng.uniform(0.01, 1.0, k) for k in (50, 50, 70, 70))
    for gamma in (0.5, 1.0, 3.0):
        want = np.array([np.mean([(p_x[i] / pr_x[i]) / (p_z[j] / pr_z[j]) >= gamma for j in range(70)]) for i in range(50)])
        np.testing.assert_array_equal(rmia_score(p_x, pr_x, p_z, pr_z, gamma=gamma), want)


def test_online_and_offline_pr_x_follow_the_paper():
    P = np.array([[0.9, 0.2], [0.5, 0.4], [0.1, 0.6]])  # K = 3 references, n = 2 targets
    inside = np.array([[True, False], [False, False], [False, True]])
    np.testing.assert_allclose(pr_online(P, inside), [0.5, 0.4])
    # OUT means: target 0 over refs 1, 2 = 0.3; target 1 over refs 0, 1 = 0.3; a = 0.3 → ½(1.3·0.3 + 0.7)
    pr, missing = pr_offline(P, inside, a=0.3)
    np.testing.assert_allclose(pr, [0.5 * (1.3 * 0.3 + 0.7)] * 2)
    assert missing == 0
    np.testing.assert_allclose(pr_offline(P, inside, a=1.0)[0], [0.3, 0.3])  # a = 1: Pr_IN = Pr_OUT
    # a target that every reference trained on has no OUT mean: the mean over every OUT pair (0.2, 0.4, 0.1, 0.5 here)
    inside[:, 1] = True
    pr, missing = pr_offline(P, inside, a=0.0)
    assert missing == 1 and pr[1] == pytest.approx(0.5 * (0.3 + 1.0))
    with pytest.raises(ValueError, match=r"\(K, n\)"):
        pr_online(P[:, :1], inside)
    with pytest.raises(ValueError, match="slope"):
        pr_offline(P, inside, a=1.5)


def test_attack_scores_use_the_reference_likelihoods():
    rng = np.random.default_rng(1)
    K, n = 5, 40
    phi, S = rng.normal(0, 2, n), rng.normal(0, 2, (K, n))
    inside = rng.random((K, n)) < 0.5
    inside[0] = False  # every target has an OUT reference (the fallback is tested above)
    z = np.arange(0, n, 2)
    p, P = expit(phi), expit(S)
    on = (p / P.mean(0))[:, None] / (p[z] / P[:, z].mean(0))[None, :] >= 1.0
    np.testing.assert_array_equal(rmia_online(phi, S, inside, z)[0], on.mean(1))
    out = np.array([P[~inside[:, t], t].mean() for t in range(n)])
    pr = 0.5 * (1.25 * out + 0.75)
    off = (p / pr)[:, None] / (p[z] / pr[z])[None, :] >= 1.0
    got, fb = rmia_offline(phi, S, inside, z, a=0.25)
    np.testing.assert_array_equal(got, off.mean(1))
    assert fb == {"no_out_shadow": 0}


def _planted(rng, *, n, K, gap, spread=2.0, noise=0.3):
    """Targets of varied difficulty d; logit Pr(x|θ) = d + gap·[trained on x] + noise, for θ and each reference (the
    membership-inference tests' planted signal, with less noise)."""
    return _synthetic(rng, n=n, K=K, gap=gap, spread=spread, noise=noise)


def test_rmia_finds_a_planted_signal_beyond_loss_and_stays_at_chance_without_one():
    rng = np.random.default_rng(2)
    n, K = 3000, 8
    pool = np.arange(n)
    phi, S, inside, member = _planted(rng, n=n, K=K, gap=1.0)
    loss = roc_auc_score(member, phi)
    on = roc_auc_score(member, rmia_online(phi, S, inside, pool)[0])
    off = roc_auc_score(member, rmia_offline(phi, S, inside, pool)[0])
    # the difficulty d hides the signal from LOSS; Pr(x) over the references removes it
    assert loss < 0.65 and on > 0.85 and off > 0.75, (loss, on, off)
    # an independent target model (no gap: θ did not learn its members) and a noised one: chance
    for gap, noise in ((0.0, 0.3), (1.0, 30.0)):
        phi0, S0, inside0, member0 = _planted(rng, n=n, K=K, gap=0.0, noise=0.3)
        phi0 = phi0 + gap * member0 + rng.normal(0.0, noise, n)
        for f in (rmia_online, rmia_offline):
            assert abs(roc_auc_score(member0, f(phi0, S0, inside0, pool)[0]) - 0.5) < 0.04


def test_rmia_on_a_real_reference_model_as_target(tmp_path):
    """The audit's own pipeline on an overfit non-private toy (the oracle, 20 epochs, 30% noisy labels): shadow 0
    attacked as the target, the other shadows as references, beats chance on its own members; an independent model
    (the released θ, trained on another split) scored against shadow 0's members stays near chance."""
    from threat_models.attacks.membership_inference import logit_confidence
    from threat_models.context import AuditContext

    mi = "attacks.membership_inference"
    plan = small_plan("attacks.run=[membership_inference]", "algorithm.name=oracle", f"{mi}.shadows=5",
                       f"{mi}.shadow_dir={tmp_path / 'shadows'}", "training.local_epochs=20", "model.hidden_dims=[128]",
                       "dataset.synthetic.noise_label_rate=0.3", "dataset.synthetic.feature_noise=1.5")  # fmt: skip
    e = build_experiment(plan, run_dir=tmp_path / "run")
    e.run(progress=False)
    ctx = AuditContext(e)
    aux, _ = MembershipInference(attacks_of(plan).membership_inference).prepare(ctx)
    S, inside = aux["shadow"].run(aux["encoder"], aux["x"], aux["Y"])
    pool, member = np.arange(S.shape[1]), inside[0].astype(int)
    m, _ = roc_summary(member, rmia_online(S[0], S[1:], inside[1:], pool)[0], bootstrap=50, seed=0)
    assert m["auc_ci95"][0] > 0.5 and m["auc"] > 0.55, m
    view = ctx.observer_view()
    phi = logit_confidence(aux["encoder"], view.theta, view.W, aux["x"], aux["Y"])
    m, _ = roc_summary(member, rmia_online(phi, S[1:], inside[1:], pool)[0], bootstrap=50, seed=0)
    assert abs(m["auc"] - 0.5) < 0.07, m
