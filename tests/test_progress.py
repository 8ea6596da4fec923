"""The phase progress helper's timing, on a fake clock (no sleeps): quiet for a short phase, a line at most every
``min_interval`` seconds as work advances, a heartbeat line at least every ``max_interval`` seconds, the ETA."""

from __future__ import annotations

import io
import threading

import pytest

from secure_fed import progress
from secure_fed.config import build_plan
from secure_fed.progress import Phase, duration, track


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _phase(clock, total=16, **kw):
    out = io.StringIO()
    return Phase("shadow models", total, stream=out, clock=clock, heartbeat=False, silent=False, **kw), out


def test_a_phase_that_ends_within_five_seconds_prints_nothing():
    clock = Clock()
    p, out = _phase(clock)
    for _ in range(16):
        clock.t += 0.3  # 16 steps in 4.8 s
        p.advance()
        p.tick()
    p.close()
    assert out.getvalue() == ""


def test_lines_at_most_every_min_interval_as_work_advances():
    clock = Clock()
    p, out = _phase(clock, total=100)
    for _ in range(100):
        clock.t += 0.5  # a step every half second: 50 s in all
        p.advance()
    p.close()
    lines = out.getvalue().splitlines()
    # the first line at 5 s, then one every 5 s up to 50 s: 10 progress lines and the done line
    assert len(lines) == 11, lines
    assert lines[0] == "shadow models: 10/100 (10%), 5s elapsed, ETA 45s"
    assert lines[-1] == "shadow models: 100/100 (100%) done in 50s"


def test_the_heartbeat_prints_at_least_every_ten_seconds_while_a_step_runs():
    clock = Clock()
    p, out = _phase(clock)
    p.advance()  # the first shadow, at once
    times = []
    for _ in range(60):  # the second shadow takes 60 s: the heartbeat thread ticks every second
        clock.t += 1.0
        n = len(out.getvalue().splitlines())
        p.tick()
        if len(out.getvalue().splitlines()) > n:
            times.append(clock.t - 100.0)
    assert times == [5.0, 15.0, 25.0, 35.0, 45.0, 55.0]
    assert out.getvalue().splitlines()[1] == "shadow models: 1/16 (6%), 15s elapsed, ETA 3m45s"


def test_no_total_no_eta_and_silent_prints_nothing():
    clock = Clock()
    p, out = _phase(clock, total=None)
    clock.t += 6
    p.advance(3)
    assert out.getvalue() == "shadow models: 3 done, 6s elapsed\n"
    quiet = Phase("x", 2, stream=(s := io.StringIO()), clock=clock, heartbeat=False, silent=True)
    clock.t += 60
    quiet.advance()
    quiet.tick()
    quiet.close()
    assert s.getvalue() == ""


def test_the_environment_flag_silences_phases(monkeypatch):
    monkeypatch.setenv("SECURE_FED_PROGRESS", "0")
    assert not progress.enabled() and Phase("x", heartbeat=False).silent
    monkeypatch.setenv("SECURE_FED_PROGRESS", "1")
    assert progress.enabled() and not Phase("x", heartbeat=False).silent


def test_the_heartbeat_thread_ticks_and_stops_on_close():
    clock = Clock()
    out = io.StringIO()
    seen = threading.Event()

    class Seen(io.StringIO):
        def write(self, s):
            out.write(s)
            seen.set()
            return len(s)

    p = Phase("cells", 4, stream=Seen(), clock=clock, silent=False, max_interval=0.04)
    clock.t += 30  # the phase is past quiet_for: the thread's next tick prints, no advance needed
    assert seen.wait(10), "the heartbeat thread printed nothing"
    p.close()
    assert not p._thread.is_alive()
    assert out.getvalue().startswith("cells: 0/4 (0%), 30s elapsed")


def test_track_advances_once_per_item(monkeypatch):
    seen = []
    real = Phase.advance
    monkeypatch.setattr(Phase, "advance", lambda self, n=1: (seen.append(self.total), real(self, n)))
    assert list(track([1, 2, 3], "items", heartbeat=False)) == [1, 2, 3]
    assert seen == [3, 3, 3]


@pytest.mark.parametrize("s, text", [(0.4, "0s"), (42, "42s"), (307, "5m07s"), (7380, "2h03m")])
def test_duration(s, text):
    assert duration(s) == text


@pytest.fixture
def advances(monkeypatch) -> list[tuple[str, int | None, int]]:
    """Every phase advance, as (phase name, total, done after it)."""
    seen: list[tuple[str, int | None, int]] = []
    real = Phase.advance

    def spy(self, n=1):
        real(self, n)
        seen.append((self.name, self.total, self.done))

    monkeypatch.setattr(Phase, "advance", spy)
    return seen


def test_the_membership_inference_shadow_loop_reports_each_shadow(tmp_path, monkeypatch, advances):
    """LiRA's shadow runs (minutes each on real data) advance a phase once per shadow, so a 16-shadow audit prints
    a line at least every 10 s (the heartbeat) and its ETA; a cached shadow advances it too."""
    from secure_fed.engine import Experiment
    from tests.conftest import small_config
    from threat_models.attacks.membership_inference import MembershipInference
    from threat_models.context import AuditContext

    mi = "attacks.membership_inference"
    cfg = small_config("attacks.run=[membership_inference]", "algorithm.name=oracle", "training.rounds=2",
                       f"{mi}.shadows=3", f"{mi}.bootstrap=10", f"{mi}.shadow_dir={tmp_path / 'shadows'}",
                       f"{mi}.shadow_cohort=1")  # fmt: skip
    e = Experiment(build_plan(cfg), run_dir=tmp_path / "run")
    e.run(progress=False)
    attack = MembershipInference(cfg.attacks.membership_inference)
    aux, _ = attack.prepare(AuditContext(e))
    trained = []
    real_train = type(aux["shadow"])._train
    monkeypatch.setattr(
        type(aux["shadow"]), "_train", lambda self, k, inside: (trained.append(len(advances)), real_train(self, k, inside))[1]
    )
    aux["shadow"].run(aux["encoder"], aux["x"], aux["Y"])
    shadows = [a for a in advances if a[0] == "membership inference: shadow models"]
    assert shadows == [("membership inference: shadow models", 3, k) for k in (1, 2, 3)]
    assert trained == [0, 1, 2]  # one advance after each shadow's training


def test_the_shadow_cohort_reports_each_shadow_round(tmp_path, monkeypatch, advances):
    """Shadows trained as one cohort advance a phase per shadow round (K × rounds in all), as the rounds finish."""
    from secure_fed.engine import Experiment
    from tests.conftest import small_config
    from threat_models.attacks.membership_inference import MembershipInference
    from threat_models.context import AuditContext

    mi = "attacks.membership_inference"
    cfg = small_config("attacks.run=[membership_inference]", "training.rounds=3", f"{mi}.shadows=2",
                       f"{mi}.shadow_dir={tmp_path / 'shadows'}")  # fmt: skip
    e = Experiment(build_plan(cfg), run_dir=tmp_path / "run")
    e.run(progress=False)
    aux, _ = MembershipInference(cfg.attacks.membership_inference).prepare(AuditContext(e))
    aux["shadow"].run(aux["encoder"], aux["x"], aux["Y"])
    name = "membership inference: shadow rounds (cohort)"
    rounds = [a for a in advances if a[0] == name]
    assert {a[1] for a in rounds} == {6} and [a[2] for a in rounds] == sorted({a[2] for a in rounds})
    assert rounds[-1][2] == 6 and len(rounds) >= 3  # advanced as the rounds went, not once at the end
