"""The round progress bar: drawn at most about once a ``mininterval``, not once per round (a log file gets a line
per draw)."""

from __future__ import annotations

from types import SimpleNamespace

from secure_fed.engine.callbacks import ProgressBar


def test_progress_bar_draws_at_most_once_a_second_not_every_round(capsys):
    exp = SimpleNamespace(cfg=SimpleNamespace(training=SimpleNamespace(rounds=200), algorithm=SimpleNamespace(name="x")),
                          round=0)  # fmt: skip
    bar = ProgressBar()
    bar.on_run_start(exp)
    for r in range(200):  # 200 rounds in well under a second
        record = {"round": r, "P@1": 50.0, "mAP": 40.0} if r % 10 == 9 else {"round": r}
        bar.on_round_end(exp, record, {"train_loss": 0.5})
    bar.on_run_end(exp, "completed")
    draws = capsys.readouterr().err.count("\r")
    assert 2 <= draws <= 10, draws  # the first draw, maybe one more, and the final one on close
