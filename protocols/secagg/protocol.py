"""Secure aggregation with dropout recovery (Bonawitz et al. 2017, CCS) on a SecAgg+ neighbour graph.

Secure against a server that deviates (the active variant, Bonawitz et al. §6 / Bell et al. 2020) when the clients
hold long-term Ed25519 signing keys and a pinned directory of their public halves (:mod:`protocols.secagg.signing`,
which states the trust assumption). Per round:

0. **AdvertiseKeys** — each client u makes two X25519 key pairs, (c_u) for the
   share channel and (s_u) for mask agreement, and sends both public keys, signed with its long-term key together
   with the round, its id, its neighbours and its threshold.
1. **ShareKeys** — each u checks every neighbour's signed advertisement against the pinned directory (and refuses
   the round otherwise), then draws a self-mask seed b_u, Shamir-splits b_u and s_u's
   private key t-of-(k+1) over its neighbourhood N(u) ∪ {u}, and sends each
   neighbour its shares AES-GCM-sealed under HKDF(X25519(c_u, c_v)).
2. **MaskedInput** — u sends y_u = x_u + PRG(b_u) + Σ_{v ∈ N(u) alive} ±PRG(s_uv) mod 2^bits,
   with s_uv = HKDF(X25519(s_u, s_v)), + if u < v and − otherwise.
2½. **ConsistencyCheck** (``consistency_check``) — the server tells each survivor the survivor set U3; each
   signs (round, U3, its session: the digest of its fresh keys) once, and the server forwards the signatures.
3. **Unmasking** — each surviving client returns, per neighbour, the share of
   b_u if u sent its input and the share of s_u's key if u dropped after
   step 1. With the consistency check it first requires that the set it is asked about is the U3 it signed and
   that, for every neighbour u whose share it releases, a quorum ⌈(|G_u| + t_u)/2⌉ of u's group signed that same
   set (:func:`protocols.secagg.signing.consistency_quorum`); it refuses otherwise, and it answers once a round.
   The server rebuilds them (≥ t shares each) and strips the masks.

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

from protocols.crypto import (
    KeyPair,
    SigningKey,
    add_masks,
    open_sealed,
    seal,
    secret_permutation,
    shamir_combine,
    shamir_split,
    verify_signature,
    word_dtype,
)
from protocols.secagg.signing import (
    ForgedMessage,
    advert_message,
    check_advert,
    consistency_quorum,
    session_digest,
    survivors_message,
)
from secure_fed.plugin_api.layers import RoundAborted


class SecAggAbort(RoundAborted):
    """Too few clients survived for the sum to be recovered, or the survivors' graph split (partial sums would leak)."""


def neighbour_graph(cohort: list[int], k: int | None, seed: int | bytes) -> dict[int, list[int]]:
    """A k-regular-ish undirected graph (Harary-style ring over a shuffle of the cohort); complete if k ≥ n − 1.

    ``seed``: 32 bytes, a secret (the layer's): the shuffle is :func:`~protocols.crypto.secret_permutation`, keyed by
    all 256 bits; an int, a public seed (tests, ``graph_seed`` debugging runs): numpy's generator."""
    n = len(cohort)
    if k is None or k >= n - 1:
        return {u: [v for v in cohort if v != u] for u in cohort}
    if isinstance(seed, bytes | bytearray):
        order = [int(u) for u in secret_permutation(sorted(int(c) for c in cohort), bytes(seed))]
    else:
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


#: a Shamir share's bytes (one byte of the secret's length, 66 of field element)
_SHARE_LEN = 67


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
    #: the long-term signing key (its own) and the pinned directory: None, None = unauthenticated (a test's control)
    signer: SigningKey | None = field(default=None, repr=False)
    directory: dict[int, bytes] | None = field(default=None, repr=False)
    #: the consistency check is required before unmasking (the layer and :func:`secure_sum` set it from the config)
    consistency: bool = False
    #: each neighbour's group and threshold, from its signed advertisement
    peer_groups: dict[int, tuple[list[int], int]] = field(default_factory=dict)
    #: per neighbour u (and this client), the session digest of each of u's share holders as u saw them in this
    #: run of the round (sealed inside u's shares): the survivor signatures that count for u's quorum
    peer_sessions: dict[int, dict[int, bytes]] = field(default_factory=dict)
    #: the survivor set it signed in the consistency check (once a round), and whether it has answered Unmasking
    signed_u3: list[int] | None = None
    unmasked: bool = False

    def advertise(self) -> dict:
        ad = {"c_pk": self.c_key.public, "s_pk": self.s_key.public}
        if self.signer is None:
            return ad
        nbrs = sorted(self.neighbours)
        msg = advert_message(self.round_idx, self.cid, ad["c_pk"], ad["s_pk"], nbrs, self.threshold)
        return {**ad, "nbrs": nbrs, "t": self.threshold, "sig": self.signer.sign(msg)}

    def state(self) -> dict:
        """Everything this client holds in the round (its secrets included): for its own storage only. The long-term
        signing key and the directory are kept beside it by the layer (they outlive the round)."""
        return {"cid": self.cid, "round_idx": self.round_idx, "neighbours": list(self.neighbours),
                "threshold": self.threshold, "c_sk": self.c_key.private_bytes(), "s_sk": self.s_key.private_bytes(),
                "b_seed": self.b_seed, "peers_c": dict(self.peers_c), "peers_s": dict(self.peers_s),
                "held_shares": {u: [list(b), list(s)] for u, (b, s) in self.held_shares.items()},
                "masked": self.masked, "consistency": self.consistency,
                "peer_groups": {u: [list(g), t] for u, (g, t) in self.peer_groups.items()},
                "peer_sessions": {u: dict(d) for u, d in self.peer_sessions.items()},
                "signed_u3": None if self.signed_u3 is None else list(self.signed_u3), "unmasked": self.unmasked}  # fmt: skip

    @classmethod
    def from_state(cls, st: dict, *, signer: SigningKey | None = None, directory: dict[int, bytes] | None = None) -> SecAggClient:
        return cls(
            cid=int(st["cid"]), round_idx=int(st["round_idx"]), neighbours=[int(v) for v in st["neighbours"]],
            threshold=int(st["threshold"]), c_key=KeyPair.from_private_bytes(st["c_sk"]),
            s_key=KeyPair.from_private_bytes(st["s_sk"]), b_seed=st["b_seed"],
            peers_c={int(k): v for k, v in st["peers_c"].items()}, peers_s={int(k): v for k, v in st["peers_s"].items()},
            held_shares={int(u): ((int(b[0]), b[1]), (int(s[0]), s[1])) for u, (b, s) in st["held_shares"].items()},
            masked=bool(st.get("masked", False)), signer=signer, directory=directory,
            consistency=bool(st.get("consistency", False)),
            peer_groups={int(u): ([int(v) for v in g], int(t)) for u, (g, t) in st.get("peer_groups", {}).items()},
            peer_sessions={int(u): {int(w): bytes(h) for w, h in d.items()} for u, d in st.get("peer_sessions", {}).items()},
            signed_u3=None if st.get("signed_u3") is None else [int(u) for u in st["signed_u3"]],
            unmasked=bool(st.get("unmasked", False)),
        )  # fmt: skip

    def share_keys(self, public_keys: dict[int, dict]) -> dict[int, bytes]:
        """Seal (share of b_u, share of s_u) to each neighbour still alive; keeps its own pair."""
        group = sorted([self.cid, *self.neighbours])
        idx = {v: i + 1 for i, v in enumerate(group)}  # Shamir x-coordinate of each member
        b_sh = dict(shamir_split(self.b_seed, threshold=self.threshold, num_shares=len(group)))
        s_sh = dict(shamir_split(self.s_key.private_bytes(), threshold=self.threshold, num_shares=len(group)))
        out = {}
        holders = sorted([self.cid, *(v for v in group if v in public_keys)])
        self.peer_groups[self.cid] = (holders, self.threshold)
        if self.directory is not None:  # every advert first: the holders' sessions go into each sealed share
            for v in holders:
                if v != self.cid:
                    self.peer_groups[v] = check_advert(self.directory, self.round_idx, v, public_keys[v], to=self.cid,
                                                       shape=(len(self.neighbours), self.threshold))  # fmt: skip
        sessions = {v: session_digest(public_keys[v]["c_pk"], public_keys[v]["s_pk"]) for v in holders if v != self.cid}
        sessions[self.cid] = self.session
        self.peer_sessions[self.cid] = sessions
        # u's share holders and their sessions as u saw them (4-byte id, 32-byte digest each)
        tail = b"".join(int(v).to_bytes(4, "little") + sessions[v] for v in holders)
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
                              share[0][1], share[1][0].to_bytes(2, "little"), share[1][1], tail])  # fmt: skip
            out[v] = seal(key, plain, aad=_pair_info(self.cid, v, self.round_idx))
        return out

    def receive_shares(self, sealed: dict[int, bytes]) -> None:
        for u, blob in sealed.items():
            key = self.c_key.agree(self.peers_c[u], info=_pair_info(u, self.cid, self.round_idx) + b" share channel")
            plain = open_sealed(key, blob, aad=_pair_info(u, self.cid, self.round_idx))
            if int.from_bytes(plain[:4], "little") != u or int.from_bytes(plain[4:8], "little") != self.cid:
                raise SecAggAbort(f"client {self.cid}: a share from {u} is addressed wrongly")
            b_len = _SHARE_LEN
            x_b, x_s = int.from_bytes(plain[8:10], "little"), int.from_bytes(plain[10 + b_len : 12 + b_len], "little")
            self.held_shares[u] = ((x_b, plain[10 : 10 + b_len]), (x_s, plain[12 + b_len : 12 + 2 * b_len]))
            # u's share holders, as u sealed them (authenticated by the share channel): the group whose quorum
            # must sign the survivor set before this client releases u's share
            rest = plain[12 + 2 * b_len :]
            if len(rest) % 36:
                raise ForgedMessage(f"client {self.cid}: client {u}'s list of share holders is malformed: refused")
            holders = [int.from_bytes(rest[i : i + 4], "little") for i in range(0, len(rest), 36)]
            self.peer_sessions[u] = {w: rest[i + 4 : i + 36] for w, i in zip(holders, range(0, len(rest), 36), strict=True)}
            if u in self.peer_groups:
                signed_nbrs, t_u = self.peer_groups[u]
                if self.cid not in holders or not set(holders) <= {u, *signed_nbrs}:
                    raise ForgedMessage(f"client {self.cid}: client {u}'s list of share holders does not fit its signed "
                                        "neighbours: refused")  # fmt: skip
                self.peer_groups[u] = (holders, t_u)

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

    def sign_survivors(self, survived: set[int] | list[int]) -> bytes:
        """ConsistencyCheck: this client's signature on (round, U3). Once a round: a second, different set is refused
        (an honest client vouches for one view of the round)."""
        u3 = sorted({int(u) for u in survived})
        if self.signer is None:
            raise ForgedMessage(f"client {self.cid}: no signing key to take part in the consistency check")
        if not self.masked or self.cid not in u3:
            raise ForgedMessage(f"client {self.cid}: asked to sign a survivor set it is not in (or before sending its input)")
        if self.signed_u3 is not None and self.signed_u3 != u3:
            raise ForgedMessage(f"client {self.cid}: asked to sign a second survivor set in round {self.round_idx}: refused")
        self.signed_u3 = u3
        return self.signer.sign(survivors_message(self.round_idx, u3, self.session))

    @property
    def session(self) -> bytes:
        """This client's session of the round: the digest of the fresh public keys it advertised."""
        return session_digest(self.c_key.public, self.s_key.public)

    def _check_consistency(self, survived: set[int], dropped: set[int], signatures: dict[int, bytes]) -> None:
        """Refuse (:class:`ForgedMessage`) unless ``survived`` is the set this client signed, ``dropped`` is disjoint
        from it, and, for every neighbour whose share it would release, a
        quorum of that neighbour's group signed the same set (module docstring)."""
        if self.directory is None:
            raise ForgedMessage(f"client {self.cid}: the consistency check needs the pinned signing-key directory")
        if self.signed_u3 is None or sorted(survived) != self.signed_u3:
            raise ForgedMessage(f"client {self.cid}: asked to unmask for a survivor set it did not sign: refused")
        if dropped & survived:
            raise ForgedMessage(f"client {self.cid}: the dropped set it is asked about does not fit the survivor set: refused")
        sigs = {int(w): sig for w, sig in signatures.items() if int(w) in survived}
        checked: dict[tuple[int, bytes], bool] = {}

        def valid(w: int, session: bytes | None) -> bool:
            """w's signature on this set in the session u saw for w (a signature from another run does not count)."""
            if session is None or w not in sigs:
                return False
            if (w, session) not in checked:
                msg = survivors_message(self.round_idx, self.signed_u3, session)
                checked[(w, session)] = verify_signature(self.directory.get(w, b""), msg, sigs[w])
            return checked[(w, session)]

        for u in self.held_shares:
            if u not in survived and u not in dropped:
                continue  # nothing of u's is released
            group, t_u = self.peer_groups[u]  # u's share holders (u itself included) and threshold
            members = {*group, u}
            sessions = self.peer_sessions.get(u, {})
            need = consistency_quorum(len(members), t_u)
            signed = sum(valid(w, sessions.get(w)) for w in members)
            if signed < need:
                raise ForgedMessage(
                    f"client {self.cid}: {signed} of client {u}'s group signed the survivor set in this run of the "
                    f"round, fewer than the quorum {need}: refused to unmask"
                )

    def unmask(
        self, survived: set[int], dropped: set[int], signatures: dict[int, bytes] | None = None
    ) -> dict[int, tuple[str, tuple[int, bytes]]]:
        """Step 3: per neighbour, the b-share if it survived or the s-key share if it dropped (never both). Once a
        round; with the consistency check, only for the set it signed and with a quorum's signatures on it."""
        survived, dropped = {int(u) for u in survived}, {int(u) for u in dropped}
        if self.unmasked:
            raise ForgedMessage(f"client {self.cid}: asked to unmask a second time in round {self.round_idx}: refused")
        if self.consistency:
            self._check_consistency(survived, dropped, signatures or {})
        self.unmasked = True
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
        self.signatures: dict[int, bytes] = {}  # ConsistencyCheck: each survivor's signature on (round, U3)
        self.holders: dict[int, set[int]] = {}  # the clients each client sealed shares to, and itself

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
            self.holders[int(u)] = {int(u), *(int(v) for v in per)}
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

    def collect_signatures(self, sigs: dict[int, bytes]) -> None:
        """Close the ConsistencyCheck: keep the survivors' signatures on (round, U3). Aborts, before any share is
        asked for, when some group that must release shares has fewer signers than the clients' quorum (they would
        refuse). The server has no key to check them with beyond the public directory; the clients check them."""
        for u, sig in sigs.items():
            self.transcript.append(("consistency", u, sig))
        self.signatures = {int(u): sig for u, sig in sigs.items()}
        signed = set(self.signatures)
        for u in sorted(self.u2):
            group = self.holders.get(u, set(self.graph[u]) | {u})
            need = consistency_quorum(len(group), self.t)
            if len(signed & group & self.u3) < need:
                raise SecAggAbort(
                    f"secure aggregation aborted at ConsistencyCheck: {len(signed & group & self.u3)} of client {u}'s "
                    f"share holders signed the survivor set, fewer than the quorum {need}"
                )

    def signatures_for(self, v: int) -> dict[int, bytes]:
        """The signatures client ``v`` needs: those of the groups of v and of its neighbours (two hops on the graph)."""
        near = {v, *self.graph[v]}
        for u in list(near):
            near.update(self.graph[u])
        return {w: sig for w, sig in self.signatures.items() if w in near}

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
    graph_seed: int | bytes = 0,
    consistency_check: bool = True,
    signing: bool = True,
) -> tuple[np.ndarray, set[int], SecAggServer]:
    """Run the whole protocol on already-encoded inputs (vectors of ``word_dtype(bits)``); a test and benchmark harness.

    ``drop`` maps a stage (``advertise``, ``share``, ``input``, ``consistency``, ``unmask``) to clients that drop
    before sending that stage's message. ``signing``: a trusted dealer gives each client a signing key and every
    client the directory (advertisements are signed and checked); ``consistency_check`` adds that round (it needs
    ``signing``). Returns (sum over U3 mod 2^bits, U3, server).
    """
    if consistency_check and not signing:
        raise ValueError("the consistency check needs signing keys")
    drop = drop or {}
    cohort = sorted(inputs)
    graph = neighbour_graph(cohort, neighbors, graph_seed)
    k1 = len(next(iter(graph.values()))) + 1 if cohort else 1
    t = threshold if isinstance(threshold, int) else threshold_for(k1, threshold)
    keys = {u: SigningKey() for u in cohort} if signing else {}
    directory = {u: k.public for u, k in keys.items()} if signing else None
    clients = {u: SecAggClient(u, round_idx, graph[u], t, signer=keys.get(u), directory=directory,
                               consistency=consistency_check) for u in cohort}  # fmt: skip
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
    if consistency_check:
        server.collect_signatures({u: clients[u].sign_survivors(u3) for u in u3 if u not in drop.get("consistency", set())})
    asked = [u for u in u3 if u not in drop.get("unmask", set()) | drop.get("consistency", set())]
    replies = {u: clients[u].unmask(u3, dropped, server.signatures_for(u)) for u in asked}
    return server.unmask(replies, size), u3, server
