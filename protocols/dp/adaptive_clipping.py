"""Adaptive clipping for client-level DP-FedAvg: the clip norm tracks a quantile of the clients' update norms, the
quantile estimate itself noised and accounted (``privacy.client.adaptive_clipping``).

Andrew, Thakkar, McMahan & Ramaswamy, "Differentially Private Learning with Adaptive Clipping", NeurIPS 2021,
Algorithm 1 (geometric update) and Theorem 1. Round t, clip norm C_t:

* each sampled client i clips its update to C_t and also reports its bit, centred as in the paper,
  b_i = 1[‖Δ_i‖ ≤ C_t] − 1/2 ∈ {−1/2, +1/2} (:func:`clip_bit`); adding or removing a client moves Σ b_i by 1/2;
* the server releases the noisy fraction below C_t,
  b̃ = (Σ_i b_i + N(0, σ_b²)) / m̄ + 1/2, with m̄ = q·N the EXPECTED cohort size (a public constant, never the
  realised count, which is private under Poisson sampling), and the noise drawn from the server's secret stream;
* the next clip norm is C_{t+1} = C_t · exp(−η_C (b̃ − γ)) (γ the target quantile, η_C the learning rate).

Privacy (Theorem 1): the round releases the vector sum with noise σ_Δ·C_t (sensitivity C_t) and the bit sum with
noise σ_b (sensitivity 1/2, noise multiplier 2σ_b). Their RDP adds, α/(2σ_Δ²) + α/(2(2σ_b)²) = α/(2σ²), so the
pair is exactly one Gaussian mechanism of noise multiplier σ when

    σ_Δ = (σ^{-2} − (2σ_b)^{-2})^{-1/2},                                                    (Theorem 1)

defined only for σ_b > σ/2 (:func:`update_noise_multiplier`). The ledger charges each round as one subsampled
Gaussian at σ (the configured or calibrated ``noise_multiplier``, the combined one); the update's noise uses σ_Δ > σ.
C_t is a function of released (DP-protected) values and public constants, so it is released too (the privacy record
of every metrics line: ``privacy.client.clip_norm``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from protocols.dp.discrete_gaussian import noisy_sum
from protocols.randomness import SecretStream
from secure_fed.plugin_api.layers import ConfigError

if TYPE_CHECKING:
    from protocols.config_sections import ClientDPConfig

#: the centred bit's values: the sum's sensitivity to one client is 1/2 (Andrew et al., the proof of Theorem 1)
BIT_BELOW, BIT_ABOVE = 0.5, -0.5
#: the sensitivity of the sum of the centred bits
BIT_SENSITIVITY = 0.5
#: the reply key a client's centred bit travels under (popped by the server before the sums)
BIT_KEY = "clip_bit"


def update_noise_multiplier(sigma: float, count_std: float) -> float:
    """σ_Δ = (σ^{-2} − (2σ_b)^{-2})^{-1/2}: the update's noise multiplier that, with std σ_b on the count of centred
    bits, makes one round one Gaussian mechanism of multiplier ``sigma`` (Andrew et al. 2021, Theorem 1). Raises
    ValueError where σ_b ≤ σ/2 (no σ_Δ exists: the count alone would spend the round's budget)."""
    if not (sigma > 0.0 and count_std > 0.0):
        raise ValueError(f"σ {sigma:g} and σ_b {count_std:g} must be positive")
    rest = sigma**-2 - (2.0 * count_std) ** -2
    if not rest > 0.0:
        raise ValueError(
            f"count_noise_multiplier: σ_b {count_std:g} must exceed σ/2 = {sigma / 2:g} (σ = {sigma:g}): the update's "
            "noise multiplier σ_Δ = (σ^-2 − (2σ_b)^-2)^-1/2 (Andrew et al. 2021, Theorem 1) is undefined otherwise"
        )
    return rest**-0.5


def clip_bit(norm: float, clip_norm: float) -> float:
    """A client's centred bit: +1/2 if its update's norm is at most ``clip_norm`` (unclipped), else −1/2."""
    return BIT_BELOW if norm <= clip_norm else BIT_ABOVE


class AdaptiveClip:
    """The server's clip-norm estimate C_t (state: the clip norm of every round opened so far).

    Args:
        initial: C_0 (``privacy.client.clip_norm``).
        target_quantile: γ.
        learning_rate: η_C.
        count_std: σ_b, the std of the noise on the sum of centred bits (0: no noise, for tests only).
        expected_clients: m̄ = q·N, the public divisor.
    """

    def __init__(self, *, initial: float, target_quantile: float, learning_rate: float, count_std: float,
                 expected_clients: float):  # fmt: skip
        if not expected_clients > 0.0:
            raise ValueError(f"expected cohort size {expected_clients:g} must be positive")
        self.target_quantile, self.learning_rate = float(target_quantile), float(learning_rate)
        self.count_std, self.expected_clients = float(count_std), float(expected_clients)
        self.next_clip = float(initial)  #: C of the next round not yet opened
        self.by_round: dict[int, float] = {}  #: round → its C_t (a re-run round gets the same C)

    def open(self, round_idx: int) -> float:
        """C_t of round ``round_idx`` (the same value if the round is run again after a resume)."""
        return self.by_round.setdefault(int(round_idx), self.next_clip)

    def noisy_fraction(self, bit_sum: float, stream: SecretStream | None, label: str) -> float:
        """b̃ = (Σ b_i + N(0, σ_b²)) / m̄ + 1/2 from the sum of centred bits; the noise is the discrete Gaussian on a
        public grid (:func:`~protocols.dp.discrete_gaussian.noisy_sum`, multiplier 2σ_b on sensitivity 1/2) drawn
        from ``stream``, the server's secret."""
        total = torch.tensor([float(bit_sum)], dtype=torch.float64)
        if self.count_std > 0.0:
            total = noisy_sum(total, sigma=self.count_std / BIT_SENSITIVITY, sensitivity=BIT_SENSITIVITY,
                              stream=stream, label=label)  # fmt: skip
        return float(total[0]) / self.expected_clients + 0.5

    def close(self, round_idx: int, bit_sum: float, stream: SecretStream | None, label: str) -> float:
        """The geometric update after round ``round_idx``: C_{t+1} = C_t·exp(−η_C(b̃ − γ)); returns C_{t+1}."""
        b = self.noisy_fraction(bit_sum, stream, label)
        self.next_clip = self.by_round[int(round_idx)] * math.exp(-self.learning_rate * (b - self.target_quantile))
        return self.next_clip

    def state_dict(self) -> dict[str, Any]:
        return {"next_clip": self.next_clip, "by_round": dict(self.by_round)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next_clip = float(state["next_clip"])
        self.by_round = {int(r): float(c) for r, c in state["by_round"].items()}


def adaptive_clip(client: ClientDPConfig, sigma: float, expected_clients: float) -> tuple[AdaptiveClip, float] | None:
    """The run's :class:`AdaptiveClip` and σ_Δ for ``privacy.client`` (section ``client``) at the unit's σ
    (configured or calibrated), or None without ``adaptive_clipping``. A σ_b ≤ σ/2 is a ConfigError (with a
    configured σ, validation refuses it first)."""
    a = client.adaptive_clipping
    if a is None:
        return None
    try:
        update_sigma = update_noise_multiplier(sigma, a.count_noise_multiplier)
    except ValueError as exc:
        raise ConfigError(f"privacy.client.adaptive_clipping.{exc}") from None
    clip = AdaptiveClip(
        initial=client.clip_norm, target_quantile=a.target_quantile, learning_rate=a.learning_rate,
        count_std=a.count_noise_multiplier, expected_clients=expected_clients,
    )  # fmt: skip
    return clip, update_sigma


def released(clip: AdaptiveClip, *, sigma: float, update_sigma: float) -> dict[str, Any]:
    """The client unit's report entry: the released clip norms and the noise split of Theorem 1."""
    return {
        "clip_norm_by_round": [clip.by_round[r] for r in sorted(clip.by_round)],
        "next_clip_norm": clip.next_clip,
        "target_quantile": clip.target_quantile,
        "learning_rate": clip.learning_rate,
        "count_noise_std": clip.count_std,
        "expected_clients": clip.expected_clients,
        "update_noise_multiplier": update_sigma,
        "note": f"Andrew et al. 2021, Theorem 1: update noise σ_Δ = {update_sigma:.6g} and count noise σ_b = "
        f"{clip.count_std:g} (sensitivity 1/2) make each round one Gaussian mechanism at σ = {sigma:.6g}, as charged; "
        "C_t follows from the noisy counts and public constants only, so it is released",
    }
