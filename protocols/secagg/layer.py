"""The ``secure_aggregation`` protocol layer: each round's sum through :mod:`protocols.secagg.protocol`."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from protocols.base import ProtocolLayer, RoundWrapper, StackEnv
from protocols.secagg.encoding import FixedPoint
from protocols.secagg.protocol import SecAggClient, SecAggServer, neighbour_graph, threshold_for
from secure_fed.algorithms.base import ClientData, ClientFn, Payload
from secure_fed.engine.aggregation import Aggregate, RoundSession


class SecureAggregation(ProtocolLayer):
    name = "secure_aggregation"

    def __init__(self, cfg, env: StackEnv):
        super().__init__(cfg, env)
        s = cfg.secure_aggregation
        self.codec = FixedPoint(s.clip_range, s.frac_bits, s.modulus_bits)
        self.codec.check_capacity(env.num_clients)
        self.layout = env.update_layout()
        self.last_stats: dict[str, Any] = {}
        self.transcripts: list | None = [] if cfg.output.log_messages else None

    def open_round(self, round_idx: int, inner: RoundSession) -> RoundSession:
        return _SecAggRound(self, round_idx, inner)

    def round_stats(self) -> dict[str, Any]:
        return self.last_stats


class _SecAggRound(RoundWrapper):
    def __init__(self, layer: SecureAggregation, round_idx: int, inner: RoundSession):
        super().__init__(inner)
        cfg = layer.cfg.secure_aggregation
        self.layer = layer
        self.bits = cfg.modulus_bits
        cohort = sorted(int(c) for c in inner.cohort)
        self.graph = neighbour_graph(cohort, cfg.neighbors, seed=layer.cfg.seed * 1000003 + round_idx)
        group = len(self.graph[cohort[0]]) + 1 if cohort else 1
        self.t = threshold_for(group, cfg.threshold)
        self.t_setup = self.t_mask = 0.0
        self.bytes_up = 0
        if not cohort:  # an empty (Poisson) cohort: a sum over nobody is zero, and nobody's input needs masking
            self.u2 = self.cohort = []
            self._set_min_summands(self.t)
            return
        rng = np.random.default_rng([layer.cfg.seed, 31, round_idx])
        self.drops = {
            stage: {u for u in cohort if rng.random() < cfg.dropout} for stage in ("advertise", "share", "input", "unmask")
        }
        t0 = time.perf_counter()
        self.clients = {u: SecAggClient(u, round_idx, self.graph[u], self.t) for u in cohort}  # client side
        self.server = SecAggServer(round_idx=round_idx, graph=self.graph, threshold=self.t, bits=self.bits)
        alive = [u for u in cohort if u not in self.drops["advertise"]]
        pks = self.server.collect_keys({u: self.clients[u].advertise() for u in alive})
        alive = [u for u in alive if u not in self.drops["share"]]
        inbox = self.server.route_shares({u: self.clients[u].share_keys(pks) for u in alive})
        for u in alive:
            self.clients[u].receive_shares(inbox[u])
        self.u2 = alive
        self.cohort = alive  # clients that dropped before sharing keys do not train this round
        self._set_min_summands(self.t)  # a completed sum holds ≥ t updates (each neighbourhood keeps ≥ t)
        self.t_setup = time.perf_counter() - t0

    def client_mod(self, fn: ClientFn) -> ClientFn:
        inner_fn = self.inner.client_mod(fn)
        layout, codec = self.layer.layout, self.layer.codec

        def masked(payload: Payload, data: ClientData) -> Payload:
            reply = inner_fn(payload, data)
            t0 = time.perf_counter()
            x = codec.encode(layout.flatten(reply, self.weighting))
            y = self.clients[data.client_id].masked_input(x, self.u2, self.bits)
            self.t_mask += time.perf_counter() - t0
            return {"masked": y}

        return masked

    def submit(self, cid: int, reply: Payload) -> None:
        if cid in self.drops["input"]:
            return  # it trained, then dropped before its masked input reached the server
        self.bytes_up = max(self.bytes_up, reply["masked"].nbytes)
        self.server.add_masked(cid, reply["masked"])

    def finish(self) -> Aggregate:
        if not self.inner.cohort:
            self.layer.last_stats = {"secagg_survivors": 0, "secagg_dropped": 0, "secagg_threshold": self.t}
            return self.inner.post(self.layer.layout.unflatten_sum(np.zeros(self.layer.layout.size), self.device))
        t0 = time.perf_counter()
        u3, dropped = self.server.request_unmasking()  # aborts here, before any share is asked for, if U3's graph splits
        replies = {u: self.clients[u].unmask(u3, dropped) for u in sorted(u3) if u not in self.drops["unmask"]}
        total = self.server.unmask(replies, self.layer.layout.size)
        agg = self.layer.layout.unflatten_sum(self.layer.codec.decode_sum(total), self.device)
        t_unmask = time.perf_counter() - t0
        self.layer.last_stats = {
            "secagg_survivors": len(u3),
            "secagg_dropped": len(self.inner.cohort) - len(u3),
            "secagg_threshold": self.t,
            "secagg_neighbours": len(next(iter(self.graph.values()))) if self.graph else 0,
            "secagg_setup_s": round(self.t_setup, 4),
            "secagg_mask_s": round(self.t_mask, 4),
            "secagg_unmask_s": round(t_unmask, 4),
            "secagg_bytes_per_client": int(self.bytes_up),
        }
        if self.layer.transcripts is not None:
            self.layer.transcripts.append(self.server.transcript)
        return self.inner.post(agg)
