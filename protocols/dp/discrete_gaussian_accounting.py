"""The Poisson-subsampled discrete Gaussian's RDP, with its proof (exact at integer orders); and Zhu & Wang's bound.

**The mechanism.** Every release is snap(S) + γ·Z (:mod:`protocols.dp.discrete_gaussian`): in grid units an
integer vector u plus Z ~ N_Z(0, s²I_d), the discrete Gaussian on Z^d (P(z) ∝ exp(−‖z‖²/(2s²))), s = σR with R the
grid-corrected sensitivity (Δ + γ√d)/γ and σ the ledger's noise multiplier. Under Poisson sampling at rate q and
add/remove neighbours D' = D ∪ {x}, fix the others' sample: the outputs are P0 = N_Z(u, s²I) on D and
μ = (1 − q)·P0 + q·P1, P1 = N_Z(u + v, s²I), on D', where v = snap(S + g_x) − snap(S) ∈ Z^d has ‖v‖ ≤ R.

**Theorem.** For every integer α ≥ 2 both Rényi divergences of (M(D), M(D')) are at most

    ε_q(α) = 1/(α−1) · log A_α,   A_α = Σ_{l=0}^{α} C(α,l) (1−q)^{α−l} q^l exp(l(l−1)/(2σ²)),

which is Mironov, Talwar & Zhang's integer-order value for the continuous sampled Gaussian ("Rényi Differential
Privacy of the Sampled Gaussian Mechanism", 2019, §3.3; Opacus's ``_compute_log_a_for_int_alpha``). Step 1 below is
an equality, so a neighbour whose ‖v‖ approaches R approaches it (R = Δ/γ + √d need not be the norm of a lattice
vector): no smaller curve is proven at these orders.

*Step 0 (one pair).* M(D) and M(D') are mixtures, with the same weights, over the others' sample. For α > 1,
exp((α−1)D_α(P‖Q)) = E_Q[(P/Q)^α] is the f-divergence of the convex f(x) = x^α, hence jointly convex (Csiszár 1967;
Liese & Vajda 2006), so D_α of the two mixtures is at most the largest D_α over the components (the joint
quasi-convexity of Rényi divergence, van Erven & Harremoës 2014), in each direction. Translation by −u is a
bijection of Z^d that moves P0, P1 together, so take u = 0.

*Step 1 (remove direction, exact).* Let L = P1/P0. A_α := E_{P0}[(μ/P0)^α] = E_{P0}[(1 − q + qL)^α]
= Σ_l C(α,l)(1−q)^{α−l} q^l M_l (binomial theorem, α an integer), M_l = Σ_{x∈Z^d} P0(x)^{1−l} P1(x)^l. Completing
the square, (1−l)‖x‖² + l‖x − v‖² = ‖x − lv‖² − l(l−1)‖v‖², so M_l = exp(l(l−1)‖v‖²/(2s²)) · Σ_x e^{−‖x−lv‖²/(2s²)} / N
with N = Σ_x e^{−‖x‖²/(2s²)} the normaliser of P0 and of P1 (v is a lattice point). lv is a lattice point too, so
x ↦ x − lv is a bijection of Z^d and the sum is N: M_l = exp(l(l−1)‖v‖²/(2s²)), the continuous Gaussian's value.
Every term of A_α grows with ‖v‖, and ‖v‖/s ≤ 1/σ: the worst case is the formula above.

*Step 2 (add direction ≤ remove direction; a lemma for every symmetric pair: P0 even, v a lattice point, so that the
privacy loss is symmetric, P0(L = 1/ℓ) = ℓ·P0(L = ℓ)).* B_α := E_μ[(P0/μ)^α] = E_{P0}[X^{1−α}] with X = μ/P0 = 1 − q + qL, so
A_α − B_α = E_{P0}[φ(X)] with φ(x) = x^α − x^{1−α}. This holds at every real α ≥ 1 and uses only symmetry:
 (a) ρ(x) = v − x is a bijection of Z^d with P0∘ρ = P1 and P1∘ρ = P0 (P0(v − x) ∝ e^{−‖x−v‖²/(2s²)}); hence
     L∘ρ = 1/L and P0(ρx) = L(x)·P0(x).
 (b) Group the (absolutely convergent) sum over the orbits {x, ρx}. An orbit with L = 1 has X = 1 and φ(1) = 0.
     Otherwise name x its point with L(x) = ℓ > 1: with p = P0(x) the orbit adds p·g, where
     g = φ(a) + ℓ·φ(b), a = 1 − q + qℓ ≥ 1 ≥ b = 1 − q + q/ℓ > 0, and (a − 1) + ℓ(b − 1) = 0.
 (c) g ≥ 0. Taylor's theorem with integral remainder at 1 (φ(1) = 0; the first-order terms cancel by (b)):
     g = ∫_1^a φ''(t)(a − t) dt + ℓ∫_b^1 φ''(t)(t − b) dt. Here φ''(t) = α(α−1)(t^{α−2} − t^{−α−1}), which is ≥ 0 for
     t ≥ 1 and satisfies φ''(1/t) = −t³φ''(t). Substituting t = 1/r in the second integral turns it into
     −∫_1^{1/b} φ''(r)(ℓ − c·r) dr with c = ℓb = ℓ(1−q) + q, so
         g = ∫_1^∞ φ''(r) [(a − r)_+ − (ℓ − c·r)_+] dr.
     Since a + c = 1 + ℓ, (a − r) − (ℓ − c·r) = (r − 1)(ℓ − a) = (r − 1)(1 − q)(ℓ − 1) ≥ 0 for r ≥ 1, and y ↦ y_+ is
     non-decreasing, the bracket is ≥ 0 on [1, ∞): g ≥ 0, so B_α ≤ A_α.
Hence D_α(μ‖P0) = log A_α/(α−1) ≥ D_α(P0‖μ), and with Steps 0–1 the theorem follows. (Step 2 is our own argument; we
do not rely on how Mironov et al. prove A_α ≥ B_α for the continuous Gaussian.)

*Sums of shares* (τ > 0). The secure sum of n discrete Gaussian shares is not a discrete Gaussian, but it is
symmetric (P0(−x) = P0(x)), so Steps 0 and 2 hold verbatim; in Step 1 the identity becomes the bound
M_l = exp((l−1)·D_l(P1‖P0)) ≤ exp((l−1)(l/(2σ²) + τ)) for l ≥ 2 (Kairouz, Liu & Steinke, ICML 2021, Thm 1 with
Prop. 14: τ = d·10·Σ_{k=1}^{n−1} exp(−2π²s²·k/(k+1)), :func:`protocols.dp.discrete_gaussian.distributed_tau`), while
M_0 = M_1 = 1 exactly. ``tau`` below is that τ; τ = 0 is the single draw of the theorem.

**Fractional orders.** Step 1 needs an integer α; Step 2 holds at every real α ≥ 1. α ↦ log A_α = log E_{P0}[X^α] is
convex (Hölder: E[X^{λα₀+(1−λ)α₁}] ≤ E[X^{α₀}]^λ·E[X^{α₁}]^{1−λ}), and log A_1 = log E[X] = 0, so for
k < α < k + 1, log A_α ≤ (k + 1 − α)·U_k + (α − k)·U_{k+1} with U_k any upper bound of log A_k (U_1 = 0): the ledger's
fractional orders (Opacus's 1.1 … 10.9) carry that value. Without sampling (q = 1, τ = 0) the curve is α/(2σ²) at
every real α (Canonne, Kamath & Steinke, NeurIPS 2020, Thm 4/15). Opacus's continuous value at a fractional order
with q < 1 is not claimed for the discrete mechanism, and is not an upper bound in general: at α = 1.1, q = 0.01,
σ = 0.233 (v = 3, s = 0.7) the lattice sum gives 0.069301 against the continuous 0.069018 (tested). (At the integer
orders no cap by the unsampled curve is needed: A_α is a weighted mean of the M_l ≤ e^{(α−1)(α/(2σ²) + τ)}, so the
curve is at most α/(2σ²) + τ by construction.)

**Checks** (``tests/protocols/test_discrete_gaussian_accounting.py``): A_α and B_α summed over the lattice by brute
force (d = 1, 2, 3, several v of one norm) against the formula and B_α ≤ A_α; the formula against Opacus and
dp-accounting at integer orders; the interpolation at fractional orders against the lattice sums.
``python benchmarks/discrete_gaussian_exact.py`` runs the wider study (σ 0.7–5, q 0.01–1, α 2–64, d ≤ 3).

**Zhu & Wang's general bound.** :func:`poisson_subsampled_rdp` is Theorem 6 of Zhu & Wang, "Poisson Subsampled
Rényi Differential Privacy" (ICML 2019), for *any* mechanism with RDP curve ε(·) at integer orders (both directions):

    ε_q(α) ≤ 1/(α−1) · log[ (1−q)^{α−1}(αq − q + 1) + C(α,2) q² (1−q)^{α−2} e^{ε(2)}
                            + 3 Σ_{ℓ=3}^{α} C(α,ℓ) (1−q)^{α−ℓ} q^ℓ e^{(ℓ−1)ε(ℓ)} ],

computed in log space, capped by ε(α), and replaced by its minimum over the larger given orders. Over the discrete
Gaussian's curve α/(2σ²) (Canonne, Kamath & Steinke, NeurIPS 2020, Thm 4/15) it was the ledger's proven bound
before the theorem above (:func:`zhu_wang_discrete_gaussian_rdp`; 5.37 against 3.99 on Bibtex's W step); the factor 3
pays for mechanisms without the symmetry of Step 2.

**(ε, δ).** Steps compose by adding RDP curves (Mironov 2017, Prop. 1); the conversion is Opacus's
``get_privacy_spent`` (Balle et al. 2020, Thm 21) over the orders.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache

import numpy as np
from opacus.accountants import RDPAccountant
from opacus.accountants.analysis import rdp as privacy_analysis
from scipy.special import gammaln

#: the Rényi orders of the ledger (:data:`protocols.dp.mechanisms.RDP_ORDERS` is this grid): Opacus's defaults
#: (1.1 … 63) and larger ones. At strong noise and few steps (σ 20 at q 1 after one round; σ 3 at q 0.01 after 10
#: steps) the best order lies past 63, where Opacus warns "Optimal order is the largest alpha" and its ε is needlessly
#: loose; up to 8192 the optimum lies inside the grid for every ε above log(1/δ)/8191 (0.0014 at δ 1e-5). Adding
#: orders only lowers the minimum. The fractional ones carry the proven values of "Fractional orders" above.
LEDGER_ORDERS: tuple[float, ...] = (
    *(float(a) for a in RDPAccountant.DEFAULT_ALPHAS),
    *(float(a) for a in range(64, 128, 4)),
    *(128.0, 160.0, 192.0, 256.0, 320.0, 384.0, 512.0, 768.0, 1024.0, 1536.0, 2048.0, 4096.0, 8192.0),
)

#: the integer orders 2..256 (Zhu & Wang's theorem holds at integer orders only)
INTEGER_ORDERS: tuple[int, ...] = tuple(range(2, 257))


def _log_binom(n: int, k: np.ndarray) -> np.ndarray:
    k = np.asarray(k, dtype=float)
    return gammaln(n + 1.0) - gammaln(k + 1.0) - gammaln(n - k + 1.0)


def _check_orders(orders: Iterable) -> list[int]:
    out = []
    for a in orders:
        if not (float(a) == int(a) and int(a) >= 2):
            raise ValueError(f"the Poisson-subsampled bound holds at integer orders α ≥ 2, not {a}")
        out.append(int(a))
    return out


def _check_real_orders(orders: Iterable) -> list[float]:
    out = [float(a) for a in orders]
    bad = [a for a in out if not (a > 1.0 and math.isfinite(a))]
    if bad:
        raise ValueError(f"Rényi orders must be finite and > 1, not {bad[0]}")
    return out


def _suffix_min(alphas: list, values: np.ndarray) -> np.ndarray:
    """RDP is non-decreasing in α, so ε(α) ≤ the bound at any larger order: the suffix minimum over the orders."""
    order = np.argsort(alphas)
    out = values.copy()
    out[order] = np.minimum.accumulate(values[order][::-1])[::-1]
    return out


def _log_a(sigma: float, q: float, a: int, tau: float) -> float:
    """log A_α of the theorem (τ = 0) or its sum-of-shares bound (τ > 0), 0 < q < 1. The binomial weights sum to 1 and
    M_0 = M_1 = 1, so A_α = 1 + Σ_{l≥2} w_l (M_l − 1): a log-sum-exp of positive terms (M_l − 1 by expm1), then log1p,
    keeping full relative precision where A_α is close to 1 (σ 20 at q 0.01: RDP ≈ 1e-7)."""
    ell = np.arange(2, a + 1, dtype=float)
    expo = (ell - 1.0) * (ell / (2.0 * sigma * sigma) + tau)  # log M_l (or its bound), > 0
    log_m_minus_1 = expo + np.log(-np.expm1(-expo))  # log(e^x − 1) = x + log(1 − e^−x)
    t = _log_binom(a, ell) + (a - ell) * math.log1p(-q) + ell * math.log(q) + log_m_minus_1
    m = float(t.max())
    return float(np.logaddexp(0.0, m + math.log(float(np.exp(t - m).sum()))))


@lru_cache(maxsize=4096)
def _curve(sigma: float, q: float, tau: float, orders: tuple[float, ...]) -> tuple[float, ...]:
    if q == 1.0 and tau == 0.0:  # CKS 2020: α/(2σ²) at every real order
        return tuple(a / (2.0 * sigma * sigma) for a in orders)
    u: dict[int, float] = {1: 0.0}  # U_k ≥ log A_k; U_1 = log E[X] = 0

    def bound(k: int) -> float:
        if k not in u:
            u[k] = (k - 1) * (k / (2.0 * sigma * sigma) + tau) if q == 1.0 else _log_a(sigma, q, k, tau)
        return u[k]

    out = []
    for a in orders:
        k = math.floor(a)
        lam = (k + 1) - a  # log A_α ≤ λ·U_k + (1 − λ)·U_{k+1} (log-convexity); λ = 1 at an integer
        log_a = bound(k) if lam == 1.0 else lam * bound(k) + (1.0 - lam) * bound(k + 1)
        out.append(log_a / (a - 1.0))
    return tuple(out)


def discrete_gaussian_subsampled_rdp(sigma: float, q: float, orders: Sequence = LEDGER_ORDERS, tau: float = 0.0) -> np.ndarray:
    """The module's theorem: the RDP, both directions, of one Poisson-subsampled (rate ``q``) discrete Gaussian step
    with noise multiplier ``sigma`` (std over the integer sensitivity), at ``orders`` (real, > 1). At an integer order
    with ``tau`` = 0 it is Mironov–Talwar–Zhang's integer-order value (exact, approached as ‖v‖ → R); at a fractional order the
    log-convex interpolation of its integer neighbours (α/(2σ²) itself at q = 1); with Kairouz–Liu–Steinke's ``tau``
    (a sum of shares) an upper bound. q = 0: 0; σ = 0: ∞ (q > 0)."""
    if not (sigma >= 0.0 and math.isfinite(sigma)) or not (tau >= 0.0 and math.isfinite(tau)):
        raise ValueError(f"σ {sigma} and τ {tau} must be finite and ≥ 0")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"sampling rate q must be in [0, 1], not {q}")
    orders = tuple(_check_real_orders(orders))
    if q == 0.0:
        return np.zeros(len(orders))
    if sigma == 0.0:
        return np.full(len(orders), math.inf)
    return np.array(_curve(float(sigma), float(q), float(tau), orders))


def poisson_subsampled_rdp(base_rdp: Callable[[int], float], q: float, orders: Iterable) -> np.ndarray:
    """Zhu & Wang 2019, Theorem 6: the RDP of the Poisson subsample (rate ``q``) of any mechanism whose RDP at
    integer order ℓ is ``base_rdp(ℓ)``, at each integer order in ``orders`` (α ≥ 2), in log space, capped by the base
    curve."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"sampling rate q must be in [0, 1], not {q}")
    alphas = _check_orders(orders)
    out = np.empty(len(alphas))
    for i, a in enumerate(alphas):
        base = float(base_rdp(a))
        if q == 0.0:
            out[i] = 0.0
            continue
        if q == 1.0 or math.isinf(base):
            out[i] = base
            continue
        lq, l1q = math.log(q), math.log1p(-q)
        terms = [(a - 1) * l1q + math.log1p((a - 1) * q)]  # (1−q)^{α−1}(αq − q + 1)
        terms.append(_log_binom(a, np.array([2]))[0] + 2 * lq + (a - 2) * l1q + float(base_rdp(2)))
        if a >= 3:
            ell = np.arange(3, a + 1)
            eps = np.array([float(base_rdp(int(j))) for j in ell])
            terms.extend(math.log(3.0) + _log_binom(a, ell) + (a - ell) * l1q + ell * lq + (ell - 1) * eps)
        t = np.array(terms)
        m = float(t.max())
        log_sum = m + math.log(float(np.exp(t - m).sum()))
        out[i] = min(base, log_sum / (a - 1))
    return _suffix_min(alphas, out)


def zhu_wang_discrete_gaussian_rdp(sigma: float, q: float, orders: Sequence = INTEGER_ORDERS, tau: float = 0.0) -> np.ndarray:
    """The earlier, looser proven curve: Zhu–Wang's Theorem 6 over the base curve α/(2σ²) + ``tau`` (CKS 2020;
    ``tau`` as in :func:`discrete_gaussian_subsampled_rdp`). σ = 0: ∞ at every order."""
    if not (sigma >= 0.0 and math.isfinite(sigma)) or not (tau >= 0.0 and math.isfinite(tau)):
        raise ValueError(f"σ {sigma} and τ {tau} must be finite and ≥ 0")
    orders = tuple(_check_orders(orders))
    if sigma == 0.0:
        return np.full(len(orders), math.inf) if q > 0 else np.zeros(len(orders))
    return poisson_subsampled_rdp(lambda a: a / (2.0 * sigma * sigma) + tau, q, orders)


def discrete_gaussian_epsilon(
    history: Iterable[tuple[float, float, int]], delta: float, tau: float = 0.0, orders: Sequence = LEDGER_ORDERS
) -> float:
    """ε at ``delta`` of a ledger history [(σ, q, steps), …] of discrete Gaussian steps under the theorem: the steps'
    curves (:func:`discrete_gaussian_subsampled_rdp`, ``tau`` per step) added, then Opacus's ``get_privacy_spent``
    over ``orders``."""
    orders = tuple(_check_real_orders(orders))
    rdp = np.zeros(len(orders))
    for sigma, q, steps in history:
        if steps:
            rdp = rdp + int(steps) * discrete_gaussian_subsampled_rdp(sigma, q, orders, tau)
    if not np.isfinite(rdp).any():
        return math.inf
    eps, _ = privacy_analysis.get_privacy_spent(orders=list(orders), rdp=rdp, delta=delta)
    return float(eps)


def continuous_epsilon(history: Iterable[tuple[float, float, int]], delta: float,
                       orders: Sequence = LEDGER_ORDERS) -> float:  # fmt: skip
    """The same history's ε under Opacus's continuous subsampled-Gaussian RDP at ``orders`` (the analysis the ledger
    used before the theorem; at integer orders its curve is the theorem's where Opacus's sums stay finite: they
    overflow to nan from α ≈ 1536 at q < 1, and ``get_privacy_spent`` skips those orders)."""
    orders = [float(a) for a in orders]
    rdp = np.zeros(len(orders))
    for sigma, q, steps in history:
        if steps:
            rdp = rdp + privacy_analysis.compute_rdp(q=q, noise_multiplier=sigma, steps=int(steps), orders=orders)
    eps, _ = privacy_analysis.get_privacy_spent(orders=orders, rdp=rdp, delta=delta)
    return float(eps)


__all__ = [
    "INTEGER_ORDERS", "LEDGER_ORDERS", "continuous_epsilon", "discrete_gaussian_epsilon",
    "discrete_gaussian_subsampled_rdp", "poisson_subsampled_rdp", "zhu_wang_discrete_gaussian_rdp",
]  # fmt: skip
