"""Audit (e): a one-run empirical ε lower bound (Steinke, Nasr & Jagielski 2023).

m Dirac canaries (:mod:`threat_models.canaries`) are each inserted with
probability ½. After training the auditor scores every canary,
``s_i·(θ_T − θ_0)[j_i]``, guesses "inserted" for the k highest and "not
inserted" for the k lowest, and abstains on the rest. If the training run is
(ε, δ)-DP with respect to each canary, the number of correct guesses among the
r = 2k is dominated as in the paper's main theorem with δ > 0 (their code ``p_value_DP_audit``):

    P[correct ≥ v] ≤ P[Binomial(r, e^ε/(1+e^ε)) ≥ v] + 2·m·δ·α(v),
    α(v) = max_{1≤i≤v} P[v−i ≤ Binomial(r, e^ε/(1+e^ε)) < v] / i,

so ε is rejected at level p when this bound is < p. The lower bound is the
largest rejected ε (bisection). Several k are tried; the level is split
between them (Bonferroni), so the reported bound keeps its confidence.

A DP run whose lower bound exceeds its accountant's ε is a defect: the test
suite fails on it. The bound is compared with the *client* unit, the unit
canaries belong to, under the neighbouring relation the canaries use: flipping
a canary replaces its owner's update (with or without the canary), so the
add/remove ledger's (ε, δ) becomes (2ε, (1 + e^ε)δ) by group privacy over two
changes. A run without client-level DP has ε = ∞ for θ. Under DP-SGD in client
training the canaries are instances (gradient canaries, see
:mod:`threat_models.canaries`) and the relation is the instance unit's own
add/remove relation.

**The audit's δ.** The δ term 2·m·δ·α(v) of the p-value can swamp the level:
at ε = 8, δ = 1e-5 the replacement δ is (1 + e^8)·1e-5 ≈ 0.03, and with
m = 200 canaries even 200 right guesses of 200 cannot reject ε = 0 (the
audit is vacuous). So the p-value uses the audit δ
``min(relation δ, level / (4m))``: α ≤ 1, so the δ term then takes at most
half the level and the bound is at least the pure-DP (δ = 0) bound at half
the level. The δ is fixed before the scores are seen, from public facts
(m, the confidence, the ledger's (σ, q, steps)). The bound is then compared
with the accountant's ε *at that δ*: the privacy curve ε(δ') of the ledger's
history gives, for the client unit, (2ε(δ'), (1 + e^{ε(δ')})δ') for replacement
at every δ', and the largest δ' whose replacement δ is within the audit δ
gives the ε compared with (∞ where the e^ε factor allows none: very weak
noise). The report says which δ was used, whether the ledger's own δ would
have been vacuous, and whether the audit is vacuous even so (too few
canaries: for every k even 2k right guesses cannot reject ε = 0).

**The tight (f-DP) bound.** The same guesses also give the largest μ whose
μ-GDP they reject (Mahloujifar, Melis & Chaudhuri 2024,
:mod:`threat_models.one_run_fdp`), at the same per-k level:
``gdp_mu_lower_bound``, and ``epsilon_lower_bound_gdp``, the ε of that μ-GDP at
the relation's own δ, compared with the relation's ε (and, for a ledger of
full-batch Gaussians only, μ with the ledger's exact μ). Its test has no δ
term, so it is not swamped where Steinke et al.'s is; its ε is a lower bound
for a Gaussian trade-off curve and an estimate under that assumption otherwise. For the comparison, Steinke et al.'s bound
is also reported at the relation's own δ (``epsilon_lower_bound_at_relation_delta``; 0 whatever the guesses where
that δ makes it vacuous, ``vacuous_at_relation_delta``), the δ at which the GDP ε is converted.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from scipy import stats

from threat_models.attacks.one_run_audit_spec import SPEC
from threat_models.base import Attack, AttackResult
from threat_models.one_run_fdp import epsilon_from_gdp, gdp_mu_lower_bound, gdp_mu_of_ledger, ledger_history

if TYPE_CHECKING:
    from secure_fed.plugin_api.attacks import RunPlan


def p_value(*, m: int, r: int, v: int, eps: float, delta: float) -> float:
    """Upper bound on P[≥ v correct of r guesses] under (ε, δ)-DP (Steinke et al. 2023, Thm 5.2)."""
    q = 1.0 / (1.0 + math.exp(-eps))
    beta = float(stats.binom.sf(v - 1, r, q))
    if delta <= 0.0 or v == 0:
        return min(beta, 1.0)
    pmf = stats.binom.pmf(np.arange(v - 1, -1, -1), r, q)  # P[B = v−1], P[B = v−2], …, P[B = 0]
    alpha = float(np.max(np.cumsum(pmf) / np.arange(1, v + 1)))
    return min(beta + 2.0 * m * delta * alpha, 1.0)


def replacement_privacy(epsilon: float, delta: float) -> tuple[float, float]:
    """Add/remove (ε, δ)-DP gives (2ε, (1 + e^ε)·δ) for replacing one unit (remove, then add)."""
    if not math.isfinite(epsilon):
        return math.inf, delta
    return 2.0 * epsilon, min(1.0, (1.0 + math.exp(min(epsilon, 700.0))) * delta)


def epsilon_lower_bound(*, m: int, r: int, v: int, delta: float, level: float) -> float:
    """The largest ε that r guesses with v correct reject at ``level`` (0 if none)."""
    if r == 0 or p_value(m=m, r=r, v=v, eps=0.0, delta=delta) >= level:
        return 0.0
    lo, hi = 0.0, 1.0
    while p_value(m=m, r=r, v=v, eps=hi, delta=delta) < level:
        lo, hi = hi, 2.0 * hi
        if hi > 200:
            return lo
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        if p_value(m=m, r=r, v=v, eps=mid, delta=delta) < level:
            lo = mid
        else:
            hi = mid
    return lo


def guess_counts(m: int) -> list[int]:
    """The k tried (k highest and k lowest scores guessed, r = 2k), fixed by m alone."""
    return sorted({k for k in (m // 50, m // 20, m // 10, m // 5, m // 2) if k >= 1})


def per_k_level(confidence: float, m: int) -> float:
    """The level each k is tested at: 1 − confidence split over the k tried (Bonferroni)."""
    return (1.0 - confidence) / max(len(guess_counts(m)), 1)


def delta_cap(m: int, level: float) -> float:
    """The largest audit δ whose p-value term 2·m·δ·α (α ≤ 1) is at most half the level."""
    return level / (4.0 * m)


def vacuous(*, m: int, delta: float, level: float) -> bool:
    """Whether no outcome can give a bound > 0: for every k, even 2k right guesses of 2k fail to reject ε = 0."""
    return all(p_value(m=m, r=2 * k, v=2 * k, eps=0.0, delta=delta) >= level for k in guess_counts(m))


def _epsilon(history, delta: float, accountant: str) -> float:
    """The ledger accountant's ε at δ; RDP's (a valid, looser bound) where the PRV accountant fails at a tiny δ."""
    from protocols.dp.accountant import epsilon_of

    if not history:
        return 0.0
    rdp = epsilon_of(history, delta, "rdp")
    if accountant == "rdp":
        return rdp
    try:
        return min(rdp, epsilon_of(history, delta, accountant))
    except Exception:  # noqa: BLE001 - the RDP ε stays a valid upper bound
        return rdp


def replacement_epsilon_at(history, delta: float, accountant: str) -> tuple[float, float]:
    """(ε*, δ'): replacement ε* = 2ε(δ') at the largest δ' whose replacement δ (1 + e^{ε(δ')})·δ' is ≤ ``delta``
    (bisection on log δ', by the RDP curve; ∞ when no δ' ≥ 1e-300 qualifies)."""
    if not history:
        return 0.0, delta

    def log_g(log_d: float) -> float:  # log of the replacement δ at δ' = e^log_d
        with warnings.catch_warnings():  # Opacus's notes on the order chosen at trial δ' values describe those only
            warnings.simplefilter("ignore")
            eps = _epsilon(history, math.exp(log_d), "rdp")
        return log_d + (eps + math.log1p(math.exp(-eps)) if eps > 0 else math.log(2.0))

    target = math.log(delta)
    lo, hi = math.log(1e-300), math.log(delta / 2.0)
    if log_g(hi) <= target:
        lo = hi
    elif log_g(lo) > target:
        return math.inf, 0.0
    else:
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if log_g(mid) <= target:
                lo = mid
            else:
                hi = mid
    d = math.exp(lo)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return 2.0 * _epsilon(history, d, accountant), d


def audit_plan(*, m: int, confidence: float, unit: str, report: dict | None) -> dict:
    """The δ the p-value uses and the accountant's ε at that δ, from public facts only (m, the confidence, the unit's
    ledger report), fixed before any score is seen. ``unit``: the canaries' unit (client: replacement relation)."""
    level = per_k_level(confidence, m)
    cap = delta_cap(m, level)
    if report is None:
        eps, delta, history, acct = math.inf, 0.0, [], "rdp"
    else:
        eps, delta = float(report["epsilon"]), float(report["delta"])
        history, acct = ledger_history(report), str(report.get("accountant", "rdp"))
    if unit == "client":
        rel_eps, rel_delta = replacement_privacy(eps, delta)
    else:
        rel_eps, rel_delta = eps, delta
    if not math.isfinite(rel_eps):
        rel_delta = 0.0  # no DP for this unit: nothing to compare with, the pure (δ = 0) bound
    plan = {"unit": unit, "relation": "replacement" if unit == "client" else "add/remove", "level": level,
            "ledger_epsilon": eps, "ledger_delta": delta, "relation_epsilon": rel_eps, "relation_delta": rel_delta,
            "vacuous_at_relation_delta": vacuous(m=m, delta=rel_delta, level=level)}  # fmt: skip
    with warnings.catch_warnings():  # Opacus's notes on the ledger's own ε were shown when training reported it
        warnings.simplefilter("ignore")
        recomputed = _epsilon(history, delta, acct) if math.isfinite(eps) else math.inf
    if rel_delta <= cap or not math.isclose(recomputed, eps, rel_tol=1e-6, abs_tol=1e-9):
        # the ledger's own δ already leaves the level to the guesses (or its history cannot be recomputed)
        if not math.isfinite(rel_eps):
            why = f"no DP for the {unit} unit: the pure (δ = 0) bound, nothing to compare it with"
        elif rel_delta <= cap:
            why = f"the ledger's δ under the canaries' relation, {rel_delta:.3g}, is ≤ level/(4m) = {cap:.3g}: used as is"
        else:
            why = "the ledger's ε could not be recomputed from its (σ, q, steps): the relation's δ is used as is"
        plan.update(delta=rel_delta, epsilon=rel_eps, accountant_delta=delta, why=why)
    else:
        if unit == "client":
            comp_eps, d_prime = replacement_epsilon_at(history, cap, acct)
        else:
            comp_eps, d_prime = _epsilon(history, cap, acct), cap
        plan.update(delta=cap, epsilon=comp_eps, accountant_delta=d_prime,
                    why=f"δ = level/(4m) = {cap:.3g} < the relation's δ {rel_delta:.3g}, so the δ term uses at most half "
                        "the level; compared with the accountant's ε at that δ"
                        + ("" if math.isfinite(comp_eps) else " (∞: no δ' makes (1 + e^ε(δ'))·δ' that small)"))  # fmt: skip
    plan["vacuous"] = vacuous(m=m, delta=plan["delta"], level=level)
    plan["gdp"] = gdp_plan(unit=unit, history=history, rel_eps=rel_eps, rel_delta=rel_delta, ledger_delta=delta)
    if plan["vacuous"]:
        plan["why"] += (f"; vacuous: with m = {m}, for every k in {guess_counts(m)} even 2k right guesses of 2k cannot "
                        f"reject ε = 0 at level {level:.3g}, so the bound is 0 whatever the run")  # fmt: skip
    return plan


def gdp_plan(*, unit: str, history, rel_eps: float, rel_delta: float, ledger_delta: float) -> dict:
    """What the f-DP (Gaussian) bound is compared with: the relation's own (ε, δ) (its ε(μ) is converted at that δ,
    no audit δ is needed: the GDP test has none), and, for a ledger of full-batch Gaussians only, the exact μ
    (add/remove √(Σ steps/σ²); ×2 for a client's replacement: the replaced update moves by up to twice the clip)."""
    mu = gdp_mu_of_ledger(history) if math.isfinite(rel_eps) else None
    if mu is not None and unit == "client":
        mu = 2.0 * mu
    delta = rel_delta if rel_delta > 0 else (ledger_delta if ledger_delta > 0 else 1e-5)
    return {"delta": delta, "epsilon": rel_eps, "accountant_mu": mu}


def replay_plan(plan: RunPlan) -> RunPlan:
    """The noise-free replay's plan: ``plan`` without attacks (so without canaries) and with every configured DP
    noise multiplier at 1e-9 (no ε target to calibrate one from)."""
    from protocols.config_sections import PrivacyConfig
    from secure_fed.plugin_api.attacks import plan_variant

    privacy = plan.part(PrivacyConfig)
    overrides = ["attacks={run: []}", "output.progress=false", "output.tensorboard=false"]
    for block in ("instance", "local", "client"):
        if getattr(privacy, block) is not None:
            overrides += [f"privacy.{block}.noise_multiplier=1e-9", f"privacy.{block}.target_epsilon=null"]
    return plan_variant(plan, overrides)


def noise_free_replay(ctx) -> dict:
    """The auditor's reference model: the same run (config, data, seed) without the canaries and with every DP noise
    multiplier at 1e-9, trained in a temporary directory. DP's adversary may know every training instance but the
    canaries; subtracting this model leaves each canary's coordinate with the canary, the noise, and what the run's
    secret sampling changed (nothing for full batches)."""
    import tempfile

    from secure_fed.plugin_api.attacks import build_experiment
    from threat_models.context import AuditContext

    plan = replay_plan(ctx.plan)
    with tempfile.TemporaryDirectory(prefix="secure-fed-audit-replay-") as tmp:
        exp = build_experiment(plan, run_dir=Path(tmp) / "run", dataset=ctx.dataset)
        exp.run(progress=False)
        view = AuditContext(exp).observer_view()  # the replay's released model, rows in label order as the run's
    return {"theta": view.theta, "W": view.W}


class OneRunAudit(Attack):
    spec = SPEC

    def applies(self, ctx) -> str | None:
        if ctx.inserted(self.name) is None:
            return "no canaries were inserted (set attacks.run to include one_run_audit, canaries > 0, before training)"
        return None

    def prepare(self, ctx):
        c = ctx.inserted(self.name)
        st = c.state_dict()
        secret = {k: v for k, v in st.items() if k != "included"}  # the guess must not read the bits
        from threat_models.canaries import DiracCanaries

        unit = getattr(c, "unit", "client")
        report = ctx.privacy().get("units", {}).get(unit)
        plan = audit_plan(m=int(c.m), confidence=self.options.confidence, unit=unit, report=report)
        reference = noise_free_replay(ctx) if self.options.reference == "noise_free_replay" else None
        plan["reference"] = self.options.reference
        return {"canaries": DiracCanaries.from_state_dict({**secret, "included": None}), "reference": reference}, {
            "included": st["included"], "plan": plan, "confidence": self.options.confidence,
        }  # fmt: skip

    def run(self, view, aux):
        ref = aux.get("reference")
        if ref is None:
            scores = aux["canaries"].scores(view.theta, view.theta0, view.W)
        else:  # the replay's model in place of the initial one: the data's own update cancels
            scores = aux["canaries"].scores(view.theta, ref["theta"], view.W, W_ref=ref["W"])
        return {"scores": scores}

    def score(self, guess, truth):
        s, inc = guess["scores"], np.asarray(truth["included"], bool)
        m = len(s)
        plan = truth["plan"]
        delta, level, ks = plan["delta"], plan["level"], guess_counts(m)
        order = np.argsort(-s, kind="stable")
        best = {"epsilon_lower_bound": 0.0, "guesses": 0, "correct": 0, "k": 0}
        at_relation = 0.0  # Steinke et al.'s bound at the relation's own δ (0 whatever the guesses when vacuous there)
        best_gdp = {"mu": 0.0, "guesses": 0, "correct": 0, "k": 0}
        for k in ks:
            top, bottom = order[:k], order[m - k :]
            v = int(inc[top].sum() + (~inc[bottom]).sum())
            lb = epsilon_lower_bound(m=m, r=2 * k, v=v, delta=delta, level=level)
            at_relation = max(at_relation, epsilon_lower_bound(m=m, r=2 * k, v=v, delta=plan["relation_delta"], level=level))
            if lb > best["epsilon_lower_bound"]:
                best = {"epsilon_lower_bound": lb, "guesses": 2 * k, "correct": v, "k": k}
            mu = gdp_mu_lower_bound(m=m, r=2 * k, v=v, level=level)
            if mu > best_gdp["mu"]:
                best_gdp = {"mu": mu, "guesses": 2 * k, "correct": v, "k": k}
        lb = best["epsilon_lower_bound"]
        gdp = plan["gdp"]
        mu_lb = best_gdp["mu"]
        eps_gdp = epsilon_from_gdp(mu_lb, gdp["delta"])
        acct_mu = gdp["accountant_mu"]
        gdp_exceeds = bool(eps_gdp > gdp["epsilon"] or (acct_mu is not None and mu_lb > acct_mu))
        return AttackResult(
            attack=self.name, role=self.role.value,
            metrics={"epsilon_lower_bound": lb, "epsilon_lower_bound_at_relation_delta": at_relation,
                     "accountant_epsilon": plan["ledger_epsilon"],
                     "replacement_epsilon": plan["epsilon"], "exceeds_accountant": bool(lb > plan["epsilon"]),
                     "vacuous": plan["vacuous"], "gdp_mu_lower_bound": mu_lb, "epsilon_lower_bound_gdp": eps_gdp,
                     "relation_epsilon": gdp["epsilon"], "gdp_exceeds_accountant": gdp_exceeds},
            chance={"epsilon_lower_bound": 0.0, "gdp_mu_lower_bound": 0.0, "epsilon_lower_bound_gdp": 0.0},
            details={"canaries": m, "inserted": int(inc.sum()), "confidence": truth["confidence"], "delta": delta,
                     "unit": plan["unit"], "audit_delta": {k: v for k, v in plan.items() if k not in ("unit", "gdp")},
                     "k_tried": ks, **{k: v for k, v in best.items() if k != "epsilon_lower_bound"},
                     "gdp": {"method": "Mahloujifar, Melis & Chaudhuri 2024: μ-GDP rejected by the f-DP one-run test",
                             "confidence": truth["confidence"], "level_per_k": level, "relation": plan["relation"],
                             "delta": gdp["delta"], "relation_epsilon": gdp["epsilon"], "accountant_mu": acct_mu,
                             "epsilon_at_audit_delta": epsilon_from_gdp(mu_lb, delta) if delta > 0 else None,
                             "note": "ε at the relation's δ of the largest rejected μ: a lower bound for a Gaussian "
                                     "trade-off curve (full-batch Gaussian sums), an estimate otherwise",
                             **{k: v for k, v in best_gdp.items() if k != "mu"}}},
        )  # fmt: skip
