"""Secure aggregation with dropout recovery (Bonawitz et al. 2017, CCS) on a SecAgg+ neighbour graph.

Honest-but-curious server variant (no consistency-check signatures). Per round:

0. **AdvertiseKeys** — each client u makes two X25519 key pairs, (c_u) for the
   share channel and (s_u) for mask agreement, and sends both public keys.
1. **ShareKeys** — u draws a self-mask seed b_u, Shamir-splits b_u and s_u's
   private key t-of-(k+1) over its neighbourhood N(u) ∪ {u}, and sends each
   neighbour its shares AES-GCM-sealed under HKDF(X25519(c_u, c_v)).
2. **MaskedInput** — u sends y_u = x_u + PRG(b_u) + Σ_{v ∈ N(u) alive} ±PRG(s_uv) mod 2^bits,
   with s_uv = HKDF(X25519(s_u, s_v)), + if u < v and − otherwise.
3. **Unmasking** — each surviving client returns, per neighbour, the share of
   b_u if u sent its input and the share of s_u's key if u dropped after
   step 1. The server rebuilds them (≥ t shares each) and strips the masks.

The server sums exactly Σ_{u ∈ U3} x_u when at most (k+1) − t clients of any
neighbourhood drop and the graph induced on the survivors stays connected; it
raises :class:`SecAggAbort` otherwise. Connectivity matters on a sparse graph:
once the self masks and the dropped clients' masks are stripped, the only masks
left are the pairwise ones between surviving neighbours, and they cancel in the
sum over any connected component of the graph on U3, so a split would hand the
server one partial sum per component. The server therefore checks, after every
stage and before it asks for any unmasking share, that the graph on the live
clients (on U3 from MaskedInput on) is connected. Masks come from
AES-256-CTR (``protocols.crypto.add_masks``). With ``neighbors = n − 1`` the
graph is complete and this is the original SecAgg.

The server object never holds a private key or a seed: only public keys,
sealed ciphertexts, masked vectors and, in step 3, the shares it is entitled
to. ``transcript`` records every message the server received.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from protocols.crypto import KeyPair, add_masks, open_sealed, seal, shamir_combine, shamir_split, word_dtype
from secure_fed.errors import RoundAborted


class SecAggAbort(RoundAborted):
    """Too few clients survived for the sum to be recovered, or the survivors' graph split (partial sums would leak)."""


def neighbour_graph(cohort: list[int], k: int | None, seed: int) -> dict[int, list[int]]:
    """A k-regular-ish undirected graph (Harary-style ring over a public shuffle); complete if k ≥ n − 1."""
    n = len(cohort)
    if k is None or k >= n - 1:
        return {u: [v for v in cohort if v != u] for u in cohort}
    order = [int(u) for u in np.random.default_rng(seed).permutation(cohort)]
    pos = {u: i for i, u in enumerate(order)}
    half = max(1, k // 2)
    nbrs: dict[int, set[int]] = {u: set() for u in cohort}
    for u in cohort:
        for j in range(1, half + 1):
            for v in (order[(pos[u] + j) % n], order[(pos[u] - j) % n]):
                if v != u:
                    nbrs[u].add(v)
                    nbrs[v].add(u)
    return {u: sorted(vs) for u, vs in nbrs.items()}


def components(graph: dict[int, list[int]], alive: Iterable[int]) -> list[set[int]]:
    """Connected components (BFS) of the undirected graph induced on ``alive``, largest first, ties by smallest id.

    An edge listed in either direction counts; a vertex absent from ``graph`` is isolated. Pure: reads nothing else.
    """
    live = {int(u) for u in alive}
    adj: dict[int, set[int]] = {u: set() for u in live}
    for u in live:
        for v in graph.get(u, ()):
            if v in live and v != u:
                adj[u].add(v)
                adj[v].add(u)
    seen: set[int] = set()
    parts: list[set[int]] = []
    for start in sorted(live):
        if start in seen:
            continue
        seen.add(start)
        part, queue = {start}, deque([start])
        while queue:
            u = queue.popleft()
            for v in adj[u]:
                if v not in seen:
                    seen.add(v)
                    part.add(v)
                    queue.append(v)
        parts.append(part)
    return sorted(parts, key=lambda c: (-len(c), min(c)))


def _pair_info(u: int, v: int, round_idx: int) -> bytes:
    a, b = min(u, v), max(u, v)
    return f"secagg round {round_idx} pair {a}-{b}".encode()


@dataclass
class SecAggClient:
    """One client's side of one round. Holds its secrets; nothing here is sent in the clear."""

    cid: int
    round_idx: int
    neighbours: list[int]
    threshold: int
    c_key: KeyPair = field(default_factory=KeyPair)
    s_key: KeyPair = field(default_factory=KeyPair)
    b_seed: bytes = field(default_factory=lambda: os.urandom(32))
    peers_c: dict[int, bytes] = field(default_factory=dict)
    peers_s: dict[int, bytes] = field(default_factory=dict)
    held_shares: dict[int, tuple[tuple[int, bytes], tuple[int, bytes]]] = field(default_factory=dict)
    #: it sent its masked input: the round's masks hide one input only (two inputs masked alike would give the
    #: server their difference in the clear)
    masked: bool = False

    def advertise(self) -> dict:
        return {"c_pk": self.c_key.public, "s_pk": self.s_key.public}

    def state(self) -> dict:
        """Everything this client holds in the round (its secrets included): for its own storage only."""
        return {"cid": self.cid, "round_idx": self.round_idx, "neighbours": list(self.neighbours),
                "threshold": self.threshold, "c_sk": self.c_key.private_bytes(), "s_sk": self.s_key.private_bytes(),
                "b_seed": self.b_seed, "peers_c": dict(self.peers_c), "peers_s": dict(self.peers_s),
                "held_shares": {u: [list(b), list(s)] for u, (b, s) in self.held_shares.items()},
                "masked": self.masked}  # fmt: skip

    @classmethod
    def from_state(cls, st: dict) -> SecAggClient:
        return cls(
            cid=int(st["cid"]), round_idx=int(st["round_idx"]), neighbours=[int(v) for v in st["neighbours"]],
            threshold=int(st["threshold"]), c_key=KeyPair.from_private_bytes(st["c_sk"]),
            s_key=KeyPair.from_private_bytes(st["s_sk"]), b_seed=st["b_seed"],
            peers_c={int(k): v for k, v in st["peers_c"].items()}, peers_s={int(k): v for k, v in st["peers_s"].items()},
            held_shares={int(u): ((int(b[0]), b[1]), (int(s[0]), s[1])) for u, (b, s) in st["held_shares"].items()},
            masked=bool(st.get("masked", False)),
        )  # fmt: skip

    def share_keys(self, public_keys: dict[int, dict]) -> dict[int, bytes]:
        """Seal (share of b_u, share of s_u) to each neighbour still alive; keeps its own pair."""
        group = sorted([self.cid, *self.neighbours])
        idx = {v: i + 1 for i, v in enumerate(group)}  # Shamir x-coordinate of each member
        b_sh = dict(shamir_split(self.b_seed, threshold=self.threshold, num_shares=len(group)))
        s_sh = dict(shamir_split(self.s_key.private_bytes(), threshold=self.threshold, num_shares=len(group)))
        out = {}
        for v in group:
            share = ((idx[v], b_sh[idx[v]]), (idx[v], s_sh[idx[v]]))
            if v == self.cid:
                self.held_shares[self.cid] = share
                continue
            if v not in public_keys:
                continue  # dropped in step 0
            self.peers_c[v] = public_keys[v]["c_pk"]
            self.peers_s[v] = public_keys[v]["s_pk"]
            key = self.c_key.agree(self.peers_c[v], info=_pair_info(self.cid, v, self.round_idx) + b" share channel")
            # Shamir x-coordinates in 2 bytes: a complete graph of more than 255 clients has indices above 255
            plain = b"".join([self.cid.to_bytes(4, "little"), v.to_bytes(4, "little"), share[0][0].to_bytes(2, "little"),
                              share[0][1], share[1][0].to_bytes(2, "little"), share[1][1]])  # fmt: skip
            out[v] = seal(key, plain, aad=_pair_info(self.cid, v, self.round_idx))
        return out

    def receive_shares(self, sealed: dict[int, bytes]) -> None:
        for u, blob in sealed.items():
            key = self.c_key.agree(self.peers_c[u], info=_pair_info(u, self.cid, self.round_idx) + b" share channel")
            plain = open_sealed(key, blob, aad=_pair_info(u, self.cid, self.round_idx))
            if int.from_bytes(plain[:4], "little") != u or int.from_bytes(plain[4:8], "little") != self.cid:
                raise SecAggAbort(f"client {self.cid}: a share from {u} is addressed wrongly")
            b_len = (len(plain) - 12) // 2
            x_b, x_s = int.from_bytes(plain[8:10], "little"), int.from_bytes(plain[10 + b_len : 12 + b_len], "little")
            self.held_shares[u] = ((x_b, plain[10 : 10 + b_len]), (x_s, plain[12 + b_len :]))

    def masked_input(
        self, x: np.ndarray, alive: list[int], bits: int, *, encode: Callable[[np.ndarray, np.ndarray], None] | None = None
    ) -> np.ndarray:
        """y_u = x_u + PRG(b_u) + Σ ±PRG(s_uv) mod 2^bits (every word below 2^bits: the words of a sum taken mod
        2^(word width) would carry the count of wrap-arounds, which depends on x), over neighbours that completed
        step 1.

        ``x`` is the encoded input (words of ``word_dtype(bits)``: uint32 for bits ≤ 32, else uint64), or, with
        ``encode`` (e.g. :meth:`FixedPoint.encode_into`), the real vector — an array, or anything sliced as
        ``x[a:b]`` with a length, such as the layout's :class:`~secure_fed.engine.aggregation.FlatUpdate` — encoded
        into the output a block at a time as the masks are added (no encoded copy of x, and no flat copy of a
        ``FlatUpdate``)."""
        if self.masked:
            raise PermissionError(
                f"client {self.cid}: asked for a second masked input in round {self.round_idx}; the same masks on two "
                "inputs would give their difference in the clear: refused"
            )
        self.masked = True
        terms = [(self.b_seed, 1)]
        for v in self.neighbours:
            if v in alive:
                s_uv = self.s_key.agree(self.peers_s[v], info=_pair_info(self.cid, v, self.round_idx) + b" mask")
                terms.append((s_uv, 1 if self.cid < v else -1))
        out = np.empty(len(x), dtype=word_dtype(bits))
        if encode is None:
            return add_masks(out, terms, base=np.asarray(x, dtype=out.dtype), bits=bits)
        return add_masks(out, terms, fill=lambda o, blk: encode(x[o : o + len(blk)], blk), bits=bits)

    def unmask(self, survived: set[int], dropped: set[int]) -> dict[int, tuple[str, tuple[int, bytes]]]:
        """Step 3: per neighbour, the b-share if it survived or the s-key share if it dropped (never both)."""
        out = {}
        for u, (b_share, s_share) in self.held_shares.items():
            if u in survived:
                out[u] = ("b", b_share)
            elif u in dropped:
                out[u] = ("s", s_share)
        return out


class SecAggServer:
    """The server's side: routes messages, sums masked inputs, strips masks. Holds no secret."""

    def __init__(self, *, round_idx: int, graph: dict[int, list[int]], threshold: int, bits: int,
                 keep_inputs: bool = True):  # fmt: skip
        """``keep_inputs``: the transcript keeps each masked input itself (an audit's view of what the server saw);
        otherwise it records that the input came, and the server holds only the running sum (one vector, not one
        per client)."""
        self.round_idx = round_idx
        self.keep_inputs = keep_inputs
        self.graph = graph
        self.t = threshold
        self.bits = bits
        self.public_keys: dict[int, dict] = {}
        self.transcript: list[tuple[str, int, object]] = []
        self.u2: set[int] = set()
        self.u3: set[int] = set()
        self.total: np.ndarray | None = None

    def _need(self, alive: set[int], stage: str, *, linked: set[int] | None = None) -> None:
        """Abort unless ≥ t of ``alive`` live, in total and in every live client's neighbourhood, and the graph on
        ``linked`` (``alive`` unless given) is connected: otherwise the server could learn one sum per component."""
        if len(alive) < self.t:
            raise SecAggAbort(
                f"secure aggregation aborted at {stage}: {len(alive)} clients alive, fewer than the threshold t = {self.t}"
            )
        for u in alive:
            group = set(self.graph[u]) | {u}
            if len(group & alive) < self.t:
                raise SecAggAbort(
                    f"secure aggregation aborted at {stage}: client {u}'s neighbourhood has "
                    f"{len(group & alive)} live members, fewer than the threshold t = {self.t}"
                )
        linked = alive if linked is None else linked
        parts = components(self.graph, linked)
        if len(parts) > 1:
            sizes = ", ".join(str(len(c)) for c in parts)
            raise SecAggAbort(
                f"secure aggregation aborted at {stage}: the neighbour graph on the {len(linked)} surviving clients splits "
                f"into {len(parts)} parts (sizes {sizes}), so the server could learn partial sums"
            )

    def collect_keys(self, msgs: dict[int, dict]) -> dict[int, dict]:
        for u, m in msgs.items():
            self.transcript.append(("advertise", u, m))
        self.public_keys = dict(msgs)
        self._need(set(msgs), "AdvertiseKeys")
        return self.public_keys

    def route_shares(self, msgs: dict[int, dict[int, bytes]]) -> dict[int, dict[int, bytes]]:
        inbox: dict[int, dict[int, bytes]] = {v: {} for v in msgs}
        for u, per in msgs.items():
            self.transcript.append(("share_keys", u, per))
            for v, blob in per.items():
                if v in inbox:
                    inbox[v][u] = blob
        self.u2 = set(msgs)
        self._need(self.u2, "ShareKeys")
        return inbox

    def add_masked(self, u: int, y: np.ndarray) -> None:
        y = np.asarray(y)
        want = word_dtype(self.bits)
        if y.dtype != want or y.ndim != 1 or (self.total is not None and y.shape != self.total.shape):
            raise SecAggAbort(f"secure aggregation aborted: client {u}'s masked input is not a {want} vector of the "
                              f"round's length ({y.dtype}, shape {y.shape})")  # fmt: skip
        self.transcript.append(("masked_input", u, y if self.keep_inputs else None))
        if self.total is None:
            self.total = y.copy()
        else:
            np.add(self.total, y, out=self.total)  # mod 2^(word width), in place: one running sum
        self.u3.add(u)

    def request_unmasking(self) -> tuple[set[int], set[int]]:
        """Close step 2: check U3 (threshold and connectivity), then name the survivors and the dropped clients
        that step 3 asks shares for. Raises :class:`SecAggAbort` before any share is requested."""
        self._need(self.u3, "MaskedInput")
        return set(self.u3), self.u2 - self.u3

    def unmask(self, replies: dict[int, dict[int, tuple[str, tuple[int, bytes]]]], size: int) -> np.ndarray:
        # Checked again here, before any share is recorded or used, for callers that skip request_unmasking().
        self._need(self.u3, "MaskedInput")
        # The shares come from U4 = replies; what could leak is set by U3, whose graph must stay connected.
        self._need(set(replies), "Unmasking", linked=self.u3)
        b_shares: dict[int, list] = {}
        s_shares: dict[int, list] = {}
        for v, per in replies.items():
            self.transcript.append(("unmask", v, per))
            for u, (kind, share) in per.items():
                (b_shares if kind == "b" else s_shares).setdefault(u, []).append(share)
        total = self.total if self.total is not None else np.zeros(size, dtype=word_dtype(self.bits))
        strip: list[tuple[bytes, int]] = []  # every mask left in the sum, with the sign that removes it
        for u in sorted(self.u3):
            if len(b_shares.get(u, [])) < self.t:
                raise SecAggAbort(
                    f"secure aggregation aborted: {len(b_shares.get(u, []))} shares of client {u}'s self-mask, below threshold"
                )
            strip.append((_combine(b_shares[u][: self.t], f"client {u}'s self-mask seed"), -1))
        for u in sorted(self.u2 - self.u3):
            if len(s_shares.get(u, [])) < self.t:
                raise SecAggAbort(
                    f"secure aggregation aborted: only {len(s_shares.get(u, []))} shares of dropped client {u}'s key"
                )
            s_u = KeyPair.from_private_bytes(_combine(s_shares[u][: self.t], f"dropped client {u}'s key"))
            for v in self.graph[u]:
                if v not in self.u3:
                    continue
                s_uv = s_u.agree(self.public_keys[v]["s_pk"], info=_pair_info(u, v, self.round_idx) + b" mask")
                strip.append((s_uv, -1 if v < u else 1))  # v added +m iff v < u; strip it
        return add_masks(total, strip, bits=self.bits)


def _combine(shares: list, what: str) -> bytes:
    """Shamir reconstruction at the server; shares that do not give a secret abort the round (they are bad or
    forged, and the sum cannot be unmasked)."""
    try:
        return shamir_combine(shares)
    except ValueError as e:
        raise SecAggAbort(f"secure aggregation aborted: the shares of {what} do not reconstruct it ({e})") from e


def threshold_for(group_size: int, fraction: float) -> int:
    return max(1, math.ceil(fraction * group_size))


def secure_sum(
    inputs: dict[int, np.ndarray],
    *,
    threshold: float | int,
    neighbors: int | None = None,
    bits: int = 64,
    round_idx: int = 0,
    drop: dict[str, set[int]] | None = None,
    graph_seed: int = 0,
) -> tuple[np.ndarray, set[int], SecAggServer]:
    """Run the whole protocol on already-encoded inputs (vectors of ``word_dtype(bits)``); a test and benchmark harness.

    ``drop`` maps a stage (``advertise``, ``share``, ``input``, ``unmask``) to clients that drop before
    sending that stage's message. Returns (sum over U3 mod 2^bits, U3, server).
    """
    drop = drop or {}
    cohort = sorted(inputs)
    graph = neighbour_graph(cohort, neighbors, graph_seed)
    k1 = len(next(iter(graph.values()))) + 1 if cohort else 1
    t = threshold if isinstance(threshold, int) else threshold_for(k1, threshold)
    clients = {u: SecAggClient(u, round_idx, graph[u], t) for u in cohort}
    server = SecAggServer(round_idx=round_idx, graph=graph, threshold=t, bits=bits)
    alive = [u for u in cohort if u not in drop.get("advertise", set())]
    pks = server.collect_keys({u: clients[u].advertise() for u in alive})
    alive = [u for u in alive if u not in drop.get("share", set())]
    inbox = server.route_shares({u: clients[u].share_keys(pks) for u in alive})
    for u in alive:
        clients[u].receive_shares(inbox[u])
    u2 = list(alive)
    size = len(next(iter(inputs.values())))
    for u in u2:
        if u not in drop.get("input", set()):
            server.add_masked(u, clients[u].masked_input(inputs[u], u2, bits))
    u3, dropped = server.request_unmasking()  # aborts here, before any client is asked for a share
    replies = {u: clients[u].unmask(u3, dropped) for u in u3 if u not in drop.get("unmask", set())}
    return server.unmask(replies, size), u3, server
