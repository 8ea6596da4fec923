"""The ``ckks`` protocol layer: clients encrypt their updates under CKKS (TenSEAL); the server adds ciphertexts.

Setup: the *key holders* — the ``ckks.key_holders`` clients with the smallest
ids, a public rule — are the only parties with the secret key. The first one
generates the TenSEAL context and sends the server a **public** copy (no
secret key); it seals the secret context to the other key holders with
X25519 + HKDF + AES-GCM, relayed by the server. Every client encrypts with the
public context.

Each round a client packs its update (``UpdateLayout``) into CKKS vectors of
``poly_modulus_degree / 2`` slots for the selected groups (``ckks.encrypt``;
the small ``meta`` group — weight, loss, count — is always encrypted) and
sends the rest in plaintext. The server sums ciphertexts homomorphically and
asks the first live key holder to decrypt *the sum only*. The key holder adds
Gaussian noise of std ``ckks.decryption_noise``, from its own secret, to every
value it returns: the server holds each summed ciphertext, and exact
decryptions of two of them give it the secret key (Li and Micciancio 2021;
:mod:`threat_models.ckks_key_recovery` and its test run that attack).

Row blocks (``ckks.row_blocks: own``, the default): the rows of W lie in the
encrypted vector one after another, several to a ciphertext, and a client's
update is zero outside the rows the server sent it. It encrypts only the
ciphertexts that hold those rows (and every ciphertext of a dense group: θ,
the meta slots) and says which (``ciphertext_blocks``); the server adds each
into that block's sum, so one summed ciphertext holds several clients' rows.
The server learns which blocks a client sent: a function of the row ids it
chose for that client's downlink. A reply with a value on every row (a DP
noise share, ``UpdateLayout.full_table_keys``) sends every block.

What still needs plaintext on the server: the aggregated update itself (the
server optimiser, the row normalisation and any regulariser on W — FedAwS's
spreadout, FedALC's eq. 11 — run on the decrypted sum, not on ciphertexts).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from typing import Any

import numpy as np
import tenseal as ts
import torch

from protocols.crypto import KeyPair, open_sealed, seal
from protocols.layer_settings import CKKSSettings
from protocols.randomness import SecretStream
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
    ProtocolSetup,
    RoundAborted,
    RoundSession,
    RoundWrapper,
    SetupResult,
    StackEnv,
    StateScope,
    client_side,
)

log = logging.getLogger(__name__)

NOISE_SEED_WARNING = (
    "privacy.noise_seed is set: the CKKS key holders' decryption noise follows from that number, so a server that "
    "knows it strips the noise and recovers the secret key from two rounds' decryptions (debugging only)"
)


def make_context(poly_modulus_degree: int, coeff_mod_bit_sizes: list[int], global_scale_bits: int) -> ts.Context:
    ctx = ts.context(ts.SCHEME_TYPE.CKKS, poly_modulus_degree=poly_modulus_degree, coeff_mod_bit_sizes=coeff_mod_bit_sizes)
    ctx.global_scale = 2.0**global_scale_bits
    return ctx


def public_bytes(ctx: ts.Context) -> bytes:
    """The context without its secret key, serialised."""
    pub = ctx.copy()
    pub.make_context_public()
    return pub.serialize(save_public_key=True, save_secret_key=False, save_galois_keys=False, save_relin_keys=False)


def _info(src: int, dst: int) -> bytes:
    return f"secure-fed ckks secret context {src} -> {dst}".encode()


class CKKSAggregation(ProtocolLayer):
    name = "ckks"
    client_state_on_nodes = True  # the key holders' keys and every client's public context, from setup

    def __init__(self, settings: CKKSSettings, env: StackEnv):
        super().__init__(settings, env)
        self.layout = env.update_layout()
        self.slots = settings.section.poly_modulus_degree // 2
        self.encrypted = self._select(settings.section.encrypt)
        #: the layout's slices of the encrypted and of the plaintext groups, in layout order, adjacent ones merged
        self._runs = {enc: self._merged_runs(enc) for enc in (True, False)}
        self.encrypted_size = sum(sl.stop - sl.start for sl in self._runs[True])
        self.num_blocks = -(-self.encrypted_size // self.slots)
        self.server_context: ts.Context | None = None  # server side: public only
        self.server_context_bytes: bytes | None = None
        self._holders: dict[int, dict] = {}  # client side: key holders' key pairs and secret contexts
        self._client_public: ts.Context | None = None  # client side copy of the public context
        self._public_bytes: bytes | None = None
        self._client_public_of: bytes | None = None
        self.holders: list[int] = []  # server side: who holds the secret key (public rule)
        self.last_stats: dict[str, Any] = {}
        self.max_abs_error = 0.0  # simulator's measurement of CKKS's approximation error over the run
        self.error_measured = False
        self._legacy_client_state = False

    def _select(self, groups: list[str]) -> list[str]:
        segs = list(self.layout.segments())
        out = {"meta"}
        for g in groups:
            if g == "all":
                out |= set(segs)
            elif g == "theta":
                out |= set(self.layout.names)
            elif g == "rows":
                out.add("rows")
            else:
                hit = {n for n in self.layout.names if n.startswith(g)}
                if not hit:
                    raise ConfigError(f"ckks.encrypt: {g!r} matches no group; θ parameters are {list(self.layout.names)}")
                out |= hit
        return [s for s in segs if s in out]

    def blocks_for(self, reply: Payload) -> np.ndarray:
        """The ciphertexts (blocks of ``slots`` values of the encrypted vector) that ``reply`` fills: all of them
        with ``ckks.row_blocks: all`` or when the reply has a value on every row; otherwise every block of a dense
        group and, in the rows group, the blocks of the rows listed in ``row_ids`` (the rows the server sent this
        client) and of their counts. A function of public settings and of ids the server chose, never of values: the
        reply's ``row_ids`` must be the downlink's (every trainer copies them; checked in process)."""
        if self.settings.section.row_blocks == "all" or any(k in reply for k in self.layout.full_table_keys):
            return np.arange(self.num_blocks, dtype=np.int64)
        seg = self.layout.segments()
        R, d = self.layout.num_rows, self.layout.dim
        spans: list[tuple[int, int]] = []  # [start, stop) in the encrypted vector
        start = 0
        for g in self.encrypted:
            length = seg[g].stop - seg[g].start
            if g != "rows":
                spans.append((start, start + length))
            elif "rows_delta" in reply:  # the flattened rows group: R·d deltas, then R counts
                for r in _ids(reply["row_ids"]).tolist():
                    spans += [(start + r * d, start + (r + 1) * d), (start + R * d + r, start + R * d + r + 1)]
            start += length
        blocks = {b for a, e in spans if e > a for b in range(a // self.slots, (e - 1) // self.slots + 1)}
        return np.array(sorted(blocks), dtype=np.int64)

    # ------------------------------------------------------------------ client side
    @client_side
    def client_setup(self, payload: Payload, data: ClientData) -> Payload:
        """Client side of the setup and of each round's decryption: key holders advertise a key pair, the first
        generates the context and seals its secret copy to the others, the others open theirs; every client
        stores the public context; a key holder decrypts a round's summed ciphertexts (the sum only)."""
        c = self.settings.section
        me, step = data.client_id, payload["ckks"]
        if step == "advertise":  # a key pair for the key dealing, and the secret its decryption noise comes from
            noise = SecretStream.for_party(self.settings.noise_seed, f"ckks holder {me}")  # os.urandom unless debugging
            self._holders[me] = {"pair": KeyPair(), "noise": noise.state_dict()["key"]}
            return {"public_key": self._holders[me]["pair"].public}
        if step == "keygen":
            sk_ctx = make_context(c.poly_modulus_degree, c.coeff_mod_bit_sizes, c.global_scale_bits)
            secret = sk_ctx.serialize(save_secret_key=True)
            self._holders[me]["secret"] = secret
            sealed = {}
            for v, pk in payload["public_keys"].items():
                if v != me:
                    sealed[v] = seal(self._holders[me]["pair"].agree(pk, info=_info(me, v)), secret, aad=_info(me, v))
            return {"public_context": public_bytes(sk_ctx), "sealed": sealed}
        if step == "receive":
            key = self._holders[me]["pair"].agree(payload["dealer_public_key"], info=_info(payload["dealer"], me))
            self._holders[me]["secret"] = open_sealed(key, payload["sealed"], aad=_info(payload["dealer"], me))
            return {}
        if step == "public_context":  # every client: the context it encrypts with (public)
            self._public_bytes = payload["ckks_public"]
            self._client_public = ts.context_from(self._public_bytes)
            return {}
        if step == "decrypt":
            return {"ckks_sum": self._decrypt(me, payload["ckks_sums"])}
        raise ValueError(f"unknown ckks step {step!r}")

    def client_plan_steps(
        self, inner: list[dict], *, round_idx: int, min_summands: int | None = None, on_node: bool = False
    ) -> list[dict]:
        """Remote clients: the inner sessions' steps, then the encryption (the last step before the wire)."""
        return [*inner, {"op": "layer:ckks.encrypt_step", "weighting": self.settings.aggregation}]

    @client_side
    def encrypt_step(self, reply: Payload, data: ClientData, *, weighting: str) -> Payload:
        """Client side, after training (the last step of the round's plan): the update flattened, its selected
        groups encrypted under the public context in vectors of ``slots`` values, the rest in plaintext."""
        return self.encrypt_vector(self.layout.flatten(reply, weighting), self.blocks_for(reply))

    def encrypt_vector(self, v: np.ndarray, blocks: np.ndarray) -> Payload:
        """Client side: the flattened update ``v`` as the message: the ciphertexts of the encrypted vector's
        ``blocks`` (from :meth:`blocks_for`), their indices, and the groups left in plaintext."""
        secret_part = self._gather(v, encrypted=True)
        if len(blocks) < self.num_blocks:  # a value outside the sent blocks would be lost from the sum: a bug
            left = np.ones(self.num_blocks, dtype=bool)
            left[blocks] = False
            if np.any(secret_part[np.repeat(left, self.slots)[: len(secret_part)]]):
                raise RuntimeError("ckks: the update has values outside the ciphertexts chosen by its row ids")
        s = self.slots
        blobs = [ts.ckks_vector(self._client_public, secret_part[b * s : (b + 1) * s]).serialize() for b in blocks.tolist()]
        plain = self._gather(v, encrypted=False)
        if plain.base is not None and 2 * plain.size < v.size:  # a small view would keep the whole update alive
            plain = plain.copy()
        return {"ciphertexts": blobs, "ciphertext_blocks": blocks, "plain": plain}

    def _merged_runs(self, encrypted: bool) -> list[slice]:
        out: list[slice] = []
        for g, sl in self.layout.segments().items():
            if (g in self.encrypted) == encrypted and sl.stop > sl.start:
                if out and out[-1].stop == sl.start:
                    out[-1] = slice(out[-1].start, sl.stop)
                else:
                    out.append(sl)
        return out

    def _gather(self, v: np.ndarray, *, encrypted: bool) -> np.ndarray:
        runs = self._runs[encrypted]
        if len(runs) == 1:
            return v[runs[0]]  # a view: the groups lie together (e.g. encrypt: [rows], with meta after them)
        return np.concatenate([v[sl] for sl in runs]) if runs else v[:0]

    def _scatter(self, total: np.ndarray, values: np.ndarray, *, encrypted: bool) -> None:
        o = 0
        for sl in self._runs[encrypted]:
            n = sl.stop - sl.start
            total[sl] = values[o : o + n]
            o += n

    # ------------------------------------------------------------------ setup (server side)
    # ------------------------------------------------------------------ the hooks (secure_fed.engine.layers)
    def setup(self, ctx: ProtocolSetup) -> SetupResult:
        """The key dealing among the key holders, and the public context to every client."""
        return SetupResult(facts=self.key_dealing(ctx))

    def clients(self) -> ClientSide:
        """Clients: the encryption as the round plan's last step."""
        return ClientSide(plan_steps=self.client_plan_steps)

    def ledger(self) -> Ledger:
        """The round's diagnostics and the run's measured decryption error (private)."""
        return Ledger(round_stats=self.round_stats, private_report=self.private_report)

    def state(self) -> LayerState:
        """The public context and holders (server), the key holders' keys and every client's public copy (client)."""
        return LayerState(
            server=StateScope(self.state_dict, self.load_state_dict),
            client=StateScope(self.client_state_dict, self.load_client_state_dict),
        )

    def key_dealing(self, ctx: ProtocolSetup) -> dict[str, Any]:
        """Server side of the setup: the holders' key exchange relayed, the public context broadcast; the facts."""
        c = self.settings.section
        if self.settings.noise_seed is not None:
            log.warning("warning: %s", NOISE_SEED_WARNING)
        holders = sorted(cl.client_id for cl in ctx.clients)[: max(1, c.key_holders)]
        self.holders = holders
        client_fn = self.client_setup
        pks = {h: ctx.query_one(h, {"ckks": "advertise"}, client_fn)["public_key"] for h in holders}
        dealer = holders[0]
        keygen = ctx.query_one(dealer, {"ckks": "keygen", "public_keys": pks}, client_fn)
        for h in holders[1:]:
            msg = {"ckks": "receive", "sealed": keygen["sealed"][h], "dealer": dealer, "dealer_public_key": pks[dealer]}
            ctx.query_one(h, msg, client_fn)
        self.server_context_bytes = keygen["public_context"]
        self.server_context = ts.context_from(self.server_context_bytes)
        if self.server_context.is_private():
            raise RuntimeError("the server's CKKS context must not hold a secret key")
        ctx.query(lambda cid: {"ckks": "public_context", "ckks_public": self.server_context_bytes}, client_fn)  # broadcast
        return {"ckks": {"key_holders": holders, "public_context_bytes": len(self.server_context_bytes),
                         "encrypted_groups": self.encrypted}}  # fmt: skip

    def _decrypt(self, holder: int, blobs: list[bytes]) -> np.ndarray:
        """Client side (a key holder): decrypt summed ciphertexts and add Gaussian noise of std
        ``ckks.decryption_noise`` to every value, drawn from the holder's own secret. The server holds each summed
        ciphertext; with exact decryptions of two of them it solves for the secret key (Li and Micciancio 2021;
        :mod:`threat_models.ckks_key_recovery`). The noise (Δσ/√N ≈ 181 in the decryption polynomial's coefficients
        at the defaults, at least 64 by the config's check) leaves it a noisy, ring-LWE-like system instead of a
        linear one, with errors larger than those of the public key it already holds.

        Each ciphertext's draw is addressed by the SHA-256 of its bytes: the same ciphertext always gets the same
        noise (asking again averages nothing away), and any other ciphertext independent noise. A draw addressed by
        the round instead would repeat when a resumed run replays that round with fresh encryptions, and the
        difference of the two releases would be an exact decryption of the difference of the two ciphertexts."""
        sk = ts.context_from(self._holders[holder]["secret"])
        stream = SecretStream(self._holders[holder]["noise"])
        out = []
        for b in blobs:
            exact = np.asarray(ts.ckks_vector_from(sk, b).decrypt(), dtype=np.float64)
            # float64 noise from 53-bit uniforms: the released values' low bits carry no exact decryption
            noise = stream.gaussian((len(exact),), "decrypt " + hashlib.sha256(b).hexdigest()).numpy()
            out.append(exact + self.settings.section.decryption_noise * noise)
        return np.concatenate(out)

    def open_round(self, round_idx: int, inner: RoundSession) -> RoundSession:
        return _CKKSRound(self, round_idx, inner)

    def round_stats(self) -> dict[str, Any]:
        return self.last_stats

    def private_report(self) -> dict[str, Any]:
        # None where no party held the exact sum to measure against (backend: flower)
        out = {"ckks_max_abs_decryption_error": self.max_abs_error if self.error_measured else None}
        if self.settings.noise_seed is not None:
            out["ckks_warning"] = NOISE_SEED_WARNING
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"server_context": self.server_context_bytes, "max_abs_error": self.max_abs_error, "holders": self.holders,
                "error_measured": self.error_measured}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.max_abs_error = float(state.get("max_abs_error", 0.0))
        self.error_measured = bool(state.get("error_measured", True))
        self.server_context_bytes = state["server_context"]
        self.server_context = ts.context_from(self.server_context_bytes)
        # checkpoints before the holders were kept: the holders are the clients with the smallest ids (public rule)
        self.holders = list(state.get("holders") or sorted(self._holders))
        if self._client_public is None and self._legacy_client_state:  # such checkpoints kept no client copy
            self._client_public = ts.context_from(self.server_context_bytes)

    def client_state_dict(self) -> dict[str, Any]:
        return {
            "holders": {
                h: {"sk": v["pair"].private_bytes(), "secret": v.get("secret"), "noise": v["noise"]}
                for h, v in self._holders.items()
            },
            "public_context": self._public_bytes,
        }

    def load_client_state_dict(self, state: dict[str, Any]) -> None:
        self._legacy_client_state = bool(state) and "holders" not in state  # {holder id: keys}, before the public copy
        holders = state if self._legacy_client_state else state.get("holders", {})
        if any(v.get("secret") and not v.get("noise") for v in holders.values()):
            raise ConfigError(
                "this checkpoint's CKKS key holders have no decryption-noise secret: it predates 2026-11-26, when its "
                "exact decryptions could give the server the secret key (two rounds suffice); start a new run"
            )
        # (a holder saved before it received the secret context has decrypted nothing: a fresh noise secret is safe)
        self._holders = {h: {"pair": KeyPair.from_private_bytes(v["sk"]), "secret": v["secret"],
                             "noise": v.get("noise") or os.urandom(32)} for h, v in holders.items()}  # fmt: skip
        self._public_bytes = state.get("public_context")
        if self._public_bytes is None:
            self._client_public = None
        elif self._client_public is None or self._client_public_of != self._public_bytes:
            self._client_public = ts.context_from(self._public_bytes)
        self._client_public_of = self._public_bytes


def _ids(ids: Any) -> np.ndarray:
    return np.unique(np.asarray(torch.as_tensor(ids).cpu()).reshape(-1))


class _CKKSRound(RoundWrapper):
    def __init__(self, layer: CKKSAggregation, round_idx: int, inner: RoundSession):
        super().__init__(inner)
        self.layer = layer
        self.round_idx = round_idx
        if len(self.cohort) == 1:  # the decrypted sum would be that client's update
            raise RoundAborted(f"round {round_idx}: a cohort of one client, whose encrypted sum would be its own update")
        self._set_min_summands(len(self.cohort))  # no dropout in this simulation: the sum holds the whole cohort
        self.sums: dict[int, Any] = {}  # block index → the sum of the ciphertexts sent for it
        self.plain_sum: np.ndarray | None = None
        #: simulator only (no party holds it in a deployment): the exact sum, to measure CKKS's error
        self.exact_sum: np.ndarray | None = None
        self.t_enc = self.t_agg = 0.0
        self.bytes_up = 0
        self.cts_up = 0
        self.n = 0

    def client_mod(self, fn: ClientFn) -> ClientFn:
        inner_fn = self.inner.client_mod(fn)
        layer = self.layer

        def encrypted(payload: Payload, data: ClientData) -> Payload:
            reply = inner_fn(payload, data)
            if "rows_delta" in reply and not np.array_equal(_ids(reply["row_ids"]), _ids(payload["row_ids"])):
                # blocks_for relies on it: other row ids could make the blocks sent depend on the client's data
                raise RuntimeError(f"ckks: client {data.client_id}'s reply names rows other than those it was sent")
            t0 = time.perf_counter()
            v = layer.layout.flatten(reply, self.weighting)  # what encrypt_step does, with v kept for the line below
            t_flat = time.perf_counter() - t0
            if self.exact_sum is None:  # simulator only, not timed
                self.exact_sum = v.copy()
            else:
                self.exact_sum += v
            t0 = time.perf_counter()
            out = layer.encrypt_vector(v, layer.blocks_for(reply))
            self.t_enc += t_flat + time.perf_counter() - t0
            return out

        return encrypted

    def client_plan(self) -> list[dict]:
        return self.layer.client_plan_steps(self.inner.client_plan(), round_idx=self.round_idx)

    def submit(self, cid: int, reply: Payload) -> None:
        t0 = time.perf_counter()
        ctx = self.layer.server_context
        blocks = np.asarray(reply["ciphertext_blocks"]).reshape(-1).tolist()
        if len(blocks) != len(reply["ciphertexts"]) or any(not 0 <= b < self.layer.num_blocks for b in blocks):
            raise ValueError(f"ckks: client {cid} sent {len(reply['ciphertexts'])} ciphertexts for blocks {blocks[:8]}…")
        for b, blob in zip(blocks, reply["ciphertexts"], strict=True):
            ct = ts.ckks_vector_from(ctx, blob)
            self.sums[b] = ct if b not in self.sums else self.sums[b] + ct
        if self.plain_sum is None:
            self.plain_sum = np.array(reply["plain"], dtype=np.float64)  # a copy: the sum is the server's own
        else:
            self.plain_sum += reply["plain"]
        self.t_agg += time.perf_counter() - t0
        self.bytes_up = max(self.bytes_up, sum(len(b) for b in reply["ciphertexts"]) + reply["plain"].nbytes)
        self.cts_up = max(self.cts_up, len(blocks))
        self.n += 1

    def finish(self) -> Aggregate:
        if self.plain_sum is None:  # nobody took part this round
            return self.inner.post(self.layer.layout.unflatten_sum(np.zeros(self.layer.layout.size), self.device))
        holder = self.layer.holders[0]  # the first key holder decrypts the sum (a message to it)
        t0 = time.perf_counter()
        present = sorted(self.sums)  # blocks no client sent sum to zero
        blobs = [self.sums[b].serialize() for b in present]
        answer = self.layer.env.call_clients([holder], lambda _: {"ckks": "decrypt", "ckks_sums": blobs},
                                             self.layer.client_setup)  # fmt: skip
        dec = np.asarray(answer[0][1]["ckks_sum"], dtype=np.float64)
        t_dec = time.perf_counter() - t0
        size, s = self.layer.encrypted_size, self.layer.slots
        secret = np.zeros(size)
        o = 0
        for b in present:
            n = min(s, size - b * s)
            secret[b * s : b * s + n] = dec[o : o + n]
            o += n
        if o != len(dec):
            raise ValueError(f"ckks: the key holder returned {len(dec)} values for {o} encrypted slots")
        total = np.zeros(self.layer.layout.size)
        self.layer._scatter(total, secret, encrypted=True)
        self.layer._scatter(total, self.plain_sum, encrypted=False)
        # the simulator's measurement of CKKS's error (in process only: on Flower no party holds the exact sum)
        err = float(np.max(np.abs(total - self.exact_sum))) if self.exact_sum is not None else float("nan")
        if self.exact_sum is not None:
            self.layer.max_abs_error = max(self.layer.max_abs_error, err)
            self.layer.error_measured = True
        self.layer.last_stats = {
            "ckks_max_abs_error": err,
            "ckks_clients": self.n,
            "ckks_encrypt_s": round(self.t_enc, 4),
            "ckks_aggregate_s": round(self.t_agg, 4),
            "ckks_decrypt_s": round(t_dec, 4),
            "ckks_bytes_per_client": int(self.bytes_up),
            "ckks_ciphertexts_per_client": int(self.cts_up),  # the most any client sent
            "ckks_ciphertexts_summed": len(blobs),
        }
        return self.inner.post(self.layer.layout.unflatten_sum(total, self.device))
