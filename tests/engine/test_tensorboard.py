"""``output.tensorboard``: the released metrics and ε of each round as TensorBoard scalars, read back with
TensorBoard's own event reader and compared with metrics.jsonl; nothing private is logged."""

from __future__ import annotations

import json

import pytest

from secure_fed.config import build_plan, load_config, load_plan
from secure_fed.engine import Experiment
from tests.conftest import SMALL


def test_scalars_equal_metrics_jsonl_and_hold_nothing_private(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = load_config(overrides=[*SMALL, "algorithm.name=fedaws", "output.tensorboard=true", "protocols=[dp]",
                                 'privacy.local={"target_epsilon": 4, "batch_sample_rate": 0.5, '
                                 '"max_labels_per_instance": 8}'])  # fmt: skip
    Experiment(build_plan(cfg), run_dir=tmp_path / "run").run(progress=False)
    acc = EventAccumulator(str(tmp_path / "run" / "private" / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    eps = [(line["round"], line["privacy"]["instance"]["epsilon"]) for line in lines]
    got = [(e.step, e.value) for e in acc.Scalars("privacy/epsilon_instance")]
    assert [s for s, _ in got] == [r for r, _ in eps]
    assert [v for _, v in got] == pytest.approx([v for _, v in eps], rel=1e-6)
    evaluated = [line for line in lines if "P@1" in line]
    p1 = [(e.step, e.value) for e in acc.Scalars("test/P@1")]
    assert p1 == [(line["round"], pytest.approx(line["P@1"], rel=1e-6)) for line in evaluated]
    released = {f"test/{k}" for line in lines for k, v in line.items() if k != "round" and isinstance(v, (int, float))}
    assert tags <= released | {"privacy/epsilon_instance", "privacy/epsilon_client"}  # nothing from private/


def test_tensorboard_off_writes_nothing(tmp_path):
    Experiment(load_plan(overrides=[*SMALL, "training.rounds=1"]), run_dir=tmp_path / "run").run(progress=False)
    assert not (tmp_path / "run" / "private" / "tensorboard").exists()
