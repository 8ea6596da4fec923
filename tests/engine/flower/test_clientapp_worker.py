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
