"""A run some of whose rounds a protocol aborted says so: status ``completed_with_aborts`` (a finished run
everywhere a status is checked), and the console's last line counts the aborted rounds and the ledger's charge."""

from __future__ import annotations

import json

import pytest
from opacus.accountants import RDPAccountant

from tests.config.test_bad_input import cli
from tests.conftest import SMALL

CLIENT_NOISE = 'privacy.client={"noise_multiplier": 2.0, "clip_norm": 0.5, "noise": "clients"}'


def test_some_rounds_aborted_by_secure_aggregation(tmp_path):
    # dropout 0.05 a stage: with this seed, 2 of the 6 rounds lose too many clients for the secure sum and its
    # consistency check's quorum (0.1: all 6)
    ov = [*SMALL, "algorithm.name=fedavg", 'protocols=["dp", "secure_aggregation"]', CLIENT_NOISE,
          "secure_aggregation.dropout=0.05", "training.rounds=6"]  # fmt: skip
    code, out, err = cli("run", "--out", str(tmp_path / "run"), *[x for o in ov for x in ("--set", o)])
    assert code == 0, err  # a finished run
    run = tmp_path / "run"
    summary = json.loads((run / "summary.json").read_text())
    diag = [json.loads(x) for x in (run / "private" / "diagnostics.jsonl").read_text().splitlines()]
    aborted = sum("aborted" in d for d in diag)
    assert 0 < aborted < 6, "the config no longer aborts some but not all rounds: retune the dropout"
    assert summary["status"] == "completed_with_aborts" and summary["rounds_aborted"] == aborted
    assert (run / "private" / "checkpoints" / "final.pt").is_file()  # finished: its model is written like a completed run's
    # every round is charged, aborted or not: one step of the client unit at q = 1 (noise shares, fixed cohort)
    ref = RDPAccountant()
    for _ in range(6):
        ref.step(noise_multiplier=2.0, sample_rate=1.0)
    assert summary["privacy"]["epsilon"] == pytest.approx(ref.get_epsilon(1e-5), rel=1e-9)
    assert summary["aborted_charge"] == {"client": {"steps": aborted, "of": 6}}
    last = out.strip().splitlines()[-1]
    assert "[completed_with_aborts]" in out
    assert last.startswith(f"  {aborted} of 6 rounds aborted") and f"client unit {aborted} of its 6 steps" in last
    assert f"ε = {summary['privacy']['epsilon']:.4g} includes them" in last
