"""torchvision ResNet backbones as encoders g_θ for image data.

:class:`ResNetEncoder` reshapes a flat input row ``(C*H*W,)`` to ``(C, H, W)``, runs ``torchvision.models.resnet18``
or ``resnet50`` (built with ``weights=None``: nothing is downloaded), and maps the pooled features to
``model.embedding_dim`` with a new linear layer that replaces torchvision's ``fc``.

**Weights.** ``model.weights`` is a local state-dict file in torchvision's ImageNet checkpoint format (the keys of
``torchvision.models.resnet18().state_dict()``; ``fc.*`` is ignored, ``num_batches_tracked`` may be absent), or the
explicit string ``"random"`` (torchvision's own initialisation). A missing or unreadable file, or one whose keys or
shapes do not fit the architecture, is a one-line :class:`~secure_fed.errors.ConfigError`; there is never a silent
fallback to random weights. The new ``fc`` is initialised from the global torch RNG, which the caller seeds.

**Batch normalisation in federated training.** The engine's θ is the module's named *parameters*; torchvision's
BatchNorm keeps its running mean and variance in buffers, which θ would not carry: the server's model would evaluate
with its initial statistics, and the worker model reused for every client would carry statistics from one client's
data to the next. :class:`FederatedBatchNorm2d` therefore holds ``running_mean`` and ``running_var`` as parameters
with ``requires_grad=False``: they are part of θ, every client starts from the server's, its update sends their
change like any other θ delta, and the server averages them with the rest (FedAvg over the whole state dict, as
state-dict based frameworks do). No client optimiser moves them (they have no gradient), and the server
does not *train* them either: whatever ``training.server_optimizer`` is, non-trainable entries of θ take the clients'
mean (see :mod:`secure_fed.engine.server_optimizers`; an adaptive step would leave the statistics far behind the
data). The state-dict keys stay torchvision's.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
import torchvision
from torch import nn
from torch.nn import functional as F

from secure_fed.errors import ConfigError

#: the torchvision architectures ``model.name`` may pick
ARCHITECTURES = ("resnet18", "resnet50")
#: how many key names an error message lists
_SHOWN = 5


class FederatedBatchNorm2d(nn.BatchNorm2d):
    """``nn.BatchNorm2d`` whose running statistics are non-trainable parameters, so that θ carries them (see the
    module docstring). A training batch with one value per channel (batch of 1 at 1×1 spatial size), whose batch
    statistics are undefined, is normalised with the running statistics and leaves them unchanged."""

    def __init__(self, num_features: int, **kwargs):
        super().__init__(num_features, **kwargs)
        mean, var = self.running_mean, self.running_var
        del self._buffers["running_mean"], self._buffers["running_var"]
        self.running_mean = nn.Parameter(mean, requires_grad=False)
        self.running_var = nn.Parameter(var, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Batch statistics in training (updating the running ones), the running statistics in evaluation."""
        if self.training and x.shape[0] * x.shape[2] * x.shape[3] <= 1:
            return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)
        return super().forward(x)


class ResNetEncoder(nn.Module):
    """g_θ: a flat image row → torchvision ResNet (``fc`` replaced by a new ``Linear(features, out_dim)``)."""

    def __init__(self, arch: str, image_shape: tuple[int, int, int], *, out_dim: int, weights: str | os.PathLike):
        """``weights``: a state-dict file (torchvision's ImageNet checkpoint format) or ``"random"``."""
        super().__init__()
        if arch not in ARCHITECTURES:
            raise ValueError(f"unknown ResNet '{arch}' (use {' or '.join(ARCHITECTURES)})")
        if len(image_shape) != 3 or image_shape[0] != 3:
            raise ConfigError(f"model.name={arch} needs RGB images (3 channels); the data's image shape is {tuple(image_shape)}")
        self.arch = arch
        self.image_shape = tuple(int(v) for v in image_shape)
        self.resnet = getattr(torchvision.models, arch)(weights=None, norm_layer=FederatedBatchNorm2d)
        if weights != "random":
            load_resnet_weights(self.resnet, weights, arch=arch)
        self.resnet.fc = nn.Linear(self.resnet.fc.in_features, out_dim)

    @property
    def in_dim(self) -> int:
        """C*H*W, the width of an input row."""
        return math.prod(self.image_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C*H*W)`` → ``(B, out_dim)``."""
        return self.resnet(x.reshape(x.shape[0], *self.image_shape))


def _listed(names: list[str]) -> str:
    shown = ", ".join(sorted(names)[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def _ignored(key: str) -> bool:
    return key.startswith("fc.") or key.endswith("num_batches_tracked")


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors of a state-dict file, with a one-line :class:`ConfigError` naming the file when it is missing,
    unreadable or not a mapping of names to tensors (loaded with ``weights_only=True``: no code runs)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"model.weights: file not found: {p} (a torchvision state dict, or 'random')")
    try:
        sd = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - pickle, zip and tensor errors alike: the file is not a readable state dict
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ConfigError(f"model.weights: cannot read {p} as a PyTorch state dict ({type(exc).__name__}: {first})") from None
    if not isinstance(sd, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in sd.items()):
        raise ConfigError(f"model.weights: {p} holds a {type(sd).__name__}, not a state dict (parameter name → tensor)")
    return sd


def load_resnet_weights(resnet: nn.Module, path: str | os.PathLike, *, arch: str) -> None:
    """Copy the backbone tensors of the state-dict file ``path`` into ``resnet`` (every key but ``fc.*`` and
    ``num_batches_tracked`` must be there with the right shape; a mismatch is a :class:`ConfigError` listing a few)."""
    sd = read_state_dict(path)
    own = {k: v for k, v in resnet.state_dict().items() if not _ignored(k)}
    given = {k: v for k, v in sd.items() if not _ignored(k)}
    missing, unexpected = sorted(set(own) - set(given)), sorted(set(given) - set(own))
    if missing or unexpected:
        parts = ([f"missing {_listed(missing)}"] if missing else []) + (
            [f"unexpected {_listed(unexpected)}"] if unexpected else []
        )
        raise ConfigError(f"model.weights: {path} does not fit torchvision's {arch}: keys " + "; ".join(parts))
    wrong = [f"{k} {tuple(given[k].shape)} vs {tuple(v.shape)}" for k, v in own.items() if given[k].shape != v.shape]
    if wrong:
        raise ConfigError(f"model.weights: {path} does not fit torchvision's {arch}: shapes differ: {_listed(wrong)}")
    resnet.load_state_dict(given, strict=False)  # fc and num_batches_tracked stay as built
