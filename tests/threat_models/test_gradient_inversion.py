"""Gradient inversion on images (Geiping et al. 2020): the image scores against independent computations, a batch-1
reconstruction well above the mean-image baseline from a plain update, near or below it from a DP-noised one."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from secure_fed.algorithms.losses import bce_loss
from secure_fed.config import load_plan
from secure_fed.models.preprocess import IMAGENET_MEAN, IMAGENET_STD
from secure_fed.plugin_api.attacks import build_dataset, build_experiment, build_model
from threat_models.attacks.gradient_inversion import (
    MEASURE_CONFIG,
    ONE_STEP_ROUND,
    client_update,
    dp_noised,
    image_input,
    invert_gradients,
    labels_from_head_update,
    matched_scores,
    psnr,
    ssim,
)


def test_psnr_matches_an_independent_computation():
    rng = np.random.default_rng(0)
    a, b = rng.random((3, 3, 8, 8)), rng.random((3, 3, 8, 8))
    want = [10 * math.log10(1 / np.mean((a[i] - b[i]) ** 2)) for i in range(3)]
    assert psnr(torch.from_numpy(a), torch.from_numpy(b)).numpy() == pytest.approx(want, rel=1e-12)
    assert psnr(torch.from_numpy(a * 255), torch.from_numpy(b * 255), peak=255).numpy() == pytest.approx(want, rel=1e-9)


def test_ssim_is_one_for_equal_images_and_falls_with_noise():
    x = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    assert ssim(x, x).numpy() == pytest.approx([1.0, 1.0])
    noisy = (x + 0.3 * torch.randn(x.shape, generator=torch.Generator().manual_seed(1))).clamp(0, 1)
    assert (ssim(noisy, x) < 0.9).all()


def test_matching_assigns_each_true_image_its_reconstruction():
    x = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    s = matched_scores(x[[2, 0, 1]], x)
    assert s["order"].tolist() == [1, 2, 0] and (s["psnr"] > 100).all()


@pytest.fixture(scope="module")
def setting():
    torch.set_num_threads(1)
    plan = load_plan(overrides=MEASURE_CONFIG)
    ds = build_dataset(plan)
    model = build_model(plan, ds)
    shape = tuple(ds.image_shape)
    to_input = image_input(IMAGENET_MEAN, IMAGENET_STD)
    x = torch.from_numpy(ds.train.features[:1].astype(np.float32)).view(1, *shape) / 255
    y = torch.from_numpy(ds.train.labels[:1].toarray()).float()
    mean_image = (torch.from_numpy(ds.test.features.astype(np.float32)).view(-1, *shape) / 255).mean(0, keepdim=True)
    update = client_update(model, bce_loss, x, y, to_input)
    return model, shape, to_input, x, y, float(psnr(mean_image, x)[0]), update


def _attack(setting, update, **kw):
    model, shape, to_input, x, _, _, _ = setting
    labels = labels_from_head_update(update["head.bias"])
    rec = invert_gradients(model, bce_loss, update, labels, shape, to_input, steps=200, **kw)
    return float(matched_scores(rec, x)["psnr"][0]), labels


def test_batch_one_image_is_recovered_well_above_the_mean_image(setting):
    *_, y, baseline, update = setting
    got, labels = _attack(setting, update)
    assert torch.equal(labels, y)  # the labels read from the head's update are the image's
    assert got > baseline + 10, (got, baseline)
    start, _ = _attack(setting, update, match=False)  # the random start alone: far below
    assert start < baseline, (start, baseline)


def test_dp_noised_update_gives_no_better_than_the_mean_image(setting):
    *_, baseline, update = setting
    noised = dp_noised(update, sigma=0.64, gen=torch.Generator().manual_seed(0))  # σ for ε = 8, δ = 1e-5, one release
    got, _ = _attack(setting, noised)
    assert got < baseline + 1, (got, baseline)


@pytest.fixture
def registered(tmp_path, monkeypatch):
    """The attack's ``secure_fed.attacks`` entry point registered as ``pip install -e .`` leaves it."""
    from secure_fed import plugins
    from secure_fed.config import schema

    info = tmp_path / "secure_fed_gradient_inversion-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: secure-fed-gradient-inversion\nVersion: 0\n")
    (info / "entry_points.txt").write_text(
        "[secure_fed.attacks]\ngradient_inversion = threat_models.attack_specs:GRADIENT_INVERSION\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins.registry.cache_clear()
    schema.experiment_config_model.cache_clear()
    yield
    plugins.registry.cache_clear()
    schema.experiment_config_model.cache_clear()


#: 10 clients of 4 mosaics each, one plain-SGD step of the whole batch in the one round: the update is a gradient
RUN = [
    *MEASURE_CONFIG,
    "dataset.mosaics={grid: 2, tile_size: 8, num_train: 40, num_test: 100}",
    *ONE_STEP_ROUND,
    "training.batch_size=4",
    "attacks.gradient_inversion={targets: 2, steps: 200}",
]


#: DP-SGD in client training (one full-batch step, per-image clip 1, the client's own Gaussian noise) at ε = 8, and the
#: same step with the noise off (the control: what the DP test's low score owes to the noise, not to the clip)
DP_SGD = ["protocols=[dp]", "privacy.local={target_epsilon: 8, clip_norm: 1.0, batch_sample_rate: 1.0}"]
DP_SGD_NOISE_OFF = ["protocols=[dp]", "privacy.local={noise_multiplier: 1e-9, clip_norm: 1.0, batch_sample_rate: 1.0}"]


@pytest.mark.parametrize(
    "case, extra",
    [("plain", []), ("secure_sum", ["protocols=[secure_aggregation]"]), ("dp", DP_SGD), ("dp_noise_off", DP_SGD_NOISE_OFF)],
)
def test_the_server_inverts_plain_uplinks_but_not_a_secure_sum_or_dp_sgd(registered, tmp_path, case, extra):
    from threat_models.audit import audit
    from threat_models.context import AuditContext

    torch.set_num_threads(1)
    exp = build_experiment(load_plan(overrides=[*RUN, *extra]), run_dir=tmp_path / "run")
    exp.run(progress=False)
    ctx = AuditContext(exp)
    res = audit(ctx, progress=False)["attacks"]["gradient_inversion"]
    got, chance = res["metrics"]["psnr"], res["chance"]["psnr"]
    if case == "secure_sum":
        assert res["metrics"]["source"] == "aggregate" and res["details"]["uplinks"] == "masked"
        assert got < chance + 1, (got, chance)
    elif case == "dp":  # the server holds the client's own update, noised by the client: the noise is what it matches
        assert ctx.privacy()["units"]["instance"]["epsilon"] <= 8.0
        assert res["metrics"]["source"] == "individual"
        assert got < chance + 1, (got, chance)
    else:
        assert res["metrics"]["source"] == "individual"
        assert got > chance + 8, (got, chance)
