"""Membership inference's shadow runs trained as one vectorised cohort: the same shadows as one after another
(with the vectorised executor: equal up to the reassociation of a batched product), their clients batched across
the shadows, DP included, and the shadow cache written as each slice of the cohort finishes (a killed audit resumes)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from secure_fed.config import load_plan
from secure_fed.plugin_api.attacks import build_experiment
from tests.conftest import SMALL
from threat_models import shadow_cohort
from threat_models.attacks.membership_inference import MembershipInference
from threat_models.attacks_section import attacks_of
from threat_models.context import AuditContext


def small_plan(*overrides: str):
    """The small test run's plan (``tests.conftest.SMALL``) with ``overrides``."""
    return load_plan(overrides=[*SMALL, *overrides])


MI = "attacks.membership_inference"
#: |Δφ| between a cohort's shadow and the same shadow trained alone on the vectorised executor: the batched products
#: over K shadows' θ reassociate float32 sums (measured ≤ 5e-5 on φ of magnitude ~1–10)
ATOL, RTOL = 1e-3, 1e-4


def _target(tmp_path, *extra):
    plan = small_plan("attacks.run=[membership_inference]", "training.executor=vectorized", f"{MI}.shadows=3", *extra)
    e = build_experiment(plan, run_dir=tmp_path / "run")
    e.run(progress=False)
    return plan, e


def _shadows(plan, e, shadow_dir, **options):
    attack = MembershipInference(
        attacks_of(plan).membership_inference.model_copy(update={"shadow_dir": str(shadow_dir), **options})
    )
    aux, _ = attack.prepare(AuditContext(e))
    return aux["shadow"].run(aux["encoder"], aux["x"], aux["Y"])


@pytest.mark.parametrize(
    "recipe",
    [
        ["algorithm.name=fedalc"],
        # client-level DP: its noise from privacy.noise_seed (without it every run, one after another too, draws fresh
        # noise from os.urandom, and no two runs of a shadow agree)
        [
            "algorithm.name=fedavg",
            "protocols=[dp]",
            "privacy.client={clip_norm: 0.5, noise_multiplier: 0.05}",
            "privacy.noise_seed=7",
        ],  # fmt: skip
    ],
    ids=["fedalc", "fedavg-client-dp"],
)
def test_cohort_trains_the_shadows_that_one_after_another_trains(tmp_path, monkeypatch, recipe):
    plan, e = _target(tmp_path, *recipe)
    seq_scores, seq_trained = _shadows(plan, e, tmp_path / "seq", shadow_cohort=1)
    cohorts = []
    real = shadow_cohort.train_shadows_together
    monkeypatch.setattr(shadow_cohort, "train_shadows_together", lambda *a, **kw: cohorts.append(real(*a, **kw)) or cohorts[-1])
    scores, trained = _shadows(plan, e, tmp_path / "cohort", shadow_cohort=3)
    assert len(cohorts) == 1
    (c,) = cohorts
    # the shadows' clients trained together: a group larger than one shadow's round (all its clients) was formed
    clients = len(e.fed.clients)
    assert c.batched > 0 and not c.unbatched and c.largest_group > clients
    np.testing.assert_array_equal(trained, seq_trained)
    assert np.ptp(seq_scores) > 1.0  # the shadows learned something to compare (not every φ at the clamp)
    np.testing.assert_allclose(scores, seq_scores, rtol=RTOL, atol=ATOL)
    # the shadows differ from one another (each its own seed and half): equal scores are not a shared run
    assert np.abs(scores[0] - scores[1]).max() > 100 * ATOL


def test_cache_is_written_per_cohort_slice_and_a_killed_audit_resumes(tmp_path, monkeypatch):
    plan, e = _target(tmp_path, "algorithm.name=fedalc")
    shadow_dir = tmp_path / "shadows"
    real = shadow_cohort.train_shadows_together
    calls = []

    def killed_in_second_slice(runs, **kw):
        calls.append(sorted(runs))
        if len(calls) == 2:
            raise KeyboardInterrupt  # the audit killed while the second slice trains
        return real(runs, **kw)

    monkeypatch.setattr(shadow_cohort, "train_shadows_together", killed_in_second_slice)
    with pytest.raises(KeyboardInterrupt):
        _shadows(plan, e, shadow_dir, shadow_cohort=2)
    assert calls == [[0, 1], [2]]
    (cache,) = shadow_dir.iterdir()
    stamps = {f.name: f.stat().st_mtime_ns for f in cache.glob("shadow*.npz")}
    assert set(stamps) == {"shadow0.npz", "shadow1.npz"}  # the first slice's shadows, cached as they finished

    calls.clear()

    def counted(runs, **kw):
        calls.append(sorted(runs))
        return real(runs, **kw)

    monkeypatch.setattr(shadow_cohort, "train_shadows_together", counted)
    scores, trained = _shadows(plan, e, shadow_dir, shadow_cohort=2)
    # only the missing shadow trains (alone: a cohort of one is the run itself); the cached ones are read back unchanged
    assert calls == [] and (cache / "shadow2.npz").is_file()
    assert {f.name: f.stat().st_mtime_ns for f in cache.glob("shadow*.npz") if f.name in stamps} == stamps
    for k in range(3):
        z = np.load(cache / f"shadow{k}.npz")
        np.testing.assert_array_equal(scores[k], z["score"])
        np.testing.assert_array_equal(trained[k], z["trained"])


def test_a_switch_carries_each_coroutines_autocast_and_grad_mode():
    """Coroutines share one thread: a shadow paused inside an autocast (or no-grad) block must not leave it on for the
    cohort or the next shadow, and must find it on again when resumed."""
    import greenlet

    from threat_models.shadow_cohort import _restore_thread_state, _thread_state

    main = greenlet.getcurrent()

    def shadow():
        with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
            st = _thread_state()
            main.switch()
            _restore_thread_state(st)
            return torch.is_autocast_enabled("cpu"), torch.is_grad_enabled()

    g = greenlet.greenlet(shadow)
    st = _thread_state()
    g.switch()
    _restore_thread_state(st)
    assert not torch.is_autocast_enabled("cpu") and torch.is_grad_enabled()  # the cohort's side: its own modes
    st = _thread_state()
    inside = g.switch()
    _restore_thread_state(st)
    assert inside == (True, False)  # the shadow's side: its block's modes again
    assert not torch.is_autocast_enabled("cpu") and torch.is_grad_enabled()
