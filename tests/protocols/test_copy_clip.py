"""``privacy.local.copy_clip: split``: an instance on k clients has each copy clipped to C/√k, so its copies move the
clients' DP-SGD releases by ≤ C together, and the ledger counts one copy's steps (protocols/dp/local_dpsgd.py)."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch

from protocols.dp.local_dpsgd import LocalDPSGD
from protocols.randomness import SecretStream
from secure_fed.config import load_plan
from secure_fed.engine import Experiment
from secure_fed.errors import ConfigError
from tests.conftest import small_config
from tests.protocols.worst_case_check import _sampled_gaussian_rdp, run_round, worst_case_pair
from tests.protocols.worst_case_combinations import BASE, FAMILIES


def _priv(copy_clip: str, bound: int = 3, sigma: float = 0.0) -> LocalDPSGD:
    return LocalDPSGD(clip_norm=1.0, noise_multiplier=sigma, sample_rate=1.0, divisor=1.0, stream=SecretStream.fresh(),
                      label="r0", copy_clip=copy_clip, copies_bound=bound)  # fmt: skip


def test_split_clips_each_sample_to_c_over_the_root_of_its_copies():
    torch.manual_seed(0)
    g = torch.randn(6, 5) * 4
    g[5] = 1e-3  # a small sample: left as it is
    copies = torch.tensor([1, 2, 3, 2, 1, 3])
    p = _priv("split")
    scales = p.clip_scales(copies)
    torch.testing.assert_close(scales, 1.0 / torch.sqrt(copies.double()))
    got = p.clip_sum({"g": g}, scales)["g"]
    want = sum(min(1.0, (1.0 / math.sqrt(int(k))) / float(v.norm())) * v.double() for v, k in zip(g, copies, strict=True))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    f = p.factors(g.double().norm(dim=1), scales)
    assert bool(((f * g.double().norm(dim=1)) <= scales + 1e-12).all())  # each clipped sample within s_i·C


def test_full_clip_ignores_copies_and_split_refuses_more_copies_than_the_bound():
    assert _priv("full").clip_scales(torch.tensor([3, 2])) is None
    with pytest.raises(ValueError, match="exceeds the contribution bound 3"):
        _priv("split", bound=3).clip_scales(torch.tensor([1, 4]))
    with pytest.raises(ValueError, match="each in"):
        _priv("split").factors(torch.ones(2), torch.tensor([0.5, 1.5]))


def test_split_refuses_poisson_batches_and_a_client_without_copy_counts():
    with pytest.raises(ValueError, match="full-batch steps"):
        LocalDPSGD(clip_norm=1.0, noise_multiplier=1.0, sample_rate=0.5, divisor=1.0, stream=SecretStream.fresh(),
                   label="r0", copy_clip="split", copies_bound=2)  # fmt: skip
    with pytest.raises(ValueError, match="copy count"):
        _priv("split", bound=2).clip_scales(None)
    assert _priv("split", bound=1).clip_scales(None) is None  # every instance on one client: the plain clip


def test_split_release_draws_the_noise_it_accounts(monkeypatch):
    """The noise ``finish`` draws is σ·(C + √m·(γ√d + slack)), not one copy's σ·(C + γ√d + slack)."""
    from protocols.dp import local_dpsgd

    drawn = []

    def grid_noise(n, std, grid, stream, label):
        drawn.append(std)
        return torch.zeros(n, dtype=torch.float64)

    monkeypatch.setattr(local_dpsgd, "grid_noise", grid_noise)
    sums = {"g": torch.zeros(10, 10, dtype=torch.float64)}
    for copy_clip in ("full", "split"):
        _priv(copy_clip, bound=9, sigma=2.0).finish(sums, "s0")
    full = _priv("full", bound=9).noise_sensitivity(100)[1]
    assert drawn[0] == pytest.approx(2.0 * full, rel=1e-12)
    assert drawn[1] == pytest.approx(2.0 * (1.0 + 3.0 * (full - 1.0)), rel=1e-12)


def test_split_noise_covers_the_copies_roundings_in_l2():
    full, split = _priv("full", bound=9), _priv("split", bound=9)
    grid, c_full = full.noise_sensitivity(100)
    _, c_split = split.noise_sensitivity(100)
    # C + γ√d + slack for one copy; C + √m·(γ√d + slack) for the m copies' roundings
    assert c_full > 1.0
    assert c_split == pytest.approx(1.0 + 3.0 * (c_full - 1.0), rel=1e-12)


def _overrides(copy_clip: str, bound: int = 3) -> list[str]:
    local = ('privacy.local={"noise_multiplier": 1.0, "clip_norm": 1.0, "batch_sample_rate": 1.0, '
             f'"max_labels_per_instance": {bound}, "copy_clip": "{copy_clip}"}}')  # fmt: skip
    return [*BASE, *FAMILIES["fedaws"], 'protocols=["dp"]', local, "model.fixed_encoder=true", "training.local_epochs=1"]


def _per_sample_chunks_of_1(mp) -> None:
    """The trainer's generic path (per-sample gradients through vmap, one sample a chunk) instead of the linear
    fast path: the clip scales must follow each chunk's samples."""
    from secure_fed.algorithms import client

    mp.setattr(client, "linear_only", lambda model: False)
    mp.setattr(client, "per_sample_gradients", functools.partial(client.per_sample_gradients, chunk=1))


@pytest.mark.parametrize(("copy_clip", "path"), [("split", "fast"), ("split", "chunks"), ("full", "fast")])
def test_one_instance_moves_its_clients_first_steps_by_at_most_c_together_under_split(tmp_path, copy_clip, path):
    """End to end, noise off and every draw taken: the removed instance r (k ≥ 2 labels, features scaled so that its
    gradients are clipped) moves the first DP-SGD step of each of its k clients; the L2 norm of those moves over the
    clients is the instance's sensitivity. Split: ≤ C (√k·C/√k), on the linear fast path and on per-sample chunks;
    full: √k·C, which the same bound refuses (so the check can fail)."""
    plan = load_plan(overrides=_overrides(copy_clip))
    d, minus, _r, labels = worst_case_pair(plan, 3)
    assert len(labels) >= 2
    first = {}
    mutate = _per_sample_chunks_of_1 if path == "chunks" else None
    for side, ds in (("D", d), ("D-", minus)):
        _exp, rec = run_round(plan, ds, tmp_path / side.replace("-", "m"), noise_off=True, mutate=mutate)
        first[side] = {cid: seq[0][0] for cid, seq in rec.dp_sgd.items()}
    moves = [float(np.linalg.norm(first["D"][c] - first["D-"][c])) for c in first["D"] if c in first["D-"]]
    moved = [m for m in moves if m > 1e-9]
    assert len(moved) == len(labels)  # one copy per label of r
    total = math.sqrt(sum(m * m for m in moved))
    if copy_clip == "split":
        assert total <= 1.0 + 1e-3, moved  # C, and the copies' grid roundings (≤ √k·γ√d ≪ 1e-3 here)
        assert total > 0.99  # clipped: each copy at C/√k
    else:
        assert total == pytest.approx(math.sqrt(len(labels)), rel=1e-3)


def test_the_ledger_counts_one_copy_under_split(tmp_path):
    """The reported ε of 2 rounds × 2 local epochs: 4 Gaussian steps at σ = 1, q = 1 (split), against k = 3 copies of
    each (full), both from an independent RDP computation (dp_accounting), converted at the same orders; and
    ``validate``'s plan of the same runs (its own count of the steps) gives the same steps and ε."""
    import re

    from dp_accounting.rdp import rdp_privacy_accountant as rdp_lib

    from protocols.dp.mechanisms import ORDERS
    from secure_fed.plugin_specs import layer_specs

    for copy_clip, steps in (("split", 4), ("full", 12)):
        plan = load_plan(overrides=[*_overrides(copy_clip), "training.rounds=2", "training.local_epochs=2"])
        line = next(x for x in layer_specs()["dp"].describe(plan, 6) if x.startswith("dp instance unit: "))
        planned = re.search(r"client_training: σ 1 \(given\), q 1, (\d+) planned steps -> plans ε = ([\d.]+)", line)
        assert planned is not None and int(planned.group(1)) == steps, line
        exp = Experiment(plan, run_dir=tmp_path / copy_clip)
        exp.run(progress=False)
        eps = exp.privacy_summary()["units"]["instance"]["epsilon"]
        want, _ = rdp_lib.compute_epsilon(list(ORDERS), list(_sampled_gaussian_rdp(1.0, 1.0, steps)), 1e-5)
        assert eps == pytest.approx(want, rel=1e-6), copy_clip
        assert float(planned.group(2)) == pytest.approx(want, rel=1e-3), line


def test_split_is_refused_with_poisson_batches_and_with_noise_shares():
    local = "clip_norm: 1.0, noise_multiplier: 1.0, max_labels_per_instance: 2, copy_clip: split"
    with pytest.raises(ConfigError, match="copy_clip: split needs batch_sample_rate 1 and noise: local"):
        small_config("algorithm.name=fedaws", "protocols=[dp]", f"privacy.local={{{local}, batch_sample_rate: 0.5}}")
    with pytest.raises(ConfigError, match="copy_clip: split needs batch_sample_rate 1 and noise: local"):
        small_config(
            "algorithm.name=fedaws",
            'protocols=["dp", "secure_aggregation"]',
            "training.local_epochs=1",
            f"privacy.local={{{local}, batch_sample_rate: 1.0, noise: shares}}".replace("2,", "1,"),
        )
    small_config("algorithm.name=fedaws", "protocols=[dp]", f"privacy.local={{{local}, batch_sample_rate: 1.0}}")
