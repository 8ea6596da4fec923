"""The canary-client ε estimate (Andrew et al. 2024): the ε of a pair of Gaussians, the estimate on a simulated
Gaussian mechanism against its derivation, and on real client-level DP runs (noise off: large; ε = 8: below it)."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import integrate, stats

from secure_fed.config import load_plan
from secure_fed.plugin_api.attacks import build_experiment
from tests.conftest import SMALL, register_plugins
from threat_models.attacks.canary_client_audit import estimate
from threat_models.attacks.canary_client_audit_spec import SPEC as CANARY_CLIENT_AUDIT
from threat_models.canary_clients import CanaryClients
from threat_models.gaussian_pair_epsilon import hockey_stick, pair_epsilon
from threat_models.one_run_fdp import epsilon_from_gdp


def small_plan(*overrides: str):
    """The small test run's plan (``tests.conftest.SMALL``) with ``overrides``."""
    return load_plan(overrides=[*SMALL, *overrides])


@pytest.mark.parametrize("mu", [0.1, 0.8, 2.0, 5.0])
def test_equal_variances_give_the_gdp_conversion(mu):
    assert pair_epsilon((0.3 * mu, 0.3), (0.0, 0.3), 1e-5) == pytest.approx(epsilon_from_gdp(mu, 1e-5), rel=1e-6)


@pytest.mark.parametrize(
    ("p", "q", "eps"), [((1.0, 1.3), (0.0, 1.0), 1.0), ((0.5, 0.8), (0.0, 1.0), 0.5), ((0.0, 1.2), (0.1, 1.0), 2.0)]
)
def test_hockey_stick_matches_a_numerical_integral(p, q, eps):
    """∫ (p − e^ε q)₊ by quadrature (no region algebra) against the closed form."""
    f = lambda x: max(stats.norm.pdf(x, *p) - math.exp(eps) * stats.norm.pdf(x, *q), 0.0)  # noqa: E731
    ref = integrate.quad(f, -40, 40, points=[-3, 0, 3], limit=400, epsabs=1e-13)[0]
    assert hockey_stick(eps, p, q) == pytest.approx(ref, rel=1e-6, abs=1e-12)


def _simulated_cosines(*, c, h, d, sigma, q, T, rng):
    """The Gaussian mechanism on random directions, independently of the engine: c inserted unit directions each
    sampled with rate q in each of T rounds, the sum noised by N(0, σ²) per coordinate and round (clip norm 1)."""
    U = rng.standard_normal((c + h, d))
    U /= np.linalg.norm(U, axis=1, keepdims=True)
    delta = rng.binomial(T, q, size=c) @ U[:c] + sigma * math.sqrt(T) * rng.standard_normal(d)
    return U @ delta / np.linalg.norm(delta)


def test_simulated_gaussian_mechanism_gives_the_derived_mu():
    """cos_in ≈ (k + N(0, Tσ²))/(σ√(Td)) with k ~ Bin(T, q), cos_out ≈ N(0, 1/d): μ = E[k]/(σ√T) = q√T/σ."""
    rng = np.random.default_rng(0)
    c, h, d, sigma, q, T = 40, 400, 1000, 1.5, 0.5, 12
    mus = [estimate(*np.split(_simulated_cosines(c=c, h=h, d=d, sigma=sigma, q=q, T=T, rng=rng), [c]), 1e-5)["gdp_mu_estimate"]
           for _ in range(100)]  # fmt: skip
    assert np.mean(mus) == pytest.approx(q * math.sqrt(T) / sigma, rel=0.05)


# 100 IID clients, 40 of them canary clients; 12 rounds of Poisson sampling at q = ½; θ's trained dimension 1,072
RUN = ["algorithm.name=fedavg", "partition.name=iid", "partition.num_clients=100", "training.rounds=12",
       "training.client_fraction=0.5", "training.sampling=poisson", "training.server_optimizer.name=fedavg",
       "training.server_optimizer.lr=1.0", "protocols=[dp]", "attacks.canary_client_audit.canaries=40",
       "attacks.canary_client_audit.held_out=400", "attacks.run=[canary_client_audit]",
       "attacks.membership_inference.shadows=0"]  # fmt: skip


def _estimated(monkeypatch, tmp_path, client: str):
    from threat_models import audit as harness
    from threat_models.context import AuditContext

    # as the installed entry point does (pyproject.toml): the audit reads the registry when it runs
    register_plugins(monkeypatch, {"attacks": {"canary_client_audit": CANARY_CLIENT_AUDIT}})
    e = build_experiment(small_plan(*RUN, f"privacy.client={{{client}}}"), run_dir=tmp_path)
    e.run(progress=False)
    return e, harness.audit(AuditContext(e), progress=False)["attacks"]["canary_client_audit"]


def test_noise_off_gives_a_large_estimate(monkeypatch, tmp_path):
    _, r = _estimated(monkeypatch, tmp_path, '"clip_norm": 0.5, "noise_multiplier": 1e-9')
    assert r["metrics"]["epsilon_estimate"] > 15.0 and r["metrics"]["gdp_mu_estimate"] > 3.0
    assert r["details"]["variant"] == "final_model" and "not a bound" in r["details"]["method"]


def test_estimate_at_epsilon_8_stays_below_it_and_within_the_simulated_mechanism(monkeypatch, tmp_path):
    """The run's μ against a numpy simulation of the Gaussian mechanism with the same c, d, σ, q, T: the data's own
    update only lengthens θ_T − θ⁰, so the run's μ is at most the simulation's (up to 4 standard errors) and the
    canaries still show (μ > 0 by 3 standard errors of the mean shift, ≈ √(1/c + 1/h))."""
    e, r = _estimated(monkeypatch, tmp_path, '"clip_norm": 0.5, "target_epsilon": 8')
    m, d = r["metrics"], r["details"]
    rep = e.privacy_summary()["units"]["client"]
    assert m["accountant_epsilon"] == pytest.approx(float(rep["epsilon"])) and m["accountant_epsilon"] <= 8.0 + 1e-6
    assert m["epsilon_estimate"] <= m["accountant_epsilon"] and m["exceeds_accountant"] is False
    sigma, q = float(rep["noise_multiplier"]), float(rep["sample_rate"])
    rng = np.random.default_rng(1)
    sims = [estimate(*np.split(_simulated_cosines(c=40, h=400, d=d["dim"], sigma=sigma, q=q, T=12, rng=rng), [40]), 1e-5)
            ["gdp_mu_estimate"] for _ in range(50)]  # fmt: skip
    se = math.sqrt(1 / 40 + 1 / 400)
    assert m["gdp_mu_estimate"] <= np.mean(sims) + 4 * se
    assert m["gdp_mu_estimate"] > 3 * se


def test_canary_update_is_the_direction_at_the_norm_and_cosines_find_it():
    import torch

    cc = CanaryClients(c=3, held_out=50, norm=0.5, theta_shapes={"a": (4, 5), "b": (7,)}, num_clients=10, seed=0)
    like = {"a": torch.zeros(4, 5), "b": torch.zeros(7), "frozen": torch.zeros(3)}
    upd = cc.canary_update(1, like)
    flat = torch.cat([upd["a"].reshape(-1), upd["b"]]).double().numpy()
    assert np.linalg.norm(flat) == pytest.approx(0.5) and not upd["frozen"].any()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cos = cc.cosines({"a": upd["a"], "b": upd["b"]}, {"a": torch.zeros(4, 5), "b": torch.zeros(7)})
    assert cos[1] == pytest.approx(1.0) and np.argmax(np.abs(cos)) == 1
    st = CanaryClients.from_state_dict(cc.state_dict())
    assert np.array_equal(st.direction(2), cc.direction(2)) and list(st.clients) == list(cc.clients)


def test_the_interval_covers_the_simulated_mechanisms_epsilon():
    """Every client in every round (q = 1): cos_in ≈ N(√T/(σ√d), 1/d), so the equal-variance estimate targets the
    μ-GDP ε of μ = √T/σ. The bootstrap interval holds its point estimate, and covers that ε in most seeds with the
    defaults' 20 inserted and 200 held-out canaries (a 95% interval: at least 24 of 30)."""
    from threat_models.attacks.canary_client_audit import estimate_interval
    from threat_models.one_run_fdp import epsilon_from_gdp

    rng = np.random.default_rng(3)
    c, h, d, sigma, T = 20, 200, 2000, 2.0, 16
    want = epsilon_from_gdp(math.sqrt(T) / sigma, 1e-5)
    covered = 0
    for s in range(30):
        ins, out = np.split(_simulated_cosines(c=c, h=h, d=d, sigma=sigma, q=1.0, T=T, rng=rng), [c])
        lo, hi = estimate_interval(ins, out, 1e-5, resamples=200, seed=s)
        assert lo <= estimate(ins, out, 1e-5)["epsilon_estimate"] <= hi
        covered += lo <= want <= hi
    assert covered >= 24, covered


def test_the_papers_closed_form_null_estimator():
    """Andrew et al.'s estimator: the fitted inserted Gaussian against N(0, 1/d). Inserted cosines whose sample std is
    exactly 1/√d make it the μ-GDP ε of μ = mean·√d (an independent closed form)."""
    d = 2500
    z = np.random.default_rng(0).standard_normal(30)
    inserted = 0.04 + (z - z.mean()) / z.std(ddof=1) / math.sqrt(d)
    got = estimate(inserted, np.zeros(5) + np.arange(5) * 1e-3, 1e-5, dim=d)["epsilon_estimate_closed_form_null"]
    assert got == pytest.approx(epsilon_from_gdp(0.04 * math.sqrt(d), 1e-5), rel=1e-5)
