"""Client side: each client's record of the rounds it trained (the SHA-256 of each round's payload and plan), which
stops its round-addressed DP noise from being spent twice, and the checkpoint of its secret stream and record."""

from __future__ import annotations

from typing import Any

from protocols.randomness import SecretStream
from secure_fed.plugin_api.layers import Payload, payload_digest


def check_round_payload(trained: dict[int, bytes], cid: int, round_idx: int, payload: Payload, plan: list[dict]) -> None:
    """A client's DP randomness (its noise share, its DP-SGD batches and noise) is addressed by the round, so
    training one round twice on different payloads, or under plans with different noise shares (the same draws
    scaled), would release two updates with the same noise, whose difference (or weighted difference) is noise-free.
    The client keeps in ``trained`` (round → digest) a SHA-256 of each round's payload and plan
    (:func:`~secure_fed.engine.message_digest.payload_digest`) and trains a round again only on the same ones (the
    round a resumed run replays first is byte-identical to the original)."""
    digest = payload_digest({"payload": payload, "plan": plan})
    if trained.get(int(round_idx), digest) != digest:
        raise PermissionError(
            f"client {cid}: round {round_idx} arrived again with another payload or plan; its DP noise, addressed "
            "by the round, would repeat: refused (a server that deviates from the protocol, or a resumed run whose "
            "replayed rounds differ from the first run's, e.g. by other real dropouts; output.checkpoint_every: 1 "
            "replays no round but the interrupted one)"
        )
    trained[int(round_idx)] = digest


def client_state_dict(streams: dict[int, SecretStream], trained: dict[int, dict[int, bytes]]) -> dict[Any, Any]:
    """Each client's secret stream's state with its record of trained rounds (``trained``)."""
    return {cid: {**s.state_dict(), "trained": dict(trained.get(cid, {}))} for cid, s in streams.items()}


def load_client_state_dict(state: dict[Any, Any]) -> tuple[dict[int, SecretStream], dict[int, dict[int, bytes]]]:
    """The clients' secret streams and records of trained rounds, from :func:`client_state_dict`'s checkpoint."""
    streams = {int(cid): SecretStream.from_state_dict(st) for cid, st in state.items()}
    trained = {int(cid): {int(r): bytes(d) for r, d in st.get("trained", {}).items()} for cid, st in state.items()}
    return streams, trained


__all__ = ["check_round_payload", "client_state_dict", "load_client_state_dict"]
