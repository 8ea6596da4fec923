"""Every DP mean divides by a public number: changing the count of private records by one changes no divisor.

The worst neighbouring pair of the finding: every clipped contribution is 0 and the removed record is alone in its
set. With a private divisor (q·n_all in the W step) the two outputs are Gaussians whose variances differ by
(n/(n−1))², a divergence no accountant counts; with a public one they are the same distribution, so the divergence is
exactly 0. The tests run each mechanism on such a pair with the same secret draws and compare the outputs exactly.
"""

from __future__ import annotations

import math

import pytest
import torch

from protocols.config_sections import PrivacyConfig
from secure_fed.config import build_plan
from secure_fed.engine import Experiment
from tests.conftest import small_config, small_plan

INSTANCE = ['protocols=["dp"]', "algorithm.normalize_gamma=false",
            'privacy.instance={"noise_multiplier": 1.0, "sample_rate": 0.2}', "privacy.noise_seed=7"]  # fmt: skip


def chi2_gaussians(std_p: float, std_q: float) -> float:
    """χ²(N(0, p²) ‖ N(0, q²)) = q² / (p·√(2q² − p²)) − 1 (∞ where 2q² ≤ p²): an independent closed form."""
    if 2 * std_q**2 <= std_p**2:
        return math.inf
    return std_q**2 / (std_p * math.sqrt(2 * std_q**2 - std_p**2)) - 1.0


def _w_step_on(exp, sets, state) -> torch.Tensor:
    """One DP W step of ``exp`` over the label sets ``sets``, from the unit's ledger ``state``."""
    exp.stack.by_name()["dp"].units["instance"].load_state_dict(state)  # the same step number: the same secret draws
    exp.algorithm.label_sets = sets
    W = exp.W.clone()
    exp.algorithm.w_step(W)
    return W


def test_the_w_step_releases_the_same_distribution_on_n_and_n_minus_1_label_sets(tmp_path):
    exp = Experiment(small_plan(*INSTANCE, "training.rounds=1"), run_dir=tmp_path / "run")
    exp.setup()
    alg = exp.algorithm
    sets = alg.label_sets
    n = sets.shape[0]
    assert n > 10
    # the worst pair: every per-set gradient 0 (clipped contributions vanish); only the noise and the divisor remain
    alg.per_set_gradients = lambda W: lambda Yb: torch.zeros(Yb.shape[0], *W.shape, dtype=W.dtype, device=W.device)
    state = exp.stack.by_name()["dp"].units["instance"].state_dict()
    a, b = _w_step_on(exp, sets, state), _w_step_on(exp, sets[: n - 1], state)
    assert not torch.equal(a, exp.W)  # noise moved W
    assert torch.equal(a, b)  # the same draw divided by the same public B̄: the same output
    # the released step's noise std on both sides, and the χ² divergence between them: exactly 0
    bbar = exp.plan.part(PrivacyConfig).instance.divisor(exp.plan.dataset)
    assert bbar == pytest.approx(0.2 * exp.plan.dataset.synthetic.num_train)
    std_n = std_m = 1.0 * 2 * 1.0 / bbar  # σ · 2C / B̄ on each side (no count enters)
    assert chi2_gaussians(std_n, std_m) == 0.0
    # what the old divisor q·n_all gave on Bibtex's scale: a positive divergence per step, at any σ
    assert chi2_gaussians(1 / (0.1 * 4880), 1 / (0.1 * 4879)) > 0


def test_client_level_row_divisors_are_public_in_a_general_partition(tmp_path):
    """Which clients hold a label is a fact of their data: the per-row divisor is q·N (every client), not q·(holders)."""
    cfg = small_config(
        "algorithm.name=fedavg",
        "partition.name=iid",
        "partition.num_clients=5",
        "model.family=embedding",
        'protocols=["dp"]',
        'privacy.client={"noise_multiplier": 1.0, "clip_norm": 0.5}',
        "training.rounds=1",
    )
    exp = Experiment(build_plan(cfg), run_dir=tmp_path / "run")
    per_row = exp.stack_env.clients_per_row
    assert per_row.tolist() == [5] * exp.dataset.num_labels


def test_client_level_row_divisors_are_one_per_label_in_the_positive_only_setting(tmp_path):
    cfg = small_config("algorithm.name=fedaws", 'protocols=["dp"]', 'privacy.client={"noise_multiplier": 1.0, "clip_norm": 0.5}')
    exp = Experiment(build_plan(cfg), run_dir=tmp_path / "run")
    assert exp.stack_env.clients_per_row.tolist() == [1] * exp.dataset.num_labels


def test_the_client_level_mean_divides_by_config_facts_whatever_the_cohort(tmp_path, monkeypatch):
    """Under Poisson client sampling the realised cohort varies; the released mean's denominators do not: q·N for θ and
    q per row (one client per label), as set on the aggregate the engine divides by."""
    import protocols.dp.client_release as client_release

    seen = []
    real = client_release.noise_aggregate

    def spy(agg, **kw):
        out = real(agg, **kw)
        seen.append((agg.num_clients, float(out.theta_denominator), out.row_denominator.clone()))
        return out

    monkeypatch.setattr(client_release, "noise_aggregate", spy)
    cfg = small_config("algorithm.name=fedaws", 'protocols=["dp"]', "training.client_fraction=0.5",
                       "training.sampling=poisson", "training.rounds=4",
                       'privacy.client={"noise_multiplier": 1.0, "clip_norm": 0.5}')  # fmt: skip
    exp = Experiment(build_plan(cfg), run_dir=tmp_path / "run")
    exp.run(progress=False)
    n = len(exp.fed.clients)
    assert len(seen) == 4 and len({c for c, _, _ in seen}) > 1  # cohorts of different sizes
    for _, theta_den, row_den in seen:
        assert theta_den == 0.5 * n
        assert torch.equal(row_den, torch.full_like(row_den, 0.5))
