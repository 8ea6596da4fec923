"""The client unit's ledger under ``privacy.client.mechanism: tree`` (DP-FTRL, :mod:`protocols.dp.tree_aggregation`).

The run is one Gaussian mechanism of noise multiplier σ/√K, K = Σ over the released tree nodes of (the client's
contributions in the node)² (:func:`~protocols.dp.tree_aggregation.gaussian_equivalents`, every client in every
round). The ledger holds it as K steps at (σ, q = 1): the RDP and PRV accountants compose identical Gaussians
exactly, so ε is the Gaussian's at σ/√K. Its ``steps`` count rounds; its history, Gaussian equivalents.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from protocols.dp.accountant import PrivacyUnit, calibrate_sigma
from protocols.dp.tree_aggregation import gaussian_equivalents, tree_depth

if TYPE_CHECKING:
    from protocols.config_sections import ClientDPConfig
    from secure_fed.plugin_api.layers import TrainingPlan


class TreeUnit(PrivacyUnit):
    """A :class:`~protocols.dp.accountant.PrivacyUnit` whose rounds are leaves of trees of ``tree_rounds`` rounds."""

    def __init__(self, *, tree_rounds: int, **kw: Any):
        self.tree_rounds = int(tree_rounds)
        super().__init__(kind="client_tree", mechanism_options={"tree_rounds": self.tree_rounds}, **kw)

    def _history_after(self, steps: dict[str, int]) -> list[tuple[float, float, int]]:
        m = self.mechanism()
        n = int(steps.get(m.name, 0))
        k = gaussian_equivalents(m.steps + max(0, n), self.tree_rounds)
        return [(m.sigma, 1.0, k)] if k else []

    def report(self) -> dict[str, Any]:
        out = super().report()
        k = gaussian_equivalents(self.steps, self.tree_rounds)
        out["tree"] = {
            "name": "DP-FTRL, binary tree aggregation (Kairouz et al. 2021)",
            "sampling_amplification": False,
            "participation": "every client in every round (no client sampling; no amplification by sampling is used)",
            "tree_rounds": self.tree_rounds,
            "tree_depth": tree_depth(self.tree_rounds),
            "gaussian_equivalents": k,
            "effective_noise_multiplier": self.sigma / k**0.5 if k else None,
            "zcdp_rho": k / (2.0 * self.sigma**2),
            "note": "each released tree node is a Gaussian mechanism with sensitivity C × (the client's rounds in the "
            "node); composed, the run is one Gaussian of noise multiplier σ/√K, K = Σ (rounds in node)² over the used "
            "nodes",
        }
        return out


def tree_client_unit(*, client: ClientDPConfig, delta: float, accountant: str, rounds: int, scope: str, not_covered: list[str],
                     report_gdp: bool) -> TreeUnit:  # fmt: skip
    """The client unit of a DP-FTRL run: σ given, or calibrated to ``target_epsilon`` over the planned K."""
    tree_rounds = int(client.tree_restart_every or rounds)
    planned = gaussian_equivalents(rounds, tree_rounds)
    calibrated = client.noise_multiplier is None
    if client.noise_multiplier is not None:
        sigma = client.noise_multiplier
    elif client.target_epsilon is None:
        raise ValueError("privacy.client: give noise_multiplier or target_epsilon")
    else:
        sigma = calibrate_sigma(
            target_epsilon=client.target_epsilon, delta=delta, sample_rate=1.0, steps=planned, accountant=accountant
        )
    return TreeUnit(
        tree_rounds=tree_rounds, name="client", scope=scope, sigma=sigma, sample_rate=1.0, delta=delta,
        accountant=accountant, target_epsilon=client.target_epsilon, clip_norm=client.clip_norm, calibrated=calibrated,
        planned_steps=rounds, not_covered=not_covered, report_gdp=report_gdp,
    )  # fmt: skip


def tree_config_error(training: TrainingPlan) -> str | None:
    """Why a run's ``training`` part cannot run ``privacy.client.mechanism: tree``, or None: the ledger's K assumes
    every client in every round (a random cohort would need amplification by sampling, which the tree's accounting
    does not use and the fixed cohort would not give), and the FTRL form needs the server step x ← x + η·Δ
    (``fedavg``)."""
    t = training
    if t.client_fraction < 1.0 or t.clients_per_round is not None:
        return (
            f"privacy.client.mechanism: tree with training.client_fraction {t.client_fraction:g}"
            + (f" (clients_per_round {t.clients_per_round})" if t.clients_per_round is not None else "")
            + ": DP-FTRL uses no sampling amplification and its accounting counts every client in every round; "
            "set client_fraction: 1 (or use mechanism: gaussian with sampling: poisson)"
        )
    if t.server_optimizer.name != "fedavg":
        return (
            f"privacy.client.mechanism: tree with training.server_optimizer.name {t.server_optimizer.name}: DP-FTRL's "
            "model is θ_0 + η·(noisy prefix sum)/N, which the server step x ← x + η·Δ of fedavg gives; set "
            "server_optimizer.name: fedavg (its lr is η)"
        )
    return None


__all__ = ["TreeUnit", "tree_client_unit", "tree_config_error"]
