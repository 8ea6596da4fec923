"""Datasets by name, and datasets by path.

Named datasets live under a *data root*, resolved in this order: the explicit
``root`` argument (config ``dataset.root`` or ``--data-root``), then the
``SECURE_FED_DATA`` environment variable, then ``~/.cache/secure-fed/data``.
Files are laid out as ``ROOT/mulan/NAME/NAME-{train,test}.arff`` plus
``ROOT/mulan/NAME/NAME.xml``, exactly as ``secure-fed data download`` writes them.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from secure_fed.data.arff import read_arff, read_label_names
from secure_fed.data.dataset import MultiLabelDataset, MultiLabelSplit
from secure_fed.data.xc import cut_by_fold_files, read_xc, read_xc_split, seeded_split
from secure_fed.errors import DataError

DEFAULT_ROOT = Path.home() / ".cache" / "secure-fed" / "data"


@dataclass(frozen=True)
class RegisteredDataset:
    name: str
    description: str
    feature_kind: str  # "sparse" (bag of words) or "dense" (numeric)
    files: tuple[str, ...]  # relative to the data root; train, test, label list

    @property
    def train(self) -> str:
        return self.files[0]

    @property
    def test(self) -> str:
        return self.files[1]

    @property
    def labels(self) -> str:
        return self.files[2]


def _mulan(name: str, description: str, kind: str) -> RegisteredDataset:
    base = f"mulan/{name}/{name}"
    return RegisteredDataset(name, description, kind, (f"{base}-train.arff", f"{base}-test.arff", f"{base}.xml"))


REGISTRY: dict[str, RegisteredDataset] = {
    d.name: d
    for d in (
        _mulan("bibtex", "BibSonomy tags; 4880/2515, 1836 binary word features, 159 labels", "sparse"),
        _mulan("scene", "scene images; 1211/1196, 294 numeric features, 6 labels", "dense"),
        _mulan("yeast", "yeast genes; 1500/917, 103 numeric features, 14 labels", "dense"),
        _mulan("emotions", "music clips; 391/202, 72 numeric features, 6 labels", "dense"),
    )
}


#: datasets generated in memory rather than read from the data root (``dataset.name``), with descriptions
GENERATED: dict[str, str] = {
    "synthetic": "generated multi-label data with controllable label co-occurrence",
    "digit_mosaics": "grid×grid mosaics of scikit-learn's 8×8 digits (no download), labelled by the digits shown; images",
}


def resolve_root(root: str | os.PathLike | None = None) -> Path:
    """The data root: ``root`` if given, else ``$SECURE_FED_DATA``, else the user cache."""
    if root:
        return Path(root).expanduser()
    env = os.environ.get("SECURE_FED_DATA")
    if env:
        return Path(env).expanduser()
    return DEFAULT_ROOT


def registered_root(name: str, root: str | os.PathLike | None = None) -> Path:
    """The data root that holds every file of the registered dataset ``name``, checked without reading them; a
    :class:`DataError` naming the first missing file (and the command that fetches it), or the unknown name."""
    if name not in REGISTRY:
        raise DataError(f"unknown dataset '{name}'; known: {', '.join(sorted(REGISTRY))}, synthetic")
    base = resolve_root(root)
    missing = [base / f for f in REGISTRY[name].files if not (base / f).is_file()]
    if missing:
        raise DataError(
            f"dataset '{name}' not found: missing {missing[0]} (fetch it with: secure-fed data download {name} --root {base})"
        )
    return base


def load_registered(
    name: str, root: str | os.PathLike | None = None, *, drop_attributes: Sequence[str] = ()
) -> MultiLabelDataset:
    """Load a named dataset from the data root, with a clear error if files are missing; ``drop_attributes``: feature
    attributes to leave out."""
    base = registered_root(name, root)
    paths = [base / f for f in REGISTRY[name].files]
    names = read_label_names(paths[2])
    train = read_arff(paths[0], names, drop=drop_attributes)
    test = read_arff(paths[1], names, drop=drop_attributes)
    return MultiLabelDataset(name, train, test, names, REGISTRY[name].feature_kind, {"root": str(base)})


def load_from_paths(
    *,
    format: str,
    train: str | os.PathLike,
    test: str | os.PathLike | None = None,
    labels: str | os.PathLike | None = None,
    train_split: str | os.PathLike | None = None,
    test_split: str | os.PathLike | None = None,
    fold: int = 0,
    feature_kind: str = "auto",
    name: str | None = None,
    test_fraction: float = 0.3,
    split_seed: int = 0,
    drop_attributes: Sequence[str] = (),
) -> MultiLabelDataset:
    """Load a user's own dataset from file paths.

    ``format="arff"``: ``train`` and ``test`` ARFF files plus ``labels`` (Mulan XML); a data set shipped as one ARFF
    file (no ``test``) is cut by ``train_split``/``test_split`` fold files, or else by a seeded random
    ``test_fraction`` of its rows (``split_seed``); ``drop_attributes`` leaves feature attributes out.
    ``format="xc"``: ``train`` and ``test`` XC files, or one XC file in ``train``
    cut by ``train_split``/``test_split`` fold files (``fold`` picks the column).

    A file the readers cannot parse (a fold file with a word in it, a label list that is not UTF-8, …) is a
    :class:`DataError` naming the files, never a traceback.
    """
    files = {"train": train, "test": test, "labels": labels, "train_split": train_split, "test_split": test_split}
    try:
        return _load_from_paths(format=format, **files, fold=fold, feature_kind=feature_kind, name=name,
                                test_fraction=test_fraction, split_seed=split_seed, drop_attributes=drop_attributes)  # fmt: skip
    except DataError:
        raise
    except (ValueError, KeyError, IndexError, UnicodeDecodeError) as exc:  # a parser's complaint about a file's content
        named = ", ".join(f"{k} {v}" for k, v in files.items() if v is not None)
        raise DataError(f"dataset ({named}) cannot be read: {type(exc).__name__}: {exc}") from None


def _load_from_paths(
    *, format, train, test, labels, train_split, test_split, fold, feature_kind, name, test_fraction, split_seed,
    drop_attributes,
) -> MultiLabelDataset:  # fmt: skip
    if format == "arff":
        if labels is None:
            raise DataError("format 'arff' needs dataset.labels (the Mulan XML label list)")
        names = read_label_names(labels)
        read = functools.partial(read_arff, label_names=names, drop=drop_attributes)
        if test is not None:
            tr, te = read(train), read(test)
        elif train_split is not None or test_split is not None:
            if train_split is None or test_split is None:
                raise DataError("format 'arff' with fold files needs both dataset.train_split and dataset.test_split")
            tr, te = cut_by_fold_files(read(train), train_split, test_split, fold=fold, source=train)
        else:
            tr, te = seeded_split(read(train), test_fraction=test_fraction, seed=split_seed)
    elif format == "xc":
        if drop_attributes:
            raise DataError("dataset.drop_attributes applies to format 'arff' (XC files have no named attributes)")
        if train_split is not None or test_split is not None:
            if train_split is None or test_split is None:
                raise DataError("format 'xc' with fold files needs both dataset.train_split and dataset.test_split")
            tr, te = read_xc_split(train, train_split, test_split, fold=fold)
        else:
            if test is None:
                raise DataError("format 'xc' needs dataset.test (or dataset.train_split/test_split)")
            tr, te = read_xc(train), read_xc(test)
            if tr.labels.shape[1] != te.labels.shape[1]:
                raise DataError(f"{train} and {test} disagree on the number of labels")
        n_labels = tr.labels.shape[1]
        names = [f"label_{i}" for i in range(n_labels)]
        if labels is not None:
            lp = Path(labels)
            if not lp.is_file():
                raise DataError(f"label list not found: {lp}")
            names = [ln.strip() for ln in lp.read_text(encoding="utf-8").splitlines() if ln.strip()]
            if len(names) != n_labels:
                raise DataError(f"{lp} lists {len(names)} labels but the data has {n_labels}")
    else:
        raise DataError(f"unknown dataset format '{format}' (use 'arff' or 'xc')")
    if feature_kind == "auto":  # XC files are bag-of-words features (tf-idf values): the sparse text network's input
        feature_kind = "sparse" if format == "xc" or _looks_sparse(tr) else "dense"
    return MultiLabelDataset(name or Path(train).stem, tr, te, names, feature_kind, {"format": format})


def _looks_sparse(split: MultiLabelSplit) -> bool:
    """Bag-of-words style: a CSR matrix under 20% dense with 0/1 values (a dense array never is)."""
    x = split.features
    if split.is_dense:
        return False
    density = x.nnz / max(1, x.shape[0] * x.shape[1])
    return density < 0.2 and bool(np.all(np.isin(x.data[:10000], (0.0, 1.0))))
