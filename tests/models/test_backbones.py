"""ResNet backbones: weights from a local torchvision state dict or 'random', never a silent fallback; the config
refuses a ResNet without weights (in one line, torch-free); batch-norm statistics travel in θ."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys

import pytest
import torch
import torchvision

from secure_fed.cli import main
from secure_fed.config import load_config
from secure_fed.errors import ConfigError
from secure_fed.models import build_encoder
from secure_fed.models.backbones import FederatedBatchNorm2d, ResNetEncoder

SHAPE = (3, 16, 16)


def _checkpoint(tmp_path, arch="resnet18", seed=123, drop=(), name="w.pt", old_style=False):
    """A torchvision state dict of ``arch`` with values unlike any initialisation (fc included, 1000 classes)."""
    torch.manual_seed(seed)
    sd = {
        k: (torch.randn_like(v) if v.is_floating_point() else v)
        for k, v in getattr(torchvision.models, arch)().state_dict().items()
    }
    sd = {k: v for k, v in sd.items() if k not in drop and not (old_style and k.endswith("num_batches_tracked"))}
    path = tmp_path / name
    torch.save(sd, path)
    return path, sd


def test_random_weights_build_and_map_flat_rows_to_the_embedding():
    enc = ResNetEncoder("resnet18", SHAPE, out_dim=24, weights="random")
    x = torch.rand(5, 3 * 16 * 16)
    assert enc(x).shape == (5, 24)
    assert enc.resnet.fc.out_features == 24 and enc.resnet.fc.in_features == 512
    enc.eval()
    assert torch.allclose(enc(x[:2]), enc.resnet(x[:2].reshape(2, *SHAPE)))  # rows are (C, H, W) images
    assert (
        build_encoder("resnet50", 768, embedding_dim=8, hidden_dims=[], image_shape=SHAPE, weights="random").resnet.fc.in_features
        == 2048
    )
    with pytest.raises(ValueError, match="does not match rows of 700"):
        build_encoder("resnet18", 700, embedding_dim=8, hidden_dims=[], image_shape=SHAPE, weights="random")
    with pytest.raises(ConfigError, match="RGB"):
        ResNetEncoder("resnet18", (1, 16, 16), out_dim=8, weights="random")


def test_a_state_dict_file_loads_every_backbone_tensor_and_not_fc(tmp_path):
    path, sd = _checkpoint(tmp_path)
    enc = ResNetEncoder("resnet18", SHAPE, out_dim=24, weights=str(path))
    own = enc.resnet.state_dict()
    backbone = [k for k in sd if not k.startswith("fc.") and not k.endswith("num_batches_tracked")]
    assert len(backbone) == 100
    for k in backbone:
        assert torch.equal(own[k], sd[k]), k
    assert own["fc.weight"].shape == (24, 512)  # the new projection, not the checkpoint's 1000-class fc
    # a checkpoint saved before num_batches_tracked existed (torchvision's ImageNet files) loads too
    old, sd_old = _checkpoint(tmp_path, seed=7, old_style=True, name="old.pt")
    enc_old = ResNetEncoder("resnet18", SHAPE, out_dim=24, weights=old)
    assert torch.equal(enc_old.resnet.state_dict()["layer4.1.bn2.running_var"], sd_old["layer4.1.bn2.running_var"])


def test_missing_or_unreadable_weights_file_is_an_error_naming_it(tmp_path):
    missing = tmp_path / "nope.pt"
    with pytest.raises(ConfigError, match="file not found") as exc:
        ResNetEncoder("resnet18", SHAPE, out_dim=8, weights=str(missing))
    assert str(missing) in str(exc.value)
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"\x00not a checkpoint" * 10)
    with pytest.raises(ConfigError, match="cannot read") as exc:
        ResNetEncoder("resnet18", SHAPE, out_dim=8, weights=str(garbage))
    assert str(garbage) in str(exc.value)
    listy = tmp_path / "list.pt"
    torch.save([torch.zeros(1)], listy)
    with pytest.raises(ConfigError, match="not a state dict"):
        ResNetEncoder("resnet18", SHAPE, out_dim=8, weights=str(listy))


def test_mismatched_keys_or_shapes_are_listed(tmp_path):
    r50, _ = _checkpoint(tmp_path, arch="resnet50", name="r50.pt")
    with pytest.raises(ConfigError, match="does not fit torchvision's resnet18") as exc:
        ResNetEncoder("resnet18", SHAPE, out_dim=8, weights=str(r50))
    msg = str(exc.value)
    assert "unexpected" in msg and "layer1.0.bn3.bias" in msg and "more" in msg and "\n" not in msg
    gap, _ = _checkpoint(tmp_path, drop=("layer2.0.conv1.weight",), name="gap.pt")
    with pytest.raises(ConfigError, match="missing layer2.0.conv1.weight"):
        ResNetEncoder("resnet18", SHAPE, out_dim=8, weights=str(gap))
    path, sd = _checkpoint(tmp_path, name="shape.pt")
    sd["conv1.weight"] = torch.zeros(64, 3, 3, 3)
    torch.save(sd, path)
    with pytest.raises(ConfigError, match=r"shapes differ: conv1.weight \(64, 3, 3, 3\)"):
        ResNetEncoder("resnet18", SHAPE, out_dim=8, weights=str(path))


def test_batch_norm_statistics_are_theta_and_train_on_client_batches():
    enc = ResNetEncoder("resnet18", SHAPE, out_dim=8, weights="random")
    names = dict(enc.named_parameters())
    assert "resnet.bn1.running_mean" in names and "resnet.layer4.1.bn2.running_var" in names  # θ carries them
    assert not names["resnet.bn1.running_var"].requires_grad
    assert isinstance(enc.resnet.bn1, FederatedBatchNorm2d)
    enc.train()
    enc(torch.rand(4, 3 * 16 * 16) * 5 + 2).sum().backward()
    assert not torch.equal(names["resnet.bn1.running_mean"], torch.zeros(64))  # batch statistics were tracked
    assert names["resnet.bn1.running_mean"].grad is None
    before = names["resnet.layer4.1.bn2.running_mean"].clone()
    enc(torch.rand(1, 3 * 16 * 16))  # a batch of one at 1×1 spatial size in layer4: no error, statistics untouched
    assert torch.equal(names["resnet.layer4.1.bn2.running_mean"], before)


# -------------------------------------------------------------------------------------------------- config
def _cli(*args: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(list(args))
    return code, err.getvalue()


def _one_error_line(code: int, err: str, *needles: str) -> None:
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    for n in needles:
        assert n in lines[0], (n, lines[0])


def test_resnet_without_weights_is_refused_at_validation(tmp_path):
    with pytest.raises(ConfigError, match="ImageNet weights cannot be downloaded here") as exc:
        load_config(overrides=["model.name=resnet18"])
    assert "model.weights: random" in str(exc.value)
    cfg = tmp_path / "r.yaml"
    cfg.write_text("dataset: {name: digit_mosaics}\nmodel: {name: resnet50}\n")
    _one_error_line(*_cli("validate", str(cfg)), "model.name=resnet50", "cannot be downloaded", "model.weights: random")
    assert _cli("validate", str(cfg), "--set", "model.weights=random")[0] == 0


def test_weights_that_are_missing_or_for_another_model_are_refused_at_validation(tmp_path):
    missing = tmp_path / "imagenet.pth"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"model: {{name: resnet18, weights: {missing}}}\n")
    _one_error_line(*_cli("validate", str(cfg)), "file not found", str(missing))
    _one_error_line(*_cli("validate", str(cfg), "--set", "model.name=mlp", "--set", "model.weights=random"), "model.name=mlp")
    path, _ = _checkpoint(tmp_path)
    assert load_config(overrides=["model.name=resnet18", f"model.weights={path}"]).model.weights == str(path)


def test_validate_of_a_resnet_config_stays_torch_free(tmp_path):
    cfg = tmp_path / "r.yaml"
    cfg.write_text("dataset: {name: digit_mosaics}\nmodel: {name: resnet18, weights: random}\n")
    code = (
        "import sys; from secure_fed.cli import main; rc = main(['validate', sys.argv[1]]); "
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision')); print(rc, heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code, str(cfg)], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "0 []", out
