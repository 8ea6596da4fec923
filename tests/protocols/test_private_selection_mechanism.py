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


def proven_rdp(sigma: float, q: float, steps: int) -> np.ndarray:
    """The runs' curve, written out: Opacus's subsampled-Gaussian RDP ε(k) at the integer orders (every order at q = 1)
    and, at a fractional order α between k and k + 1 with q < 1, (α−1)ε(α) = (k+1−α)(k−1)ε(k) + (α−k)·k·ε(k+1)
    (the discrete Gaussian's proven curve: protocols/dp/discrete_gaussian_accounting.py)."""
    if q >= 1.0:
        return privacy_analysis.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=list(ORDERS))
    needed = sorted({k for a in ORDERS for k in (math.floor(a), math.floor(a) + 1)} - {1})
    at = {1: 0.0, **dict(zip(needed, privacy_analysis.compute_rdp(q=q, noise_multiplier=sigma, steps=steps, orders=needed),
                             strict=True))}  # fmt: skip
    out = []
    for a in ORDERS:
        k, lam = math.floor(a), math.floor(a) + 1 - a
        out.append(at[k] if lam == 1 else (lam * (k - 1) * at[k] + (1 - lam) * k * at[k + 1]) / (a - 1))
    return np.asarray(out)


def test_its_curve_is_theorem_2_over_the_largest_candidate_curve():
    h1, h2 = [(1.1, 0.05, 200)], [(0.9, 0.05, 120), (2.0, 1.0, 3)]
    eta, gamma, delta = 1.0, 0.2, 1e-5
    lam = np.asarray(ORDERS)
    c1 = proven_rdp(1.1, 0.05, 200)
    c2 = proven_rdp(0.9, 0.05, 120) + proven_rdp(2.0, 1.0, 3)
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
