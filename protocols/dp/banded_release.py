"""The server's release under ``privacy.client.mechanism: banded`` (:mod:`protocols.dp.banded_mf`), exact on a lattice.

Round t, for each released sum (θ's tensors, and W's rows where they are noised):

1. x̄_t = the clipped sum rounded to the public grid γ (a power of two; :func:`protocols.dp.discrete_gaussian.snap`),
   sensitivity C + γ√d per round as for the Gaussian release;
2. y_t = Σ_{k<b} c_k·x̄_{t−k} + z_t, z_t a discrete Gaussian of std σ·(C + γ√d) on the lattice γ' = γ/2^v
   (:func:`~protocols.dp.banded_mf.lattice_bits`): the c_k are dyadic, so Σ c_k x̄_{t−k} lies on γ'·ℤ and is computed
   exactly in float64 (checked: every term below 2^51 lattice steps), and y_t is exactly γ'·(integer). This is the
   matrix mechanism's release C·x̄ + z, one row a round;
3. the model receives w_t = y_t − Σ_{k≥1} c_k·w_{t−k} (:class:`~protocols.dp.banded_mf.InverseRecursion`): w = C^{-1}y
   = x̄ + ẑ with ẑ = C^{-1}z, the correlated noise, and Σ_{s≤t} w_s = (prefix sum of x̄) + (A·C^{-1}z)_t.

Why y first and not x̄_t + ẑ_t directly: ẑ = C^{-1}z is not on any lattice (C^{-1}'s coefficients are dyadic with
growing denominators), so x̄_t + ẑ_t computed in floating point is not a post-processing of the exact discrete Gaussian
release — and with lattice noise, C·(x̄ + ẑ) mod γ' would reveal C·x̄ mod γ' were C not dyadic. Here the exact release
is y, and w is computed from y alone (a post-processing); the noise the model receives is ẑ_t up to float rounding.

State (the server's, private: it holds un-noised clipped sums): the last b rounds' x̄ and w per sum, O(b·d). It is
checkpointed with the server's secrets (``private/checkpoints/server_secrets.pt``) and a resumed run continues the
recursion exactly; z_t is drawn from the server's secret stream addressed by the round, so a re-run round (an
interrupted one) redraws the same. A round that released nothing (aborted) enters the recursion as x̄ = 0 with its
z drawn: its y is not released, only the later w that use it (a post-processing of valid releases: a zero
contribution is within the bound).
"""

from __future__ import annotations

import torch

from protocols.dp.banded_mf import band_coefficients, lattice_bits
from protocols.dp.client_dp import released_sums
from protocols.dp.discrete_gaussian import grid_noise, snap
from protocols.randomness import SecretStream
from secure_fed.plugin_api.layers import ConfigError

#: the largest grid index a term of Σ c_k x̄_{t−k} (or y_t) may reach: float64 holds integers below 2^53 exactly
MAX_TERM_INDEX = 2.0**51


class BandedNoise:
    """The server's banded-MF state and release (the module's steps 1–3)."""

    def __init__(self, stream: SecretStream, label: str, bands: int, period: int | None = None):
        self.stream, self.label, self.bands = stream, label, int(bands)
        #: the cyclic schedule's period P the sensitivity was derived for (a resume must keep it)
        self.period = period
        self.coeffs = [float(c) for c in band_coefficients(self.bands)]
        self.bits = lattice_bits(self.bands)
        #: round → {sum name → (x̄, w)}: the last ``bands`` rounds (float64, CPU)
        self.rows: dict[int, dict[str, tuple[torch.Tensor, torch.Tensor]]] = {}
        self.next_round = 0  #: the first round not yet in the recursion

    def _row(self, t: int, name: str, xbar: torch.Tensor, std: float, grid: float) -> torch.Tensor:
        """w_t for one sum: y_t exactly on the lattice, then the inverse recursion; records (x̄_t, w_t)."""
        lattice = grid * 2.0**-self.bits
        y = xbar.clone()
        bound = xbar.abs()
        for k, c in enumerate(self.coeffs[1:], start=1):
            if (past := self.rows.get(t - k, {}).get(name)) is not None:
                y += c * past[0]
                bound += c * past[0].abs()
        if y.numel() and float(bound.max()) >= MAX_TERM_INDEX * lattice:
            raise ValueError("banded release: a sum exceeds 2^51 lattice steps; float64 would not hold C·x̄ exactly")
        y += grid_noise(y.numel(), std, lattice, self.stream, f"{self.label} r{t} {name}").reshape(y.shape)
        w = y.clone()
        for k, c in enumerate(self.coeffs[1:], start=1):
            if (past := self.rows.get(t - k, {}).get(name)) is not None:
                w -= c * past[1]
        self.rows.setdefault(t, {})[name] = (xbar, w)
        return w

    def release(self, agg, *, round_idx: int, clip_norm: float, noise_multiplier: float, noise_rows: bool) -> None:
        """This round's release, in place on ``agg``'s sums (θ's, and the rows' with ``noise_rows``): w_t."""
        t = int(round_idx)
        if t < self.next_round - 1:
            raise RuntimeError(f"banded release: round {t} is older than the recursion's last round {self.next_round - 1}")
        sums, grid, std = released_sums(agg, noise_rows=noise_rows, clip_norm=clip_norm, noise_multiplier=noise_multiplier)
        for s in range(self.next_round, t):  # rounds that released nothing: x̄ = 0, their z drawn, nothing released
            for n, v in sums.items():
                self._row(s, n, torch.zeros(v.numel(), dtype=torch.float64), std, grid)
        for n, v in sums.items():  # a re-run of the last round recomputes it from the same rows and draws
            w = self._row(t, n, snap(v.detach().cpu().reshape(-1), grid), std, grid)
            v.copy_(w.reshape(v.shape).to(device=v.device, dtype=v.dtype))
        self.next_round = t + 1
        for r in [r for r in self.rows if r <= t - self.bands]:
            del self.rows[r]

    def state_dict(self) -> dict:
        """The recursion's state (private: un-noised clipped sums)."""
        return {"bands": self.bands, "period": self.period, "next_round": self.next_round,
                "rows": {r: {n: (x.clone(), w.clone()) for n, (x, w) in d.items()} for r, d in self.rows.items()}}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        if int(state["bands"]) != self.bands:
            raise ValueError(f"banded state of {state['bands']} bands, run has {self.bands}")
        if state.get("period") != self.period:
            # the sensitivity √k·max‖C[:,i]‖ needs every client's rounds ≥ b apart over the whole run: a period changed
            # on resume breaks that at the switch (a client could train in rounds closer than b), so it is refused
            raise ConfigError(
                f"resume changes the cyclic period of banded noise from {state.get('period')} to {self.period} "
                "(training.client_fraction): its sensitivity holds for one schedule over the whole run; keep "
                f"training.client_fraction: {1 / state['period'] if state.get('period') else 'as recorded'}"
            )
        self.next_round = int(state["next_round"])
        self.rows = {int(r): {n: (x.clone(), w.clone()) for n, (x, w) in d.items()} for r, d in state["rows"].items()}


__all__ = ["MAX_TERM_INDEX", "BandedNoise"]
