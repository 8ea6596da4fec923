"""Client code depends only on message content: it runs unchanged when every
message crosses a byte-level transport, as it would under Flower."""

import io

import torch

from secure_fed.engine import Experiment
from secure_fed.engine.client_link import ClientLink
from tests.conftest import small_plan


def _through_bytes(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def test_round_trip_serialised_messages_give_identical_training(tmp_path, monkeypatch):
    ref = Experiment(small_plan("algorithm.name=fedalc"), run_dir=tmp_path / "a")
    ref.run(progress=False)

    exp = Experiment(small_plan("algorithm.name=fedalc"), run_dir=tmp_path / "b")
    original = ClientLink.exchange

    def wire(self, cid, payload, client_fn):
        def remote(p, d):  # the client only ever sees a deserialised copy; the server a deserialised reply
            return _through_bytes(client_fn(_through_bytes(p), d))

        return original(self, cid, payload, remote)

    monkeypatch.setattr(ClientLink, "exchange", wire)
    exp.run(progress=False)
    assert torch.equal(ref.W, exp.W)
    assert all(torch.equal(ref.theta[k], exp.theta[k]) for k in ref.theta)
