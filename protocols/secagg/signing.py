"""Long-term signing keys for secure aggregation against an active server (Bonawitz et al. 2017, §6; Bell et al. 2020).

**Trust assumption (the PKI).** Each client u has an Ed25519 signing key whose private half only u holds; every
client pins a *directory* (client id → public key) before the first round and checks every signature against it.
Where the directory comes from is ``secure_aggregation.key_source``:

* ``setup`` (default): before round 0 each client draws its own key (client side: the private key stays in its own
  state, on its Flower node or in the clients' checkpoint, never in a server object or file) and sends the public
  half; the directory assembled from the answers is sent back and every client pins it. The exchange at set-up
  must be honest (the operator acting as a trusted dealer; trust on first use): a server that substitutes keys at
  set-up could impersonate clients. A server that turns malicious after set-up can no longer do so: a client's
  key and pinned directory are write-once (a second ``register`` answers the same key, a second ``pin`` of any
  other directory is refused), kept in the client's own storage.
* ``file``: the operator writes the keys once (:func:`write_keys_dir`) and gives each client its own private key
  file and every party ``directory.json`` out of band; the server never reads a private key file.

What the signatures stop: (1) the server replacing a neighbour's advertised public keys with its own (it would then
open the Shamir shares sealed to that neighbour, with no colluding client at all); (2) with the consistency check,
a server that tells different clients different survivor sets (U3) so that some release shares of u's self-mask seed
b_u and others shares of u's mask key s_u: both halves of one client's masks, hence its input.

**The quorum.** A client releases its share of neighbour u's secrets only when at least ``Q_u = ⌈(|G_u| + t_u)/2⌉``
members of u's group G_u (u and the neighbours u sealed its shares to, as u itself listed them inside the sealed
shares; its threshold t_u from its signed advertisement) have signed the exact survivor set the client was told,
each signature bound to the signer's session of the round (its fresh public keys, as u sealed them inside its
shares: :func:`survivors_message`), so a signature from another run of the round index does not count; and a client
takes part in one run of each round (the layer's record). Two different sets each with Q_u signers in G_u share at
least 2·Q_u − |G_u| ≥ t_u signers, and an honest client signs one set a round: an equivocating server therefore
needs t_u colluders in G_u, the number that already hands it u's input in the honest-but-curious model (the graph
bound P1, :mod:`protocols.secagg.graph_bounds`). A quorum of only t_u signatures would not help: with 2·t_u − |G_u|
colluders (2 of 10 at t = 6, 8 of 40 at t = 24) two disjoint views each reach t_u signatures, exactly as the attack
without any check needs (tests/protocols/test_secagg_active_server.py).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from protocols.crypto import SigningKey, verify_signature


class ForgedMessage(PermissionError):
    """A client refuses a message the pinned directory does not vouch for (forged, unsigned, or inconsistent)."""


def consistency_quorum(group_size: int, threshold: int) -> int:
    """Q = ⌈(|G| + t) / 2⌉: two sets with Q signers each in a group of |G| share ≥ t of them."""
    return math.ceil((group_size + threshold) / 2)


def advert_message(round_idx: int, cid: int, c_pk: bytes, s_pk: bytes, neighbours: list[int], threshold: int) -> bytes:
    """What client ``cid`` signs in AdvertiseKeys: the round, its id, its two public keys, the neighbours it will
    share with and its threshold (a neighbour learns u's group and t from u, not from the server)."""
    head = f"secure-fed secagg advert r{int(round_idx)} c{int(cid)} t{int(threshold)} n{','.join(map(str, sorted(neighbours)))}"
    return head.encode() + b"|" + bytes(c_pk) + bytes(s_pk)


def session_digest(c_pk: bytes, s_pk: bytes) -> bytes:
    """A client's session of a round: SHA-256 of the fresh public keys it advertised in it. Each run of a round
    index (a server may run the same index again) has fresh keys, hence its own digest."""
    return hashlib.sha256(b"secure-fed secagg session|" + bytes(c_pk) + bytes(s_pk)).digest()


def survivors_message(round_idx: int, survivors: list[int] | set[int], session: bytes) -> bytes:
    """What a client signs in the consistency check: the round, the survivor set U3 it was told, and its own
    session (:func:`session_digest`), so that a signature from one run of the round counts in no other run: a
    verifier checks it against the signer's keys as the neighbour whose share is at stake saw them in this run
    (sealed inside that neighbour's shares)."""
    head = f"secure-fed secagg survivors r{int(round_idx)} {','.join(map(str, sorted(int(u) for u in survivors)))}"
    return head.encode() + b"|" + bytes(session)


def check_advert(
    directory: dict[int, bytes], round_idx: int, cid: int, ad: dict, *, to: int, shape: tuple[int, int] | None = None
) -> tuple[list[int], int]:
    """Client ``to``'s check of neighbour ``cid``'s advertisement against the pinned ``directory``: raises
    :class:`ForgedMessage` unless it is ``cid``'s signature on this round's keys, it names ``to`` as a neighbour
    and, with ``shape`` = (k, t), ``to``'s own neighbourhood size and threshold (every client of a round has the
    same k and t, which each computes from the config: a server cannot give one client a smaller group).
    Returns (cid's neighbours, cid's threshold)."""
    pk = directory.get(int(cid))
    if pk is None:
        raise ForgedMessage(f"client {to}: client {cid} is not in the pinned signing-key directory: refused")
    try:
        nbrs, t = [int(v) for v in ad["nbrs"]], int(ad["t"])
        msg = advert_message(round_idx, cid, ad["c_pk"], ad["s_pk"], nbrs, t)
    except (KeyError, TypeError, ValueError) as e:
        raise ForgedMessage(f"client {to}: client {cid}'s key advertisement is unsigned or malformed: refused") from e
    if not verify_signature(pk, msg, ad.get("sig")):
        raise ForgedMessage(f"client {to}: client {cid}'s key advertisement does not carry its signature: refused")
    if to not in nbrs or not 1 <= t <= len(nbrs) + 1:
        raise ForgedMessage(f"client {to}: client {cid}'s signed advertisement does not make {to} its neighbour: refused")
    if shape is not None and (len(set(nbrs)) != shape[0] or cid in nbrs or t != shape[1]):
        raise ForgedMessage(f"client {to}: client {cid}'s signed advertisement has {len(set(nbrs))} neighbours and "
                            f"threshold {t}, not the round's {shape[0]} and {shape[1]}: refused")  # fmt: skip
    return nbrs, t


def write_keys_dir(path: str | Path, cids: list[int]) -> dict[int, bytes]:
    """The operator as a trusted dealer (``key_source: file``): one private key file per client
    (``client-<id>.ed25519``, to be handed to that client only) and ``directory.json`` (public keys, for everyone).
    Returns the directory."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    directory = {}
    for cid in cids:
        key = SigningKey()
        f = path / f"client-{int(cid)}.ed25519"
        f.write_bytes(key.private_bytes())
        f.chmod(0o600)
        directory[int(cid)] = key.public
    (path / "directory.json").write_text(json.dumps({str(c): pk.hex() for c, pk in directory.items()}, indent=0))
    return directory


def read_directory(path: str | Path) -> dict[int, bytes]:
    """``directory.json`` of a keys folder: client id → Ed25519 public key."""
    raw = json.loads((Path(path) / "directory.json").read_text())
    return {int(c): bytes.fromhex(pk) for c, pk in raw.items()}


def read_private_key(path: str | Path, cid: int) -> SigningKey:
    """Client side only: client ``cid``'s own private key file from a keys folder."""
    return SigningKey.from_private_bytes((Path(path) / f"client-{int(cid)}.ed25519").read_bytes())


def dealer_keys(cids: list[int]) -> tuple[dict[int, SigningKey], dict[int, bytes]]:
    """In process, a trusted dealer: each client's signing key (to be kept by that client) and the directory."""
    keys = {int(c): SigningKey() for c in cids}
    return keys, {c: k.public for c, k in keys.items()}
