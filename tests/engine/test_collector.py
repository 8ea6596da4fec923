"""A run's long-lived objects are left out of the cyclic collector's scans (``secure_fed/engine/collector.py``), and
given back at its end; what the run itself makes is still collected."""

from __future__ import annotations

import gc
import weakref

import pytest

from secure_fed.engine import Experiment
from secure_fed.engine.callbacks import Callback
from secure_fed.engine.collector import long_lived_frozen
from tests.conftest import small_config


class _Node:
    """A container that can sit in a reference cycle and be watched through a weak reference."""

    def __init__(self):
        self.other = None


def _cycle() -> weakref.ref:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_objects_alive_at_the_start_are_frozen_and_given_back_at_the_end():
    assert gc.get_freeze_count() == 0
    kept = _Node()
    with long_lived_frozen():
        assert gc.get_freeze_count() > 0
        # the frozen objects are not in any generation the collector scans
        assert not any(o is kept for g in range(3) for o in gc.get_objects(generation=g))
    assert gc.get_freeze_count() == 0
    assert any(o is kept for o in gc.get_objects())


def test_garbage_from_before_the_block_is_collected_not_frozen():
    gc.disable()  # the cycle stays garbage until someone collects it
    try:
        ref = _cycle()
        assert ref() is not None
        with long_lived_frozen():
            assert ref() is None
    finally:
        gc.enable()


def test_cycles_made_inside_the_block_are_still_collected():
    with long_lived_frozen():
        ref = _cycle()
        assert ref() is not None
        gc.collect()
        assert ref() is None


def test_nested_blocks_unfreeze_once_at_the_outermost_exit_also_on_an_error():
    with pytest.raises(RuntimeError, match="inner"):
        with long_lived_frozen():
            with long_lived_frozen():
                pass
            assert gc.get_freeze_count() > 0  # the inner exit left the outer block's objects frozen
            with long_lived_frozen():
                raise RuntimeError("inner")
    assert gc.get_freeze_count() == 0


class _FreezeProbe(Callback):
    name = "freeze_probe"

    def __init__(self):
        self.counts: list[int] = []

    def on_round_end(self, exp, rec, diag) -> None:
        self.counts.append(gc.get_freeze_count())


def test_a_run_trains_its_rounds_with_the_long_lived_objects_frozen(tmp_path):
    exp = Experiment(small_config("training.rounds=2"), run_dir=tmp_path / "run")
    probe = _FreezeProbe()
    exp.callbacks.append(probe)
    exp.run(progress=False)
    assert len(probe.counts) == 2 and min(probe.counts) > 0
    assert gc.get_freeze_count() == 0
