"""Private selection as a declared, registered mechanism (protocols.dp.private_selection.PrivateSelection): its curve
is Theorem 2's over the candidates' order-wise maximum, recomputed here by hand; it composes runs, so it is the one
study-level kind of the registry."""

from __future__ import annotations

import math

import numpy as np
import pytest
from opacus.accountants.analysis import rdp as privacy_analysis

from protocols.dp.mechanisms import MECHANISMS, run_mechanisms
from protocols.dp.private_selection import ORDERS, PrivateSelection, selection_epsilon


def test_it_is_registered_as_the_one_study_level_kind():
    assert MECHANISMS["private_selection"] is PrivateSelection
    assert "private_selection" not in run_mechanisms()
    d = PrivateSelection(histories=[[(1.0, 0.1, 10)]], eta=1.0, gamma=0.25).declaration()
    assert d["kind"] == "private_selection" and d["level"] == "study" and d["candidates"] == 1


def test_its_curve_is_theorem_2_over_the_largest_candidate_curve():
    h1, h2 = [(1.1, 0.05, 200)], [(0.9, 0.05, 120), (2.0, 1.0, 3)]
    eta, gamma, delta = 1.0, 0.2, 1e-5
    lam = np.asarray(ORDERS)
    c1 = privacy_analysis.compute_rdp(q=0.05, noise_multiplier=1.1, steps=200, orders=list(ORDERS))
    c2 = privacy_analysis.compute_rdp(q=0.05, noise_multiplier=0.9, steps=120, orders=list(ORDERS))
    c2 = c2 + privacy_analysis.compute_rdp(q=1.0, noise_multiplier=2.0, steps=3, orders=list(ORDERS))
    q = np.maximum(c1, c2)
    mean_k = eta * (1 - gamma) / (gamma * (1 - gamma**eta))  # 1/γ at η = 1
    hat = min((1 + eta) * (1 - 1 / lh) * q[i] + (1 + eta) * math.log(1 / gamma) / lh for i, lh in enumerate(lam))
    want = q + hat + math.log(mean_k) / (lam - 1)
    m = PrivateSelection(histories=[h1, h2], eta=eta, gamma=gamma)
    np.testing.assert_allclose(m.rdp(), want, rtol=1e-12)
    eps, _ = privacy_analysis.get_privacy_spent(orders=list(ORDERS), rdp=want, delta=delta)
    assert selection_epsilon([h1, h2], delta=delta, eta=eta, gamma=gamma) == pytest.approx(eps, rel=1e-12)
    assert m.epsilon(delta) > max(
        privacy_analysis.get_privacy_spent(orders=list(ORDERS), rdp=c, delta=delta)[0] for c in (c1, c2)
    )  # selecting costs more than any one run


def test_it_refuses_what_it_cannot_account():
    with pytest.raises(ValueError, match="no candidate"):
        PrivateSelection(histories=[], eta=1.0, gamma=0.5)
    with pytest.raises(ValueError):
        PrivateSelection(histories=[[(1.0, 0.1, 1)]], eta=1.0, gamma=1.5)
    with pytest.raises(NotImplementedError):
        PrivateSelection(histories=[[(1.0, 0.1, 1)]], eta=1.0, gamma=0.5).history()
