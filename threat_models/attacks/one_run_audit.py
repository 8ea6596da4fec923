"""Audit (e): a one-run empirical ε lower bound (Steinke, Nasr & Jagielski 2023).

m Dirac canaries (:mod:`threat_models.canaries`) are each inserted with
probability ½. After training the auditor scores every canary,
``s_i·(θ_T − θ_0)[j_i]``, guesses "inserted" for the k highest and "not
inserted" for the k lowest, and abstains on the rest. If the training run is
(ε, δ)-DP with respect to each canary, the number of correct guesses among the
r = 2k is dominated as in the paper's Theorem 5.2:

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
changes, and the p-value's δ term uses that δ. A run without client-level DP has
ε = ∞ for θ. Under DP-SGD in client training the canaries are instances (gradient canaries, see
:mod:`threat_models.canaries`) and the bound is compared with the instance unit's (ε, δ) as is: flipping
a canary adds or removes one instance.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from threat_models.base import Attack, AttackResult
from threat_models.specs import ONE_RUN_AUDIT


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


class OneRunAudit(Attack):
    spec = ONE_RUN_AUDIT

    def applies(self, ctx) -> str | None:
        if ctx.canaries is None:
            return "no canaries were inserted (set attacks.run to include one_run_audit, canaries > 0, before training)"
        return None

    def prepare(self, ctx):
        c = ctx.canaries
        st = c.state_dict()
        secret = {k: v for k, v in st.items() if k != "included"}  # the guess must not read the bits
        from threat_models.canaries import DiracCanaries

        priv = ctx.privacy()
        units = priv.get("units", {})
        client = units.get("client")
        acct = {"epsilon": math.inf, "delta": 0.0, "replacement_epsilon": math.inf, "replacement_delta": 0.0}
        if getattr(c, "unit", "client") == "instance":
            # instance canaries: flipping a bit adds or removes one instance, the instance unit's own relation
            inst = units.get("instance")
            eps = float(inst["epsilon"]) if inst else math.inf
            delta = float(inst["delta"]) if inst else 0.0
            acct = {"epsilon": eps, "delta": delta, "replacement_epsilon": eps, "replacement_delta": delta, "unit": "instance"}
        elif client:
            eps, delta = float(client["epsilon"]), float(client["delta"])
            acct = {"epsilon": eps, "delta": delta, **dict(zip(("replacement_epsilon", "replacement_delta"),
                                                                 replacement_privacy(eps, delta), strict=True))}  # fmt: skip
        return {"canaries": DiracCanaries.from_state_dict({**secret, "included": None})}, {
            "included": st["included"], "accountant": acct, "confidence": self.options.confidence,
        }  # fmt: skip

    def run(self, view, aux):
        scores = aux["canaries"].scores(view.theta, view.theta0)
        return {"scores": scores}

    def score(self, guess, truth):
        s, inc = guess["scores"], np.asarray(truth["included"], bool)
        m = len(s)
        acct = truth["accountant"]
        bound_eps = acct["replacement_epsilon"]
        delta = acct["replacement_delta"] if math.isfinite(bound_eps) else 0.0
        ks = sorted({k for k in (m // 50, m // 20, m // 10, m // 5, m // 2) if k >= 1})
        level = (1.0 - truth["confidence"]) / max(len(ks), 1)
        order = np.argsort(-s, kind="stable")
        best = {"epsilon_lower_bound": 0.0, "guesses": 0, "correct": 0, "k": 0}
        for k in ks:
            top, bottom = order[:k], order[m - k :]
            v = int(inc[top].sum() + (~inc[bottom]).sum())
            lb = epsilon_lower_bound(m=m, r=2 * k, v=v, delta=delta, level=level)
            if lb > best["epsilon_lower_bound"]:
                best = {"epsilon_lower_bound": lb, "guesses": 2 * k, "correct": v, "k": k}
        lb = best["epsilon_lower_bound"]
        return AttackResult(
            attack=self.name, role=self.role.value,
            metrics={"epsilon_lower_bound": lb, "accountant_epsilon": acct["epsilon"],
                     "replacement_epsilon": bound_eps, "exceeds_accountant": bool(lb > bound_eps)},
            chance={"epsilon_lower_bound": 0.0},
            details={"canaries": m, "inserted": int(inc.sum()), "confidence": truth["confidence"], "delta": delta,
                     "unit": acct.get("unit", "client"),
                     "k_tried": ks, **{k: v for k, v in best.items() if k != "epsilon_lower_bound"}},
        )  # fmt: skip
