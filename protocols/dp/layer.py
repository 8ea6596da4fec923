"""The ``dp`` protocol layer: client-level DP-FedAvg and instance-level DP-SGD on W, with a ledger.

The class wires its parts: the privacy units from the settings (:mod:`protocols.dp.privacy_units`), the W step's
release (:mod:`protocols.dp.w_step_release`), DP-SGD in client training (:mod:`protocols.dp.local_dpsgd`,
:mod:`protocols.dp.local_shares`), the client unit's release and the clients' plan steps
(:mod:`protocols.dp.client_release`), the budget stop (:mod:`protocols.dp.budget_stop`) and the privacy report
(:mod:`protocols.dp.privacy_report`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from protocols.dp import adaptive_clipping, client_release, privacy_units
from protocols.dp.accountant import PrivacyUnit
from protocols.dp.banded_release import BandedNoise
from protocols.dp.budget_stop import budget_stop
from protocols.dp.client_records import check_round_payload, client_state_dict, load_client_state_dict
from protocols.dp.local_dpsgd import LocalDPSGD
from protocols.dp.local_shares import LocalSharesRound
from protocols.dp.mechanism_plugins import active_plugins
from protocols.dp.privacy_graph import Graph
from protocols.dp.privacy_report import privacy_graph, privacy_report
from protocols.dp.run_graph import CLIENT_STEP, SERVER_STEP
from protocols.dp.tree_aggregation import TreeNoise
from protocols.dp.w_step_release import private_w_step
from protocols.layer_settings import DPSettings
from protocols.randomness import SecretStream
from secure_fed.plugin_api.layers import (
    Algorithm,
    ClientData,
    ClientSide,
    LayerState,
    Ledger,
    Payload,
    ProtocolLayer,
    ProtocolSetup,
    RoundSession,
    SetupResult,
    StackEnv,
    StateScope,
    client_side,
    cyclic_period,
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
        #: the DP mechanism plugins' releases, by statistic (set at setup)
        self.released: dict[str, torch.Tensor] = {}
        if p.instance is not None or p.local is not None or active_plugins(p):
            self.units["instance"] = privacy_units.instance_unit(settings, env)
            if self.local_shares:
                privacy_units.check_local_shares(settings, env, self.units["instance"].mechanism(CLIENT_STEP).sigma)
        if p.client is not None:
            self.units["client"] = privacy_units.client_unit(settings, env)
            if p.client.mechanism == "tree":  # DP-FTRL's node noise, addressed by node
                self.tree_noise = TreeNoise(self.server_stream, "client tree noise")
            if p.client.mechanism == "banded":  # banded MF's recursion state (private), its draws addressed by round
                period = cyclic_period(settings.training.client_fraction)
                self.banded_noise = BandedNoise(self.server_stream, "client banded noise", p.client.bands, period)
            privacy_units.check_share_range(settings, env, self.units["client"].sigma)
            # adaptive clipping (privacy.client.adaptive_clipping): (C_t, σ_Δ), or None (a fixed clip norm)
            q = settings.training.client_fraction
            self.adaptive = adaptive_clipping.adaptive_clip(p.client, self.units["client"].sigma, q * env.num_clients)
        privacy_units.add_plugin_client_mechanisms(settings, self.units)
        for unit in self.units.values():
            unit.fixed = privacy_units.fixed_parts(settings)

    # ---------------------------------------------------------------- the hooks (secure_fed.engine.layers)
    def setup(self, ctx: ProtocolSetup) -> SetupResult:
        """Before round 0: each DP mechanism plugin's one release (:func:`protocols.dp.plugin_release.release`),
        charged to the ledgers; the algorithm's setup query for a released statistic is answered with it."""
        if not active_plugins(self.settings.privacy):
            return SetupResult()
        from protocols.dp import plugin_release

        self.released = plugin_release.release(self, ctx.query)
        return SetupResult(wrap_query=plugin_release.answer_statistics(self.released))

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

    # ---------------------------------------------------------------- public facts of the settings
    @property
    def local_shares(self) -> bool:
        """``privacy.local.noise: shares``: distributed DP-FedSGD (:mod:`protocols.dp.local_shares`)."""
        return self.settings.privacy.local is not None and self.settings.privacy.local.noise == "shares"

    @property
    def client_state_on_nodes(self) -> bool:  # type: ignore[override]
        """On Flower, each client's secret stream (DP-SGD's batches and noise, its noise share) lives on its node
        (its ``context.state`` and own storage, which a resumed run takes up again)."""
        p = self.settings.privacy
        return p.local is not None or (p.client is not None and p.client.noise == "clients")

    @property
    def noise_rows(self) -> bool:
        """Client-level noise covers W's rows too (a model with a row table that the clients update)."""
        return self.env.has_rows and not self.settings.algorithm.capabilities.fixed_w

    def local_steps_per_round(self) -> int:
        """Steps of the ``client_training`` mechanism the instance unit records per round."""
        return privacy_units.client_training_steps(self.settings, self.env)

    # ---------------------------------------------------------------- server side: the W step, the rounds
    def wrap_algorithm(self, algorithm: Algorithm) -> None:
        """Wrap the algorithm's W step over label sets (its declared ``w_step``) with DP-SGD over label sets."""
        unit = self.units.get("instance")
        if unit is not None and SERVER_STEP in unit.mechanisms:
            algorithm.w_step = private_w_step(self, algorithm)  # stands in for the non-private step, same label sets

    def open_round(self, round_idx: int, inner: RoundSession) -> RoundSession:
        # a round is charged once: a run interrupted inside round r (checkpointed with r charged) re-runs r after
        # resume with the same secret draws (cohort, noise, batches are addressed by the round), so the same output
        first = round_idx > self.charged_round
        self.charged_round = max(self.charged_round, round_idx)
        if self.settings.privacy.local is not None and first:  # before the clients train (an aborted round used the data)
            self.units["instance"].step(self.local_steps_per_round(), CLIENT_STEP)
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
        return client_release.ClientNoiseRound(inner, layer=self, round_idx=round_idx)

    def cohort_uniforms(self, round_idx: int, num_clients: int) -> np.ndarray | None:
        """Client sampling amplifies the client unit's ε only if the sample is secret: draw it from the server's secret."""
        unit = self.units.get("client")
        if unit is None or unit.sample_rate >= 1.0:
            return None
        return self.server_stream.uniform(num_clients, f"cohort r{round_idx}")

    def budget_stop(self, round_idx: int) -> str | None:
        """A reason not to start this round (:func:`protocols.dp.budget_stop.budget_stop`)."""
        return budget_stop(self.units, self.settings, self.env)

    def privacy_graph(self, *, planned: bool = False) -> Graph:
        """This run's privacy-loss graph (:func:`protocols.dp.privacy_report.privacy_graph`)."""
        return privacy_graph(self, planned=planned)

    def privacy(self) -> dict[str, Any]:
        """Each unit's report (:func:`protocols.dp.privacy_report.privacy_report`)."""
        return privacy_report(self)

    # ---------------------------------------------------------------- client side
    def local_privatizer(self, cid: int, round_idx: int) -> LocalDPSGD | None:
        """Client side: client ``cid``'s DP-SGD for this round (:func:`protocols.dp.client_release.local_privatizer`)."""
        return client_release.local_privatizer(self, cid, round_idx)

    def client_plan_steps(
        self, inner: list[dict], *, round_idx: int, min_summands: int | None = None, on_node: bool = False
    ) -> list[dict]:
        """The clients' plan steps of this round (:func:`protocols.dp.client_release.client_plan_steps`)."""
        return client_release.client_plan_steps(self, inner, round_idx=round_idx, min_summands=min_summands, on_node=on_node)

    @client_side
    def noise_share_step(self, reply: Payload, data: ClientData, *, std: float, rows: list[int] | None, label: str) -> Payload:
        """Client side (a remote client's plan step): :func:`protocols.dp.client_release.noise_share_reply`."""
        return client_release.noise_share_reply(self, reply, data, std=std, rows=rows, label=label)

    @client_side
    def local_share_step(self, reply: Payload, data: ClientData, *, std: float, rows: list[int] | None, label: str) -> Payload:
        """Client side (a plan step of ``privacy.local.noise: shares``): :func:`protocols.dp.client_release.local_share_reply`."""
        return client_release.local_share_reply(self, reply, data, std=std, rows=rows, label=label)

    def client_stream(self, cid: int) -> SecretStream:
        """Client side: client ``cid``'s own secret (fresh from os.urandom unless privacy.noise_seed is set)."""
        if cid not in self._client_streams:
            self._client_streams[cid] = SecretStream.for_party(self.settings.privacy.noise_seed, f"client {cid}")
        return self._client_streams[cid]

    def check_round_payload(self, cid: int, round_idx: int, payload: Payload, plan: list[dict]) -> None:
        """Client side, on a remote node: a round trained again only on the same payload and plan, its DP noise being
        addressed by the round (:func:`protocols.dp.client_records.check_round_payload`)."""
        if self.client_state_on_nodes:
            self.client_stream(int(cid))  # its state holds the record
            check_round_payload(self._trained.setdefault(int(cid), {}), cid, round_idx, payload, plan)

    # ---------------------------------------------------------------- checkpoints
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
        banded = getattr(self, "banded_noise", None)
        return {"server": self.server_stream.state_dict(), **({"banded": banded.state_dict()} if banded else {})}

    def load_secret_state_dict(self, state: dict[str, Any]) -> None:
        if "server" in state:
            self.server_stream = SecretStream.from_state_dict(state["server"])
            if hasattr(self, "tree_noise"):  # node noise is addressed by node: redrawn from the restored key
                self.tree_noise = TreeNoise(self.server_stream, self.tree_noise.label)
            if hasattr(self, "banded_noise"):  # its draws from the restored key, its recursion from the checkpoint
                old = self.banded_noise
                self.banded_noise = BandedNoise(self.server_stream, old.label, old.bands, old.period)
                self.banded_noise.load_state_dict(state["banded"])

    def client_state_dict(self) -> dict[str, Any]:
        return client_state_dict(self._client_streams, self._trained)

    def load_client_state_dict(self, state: dict[str, Any]) -> None:
        self._client_streams, self._trained = load_client_state_dict(state)
