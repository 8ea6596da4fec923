"""One long-lived ClientApp process per SuperNode: ``python -m secure_fed.engine.flower.clientapp_worker``.

Flower 1.42's process isolation (``flower-supernode --isolation process``) leaves running the node's ClientApps to
a separate process that polls the SuperNode's Runtime API for tasks: ``flower-superexec``, which starts a fresh
``flwr-clientapp`` process for every message (each imports torch and builds its copy of the run again). This
worker takes its place and runs the same steps as ``flwr-clientapp`` (Flower's own functions: take a task and its
one-time token, pull the message, the node's context and the app, run the ClientApp, push the reply and the
context back), but every task in this one process, so the node's copy of the run
(:func:`~secure_fed.engine.flower.client_app.client_replica`) is built once per run and kept. The node's state
still lives in its ``context.state`` (handed to each task and stored back after it by the SuperNode), never in
this process: a killed worker loses nothing but its cache.

Only what the SuperNode's Runtime API offers reaches it; it listens on nothing. With ``--parent-pid`` it stops
when the SuperNode is gone.

``--zygote SOCKET``: one process per deployment imports torch, Flower and secure-fed once, then forks a worker for
each node that asks through the Unix socket (:func:`spawn`): the libraries' pages are shared copy-on-write by all
workers (and ``gc.freeze()`` keeps a worker's garbage collector from copying them), so a node's worker costs about
70 MiB of PSS before its copy of the run instead of about 380 MiB (torch alone writes about 280 MiB of private
pages at import on this machine). A forked worker is a process of its own
(its own session, log, environment variables as the node gives them, its SuperNode as parent to watch); it does not
share its memory writes with any other node's.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import time
from logging import ERROR, INFO, WARNING

#: Flower's task type of a ClientApp execution
CLIENT_APP = "flwr-clientapp"

#: seconds a task's message may take to pull before the task is given up (Flower's own pull retries for up to 2 hours:
#: a task of a run that a restarted SuperLink has ended can never be pulled, and would hold the node that long)
PULL_INPUT_TIMEOUT_S = 120.0


def pull_task_input(client, *, max_time: float = PULL_INPUT_TIMEOUT_S):
    """``flwr.supernode.runtime.run_clientapp.pull_task_input`` (the task's context, run, FAB and message, through
    Flower's own calls) with the message's pull bounded by ``max_time`` seconds."""
    from flwr.app import Message
    from flwr.proto.node_pb2 import Node
    from flwr.proto.runtime_pb2 import PullAppMessagesRequest, PullTaskInputRequest
    from flwr.supercore.inflatable.inflatable_protobuf_utils import (
        make_confirm_message_received_fn_protobuf,
        make_pull_object_fn_protobuf,
    )
    from flwr.supercore.inflatable.inflatable_utils import pull_and_inflate_object_from_tree
    from flwr.supernode.runtime import run_clientapp as flwr_clientapp

    res = client.PullTaskInput(PullTaskInputRequest())
    flwr_clientapp.TaskIdentity.task_id = res.task_id
    flwr_clientapp.TaskIdentity.run_id = res.run.run_id
    flwr_clientapp.TaskIdentity.node_id = res.context.node_id
    context = flwr_clientapp.context_from_proto(res.context)
    run, fab = flwr_clientapp.run_from_proto(res.run), flwr_clientapp.fab_from_proto(res.fab)
    messages = client.PullMessages(PullAppMessagesRequest())
    if not messages.messages_list:
        raise RuntimeError("No messages received from Runtime API")
    node, tree = Node(node_id=context.node_id), messages.message_object_trees[0]
    message = pull_and_inflate_object_from_tree(
        tree, make_pull_object_fn_protobuf(client.PullObject, node, context.run_id),
        make_confirm_message_received_fn_protobuf(client.ConfirmMessageReceived, node, context.run_id),
        return_type=Message, max_time=max_time,
    )  # fmt: skip
    message.metadata.__dict__["_message_id"] = tree.object_id  # as Flower sets it: the deflated message lacks it
    return message, context, run, fab


#: HTTP statuses a task's calls retry, as Flower's own retry invoker does (the SuperNode busy or behind a gateway)
RETRYABLE_STATUSES = frozenset({502, 503, 504})


def task_retry_invoker():
    """The retries of a task's Runtime API calls: Flower's (``make_simple_http_retry_invoker``: its transport errors
    and 502/503/504 retried with exponential waits up to ``MAX_RETRY_DELAY``, each retry logged), except that every
    other refusal, a void task token (401) or a stopped run (403) included, gives up with the error. Flower's invoker
    answers a 401 with SIGINT to its own process, which ends ``flwr-clientapp`` with its task; here it would end the
    node's only ClientApp process (the 16-node deployment lost three workers so, after a heartbeat of a finished task
    was refused). The error reaches the task's caller, which logs it and takes the next task (:func:`serve`)."""
    import httpx
    from flwr.common.constant import MAX_RETRY_DELAY
    from flwr.supercore import log
    from flwr.supercore.retry import RetryInvoker, exponential

    transport = (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError,
                 httpx.ConnectTimeout, httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout)  # Flower's  # fmt: skip

    def should_giveup(exc: Exception) -> bool:
        return isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code not in RETRYABLE_STATUSES

    def on_backoff(state) -> None:
        log(WARNING, "Runtime API call failed (%s), retrying (try %s)", state.exception, state.tries)

    return RetryInvoker(
        wait_gen_factory=lambda: exponential(max_delay=MAX_RETRY_DELAY),
        recoverable_exceptions=(*transport, httpx.HTTPStatusError),
        max_tries=None, max_time=None, should_giveup=should_giveup, on_backoff=on_backoff,
    )  # fmt: skip


def task_client(address: str, token: str):
    """The Runtime API client of one task (its one-time token on every call), with :func:`task_retry_invoker`."""
    from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
    from flwr.supercore.runtime import RuntimeHttpClient

    return RuntimeHttpClient.from_server_address(
        server_address=address, insecure=True, root_certificates=None,
        interceptors=[RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"), RuntimeTokenHttpInterceptor(token)],
        retry_invoker=task_retry_invoker(),
    )  # fmt: skip


def task_heartbeat_fn(client):
    """The task's heartbeat, as ``flwr.supercore.heartbeat.make_task_heartbeat_fn_http`` sends it, for a process that
    outlives its tasks: where Flower's ``flwr-clientapp`` (one process per task) raises SIGINT when the SuperNode
    answers that the task is gone, and lets a refused token (401) end its heartbeat thread with an error, here both
    end only the heartbeat (it reports success, so it is not retried); the task's own calls then fail, and the worker
    takes the next task. A SIGINT would end the node's only ClientApp process."""
    import httpx
    from flwr.proto.runtime_pb2 import SendTaskHeartbeatRequest

    req = SendTaskHeartbeatRequest()
    gone = []

    def fn() -> bool:
        if gone:  # the SuperNode said the task is over: nothing more to send
            return True
        try:
            res = client.SendTaskHeartbeat(req)
        except httpx.TransportError:
            return False
        except httpx.HTTPStatusError as err:
            if err.response.status_code in (httpx.codes.SERVICE_UNAVAILABLE, httpx.codes.GATEWAY_TIMEOUT):
                return False
            gone.append(err.response.status_code)  # e.g. 401: the task's token is void
            return True
        if not res.success:
            gone.append("ended")
        return True

    return fn


def _run_task(address: str, token: str, apps: dict) -> None:
    """One ClientApp task, as ``flwr.supernode.runtime.run_clientapp`` runs it, in this process."""
    from flwr.app import Message
    from flwr.app.error import Error
    from flwr.cli.install import install_from_fab
    from flwr.clientapp.utils import get_load_client_app_fn
    from flwr.common.constant import ErrorCode, SubStatus
    from flwr.supercore import log
    from flwr.supercore.heartbeat import HeartbeatSender
    from flwr.supernode.runtime.run_clientapp import push_message, push_task_output

    client = task_client(address, token)
    heartbeat = HeartbeatSender(task_heartbeat_fn(client))
    message = reply = context = None
    status, details = SubStatus.FAILED, "ClientApp task failed"
    try:
        heartbeat.start()
        message, context, run, fab = pull_task_input(client)
        if fab.hash_str not in apps:  # the app is installed and loaded once per FAB (i.e. per app version)
            install_from_fab(fab.content, skip_prompt=True)
            load = get_load_client_app_fn(default_app_ref="", app_path=None, multi_app=True)
            apps[fab.hash_str] = load(run.fab_id, run.fab_version, fab.hash_str)
        reply = apps[fab.hash_str](message=message, context=context)
        status, details = SubStatus.COMPLETED, ""
    except Exception as ex:  # noqa: BLE001 - the node's reply says what failed, as flwr-clientapp's does
        log(ERROR, "ClientApp raised an exception", exc_info=ex)
        details = f"{type(ex)}:<'{ex}'>"
        if message is not None:
            reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=details), reply_to=message)
    except BaseException:  # e.g. the parent monitor's SIGINT (the SuperNode gone): the last calls get one try each
        client._retry_invoker.max_tries = 1  # as Flower's own exit handler sets it
        raise
    finally:
        try:
            if reply is not None and context is not None:
                push_message(client, reply, context)
            push_task_output(client=client, context=context, sub_status=status, details=details)
        finally:
            if heartbeat.is_running:
                heartbeat.stop()
            client.close()


#: the longest wait between two task requests the SuperNode refused in a row
MAX_REFUSED_WAIT_S = 10.0


def serve(address: str, *, poll_s: float = 0.2, parent_pid: int | None = None) -> None:
    """Take the SuperNode's ClientApp tasks one after the other, for ever (a refused request is asked again, backing
    off to :data:`MAX_REFUSED_WAIT_S`; the SuperNode's end ends the worker through the parent monitor)."""
    import httpx
    from flwr.proto.runtime_pb2 import AcquireTaskRequest
    from flwr.supercore import log
    from flwr.supercore.app_utils import start_parent_process_monitor
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
    from flwr.supercore.runtime import RuntimeHttpClient

    from secure_fed.engine.flower.live_buffers import largest_buffers, memlog_on
    from secure_fed.engine.flower.node_memory import pss_kib

    if parent_pid is not None:
        start_parent_process_monitor(parent_pid)
    client = RuntimeHttpClient.from_server_address(
        server_address=address, insecure=True, root_certificates=None,
        interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperExec")],
        retry_invoker=task_retry_invoker(),
    )  # fmt: skip
    log(INFO, "secure-fed ClientApp worker polling %s", address)
    apps: dict = {}
    refused = 0
    while True:
        try:
            res = client.AcquireTask(AcquireTaskRequest(supported_task_types=[CLIENT_APP], agentapp_fab_hashes=[]))
        except httpx.HTTPStatusError as ex:  # a refusal (e.g. 403 while a run stops): ask again, backing off
            refused += 1
            if refused in (1, 10) or refused % 100 == 0:
                log(WARNING, "secure-fed ClientApp worker: no task (%s), %d refusals in a row; asking again", ex, refused)
            time.sleep(min(MAX_REFUSED_WAIT_S, poll_s * 2 ** min(refused, 10)))
            continue
        refused = 0
        if res.HasField("task") and res.token:
            try:
                _run_task(address, res.token, apps)
            except Exception as ex:  # noqa: BLE001 - e.g. a reply refused for a task the SuperNode has ended (401)
                log(ERROR, "secure-fed ClientApp worker: a task ended with an error; taking the next", exc_info=ex)
            if memlog_on():  # SECURE_FED_WORKER_MEMLOG=1: what this node's memory is made of, after each task
                log(INFO, "secure-fed ClientApp worker: PSS %s KiB after the task; largest buffers %s",
                    pss_kib(os.getpid()), json.dumps(largest_buffers()))  # fmt: skip
        else:
            time.sleep(poll_s)


def zygote(path: str) -> None:
    """Import what a worker needs, then fork one worker per request on the Unix socket ``path`` (a JSON line:
    ``address``, ``parent_pid``, ``env``, ``log``; the answer: ``{"pid": ...}``), for ever."""
    import gc

    import torch  # noqa: F401 - imported here once, shared by every worker
    from flwr.cli.install import install_from_fab  # noqa: F401
    from flwr.supernode.runtime import run_clientapp  # noqa: F401

    import secure_fed.engine.flower.flwr_app  # noqa: F401
    import secure_fed.engine.runner  # noqa: F401

    gc.freeze()  # the imported objects are never collected: a worker's collector leaves their pages shared
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the workers are reaped by the kernel
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    while True:
        conn, _ = server.accept()
        with conn:
            req = json.loads(conn.makefile().readline())
            pid = os.fork()
            if pid == 0:  # the worker: its own session, log and environment
                try:
                    server.close()
                    conn.close()
                    os.setsid()
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                    os.dup2(fd, 1)
                    os.dup2(fd, 2)
                    os.environ.update(req["env"])
                    serve(req["address"], parent_pid=req["parent_pid"])
                finally:
                    os._exit(1)
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")


def spawn(path: str, *, address: str, parent_pid: int, env: dict[str, str], log: str, timeout_s: float = 60.0) -> int:
    """Ask the zygote at ``path`` for a worker for the SuperNode whose Runtime API is ``address``; its pid."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(timeout_s)
                s.connect(path)
                s.sendall(json.dumps({"address": address, "parent_pid": parent_pid, "env": env, "log": log}).encode() + b"\n")
                return int(json.loads(s.makefile().readline())["pid"])
        except (FileNotFoundError, ConnectionRefusedError):  # the zygote is still importing
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="a long-lived ClientApp process for one SuperNode (--isolation process)")
    ap.add_argument("--runtime-api-address", help="the SuperNode's Runtime API (host:port)")
    ap.add_argument("--parent-pid", type=int, default=None, help="stop when this process (the SuperNode) is gone")
    ap.add_argument("--poll", type=float, default=0.2, help="seconds between polls for a task (default 0.2)")
    ap.add_argument("--zygote", metavar="SOCKET", help="fork a worker per request on this Unix socket instead")
    args = ap.parse_args(argv)
    if args.zygote:
        zygote(args.zygote)
    elif args.runtime_api_address:
        serve(args.runtime_api_address, poll_s=args.poll, parent_pid=args.parent_pid)
    else:
        ap.error("give --runtime-api-address or --zygote")


if __name__ == "__main__":
    main()
