"""The ``dp`` protocol layer: client-level DP-FedAvg and instance-level DP-SGD on W, with a ledger."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from protocols.dp import adaptive_clipping
from protocols.dp.accountant import PrivacyUnit, calibrate_shared_sigma, calibrate_sigma
from protocols.dp.client_dp import add_client_noise, noise_aggregate, update_norm
from protocols.dp.discrete_gaussian import noisy_sum
from protocols.dp.label_set_dpsgd import SENSITIVITY_IN_CLIP_NORMS, dp_label_set_step
from protocols.dp.local_dpsgd import LocalDPSGD, copies_per_round, local_steps_per_round
from protocols.dp.local_shares import SHARE_STEP, LocalSharesRound, LocalShareSums, share_reply, share_std
from protocols.dp.privacy_graph import ADVERSARIES, Graph
from protocols.dp.released_model import unnoised_steps
from protocols.dp.run_graph import CLIENT_STEP, SERVER_STEP, mechanism_kind, run_graph
from protocols.dp.tree_aggregation import TreeNoise, tree_release
from protocols.dp.tree_ledger import tree_client_unit
from protocols.layer_settings import DPSettings
from protocols.layer_specs import share_range_error
from protocols.randomness import SecretStream
from secure_fed.algorithms.base import Algorithm, ClientData, ClientFn, Payload
from secure_fed.client_functions import apply_client_plan, client_side
from secure_fed.engine.aggregation import Aggregate, RoundSession
from secure_fed.engine.layers import Bounds, ClientSide, LayerState, Ledger, ProtocolLayer, RoundWrapper, StackEnv, StateScope
from secure_fed.engine.message_digest import payload_digest
from secure_fed.errors import ConfigError, PrivacyViolation

#: the instance unit's mechanisms, as its report names them (:mod:`protocols.dp.run_graph`)
CLIENT_TRAINING = CLIENT_STEP

NOISE_SEED_WARNING = (
    "privacy.noise_seed is set: every noise and sampling draw follows from that number, so the reported ε does not "
    "hold against anyone who knows it (debugging only)"
)


class DifferentialPrivacy(ProtocolLayer):
    name = "dp"

    def __init__(self, settings: DPSettings, env: StackEnv):
        super().__init__(settings, env)
        p = settings.privacy
        #: server side: the secret behind server noise, label-set sampling and client sampling
        self.server_stream = SecretStream.for_party(p.noise_seed, "server")
        #: client side: each client's own secret behind its DP-SGD (``privacy.local``) and its noise share
        #: (``noise: clients``)
        self._client_streams: dict[int, SecretStream] = {}
        #: client side: each client's trained rounds → the SHA-256 of the payload and plan it trained that round on
        self._trained: dict[int, dict[int, bytes]] = {}
        #: client side, ``privacy.local.noise: shares``: each client's clipped gradient sum of the round, until its
        #: share step sends it
        self._local_sums: dict[int, dict[str, torch.Tensor]] = {}
        if self.client_state_on_nodes and not settings.on_flower:
            # in process, every client's key now, so the first checkpoint holds them all (exact resume); on Flower
            # each node draws its own clients' keys when they first train and keeps them in its state
            for cid in range(env.num_clients):
                self.client_stream(cid)
        self.units: dict[str, PrivacyUnit] = {}
        self.adaptive: tuple[adaptive_clipping.AdaptiveClip, float] | None = None
        self.charged_round = -1  #: the last round whose steps the ledger holds
        if p.instance is not None or p.local is not None:
            self.units["instance"] = self._instance_unit()
            if self.local_shares:
                self._check_local_shares()
        if p.client is not None:
            q = settings.training.client_fraction
            not_cov = []
            if settings.label_set_algorithm:
                not_cov.append("label-set collection: a client's tokens shape W through the server regulariser "
                               "(covered per instance by privacy.instance, not per client)")  # fmt: skip
            scope = "each client's whole update of θ and its class rows"
            if p.client.mechanism == "tree":
                self.units["client"] = self._tree_unit(scope, not_cov)
            else:
                self.units["client"] = self._unit("client", p.client, q, settings.training.rounds, scope=scope,
                                                  not_covered=not_cov)  # fmt: skip
            self._check_share_range()
            # adaptive clipping (privacy.client.adaptive_clipping): (C_t, σ_Δ), or None (a fixed clip norm)
            self.adaptive = adaptive_clipping.adaptive_clip(p.client, self.units["client"].sigma, q * env.num_clients)
        for unit in self.units.values():
            unit.fixed = self.fixed_parts()

    @property
    def cfg(self) -> DPSettings:
        """The layer's settings (:class:`~protocols.layer_settings.DPSettings`), not the run's config: the name that
        the algorithm reads (``self.cfg.algorithm``) keep."""
        return self.settings

    # ---------------------------------------------------------------- the hooks (secure_fed.engine.layers)
    def clients(self) -> ClientSide:
        """Clients: DP-SGD in their training (``privacy.local``); the clip and noise share as plan steps
        (``privacy.client``), and a node's record of the payloads it trained on."""
        return ClientSide(privatizer=self.local_privatizer, plan_steps=self.client_plan_steps,
                          check_payload=self.check_round_payload)  # fmt: skip

    def ledger(self) -> Ledger:
        """The privacy units: budget stop, the secret cohort (amplification by sampling), the privacy report."""
        return Ledger(budget_stop=self.budget_stop, cohort_uniforms=self.cohort_uniforms, accounting=self.privacy)

    def state(self) -> LayerState:
        """The ledger (server), the server's secret stream (secret), the clients' streams and records (client)."""
        return LayerState(
            server=StateScope(self.state_dict, self.load_state_dict),
            client=StateScope(self.client_state_dict, self.load_client_state_dict),
            secret=StateScope(self.secret_state_dict, self.load_secret_state_dict),
        )

    def _check_share_range(self) -> None:
        """Noise shares must pass secure aggregation's encoding unclipped (:func:`protocols.layer_specs.share_range_error`);
        checked here, with σ as calibrated (``validate`` checks a given σ before the run)."""
        layout = self.env.update_layout()
        dim = sum(s.stop - s.start for s in layout.segments().values()) if self.env.theta else None
        if why := share_range_error(self.settings.privacy.client, self.settings.encoding, self.units["client"].sigma, dim):
            raise ConfigError(why)

    @property
    def local_shares(self) -> bool:
        """``privacy.local.noise: shares``: distributed DP-FedSGD (:mod:`protocols.dp.local_shares`)."""
        return self.settings.privacy.local is not None and self.settings.privacy.local.noise == "shares"

    def _check_local_shares(self) -> None:
        """One copy of an instance per round (the one sum holds every copy: k copies would be sensitivity kC), and
        shares that pass secure aggregation's encoding unclipped at the calibrated σ."""
        if (k := self.local_copies()) != 1:
            raise ConfigError(
                f"privacy.local.noise: shares: an instance enters up to {k} clients' training a round, and all of them "
                f"enter the one noised sum (sensitivity {k}C): use a partition with each instance on one client "
                "(privacy.local.max_labels_per_instance: 1 on positive_only) or noise: local"
            )
        layout = self.env.update_layout()
        dim = sum(s.stop - s.start for s in layout.segments().values()) if self.env.theta else None
        sigma = self.units["instance"].mechanism(CLIENT_TRAINING).sigma
        if why := share_range_error(self.settings.privacy.local, self.settings.encoding, sigma, dim):
            raise ConfigError(why)

    # ---------------------------------------------------------------- the instance unit: every mechanism an instance enters
    @property
    def client_state_on_nodes(self) -> bool:  # type: ignore[override]
        """On Flower, each client's secret stream (DP-SGD's batches and noise, its noise share) lives on its node
        (its ``context.state`` and own storage, which a resumed run takes up again)."""
        p = self.settings.privacy
        return p.local is not None or (p.client is not None and p.client.noise == "clients")

    def local_copies(self) -> int:
        """Client trainings one instance can enter per round: the clients it sits on (``k``: in the positive-only
        setting the public bound ``max_labels_per_instance``, which every instance is bounded to before the partition;
        1 in a CMDA/iid partition), capped by the largest cohort a round can have (all
        clients under Poisson sampling, else the fixed cohort size: ⌈fN⌉ or ``training.clients_per_round``). The
        ledger counts this worst case every round, whatever the realised cohort."""
        t = self.settings.training
        n = self.env.num_clients
        largest = n if t.sampling == "poisson" else t.cohort_size(n)
        return copies_per_round(self.env.max_clients_per_instance, largest)

    def local_steps_per_round(self) -> int:
        """Steps of the ``client_training`` mechanism the instance unit records per round."""
        q = self.settings.privacy.local.batch_sample_rate
        return self.local_copies() * local_steps_per_round(local_epochs=self.settings.training.local_epochs, sample_rate=q)

    def _trained_in_clients(self) -> str:
        """What client training changes, as the report names it."""
        if not self.settings.fixed_encoder:
            return "θ and the client's class rows" if self.env.has_rows else "θ"
        return "the client's class rows" if self.env.has_rows else "θ's linear head"

    def fixed_parts(self) -> list[str]:
        """The released tensors that no mechanism needs to cover: they do not depend on the training data."""
        if not self.settings.fixed_encoder:
            return []
        return ["θ's encoder g_θ: fixed at its initialisation from the run's seed (model.fixed_encoder), never "
                "trained, so the released value does not depend on the data (covered at no cost)"]  # fmt: skip

    def _instance_unit(self) -> PrivacyUnit:
        p = self.settings.privacy
        fixed = self.settings.algorithm.capabilities.fixed_w
        mechs: list[dict[str, Any]] = []
        if p.instance is not None:
            mechs.append({
                "name": SERVER_STEP, "cfg": p.instance, "sample_rate": p.instance.sample_rate,
                "planned_steps": self.settings.algorithm.private_w_steps(self.settings.training.rounds),
                "scope": "their label sets in the server's W update (eq. 12 pre-training)" if fixed
                else "their label sets in the server's W update (eq. 11 with σ weights, eq. 9)",
            })  # fmt: skip
        if p.local is not None:
            k = int(self.env.max_clients_per_instance)
            mechs.append({
                "name": CLIENT_TRAINING, "cfg": p.local, "sample_rate": p.local.batch_sample_rate,
                "planned_steps": self.settings.training.rounds * self.local_steps_per_round(),
                "scope": f"DP-SGD in client training ({self._trained_in_clients()}), per-sample clipping; one instance "
                         f"enters up to {self.local_copies()} clients' training a round (it sits on ≤ {k} clients), "
                         "each of their steps counted",
            })  # fmt: skip
            if p.local.noise == "shares":
                mechs[-1]["scope"] = (
                    f"distributed DP-FedSGD in client training ({self._trained_in_clients()}): per-sample clipping, one "
                    "step a round, each client's discrete Gaussian noise share σ(C + γ√d)/√t on its clipped gradient sum, "
                    "summed by secure aggregation over ≥ t survivors; one instance on one client"
                )
        target = next((m["cfg"].target_epsilon for m in mechs if m["cfg"].target_epsilon is not None), None)
        free = [m for m in mechs if m["cfg"].noise_multiplier is None]
        if free and target is None:
            raise ValueError(
                f"privacy.{'instance' if p.instance is not None else 'local'}: give noise_multiplier or target_epsilon"
            )
        shared = None
        block = "instance" if p.instance is not None and p.instance.target_epsilon is not None else "local"  # the target's
        if free:
            try:
                shared = calibrate_shared_sigma(
                    target_epsilon=target, delta=p.delta, accountant=p.accountant,
                    parts=[(m["sample_rate"], m["planned_steps"], m["cfg"].noise_multiplier) for m in mechs],
                )  # fmt: skip
            except (ValueError, RuntimeError) as exc:
                raise ConfigError(f"privacy.{block}.target_epsilon: {exc}") from None
        not_covered = ["which labels have a training instance (the label space, and in the positive-only setting the set "
                       "of clients): public, it decides W's shape"]  # fmt: skip
        if p.local is None:
            not_covered.append(
                "client training on the instance (θ and class-row updates): "
                + ("outside this unit's ledger: the observer's ε composes the client unit's noise through the group of "
                   "clients an instance sits on (units.client.instance_level)" if p.client is not None
                   else "add privacy.local to cover it")
            )  # fmt: skip
        if p.instance is None and self.settings.label_set_algorithm:
            not_covered.append("label-set collection for the server's W update: add privacy.instance to cover it")
        unit = None
        for m in mechs:
            sigma = m["cfg"].noise_multiplier if m["cfg"].noise_multiplier is not None else shared
            kw = {"scope": m["scope"], "sigma": sigma, "sample_rate": m["sample_rate"], "clip_norm": m["cfg"].clip_norm,
                  "calibrated": m["cfg"].noise_multiplier is None, "planned_steps": m["planned_steps"],
                  "kind": mechanism_kind(p, m["name"])}  # fmt: skip
            if unit is None:
                unit = PrivacyUnit(
                    name="instance", delta=p.delta, accountant=p.accountant, target_epsilon=target,
                    not_covered=not_covered, report_gdp=p.report_gdp, mechanism=m["name"], **kw,
                )  # fmt: skip
                unit.scope = "training instances, through " + " and ".join(x["scope"] for x in mechs)
            else:
                unit.add_mechanism(m["name"], **kw)
        first = {m["name"]: (self.local_steps_per_round() if m["name"] == CLIENT_TRAINING else 1) for m in mechs}
        if (why := unit.stop_reason(plan=first)) is not None:
            raise ConfigError(
                f"privacy.{block}.target_epsilon {target:g} cannot be met: the first round alone would exceed it "
                f"({why.split(': ', 1)[1].split('; stopped')[0]}); raise the noise_multiplier, or omit it to calibrate σ"
            )
        return unit

    def _unit(self, name, ucfg, q, steps, *, scope, not_covered) -> PrivacyUnit:
        p = self.settings.privacy
        calibrated = ucfg.noise_multiplier is None
        if calibrated:
            if ucfg.target_epsilon is None:
                raise ValueError(f"privacy.{name}: give noise_multiplier or target_epsilon")
            try:
                sigma = calibrate_sigma(
                    target_epsilon=ucfg.target_epsilon, delta=p.delta, sample_rate=q, steps=steps, accountant=p.accountant
                )
            except (ValueError, RuntimeError) as exc:
                raise ConfigError(f"privacy.{name}.target_epsilon: {exc}") from None
        else:
            sigma = ucfg.noise_multiplier
        return PrivacyUnit(
            name=name, scope=scope, sigma=sigma, sample_rate=q, delta=p.delta, accountant=p.accountant,
            target_epsilon=ucfg.target_epsilon, clip_norm=ucfg.clip_norm, calibrated=calibrated, planned_steps=steps,
            not_covered=not_covered, report_gdp=p.report_gdp, kind=mechanism_kind(p, name),
        )  # fmt: skip

    def _tree_unit(self, scope: str, not_covered: list[str]) -> PrivacyUnit:
        """The client unit under ``mechanism: tree`` (DP-FTRL, :mod:`protocols.dp.tree_ledger`), and its node noise."""
        p = self.settings.privacy
        try:
            unit = tree_client_unit(ucfg=p.client, delta=p.delta, accountant=p.accountant, rounds=self.settings.training.rounds,
                                    scope=scope, not_covered=not_covered, report_gdp=p.report_gdp)  # fmt: skip
        except (ValueError, RuntimeError) as exc:
            raise ConfigError(f"privacy.client.target_epsilon: {exc}") from None
        self.tree_noise = TreeNoise(self.server_stream, "client tree noise")
        return unit

    # ---------------------------------------------------------------- instance-level (server side)
    def wrap_algorithm(self, algorithm: Algorithm) -> None:
        """Wrap the algorithm's W step over label sets (its declared ``w_step``) with DP-SGD over label sets."""
        unit = self.units.get("instance")
        if unit is None or SERVER_STEP not in unit.mechanisms:
            return
        fixed = self.settings.algorithm.capabilities.fixed_w
        mech = unit.mechanism(SERVER_STEP)
        divisor = self.settings.instance_divisor  # public B̄ (config), never the realised count

        def dp_step(W: torch.Tensor) -> dict[str, float] | None:
            if (why := unit.stop_reason(1, SERVER_STEP)) is not None:
                # fedalc_fixed: W stays fixed from here. fedalc: unreachable in practice, since budget_stop refuses the
                # round first (same ledger, same check); if reached, the W step is skipped, the clients' update stands
                self.pretrain_stopped = why if fixed else None
                return None
            label = f"instance step {mech.steps}"  # the ledger's step count: a resumed run redraws the same
            n_all = algorithm.label_sets.shape[0]
            pick = torch.from_numpy(self.server_stream.uniform(n_all, f"{label} sample") < mech.sample_rate)
            stats = dp_label_set_step(
                W, algorithm.label_sets, algorithm.per_set_gradients, clip_norm=mech.clip_norm,
                noise_multiplier=mech.sigma, divisor=divisor, step_size=algorithm.step_size, pick=pick,
                noise=lambda total, sigma, sens: noisy_sum(
                    total, sigma=sigma, sensitivity=sens, stream=self.server_stream, label=f"{label} noise"),
            )  # fmt: skip
            unit.step(1, SERVER_STEP)
            return {"reg": algorithm.regularizer_value(W), **stats} if fixed else stats

        algorithm.w_step = dp_step  # stands in for the non-private step over the same label sets

    # ---------------------------------------------------------------- client-level
    def local_privatizer(self, cid: int, round_idx: int) -> LocalDPSGD | None:
        """Client side: client ``cid``'s DP-SGD for this round, drawing from the client's own secret."""
        loc = self.settings.privacy.local
        if loc is None:
            return None
        mech = self.units["instance"].mechanism(CLIENT_TRAINING)
        kw = {"clip_norm": mech.clip_norm, "noise_multiplier": mech.sigma, "sample_rate": mech.sample_rate,
              "divisor": self.settings.training.batch_size, "stream": self.client_stream(cid),
              "label": f"dp-sgd r{round_idx}"}  # fmt: skip
        if self.local_shares:  # its clipped sum, kept for the share step (local_share_step)
            return LocalShareSums(sink=lambda sums: self._local_sums.__setitem__(int(cid), sums), **kw)
        return LocalDPSGD(**kw)

    def open_round(self, round_idx: int, inner: RoundSession) -> RoundSession:
        # a round is charged once: a run interrupted inside round r (checkpointed with r charged) re-runs r after
        # resume with the same secret draws (cohort, noise, batches are addressed by the round), so the same output
        first = round_idx > self.charged_round
        self.charged_round = max(self.charged_round, round_idx)
        if self.settings.privacy.local is not None and first:  # before the clients train (an aborted round used the data)
            self.units["instance"].step(self.local_steps_per_round(), CLIENT_TRAINING)
        if self.local_shares:
            return LocalSharesRound(inner, layer=self, round_idx=round_idx)
        unit = self.units.get("client")
        if unit is None:
            return inner
        # counted once the secret cohort is drawn: its clients train, and whether the round completes or a protocol
        # aborts it (dropouts below the secure sum's threshold) is observable, so an aborted round is charged too
        if first:
            unit.step()
        if self.adaptive is not None:  # this round's C_t (the same one when a resumed run re-runs the round)
            unit.mechanism().clip_norm = self.adaptive[0].open(round_idx)
        layer = self

        on_clients = self.settings.privacy.client.noise == "clients"
        tree = self.settings.privacy.client.mechanism == "tree"
        noise_rows = self.noise_rows

        class _Noise(RoundWrapper):
            bit_sum = 0.0  #: adaptive clipping: Σ of the submitted clients' centred bits

            def client_mod(self, fn: ClientFn) -> ClientFn:
                """Client side: clip the whole update to S (FLAG: its eq. 2 weight bounded inside, ``weight_cap``);
                with ``noise: clients`` also add this client's noise share, from its own secret stream. The steps
                and their arguments are the round's plan (:meth:`client_plan_steps`), run here as a remote node
                runs them."""
                steps = self._plan_steps([])

                def clipped(payload, data):
                    return apply_client_plan(fn(payload, data), steps, data=data, layers={layer.name: layer})

                return self.inner.client_mod(clipped)

            def client_plan(self) -> list[dict]:
                return self._plan_steps(self.inner.client_plan())

            def _plan_steps(self, inner_steps: list[dict]) -> list[dict]:
                if on_clients and self.min_summands is None:
                    raise RuntimeError("privacy.client.noise: clients needs a secure-sum layer outside dp")
                return layer.client_plan_steps(inner_steps, round_idx=round_idx, min_summands=self.min_summands)

            def submit(self, cid: int, reply) -> None:
                """Server side: a plaintext update must arrive clipped (a client that skipped the clip would break
                the sensitivity the noise is calibrated to): refused above S."""
                if not on_clients:
                    norm = update_norm(reply)
                    if not norm <= unit.clip_norm * (1 + 1e-5):  # NaN fails too
                        raise PrivacyViolation(
                            f"client {cid}'s update has L2 norm {norm:.6g}, above privacy.client.clip_norm "
                            f"{unit.clip_norm:g}: it was not clipped"
                        )
                    if "weight" in reply and float(reply["weight"]) != 1.0:  # the sum would count it w times
                        raise PrivacyViolation(
                            f"client {cid}'s update carries weight {reply['weight']}: under client DP a weight is "
                            "capped inside the clipped update and reported as 1 (privacy.client.weight_cap)"
                        )
                if layer.adaptive is not None:
                    reply = dict(reply)
                    bit = reply.pop(adaptive_clipping.BIT_KEY, None)
                    if bit not in (adaptive_clipping.BIT_BELOW, adaptive_clipping.BIT_ABOVE):  # the count's sensitivity
                        raise PrivacyViolation(f"client {cid}'s clip bit is {bit!r}, not ±1/2: refused")
                    self.bit_sum += bit
                self.inner.submit(cid, reply)

            def post_own(self, agg: Aggregate) -> Aggregate:
                q = unit.sample_rate
                if tree:  # DP-FTRL: the leaf plus the tree's noise increment; denominators as below (q = 1)
                    tree_release(agg, clip_norm=unit.clip_norm, noise_multiplier=unit.sigma, noise=layer.tree_noise,
                                 round_idx=round_idx, tree_rounds=unit.tree_rounds, noise_rows=noise_rows)  # fmt: skip
                # an empty cohort (Poisson sampling) has no one to add noise shares: the server draws the whole
                # σS itself, so the release is the sampled Gaussian mechanism's on an empty sample, as accounted
                out = noise_aggregate(
                    agg, clip_norm=unit.clip_norm,
                    noise_multiplier=unit.sigma if layer.adaptive is None else layer.adaptive[1],  # σ_Δ: Theorem 1
                    expected_clients=q * layer.env.num_clients, expected_per_row=q * layer.env.clients_per_row.float(),
                    noise_rows=noise_rows, stream=layer.server_stream, label=f"client noise r{round_idx}",
                    server_noise=not tree and (not on_clients or agg.num_clients == 0),
                )  # fmt: skip
                if layer.adaptive is not None:
                    layer.adaptive[0].close(round_idx, self.bit_sum, layer.server_stream, f"clip bit r{round_idx}")
                return out

        return _Noise(inner)

    @property
    def noise_rows(self) -> bool:
        """Client-level noise covers W's rows too (a model with a row table that the clients update)."""
        return self.env.has_rows and not self.settings.algorithm.capabilities.fixed_w

    def client_plan_steps(
        self, inner: list[dict], *, round_idx: int, min_summands: int | None = None, on_node: bool = False
    ) -> list[dict]:
        """Remote clients, under ``privacy.client``: the clip (and weight cap) as a registered step; with ``noise:
        clients`` then the noise share, drawn by the client's own copy of this layer from the client's own secret
        stream; then the inner sessions' steps. The plan holds public values only (the share's standard deviation
        σ·S/√t, t = ``min_summands``, and the label that addresses the draw). ``on_node`` (a node checking the
        server's plan) the standard deviation is a range: at most σ·S (t ≥ 1) and at least σ·S/√t with the t the
        node's own state knows (its SecAgg threshold), else σ·S/√N, N the federation's clients (no sum holds more);
        a relative 1e-9 of slack on both ends (the node calibrates σ itself)."""
        if self.local_shares:  # (privacy.client is refused with it)
            full = self.units["instance"].mechanism(CLIENT_TRAINING).sigma * self.settings.privacy.local.clip_norm
            return [{
                "op": SHARE_STEP,
                "std": share_std(full, min_summands, on_node=on_node, num_clients=self.env.num_clients),
                "rows": [self.env.num_labels, self.env.embedding_dim] if self.noise_rows else None,
                "label": f"local share r{round_idx}",
            }, *inner]  # fmt: skip
        unit = self.units.get("client")
        if unit is None:
            return inner
        step: dict[str, Any] = {"op": "dp.clip", "clip_norm": float(unit.clip_norm)}
        if self.adaptive is not None:
            step["report_bit"] = True
        if self.settings.privacy.client.weight_cap is not None:
            step["weight_cap"] = float(self.settings.privacy.client.weight_cap)
        steps = [step]
        if self.settings.privacy.client.noise == "clients":
            full = unit.sigma * unit.clip_norm
            if on_node:
                n = min_summands or self.env.num_clients
                std: float | Bounds = Bounds(full / math.sqrt(n) * (1 - 1e-9), full * (1 + 1e-9))
            else:  # an empty cohort (no client trains, no share is drawn) has a sum of no updates
                std = float(full / math.sqrt(max(1, int(min_summands or 0))))
            steps.append({
                "op": "layer:dp.noise_share_step",
                "std": std,
                "rows": [self.env.num_labels, self.env.embedding_dim] if self.noise_rows else None,
                "label": f"noise share r{round_idx}",
            })  # fmt: skip
        return [*steps, *inner]

    @client_side
    def noise_share_step(self, reply: Payload, data: ClientData, *, std: float, rows: list[int] | None, label: str) -> Payload:
        """Client side (a remote client's plan step): this client's noise share from its own secret stream, as the
        in-process ``client_mod`` adds it."""
        rows_shape = None if rows is None else (int(rows[0]), int(rows[1]))
        # the training loss would reach the server inside the secure sum, exactly and outside the noise: not sent
        reply = {**reply, "loss": 0.0}
        return add_client_noise(
            reply, std=std, rows_shape=rows_shape, stream=self.client_stream(data.client_id), label=label,
            clip_norm=self.units["client"].clip_norm, finest_grid=self.settings.encoding_grid,
        )  # fmt: skip

    @client_side
    def local_share_step(self, reply: Payload, data: ClientData, *, std: float, rows: list[int] | None, label: str) -> Payload:
        """Client side, ``privacy.local.noise: shares`` (a plan step): the client's clipped gradient sum of this round
        (kept by its :class:`~protocols.dp.local_shares.LocalShareSums`) with its noise share, from its own secret
        stream, in place of the trained update (:func:`~protocols.dp.local_shares.share_reply`)."""
        sums = self._local_sums.pop(int(data.client_id), None)
        if sums is None:
            raise RuntimeError(f"client {data.client_id}: no clipped gradient sum this round (privacy.local.noise: shares)")
        mech = self.units["instance"].mechanism(CLIENT_TRAINING)
        return share_reply(
            reply, sums, std=std, sigma=mech.sigma, rows_shape=None if rows is None else (int(rows[0]), int(rows[1])),
            stream=self.client_stream(data.client_id), label=label, clip_norm=mech.clip_norm,
            finest_grid=self.settings.encoding_grid, clip_range=self.settings.encoding[0],
        )  # fmt: skip

    def client_stream(self, cid: int) -> SecretStream:
        """Client side: client ``cid``'s own secret (fresh from os.urandom unless privacy.noise_seed is set)."""
        if cid not in self._client_streams:
            self._client_streams[cid] = SecretStream.for_party(self.settings.privacy.noise_seed, f"client {cid}")
        return self._client_streams[cid]

    def cohort_uniforms(self, round_idx: int, num_clients: int) -> np.ndarray | None:
        """Client sampling amplifies the client unit's ε only if the sample is secret: draw it from the server's secret."""
        unit = self.units.get("client")
        if unit is None or unit.sample_rate >= 1.0:
            return None
        return self.server_stream.uniform(num_clients, f"cohort r{round_idx}")

    # ---------------------------------------------------------------- budget and ledger
    def budget_stop(self, round_idx: int) -> str | None:
        """A reason not to start this round: one of its units' planned steps would exceed its target."""
        if (client := self.units.get("client")) is not None and (why := client.stop_reason()):
            return why
        inst = self.units.get("instance")
        if inst is None:
            return None
        plan = {}
        if CLIENT_TRAINING in inst.mechanisms:
            plan[CLIENT_TRAINING] = self.local_steps_per_round()
        if SERVER_STEP in inst.mechanisms and not self.settings.algorithm.capabilities.fixed_w:  # a W step every round
            plan[SERVER_STEP] = 1
        return inst.stop_reason(plan=plan) if plan else None

    def privacy_graph(self, *, planned: bool = False) -> Graph:
        """This run's privacy-loss graph (:mod:`protocols.dp.run_graph`) over its units' declared mechanisms, at the
        steps the ledgers hold (``planned``: the steps they plan)."""
        t, n = self.settings.training, self.env.num_clients
        mechs = [m.at(m.planned_steps) if planned else m for u in self.units.values() for m in u.mechanisms.values()]
        return run_graph(
            self.settings.privacy, label_set_algorithm=self.settings.label_set_algorithm, mechanisms=mechs,
            instance_group=self.env.max_clients_per_instance, population=n,
            cohort=None if t.sampling == "poisson" else t.cohort_size(n),
        )  # fmt: skip

    def _adversary(self, graph: Graph, unit: str, adversary: str) -> dict[str, Any]:
        """One unit's ε against one adversary, from the graph, with why it holds."""
        u = self.units[unit]
        res = graph.epsilon(unit, adversary, delta=u.delta, accountant=u.accountant_name)
        if "why" in res:
            return {"epsilon": res["epsilon"], "why": res["why"]}
        sees = "sees the released θ, W and files" if adversary == "observer" else "sees every message"
        out = {"epsilon": res["epsilon"], "why": f"{sees}; composes {', '.join(res['composed'])}"}
        if res["accountant"] != u.accountant_name:
            out["accountant"] = res["accountant"]
        if unit == "instance" and "client" in self.units:
            out["why"] += f" (client-level noise through a group of {graph.instance_group} clients: protocols/dp/group_bound.py)"
        if res["notes"]:
            out["why"] += "; " + "; ".join(res["notes"])
        return out

    def privacy(self) -> dict[str, Any]:
        """Each unit's report. ``unnoised`` (in every unit's, the same list) names the steps that shape a released
        tensor with no DP mechanism of this stack on them: with one, no unit's ε bounds what the released θ and W
        reveal (the observer's ε is ∞, and so is the run's top-level ε)."""
        graph = self.privacy_graph()
        unnoised = unnoised_steps(graph.uncovered("observer"))
        out = {}
        for name, u in self.units.items():
            rep = u.report()
            rep["unnoised"] = [dict(x) for x in unnoised]
            if name == "instance" and SERVER_STEP in u.mechanisms:
                m = u.mechanism(SERVER_STEP)
                note = "2C: identical instances share one merged label set, so removing one can change a set, not only remove it"
                target = rep["mechanisms"][SERVER_STEP] if "mechanisms" in rep else rep
                target["sensitivity"] = SENSITIVITY_IN_CLIP_NORMS * m.clip_norm
                target["sensitivity_note"] = note
                target["expected_batch_size"] = self.settings.instance_divisor  # the public divisor
            if name == "instance" and CLIENT_TRAINING in u.mechanisms:
                m = u.mechanism(CLIENT_TRAINING)
                target = rep["mechanisms"][CLIENT_TRAINING] if "mechanisms" in rep else rep
                target["sensitivity"] = m.clip_norm
                target["sensitivity_note"] = (
                    "C per step: adding or removing the instance adds or removes one clipped per-sample gradient; it "
                    f"enters up to {self.local_copies()} clients' training a round, each of those steps counted"
                )
                if self.local_shares:
                    target["sensitivity_note"] = (
                        "C per round: adding or removing the instance adds or removes one clipped per-sample gradient in "
                        "its one client's gradient sum, hence in the round's secure sum, whose noise (the clients' shares, "
                        "≥ t of them) is σ(C + γ√d); against the server this holds only with the secure sum"
                    )
            if (bound := self.settings.privacy.max_labels_per_instance()) is not None and name in ("instance", "client"):
                rep["contribution_bound"] = {"max_labels_per_instance": bound, "over_bound": self.settings.privacy.over_bound}
            rep["adversaries"] = {adv: self._adversary(graph, name, adv) for adv in ADVERSARIES}
            if unnoised:  # the same verdict as the graph's, with every un-noised step named
                rep["adversaries"]["observer"] = {"epsilon": "inf", "why": "; ".join(x["why"] for x in unnoised)}
            if name == "client" and self.settings.privacy.client.weight_cap is not None:
                rep["sensitivity"] = u.clip_norm
                rep["sensitivity_note"] = (
                    f"each client's update is clipped to C, then scaled by min(w, W̄)/W̄ ≤ 1 with its eq. 2 weight w and "
                    f"the public cap W̄ = {self.settings.privacy.client.weight_cap:g}; it reports weight 1, so w is released "
                    "only inside the noised sum"
                )
            if name == "client":
                k = int(self.env.max_clients_per_instance)
                alone = Graph([m for m in graph.mechanisms if m.unit == "client"], {"client_training": ""},
                              instance_group=k, population=graph.population, cohort=graph.cohort)  # fmt: skip
                rep["instance_level"] = {
                    "group_size": k,
                    "epsilon": alone.epsilon("instance", "observer", delta=u.delta, accountant=u.accountant_name)["epsilon"],
                    "delta": u.delta,
                    "note": f"one training instance sits on up to {k} clients (a public bound: in the positive-only "
                            "setting privacy.client.max_labels_per_instance, else the number of labels; 1 in a partition "
                            "that puts each instance on one client); removing it substitutes each of those clients' "
                            "updates (a shift of at most 2C each, when sampled): the group bound of "
                            "protocols/dp/group_bound.py, the client-level mechanism alone",
                }  # fmt: skip
            if name == "client" and self.adaptive is not None:
                clip, update_sigma = self.adaptive
                rep["adaptive_clipping"] = adaptive_clipping.released(clip, sigma=u.sigma, update_sigma=update_sigma)
            if self.server_stream.derived_from_seed:
                rep["warning"] = NOISE_SEED_WARNING
            out[name] = rep
        if getattr(self, "pretrain_stopped", None):
            out["instance"]["stopped"] = self.pretrain_stopped
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            "units": {n: u.state_dict() for n, u in self.units.items()},
            "pretrain_stopped": getattr(self, "pretrain_stopped", None),
            "charged_round": self.charged_round,
            **({"adaptive_clip": self.adaptive[0].state_dict()} if self.adaptive is not None else {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for n, s in state["units"].items():
            self.units[n].load_state_dict(s)
        self.pretrain_stopped = state.get("pretrain_stopped")
        self.charged_round = int(state.get("charged_round", -1))
        if self.adaptive is not None and "adaptive_clip" in state:
            clip = self.adaptive[0]
            clip.load_state_dict(state["adaptive_clip"])
            if clip.by_round:  # the report's clip norm: the last opened round's
                self.units["client"].mechanism().clip_norm = clip.by_round[max(clip.by_round)]

    # the secrets: the server's in its private checkpoint (server_secrets.pt), the clients' in clients.pt
    def secret_state_dict(self) -> dict[str, Any]:
        return {"server": self.server_stream.state_dict()}

    def load_secret_state_dict(self, state: dict[str, Any]) -> None:
        if "server" in state:
            self.server_stream = SecretStream.from_state_dict(state["server"])
            if hasattr(self, "tree_noise"):  # node noise is addressed by node: redrawn from the restored key
                self.tree_noise = TreeNoise(self.server_stream, self.tree_noise.label)

    def check_round_payload(self, cid: int, round_idx: int, payload: Payload, plan: list[dict]) -> None:
        """Client side, on a remote node: a client's DP randomness (its noise share, its DP-SGD batches and noise)
        is addressed by the round, so training one round twice on different payloads, or under plans with different
        noise shares (the same draws scaled), would release two updates with the same noise, whose difference (or
        weighted difference) is noise-free. The client keeps a SHA-256 of each round's payload and plan
        (:func:`~secure_fed.engine.message_digest.payload_digest`) and trains a round again only on the same ones
        (the round a resumed run replays first is byte-identical to the original)."""
        if not self.client_state_on_nodes:
            return
        digest = payload_digest({"payload": payload, "plan": plan})
        self.client_stream(int(cid))  # its state holds the record below
        seen = self._trained.setdefault(int(cid), {})
        if seen.get(int(round_idx), digest) != digest:
            raise PermissionError(
                f"client {cid}: round {round_idx} arrived again with another payload or plan; its DP noise, addressed "
                "by the round, would repeat: refused (a server that deviates from the protocol, or a resumed run whose "
                "replayed rounds differ from the first run's, e.g. by other real dropouts; output.checkpoint_every: 1 "
                "replays no round but the interrupted one)"
            )
        seen[int(round_idx)] = digest

    def client_state_dict(self) -> dict[str, Any]:
        return {cid: {**s.state_dict(), "trained": dict(self._trained.get(cid, {}))} for cid, s in self._client_streams.items()}

    def load_client_state_dict(self, state: dict[str, Any]) -> None:
        self._client_streams = {int(cid): SecretStream.from_state_dict(st) for cid, st in state.items()}
        self._trained = {int(cid): {int(r): bytes(d) for r, d in st.get("trained", {}).items()} for cid, st in state.items()}
