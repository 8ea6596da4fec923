"""The ``dp`` protocol layer: client-level DP-FedAvg and instance-level DP-SGD on W, with a ledger."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from protocols.base import ProtocolLayer, RoundWrapper, StackEnv
from protocols.dp.accountant import PrivacyUnit, calibrate_sigma
from protocols.dp.client_dp import add_client_noise, clip_update, noise_aggregate
from protocols.dp.label_set_dpsgd import dp_label_set_step
from secure_fed.algorithms.base import Algorithm, ClientFn
from secure_fed.algorithms.regularizers import (
    label_set_correlation_grads,
    label_set_fixed_grads,
    nearest_classes,
    pair_hinge_grads,
    pair_sqdist_grads,
)
from secure_fed.engine.aggregation import Aggregate, RoundSession

LABEL_SET_ALGORITHMS = ("fedalc", "fedalc_fixed")


def client_noise_seed(seed: int, round_idx: int, cid: int) -> int:
    """Each client's own noise stream (reproducible per run, round and client)."""
    return int(np.random.SeedSequence([seed, round_idx, cid, 4099]).generate_state(1)[0])


class DifferentialPrivacy(ProtocolLayer):
    name = "dp"
    threat_model = (
        "Bounds, with a tracked (ε, δ), what the trained θ and W reveal about any one client (client-level DP-FedAvg) "
        "or any one instance's label set (DP-SGD on the server's W update) to anyone who sees them; the server that adds "
        "the noise is trusted with the un-noised sums."
    )

    @classmethod
    def validate(cls, cfg, stack: list[str]) -> None:
        p, algo = cfg.privacy, cfg.algorithm.name
        if p.instance is None and p.client is None:
            raise ValueError("'dp' is listed in protocols but neither privacy.instance nor privacy.client is set")
        if p.instance is not None:
            if algo not in LABEL_SET_ALGORITHMS:
                raise ValueError(
                    f"privacy.instance is DP-SGD on the server's label-set regulariser, which {algo} does not have "
                    "(fedaws's spreadout uses no data: it is post-processing); use privacy.client"
                )
            if algo == "fedalc" and cfg.algorithm.normalize_gamma:
                raise ValueError(
                    "privacy.instance with fedalc needs algorithm.normalize_gamma: false — eq. 10 normalises γ by all "
                    "label sets, which is not a per-label-set sum; DP-SGD runs on the σ weights of eq. 9"
                )
        if p.client is not None:
            t = cfg.training
            if t.aggregation != "uniform":
                raise ValueError("privacy.client bounds each client's contribution, so training.aggregation must be uniform")
            if p.client.noise == "clients" and not ({"secure_aggregation", "ckks"} & set(stack)):
                raise ValueError(
                    "privacy.client.noise: clients needs secure_aggregation or ckks after dp: each client adds only a "
                    "1/√t share of the noise, so without a secure sum the server would see lightly-noised single updates"
                )
            if t.client_fraction < 1.0 and t.sampling != "poisson":
                raise ValueError(
                    "privacy.client with training.client_fraction < 1 needs training.sampling: poisson "
                    "(the accountant's subsampling amplification assumes Poisson sampling)"
                )

    def __init__(self, cfg, env: StackEnv):
        super().__init__(cfg, env)
        p = cfg.privacy
        self.generator = torch.Generator().manual_seed(cfg.seed * 7919 + 17)
        self.units: dict[str, PrivacyUnit] = {}
        algo = cfg.algorithm.name
        if p.instance is not None:
            steps = cfg.algorithm.fixed_steps if algo == "fedalc_fixed" else cfg.training.rounds
            self.units["instance"] = self._unit("instance", p.instance, p.instance.sample_rate, steps, scope=(
                "label sets used by the server's W update (eq. 12 pre-training)" if algo == "fedalc_fixed"
                else "label sets used by the server's W update (eq. 11 with σ weights, eq. 9)"
            ), not_covered=[] if p.client is not None else [
                "client training on the instance (θ and class-row updates): add privacy.client to cover it",
            ])  # fmt: skip
        if p.client is not None:
            q = cfg.training.client_fraction
            not_cov = ["per-round mean training loss written to metrics.jsonl (a diagnostic)"]
            if algo in LABEL_SET_ALGORITHMS:
                not_cov.insert(0, "label-set collection: a client's tokens shape W through the server regulariser "
                                  "(covered per label set by privacy.instance, not per client)")  # fmt: skip
            self.units["client"] = self._unit(
                "client",
                p.client,
                q,
                cfg.training.rounds,
                scope="each client's whole update of θ and its class rows",
                not_covered=not_cov,
            )

    def _unit(self, name, ucfg, q, steps, *, scope, not_covered) -> PrivacyUnit:
        p = self.cfg.privacy
        calibrated = ucfg.noise_multiplier is None
        if calibrated:
            if ucfg.target_epsilon is None:
                raise ValueError(f"privacy.{name}: give noise_multiplier or target_epsilon")
            sigma = calibrate_sigma(
                target_epsilon=ucfg.target_epsilon, delta=p.delta, sample_rate=q, steps=steps, accountant=p.accountant
            )
        else:
            sigma = ucfg.noise_multiplier
        return PrivacyUnit(
            name=name, scope=scope, sigma=sigma, sample_rate=q, delta=p.delta, accountant=p.accountant,
            target_epsilon=ucfg.target_epsilon, clip_norm=ucfg.clip_norm, calibrated=calibrated, planned_steps=steps,
            not_covered=not_covered,
        )  # fmt: skip

    # ---------------------------------------------------------------- instance-level (server side)
    def wrap_algorithm(self, algorithm: Algorithm) -> None:
        unit = self.units.get("instance")
        if unit is None:
            return
        a = self.cfg.algorithm
        C = self.env.num_labels
        scale = (C - 1) if a.gamma_scale == "classes_minus_one" else float(a.gamma_scale)

        def step(W: torch.Tensor, grads, step_size: float) -> dict[str, float]:
            stats = dp_label_set_step(
                W, algorithm.label_sets, grads, clip_norm=unit.clip_norm, noise_multiplier=unit.sigma,
                sample_rate=unit.sample_rate, step_size=step_size, generator=self.generator,
            )  # fmt: skip
            unit.step()
            return stats

        def correlation_grads(V: torch.Tensor):
            nn_idx, pair = nearest_classes(V, a.k), pair_hinge_grads(V, a.margin)
            return lambda Y: label_set_correlation_grads(
                V, Y, k=a.k, margin=a.margin, scale=scale, nn_idx=nn_idx, pair_grads=pair
            )

        def fixed_grads(V: torch.Tensor):
            pair = (pair_sqdist_grads(V), pair_hinge_grads(V, a.margin))
            return lambda Y: label_set_fixed_grads(V, Y, alpha=a.alpha, beta=a.beta, margin=a.margin, pair_grads=pair)

        if a.name == "fedalc":
            algorithm.correlation_update = lambda W: step(W, correlation_grads, a.lam * a.reg_lr)
        else:

            def pretrain(W: torch.Tensor, i: int) -> dict[str, float] | None:
                if (why := unit.stop_reason()) is not None:
                    self.pretrain_stopped = why  # W stays fixed from here; client rounds use no label set
                    return None
                stats = step(W, fixed_grads, a.lam * a.fixed_lr)
                return {"reg": float(algorithm._reg_fc(W).detach()), **stats}

            algorithm.pretrain_update = pretrain

    # ---------------------------------------------------------------- client-level
    def open_round(self, round_idx: int, inner: RoundSession) -> RoundSession:
        unit = self.units.get("client")
        if unit is None:
            return inner
        layer = self

        on_clients = self.cfg.privacy.client.noise == "clients"
        noise_rows = layer.cfg.algorithm.name not in ("fedavg_fixed", "fedalc_fixed")

        class _Noise(RoundWrapper):
            def client_mod(self, fn: ClientFn) -> ClientFn:
                """Client side: clip the whole update to S; with ``noise: clients`` also add this client's noise share."""

                def clipped(payload, data):
                    reply = clip_update(fn(payload, data), unit.clip_norm)
                    if not on_clients:
                        return reply
                    if self.min_summands is None:
                        raise RuntimeError("privacy.client.noise: clients needs a secure-sum layer outside dp")
                    gen = torch.Generator().manual_seed(client_noise_seed(layer.cfg.seed, round_idx, data.client_id))
                    std = unit.sigma * unit.clip_norm / math.sqrt(self.min_summands)
                    rows = (layer.env.num_labels, layer.env.embedding_dim) if noise_rows else None
                    return add_client_noise(reply, std=std, rows_shape=rows, generator=gen)

                return self.inner.client_mod(clipped)

            def post_own(self, agg: Aggregate) -> Aggregate:
                q = unit.sample_rate
                out = noise_aggregate(
                    agg, clip_norm=unit.clip_norm, noise_multiplier=unit.sigma,
                    expected_clients=q * layer.env.num_clients, expected_per_row=q * layer.env.clients_per_row.float(),
                    noise_rows=noise_rows, generator=layer.generator, server_noise=not on_clients,
                )  # fmt: skip
                unit.step()
                return out

        return _Noise(inner)

    # ---------------------------------------------------------------- budget and ledger
    def budget_stop(self, round_idx: int) -> str | None:
        units = [self.units.get("client")]
        if self.cfg.algorithm.name == "fedalc":
            units.append(self.units.get("instance"))
        for u in units:
            if u is not None and (why := u.stop_reason()):
                return why
        return None

    def privacy(self) -> dict[str, Any]:
        out = {name: u.report() for name, u in self.units.items()}
        if getattr(self, "pretrain_stopped", None):
            out["instance"]["stopped"] = self.pretrain_stopped
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "units": {n: u.state_dict() for n, u in self.units.items()},
            "generator": self.generator.get_state(),
            "pretrain_stopped": getattr(self, "pretrain_stopped", None),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for n, s in state["units"].items():
            self.units[n].load_state_dict(s)
        self.generator.set_state(state["generator"])
        self.pretrain_stopped = state.get("pretrain_stopped")
