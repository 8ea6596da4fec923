"""The round progress bar: drawn at most about once a ``mininterval``, not once per round (a log file gets a line
per draw)."""

from __future__ import annotations

from types import SimpleNamespace

from secure_fed.engine.callbacks import ProgressBar


def test_progress_bar_draws_at_most_once_a_second_not_every_round(capsys):
    exp = SimpleNamespace(plan=SimpleNamespace(training=SimpleNamespace(rounds=200), algorithm=SimpleNamespace(name="x")),
                          round=0)  # fmt: skip
    bar = ProgressBar()
    bar.on_run_start(exp)
    for r in range(200):  # 200 rounds in well under a second
        record = {"round": r, "P@1": 50.0, "mAP": 40.0} if r % 10 == 9 else {"round": r}
        bar.on_round_end(exp, record, {"train_loss": 0.5})
    bar.on_run_end(exp, "completed")
    draws = capsys.readouterr().err.count("\r")
    assert 2 <= draws <= 10, draws  # the first draw, maybe one more, and the final one on close


def _bar_text(capsys, record, diagnostics):
    exp = SimpleNamespace(plan=SimpleNamespace(training=SimpleNamespace(rounds=2), algorithm=SimpleNamespace(name="x")), round=0)
    bar = ProgressBar()
    bar.on_run_start(exp)
    bar.on_round_end(exp, record, diagnostics)
    bar.on_run_end(exp, "completed")
    return capsys.readouterr().err


def test_the_bar_shows_epsilon_spent_and_no_private_statistic(capsys):
    priv = {"epsilon": 3.98765, "delta": 1e-5, "unit": "client", "client": {"epsilon": 3.98765, "delta": 1e-5, "steps": 4}}
    text = _bar_text(capsys, {"round": 1, "P@1": 50.0, "mAP": 40.0, "privacy": priv}, {"train_loss": 0.123456})
    assert "ε model=3.988" in text and "client unit=3.988" in text and "P@1=50.00" in text
    assert "loss" not in text and "0.123" not in text  # the training loss is a private diagnostic
    # no DP: ε = ∞; a unit that does not bound the released model: ∞ for the model beside the unit's own ε
    assert "ε model=∞" in _bar_text(capsys, {"round": 1, "privacy": {"epsilon": "inf", "delta": None}}, {})
    text = _bar_text(capsys, {"round": 1, "privacy": {**priv, "epsilon": "inf", "why": "W un-noised"}}, {})
    assert "ε model=∞" in text and "client unit=3.988" in text
