"""Keyed (salted) instance tokens and label pseudonyms for FedALC's label-set collection.

The paper's tokens are plain SHA-256 of the instance: anyone holding a
candidate instance recomputes its token (``threat_models``, attack a). Here:

* **Run key.** Each client publishes an X25519 public key (through the
  server). The dealer — the client with the smallest id, a public rule — draws
  a 32-byte run key and a 16-byte per-run salt and seals them to every other
  client under HKDF(X25519(dealer, client)) with AES-256-GCM. The server only
  relays public keys and ciphertexts.
* **Instance tokens.** HMAC-SHA256(run key, salt | canonical encoding). The
  encoding is :func:`~secure_fed.algorithms.label_sets.canonical_instance_bytes`
  for raw features, or :func:`quantized_embedding_bytes` (a quantised grid, so
  every client and device agrees) for embeddings.
* **Label pseudonyms.** HMAC-SHA256(run key, "label:" + name). The server
  indexes W's rows by the rank of the pseudonyms it receives, so it never
  learns which row is which label name; the simulator re-indexes labels
  accordingly (the metrics are unchanged).

Client-side secrets live in :class:`ClientKeyring` objects that server code
never receives; they are checkpointed to the clients' own storage.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from protocols.crypto import KeyPair, open_sealed, seal
from protocols.layer_settings import KeyedHashingSettings
from secure_fed.plugin_api.layers import (
    ClientData,
    ClientFn,
    ClientSide,
    LayerState,
    Payload,
    PrivacyViolation,
    ProtocolLayer,
    ProtocolSetup,
    SetupResult,
    StackEnv,
    StateScope,
    canonical_rows,
    client_side,
    mod_of,
)

TOKENIZER_NAME = "hmac-sha256"


def quantized_embedding_bytes(embedding: np.ndarray | torch.Tensor, *, step: float = 1e-3) -> bytes:
    """``b"SFE1" | d | round(e/step) as int32 LE``: equal on every device whose error is < step/2 off the grid."""
    e = embedding.detach().double().cpu().numpy() if isinstance(embedding, torch.Tensor) else np.asarray(embedding, float)
    q = np.rint(e.ravel() / step).astype("<i4")
    return b"SFE1" + np.uint32(q.size).tobytes() + np.float64(step).tobytes() + q.tobytes()


def keyed_token(key: bytes, salt: bytes, encoding: bytes) -> bytes:
    return hmac.new(key, salt + encoding, hashlib.sha256).digest()


def label_pseudonym(key: bytes, name: str) -> bytes:
    return hmac.new(key, b"label:" + name.encode("utf-8"), hashlib.sha256).digest()


class ClientKeyring:
    """One client's key material: its X25519 pair and, after setup, the run key and salt."""

    def __init__(self, cid: int):
        self.cid = cid
        self.pair = KeyPair()
        self.run_key: bytes | None = None
        self.salt: bytes | None = None
        self.pseudonym: bytes | None = None

    def tokens(self, raw: sp.csr_matrix) -> list[bytes]:
        return [keyed_token(self.run_key, self.salt, row) for row in canonical_rows(raw)]

    def state(self) -> dict[str, bytes]:
        return {"sk": self.pair.private_bytes(), "run_key": self.run_key, "salt": self.salt, "pseudonym": self.pseudonym}

    @classmethod
    def restore(cls, cid: int, st: dict[str, bytes]) -> ClientKeyring:
        k = cls.__new__(cls)
        k.cid, k.pair, k.run_key, k.salt = cid, KeyPair.from_private_bytes(st["sk"]), st["run_key"], st["salt"]
        k.pseudonym = st["pseudonym"]
        return k


def _row_order(num_labels: int, held: dict[int, list[int]], by_client: dict[int, list[bytes]],
               row_of_pseudonym: dict[bytes, int]) -> np.ndarray:  # fmt: skip
    """Label l → the row of its pseudonym; labels no client holds fill the remaining rows in label order."""
    perm = np.full(num_labels, -1, dtype=np.int64)
    for cid, labels in held.items():
        for lbl, p in zip(labels, by_client[cid], strict=True):
            perm[lbl] = row_of_pseudonym[p]
    free = iter(sorted(set(range(num_labels)) - set(perm[perm >= 0].tolist())))
    return np.array([p if p >= 0 else next(free) for p in perm])


def _seal_info(dealer: int, cid: int) -> bytes:
    return f"secure-fed run key dealer {dealer} -> client {cid}".encode()


class KeyedHashing(ProtocolLayer):
    name = "keyed_hashing"
    client_state_on_nodes = True  # the keyrings, from the key exchange before round 0

    def __init__(self, settings: KeyedHashingSettings, env: StackEnv):
        super().__init__(settings, env)
        self._clients: dict[int, ClientKeyring] = {}  # client side
        self.public_keys: dict[int, bytes] = {}  # server side
        self.row_of_pseudonym: dict[bytes, int] = {}  # server side
        self._row_order: np.ndarray | None = None  # simulator: label l's row, decided in setup

    # ------------------------------------------------------------------ the hooks (secure_fed.engine.layers)
    def setup(self, ctx: ProtocolSetup) -> SetupResult:
        """The run-key exchange; with pseudonyms, W's rows in the order of the pseudonyms; keyed tokens in the
        algorithm's label-set query (:meth:`wrap_query`)."""
        facts = self.key_agreement(ctx)
        return SetupResult(facts=facts, row_order=self._row_order, wrap_query=self.wrap_query)

    def clients(self) -> ClientSide:
        """Clients (a remote node's copy of the run): the row order, from the run key in the client's keyring."""
        return ClientSide(row_order=self.client_row_order)

    def state(self) -> LayerState:
        """The public keys and pseudonym rows (server), the keyrings (client)."""
        return LayerState(
            server=StateScope(self.state_dict, self.load_state_dict),
            client=StateScope(self.client_state_dict, self.load_client_state_dict),
        )

    # ------------------------------------------------------------------ one-off setup
    @client_side
    def _client_setup_fn(self, payload: Payload, data: ClientData) -> Payload:
        """Client side of key agreement: runs on the client, with its own keyring."""
        ring = self._clients.setdefault(data.client_id, ClientKeyring(data.client_id))
        step = payload["keyed_hashing"]
        if step == "advertise":
            return {"public_key": ring.pair.public}
        if step == "deal":  # the dealer seals a fresh run key + salt to everyone
            ring.run_key, ring.salt = os.urandom(32), os.urandom(16)
            sealed = {}
            for cid, pk in payload["public_keys"].items():
                if cid == data.client_id:
                    continue
                key = ring.pair.agree(pk, info=_seal_info(data.client_id, cid))
                sealed[cid] = seal(key, ring.run_key + ring.salt, aad=_seal_info(data.client_id, cid))
            return {"sealed": sealed}
        if step == "receive":
            if payload.get("sealed") is not None:
                key = ring.pair.agree(payload["dealer_public_key"], info=_seal_info(payload["dealer"], data.client_id))
                plain = open_sealed(key, payload["sealed"], aad=_seal_info(payload["dealer"], data.client_id))
                ring.run_key, ring.salt = plain[:32], plain[32:]
            names = payload["label_names"]
            pseudonyms = [label_pseudonym(ring.run_key, names[int(lbl)]) for lbl in data.known_labels]
            ring.pseudonym = pseudonyms[0] if len(pseudonyms) == 1 else None
            return {"pseudonyms": pseudonyms}
        raise ValueError(f"unknown keyed_hashing step {step!r}")

    def key_agreement(self, ctx: ProtocolSetup) -> dict[str, Any]:
        """Server side of the run-key exchange, then (with pseudonyms) W's row order; returns the summary's facts."""
        # 0. public keys up (the server relays them)
        replies = ctx.query(lambda cid: {"keyed_hashing": "advertise"}, self._client_setup_fn)
        self.public_keys = {cid: r["public_key"] for cid, r in replies}
        dealer = min(self.public_keys)
        # 1. the dealer seals the run key to each client's public key
        deal = ctx.query_one(dealer, {"keyed_hashing": "deal", "public_keys": self.public_keys}, self._client_setup_fn)
        sealed = deal["sealed"]
        # 2. each client opens its copy and answers with its label pseudonym(s)
        pseud = ctx.query(
            lambda cid: {
                "keyed_hashing": "receive", "sealed": sealed.get(cid), "dealer": dealer,
                "dealer_public_key": self.public_keys[dealer], "label_names": ctx.label_names,
            },
            self._client_setup_fn,
        )  # fmt: skip
        if not self.settings.section.pseudonymize_labels:  # keyed tokens only; rows stay in label order
            return {"keyed_hashing": {"dealer": dealer, "clients": len(self.public_keys), "pseudonyms": 0}}
        # server: rows in the order of the pseudonyms (a keyed permutation it cannot invert)
        by_client = {cid: r["pseudonyms"] for cid, r in pseud}
        distinct = sorted({p for ps in by_client.values() for p in ps})
        self.row_of_pseudonym = {p: i for i, p in enumerate(distinct)}
        # simulator: re-index labels so that label l lives in the row of its pseudonym
        held = {c.client_id: c.known_labels.tolist() for c in ctx.clients}
        self._row_order = _row_order(len(ctx.label_names), held, by_client, self.row_of_pseudonym)
        return {"keyed_hashing": {"dealer": dealer, "clients": len(self.public_keys), "pseudonyms": len(distinct)}}

    def client_row_order(self, held: dict[int, list[int]], label_names: list[str]) -> np.ndarray | None:
        """Client side (a remote client's copy of the run): the same row order the server's setup produced,
        computed from the run key that this client's keyring holds and the public facts (which labels the clients
        hold, ``held``: client id → its labels in label order): the server's rows are the ranks of the distinct
        pseudonyms. None before the key exchange, or without pseudonyms."""
        ring = next((r for r in self._clients.values() if r.run_key is not None), None)
        if ring is None or not self.settings.section.pseudonymize_labels:
            return None
        by_client = {cid: [label_pseudonym(ring.run_key, label_names[int(lbl)]) for lbl in labels]
                     for cid, labels in held.items()}  # fmt: skip
        rows = {p: i for i, p in enumerate(sorted({p for ps in by_client.values() for p in ps}))}
        return _row_order(len(label_names), held, by_client, rows)

    # ------------------------------------------------------------------ label-set collection
    @client_side
    def token_mod(self, fn: ClientFn) -> ClientFn:
        """Client side: answer a token request with keyed tokens and pseudonyms instead of clear ones."""

        def wrapped(payload: Payload, data: ClientData) -> Payload:
            if payload.get("tokenizer") != TOKENIZER_NAME:
                return fn(payload, data)
            ring = self._clients[data.client_id]
            if len(data.known_labels) != 1:
                raise ValueError("label-set collection needs the positive-only setting (one label per client)")
            if not self.settings.section.pseudonymize_labels:
                return {"tokens": ring.tokens(data.raw), "label": int(data.known_labels[0])}
            return {"tokens": ring.tokens(data.raw), "pseudonym": ring.pseudonym}

        return mod_of(wrapped, self.name, "token_mod", fn)

    def wrap_query(self, query):
        """Server side: ask for keyed tokens; map each pseudonym to its row before the algorithm merges sets."""

        def q(payload_fn, client_fn):
            replies = query(lambda cid: {**payload_fn(cid), "tokenizer": TOKENIZER_NAME}, self.token_mod(client_fn))
            out = []
            for cid, r in replies:
                if "pseudonym" in r:
                    if r["pseudonym"] not in self.row_of_pseudonym:
                        raise PrivacyViolation(f"client {cid} sent an unknown pseudonym")
                    r = {"tokens": r["tokens"], "label": self.row_of_pseudonym[r["pseudonym"]]}
                out.append((cid, r))
            return out

        return q

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"public_keys": self.public_keys, "row_of_pseudonym": self.row_of_pseudonym}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.public_keys = state["public_keys"]
        self.row_of_pseudonym = state["row_of_pseudonym"]

    def client_state_dict(self) -> dict[str, Any]:
        return {cid: ring.state() for cid, ring in self._clients.items()}

    def load_client_state_dict(self, state: dict[str, Any]) -> None:
        self._clients = {cid: ClientKeyring.restore(cid, st) for cid, st in state.items()}
