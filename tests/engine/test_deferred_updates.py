"""Deferred updates in the engine (``training.deferred_updates``, ``secure_fed/models/group_updates.py``): on where
every layer passes plaintext updates to the sum untouched, refused where asked for and impossible; a round's sums
equal the dense path's, also when some of a group's updates arrive dense; a group's history freed once its last
update is summed; the guard and the digest treat a deferred update as the dense one it stands for."""

from __future__ import annotations

import gc
import pickle
import weakref

import pytest

from secure_fed.algorithms.batched_sgd import relative_error
from secure_fed.engine import Experiment
from secure_fed.engine.aggregation import RoundSession
from secure_fed.engine.callbacks import Callback
from secure_fed.engine.message_digest import payload_digest
from secure_fed.errors import ConfigError
from secure_fed.models.group_updates import DeferredDelta
from secure_fed.models.sparse_rows import dense_delta
from tests.conftest import small_plan
from tests.engine.test_vectorized import PLAIN, _theta_and_W

VEC = [*PLAIN, "training.executor=vectorized"]


class _Wires(Callback):
    """Counts the deferred updates on the wire and keeps weak references to their groups, in arrival order."""

    name = "wires"

    def __init__(self):
        self.deferred = 0
        self.dense = 0
        self.dense_names: set[str] = set()
        self.groups: list[weakref.ref] = []
        self.alive_at_new_group: list[int] = []

    def on_uplink(self, round_idx, cid, wire):
        for n, t in wire["theta_delta"].items():
            if isinstance(t, DeferredDelta):
                self.deferred += 1
                if not any(r() is t.group for r in self.groups):
                    gc.collect()
                    # groups before this one still alive (each should be freed once its last update was summed)
                    self.alive_at_new_group.append(sum(r() is not None for r in self.groups))
                    self.groups.append(weakref.ref(t.group))
            else:
                self.dense += 1
                self.dense_names.add(n)


class _DensifyEveryOther(Callback):
    """A client mod that replaces every other client's θ update by its dense tensor (as a canary callback does)."""

    name = "densify"

    def client_mod(self, fn):
        def train(payload, data):
            reply = fn(payload, data)
            if data.client_id % 2:
                reply = {**reply, "theta_delta": {n: dense_delta(t).clone() for n, t in reply["theta_delta"].items()}}
            return reply

        return train


class _Keep(Callback):
    """Keeps every wire message of the run."""

    name = "keep"

    def __init__(self):
        self.wires: list[dict] = []

    def on_uplink(self, round_idx, cid, wire):
        self.wires.append(wire)


def _run(tmp_path, name, *overrides, callbacks=(), rounds=2):
    exp = Experiment(small_plan(*VEC, *overrides), run_dir=tmp_path / name)
    exp.callbacks[-1:-1] = list(callbacks)
    exp.setup()
    for _ in range(rounds):
        exp.train_round()
    return exp


@pytest.mark.parametrize(
    ("overrides", "on"),
    [
        ([], True),
        (['protocols=["keyed_hashing"]'], True),
        (['protocols=["dp"]', "privacy.instance={noise_multiplier: 1.0}", "algorithm.normalize_gamma=false"], True),
        (["training.deferred_updates=false"], False),
        (["training.executor=sequential"], False),
        (['protocols=["secure_aggregation"]'], False),
        (['protocols=["dp"]', "privacy.client={noise_multiplier: 1.0, clip_norm: 0.1}"], False),
        (["output.log_messages=true"], False),  # the log keeps the messages
        (["attacks.run=[update_inversion]"], False),  # a registered callback (the attack taps) sees them
    ],
)
def test_deferred_updates_are_on_where_every_layer_passes_plaintext_updates_untouched(tmp_path, overrides, on):
    exp = Experiment(small_plan(*VEC, *overrides), run_dir=tmp_path / "run")
    assert exp.trainer.deferred_updates is on
    assert exp.guard.up_rules["theta_delta"].deferred is on


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["training.executor=sequential"], r"training.deferred_updates=true: only the vectorized executor"),
        (['protocols=["secure_aggregation"]'], r"training.deferred_updates=true: protocols \['secure_aggregation'\]"),
        (["output.log_messages=true"], r"training.deferred_updates=true: output.log_messages keeps"),
        (["attacks.run=[update_inversion]"], r"training.deferred_updates=true: callbacks \['AttackTaps'\] see"),
    ],
)
def test_deferred_updates_true_where_they_cannot_run_is_refused(tmp_path, overrides, match):
    with pytest.raises(ConfigError, match=match):
        Experiment(small_plan(*VEC, "training.deferred_updates=true", *overrides), run_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("algorithm", ["fedalc", "fedavg"])
def test_rounds_with_deferred_updates_equal_rounds_with_dense_updates(tmp_path, algorithm):
    """fp32: the pooled sums equal the dense path's up to reassociation (θ and W after two rounds), with
    example-count weights; the deferred run really sent deferred updates, and no dense weight update."""
    extra = [f"algorithm.name={algorithm}", "training.aggregation=num_examples", "training.chunk_clients=3"]
    wires = _Wires()
    a = _run(tmp_path, "deferred", *extra, callbacks=[wires])
    b = _run(tmp_path, "dense", *extra, "training.deferred_updates=false")
    assert wires.deferred > 0 and wires.dense_names == {n for n in a.theta if not n.endswith("weight")}
    start = _theta_and_W(Experiment(b.plan, run_dir=tmp_path / "start"))
    ta, tb = _theta_and_W(a), _theta_and_W(b)
    assert relative_error({k: ta[k] - v for k, v in start.items()}, {k: tb[k] - v for k, v in start.items()}) < 1e-5


def test_a_group_whose_updates_partly_arrive_dense_is_summed_when_the_round_ends(tmp_path):
    """Every other client's update is made dense by a client mod: the group never sees all its deferred updates,
    so the round's end sums the ones that came; the result equals the all-dense run's."""
    wires = _Wires()
    a = _run(tmp_path, "mixed", "training.chunk_clients=4", callbacks=[_DensifyEveryOther(), wires])
    b = _run(tmp_path, "dense", "training.chunk_clients=4", "training.deferred_updates=false")
    densified = {n for n in a.theta if n.endswith("weight")}
    assert wires.deferred > 0 and densified <= wires.dense_names  # weight updates arrived both ways
    assert relative_error(_theta_and_W(a), _theta_and_W(b)) < 1e-5


def test_a_groups_history_is_freed_once_its_last_update_is_summed(tmp_path):
    """With chunks of 2 clients, each chunk trains after the previous chunk's updates were summed: by then no
    earlier group (holding its clients' training histories) is alive, and none is after the round."""
    wires = _Wires()
    _run(tmp_path, "run", "training.chunk_clients=2", callbacks=[wires], rounds=1)
    assert len(wires.groups) >= 3
    assert wires.alive_at_new_group == [0] * len(wires.groups)
    gc.collect()
    assert all(r() is None for r in wires.groups)


def test_the_guard_and_the_digest_take_a_deferred_update_as_the_dense_one_it_stands_for(tmp_path):
    keep = _Keep()
    wires = keep.wires
    exp = _run(tmp_path, "run", callbacks=[keep], rounds=1)
    wire = wires[0]
    name = next(n for n, t in wire["theta_delta"].items() if isinstance(t, DeferredDelta))
    d = wire["theta_delta"][name]
    dense = {**wire, "theta_delta": {n: dense_delta(t) for n, t in wire["theta_delta"].items()}}
    assert payload_digest(wire) == payload_digest(dense)
    assert payload_digest(wire) != payload_digest({**dense, "loss": dense["loss"] + 1.0})
    exp.guard.check_up(0, wire, record=False)  # allowed as declared
    other = next(n for n in exp.theta if n.endswith("weight") and exp.theta[n].shape != exp.theta[name].shape)
    wrong = {**wire, "theta_delta": {**wire["theta_delta"], other: d}}  # another parameter's update in its place
    with pytest.raises(Exception, match=f"'theta_delta' entry '{other}' is a deferred update of another parameter"):
        exp.guard.check_up(0, wrong, record=False)
    dense_only = Experiment(small_plan(*VEC, "training.deferred_updates=false"), run_dir=tmp_path / "dense")
    with pytest.raises(Exception, match=f"'theta_delta' entry '{name}' has the wrong shape"):
        dense_only.guard.check_up(0, wire, record=False)
    with pytest.raises(TypeError, match="a deferred update is not serialised"):
        pickle.dumps(wire)
    pickle.dumps(dense)


def test_a_deferred_update_sent_twice_or_under_another_name_is_refused_by_the_sum(tmp_path):
    keep = _Keep()
    wires = keep.wires
    exp = _run(tmp_path, "run", "training.chunk_clients=4", callbacks=[keep], rounds=1)
    session = RoundSession(cohort=[0, 1], theta=exp.theta, W=exp.W, weighting="uniform")
    session.submit(0, wires[0])
    with pytest.raises(ValueError, match="sent its update of .* twice"):
        session.submit(0, wires[0])
    name, d = next((n, t) for n, t in wires[1]["theta_delta"].items() if isinstance(t, DeferredDelta))
    other = next(n for n in exp.theta if n.endswith("bias"))
    renamed = {**wires[1], "theta_delta": {**wires[1]["theta_delta"], other: d}}
    with pytest.raises(ValueError, match=f"a deferred update of '{name}' .* sent as '{other}'"):
        RoundSession(cohort=[1], theta=exp.theta, W=exp.W, weighting="uniform").submit(1, renamed)
