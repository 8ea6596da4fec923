"""The one-run audit's arithmetic and the δ it is run at (Steinke, Nasr & Jagielski 2023).

The p-value is checked against an exact evaluation of the paper's bound (integer binomial coefficients, no scipy), the
lower bound against a root found by scipy's brentq, and the audit δ against the finding it fixes: at the replacement δ
(1 + e^ε)·δ of a client ledger at ε = 8 the audit was vacuous (195 of 200 guesses right gave 0).
"""

from __future__ import annotations

import math
import warnings

import pytest
from opacus.accountants import RDPAccountant
from scipy.optimize import brentq

from protocols.dp.mechanisms import RDP_ORDERS
from tests.threat_models.test_attacks import AUDIT, _audited
from threat_models.attacks.one_run_audit import (
    audit_plan,
    epsilon_lower_bound,
    guess_counts,
    p_value,
    per_k_level,
    replacement_privacy,
)


def _exact_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """The paper's bound by direct sums of C(r, j)·q^j·(1 − q)^(r−j) (integer binomial coefficients, no scipy)."""
    q = 1.0 / (1.0 + math.exp(-eps))
    pmf = [math.comb(r, j) * q**j * (1 - q) ** (r - j) for j in range(r + 1)]
    beta = math.fsum(pmf[v:])
    alpha = max((math.fsum(pmf[v - i : v]) / i for i in range(1, v + 1)), default=0.0)
    return min(beta + 2 * m * delta * alpha, 1.0)


@pytest.mark.parametrize(
    ("m", "r", "v", "eps", "delta"),
    [(20, 10, 10, 0.0, 0.0), (20, 10, 9, 1.0, 1e-3), (50, 20, 17, 0.7, 1e-4), (100, 40, 30, 2.0, 1e-2),
     (200, 200, 195, 0.5, 8.3e-6), (200, 200, 195, 3.0, 0.0298), (60, 30, 0, 1.0, 1e-3)],
)  # fmt: skip
def test_p_value_matches_an_exact_evaluation_of_the_bound(m, r, v, eps, delta):
    assert p_value(m=m, r=r, v=v, eps=eps, delta=delta) == pytest.approx(_exact_p_value(m, r, v, eps, delta), rel=1e-9)


@pytest.mark.parametrize(("m", "r", "v", "delta", "level"), [(200, 200, 195, 8.3e-6, 0.01), (100, 40, 36, 1e-4, 0.05)])
def test_lower_bound_is_the_root_of_the_exact_p_value_at_the_level(m, r, v, delta, level):
    lb = epsilon_lower_bound(m=m, r=r, v=v, delta=delta, level=level)
    root = brentq(lambda e: _exact_p_value(m, r, v, e, delta) - level, 0.0, 50.0, xtol=1e-10)
    assert lb > 0 and lb == pytest.approx(root, rel=1e-5)


#: the RDP ledger's orders where q < 1: its curve there is Opacus's (protocols/dp/discrete_gaussian_accounting.py)
INTEGER_ORDERS = [a for a in RDP_ORDERS if float(a).is_integer()]


def _client_report(sigma: float, q: float, steps: int, delta: float = 1e-5) -> dict:
    """A client ledger's report: σ 1.4 at q ½ over 12 steps is ε 8.0 at δ 1e-5 (RDP, the proven ledger; the
    continuous analysis with fractional orders gave 8.0 at σ 1.372)."""
    acc = RDPAccountant()
    acc.history = [(sigma, q, steps)]
    return {"epsilon": acc.get_epsilon(delta, alphas=INTEGER_ORDERS), "delta": delta, "accountant": "rdp",
            "noise_multiplier": sigma, "sample_rate": q, "steps": steps}  # fmt: skip


def _rdp_epsilon(report: dict, delta: float) -> float:
    acc = RDPAccountant()
    acc.history = [(report["noise_multiplier"], report["sample_rate"], report["steps"])]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(acc.get_epsilon(delta, alphas=INTEGER_ORDERS))


def test_the_finding_client_audit_at_epsilon_8_is_vacuous_at_the_replacement_delta_and_not_at_the_audit_delta():
    m, conf = 200, 0.95
    rep = _client_report(1.4, 0.5, 12)
    assert rep["epsilon"] == pytest.approx(8.0, abs=0.05)
    plan = audit_plan(m=m, confidence=conf, unit="client", report=rep)
    level = per_k_level(conf, m)
    _, rel_delta = replacement_privacy(rep["epsilon"], rep["delta"])
    assert plan["relation_delta"] == pytest.approx(rel_delta) and rel_delta > 0.02
    # the finding: 195 of 200 right is no evidence at the replacement δ, nor is a perfect score
    assert epsilon_lower_bound(m=m, r=200, v=195, delta=rel_delta, level=level) == 0.0
    assert epsilon_lower_bound(m=m, r=200, v=200, delta=rel_delta, level=level) == 0.0
    assert plan["vacuous_at_relation_delta"] is True and plan["vacuous"] is False
    # the audit δ: the δ term of the best outcome takes at most half the level, for every k
    assert plan["delta"] == pytest.approx(level / (4 * m)) and plan["delta"] < rel_delta
    for k in guess_counts(m):
        extra = p_value(m=m, r=2 * k, v=2 * k, eps=0.0, delta=plan["delta"]) - p_value(m=m, r=2 * k, v=2 * k, eps=0.0, delta=0)
        assert 0 < extra <= level / 2
    assert epsilon_lower_bound(m=m, r=200, v=195, delta=plan["delta"], level=level) > 1.0
    # compared with the accountant at that δ: 2ε(δ') by Opacus directly, (1 + e^ε(δ'))·δ' within the audit δ, δ' tight
    d1 = plan["accountant_delta"]
    e1 = _rdp_epsilon(rep, d1)
    assert plan["epsilon"] == pytest.approx(2 * e1, rel=1e-9) and plan["epsilon"] > 2 * rep["epsilon"]
    assert (1 + math.exp(e1)) * d1 <= plan["delta"] * (1 + 1e-9)
    e2 = _rdp_epsilon(rep, d1 * 1.01)
    assert (1 + math.exp(e2)) * d1 * 1.01 > plan["delta"]


def test_a_ledger_delta_small_enough_is_used_as_is():
    rep = _client_report(5.0, 0.5, 12, delta=1e-9)
    plan = audit_plan(m=300, confidence=0.95, unit="client", report=rep)
    e2, d2 = replacement_privacy(rep["epsilon"], rep["delta"])
    assert d2 <= per_k_level(0.95, 300) / 1200
    assert plan["delta"] == pytest.approx(d2) and plan["epsilon"] == pytest.approx(e2) and plan["vacuous"] is False


def test_too_few_canaries_is_reported_vacuous():
    plan = audit_plan(m=4, confidence=0.95, unit="client", report=_client_report(1.4, 0.5, 12))
    assert plan["vacuous"] is True and "vacuous" in plan["why"]
    assert epsilon_lower_bound(m=4, r=4, v=4, delta=plan["delta"], level=plan["level"]) == 0.0


# client-level DP at σ = 0.01: the accountant's ε is ~2·10^4, so its replacement δ (1 + e^ε)·δ is 1 and the bound at it
# is 0 whatever the guesses; at the audit δ the canaries show (120 of 120 right, bound 3.23)
WEAK = [*(o for o in AUDIT if not o.startswith("training.rounds")), "training.rounds=4", "protocols=[dp]",
        'privacy.client={"clip_norm": 0.5, "noise_multiplier": 0.01}']  # fmt: skip


def test_weak_noise_client_dp_run_gives_a_positive_bound_at_the_audit_delta(tmp_path):
    e, res = _audited(tmp_path, *WEAK, attacks="one_run_audit")
    r = res["one_run_audit"]
    m, d = r["metrics"], r["details"]
    plan = d["audit_delta"]
    assert plan["relation_delta"] == 1.0 and plan["vacuous_at_relation_delta"] is True
    assert m["vacuous"] is False and d["delta"] == pytest.approx(plan["level"] / (4 * d["canaries"]))
    assert m["epsilon_lower_bound"] > 1.0
    assert m["epsilon_lower_bound_at_relation_delta"] == 0.0  # Steinke et al.'s at the relation's δ (1): vacuous
    assert m["replacement_epsilon"] == "inf" and m["exceeds_accountant"] is False
    assert float(m["accountant_epsilon"]) == pytest.approx(float(e.privacy_summary()["units"]["client"]["epsilon"]))


def test_weak_noise_run_with_four_canaries_reports_the_audit_vacuous(tmp_path):
    _, res = _audited(tmp_path, *WEAK, "attacks.one_run_audit.canaries=4", attacks="one_run_audit")
    r = res["one_run_audit"]
    assert r["metrics"]["vacuous"] is True and r["metrics"]["epsilon_lower_bound"] == 0.0
    assert "vacuous" in r["details"]["audit_delta"]["why"]


# the private recipe's shape on synthetic data: a fixed encoder (only each client's class row trains), one full-batch
# DP-SGD step a round; the canaries are instances whose clipped gradient sits in their owner's row
ROWS = ["training.rounds=1", "model.fixed_encoder=true", "model.hidden_dims=[]", "algorithm.name=fedaws",
        "training.batch_size=512", "training.client_lr=100", "training.server_optimizer.name=fedavg",
        "training.server_optimizer.lr=1.0", "protocols=[dp]", "attacks.one_run_audit.canaries=1000",
        "model.embedding_dim=256"]  # fmt: skip
LOCAL = '"clip_norm": 1.0, "batch_sample_rate": 1.0, "max_labels_per_instance": 3'


@pytest.mark.parametrize("reference", ["initial", "noise_free_replay"])
def test_row_canaries_audit_dp_sgd_below_its_epsilon_and_the_unnoised_control_above(tmp_path, reference):
    """At ε = 2 the bound stays below the ledger's ε; with the noise removed (σ = 1e-9, the control) it must rise above
    2. Only the replay reference takes the data's own update out of the score: against θ⁰/W⁰ the control stays weak
    (the data's update at a coordinate is several canaries large)."""
    ref = f"attacks.one_run_audit.reference={reference}"
    _, res = _audited(tmp_path / "dp", *ROWS, ref, f'privacy.local={{{LOCAL}, "target_epsilon": 2}}', attacks="one_run_audit")
    m = res["one_run_audit"]["metrics"]
    assert m["epsilon_lower_bound"] < float(m["accountant_epsilon"]) <= 2.0 + 1e-6
    _, res = _audited(tmp_path / "ctrl", *ROWS, ref, f"privacy.local={{{LOCAL}, \"noise_multiplier\": 1e-9}}",
                      attacks="one_run_audit")  # fmt: skip
    control = res["one_run_audit"]["metrics"]["epsilon_lower_bound"]
    assert (control > 2.0) == (reference == "noise_free_replay"), control


def test_row_canaries_are_scored_in_their_owners_row():
    import numpy as np
    import torch

    from threat_models.canaries import ROWS as ROW_SPACE
    from threat_models.canaries import DiracCanaries

    W0 = np.random.default_rng(0).normal(size=(5, 4))
    c = DiracCanaries(m=20, norm=1.0, theta_shapes={}, num_clients=5, seed=3, unit="instance",
                      own_rows=(np.array([4, 3, 2, 1, 0]), W0))  # fmt: skip
    assert all(c._locate(int(j))[0] == ROW_SPACE for j in c.coords)
    W = torch.tensor(W0).clone()
    i = 7
    off = c._locate(int(c.coords[i]))[1] % 4
    assert c.owner[i] == int(c.coords[i]) // 4 and c.row[i] == 4 - c.owner[i]  # client k's row is 4 − k
    W[int(c.row[i]), off] += 2.5
    s = c.scores({}, {}, W)
    assert s[i] == pytest.approx(2.5 * c.signs[i]) and np.count_nonzero(s) == 1
