"""The server's guarded link to its clients: every exchange goes through the
:class:`~secure_fed.engine.guard.MessageGuard`, in process or through a remote executor.

Setup-time exchanges (:meth:`ClientLink.query`) and the round's channel (:meth:`ClientLink.channel`: downlink
checked before it leaves, the wire message logged and shown to the callbacks, dropouts to the round's session).
The link holds the run's executor (the Flower back end passes its own in for a run).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from secure_fed.engine.execution import Channel, Executor
from secure_fed.engine.guard import MessageGuard


class ClientLink:
    """The guard, the clients it speaks for (``fed``) and the executor that runs their code."""

    def __init__(self, guard: MessageGuard, fed, executor: Executor):
        self.guard, self.fed, self.executor = guard, fed, executor

    def exchange(self, cid: int, payload: dict, client_fn) -> dict:
        """One in-process exchange: payload checked, the client's function, its reply checked."""
        self.guard.check_down(cid, payload)
        reply = client_fn(payload, self.fed.clients[cid])
        self.guard.check_up(cid, reply)
        return reply

    def query(self, cids: list[int], payload_fn, client_fn, *, partial: bool = False) -> list[tuple[int, dict]]:
        """A setup-time exchange with ``cids``: in process, or through a remote executor (which sends the client
        function's registered name; the client runs its own copy). ``partial``: the caller takes the answers of the
        clients that answered (a remote client whose node fails or times out drops out of the exchange)."""
        if self.executor.remote:
            return self.executor.query(cids, payload_fn, client_fn, partial=partial)
        return [(cid, self.exchange(cid, payload_fn(cid), client_fn)) for cid in cids]

    def query_all(self, payload_fn, client_fn) -> list[tuple[int, dict]]:
        return self.query([c.client_id for c in self.fed.clients], payload_fn, client_fn)

    def query_one(self, cid: int, payload: dict, client_fn) -> dict:
        return self.query([cid], lambda _cid: payload, client_fn)[0][1]

    def channel(self, round_idx: int, callbacks: Sequence[Any], drop: Callable[[int, str], None] | None = None) -> Channel:
        """The round's guarded channel: downlink checked before it leaves; the wire message logged and shown to
        the callbacks (the client's plaintext reply is checked on the client, inside the run's client function);
        a client that drops out goes to ``drop`` (the round's session)."""

        def up(cid: int, wire: dict) -> dict:
            self.guard.record("up", cid, wire)
            for cb in callbacks:
                cb.on_uplink(round_idx, cid, wire)
            return wire

        def dropped(cid: int, reason: str) -> None:
            if drop is None:
                raise RuntimeError(f"client {cid} dropped out ({reason}) outside a round")
            drop(cid, reason)

        return Channel(
            down=lambda job: self.guard.check_down(job.cid, job.payload, plan=job.plan), up=up,
            client=lambda cid: self.fed.clients[cid], drop=dropped,
        )  # fmt: skip
