"""A run's long-lived objects are left out of the cyclic collector's scans (``secure_fed/engine/collector.py``), and
given back at its end; what the run itself makes is still collected."""

from __future__ import annotations

import gc
import json
import weakref

import pytest

from secure_fed.engine import Experiment, collector
from secure_fed.engine.callbacks import Callback
from secure_fed.engine.collector import long_lived_frozen
from tests.conftest import small_plan


@pytest.fixture(autouse=True)
def _no_block_open():
    """Each test starts and ends outside any block, with nothing frozen."""
    assert collector._depth == 0 and gc.get_freeze_count() == 0
    yield
    assert collector._depth == 0 and gc.get_freeze_count() == 0


class _Node:
    """A container that can sit in a reference cycle and be watched through a weak reference."""

    def __init__(self):
        self.other = None


def _cycle() -> weakref.ref:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def _tracked(obj) -> bool:
    """Whether ``obj`` is in a generation the collector scans (frozen objects are in none)."""
    return any(o is obj for g in range(3) for o in gc.get_objects(generation=g))


def test_objects_alive_at_the_start_are_frozen_and_given_back_at_the_end():
    kept = _Node()
    with long_lived_frozen():
        assert gc.get_freeze_count() > 0
        assert not _tracked(kept)
    assert _tracked(kept)


def test_garbage_from_before_the_block_is_collected_not_frozen():
    was_enabled = gc.isenabled()
    gc.disable()  # the cycle stays garbage until someone collects it
    try:
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        ref = weakref.ref(a)
        gc.collect()  # alive: the pair moves to the oldest generation, which only a full collection visits
        del a, b
        assert ref() is not None
        with long_lived_frozen():
            assert ref() is None
    finally:
        if was_enabled:
            gc.enable()


def test_cycles_made_inside_the_block_are_collected_by_the_collector_on_its_own():
    with long_lived_frozen():
        assert gc.isenabled()
        ref = _cycle()
        assert ref() is not None
        junk = [[] for _ in range(20_000)]  # far past the youngest generation's threshold: it runs by itself
        del junk
        assert ref() is None


def test_nested_blocks_unfreeze_once_at_the_outermost_exit_also_on_an_error_or_an_interrupt():
    with pytest.raises(RuntimeError, match="inner"):
        with long_lived_frozen():
            with long_lived_frozen():
                pass
            assert gc.get_freeze_count() > 0  # the inner exit left the outer block's objects frozen
            with long_lived_frozen():
                raise RuntimeError("inner")
    assert gc.get_freeze_count() == 0
    with pytest.raises(KeyboardInterrupt):
        with long_lived_frozen():
            raise KeyboardInterrupt
    assert gc.get_freeze_count() == 0 and collector._depth == 0
    with long_lived_frozen():  # and the next block freezes again
        assert gc.get_freeze_count() > 0


def test_a_freeze_made_by_someone_else_is_left_to_them():
    theirs = _Node()
    gc.freeze()
    try:
        kept = _Node()
        with long_lived_frozen():
            assert _tracked(kept)  # not frozen by the block either
        # Still frozen: the block did not unfreeze it. (The freeze count is no measure here: it falls whenever a
        # frozen object elsewhere in the process is freed.)
        assert not _tracked(theirs)
        assert _tracked(kept)
    finally:
        gc.unfreeze()


class _Probe(Callback):
    name = "freeze_probe"

    def __init__(self, interrupt_at: int | None = None):
        self.counts: list[int] = []
        self.marker_frozen: list[bool] = []
        self.interrupt_at = interrupt_at
        self.marker: _Node | None = None

    def on_run_start(self, exp) -> None:
        self.marker = _Node()  # made after setup(), before the rounds: a long-lived object of the run

    def on_round_end(self, exp, rec, diag) -> None:
        self.counts.append(gc.get_freeze_count())
        self.marker_frozen.append(not _tracked(self.marker))
        if self.interrupt_at is not None and len(self.counts) == self.interrupt_at:
            raise KeyboardInterrupt


def test_a_run_trains_its_rounds_with_what_existed_before_them_frozen(tmp_path):
    exp = Experiment(small_plan("training.rounds=2"), run_dir=tmp_path / "run")
    probe = _Probe()
    exp.callbacks.append(probe)
    exp.run(progress=False)
    assert len(probe.counts) == 2 and min(probe.counts) > 0
    assert probe.marker_frozen == [True, True]


def test_an_interrupted_run_gives_its_objects_back_and_ends_as_interrupted(tmp_path):
    exp = Experiment(small_plan("training.rounds=3"), run_dir=tmp_path / "run")
    exp.callbacks.append(_Probe(interrupt_at=1))
    exp.run(progress=False)
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "interrupted"
