"""Attack (d), LiRA online and offline: the scores against a direct per-target computation, a planted signal,
the fallback counts, and one small end-to-end audit that reuses its shadow cache."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from secure_fed.config import load_plan
from secure_fed.plugin_api.attacks import build_experiment
from tests.conftest import SMALL
from threat_models.attacks.membership_inference import MembershipInference, lira_offline, lira_online, roc_summary
from threat_models.attacks_section import attacks_of
from threat_models.audit import audit
from threat_models.context import AuditContext


def small_plan(*overrides: str):
    """The small test run's plan (``tests.conftest.SMALL``) with ``overrides``."""
    return load_plan(overrides=[*SMALL, *overrides])


# ------------------------------------------------------------------------------------------ the direct computation
def _direct(phi, S, inside, *, fixed):
    """Per target, with loops: the side's mean (global mean if empty) and σ (pooled within-target, ddof 1)."""
    K, n = S.shape

    def side(mask):
        vals = [S[mask[:, t], t] for t in range(n)]
        everything = np.concatenate(vals)
        mu = np.array([v.mean() if len(v) else everything.mean() for v in vals])
        resid = np.concatenate([v - v.mean() for v in vals if len(v)])
        dof = sum(len(v) - 1 for v in vals if len(v))
        pooled = np.sqrt(np.sum(resid**2) / dof)
        sd = np.array([pooled if fixed or len(v) < 2 else np.std(v, ddof=1) for v in vals])
        return mu, sd

    mu_in, sd_in = side(inside)
    mu_out, sd_out = side(~inside)
    online = stats.norm.logpdf(phi, mu_in, sd_in) - stats.norm.logpdf(phi, mu_out, sd_out)
    offline = (phi - mu_out) / sd_out
    return online, offline


def _synthetic(rng, *, n, K, gap, spread=2.0, noise=0.5):
    """Targets with a per-target difficulty d; φ = d + gap·[trained on it] + noise, on the released model and each shadow."""
    member = rng.random(n) < 0.5
    d = rng.normal(0.0, spread, n)
    inside = rng.random((K, n)) < 0.5
    S = d + gap * inside + rng.normal(0.0, noise, (K, n))
    phi = d + gap * member + rng.normal(0.0, noise, n)
    return phi, S, inside, member


@pytest.mark.parametrize("fixed", [True, False])
def test_online_and_offline_scores_equal_a_direct_per_target_computation(fixed):
    rng = np.random.default_rng(3)
    K, n = 7, 60
    phi = rng.normal(0, 3, n)
    S = rng.normal(0, 1, (K, n)) * rng.uniform(0.5, 2.0, n) + rng.normal(0, 2, n)
    inside = rng.random((K, n)) < 0.5
    inside[:, 0], inside[:2, 1], inside[2:, 1] = True, True, False  # target 0: no OUT; target 1: two IN, five OUT
    want_on, want_off = _direct(phi, S, inside, fixed=fixed)
    got_on, fb_on = lira_online(phi, S, inside, fixed_variance=fixed)
    got_off, fb_off = lira_offline(phi, S, inside, fixed_variance=fixed)
    np.testing.assert_allclose(got_on, want_on, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(got_off, want_off, rtol=1e-9, atol=1e-12)
    assert fb_on == {"no_in_shadow": int((~inside).all(0).sum()), "no_out_shadow": int(inside.all(0).sum())}
    assert fb_off == {"no_out_shadow": fb_on["no_out_shadow"]} and fb_off["no_out_shadow"] >= 1


def test_variance_is_global_below_64_shadows_and_per_target_from_64():
    rng = np.random.default_rng(4)
    for K, fixed in ((16, True), (64, False)):
        phi, S, inside, _ = _synthetic(rng, n=50, K=K, gap=1.0)
        np.testing.assert_array_equal(lira_online(phi, S, inside)[0], lira_online(phi, S, inside, fixed_variance=fixed)[0])
        np.testing.assert_array_equal(lira_offline(phi, S, inside)[0], lira_offline(phi, S, inside, fixed_variance=fixed)[0])
    with pytest.raises(ValueError, match=r"\(K, n\)"):
        lira_online(phi, S[:, :-1], inside[:, :-1])


def test_planted_signal_is_found_and_no_signal_stays_at_chance():
    rng = np.random.default_rng(5)
    phi, S, inside, member = _synthetic(rng, n=2000, K=16, gap=1.0)
    on, _ = lira_online(phi, S, inside)
    off, _ = lira_offline(phi, S, inside)
    m_on, _ = roc_summary(member, on, bootstrap=50, seed=0)
    m_off, _ = roc_summary(member, off, bootstrap=50, seed=0)
    m_loss, _ = roc_summary(member, phi, bootstrap=50, seed=0)
    # calibrating by each target's difficulty is what LiRA adds over LOSS; the IN side adds to the OUT side
    assert m_on["auc"] > 0.85 and m_on["auc_ci95"][0] > 0.8
    assert m_off["auc"] > 0.8 and m_loss["auc"] < 0.7
    assert m_on["tpr_at_1pct_fpr"] > 0.1
    # when only some targets are vulnerable, the IN side tells which: online beats offline
    gap = np.where(np.random.default_rng(8).random(2000) < 0.3, 3.0, 0.0)
    phi, S, inside, member = _synthetic(np.random.default_rng(9), n=2000, K=16, gap=gap)
    auc_on = roc_summary(member, lira_online(phi, S, inside)[0], bootstrap=10, seed=0)[0]["auc"]
    auc_off = roc_summary(member, lira_offline(phi, S, inside)[0], bootstrap=10, seed=0)[0]["auc"]
    assert auc_on > auc_off + 0.04
    phi0, S0, inside0, member0 = _synthetic(np.random.default_rng(6), n=2000, K=16, gap=0.0)
    for score in (lira_online(phi0, S0, inside0)[0], lira_offline(phi0, S0, inside0)[0]):
        null, _ = roc_summary(member0, score, bootstrap=200, seed=0)
        assert null["auc_ci95"][0] <= 0.5 <= null["auc_ci95"][1]


def test_fallback_counts_and_global_means_for_targets_in_every_or_no_shadow():
    rng = np.random.default_rng(7)
    phi, S, inside, _ = _synthetic(rng, n=30, K=4, gap=1.0)
    inside[:, :] = np.arange(4)[:, None] % 2 == np.arange(30)[None, :] % 2  # two IN, two OUT each
    inside[:, 3] = True  # IN every shadow
    inside[:, [5, 8]] = False  # OUT of every shadow
    on, fb_on = lira_online(phi, S, inside)
    off, fb_off = lira_offline(phi, S, inside)
    assert fb_on == {"no_in_shadow": 2, "no_out_shadow": 1} and fb_off == {"no_out_shadow": 1}
    assert np.isfinite(on).all() and np.isfinite(off).all()
    # the fallback is the global mean of the side: target 3's OUT mean, targets 5 and 8's IN mean
    outs = [S[~inside[:, t], t] for t in range(30) if t != 3]
    sd_out = np.sqrt(sum(np.sum((v - v.mean()) ** 2) for v in outs) / sum(len(v) - 1 for v in outs))
    assert off[3] == pytest.approx((phi[3] - S[~inside].mean()) / sd_out)
    ins = [S[inside[:, t], t] for t in range(30) if t not in (5, 8)]
    sd_in = np.sqrt(sum(np.sum((v - v.mean()) ** 2) for v in ins) / sum(len(v) - 1 for v in ins))
    want5 = stats.norm.logpdf(phi[5], S[inside].mean(), sd_in) - stats.norm.logpdf(phi[5], S[~inside[:, 5], 5].mean(), sd_out)
    assert on[5] == pytest.approx(want5)
    everywhere = np.ones_like(inside)
    assert lira_online(phi, S, everywhere)[1] == {"no_in_shadow": 0, "no_out_shadow": 30}
    assert np.isfinite(lira_online(phi, S, everywhere)[0]).all()


# ------------------------------------------------------------------------------------------ end to end
def test_end_to_end_reports_both_lira_variants_and_reuses_a_smaller_shadow_cache(tmp_path):
    shadow_dir = tmp_path / "shadows"
    mi = "attacks.membership_inference"
    plan = small_plan("attacks.run=[membership_inference]", "algorithm.name=oracle", f"{mi}.shadows=2", f"{mi}.bootstrap=20",
                       f"{mi}.shadow_dir={shadow_dir}")  # fmt: skip
    e = build_experiment(plan, run_dir=tmp_path / "run")
    e.run(progress=False)
    res = audit(AuditContext(e), progress=False)["attacks"]["membership_inference"]
    m, d = res["metrics"], res["details"]
    assert list(m) == ["loss", "lira_online", "lira_offline", "rmia_online", "rmia_offline"]
    for k in m:
        assert set(m[k]) == {
            "auc",
            "auc_ci95",
            "tpr_at_1pct_fpr",
            "tpr_at_1pct_fpr_ci95",
            "tpr_at_0.1pct_fpr",
            "tpr_at_0.1pct_fpr_ci95",
        }
        assert 0.0 <= m[k]["auc_ci95"][0] <= m[k]["auc"] <= m[k]["auc_ci95"][1] <= 1.0
    n = d["members"] + d["non_members"]
    assert d["shadows"] == 2 and d["fixed_variance"] is True
    assert set(d["fallback"]) == {"lira_online", "lira_offline", "rmia_offline"}
    assert d["rmia"] == {"offline_a": 0.3, "gamma": 1.0, "population": n}
    # with 2 shadows a target is IN both with probability ¼ and OUT of both with probability ¼
    assert 0.1 * n < d["fallback"]["lira_online"]["no_out_shadow"] == d["fallback"]["lira_offline"]["no_out_shadow"] < 0.4 * n
    assert d["fallback"]["rmia_offline"] == {"no_out_shadow": d["fallback"]["lira_offline"]["no_out_shadow"]}
    assert 0.1 * n < d["fallback"]["lira_online"]["no_in_shadow"] < 0.4 * n
    assert (tmp_path / "run" / "private" / "roc.png").is_file()
    doc = json.loads((tmp_path / "run" / "private" / "attacks.json").read_text())
    assert set(doc["attacks"]["membership_inference"]["curves"]) == set(m)

    # a third shadow reuses the two cached ones
    (cache,) = shadow_dir.iterdir()
    stamps = {f.name: f.stat().st_mtime_ns for f in cache.glob("shadow*.npz")}
    assert set(stamps) == {"shadow0.npz", "shadow1.npz"}
    ctx = AuditContext(e)
    attack = MembershipInference(attacks_of(plan).membership_inference.model_copy(update={"shadows": 3}))
    aux, truth = attack.prepare(ctx)
    scores, inside = aux["shadow"].run(aux["encoder"], aux["x"], aux["Y"])
    assert scores.shape == inside.shape == (3, n)
    assert {f.name: f.stat().st_mtime_ns for f in cache.glob("shadow*.npz") if f.name in stamps} == stamps
    assert (cache / "shadow2.npz").is_file()
    for k in range(2):
        z = np.load(cache / f"shadow{k}.npz")
        np.testing.assert_array_equal(scores[k], z["score"])
        np.testing.assert_array_equal(inside[k], z["trained"])
        # the oracle recipe holds out a validation split of its IN half: those rows are not members of the shadow
        assert not (z["trained"] & ~z["inside"]).any()
        held = 1 - z["trained"].sum() / z["inside"].sum()
        assert abs(held - plan.algorithm.validation_fraction) < 0.02
    assert 0.0 < inside.mean() < 1.0


def test_runs_on_dense_image_rows_with_image_shadows(tmp_path):
    """Dense uint8 image rows (digit mosaics): the target pool stacks train and test rows in order, and a shadow's
    dataset keeps the image shape."""
    mi = "attacks.membership_inference"
    plan = small_plan("attacks.run=[membership_inference]", "algorithm.name=oracle", f"{mi}.shadows=1",
                       f"{mi}.bootstrap=10", "dataset.name=digit_mosaics", "model.name=mlp",
                       "dataset.mosaics={num_train: 60, num_test: 30, tile_size: 4}", "model.family=linear_head",
                       "partition.name=iid", "algorithm.loss=bce")  # fmt: skip
    e = build_experiment(plan, run_dir=tmp_path / "run")
    e.run(progress=False)
    ds = e.dataset
    attack = MembershipInference(attacks_of(plan).membership_inference)
    aux, truth = attack.prepare(AuditContext(e))
    order = np.random.default_rng([plan.seed, 0x3E3]).permutation(90)
    pool = np.concatenate([ds.train.features, ds.test.features])[order]
    np.testing.assert_array_equal(aux["x"].numpy(), e.fed.preprocessor.transform(pool))
    assert truth["member"].sum() == 60 - len(e.fed.x_val if e.fed.x_val is not None else [])
    assert aux["shadow"].meta == {"image_shape": ds.image_shape}
    # linear_head: φ is the logit of the whole label vector's likelihood, here from the engine's own scores
    phi = attack.run(AuditContext(e).observer_view(), {**aux, "shadow": None})["loss"]
    z = e.model_scores(e.theta, aux["x"]).astype(np.float64)
    lp = np.clip(np.where(aux["Y"], -np.logaddexp(0, -z), -np.logaddexp(0, z)).sum(axis=1), -60, -1e-12)
    np.testing.assert_allclose(phi, lp - np.log(-np.expm1(lp)), rtol=1e-5, atol=1e-6)
    res = audit(AuditContext(e), progress=False)["attacks"]["membership_inference"]
    assert res["details"]["shadows"] == 1
