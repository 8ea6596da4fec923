"""The client unit under ``privacy.client.mechanism: banded`` (banded matrix factorisation,
:mod:`protocols.dp.banded_mf`): its declared mechanism, its ledger, its config rules and its plan line.

Accounting: after t rounds the released y_0 … y_{t−1} = (C x̄ + z)[:t] are one Gaussian mechanism of sensitivity
sens(t)·(C + γ√d) against noise std σ·(C + γ√d) per row (:func:`protocols.dp.banded_mf.sensitivity`, Choquette-Choo et
al. 2023, Theorem 2, its conditions checked: bands ≤ the cyclic period), i.e. one Gaussian of noise multiplier
σ/sens(t) — held in the ledger as one step at (σ/sens(t), q = 1). No amplification by sampling is claimed: the cyclic
schedule is public. The discrete Gaussian on the lattice has the same RDP bound αΔ²/(2σ²) (Canonne, Kamath & Steinke
2020, Thm 15), so the RDP ledger is proven; PRV and PLD are the continuous Gaussian's (the project's standing note).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from protocols.dp.accountant import PrivacyUnit, calibrate_sigma
from protocols.dp.banded_mf import band_coefficients, lattice_bits, max_column_norm, participations, sensitivity, theorem_error
from protocols.dp.group_bound import gaussian_rdp, substitution_sensitivity
from protocols.dp.mechanisms import ORDERS, _ClientGaussian, register_mechanism
from secure_fed.plugin_api.layers import ConfigError, cyclic_period

if TYPE_CHECKING:
    from protocols.config_sections import ClientDPConfig, PrivacyConfig
    from protocols.layer_settings import TrainingFacts
    from secure_fed.plugin_api.layers import TrainingPlan

    Training = TrainingPlan | TrainingFacts  #: the plan's training part, or the dp layer's facts of it

#: the mechanism's name, as the report and the validate line give it
NAME = "banded matrix factorisation (DP-FTRL with correlated noise, Choquette-Choo et al. 2023)"


@register_mechanism
class ClientBanded(_ClientGaussian):
    """``privacy.client.mechanism: banded``: the server releases x_t + ẑ_t, ẑ = C^{-1}z for the b-banded square-root
    strategy C, every client in the rounds of its cyclic group; the run is one Gaussian of multiplier σ/sens."""

    kind, noise_by, sample_known_to_server = "client_banded", "server", True
    allows_noiseless = False  # its ledger is one Gaussian at σ/sens

    def __init__(self, *, bands: int, period: int, **kw):
        self.bands, self.period = int(bands), int(period)
        if why := theorem_error(self.bands, self.period):
            raise ValueError(why)
        super().__init__(**kw)

    def sensitivity(self, steps: int | None = None) -> float:
        """sens after ``steps`` rounds (default: the steps it holds), in clip norms."""
        return sensitivity(self.steps if steps is None else steps, self.bands, self.period)

    def history(self, *, sample_rate: float | None = None) -> list[tuple[float, float, int]]:
        """One Gaussian at σ/sens (q = 1 whatever the adversary: nothing is subsampled)."""
        return [(self.sigma / self.sensitivity(), 1.0, 1)] if self.steps else []

    def rdp(self, orders=ORDERS, *, sample_rate: float | None = None) -> np.ndarray:
        return gaussian_rdp(self.sensitivity() / self.sigma, orders) if self.steps else np.zeros(len(orders))

    def group_rdp(self, orders=ORDERS, *, group: int, sample_rate: float | None = None, population: int | None = None,
                  cohort: int | None = None) -> np.ndarray:  # fmt: skip
        """An instance on ``group`` clients, each substituted: by the triangle inequality the shift of C·x̄ is at most
        2·group·sens (whatever the clients' groups), a Gaussian at that sensitivity."""
        if not self.steps:
            return np.zeros(len(orders))
        return gaussian_rdp(substitution_sensitivity(group) * self.sensitivity() / self.sigma, orders)

    def report(self) -> dict[str, object]:
        return {**super().report(), "bands": self.bands, "period": self.period, "sensitivity": self.sensitivity()}


class BandedUnit(PrivacyUnit):
    """A :class:`~protocols.dp.accountant.PrivacyUnit` whose history after t rounds is the one Gaussian (σ/sens(t), 1, 1)."""

    def __init__(self, *, bands: int, period: int, **kw: Any):
        self.bands, self.period = int(bands), int(period)
        super().__init__(kind=ClientBanded.kind, mechanism_options={"bands": self.bands, "period": self.period}, **kw)

    def _history_after(self, steps: dict[str, int]) -> list[tuple[float, float, int]]:
        m = self.mechanism()
        t = m.steps + max(0, int(steps.get(m.name, 0)))
        return [(m.sigma / sensitivity(t, self.bands, self.period), 1.0, 1)] if t else []

    def report(self) -> dict[str, Any]:
        out = super().report()
        t = self.steps
        sens = sensitivity(t, self.bands, self.period) if t else 0.0
        out["banded"] = {
            "name": NAME,
            "strategy": "the square root of the prefix-sum workload, c_k = binom(2k,k)/4^k, truncated to the bands "
            "(not re-optimised)",
            "bands": self.bands,
            "coefficients": [float(c) for c in band_coefficients(self.bands)],
            "participation": f"cyclic: client c in the rounds r ≡ c (mod {self.period}) (public; no amplification)",
            "period": self.period,
            "participations": participations(t, self.period),
            "max_column_norm": max_column_norm(t, self.bands) if t else 0.0,
            "sensitivity": sens,
            "effective_noise_multiplier": self.sigma / sens if t else None,
            "zcdp_rho": sens**2 / (2.0 * self.sigma**2),
            "lattice_bits": lattice_bits(self.bands),
            "theorem": "Choquette-Choo et al. 2023, Theorem 2: C lower triangular and b-banded, a client's rounds ≥ b "
            "apart (period ≥ bands) and at most k of them: sens = √k·max‖C[:, i]‖",
        }
        return out


def banded_period(training: Training) -> int:
    """P, the cyclic schedule's period (``training.sampling: cyclic``, P = 1/client_fraction)."""
    period = cyclic_period(training.client_fraction)
    if period is None:
        raise ValueError(f"training.client_fraction {training.client_fraction:g} is not 1/P for a whole number P")
    return period


def banded_config_error(client: ClientDPConfig | None, training: Training) -> str | None:
    """Why ``privacy.client`` (``client``) with this ``training`` cannot run the banded mechanism, or None (also
    None for another mechanism)."""
    if client is None or client.mechanism != "banded":
        return None
    head = f"privacy.client.mechanism: banded (bands {client.bands})"
    if training.sampling != "cyclic":
        return (
            f"{head} with training.sampling: {training.sampling}: its sensitivity holds for the public cyclic schedule "
            "(each client's rounds P apart), not a random cohort; set training.sampling: cyclic with client_fraction 1/P"
        )
    if client.noise == "clients":
        return f"{head} with noise: clients: the correlated noise needs the server's state across rounds; use noise: server"
    if client.adaptive_clipping is not None:
        return f"{head} with adaptive_clipping: the sensitivity is for one fixed clip norm across rounds; use one of the two"
    if why := theorem_error(client.bands, banded_period(training)):
        return f"{head}: {why}"
    return None


def banded_options(client: ClientDPConfig | None, training: Training) -> dict[str, int]:
    """The declared mechanism's options (:class:`ClientBanded`) of a run, or {} for another mechanism."""
    if client is None or client.mechanism != "banded":
        return {}
    return {"bands": int(client.bands), "period": banded_period(training)}


def banded_sigma(client: ClientDPConfig, *, delta: float, accountant: str, rounds: int, period: int) -> tuple[float, bool]:
    """(σ, calibrated): the given noise multiplier, or the one whose planned run (σ/sens(rounds)) meets the target."""
    if client.noise_multiplier is not None:
        return float(client.noise_multiplier), False
    if client.target_epsilon is None:
        raise ValueError("privacy.client: give noise_multiplier or target_epsilon")
    eff = calibrate_sigma(target_epsilon=client.target_epsilon, delta=delta, sample_rate=1.0, steps=1, accountant=accountant)
    return eff * sensitivity(rounds, int(client.bands or 0), period), True


def banded_client_unit(*, client: ClientDPConfig, training: Training, delta: float, accountant: str, scope: str,
                       not_covered: list[str], report_gdp: bool) -> BandedUnit:  # fmt: skip
    """The client unit of a banded run: σ given, or calibrated to ``target_epsilon`` over the planned rounds."""
    period = banded_period(training)
    sigma, calibrated = banded_sigma(client, delta=delta, accountant=accountant, rounds=training.rounds, period=period)
    return BandedUnit(
        bands=int(client.bands or 0), period=period, name="client", scope=scope, sigma=sigma, sample_rate=1.0, delta=delta,
        accountant=accountant, target_epsilon=client.target_epsilon, clip_norm=client.clip_norm, calibrated=calibrated,
        planned_steps=training.rounds, not_covered=not_covered, report_gdp=report_gdp,
    )  # fmt: skip


def banded_plan_line(p: PrivacyConfig, training: Training) -> tuple[str, tuple[float, float, int]]:
    """``validate``'s line for the client unit of a banded run (``p``: the privacy section), and its planned (σ, q,
    rounds) for the run's graph."""
    from protocols.dp.accountants import epsilon_of

    c, rounds, period = p.client, training.rounds, banded_period(training)
    try:
        sigma, calibrated = banded_sigma(c, delta=p.delta, accountant=p.accountant, rounds=rounds, period=period)
    except (ValueError, RuntimeError) as exc:
        raise ConfigError(f"privacy.client.target_epsilon: {exc}") from None
    sens = sensitivity(rounds, c.bands, period)
    history = [(sigma / sens, 1.0, 1)]
    eps = epsilon_of(history, p.delta, p.accountant)
    rdp = epsilon_of(history, p.delta, "rdp")
    goal = f" (target {c.target_epsilon:g})" if c.target_epsilon is not None else ""
    line = (
        f"dp client unit: client update ({NAME}): {c.bands} bands, cyclic period {period} (each client in ≤ "
        f"{participations(rounds, period)} of {rounds} rounds, ≥ {period} apart), sens = √k·max‖C[:, i]‖ = {sens:.4g}; "
        f"σ {sigma:.4g} ({'calibrated' if calibrated else 'given'}), one Gaussian at σ/sens = {sigma / sens:.4g} -> plans "
        f"ε = {eps:.4g}{goal} at δ = {p.delta:g} ({p.accountant}; RDP, proven for the discrete Gaussian: {rdp:.4g}); "
        "no sampling amplification: the schedule is public"
    )
    return line, (sigma, 1.0, rounds)


__all__ = [
    "NAME", "BandedUnit", "ClientBanded", "banded_client_unit", "banded_config_error", "banded_options", "banded_period",
    "banded_plan_line", "banded_sigma",
]  # fmt: skip
