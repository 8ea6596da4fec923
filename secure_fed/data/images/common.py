"""What the image loaders share: torchvision's resize pipeline, and packing images and label sets into a split."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from xml.etree.ElementTree import ParseError

import numpy as np
import scipy.sparse as sp
import torch
from torchvision.transforms import v2

from secure_fed.data.dataset import MultiLabelDataset, MultiLabelSplit
from secure_fed.errors import DataError


def image_transform(size: int) -> v2.Compose:
    """torchvision's v2 pipeline from a PIL image to a ``(3, size, size)`` uint8 tensor (bilinear, antialiased;
    the aspect ratio is not kept, as is usual for multi-label image classification)."""
    return v2.Compose([v2.ToImage(), v2.Resize((size, size), antialias=True), v2.ToDtype(torch.uint8)])


def label_matrix(label_sets: Sequence[Sequence[int]], num_labels: int) -> sp.csr_matrix:
    """``(n, num_labels)`` int8 CSR with a 1 at each label of each row's label set."""
    rows = [i for i, labels in enumerate(label_sets) for _ in set(labels)]
    cols = [j for labels in label_sets for j in sorted(set(labels))]
    data = np.ones(len(rows), dtype=np.int8)
    return sp.csr_matrix((data, (rows, cols)), shape=(len(label_sets), num_labels), dtype=np.int8)


def read_split(
    dataset: torch.utils.data.Dataset,
    size: int,
    labels_of: Callable[[object, int], list[int]],
    num_labels: int,
    path_of: Callable[[int], str],
) -> MultiLabelSplit:
    """Every item of a torchvision dataset (whose transform is :func:`image_transform`) as one split.

    ``labels_of(target, i)`` maps item i's target to its label indices; ``path_of(i)`` names item i's files in the one-line
    :class:`DataError` raised when an image or annotation cannot be read.
    """
    n = len(dataset)
    pixels = np.empty((n, 3 * size * size), dtype=np.uint8)
    label_sets: list[list[int]] = []
    for i in range(n):
        try:
            img, target = dataset[i]
        except FileNotFoundError as exc:
            raise DataError(f"missing {exc.filename or path_of(i)}") from None
        except (OSError, ParseError, ValueError) as exc:  # PIL's UnidentifiedImageError is an OSError
            raise DataError(f"cannot read {path_of(i)}: {first_line(exc)}") from None
        pixels[i] = img.numpy().reshape(-1)
        label_sets.append(labels_of(target, i))
    return MultiLabelSplit(pixels, label_matrix(label_sets, num_labels))


def first_line(exc: BaseException) -> str:
    """``TypeName: first line of the message`` of an exception, for one-line errors."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def image_dataset(
    name: str, train: MultiLabelSplit, test: MultiLabelSplit, label_names: list[str], size: int, **meta
) -> MultiLabelDataset:
    """An image :class:`MultiLabelDataset`: ``feature_kind="image"``, ``meta["image_shape"] = (3, size, size)``."""
    return MultiLabelDataset(name, train, test, label_names, "image", {"image_shape": (3, size, size), **meta})


def require_file(path: str | os.PathLike, what: str, hint: str = "") -> None:
    """A one-line :class:`DataError` naming ``path`` when it is not a file."""
    if not os.path.isfile(path):
        raise DataError(f"{what} not found: missing {path}" + (f" ({hint})" if hint else ""))


def require_dir(path: str | os.PathLike, what: str, hint: str = "") -> None:
    """A one-line :class:`DataError` naming ``path`` when it is not a directory."""
    if not os.path.isdir(path):
        raise DataError(f"{what} not found: missing {path}" + (f" ({hint})" if hint else ""))
