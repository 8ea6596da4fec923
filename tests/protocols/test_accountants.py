"""The accountants behind one interface (protocols/dp/accountants/): the registry, each accountant's ε against an
independent computation, ``step``'s bookkeeping, a third party's accountant used by name, and ``pld`` in a run.

Independent computations: Opacus's ``RDPAccountant`` (at the ledger's orders) and ``PRVAccountant`` used directly,
and dp-accounting's ``PLDAccountant`` over the events the brief names (``SelfComposedDpEvent`` of
``PoissonSampledDpEvent(q, GaussianDpEvent(σ))``, composed by ``ComposedDpEvent``), at the same grid.
Tolerances: RDP and PRV are the same computations (relative 1e-12); PLD is composed by another path (the accountant
self-composes cached PLDs, dp-accounting composes events): absolute 1e-8 (measured ≤ 1.3e-10).
"""

from __future__ import annotations

import warnings

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import PLDAccountant as GooglePLDAccountant
from opacus.accountants import PRVAccountant as OpacusPRV
from opacus.accountants import RDPAccountant as OpacusRDP

from protocols.dp.accountant import PrivacyUnit, calibrate_shared_sigma, calibrate_sigma
from protocols.dp.accountants import (
    ACCOUNTANTS,
    Accountant,
    epsilon_of,
    make_accountant,
    register_accountant,
)
from protocols.dp.accountants.pld import PLD_MAX_RDP_EPSILON, VALUE_DISCRETIZATION_INTERVAL
from protocols.dp.accountants.rdp import rdp_curve_epsilon, rdp_epsilon
from protocols.dp.mechanisms import ORDERS, RDP_ORDERS, ClientDPSGD, ClientServerNoise, LabelSetWStep
from protocols.dp.privacy_graph import Graph
from secure_fed.config import load_config
from secure_fed.engine import Experiment
from secure_fed.errors import ConfigError
from tests.conftest import small_plan

DELTA = 1e-5
HISTORIES = [
    [(1.0, 0.1, 100)],
    [(1.23, 0.1, 50)],  # the GDP audit's point
    [(3.0, 1.0, 10)],  # no sampling
    [(1.484, 0.1, 100), (2.0, 0.25, 40)],  # two mechanisms of one unit
]
IDS = ["s1-q0.1-100", "s1.23-q0.1-50", "s3-q1-10", "two-entries"]


def quiet(fn, *args, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kw)


def opacus_rdp(history):
    acc = OpacusRDP()
    acc.history = list(history)
    # the ledger's curve is Opacus's at its integer orders, and at every order without sampling (CKS 2020); at its
    # fractional orders with q < 1 an interpolation (protocols/dp/discrete_gaussian_accounting.py)
    every = all(q >= 1.0 for _, q, _ in history)
    return quiet(acc.get_epsilon, DELTA, alphas=[a for a in RDP_ORDERS if every or float(a).is_integer()])


def opacus_prv(history):
    acc = OpacusPRV()
    acc.history = list(history)
    return quiet(acc.get_epsilon, DELTA)


def google_pld(history, interval=VALUE_DISCRETIZATION_INTERVAL):
    acc = GooglePLDAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=interval
    )
    events = [
        dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(s)), n)
        for s, q, n in history
    ]
    acc.compose(dp_accounting.ComposedDpEvent(events))
    return acc.get_epsilon(DELTA)


# ---------------------------------------------------------------- the registry


def test_the_registry_lists_rdp_prv_and_pld():
    assert set(ACCOUNTANTS) == {"rdp", "prv", "pld"}
    for name, cls in ACCOUNTANTS.items():
        acc = make_accountant(name)
        assert isinstance(acc, Accountant) and type(acc) is cls and acc.name == name == acc.mechanism()
        assert acc.history == [] and acc.get_epsilon(DELTA) == 0.0


@pytest.mark.parametrize("bad", ["gdp", "moments", "RDP", ""])
def test_an_unknown_name_is_a_value_error_everywhere_an_accountant_is_named(bad):
    with pytest.raises(ValueError, match="unknown accountant"):
        make_accountant(bad)
    with pytest.raises(ValueError, match="unknown accountant"):
        epsilon_of([(1.0, 0.1, 10)], DELTA, bad)
    with pytest.raises(ValueError, match="unknown accountant"):
        calibrate_sigma(target_epsilon=1.0, delta=DELTA, sample_rate=0.1, steps=10, accountant=bad)
    with pytest.raises(ValueError, match="unknown accountant"):
        PrivacyUnit(name="instance", scope="s", sigma=1.0, sample_rate=0.1, delta=DELTA, accountant=bad,
                    target_epsilon=None, clip_norm=1.0, calibrated=False, planned_steps=10)  # fmt: skip


def test_config_accepts_pld_and_refuses_an_unknown_name_with_one_error_line(capsys):
    from secure_fed.cli import main

    assert load_config(overrides=["privacy.accountant=pld"]).privacy.accountant == "pld"
    with pytest.raises(ConfigError, match="'rdp', 'prv' or 'pld'"):
        load_config(overrides=["privacy.accountant=moments"])
    assert main(["validate", "--set", 'protocols=["dp"]', "--set", "privacy.accountant=moments"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_registering_a_second_class_under_a_taken_name_is_refused():
    class Impostor(Accountant):
        name = "rdp"

    with pytest.raises(ValueError, match="already registered"):
        register_accountant(Impostor)

    class Nameless(Accountant):
        pass

    with pytest.raises(ValueError, match="no name"):
        register_accountant(Nameless)
    assert ACCOUNTANTS["rdp"].__name__ == "RDPAccountant"


# ---------------------------------------------------------------- each ε against an independent computation


@pytest.mark.parametrize("history", HISTORIES, ids=IDS)
def test_rdp_equals_opacus_rdp_accountant_at_the_ledgers_orders(history):
    assert epsilon_of(history, DELTA, "rdp") == pytest.approx(opacus_rdp(history), rel=1e-12)


@pytest.mark.parametrize("history", HISTORIES, ids=IDS)
def test_prv_equals_opacus_prv_accountant(history):
    assert epsilon_of(history, DELTA, "prv") == pytest.approx(opacus_prv(history), rel=1e-12)


@pytest.mark.parametrize("history", HISTORIES, ids=IDS)
def test_pld_equals_dp_accounting_and_is_below_rdp(history):
    pld, rdp, prv = epsilon_of(history, DELTA, "pld"), epsilon_of(history, DELTA, "rdp"), epsilon_of(history, DELTA, "prv")
    assert pld == pytest.approx(google_pld(history), abs=1e-8)
    assert pld <= 0.95 * rdp  # PLD is the tightest: 7.05 vs RDP 7.90 at σ 1, q 0.1, 100 steps
    assert pld <= prv  # Opacus's PRV adds its +0.01 margin to the same quantity


def test_pld_discretisation_is_within_its_stated_error():
    """The stated grid (1e-4, pessimistic) against a 10 times finer one, on the cheapest history (no sampling)."""
    history = [(3.0, 1.0, 10)]
    assert abs(epsilon_of(history, DELTA, "pld") - google_pld(history, interval=1e-5)) <= 1e-4


def test_past_its_range_pld_reports_the_rdp_bound_and_says_so():
    """At σ 0.2, q 1, 60 steps (RDP ε ≈ 937) the PLD's support would be hundreds of ε at a 1e-4 grid; RDP's ε is
    reported, flagged, as for prv. Inside the range the PLD's own ε (below RDP's)."""
    far = PrivacyUnit(name="client", scope="s", sigma=0.2, sample_rate=1.0, delta=DELTA, accountant="pld",
                      target_epsilon=None, clip_norm=1.0, calibrated=False, planned_steps=60)  # fmt: skip
    far.step(60)
    rdp = rdp_epsilon([(0.2, 1.0, 60)], DELTA)
    assert rdp > PLD_MAX_RDP_EPSILON and far.accountant.beyond_range(DELTA)
    rep = far.report()
    assert rep["epsilon"] == rdp and "PLD" in rep["epsilon_bound"] and rep["accountant"] == "pld"
    near = make_accountant("pld", [(3.0, 1.0, 10)])
    assert not near.beyond_range(DELTA) and near.get_epsilon(DELTA) < rdp_epsilon(near.history, DELTA)


# ---------------------------------------------------------------- step, compose, history


@pytest.mark.parametrize("name", ["rdp", "prv", "pld"])
def test_every_step_is_recorded(name):
    acc = make_accountant(name)
    for _ in range(30):
        acc.step(1.1, 0.05)
    acc.step(1.1, 0.05, steps=20)
    acc.step(2.0, 1.0, steps=3)
    acc.step(2.0, 1.0, steps=0)
    assert acc.history == [(1.1, 0.05, 50), (2.0, 1.0, 3)]
    assert acc.get_epsilon(DELTA) == epsilon_of([(1.1, 0.05, 50), (2.0, 1.0, 3)], DELTA, name)
    assert acc.get_epsilon(DELTA) > epsilon_of([(1.1, 0.05, 49), (2.0, 1.0, 3)], DELTA, name)
    ref = OpacusRDP()  # Opacus's own step() over the same steps
    for _ in range(50):
        ref.step(noise_multiplier=1.1, sample_rate=0.05)
    for _ in range(3):
        ref.step(noise_multiplier=2.0, sample_rate=1.0)
    assert ref.history == acc.history


def test_compose_records_a_declared_mechanisms_history():
    m = LabelSetWStep(name="w", sigma=1.484, sample_rate=0.1, steps=100)
    acc = make_accountant("pld")
    acc.compose(m)
    acc.compose(ClientDPSGD(name="local", sigma=2.0, sample_rate=0.25, steps=40))
    assert acc.history == HISTORIES[3] and acc.get_epsilon(DELTA) == pytest.approx(google_pld(HISTORIES[3]), abs=1e-8)


@pytest.mark.parametrize("entry", [(-1e-12, 0.1, 1), (-1.0, 0.1, 1), (1.0, 0.0, 1), (1.0, 1.5, 1), (1.0, 0.1, -1),
                                   (1.0, 0.1, 1.5), (float("inf"), 0.1, 1)])  # fmt: skip
def test_an_entry_that_is_no_subsampled_gaussian_is_refused(entry):
    with pytest.raises(ValueError, match="out of range|whole number"):
        make_accountant("pld").step(*entry)
    with pytest.raises(ValueError):
        epsilon_of([entry], DELTA, "rdp")


# ---------------------------------------------------------------- calibration with pld


def test_pld_calibration_is_rdps_sigma_and_pld_holds_there():
    """σ is solved by RDP and verified by PRV and PLD (PLD's ε is below RDP's, so σ is unchanged)."""
    kw = {"target_epsilon": 4.0, "delta": DELTA, "sample_rate": 0.1, "steps": 50}
    sigma = calibrate_sigma(**kw, accountant="pld")
    assert sigma == calibrate_sigma(**kw, accountant="rdp")
    eps = {name: epsilon_of([(sigma, 0.1, 50)], DELTA, name) for name in ACCOUNTANTS}
    assert eps["pld"] < eps["prv"] <= eps["rdp"] <= 4.0 and eps["rdp"] >= 0.98 * 4.0
    shared = calibrate_shared_sigma(target_epsilon=4.0, delta=DELTA, accountant="pld",
                                    parts=[(0.1, 50, None), (0.25, 20, 3.0)])  # fmt: skip
    assert epsilon_of([(3.0, 0.25, 20), (shared, 0.1, 50)], DELTA, "pld") <= 4.0


# ---------------------------------------------------------------- a third party's accountant, by name


class Doubled(Accountant):
    """A test accountant: twice the RDP ε (valid, looser): one that binds where RDP does not."""

    name, title = "test_doubled", "doubled"

    def _epsilon(self, entries, delta):
        return 2.0 * rdp_epsilon(entries, delta)


@pytest.fixture
def doubled():
    register_accountant(Doubled)
    yield Doubled
    ACCOUNTANTS.pop(Doubled.name)


def test_a_third_party_accountant_is_used_by_name(doubled):
    history = [(1.0, 0.1, 100)]
    assert epsilon_of(history, DELTA, "test_doubled") == 2.0 * epsilon_of(history, DELTA, "rdp")
    u = PrivacyUnit(name="instance", scope="s", sigma=1.0, sample_rate=0.1, delta=DELTA, accountant="test_doubled",
                    target_epsilon=None, clip_norm=1.0, calibrated=False, planned_steps=100)  # fmt: skip
    u.step(100)
    assert isinstance(u.accountant, Doubled) and u.report()["accountant"] == "test_doubled"
    assert u.epsilon() == 2.0 * epsilon_of(history, DELTA, "rdp")
    graph = Graph([LabelSetWStep(name="w", sigma=1.0, sample_rate=0.1, steps=100)], {"label_sets": ""})
    res = graph.epsilon("instance", "observer", delta=DELTA, accountant="test_doubled")
    assert res["accountant"] == "test_doubled" and res["epsilon"] == u.epsilon()
    # calibration: RDP's σ is verified by the run's accountant and raised until it holds (not needlessly)
    kw = {"target_epsilon": 4.0, "delta": DELTA, "sample_rate": 0.1, "steps": 50}
    sigma = calibrate_sigma(**kw, accountant="test_doubled")
    assert sigma > calibrate_sigma(**kw, accountant="rdp")
    assert 0.98 * 4.0 <= epsilon_of([(sigma, 0.1, 50)], DELTA, "test_doubled") <= 4.0
    shared = calibrate_shared_sigma(target_epsilon=4.0, delta=DELTA, accountant="test_doubled",
                                    parts=[(0.1, 50, None), (0.25, 20, 6.0)])  # fmt: skip
    assert 0.98 * 4.0 <= epsilon_of([(6.0, 0.25, 20), (shared, 0.1, 50)], DELTA, "test_doubled") <= 4.0


# ---------------------------------------------------------------- where an accountant does not apply


def test_a_group_bound_is_converted_by_rdp_and_the_entry_says_so():
    """An instance under client-level DP is bounded by the group curve (RDP only): with accountant pld the graph
    converts it by RDP and names ``rdp``; the client unit's own history goes to PLD."""
    client = ClientServerNoise(name="client", sigma=2.0, sample_rate=0.5, steps=20)
    graph = Graph([client], {"client_training": ""}, instance_group=3)
    inst = graph.epsilon("instance", "observer", delta=DELTA, accountant="pld")
    group = client.group_rdp(ORDERS, group=3)
    assert inst["accountant"] == "rdp" and inst["epsilon"] == rdp_curve_epsilon(group, DELTA)
    own = graph.epsilon("client", "observer", delta=DELTA, accountant="pld")
    assert own["accountant"] == "pld" and own["epsilon"] == epsilon_of([(2.0, 0.5, 20)], DELTA, "pld")
    assert own["epsilon"] < epsilon_of([(2.0, 0.5, 20)], DELTA, "rdp")


# ---------------------------------------------------------------- a run


def test_a_run_with_pld_reports_a_finite_epsilon_at_most_the_rdp_runs(tmp_path):
    stack = ['protocols=["dp"]', "algorithm.name=fedavg", 'privacy.client={"noise_multiplier": 2.0, "clip_norm": 0.5}',
             "training.rounds=4", "privacy.noise_seed=3"]  # fmt: skip
    runs = {
        acc: Experiment(small_plan(*stack, f"privacy.accountant={acc}"), run_dir=tmp_path / acc).run(progress=False).summary
        for acc in ("pld", "rdp")
    }
    pld, rdp = runs["pld"]["privacy"], runs["rdp"]["privacy"]
    unit = pld["units"]["client"]
    assert unit["accountant"] == "pld" and unit["steps"] == 4
    assert np.isfinite(pld["epsilon"]) and 0 < pld["epsilon"] < rdp["epsilon"]
    assert unit["epsilon"] == pytest.approx(google_pld([(2.0, 1.0, 4)]), abs=1e-8)
    assert rdp["units"]["client"]["epsilon"] == pytest.approx(opacus_rdp([(2.0, 1.0, 4)]), rel=1e-12)


def test_a_pld_run_stops_at_the_proven_rdp_budget():
    """PLD (the continuous Gaussian's) is below the proven RDP ledger; the budget stop is the proven one: with a target
    between the two, a pld unit stops, naming the RDP ε past the target (σ 1, q 0.1: after 100 steps RDP ≈ 7.9, PLD ≈
    7.0 at δ 1e-5)."""
    from protocols.dp.accountant import PrivacyUnit, epsilon_of

    u = PrivacyUnit(name="instance", scope="s", sigma=1.0, sample_rate=0.1, delta=DELTA, accountant="pld",
                    target_epsilon=7.5, clip_norm=1.0, calibrated=False, planned_steps=100)  # fmt: skip
    u.step(99)
    rdp, pld = (epsilon_of([(1.0, 0.1, 100)], DELTA, n) for n in ("rdp", "pld"))
    assert pld < 7.5 < rdp
    why = u.stop_reason(1)
    assert why is not None and f"{rdp:.4g}" in why
