"""``privacy.label_prior``: the DP label histogram, a DP mechanism plugin (protocols/dp/label_prior.py, registered by
its ``secure_fed.mechanisms`` entry point alone, read from pyproject.toml: ``secure_fed.plugins.source_entry_points``).

Checked against independent computations: the clients' bounded counts recomputed with numpy, the noise's std against
the declared σ·(Δ + γ√d) (a statistical test), the ε of the run's report against the Gaussian mechanism's RDP at that
σ (closed form) and the project's accountant over the independently built history, and ``validate``'s ε line."""

from __future__ import annotations

import math
from types import SimpleNamespace as NS

import numpy as np
import pytest
import torch

from protocols.dp.accountant import epsilon_of
from protocols.dp.discrete_gaussian import release_grid
from protocols.dp.discrete_gaussian_accounting import LEDGER_ORDERS
from protocols.dp.label_prior import label_counts
from protocols.dp.mechanism_plugins import mechanism_specs
from protocols.layer_settings import dp_settings
from protocols.randomness import SecretStream
from secure_fed.algorithms.base import ClientData
from secure_fed.config import load_config
from secure_fed.engine import Experiment
from secure_fed.errors import ConfigError
from tests.conftest import small_config, small_plan

DELTA = 1e-5


def client(cid: int, pos: list[list[int]], known: list[int], num_labels: int) -> ClientData:
    p = torch.tensor(pos, dtype=torch.bool)
    return ClientData(client_id=cid, x=torch.zeros(len(pos), 1), pos=p, known_labels=torch.tensor(known), raw=None,
                      num_labels=num_labels)  # fmt: skip


def bounded_numpy(pos: list[list[int]], known: list[int], num_labels: int, m: int, clip: float | None = None) -> np.ndarray:
    """The client's bounded counts, independently: each instance's 0/1 row scaled to L2 ≤ √m, summed per label."""
    out = np.zeros(num_labels)
    for row in np.asarray(pos, dtype=float):
        n = np.sqrt(row.sum())
        out[known] += row * (min(1.0, np.sqrt(m) / n) if n > 0 else 1.0)
    if clip is not None and np.linalg.norm(out) > clip:
        out *= clip / np.linalg.norm(out)
    return out


POS = [[1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 0, 0, 0]]
KNOWN = [0, 2, 4, 6, 8]


def test_the_registry_finds_it_by_its_entry_point():
    spec = mechanism_specs()["label_prior"]
    assert spec.statistic == "label_counts" and spec.client == "protocols.dp.label_prior:label_counts"
    cfg = load_config(overrides=['protocols=["dp"]', 'privacy.label_prior={"noise_multiplier": 2, "max_labels_per_instance": 3}',
                                 "algorithm.name=fedaws"])  # fmt: skip
    assert cfg.privacy.label_prior.max_labels_per_instance == 3 and cfg.privacy.max_labels_per_instance() == 3


def test_each_instance_counts_once_per_label_and_at_most_root_m():
    got = label_counts(client(0, POS, KNOWN, 10), instance_bound=math.sqrt(2), client_clip=None).numpy()
    np.testing.assert_allclose(got, bounded_numpy(POS, KNOWN, 10, m=2), rtol=0, atol=1e-12)
    # the 5-label instance alone: its contribution has L2 norm √m, not √5
    alone = label_counts(client(0, POS[:1], KNOWN, 10), instance_bound=math.sqrt(2), client_clip=None)
    assert float(torch.linalg.vector_norm(alone)) == pytest.approx(math.sqrt(2), abs=1e-12)
    # an instance within the bound counts exactly 1 per label
    small = label_counts(client(0, POS[1:], KNOWN, 10), instance_bound=math.sqrt(2), client_clip=None).numpy()
    np.testing.assert_array_equal(small[KNOWN], [1, 1, 1, 0, 0])


def test_with_a_client_unit_each_clients_vector_is_clipped():
    got = label_counts(client(0, POS, KNOWN, 10), instance_bound=math.sqrt(2), client_clip=0.5)
    assert float(torch.linalg.vector_norm(got)) == pytest.approx(0.5, abs=1e-12)
    np.testing.assert_allclose(got.numpy(), bounded_numpy(POS, KNOWN, 10, m=2, clip=0.5), atol=1e-12)


def _fake_layer(cfg, clients: list[ClientData], seed: int):
    from protocols.dp import privacy_units

    settings = dp_settings(cfg)
    units = {"instance": privacy_units.instance_unit(settings, None)}
    return NS(settings=settings, units=units, env=NS(num_labels=clients[0].num_labels),
              server_stream=SecretStream.for_party(seed, "server"))  # fmt: skip


def _query(clients):
    return lambda payload_fn, fn: [(c.client_id, fn(payload_fn(c.client_id), c)) for c in clients]


def test_the_release_is_the_bounded_sum_plus_noise_of_the_declared_std():
    """300 releases of the same 3 clients' counts (20 labels) under different secrets: the noise's sample std is
    σ·(Δ + γ√d), Δ = √m, within 4% (6,000 draws: the std's standard error is 0.9%), its mean within 4 standard errors
    of 0; a release without noise (a mutant) fails."""
    from protocols.dp.plugin_release import release

    sigma, m, C = 3.0, 2, 20
    cfg = small_plan('protocols=["dp"]', "algorithm.name=fedaws",
                     f'privacy.label_prior={{"noise_multiplier": {sigma}, "max_labels_per_instance": {m}}}')  # fmt: skip
    rng = np.random.default_rng(0)
    data = []
    for cid in range(3):
        known = sorted(rng.choice(C, 5, replace=False).tolist())
        data.append((client(cid, rng.integers(0, 2, (30, 5)).tolist(), known, C), known))
    clients = [c for c, _ in data]
    exact = sum(bounded_numpy(c.pos.int().tolist(), known, C, m) for c, known in data)
    noise = []
    for seed in range(300):
        layer = _fake_layer(cfg, clients, seed)
        out = release(layer, _query(clients))["label_counts"].numpy()
        noise.append(out - exact)
        assert layer.units["instance"].mechanism("label_prior").steps == 1  # charged once
    noise = np.concatenate(noise)
    _, corrected = release_grid(math.sqrt(m), C)
    want = sigma * corrected
    assert corrected == pytest.approx(math.sqrt(m), rel=2**-10)
    assert np.std(noise) == pytest.approx(want, rel=0.04)
    assert abs(np.mean(noise)) < 4 * want / math.sqrt(len(noise))


def gaussian_epsilon(sigma: float, delta: float) -> float:
    """The Gaussian mechanism's (one step, q = 1, sensitivity 1 in units of σ) ε at δ, independently: its RDP
    α/(2σ²) at the ledger's orders, converted as Opacus converts (Balle et al. 2020's bound)."""
    a = np.asarray(LEDGER_ORDERS, dtype=float)
    a = a[a > 1]
    eps = a / (2 * sigma**2) + np.log((a - 1) / a) - (np.log(delta) + np.log(a)) / (a - 1)
    return float(eps.min())


def test_the_run_reports_its_epsilon_per_instance_and_per_client(tmp_path):
    """fedaws with client-level DP and the label prior: the instance unit's ledger is the label prior's one Gaussian
    step (closed form); the client unit's composes its rounds with the label prior's release at σ√m/(C_c + 2^-10√m),
    the project's accountant over that independently built history; validate's lines say the same."""
    from protocols.layer_specs import _describe_dp

    sigma, m, clip_c, q, rounds = 2.0, 2, 5.0, 0.5, 2
    ov = ['protocols=["dp"]', "algorithm.name=fedaws", f"training.rounds={rounds}", f"training.client_fraction={q}",
          "training.sampling=poisson", 'privacy.client={"noise_multiplier": 3.0, "clip_norm": 1.0}',
          f'privacy.label_prior={{"noise_multiplier": {sigma}, "max_labels_per_instance": {m}, '
          f'"client_clip_norm": {clip_c}}}']  # fmt: skip
    cfg = small_plan(*ov)
    res = Experiment(cfg, run_dir=tmp_path).run(progress=False)
    units = res.summary["privacy"]["units"]
    inst, cli = units["instance"], units["client"]
    assert inst["mechanisms"]["label_prior"]["steps"] == 1 if "mechanisms" in inst else inst["steps"] == 1
    assert inst["epsilon"] == pytest.approx(gaussian_epsilon(sigma, DELTA), rel=1e-9)
    sigma_c = sigma * math.sqrt(m) / (clip_c + 2**-10 * math.sqrt(m))
    assert cli["mechanisms"]["label_prior_client"]["noise_multiplier"] == pytest.approx(sigma_c, rel=1e-12)
    want = epsilon_of([(3.0, q, rounds), (sigma_c, 1.0, 1)], DELTA, "rdp")
    assert cli["epsilon"] == pytest.approx(want, rel=1e-9)
    assert cli["epsilon"] > epsilon_of([(3.0, q, rounds)], DELTA, "rdp")  # the release is charged, not free
    observer = cli["adversaries"]["observer"]
    assert observer["epsilon"] == pytest.approx(want, rel=1e-9) and "label_prior_client" in observer["why"]
    assert inst["adversaries"]["server"]["epsilon"] == "inf"  # the server adds the noise itself
    lines = _describe_dp(cfg, 8)
    line = next(x for x in lines if x.startswith("dp instance unit:"))
    assert f"label_prior: σ {sigma:.4g} (given), q 1, 1 planned steps -> plans ε = {inst['epsilon']:.4g}" in line
    assert any(x.startswith("dp label_prior: releases") and f"σ {sigma_c:.4g}" in x for x in lines)


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (['privacy.label_prior={"noise_multiplier": 1, "max_labels_per_instance": 2}'], "privacy.label_prior is set but 'dp'"),
        (['protocols=["dp"]', 'privacy.label_prior={"max_labels_per_instance": 2}'], "privacy.label_prior sets neither"),
        (['protocols=["dp"]', 'privacy.label_prior={"noise_multiplier": 1, "max_labels_per_instance": 2, "k": 1}'],
         "privacy.label_prior.k"),
        (['protocols=["dp"]', 'privacy.label_prior={"noise_multiplier": 1}'], "max_labels_per_instance"),
        (['protocols=["dp"]', 'privacy.label_prior={"noise_multiplier": 1, "max_labels_per_instance": 2}',
          'privacy.client={"noise_multiplier": 1, "max_labels_per_instance": 3}'], "differ"),
    ],
)  # fmt: skip
def test_bad_settings_are_one_clear_error(overrides, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(".", r"\.")):
        small_config("algorithm.name=fedaws", *overrides)
