"""The ``secure_aggregation`` protocol layer: each round's sum through :mod:`protocols.secagg.protocol`.

Before round 0 (:meth:`SecureAggregation.setup`) every client gets its long-term Ed25519 signing key and pins the
directory of public keys (``secure_aggregation.key_source``; the trust assumption is in
:mod:`protocols.secagg.signing`). The private keys live in the clients' state only (``client_state_dict``: their
Flower nodes' storage, or the clients' checkpoint), never in the server's objects or files. Each round the clients
sign their key advertisements and check their neighbours'; with ``consistency_check`` the server runs the
ConsistencyCheck stage between the masked inputs and the unmasking."""

from __future__ import annotations

import hashlib
import math
import time
from typing import Any

import numpy as np

from protocols.crypto import SigningKey
from protocols.layer_settings import SecureAggregationSettings
from protocols.randomness import SecretStream
from protocols.secagg.encoding import FixedPoint
from protocols.secagg.fault_schedule import FaultSchedule, load_fault_schedule
from protocols.secagg.graph_bounds import graph_for, poisson_cohort_floor
from protocols.secagg.protocol import SecAggAbort, SecAggClient, SecAggServer, neighbour_graph
from protocols.secagg.signing import ForgedMessage, read_directory, read_private_key
from secure_fed.plugin_api.layers import (
    Aggregate,
    ClientData,
    ClientFn,
    ClientSide,
    ConfigError,
    LayerState,
    Ledger,
    Payload,
    ProtocolLayer,
    RoundSession,
    RoundWrapper,
    SetupResult,
    StackEnv,
    StateScope,
    client_side,
)


class SecureAggregation(ProtocolLayer):
    name = "secure_aggregation"
    client_state_on_nodes = True  # the clients' long-term signing keys and pinned directories, from the set-up

    def __init__(self, settings: SecureAggregationSettings, env: StackEnv):
        super().__init__(settings, env)
        s = settings.section
        self.codec = FixedPoint(s.clip_range, s.frac_bits, s.modulus_bits)
        self.codec.check_capacity(env.num_clients)
        self.layout = env.update_layout()
        self._meta = self.layout.segments()["meta"]  # (weight, loss, 1): bookkeeping that must reach the sum exactly
        self.last_stats: dict[str, Any] = {}
        #: test only (``flower.debug_write_inputs``): called as ``(round_idx, survivors, sum words, bits)`` with each
        #: round's unmasked sum, server side
        self.on_unmasked = None
        self.transcripts: list | None = [] if settings.log_messages else None
        self._round_clients: dict[int, SecAggClient] = {}  # client side: each client's secrets of the current round
        self._signers: dict[int, SigningKey] = {}  # client side: each client's own long-term signing key
        self._pinned: dict[int, dict[int, bytes]] = {}  # client side: the directory each client pinned at set-up
        # client side: per client, the rounds it advertised in (round → digest of the server's advertise request)
        self._advertised: dict[int, dict[int, bytes]] = {}
        self.directory: dict[int, bytes] | None = None  # server side: the public keys (None before the key set-up)
        # the server's secret behind each round's graph (its order of the cohort): colluders fixed before the run
        # cannot know which clients will be a target's neighbours (protocols.secagg.graph_bounds)
        self.graph_stream = SecretStream.for_party(s.graph_seed, "secagg-graph")
        self._fault_schedule: FaultSchedule | None = None  # read at the first round (the server's side only)

    # ------------------------------------------------------------------ the hooks (secure_fed.engine.layers)
    def setup(self, ctx) -> SetupResult:
        """The signing-key set-up (:meth:`key_setup`)."""
        facts = self.key_setup(lambda payload_fn: ctx.query(payload_fn, self._client_keys))
        return SetupResult(facts={"secure_aggregation": facts})

    def clients(self) -> ClientSide:
        """Clients: the mask as the round plan's last step; the threshold each client checked at advertise."""
        return ClientSide(plan_steps=self.client_plan_steps, min_summands=self.client_min_summands)

    def ledger(self) -> Ledger:
        """The round's diagnostics (survivors, timings, the graph's bounds)."""
        return Ledger(round_stats=self.round_stats)

    def state(self) -> LayerState:
        """The signing-key directory (server), the graph secret (secret), each client's keys and round (client)."""
        return LayerState(
            server=StateScope(self.state_dict, self.load_state_dict),
            client=StateScope(self.client_state_dict, self.load_client_state_dict),
            secret=StateScope(self.secret_state_dict, self.load_secret_state_dict),
        )

    # ------------------------------------------------------------------ one-off key set-up

    def key_setup(self, query) -> dict[str, Any]:
        """Signing keys, once a run (at :meth:`setup`, or before the first round of a caller that opens rounds
        without it): each client registers (draws, or reads its file), then pins the directory. With ``key_source:
        setup`` the directory is the one assembled from these answers (this exchange is trusted); with ``file`` each
        client reads ``directory.json`` itself, and the server checks the answers against it. ``query(payload_fn)``
        asks every client of the federation."""
        s = self.settings.section
        replies = query(lambda cid: {"secagg_keys": "register"})
        directory = {int(cid): r["sign_pk"] for cid, r in replies}
        if s.key_source == "file":
            pinned = read_directory(s.keys_dir)
            if bad := sorted(c for c, pk in directory.items() if pinned.get(c) != pk):
                raise ConfigError(f"secure_aggregation.keys_dir {s.keys_dir}: clients {bad[:5]} hold keys that "
                                  "directory.json does not list")  # fmt: skip
            directory = pinned
        query(lambda cid: {"secagg_keys": "pin", "directory": directory})
        self.directory = directory
        return {"signing_keys": len(directory), "key_source": s.key_source}

    @client_side
    def _client_keys(self, payload: Payload, data: ClientData) -> Payload:
        """Client side of the key set-up: its own signing key (kept here only), then the directory it pins.

        Both are write-once client state: a second ``register`` answers the key the client already holds (it draws
        no new one), and a second ``pin`` is refused unless it names the very directory pinned (a resumed run's
        set-up), so a server that turns malicious after the set-up cannot swap its own keys in for the neighbours'.
        With ``key_source: file`` the client pins the operator's ``directory.json`` and refuses any other."""
        cid, s = data.client_id, self.settings.section
        if payload["secagg_keys"] == "register":
            if cid not in self._signers:
                self._signers[cid] = read_private_key(s.keys_dir, cid) if s.key_source == "file" else SigningKey()
            return {"sign_pk": self._signers[cid].public}
        if payload["secagg_keys"] == "pin":
            offered = {int(c): bytes(pk) for c, pk in payload.get("directory", {}).items()}
            if s.key_source == "file":  # the operator's file, not the server's word
                directory = read_directory(s.keys_dir)
                if offered and offered != directory:
                    raise ForgedMessage(f"client {cid}: the server's signing-key directory is not the operator's "
                                        "directory.json it already pinned: refused")  # fmt: skip
            else:
                directory = offered
            if (held := self._pinned.get(cid)) is not None:
                if directory != held:
                    raise ForgedMessage(f"client {cid}: a signing-key directory is already pinned; another one is "
                                        "refused")  # fmt: skip
                return {"pinned": len(held)}
            if cid not in self._signers or directory.get(cid) != self._signers[cid].public:
                raise ForgedMessage(f"client {cid}: the signing-key directory does not hold this client's own key: refused")
            self._pinned[cid] = directory
            return {"pinned": len(directory)}
        raise ValueError(f"unknown secure aggregation key step {payload['secagg_keys']!r}")

    @property
    def fault_schedule(self) -> FaultSchedule | None:
        """``secure_aggregation.fault_schedule``, read once (None without one): the server side's scripted dropouts.
        Read when a round first asks, so that a remote node, which never draws the dropouts, needs no copy of it."""
        path = self.settings.section.fault_schedule
        if path is not None and self._fault_schedule is None:
            self._fault_schedule = load_fault_schedule(path)
        return self._fault_schedule

    def open_round(self, round_idx: int, inner: RoundSession) -> RoundSession:
        return _SecAggRound(self, round_idx, inner)

    def round_stats(self) -> dict[str, Any]:
        return self.last_stats

    # ------------------------------------------------------------------ client side
    @client_side
    def client_stage(self, payload: Payload, data: ClientData) -> Payload:
        """Client side of one stage of a round (a message from the server): advertise keys, share keys, receive
        the shares addressed to this client, or unmask (Bonawitz et al. 2017, steps 0, 1 and 3)."""
        cid, stage = data.client_id, payload["secagg"]
        if stage == "advertise":  # a new round: fresh keys and self-mask seed
            r = int(payload["secagg_round"])
            nbrs, t = self._check_neighbourhood(cid, payload)
            digest = hashlib.sha256(repr((r, sorted(nbrs), t)).encode()).digest()
            seen = self._advertised.setdefault(cid, {})
            if r in seen:
                # one session a round: a second run of the round (fresh keys, the same input) would let the server
                # take two sums over different survivor sets, whose difference is one input, and replay survivor
                # signatures across runs. Only the client's own session of the round, still held, goes on (the
                # same keys and the same sign-once, mask-once and unmask-once memory)
                held = self._round_clients.get(cid)
                if seen[r] == digest and held is not None and held.round_idx == r:
                    return held.advertise()
                raise PermissionError(
                    f"client {cid}: round {r} advertised again (another neighbourhood or threshold, or a session it "
                    "no longer holds): refused; a client takes part in one run of each secure aggregation round"
                )
            seen[r] = digest
            # Without a pinned directory (no key set-up) the advertisement goes unsigned and the share stage refuses
            client = SecAggClient(
                cid,
                r,
                nbrs,
                t,
                signer=self._signers.get(cid),
                directory=self._pinned.get(cid),
                consistency=self.settings.section.consistency_check,
            )
            self._round_clients[cid] = client
            return client.advertise()
        client = self._round_clients.get(cid)
        if client is None or client.round_idx != int(payload["secagg_round"]):
            raise ValueError(f"client {cid}: secure aggregation stage {stage!r} of a round it did not advertise in")
        if stage == "share":
            if client.directory is None:  # fail closed: no share leaves a client that cannot check who receives it
                raise ForgedMessage(f"client {cid}: no pinned signing-key directory (the key set-up did not run): "
                                    "refuses to share keys")  # fmt: skip
            return {"secagg_sealed": client.share_keys(payload["secagg_keys"])}
        if stage == "receive":
            client.receive_shares(payload["secagg_sealed"])
            return {}
        if stage == "consistency":
            return {"secagg_signature": client.sign_survivors([int(u) for u in payload["secagg_survived"]])}
        if stage == "unmask":
            sigs = {int(w): sig for w, sig in payload.get("secagg_signatures", {}).items()}
            shares = client.unmask({int(u) for u in payload["secagg_survived"]}, {int(u) for u in payload["secagg_dropped"]},
                                   sigs)  # fmt: skip
            del self._round_clients[cid]  # the round is over for this client
            return {"secagg_shares": shares}
        raise ValueError(f"unknown secure aggregation stage {stage!r}")

    def _check_neighbourhood(self, cid: int, payload: Payload) -> tuple[list[int], int]:
        """Client side: the neighbours and threshold the server sends, refused unless they are the round's, which
        the client computes itself from the config and public facts: the cohort's size n (the config's, under
        fixed-size sampling; the size the server states under Poisson sampling, at most the federation's N), the
        graph k = :func:`graph_for` (n, config, N) would build, and t = ⌈τ(k + 1)⌉. A server that told a client
        it had one neighbour (a colluder) would make its "sum" that colluder's input plus its own."""
        s, N = self.settings.section, self.env.num_clients
        nbrs, t = [int(v) for v in payload["secagg_neighbours"]], int(payload["secagg_threshold"])
        if self.settings.training.sampling == "poisson":
            if "secagg_cohort" not in payload:
                raise PermissionError(f"client {cid}: a secure aggregation round that does not state its cohort's size: "
                                      "refused")  # fmt: skip
            n = int(payload["secagg_cohort"])
            floor = poisson_cohort_floor(N, s)
            if n < floor:  # a server that claimed a tiny cohort would pick a k and t the declared colluders can open
                raise PermissionError(
                    f"client {cid}: a Poisson cohort of {n} of {N} clients, below the public floor {floor} (the least "
                    f"whose graph needs more than the ⌊γN⌋ colluders secure_aggregation.corrupt_fraction declares): refused"
                )
        else:
            n = self.settings.training.cohort_size(N)
        if not 2 <= n <= N:
            raise PermissionError(f"client {cid}: a secure aggregation cohort of {n} of {N} clients: refused")
        choice = graph_for(n, s, population=N)
        k = n - 1 if choice.neighbors is None else choice.neighbors
        if len(set(nbrs)) != len(nbrs) or cid in nbrs or len(nbrs) != k:
            raise PermissionError(
                f"client {cid}: the server's {len(set(nbrs) - {cid})} secure aggregation neighbours are not the {k} "
                f"that the config gives a cohort of {n} of {N} clients: refused"
            )
        # the threshold follows from the neighbourhood and the run's config, which the client has: a server cannot
        # set it (a lower t lets fewer clients' shares unmask; it also sets the noise shares' size)
        if t != choice.threshold:
            raise PermissionError(
                f"client {cid}: the server's secure aggregation threshold {t} is not the {choice.threshold} that "
                f"secure_aggregation.threshold {s.threshold:g} gives for {k + 1} clients: refused"
            )
        return nbrs, t

    @client_side
    def mask_step(self, reply: Payload, data: ClientData, *, secagg_round: int, weighting: str) -> Payload:
        """Client side, after training (the last step of the round's plan): the update, flattened and encoded,
        masked (step 2) with the pairwise masks of the neighbours whose shares this client holds, i.e. those that
        completed ShareKeys (the client's own view, not a list the server could shorten to strip the masks)."""
        client = self._round_clients.get(data.client_id)
        if client is None or client.round_idx != int(secagg_round):
            raise ValueError(f"client {data.client_id}: asked to mask an update for a round it did not share keys in")
        alive = sorted(client.held_shares)
        if len(alive) < client.threshold:
            raise ValueError(f"client {data.client_id}: only {len(alive)} shares held, below the threshold t = "
                             f"{client.threshold}; it does not send its update")  # fmt: skip
        x = self.layout.flat_view(reply, weighting)  # read a block at a time inside the masking: no θ-sized copy
        # the encoding clips to ±R; a clipped update value is the range's design, a clipped weight or loss would
        # silently skew the round's mean and its reported loss: refused, naming the value's kind (not the value)
        R = self.codec.clip_range
        meta = dict(zip(("weight", "training loss"), x[self._meta][:2].tolist(), strict=True))
        if over := [name for name, v in meta.items() if abs(v) > R]:
            raise ConfigError(
                f"secure_aggregation.clip_range {R:g} would clip client {data.client_id}'s {' and '.join(over)} (they "
                "travel in the encoded sum): raise clip_range (lowering frac_bits to fit)"
            )
        bits = self.settings.section.modulus_bits
        return {"masked": client.masked_input(x, alive, bits, encode=self.codec.encode_into)}

    def client_plan_steps(
        self, inner: list[dict], *, round_idx: int, min_summands: int | None = None, on_node: bool = False
    ) -> list[dict]:
        """Remote clients: the inner sessions' steps, then this round's mask (the last step before the wire)."""
        mask = {
            "op": "layer:secure_aggregation.mask_step",
            "secagg_round": round_idx,
            "weighting": self.settings.training.aggregation,
        }
        return [*inner, mask]

    def client_min_summands(self, cid: int, round_idx: int) -> int | None:
        """Client side: this round's threshold t, as the client checked it at advertise (a completed sum holds ≥ t)."""
        client = self._round_clients.get(cid)
        return client.threshold if client is not None and client.round_idx == round_idx else None

    def graph_seed(self, round_idx: int) -> bytes:
        """The key of round ``round_idx``'s order of the cohort: 256 bits drawn from the server's graph secret (the
        order is :func:`~protocols.crypto.secret_permutation` under all of them)."""
        return self.graph_stream._words(f"secagg graph r{round_idx}", 4).astype("<u8").tobytes()

    def state_dict(self) -> dict[str, Any]:
        return {"directory": self.directory}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.directory = state.get("directory")

    def secret_state_dict(self) -> dict[str, Any]:
        return {"graph": self.graph_stream.state_dict()}

    def load_secret_state_dict(self, state: dict[str, Any]) -> None:
        if "graph" in state:  # a checkpoint from before the graph secret: later rounds draw from a fresh one
            self.graph_stream = SecretStream.from_state_dict(state["graph"])

    def client_state_dict(self) -> dict[str, Any]:
        """Per client (its own storage): its signing key, the directory it pinned, and its round's secrets if a round
        is under way."""
        out: dict[int, Any] = {}
        for cid in sorted({*self._signers, *self._pinned, *self._round_clients, *self._advertised}):
            c = self._round_clients.get(cid)
            out[cid] = {"sign_sk": self._signers[cid].private_bytes() if cid in self._signers else None,
                        "directory": dict(self._pinned.get(cid, {})), "round": None if c is None else c.state(),
                        "advertised": dict(self._advertised.get(cid, {}))}  # fmt: skip
        return out

    def load_client_state_dict(self, state: dict[str, Any]) -> None:
        self._signers, self._pinned, self._round_clients, self._advertised = {}, {}, {}, {}
        for cid, st in state.items():
            cid = int(cid)
            if "round" not in st:  # a checkpoint from before the signing keys: the round's secrets alone
                st = {"sign_sk": None, "directory": {}, "round": st}
            if st.get("sign_sk"):
                self._signers[cid] = SigningKey.from_private_bytes(st["sign_sk"])
            if st.get("directory"):
                self._pinned[cid] = {int(c): bytes(pk) for c, pk in st["directory"].items()}
            if st.get("advertised"):
                self._advertised[cid] = {int(r): bytes(d) for r, d in st["advertised"].items()}
            if st.get("round") is not None:
                self._round_clients[cid] = SecAggClient.from_state(
                    st["round"], signer=self._signers.get(cid), directory=self._pinned.get(cid)
                )


def _finite(x: float) -> float | None:
    return round(x, 2) if math.isfinite(x) else None


class _SecAggRound(RoundWrapper):
    def __init__(self, layer: SecureAggregation, round_idx: int, inner: RoundSession):
        super().__init__(inner)
        sa = layer.settings.section
        self.layer = layer
        self.round_idx = round_idx
        self.bits = sa.modulus_bits
        cohort = sorted(int(c) for c in inner.cohort)
        if len(cohort) == 1:  # its "sum" is its own update: nothing to hide it among
            raise SecAggAbort(f"round {round_idx}: a cohort of one client, whose secure sum would be its own update")
        if layer.settings.training.sampling == "poisson" and cohort:  # clients refuse a stated cohort below the public floor
            floor = poisson_cohort_floor(layer.env.num_clients, sa)  # (an empty cohort sums nothing: no abort)
            if len(cohort) < floor:
                raise SecAggAbort(f"round {round_idx}: a Poisson cohort of {len(cohort)}, below the public floor {floor}")
        if layer.directory is None:  # rounds opened without the run's set-up: the key set-up first
            everyone = list(range(layer.env.num_clients))
            layer.key_setup(lambda fn: layer.env.call_clients(everyone, fn, layer._client_keys))
        self.choice = graph_for(len(cohort), sa, population=layer.env.num_clients)
        self.graph = neighbour_graph(cohort, self.choice.neighbors, seed=layer.graph_seed(round_idx))
        self.t = self.choice.threshold  # ⌈τ·(degree + 1)⌉ of the graph built (each client checks it at advertise)
        self.t_setup = self.t_mask = 0.0
        self.bytes_up = 0
        if not cohort:  # an empty (Poisson) cohort: a sum over nobody is zero, and nobody's input needs masking
            self.u2 = self.cohort = []
            self._set_min_summands(self.t)
            return
        if layer.fault_schedule is not None:  # scripted: each stage's clients of the nodes killed by then
            self.drops = layer.fault_schedule.drops(round_idx, cohort)
        else:
            rng = np.random.default_rng([layer.env.seed, 31, round_idx])
            self.drops = {
                stage: {u for u in cohort if rng.random() < sa.dropout} for stage in ("advertise", "share", "input", "unmask")
            }
        t0 = time.perf_counter()
        self.server = SecAggServer(
            round_idx=round_idx, graph=self.graph, threshold=self.t, bits=self.bits, keep_inputs=layer.transcripts is not None
        )  # else only the running sum is held
        alive = [u for u in cohort if u not in self.drops["advertise"]]
        # each stage goes on with the clients that answered the one before (a remote client whose node fails drops out)
        pks = self.server.collect_keys(dict(self._call(alive, lambda u: {
            "secagg": "advertise", "secagg_neighbours": self.graph[u], "secagg_threshold": self.t,
            "secagg_cohort": len(cohort)})))  # fmt: skip
        alive = [u for u in alive if u in pks and u not in self.drops["share"]]
        sealed = self._call(alive, lambda u: {"secagg": "share", "secagg_keys": {v: pks[v] for v in self.graph[u] if v in pks}})
        inbox = self.server.route_shares({u: r["secagg_sealed"] for u, r in sealed})
        alive = [u for u in alive if u in inbox]
        self._call(alive, lambda u: {"secagg": "receive", "secagg_sealed": inbox[u]})
        self.u2 = alive
        self.cohort = alive  # clients that dropped before sharing keys do not train this round
        self._set_min_summands(self.t)  # a completed sum holds ≥ t updates (each neighbourhood keeps ≥ t)
        self.t_setup = time.perf_counter() - t0

    def _call(self, cids: list[int], payload_fn) -> list[tuple[int, Payload]]:
        """One stage: a guarded message to each of ``cids`` (in process, or to their Flower nodes)."""
        return self.layer.env.call_clients(cids, lambda u: {**payload_fn(u), "secagg_round": self.round_idx},
                                           self.layer.client_stage, partial=True)  # fmt: skip

    def client_mod(self, fn: ClientFn) -> ClientFn:
        inner_fn = self.inner.client_mod(fn)
        # the mask step's arguments as the round's plan gives them to a remote node
        args = {k: v for k, v in self.layer.client_plan_steps([], round_idx=self.round_idx)[-1].items() if k != "op"}

        def masked(payload: Payload, data: ClientData) -> Payload:
            reply = inner_fn(payload, data)
            t0 = time.perf_counter()
            out = self.layer.mask_step(reply, data, **args)
            self.t_mask += time.perf_counter() - t0
            return out

        return masked

    def client_plan(self) -> list[dict]:
        return self.layer.client_plan_steps(self.inner.client_plan(), round_idx=self.round_idx)

    def submit(self, cid: int, reply: Payload) -> None:
        if cid in self.drops["input"]:
            # it trained, then dropped before its masked input reached the server: not a participant of the round,
            # as a remote client whose training message is lost (the executor's drop; the server step then leaves
            # its labels out), while the abort stays the secure sum's own decision (at Unmasking)
            self.inner.dropped.setdefault(int(cid), "dropped before its masked input reached the server")
            return
        self.bytes_up = max(self.bytes_up, reply["masked"].nbytes)
        self.server.add_masked(cid, reply["masked"])

    def finish(self) -> Aggregate:
        if not self.inner.cohort:
            self.layer.last_stats = {"secagg_survivors": 0, "secagg_dropped": 0, "secagg_threshold": self.t}
            return self.inner.post(self.layer.layout.unflatten_sum(np.zeros(self.layer.layout.size), self.device))
        t0 = time.perf_counter()
        u3, dropped = self.server.request_unmasking()  # aborts here, before any share is asked for, if U3's graph splits
        if self.layer.settings.section.consistency_check:  # each survivor signs the U3 it is told, once
            signed = self._call(sorted(u3), lambda u: {"secagg": "consistency", "secagg_survived": sorted(u3)})
            self.server.collect_signatures({u: r["secagg_signature"] for u, r in signed})
        asked = [u for u in sorted(u3) if u not in self.drops["unmask"]]
        ask = {"secagg": "unmask", "secagg_survived": sorted(u3), "secagg_dropped": sorted(dropped)}
        answers = self._call(asked, lambda u: {**ask, "secagg_signatures": self.server.signatures_for(u)})
        replies = {u: r["secagg_shares"] for u, r in answers}
        total = self.server.unmask(replies, self.layer.layout.size)
        if self.layer.on_unmasked is not None:
            self.layer.on_unmasked(self.round_idx, sorted(u3), total, self.bits)
        agg = self.layer.layout.unflatten_sum(self.layer.codec.decode_sum(total), self.device)
        t_unmask = time.perf_counter() - t0
        self.layer.last_stats = {
            "secagg_survivors": len(u3),
            "secagg_dropped": len(self.inner.cohort) - len(u3),
            "secagg_threshold": self.t,
            "secagg_neighbours": len(next(iter(self.graph.values()))) if self.graph else 0,
            # the graph's bounds (protocols.secagg.graph_bounds), log2; null where the bound is 0
            "secagg_log2_privacy_bound": _finite(self.choice.log2_privacy_failure),
            "secagg_log2_abort_bound": _finite(self.choice.log2_abort),
            "secagg_setup_s": round(self.t_setup, 4),
            "secagg_mask_s": round(self.t_mask, 4),
            "secagg_unmask_s": round(t_unmask, 4),
            "secagg_bytes_per_client": int(self.bytes_up),
        }
        if self.layer.transcripts is not None:
            self.layer.transcripts.append(self.server.transcript)
        return self.inner.post(agg)
