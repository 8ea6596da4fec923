"""The privacy-loss graph (protocols/dp/privacy_graph.py, run_graph.py): the released model's ε per instance
composes every mechanism the release reaches, each once, at the unit's sensitivity; checked against an independent
computation (Opacus's RDP of the W step plus the group bound written out here with math.comb), so a mechanism
dropped from the graph or a group size off by one fails."""

from __future__ import annotations

import math

import pytest
from opacus.accountants import RDPAccountant
from opacus.accountants.analysis import rdp as privacy_analysis

from protocols.dp.accountant import epsilon_of
from protocols.dp.mechanisms import (
    ORDERS,
    ClientDPSGD,
    ClientDPSGDShares,
    ClientNoiseShares,
    ClientServerNoise,
    ClientTree,
    LabelSetWStep,
    builtin_run_mechanisms,
)
from protocols.dp.privacy_graph import Graph, finite
from protocols.dp.run_graph import mechanism_kind, run_graph
from secure_fed.config import build_plan, load_config
from secure_fed.engine import Experiment
from tests.conftest import REPO, small_plan

#: the audit's configuration (issue 52): Bibtex FedALC, the W step at ε 4 and client-level DP at ε 4, q = 0.5
INSTANCE_AND_CLIENT = ['privacy.client={"target_epsilon": 4, "clip_norm": 1, "max_labels_per_instance": 3}',
                       "training.client_fraction=0.5", "training.sampling=poisson"]  # fmt: skip
#: the privacy-loss distribution of the realised worst-case pair in that configuration, as the audit measured it
#: (one instance alone in each of its 3 labels, removed; client step and W step): a lower bound of the true ε
AUDIT_PLD_LOWER_BOUND = 6.25


def proven_gaussian_rdp(sigma: float, q: float, steps: int) -> list[float]:
    """The subsampled Gaussian's curve the ledger uses, written out: Opacus's value ε(k) at the integer orders (proven
    for the discrete Gaussian) and, at a fractional order α between integers k and k + 1, the log-linear interpolation
    (α−1)·ε(α) = (k+1−α)(k−1)·ε(k) + (α−k)·k·ε(k+1) (log-convexity; (α−1)ε(α) is 0 at α = 1)."""
    needed = sorted({k for a in ORDERS for k in (math.floor(a), math.floor(a) + 1) if k >= 2})
    at = dict(zip(needed, privacy_analysis.compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=needed), strict=True))
    at[1] = 0.0
    out = []
    for a in ORDERS:
        k, lam = math.floor(a), math.floor(a) + 1 - a
        log_a = (k - 1) * at[k] if lam == 1 else lam * (k - 1) * at[k] + (1 - lam) * k * at[k + 1]
        out.append(steps * log_a / (a - 1))
    return out


def independent_instance_epsilon(*, w: tuple[float, float, int], client: tuple[float, float, int], k: int, delta: float):
    """The subsampled-Gaussian RDP for the W step (:func:`proven_gaussian_rdp`) plus, for the client steps,
    log E_j exp(2α(α−1)j²/σ²)/(α−1) with j ~ Binomial(k, q), written out with math.comb; Opacus's RDP → (ε, δ)
    conversion."""
    sw, qw, nw = w
    sc, qc, nc = client
    rdp = proven_gaussian_rdp(sw, qw, nw)
    for i, a in enumerate(ORDERS):
        logs = [math.log(math.comb(k, j) * qc**j * (1 - qc) ** (k - j)) + 2 * a * (a - 1) * j * j / sc**2
                for j in range(k + 1) if qc**j * (1 - qc) ** (k - j) > 0]  # fmt: skip
        top = max(logs)
        rdp[i] += nc * (top + math.log(sum(math.exp(x - top) for x in logs))) / (a - 1)
    eps, _ = privacy_analysis.get_privacy_spent(orders=list(ORDERS), rdp=rdp, delta=delta)
    return float(eps)


def _graph(privacy, *, w, client, k, label_sets=True) -> Graph:
    mechs = []
    if w is not None:
        mechs.append(LabelSetWStep(name="server_w_step", sigma=w[0], sample_rate=w[1], steps=w[2]))
    if client is not None:
        mechs.append(ClientServerNoise(name="client", sigma=client[0], sample_rate=client[1], steps=client[2]))
    return run_graph(privacy, label_set_algorithm=label_sets, mechanisms=mechs, instance_group=k, population=159,
                     cohort=None)  # fmt: skip


def test_instance_and_client_units_compose_per_instance_through_the_group_bound():
    cfg = load_config(REPO / "experiments/configs/bibtex_fedalc_dp.yaml", INSTANCE_AND_CLIENT)
    w, client = (1.484, 0.1, 100), (5.918, 0.5, 100)
    g = _graph(cfg.privacy, w=w, client=client, k=3)
    got = g.epsilon("instance", "observer", delta=1e-5, accountant="rdp")
    want = independent_instance_epsilon(w=w, client=client, k=3, delta=1e-5)
    assert got["epsilon"] == pytest.approx(want, rel=1e-9)
    assert got["composed"] == ["server_w_step", "client"]
    assert math.isfinite(want) and want >= AUDIT_PLD_LOWER_BOUND
    # a group size off by one, or the client mechanism dropped, gives another (smaller) ε
    assert want > independent_instance_epsilon(w=w, client=client, k=2, delta=1e-5) * 1.05
    w_only = RDPAccountant()
    w_only.history = [w]
    assert want > w_only.get_epsilon(1e-5) + 1.0
    # a client holds an unbounded number of label sets: the W step bounds no client
    assert g.epsilon("client", "observer", delta=1e-5, accountant="rdp")["epsilon"] == "inf"
    # the server adds both noises itself
    assert g.epsilon("instance", "server", delta=1e-5, accountant="rdp")["epsilon"] == "inf"


def test_validate_plans_the_released_models_epsilon_per_instance(capsys):
    """``validate``'s line for the audit's configuration at its full 100 rounds on Bibtex's 159 clients (config and
    public facts only): finite, at least the audit's worst-case PLD, and the independent composition of the planned σ."""
    from protocols.layer_specs import _describe_dp

    lines = _describe_dp(build_plan(load_config(REPO / "experiments/configs/bibtex_fedalc_dp.yaml", INSTANCE_AND_CLIENT)), 159)
    line = next(x for x in lines if x.startswith("dp released model, per instance (observer)"))
    eps = float(line.split("plans ε = ")[1].split(" ")[0])
    sigmas = {x.split(" unit")[0].split()[-1]: float(x.split("σ ")[1].split(" ")[0]) for x in lines if " unit: " in x}
    want = independent_instance_epsilon(w=(sigmas["instance"], 0.1, 100), client=(sigmas["client"], 0.5, 100), k=3, delta=1e-5)
    assert eps == pytest.approx(want, rel=2e-3)  # the line prints 4 significant digits; σ is printed to 4 too
    assert AUDIT_PLD_LOWER_BOUND <= eps < 200


def test_a_run_reports_the_composed_epsilon_for_the_released_model(tmp_path):
    """End to end: the summary's top-level ε (the released model's) is the observer's, which composes the W step's
    realised steps with the client steps through the group bound; the instance unit's own ledger stays the W step's."""
    ov = ['protocols=["dp"]', "algorithm.normalize_gamma=false", "training.rounds=2",
          'privacy.instance={"noise_multiplier": 1.0, "sample_rate": 0.2}',
          'privacy.client={"noise_multiplier": 3.0, "clip_norm": 1.0, "max_labels_per_instance": 2}',
          "training.client_fraction=0.5", "training.sampling=poisson"]  # fmt: skip
    res = Experiment(small_plan(*ov), run_dir=tmp_path).run(progress=False)
    priv = res.summary["privacy"]
    inst = priv["units"]["instance"]
    observer = inst["adversaries"]["observer"]
    want = independent_instance_epsilon(w=(1.0, 0.2, inst["steps"]), client=(3.0, 0.5, 2), k=2, delta=1e-5)
    assert observer["epsilon"] == pytest.approx(want, rel=1e-9)
    assert priv["epsilon"] == observer["epsilon"] > inst["epsilon"]
    assert priv["units"]["client"]["adversaries"]["observer"]["epsilon"] == "inf"
    assert priv["units"]["client"]["instance_level"]["group_size"] == 2


def test_every_registered_mechanism_is_declared_by_some_run():
    """Each registered kind is one a run's settings declare (run_graph.mechanism_kind), so none is dead."""
    from types import SimpleNamespace as NS

    seen = set()
    for local_noise in ("local", "shares"):
        for client in (NS(mechanism="gaussian", noise="server", adaptive_clipping=None),
                       NS(mechanism="gaussian", noise="clients", adaptive_clipping=None),
                       NS(mechanism="gaussian", noise="server", adaptive_clipping=object()),
                       NS(mechanism="tree", noise="server", adaptive_clipping=None),
                       NS(mechanism="banded", noise="server", adaptive_clipping=None)):  # fmt: skip
            p = NS(local=NS(noise=local_noise), client=client)
            seen.update(mechanism_kind(p, name) for name in ("server_w_step", "client_training", "client"))
    assert seen == builtin_run_mechanisms()  # a DP mechanism plugin's kinds: its own tests


def _mech(cls, name, sigma, q, steps, **kw):
    return cls(name=name, sigma=sigma, sample_rate=q, steps=steps, **kw)


def test_the_tree_covers_an_instance_as_a_gaussian_at_twice_the_group():
    """DP-FTRL with every client in every round: K Gaussian equivalents at sensitivity 2kC (each of the k clients
    substituted), α(2k)²K/(2σ²); K = rounds with trees of one round."""
    for rounds in (1, 4):
        tree = _mech(ClientTree, "client", 3.0, 1.0, rounds, tree_rounds=1)
        want = [rounds * a * (2 * 3) ** 2 / (2 * 3.0**2) for a in ORDERS]
        assert tree.group_rdp(ORDERS, group=3) == pytest.approx(want, rel=1e-12)


def test_dp_sgd_sends_the_loss_in_the_clear_unless_noise_shares_carry_it():
    """Against the server, DP-SGD's channel leaks the clear loss (ε = ∞ with that why); local shares send no loss; with
    client noise shares the loss is zeroed (noise_share_step), so client noise holds against the server at q = 1."""
    from types import SimpleNamespace as NS

    p = NS(local=NS(noise="local"), client=None)
    g = run_graph(p, label_set_algorithm=False, mechanisms=[_mech(ClientDPSGD, "client_training", 1.0, 0.5, 10)],
                  instance_group=1, population=10, cohort=None)  # fmt: skip
    res = g.epsilon("instance", "server", delta=1e-5, accountant="rdp")
    assert res["epsilon"] == "inf" and "training loss" in res["why"]
    assert finite(g.epsilon("instance", "observer", delta=1e-5, accountant="rdp")["epsilon"])
    shares = run_graph(p, label_set_algorithm=False, mechanisms=[_mech(ClientDPSGDShares, "client_training", 1.0, 0.5, 10)],
                       instance_group=1, population=10, cohort=None)  # fmt: skip
    assert finite(shares.epsilon("instance", "server", delta=1e-5, accountant="rdp")["epsilon"])
    both = run_graph(p, label_set_algorithm=False, instance_group=1, population=10, cohort=None, mechanisms=[
        _mech(ClientDPSGD, "client_training", 1.0, 0.5, 10), _mech(ClientNoiseShares, "client", 2.0, 0.5, 10)])  # fmt: skip
    acc = RDPAccountant()
    acc.history = [(2.0, 1.0, 10)]  # the server knows the cohort: q = 1
    assert both.epsilon("client", "server", delta=1e-5, accountant="rdp")["epsilon"] == pytest.approx(acc.get_epsilon(1e-5))


def test_mechanisms_in_series_count_the_smaller_curve_at_each_order():
    """DP-SGD inside client training, then client-level noise on the update: the instance's ε is that of the
    per-order minimum of the two curves (each alone bounds the release), at most each one's own ε."""
    from types import SimpleNamespace as NS

    dpsgd, client = _mech(ClientDPSGD, "client_training", 1.5, 0.5, 20), _mech(ClientServerNoise, "client", 5.0, 0.5, 10)
    g = run_graph(NS(local=NS(noise="local"), client=None), label_set_algorithm=False, mechanisms=[dpsgd, client],
                  instance_group=2, population=10, cohort=None)  # fmt: skip
    got = g.epsilon("instance", "observer", delta=1e-5, accountant="rdp")["epsilon"]
    a = proven_gaussian_rdp(1.5, 0.5, 20)
    b = [10 * independent_group_rdp(5.0, 0.5, 2, x) for x in ORDERS]
    want, _ = privacy_analysis.get_privacy_spent(orders=list(ORDERS), rdp=[min(x, y) for x, y in zip(a, b, strict=True)],
                                                 delta=1e-5)  # fmt: skip
    only_a, _ = privacy_analysis.get_privacy_spent(orders=list(ORDERS), rdp=a, delta=1e-5)
    only_b, _ = privacy_analysis.get_privacy_spent(orders=list(ORDERS), rdp=b, delta=1e-5)
    # the two views give 9.19 and 9.87: the series is the smaller, never their composition or the larger
    assert got == pytest.approx(want, rel=1e-9) and got <= min(only_a, only_b) * (1 + 1e-9) < max(only_a, only_b) - 0.5
    # under PRV the unit's own mechanism alone (DP-SGD, by PRV) also bounds it: never above it
    prv = g.epsilon("instance", "observer", delta=1e-5, accountant="prv")["epsilon"]
    assert prv <= min(want, epsilon_of([(1.5, 0.5, 20)], 1e-5, "prv")) + 1e-12


def independent_group_rdp(sigma: float, q: float, k: int, a: float) -> float:
    """One round of the group bound at order a, written out with math.comb (log-sum-exp by hand)."""
    logs = [math.log(math.comb(k, j) * q**j * (1 - q) ** (k - j)) + 2 * a * (a - 1) * j * j / sigma**2 for j in range(k + 1)]
    top = max(logs)
    return (top + math.log(sum(math.exp(x - top) for x in logs))) / (a - 1)
