"""The executor whose client jobs run on Flower nodes.

Each job becomes one ``train`` message to the node that hosts the client (client ``c`` on the node whose
``partition-id`` is ``c mod num-partitions``): the payload the algorithm built for that client alone, checked by
the guard before it leaves, the round index, and the round's client-side protocol steps as public data (the
session's :meth:`~secure_fed.engine.aggregation.RoundSession.client_plan`, e.g. DP's clip; the node runs the
registered steps of those names). The node rebuilds the client's training function from its own
copy of the run (:meth:`~secure_fed.engine.runner.Experiment.client_fn`) and answers with the wire message, which
the guard checks again on arrival. At most ``flower.max_in_flight`` messages are out at once; replies are yielded
in the jobs' order, so aggregation sums in the same order as in process.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.constant import ErrorCode

from secure_fed.algorithms.base import Payload
from secure_fed.client_functions import registered_name
from secure_fed.engine.execution import Channel, ClientJob, Executor
from secure_fed.engine.flower.codec import decode, encode
from secure_fed.engine.flower.run_checks import node_held_state
from secure_fed.engine.run_context import RunContext

#: what a reply's ``meta`` record may hold (the request's position in its batch; the node's callbacks' reports)
REPLY_META = frozenset({"seq", "report"})
#: ... and a setup or stage query's reply (no reports)
QUERY_REPLY_META = frozenset({"seq"})


class FlowerError(RuntimeError):
    """A Flower node failed or answered outside the protocol."""


def request(kind: str, payload: Payload, **meta: Any) -> RecordDict:
    record = encode(payload)
    record["meta"] = ConfigRecord({"kind": kind, **meta})
    return record


class FlowerExecutor(Executor):
    name = "flower"
    remote = True

    def __init__(self, grid, ctx: RunContext, *, max_in_flight: int, timeout_s: float, stage_timeout_s: float | None = None):
        """``ctx``: the run's context (its guard, stack, records, callbacks), never the run object. ``timeout_s``:
        the deadline of a message the run needs (set-up exchanges); ``stage_timeout_s``: that of a message whose loss
        the round survives (a secure aggregation stage, a training message under ``on_client_failure: drop``)."""
        self.grid, self.ctx = grid, ctx
        self.max_in_flight, self.timeout_s = max_in_flight, timeout_s
        self.stage_timeout_s = timeout_s if stage_timeout_s is None else stage_timeout_s
        self.node_of: dict[int, int] = {}
        #: each partition's node id (a restarted SuperNode may come back under another id) and the reverse
        self.node_of_partition: dict[int, int] = {}
        self.num_nodes = 0
        self.seen_nodes: set[int] = set()
        #: the round the executor last sent a message in, and the partitions whose node failed a message in it: a
        #: node that fails drops out of the rest of its round with all its clients (a killed node's later
        #: messages of that round are not sent; it rejoins at the next round's first message)
        self._round: int | None = None
        self.down: dict[int, str] = {}
        #: each dropout, in order: (round, stage, client, why); the stage is the secure aggregation stage the
        #: message carried (``advertise``, ``share``, ``receive``, ``consistency``, ``unmask``), ``input`` for a
        #: training message
        self.dropouts: list[tuple[int, str, int, str]] = []
        #: replies that answered no message of the batch in flight (a late reply to an earlier message): discarded
        self.late_discarded = 0
        #: messages sent, by kind (``whoami``, ``query``, ``train``)
        self.sent: dict[str, int] = {}
        #: training messages whose node failed or did not answer in time (the clients dropped out of their rounds)
        self.dropped = 0
        #: protocol stage queries (``partial``) whose node failed or did not answer in time
        self.stage_dropped = 0
        #: the run's public name to the nodes (they keep their clients' state under it) and, when the clients keep
        #: secrets or models on the nodes, this Flower run's first round (a node refuses a resumed run it has no
        #: state for)
        self.session = ctx.records.flower_session
        self.since = ctx.round if node_held_state(ctx) else None

    # ----------------------------------------------------------------- nodes
    def discover(self, num_clients: int, expected_nodes: int, *, wait_s: float = 600.0) -> None:
        """Wait for the nodes, ask each for its partition and map every client to its node."""
        import time

        start = time.monotonic()
        while len(nodes := list(self.grid.get_node_ids())) < expected_nodes:
            if time.monotonic() - start > wait_s:
                raise FlowerError(f"only {len(nodes)} of {expected_nodes} Flower nodes connected in {wait_s:.0f} s")
            time.sleep(0.05)
        if len(nodes) != expected_nodes:
            raise FlowerError(f"{len(nodes)} Flower nodes connected; this run expects {expected_nodes}")
        replies = self._send([(n, request("whoami", {}), None) for n in nodes])
        parts: dict[int, int] = {}
        sizes = set()
        for node, content in replies:  # type: ignore[misc]
            meta = content["meta"]
            pid = int(meta["partition_id"])
            if pid in parts:
                raise FlowerError(f"nodes {parts[pid]} and {node} both say they hold partition {pid}")
            parts[pid] = node
            sizes.add(int(meta["num_partitions"]))
        if sizes != {expected_nodes} or sorted(parts) != list(range(expected_nodes)):
            raise FlowerError(
                f"the nodes' partitions {sorted(parts)} (of {sorted(sizes)}) do not cover 0..{expected_nodes - 1} once"
            )
        n = expected_nodes
        self.num_nodes, self.num_clients = n, num_clients
        self.node_of_partition = parts
        self.seen_nodes = set(nodes)
        self.node_of = {cid: parts[cid % n] for cid in range(num_clients)}

    def _refresh_nodes(self) -> None:
        """At a round's first message: nodes that connected since the last look (a restarted SuperNode, under a
        new node id) say which partition they hold, and take it over; a node that does not answer is ignored (its
        partition keeps the node it had, whose messages then fail and drop its clients out)."""
        new = [n for n in self.grid.get_node_ids() if n not in self.seen_nodes]
        self.seen_nodes.update(new)  # asked once: a dead node's id that the SuperLink still lists is not asked again
        if not new:
            return
        failed: dict[int, str] = {}
        replies = self._send([(n, request("whoami", {}), None) for n in new], failed=failed, timeout=self.stage_timeout_s)
        for node, content in (r for r in replies if r is not None):
            meta = content["meta"]
            pid, size = int(meta["partition_id"]), int(meta["num_partitions"])
            if size != self.num_nodes or not 0 <= pid < size:
                raise FlowerError(f"node {node} says it holds partition {pid} of {size}; this run has {self.num_nodes}")
            self.node_of_partition[pid] = node
        n = self.num_nodes
        self.node_of = {cid: self.node_of_partition[cid % n] for cid in range(self.num_clients)}

    def _enter_round(self) -> None:
        """The round's first message: forget which nodes failed in the last round and look for restarted ones."""
        if self._round == self.ctx.round:
            return
        self._round, self.down = self.ctx.round, {}
        if self.node_of_partition:
            self._refresh_nodes()

    def _partition(self, cid: int) -> int:
        return cid % self.num_nodes if self.num_nodes else 0

    # ----------------------------------------------------------------- messages
    def _send(
        self,
        batch: list[tuple[int, RecordDict, int | None]],
        *,
        failed: dict[int, str] | None = None,
        timeout: float | None = None,
    ) -> list[tuple[int, RecordDict] | None]:
        """Send ``(node, content, cid)`` messages; return ``(node, reply content)`` in the batch's order. A node that
        fails or does not answer within ``timeout`` (default ``timeout_s``) stops the run, unless ``failed`` is
        given: its position then holds None and ``failed[position]`` says why. A reply to a message not of this
        batch (one that came after its deadline) is discarded."""
        timeout = self.timeout_s if timeout is None else timeout
        kinds = {"whoami": "query", "query": "query", "train": "train"}
        msgs = []
        for seq, (node, content, _) in enumerate(batch):
            kind = str(content["meta"]["kind"])
            self.sent[kind] = self.sent.get(kind, 0) + 1
            content["meta"]["seq"] = seq  # the client echoes it: replies come back in any order
            if self.session is not None:
                content["meta"]["session"] = self.session
            if self.since is not None:
                content["meta"]["since"] = self.since
            msgs.append(Message(content, dst_node_id=node, message_type=kinds[str(content["meta"]["kind"])]))
        out: list[tuple[int, RecordDict] | None] = [None] * len(msgs)
        errors: dict[int, str] = {}
        sent_ids: set[str] = set()
        #: positions whose node is lost (no reply by the deadline, or the SuperLink says it is offline), not a
        #: client's error: the node is down for the rest of the round
        self.lost_positions: set[int] = set()
        for reply in self._exchange(msgs, timeout, sent_ids):
            src = reply.metadata.src_node_id
            to = reply.metadata.reply_to_message_id
            if sent_ids and to and to not in sent_ids:
                self.late_discarded += 1  # a late answer to an earlier message: that client already dropped out
                continue
            if reply.has_error():
                to = reply.metadata.reply_to_message_id  # the grid sets each sent message's id; else the node tells
                seqs = [i for i, m in enumerate(msgs) if to and m.metadata.message_id == to]
                seqs = seqs or [i for i, (node, _, _) in enumerate(batch) if node == src]
                if failed is None or len(seqs) != 1:
                    raise FlowerError(f"node {src} failed: {reply.error.reason}")
                errors[seqs[0]] = f"node {src} failed: {reply.error.reason}"
                if reply.error.code == ErrorCode.NODE_UNAVAILABLE:  # the SuperLink's word: the node went offline
                    self.lost_positions.add(seqs[0])
                continue
            seq = int(reply.content["meta"]["seq"])
            if not 0 <= seq < len(batch):
                raise FlowerError(f"node {src} answered a message it was not sent")
            node, _, cid = batch[seq]
            if src != node or out[seq] is not None:
                raise FlowerError(f"node {src} answered a message it was not sent")
            out[seq] = (node, reply.content)
        missing = [i for i, r in enumerate(out) if r is None and i not in errors]
        if failed is None:
            if missing:
                raise FlowerError(f"no reply within {timeout:.0f} s from clients {[batch[i][2] for i in missing][:10]}")
            return out
        failed.update(errors)
        failed.update({i: f"no reply from node {batch[i][0]} within {timeout:g} s" for i in missing})
        self.lost_positions.update(missing)
        return out

    def _exchange(self, msgs: list[Message], timeout: float, sent_ids: set[str]) -> list[Message]:
        """Push ``msgs`` and pull their replies until every one has answered or ``timeout`` seconds have passed
        (polling every 0.05 s, backing off to 0.5 s; Flower's own ``send_and_receive`` polls a deployment's
        SuperLink every 3 s, which a round of several message stages pays at each). ``sent_ids`` receives the
        pushed messages' ids. A grid without ``push_messages`` uses its ``send_and_receive``."""
        import time

        if not hasattr(self.grid, "push_messages"):
            return list(self.grid.send_and_receive(msgs, timeout=timeout))
        pending = {i for i in self.grid.push_messages(msgs) if i}
        sent_ids.update(pending)
        end, wait, out = time.monotonic() + timeout, 0.05, []
        while pending:
            got = list(self.grid.pull_messages(pending))
            out.extend(got)
            pending -= {m.metadata.reply_to_message_id for m in got}
            if not pending or time.monotonic() >= end:
                break
            time.sleep(min(wait, max(0.0, end - time.monotonic())))
            wait = min(0.5, wait * 1.5)
        return out

    def _chunks(self, items: Iterable[Any], cid_of: Callable[[Any], int]) -> Iterator[list[Any]]:
        """Consecutive batches of at most ``max_in_flight`` items. With protocol layers, or an algorithm whose
        clients keep state between rounds, also at most one message per node in a batch: a node's client state
        (keys, round secrets, ``local``'s own model) lives in its ``context.state``, which Flower hands to each
        message and stores back after it, so two messages to one node at once would lose one's changes (the last
        write wins)."""
        one_per_node = bool(self.ctx.stack) or self.ctx.algorithm.keeps_client_state
        chunk: list[Any] = []
        nodes: set[int] = set()
        for item in items:
            node = self.node_of.get(cid_of(item))
            if chunk and (len(chunk) == self.max_in_flight or (one_per_node and node in nodes)):
                yield chunk
                chunk, nodes = [], set()
            chunk.append(item)
            nodes.add(node)
        if chunk:
            yield chunk

    # ----------------------------------------------------------------- the executor interface
    def _lossy_send(self, batch: list[tuple[int, RecordDict, int]], stage: str) -> tuple[list, dict[int, str]]:
        """Send a batch whose lost messages the round survives: the messages to a node that already failed in this
        round are not sent (its clients drop out at this stage too), the others wait ``stage_timeout_s``; a node
        that fails or misses the deadline is down for the rest of the round. Returns the answers (None for a
        dropout) and why each dropout happened, by position; each dropout is also logged in :attr:`dropouts`."""
        failed: dict[int, str] = {}
        live = []
        for i, (_, _, cid) in enumerate(batch):
            p = self._partition(cid)
            if p in self.down:
                failed[i] = f"node of partition {p} dropped out earlier in round {self._round}: {self.down[p]}"
            else:
                live.append(i)
        sent_failed: dict[int, str] = {}
        answers = self._send([batch[i] for i in live], failed=sent_failed, timeout=self.stage_timeout_s) if live else []
        lost = set(self.lost_positions) if live else set()
        out: list = [None] * len(batch)
        for j, i in enumerate(live):
            out[i] = answers[j]
            if j in sent_failed:
                failed[i] = sent_failed[j]
                if j in lost:  # a lost node, not one client's error: its other clients drop out with it
                    self.down.setdefault(self._partition(batch[i][2]), sent_failed[j])
        for i in sorted(failed):
            self.dropouts.append((int(self._round or 0), stage, int(batch[i][2]), failed[i]))
        return out, failed

    def run(self, jobs: Iterable[ClientJob], channel: Channel) -> Iterator[tuple[int, Payload]]:
        round_idx = self.ctx.round
        self._enter_round()
        drop = self.ctx.plan.flower.on_client_failure == "drop"
        for chunk in self._chunks(jobs, lambda job: job.cid):
            batch = []
            for job in chunk:
                channel.down(job)
                msg = request("train", job.payload, cid=job.cid, round=round_idx, plan=json.dumps(list(job.plan)))
                batch.append((self.node_of[job.cid], msg, job.cid))
            if drop:
                answers, failed = self._lossy_send(batch, "input")
            else:
                answers, failed = self._send(batch), {}
            for seq, (answer, job) in enumerate(zip(answers, chunk, strict=True)):
                if answer is None:  # the client dropped out: the round's session sums the others (or aborts)
                    self.dropped += 1
                    channel.drop(job.cid, failed[seq])
                    continue
                content = answer[1]
                wire = decode(content, meta_keys=REPLY_META)
                self.ctx.guard.check_up(job.cid, wire, record=False)  # the server checks what crossed the network
                if "report" in content["meta"]:
                    self._take_reports(job.cid, str(content["meta"]["report"]))
                yield job.cid, channel.up(job.cid, wire)

    def _take_reports(self, cid: int, text: str) -> None:
        """A node's callbacks' reports on client ``cid``: numbers only, each to the server's callback of that name,
        which must take reports from remote clients (and may refuse them)."""
        from secure_fed.errors import PrivacyViolation

        reports = json.loads(text)
        if not isinstance(reports, dict):
            raise FlowerError(f"client {cid}'s report is not a mapping")
        if self.ctx.messages is not None:  # what the server learned, in its recorded view
            self.ctx.messages.append({"direction": "up", "client": cid, "message": {"report": reports}})
        for name, report in reports.items():
            cb = self.ctx.callback(str(name))
            if cb is None or not cb.reports_from_remote_clients():
                raise PrivacyViolation(f"client {cid} sent a report for {name!r}, which takes no reports from clients")
            ok = isinstance(report, dict) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) for v in report.values()
            )
            if not ok:
                raise FlowerError(f"client {cid}'s report for {name!r} is not a mapping of names to numbers")
            cb.on_client_report(self.ctx, cid, {str(k): float(v) for k, v in report.items()})

    def query(
        self, cids: list[int], payload_fn: Callable[[int], Payload], client_fn, *, partial: bool = False
    ) -> list[tuple[int, Payload]]:
        """A setup exchange: each client runs the registered client function ``client_fn`` names. With ``partial``
        (and ``flower.on_client_failure: drop``) a client whose node fails or does not answer in time is left out of
        the answers (a protocol stage that handles dropouts, e.g. secure aggregation's), else the run stops."""
        fn = registered_name(client_fn)
        out: list[tuple[int, Payload]] = []
        drop = partial and self.ctx.plan.flower.on_client_failure == "drop"
        if drop:
            self._enter_round()
        for chunk in self._chunks(cids, int):
            batch, stage = [], "query"
            for cid in chunk:
                payload = payload_fn(cid)
                self.ctx.guard.check_down(cid, payload)
                stage = str(payload.get("secagg", stage)) if isinstance(payload, dict) else stage
                batch.append((self.node_of[cid], request("query", payload, cid=cid, fn=fn), cid))
            answers = self._lossy_send(batch, stage)[0] if drop else self._send(batch)
            for answer, cid in zip(answers, chunk, strict=True):
                if answer is None:
                    self.stage_dropped += 1
                    continue
                content = answer[1]
                reply = decode(content, meta_keys=QUERY_REPLY_META)
                self.ctx.guard.check_up(cid, reply)
                out.append((cid, reply))
        return out


__all__ = ["FlowerError", "FlowerExecutor", "request"]
