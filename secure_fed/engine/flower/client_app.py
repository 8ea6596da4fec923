"""The Flower ``ClientApp`` that serves its node's clients (the ``ServerApp`` is in :mod:`.server`). It does not
import the run object's module: the caller hands it the class that builds the node's copy of the run
(``run_class``, :class:`~secure_fed.engine.runner.Experiment`).

**What a node holds.** The node with ``partition-id`` p of N serves the clients c with c mod N = p. It builds its
own copy of the run from the experiment's config (the dataset, the partition, the model, the algorithm: all
deterministic from the config), and uses from it only its own clients' data and the client-side code: the
training function of :meth:`~secure_fed.engine.runner.Experiment.client_fn` (the same code as in process; the
same update up to float reassociation when thread counts differ) and the registered setup functions
(:mod:`secure_fed.client_functions`). It answers only for its own clients (0 ≤ c < clients, c mod N = p). It
receives no server state beyond the payloads the algorithm addresses to its clients, and a message can only name
code the node already has: the codec never unpickles (Flower's simulation engine itself moves messages between
Ray processes with pickle, inside one machine).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

from secure_fed.client_functions import apply_client_plan, resolve_client_function
from secure_fed.engine.flower.codec import decode, encode
from secure_fed.engine.flower.node_faults import before_message, encoded_input, write_input
from secure_fed.engine.tensor_tree import to_device

#: what a request's ``meta`` record may hold
REQUEST_META = frozenset({"kind", "seq", "cid", "round", "fn", "plan", "session", "since"})
#: the op of secure aggregation's mask step (the last step of a SecAgg+ round's plan)
#: the name of the plan step that masks a client's input for a secure sum (``layer:<layer>.mask_step``)
MASK_STEP_METHOD = "mask_step"
#: one copy of the run per (config, data root) in each ClientApp process
_REPLICAS: dict[str, Any] = {}


def client_replica(
    config_text: str, data_root: str | None, threads: int, run_class: Callable[..., Any], *, node_copy: bool = False
):
    """This process's copy of the run (built once, by ``run_class(plan, run_dir=..., data_root=...,
    node_copy=node_copy)``, the run object's class, from the plan the config package loads from ``config_text``): the
    clients' data and client-side code.

    ``node_copy`` (a deployment's node, whose process serves that node alone, one of many on the machine): each
    client's dense preprocessed training rows are made when that client's code reads them, so the copy holds none of
    another node's clients' (the raw data set it loads from the data root is still whole, as are sparse runs'
    shared rows and the test rows: a simulation of the nodes' data on one machine), and the process gives freed
    memory back to the system (16 Bibtex workers: 6.5 GB eleven minutes into round 1, against 8.5 GB with
    eager rows and freed memory kept). Off (a simulation worker, which serves many nodes): the run's own eager rows
    and allocator settings."""
    key = hashlib.sha256(f"{config_text}\n{data_root}\n{node_copy}".encode()).hexdigest()
    if key not in _REPLICAS:
        import torch

        from secure_fed.config import load_plan

        torch.set_num_threads(threads)
        plan = load_plan(yaml.safe_load(config_text), ["backend=inprocess"])  # the copy runs client code only
        cache = tempfile.mkdtemp(prefix="secure-fed-client-")
        atexit.register(shutil.rmtree, cache, True)  # the copy's model cache goes with the process
        _REPLICAS[key] = run_class(plan, run_dir=cache, data_root=data_root, node_copy=node_copy)
    return _REPLICAS[key]


#: the records of a node's ``context.state`` that hold its clients' protocol state (keys, secrets)
STATE_RECORDS = ("secure-fed/client-state/arrays", "secure-fed/client-state/values")


#: the records of a node's ``context.state`` that hold its clients' own algorithm state (e.g. ``local``'s θ_c)
CLIENT_DATA_RECORDS = ("secure-fed/client-data/arrays", "secure-fed/client-data/values")


def _read(context: Context, records: tuple[str, str]) -> dict:
    arrays, values = records
    if values not in context.state.keys():
        return {}
    return decode(RecordDict({"arrays": context.state[arrays], "values": context.state[values]}))


def _write(context: Context, records: tuple[str, str], state: dict) -> None:
    record = encode(state)
    context.state[records[0]] = record["arrays"]
    context.state[records[1]] = record["values"]


def node_state_file(storage: str | Path | None, context: Context, session: Any) -> Path | None:
    """Where this node keeps its clients' state for run ``session`` on its own storage (``storage``: the node's
    state directory, or None for none), so that a resumed run finds it again; the session is a public token the
    server names the run with (hex only: it becomes a folder name)."""
    if storage is None or session is None:
        return None
    if not re.fullmatch(r"[0-9a-f]{32}", str(session)):
        raise PermissionError(f"{session!r} is not a run session token")
    return Path(storage) / str(session) / f"node-{int(context.node_config['partition-id'])}.state"


def _has_state(context: Context) -> bool:
    return STATE_RECORDS[1] in context.state.keys() or CLIENT_DATA_RECORDS[1] in context.state.keys()


def _store(file: Path, state: dict) -> None:
    """Write the node's state file: private to its owner, replaced whole (a kill leaves the previous one); the
    state as the codec encodes a message, in Flower's protobuf form (nothing pickled)."""
    file.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = file.with_name(file.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(recorddict_to_proto(encode(state)).SerializeToString())
    tmp.replace(file)


def read_node_state_file(file: str | Path) -> dict:
    """A node's state file (``{"protocols": ..., "clients": ...}``), decoded by the codec: reading it runs no code."""
    proto = ProtoRecordDict()
    proto.ParseFromString(Path(file).read_bytes())
    return decode(recorddict_from_proto(proto))


def check_node_storage(context: Context, file: Path | None, *, since: int) -> None:
    """At the start of a Flower run (the ``whoami`` message): a node that will keep state gets its state file; in a
    resumed run (``since`` > 0: its first round) whose clients keep state on the nodes, a node that has none to
    take up refuses, so the run stops before any round (a client with fresh keys would draw again what it drew)."""
    if since > 0 and not _has_state(context) and (file is None or not file.is_file()):
        where = "no state storage (give the node a state-dir)" if file is None else f"no state file {file}"
        raise PermissionError(
            f"node {int(context.node_config['partition-id'])} has {where}: it cannot continue a run resumed at "
            f"round {since} whose clients keep their secrets or models on the nodes"
        )
    if file is not None and not file.is_file():
        _store(file, {"protocols": {}, "clients": {}})


def load_node_state(context: Context, exp, file: Path | None = None) -> None:
    """Before a message: this node's clients' state from ``context.state`` into the copy of the run: the layers'
    client-side protocol state (keys, secrets) and each client's own algorithm state.

    Flower keeps ``context.state`` per node for the whole run (in a deployment it starts a fresh ClientApp process
    for every message, so state kept anywhere else would be lost); it never travels to the ServerApp. A copy of
    the run that serves several nodes (one simulation worker) is loaded afresh for each message. With a state file
    (``file``) the first message of a Flower run takes the state up from it (a resumed run)."""
    if file is not None and not _has_state(context) and file.is_file():
        stored = read_node_state_file(file)
        _write(context, STATE_RECORDS, stored["protocols"])
        _write(context, CLIENT_DATA_RECORDS, stored["clients"])
    if exp.stack:
        exp.stack.load_client_state_dict(_read(context, STATE_RECORDS))
    own = _read(context, CLIENT_DATA_RECORDS)
    for c in exp.fed.clients:
        c.state = to_device(own.get(c.client_id, {}), exp.device)


def save_node_state(context: Context, exp, file: Path | None = None) -> None:
    """After a message: the copy's client-side state back into this node's ``context.state``, and into its state
    file when it keeps one."""
    protocols = exp.stack.client_state_dict() if exp.stack else {}
    if exp.stack:
        _write(context, STATE_RECORDS, protocols)
    own = {c.client_id: c.state for c in exp.fed.clients if c.state}
    if own or CLIENT_DATA_RECORDS[1] in context.state.keys():
        _write(context, CLIENT_DATA_RECORDS, own)
    if file is not None:
        _store(file, to_device({"protocols": protocols, "clients": own}, "cpu"))


def _apply_client_row_order(exp) -> None:
    """A layer that ordered W's rows (keyed label pseudonyms) lets each client compute the same order from its own
    state: the copy re-indexes its clients' labels once, as the server did after setup (simulator bookkeeping)."""
    if getattr(exp, "_node_row_order", None) is not None:
        return
    if not hasattr(exp, "_node_labels"):
        exp._node_labels = {c.client_id: c.known_labels.tolist() for c in exp.fed.clients}
    perm = exp.stack.client_row_order(exp._node_labels, list(exp.dataset.label_names))
    if perm is not None:
        exp.apply_row_order(perm)
        exp._node_row_order = perm


def _reply(msg: Message, payload: dict, **meta: Any) -> Message:
    content = encode(payload)
    content["meta"] = ConfigRecord({"seq": int(msg.content["meta"]["seq"]), **meta})
    return Message(content, reply_to=msg)


def make_client_app(
    config_text: str,
    data_root: str | None,
    run_class: Callable[..., Any],
    *,
    threads: int = 1,
    state_dir: str | Path | None = None,
) -> ClientApp:
    """The ClientApp of one experiment (its config and data root travel with the app, not in messages; each node
    builds its copy with ``run_class``); each node keeps its clients' state under ``state_dir`` too (its storage;
    None: only for one Flower run)."""
    return client_app_of(lambda context: client_replica(config_text, data_root, threads, run_class), lambda context: state_dir)


def client_app_of(
    replica: Callable[[Context], Any], storage: Callable[[Context], str | Path | None] = lambda context: None
) -> ClientApp:
    """A ClientApp whose node finds its copy of the run with ``replica(context)`` and its state directory with
    ``storage(context)`` (None: the node keeps its clients' state for one Flower run only)."""
    app = ClientApp()

    def state_file(context: Context, meta) -> Path | None:
        """The node's state file for this run, when the run's clients keep state on the nodes (the server then
        sends ``since``); None otherwise."""
        if "since" not in meta:
            return None
        return node_state_file(storage(context), context, meta["session"] if "session" in meta else None)

    def own_client(context: Context, cid: int, exp) -> None:
        p, n = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
        if not 0 <= cid < len(exp.fed.clients) or cid % n != p:
            raise PermissionError(f"client {cid} does not live on partition {p} of {n}")

    def before(context: Context, round_idx: int, stage: str) -> None:
        """The node's fault hooks (:mod:`.node_faults`): note its progress, die here if its schedule says so."""
        before_message(storage(context), int(context.node_config["partition-id"]), round_idx, stage)

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        meta = msg.content["meta"]
        payload = None if meta["kind"] == "whoami" else decode(msg.content, meta_keys=REQUEST_META)
        if isinstance(payload, dict) and "secagg" in payload and "secagg_round" in payload:  # a SecAgg+ stage
            before(context, int(payload["secagg_round"]), str(payload["secagg"]))
        if meta["kind"] == "whoami":
            check_node_storage(context, state_file(context, meta), since=int(meta["since"]) if "since" in meta else 0)
            return _reply(
                msg, {}, partition_id=int(context.node_config["partition-id"]),
                num_partitions=int(context.node_config["num-partitions"]),
            )  # fmt: skip
        cid, name = int(meta["cid"]), str(meta["fn"])
        exp = replica(context)
        own_client(context, cid, exp)
        file = state_file(context, meta)
        load_node_state(context, exp, file)
        fn = resolve_client_function(name, exp.stack.by_name())
        reply = fn(payload, exp.fed.clients[cid])
        save_node_state(context, exp, file)
        return _reply(msg, reply)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        meta = msg.content["meta"]
        cid, round_idx = int(meta["cid"]), int(meta["round"])
        before(context, round_idx, "input")
        exp = replica(context)
        own_client(context, cid, exp)
        file = state_file(context, meta)
        load_node_state(context, exp, file)
        _apply_client_row_order(exp)  # training addresses rows; the setup steps still read labels in label order
        exp.round = round_idx  # the client's training function of this round (its generator follows the round)
        payload = decode(msg.content, meta_keys=REQUEST_META)
        client = exp.fed.clients[cid]
        payload = to_device(payload, exp.device)
        plan = json.loads(str(meta["plan"])) if "plan" in meta else []
        # the server chooses the round's plan; the node runs it only if it is the plan its own copy of the run's
        # config gives (no step dropped, weakened, reordered or pointed at another round)
        exp.stack.check_client_plan(plan, round_idx=round_idx, cid=cid)
        # randomness addressed by the round (DP): a round trains again only on the same payload and plan
        exp.stack.check_round_payload(cid, round_idx, payload, plan)
        layers = exp.stack.by_name()
        trained = exp.client_fn(cid)(payload, client)
        masker = mask_step_layer(plan)
        if exp.plan.flower.debug_write_inputs and masker is not None and storage(context):
            # test only: the input as the mask step will encode it, into the node's own folder (node_faults)
            trained = apply_client_plan(trained, plan[:-1], data=client, layers=layers)
            write_input(storage(context), round_idx, cid, encoded_input(layers[masker], trained,
                                                                        str(plan[-1]["weighting"])))  # fmt: skip
            plan = plan[-1:]
        reply = apply_client_plan(trained, plan, data=client, layers=layers)
        save_node_state(context, exp, file)
        # what the node's callbacks measured inside the client's function that the server may learn (e.g. the
        # client's own model's mAP in the general setting, without DP), beside the reply
        ctx = exp.context()
        reports = {cb.name: r for cb in exp.callbacks if cb.reports_from_remote_clients() and (r := cb.client_report(ctx, cid))}
        return _reply(msg, reply, **({"report": json.dumps(reports)} if reports else {}))

    return app


__all__ = [
    "client_app_of",
    "client_replica",
    "make_client_app",
    "load_node_state",
    "read_node_state_file",
    "save_node_state",
]


def mask_step_layer(plan: list[dict]) -> str | None:
    """The layer whose mask step ends the round's client plan (``layer:<name>.mask_step``), else None."""
    op = str(plan[-1].get("op", "")) if plan else ""
    if not op.startswith("layer:") or not op.endswith(f".{MASK_STEP_METHOD}"):
        return None
    return op[len("layer:") : -len(MASK_STEP_METHOD) - 1]
