"""Image data end to end: ResNet-18 on digit mosaics learns under FedAvg and FLAG (well above the label-frequency
baseline), the server's and the worker's models start from the same weights, and the model choice for images."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
import torchvision
from sklearn.metrics import average_precision_score

from secure_fed.config import load_plan
from secure_fed.data.from_config import build_dataset
from secure_fed.engine import Experiment
from secure_fed.errors import ConfigError
from secure_fed.model_choices import model_choice
from tests.conftest import small_plan

#: ResNet-18 (random init) on 16×16 mosaics of 2×2 digits, 3 iid clients; the same settings for every algorithm
IMAGES = [
    "dataset.name=digit_mosaics",
    "dataset.mosaics={grid: 2, tile_size: 8, num_train: 1000, num_test: 300}",
    "model.name=resnet18",
    "model.weights=random",
    "model.family=linear_head",
    "model.embedding_dim=64",
    "partition.name=iid",
    "partition.num_clients=3",
    "algorithm.name=fedavg",
    "training.rounds=3",
    "training.local_epochs=2",
    "training.batch_size=192",  # 333 rows per client: 2 steps an epoch (an Adam step on 11M parameters costs ~0.1 s)
    "training.client_optimizer=adam",
    "training.client_lr=0.002",
    "training.server_optimizer.name=fedavg",
    "training.server_optimizer.lr=1.0",
    "evaluation.every=3",
    "output.progress=false",
    "output.checkpoint_every=100",
    "device=cpu",
]


def _frequency_baseline_map(ds) -> float:
    """mAP (%) of scoring every test mosaic with the training label frequencies (no features)."""
    y = ds.test.labels.toarray()
    freq = np.asarray(ds.train.labels.mean(axis=0)).ravel()
    keep = y.sum(axis=0) > 0
    return 100 * float(average_precision_score(y[:, keep], np.tile(freq[keep], (len(y), 1)), average="macro"))


@pytest.fixture
def one_thread():
    """One torch thread for the run: the figures then do not depend on the core count (reduction order), and a busy
    second core does not slow it down (two threads on a shared 2-core machine took 98 s instead of 32 s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_resnet18_on_digit_mosaics_learns_under_fedavg_and_flag(tmp_path, one_thread):
    start = time.perf_counter()
    ds = build_dataset(load_plan(overrides=IMAGES))
    baseline = _frequency_baseline_map(ds)
    assert 30 < baseline < 40  # each digit is in about 34% of the mosaics
    maps = {}
    for algo in ("fedavg", "flag"):
        exp = Experiment(load_plan(overrides=[*IMAGES, f"algorithm.name={algo}"]), run_dir=tmp_path / algo, dataset=ds)
        res = exp.run(progress=False)
        maps[algo] = res.summary["final"]["mAP"]
        assert res.summary["status"] == "completed"
        assert maps[algo] == pytest.approx(exp.evaluate()["mAP"])
        var = exp.theta["encoder.resnet.layer4.1.bn2.running_var"]
        assert not torch.allclose(var, torch.ones_like(var))  # the server evaluates with trained batch-norm statistics
    elapsed = time.perf_counter() - start
    print(f"baseline {baseline:.1f}  fedavg {maps['fedavg']:.1f}  flag {maps['flag']:.1f}  ({elapsed:.1f} s)")
    for algo, m in maps.items():
        assert m > baseline + 15, (algo, m, baseline)


def test_server_and_worker_models_start_from_the_same_weights_file(tmp_path):
    torch.manual_seed(5)
    sd = {k: (torch.randn_like(v) if v.is_floating_point() else v) for k, v in torchvision.models.resnet18().state_dict().items()}
    path = tmp_path / "imagenet_like.pt"
    torch.save(sd, path)
    ov = [*IMAGES, "dataset.mosaics.num_train=40", "dataset.mosaics.num_test=20", f"model.weights={path}"]
    exp = Experiment(load_plan(overrides=ov), run_dir=tmp_path / "run")
    server, worker = dict(exp.encoder.named_parameters()), dict(exp.worker.named_parameters())
    assert server.keys() == worker.keys() == exp.theta.keys()
    for name, p in server.items():
        assert torch.equal(p, worker[name]) and torch.equal(p, exp.theta[name]), name
        key = name.removeprefix("encoder.resnet.")
        if name.startswith("encoder.resnet.") and not key.startswith("fc."):
            assert torch.equal(p, sd[key]), name  # the file's tensor, not an initialisation
    assert exp.fed.x_test.dtype == torch.float32 and exp.fed.x_test.shape[1] == 3 * 16 * 16


def test_model_choice_for_image_data():
    images = build_dataset(load_plan(overrides=[*IMAGES[:2], "dataset.mosaics={num_train: 20, num_test: 10, tile_size: 8}"]))
    auto = small_plan("model.name=auto", "model.weights=random")
    assert model_choice(auto, images) == ("resnet18", "image", [])
    assert model_choice(small_plan("model.name=mlp"), images)[1] == "image"  # pixels in [0, 1], ImageNet-normalised
    with pytest.raises(ConfigError, match="cannot be downloaded here"):
        model_choice(small_plan("model.name=auto"), images)
    with pytest.raises(ConfigError, match="garbage weight gradients"):  # torch's bf16 CPU conv bug at 1×1 maps
        model_choice(small_plan("model.name=auto", "model.weights=random", "training.precision=bf16"), images)
    larger = build_dataset(load_plan(overrides=[*IMAGES[:2], "dataset.mosaics={num_train: 20, num_test: 10, tile_size: 9}"]))
    assert model_choice(small_plan("model.name=auto", "model.weights=random", "training.precision=bf16"), larger)[0] == "resnet18"
    synthetic = build_dataset(small_plan())
    with pytest.raises(ConfigError, match="needs image data"):
        model_choice(small_plan("model.name=resnet18", "model.weights=random"), synthetic)
    with pytest.raises(ConfigError, match="model.weights is for"):
        model_choice(auto, synthetic)
    assert model_choice(small_plan("model.name=auto"), synthetic)[:2] == ("mlp", "standardize")


def test_batch_norm_statistics_are_averaged_under_fedadam(tmp_path, one_thread):
    """With the default adaptive server optimiser, the running statistics still take the clients' mean: FedAdam's
    first step would move every coordinate by ≈ η = 1e-3, the mean of the clients' statistics moves far more."""
    ov = [
        *IMAGES,
        "dataset.mosaics.num_train=60",
        "dataset.mosaics.num_test=20",
        "training.rounds=1",
        "training.local_epochs=1",
        "training.server_optimizer.name=fedadam",
        "training.server_optimizer.lr=0.001",
        "evaluation.every=1",
    ]
    exp = Experiment(load_plan(overrides=ov), run_dir=tmp_path / "run")
    frozen = {n for n, p in exp.encoder.named_parameters() if not p.requires_grad}
    assert frozen == {n for n in exp.theta if n.endswith(("running_mean", "running_var"))} and len(frozen) == 40
    before = {n: exp.theta[n].clone() for n in frozen}
    exp.run(progress=False)
    moved = max(float((exp.theta[n] - before[n]).abs().max()) for n in frozen)
    assert moved > 0.05, moved
    weight = "encoder.resnet.layer1.0.conv1.weight"
    assert exp.server_opt.state[weight]  # the trained entries do go through FedAdam
