"""The long-lived ClientApp worker (:mod:`secure_fed.engine.flower.clientapp_worker`): a task's message is pulled
within a bounded time, so a task whose message can never be pulled (its run ended by a restarted SuperLink) frees
the node instead of holding it for Flower's two hours of retries."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

pytest.importorskip("flwr")


def _fake_client(object_tree):
    def pull_task_input(_req):
        return SimpleNamespace(task_id=7, run=SimpleNamespace(run_id=11), context=SimpleNamespace(node_id=3), fab=None)

    def pull_messages(_req):
        return SimpleNamespace(messages_list=[object()], message_object_trees=[object_tree])

    def pull_object(_req):  # the object is never there, as for a message of a run the SuperLink has ended
        raise AssertionError("replaced by the patched pull function")

    return SimpleNamespace(PullTaskInput=pull_task_input, PullMessages=pull_messages, PullObject=pull_object,
                           ConfirmMessageReceived=lambda _req: None)  # fmt: skip


def test_a_message_that_never_arrives_is_given_up_after_the_bound(monkeypatch):
    from flwr.supercore.inflatable import inflatable_protobuf_utils, inflatable_utils
    from flwr.supercore.inflatable.inflatable_utils import ObjectPullError, ObjectUnavailableError
    from flwr.supernode.runtime import run_clientapp

    from secure_fed.engine.flower import clientapp_worker

    monkeypatch.setattr(run_clientapp, "context_from_proto", lambda p: SimpleNamespace(node_id=3, run_id=11))
    monkeypatch.setattr(run_clientapp, "run_from_proto", lambda p: p)
    monkeypatch.setattr(run_clientapp, "fab_from_proto", lambda p: None)
    monkeypatch.setattr(run_clientapp, "TaskIdentity", SimpleNamespace())
    calls = []

    def never(object_id):
        calls.append(object_id)
        raise ObjectUnavailableError(object_id)

    monkeypatch.setattr(inflatable_protobuf_utils, "make_pull_object_fn_protobuf", lambda *a: never)
    monkeypatch.setattr(inflatable_protobuf_utils, "make_confirm_message_received_fn_protobuf", lambda *a: None)
    seen = {}
    real = inflatable_utils.pull_and_inflate_object_from_tree

    def spy(tree, pull, confirm, **kw):
        seen.update(kw)
        return real(tree, pull, confirm, **{**kw, "initial_backoff": 0.05, "backoff_cap": 0.05})

    monkeypatch.setattr(inflatable_utils, "pull_and_inflate_object_from_tree", spy)
    tree = SimpleNamespace(object_id="a" * 64, children=[])
    start = time.monotonic()
    with pytest.raises(ObjectPullError):
        clientapp_worker.pull_task_input(_fake_client(tree), max_time=0.5)
    assert seen["max_time"] == 0.5 and calls  # the bound reaches Flower's pull, which tried and gave up
    assert time.monotonic() - start < 10
    assert clientapp_worker.PULL_INPUT_TIMEOUT_S <= 300  # far below Flower's 7,200 s


class _Stop(BaseException):  # not an Exception: the worker's loop lets only these through
    pass


def test_a_task_that_fails_does_not_end_the_worker(monkeypatch):
    """A task whose calls fail (e.g. its reply refused with 401 once the SuperNode has ended it) is logged and the
    worker takes the next task: the worker is the node's only ClientApp process."""
    from flwr.supercore import runtime

    from secure_fed.engine.flower import clientapp_worker

    tokens = iter(["t1", "t2", None])

    class FakeClient:
        def AcquireTask(self, _req):  # noqa: N802 - Flower's method name
            token = next(tokens)
            if token is None:
                raise _Stop
            return SimpleNamespace(HasField=lambda _f: True, token=token)

    monkeypatch.setattr(runtime.RuntimeHttpClient, "from_server_address", classmethod(lambda cls, **kw: FakeClient()))
    ran = []

    def run_task(address, token, apps):
        ran.append(token)
        if token == "t1":
            raise RuntimeError("Client error '401 Unauthorized'")

    monkeypatch.setattr(clientapp_worker, "_run_task", run_task)
    with pytest.raises(_Stop):
        clientapp_worker.serve("127.0.0.1:1", poll_s=0.0)
    assert ran == ["t1", "t2"]


def test_the_heartbeat_of_a_task_the_supernode_ended_stops_quietly():
    """Flower's flwr-clientapp raises SIGINT when the SuperNode says the task is gone (one process per task); in
    the long-lived worker that would end the node's only ClientApp process, so the heartbeat just stops sending.
    A refused token (401) stops it too; 503 and transport errors are retried as Flower retries them."""
    import httpx

    from secure_fed.engine.flower.clientapp_worker import task_heartbeat_fn

    sent = []

    def client_answering(answer):
        def send(_req):
            sent.append(answer)
            if isinstance(answer, int):
                raise httpx.HTTPStatusError("status", request=httpx.Request("POST", "http://x"),
                                            response=httpx.Response(answer))  # fmt: skip
            return SimpleNamespace(success=answer)

        return SimpleNamespace(SendTaskHeartbeat=send)

    fn = task_heartbeat_fn(client_answering(False))  # no SIGINT here: pytest would stop with KeyboardInterrupt
    assert fn() is True and fn() is True and sent == [False]  # the second call sends nothing
    sent.clear()
    fn = task_heartbeat_fn(client_answering(401))
    assert fn() is True and fn() is True and sent == [401]
    assert task_heartbeat_fn(client_answering(503))() is False
    assert task_heartbeat_fn(client_answering(True))() is True


def _runtime_refusing(status: int, calls: list):
    """A task's real Runtime API client (:func:`task_client`) whose SuperNode answers every call with ``status``."""
    import httpx

    from secure_fed.engine.flower.clientapp_worker import task_client

    client = task_client("127.0.0.1:1", "token")

    def answer(request):
        calls.append(request.url.path)
        return httpx.Response(status, json={})

    client._client = httpx.Client(transport=httpx.MockTransport(answer), base_url="http://127.0.0.1:1")
    return client


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_call_of_a_task_raises_its_error_and_signals_nothing(status):
    """Through the real Runtime API client and its retries: Flower's own retry invoker answers a 401 with SIGINT
    to its process (flwr-clientapp ends with its task), which ended three of the 16-node deployment's workers; the
    task's client gives up with the error instead, so the heartbeat stops quietly and a refused push reaches the
    worker's loop. Fails with ``make_simple_http_retry_invoker`` in :func:`task_client`."""
    import signal

    import httpx
    from flwr.proto.runtime_pb2 import SendTaskHeartbeatRequest

    from secure_fed.engine.flower.clientapp_worker import task_heartbeat_fn

    signals = []
    previous = signal.signal(signal.SIGINT, lambda *a: signals.append("SIGINT"))
    try:
        calls: list = []
        client = _runtime_refusing(status, calls)
        with pytest.raises(httpx.HTTPStatusError):
            client.SendTaskHeartbeat(SendTaskHeartbeatRequest())
        beat = task_heartbeat_fn(_runtime_refusing(status, calls))
        assert beat() is True and beat() is True  # the task is over: the heartbeat ends, nothing else
        assert len(calls) == 2  # one call each: a refusal is not retried
    finally:
        signal.signal(signal.SIGINT, previous)
    assert signals == []


def test_a_busy_supernode_is_retried():
    """503 is retried as Flower retries it: the call succeeds once the SuperNode answers."""
    import httpx
    from flwr.proto.runtime_pb2 import SendTaskHeartbeatResponse

    from secure_fed.engine.flower import clientapp_worker

    client = clientapp_worker.task_client("127.0.0.1:1", "token")
    answers = iter([503, 200])

    def answer(request):
        status = next(answers)
        if status != 200:
            return httpx.Response(status, json={})
        return httpx.Response(200, content=SendTaskHeartbeatResponse(success=True).SerializeToString(),
                              headers={"content-type": "application/protobuf"})  # fmt: skip

    client._client = httpx.Client(transport=httpx.MockTransport(answer), base_url="http://127.0.0.1:1")
    client._retry_invoker.wait_function = lambda _t: None
    from flwr.proto.runtime_pb2 import SendTaskHeartbeatRequest

    assert client.SendTaskHeartbeat(SendTaskHeartbeatRequest()).success is True


def test_a_refused_task_request_is_asked_again(monkeypatch):
    """The worker's own poll: a request the SuperNode refuses (e.g. 403 while a run stops) is asked again and the
    next task is taken; the worker does not end."""
    import httpx
    from flwr.supercore import runtime

    from secure_fed.engine.flower import clientapp_worker

    answers = iter([403, "t1", None])

    class FakeClient:
        def AcquireTask(self, _req):  # noqa: N802 - Flower's method name
            a = next(answers)
            if a is None:
                raise _Stop
            if isinstance(a, int):
                raise httpx.HTTPStatusError("refused", request=httpx.Request("POST", "http://x"), response=httpx.Response(a))
            return SimpleNamespace(HasField=lambda _f: True, token=a)

    monkeypatch.setattr(runtime.RuntimeHttpClient, "from_server_address", classmethod(lambda cls, **kw: FakeClient()))
    ran = []
    monkeypatch.setattr(clientapp_worker, "_run_task", lambda address, token, apps: ran.append(token))
    with pytest.raises(_Stop):
        clientapp_worker.serve("127.0.0.1:1", poll_s=0.0)
    assert ran == ["t1"]
