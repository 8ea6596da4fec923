"""Digit mosaics: a small multi-label image set built from scikit-learn's bundled 8×8 digits (no download).

Each image is a ``grid × grid`` mosaic of digit images, each tile resized to ``tile_size`` pixels with
torchvision and repeated over 3 channels; its labels are the set of digits it shows (10 labels, ``"0"`` to
``"9"``). Tiles are drawn uniformly with replacement, so a mosaic of 4 tiles shows 1 to 4 distinct digits
(3.4 on average). Train mosaics take their tiles from the first :data:`TRAIN_FRACTION` of
``sklearn.datasets.load_digits()`` (in its order) and test mosaics from the rest, so no digit image is in both
splits. The draw is seeded by the run seed; ``meta["train_tiles"]`` and ``meta["test_tiles"]`` record the
digits' indices in ``load_digits()`` of every tile (row-major), and ``meta["digit_pools"]`` the two index ranges.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torchvision.transforms.v2 import functional as TF

from secure_fed.data.dataset import MultiLabelSplit
from secure_fed.data.images.common import image_dataset, label_matrix

#: the share of load_digits() (first rows, in its order) whose images make train tiles; the rest make test tiles
TRAIN_FRACTION = 0.7
LABEL_NAMES = [str(d) for d in range(10)]


@dataclass(frozen=True, kw_only=True)
class MosaicSpec:
    """``grid`` tiles per side, each ``tile_size`` pixels (8 keeps the digits' own resolution); split sizes."""

    grid: int = 2
    tile_size: int = 16
    num_train: int = 2000
    num_test: int = 500


def digit_tiles(tile_size: int) -> tuple[torch.Tensor, np.ndarray]:
    """Every load_digits() image as a uint8 tile ``(n, tile_size, tile_size)`` (0..16 mapped to 0..255, resized
    with torchvision when ``tile_size != 8``), and the digits' targets."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    tiles = torch.from_numpy(np.rint(digits.images * (255.0 / 16.0)).astype(np.uint8))
    if tile_size != tiles.shape[-1]:
        tiles = TF.resize(tiles[:, None], [tile_size, tile_size], antialias=True)[:, 0]
    return tiles, np.asarray(digits.target, dtype=np.int64)


def digit_pools(num_digits: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices into load_digits() whose images may be train tiles, and those that may be test tiles (disjoint)."""
    cut = int(TRAIN_FRACTION * num_digits)
    return np.arange(cut), np.arange(cut, num_digits)


def assemble(tiles: torch.Tensor, picks: np.ndarray, grid: int) -> np.ndarray:
    """Mosaics from ``picks`` ``(n, grid*grid)`` (tile indices, row-major): ``(n, 3*S*S)`` uint8 with S = grid × tile
    side, channel-major, the gray mosaic repeated over 3 channels."""
    n, t = len(picks), tiles.shape[-1]
    side = grid * t
    m = tiles[torch.from_numpy(picks.reshape(-1))].reshape(n, grid, grid, t, t).permute(0, 1, 3, 2, 4)
    m = m.reshape(n, 1, side, side).expand(n, 3, side, side)
    return np.ascontiguousarray(m.numpy()).reshape(n, 3 * side * side)


def make_digit_mosaics(spec: MosaicSpec, *, seed: int = 0):
    """The digit-mosaic dataset of ``spec``, drawn deterministically from ``seed`` (see the module docstring)."""
    tiles, targets = digit_tiles(spec.tile_size)
    pools = digit_pools(len(targets))
    k = spec.grid * spec.grid
    splits, picked = [], []
    for stream, (pool, n) in enumerate(zip(pools, (spec.num_train, spec.num_test), strict=True)):
        picks = np.random.default_rng([seed, 0x6D05, stream]).choice(pool, size=(n, k), replace=True)
        splits.append(MultiLabelSplit(assemble(tiles, picks, spec.grid), label_matrix(targets[picks].tolist(), 10)))
        picked.append(picks)
    return image_dataset(
        "digit_mosaics",
        splits[0],
        splits[1],
        list(LABEL_NAMES),
        spec.grid * spec.tile_size,
        train_tiles=picked[0],
        test_tiles=picked[1],
        digit_pools=[(int(p[0]), int(p[-1]) + 1) for p in pools],
    )
