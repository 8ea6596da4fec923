"""A checkpoint's files become current together: a crash while they are written leaves the previous checkpoint,
one while they are moved in place is completed on resume; either way the resumed DP run ends exactly where an
uninterrupted one ends (the kill -9 test hits these windows only by chance; this one hits each on purpose)."""

from __future__ import annotations

import json

import pytest
import torch

from secure_fed.engine import Experiment, checkpoint_commit
from secure_fed.errors import SecureFedError
from secure_fed.run_files import holds_checkpoint
from tests.conftest import small_plan

DP = [
    "training.rounds=4", "output.checkpoint_every=1", 'protocols=["dp"]', "algorithm.name=fedaws",
    'privacy.client={"clip_norm": 1.0, "noise_multiplier": 1.0}', "privacy.noise_seed=7",
]  # fmt: skip


class Crash(BaseException):
    """Stands for a kill: nothing after it runs (not an Exception, so no handler in the run catches it)."""


def _lines(run):
    return [{k: v for k, v in json.loads(x).items() if k != "wall_seconds"}
            for x in (run / "metrics.jsonl").read_text().splitlines()]  # fmt: skip


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    run = tmp_path_factory.mktemp("full") / "run"
    exp = Experiment(small_plan(*DP), run_dir=run)
    exp.run(progress=False)
    return run, exp


@pytest.mark.parametrize("where", ["writing", "moving"])
@pytest.mark.parametrize("at_round", [1, 3])
def test_a_crash_in_a_checkpoints_writes_resumes_exactly(uninterrupted, tmp_path, monkeypatch, where, at_round):
    full, ref = uninterrupted
    run = tmp_path / "run"
    exp = Experiment(small_plan(*DP), run_dir=run)
    real_save, real_move = torch.save, checkpoint_commit._move
    moved = []

    def save(obj, f, *a, **kw):  # crash after the first file of round at_round's checkpoint is written
        real_save(obj, f, *a, **kw)
        if where == "writing" and exp.round == at_round:
            raise Crash

    def move(src, dst):  # crash after the first file of round at_round's checkpoint is moved in place
        real_move(src, dst)
        moved.append(dst.name)
        if where == "moving" and exp.round == at_round:
            raise Crash

    monkeypatch.setattr(checkpoint_commit.torch, "save", save)
    monkeypatch.setattr(checkpoint_commit, "_move", move)
    with pytest.raises(Crash):
        exp.run(progress=False)
    monkeypatch.undo()
    ckpt = run / "private" / "checkpoints"
    if where == "moving":  # the committed checkpoint is half in place: its first file new, last.pt not yet
        assert (ckpt / "commit.json").is_file() and moved[-1] == "clients.pt"
        assert torch.load(ckpt / "clients.pt", weights_only=False)["round"] == at_round
        assert not (ckpt / "last.pt").is_file() or torch.load(ckpt / "last.pt", weights_only=False)["round"] < at_round
    assert holds_checkpoint(run) == (where == "moving" or at_round > 1)

    resumed = Experiment(small_plan(*DP), run_dir=run)
    if not holds_checkpoint(run):  # round 1 was released before its checkpoint, which the crash lost
        with pytest.raises(SecureFedError, match="spend its privacy budget twice"):
            resumed.resume()
        return
    assert resumed.resume()
    assert resumed.round == (at_round if where == "moving" else at_round - 1)
    assert not (ckpt / "commit.json").exists()
    resumed.run(progress=False)
    assert torch.equal(ref.W, resumed.W) and all(torch.equal(ref.theta[k], resumed.theta[k]) for k in ref.theta)
    assert _lines(full) == _lines(run)
    assert json.loads((full / "summary.json").read_text())["privacy"] == json.loads((run / "summary.json").read_text())["privacy"]
