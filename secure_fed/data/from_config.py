"""A run plan's data: the dataset it names or points at, loaded without torch (``secure-fed validate`` uses it for
the memory estimate; the engine builds everything else on top of it)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from secure_fed.data.dataset import MultiLabelDataset, MultiLabelSplit
from secure_fed.data.registry import GENERATED, load_from_paths, load_registered, registered_root
from secure_fed.data.synthetic import SyntheticSpec, make_synthetic
from secure_fed.data.xc import missing_file_error
from secure_fed.errors import DataError

if TYPE_CHECKING:
    from secure_fed.plan import DatasetPlan, RunPlan


def build_dataset(plan: RunPlan, data_root: str | None = None) -> MultiLabelDataset:
    """The planned data; labels no training instance has are dropped (``dataset.drop_empty_labels``, which the plan
    resolves: ``auto`` drops them unless the ``dp`` layer is on, since which labels have one is a fact about the
    private data, released through W's shape)."""
    ds = _load_dataset(plan.dataset, plan.seed, data_root)
    if plan.dataset.evaluate_on == "validation":
        ds = validation_dataset(ds, plan.dataset.validation_fraction, plan.dataset.split_seed)
    if ds.train.labels.nnz == 0:
        raise DataError(f"{ds.name}: no training instance has a positive label; nothing can be learned")
    if plan.dataset.drop_empty_labels:
        ds, dropped = ds.without_empty_labels()
        if dropped:
            shown = ", ".join(dropped[:5]) + (f" and {len(dropped) - 5} more" if len(dropped) > 5 else "")
            print(f"note: dropped {len(dropped)} label(s) with no training instance ({shown}); dataset.drop_empty_labels")
    return ds


def validation_dataset(ds: MultiLabelDataset, fraction: float, seed: int) -> MultiLabelDataset:
    """``ds`` with its test split replaced by a validation split: ⌊fraction·n⌋ training rows drawn by ``seed`` (a
    permutation; the same rows for every run seed), the rest kept as the training split in their order. The test
    split is not read again, so a recipe chosen on these metrics never saw it."""
    n = ds.train.num_instances
    k = int(fraction * n)
    if k < 1 or k >= n:
        raise DataError(f"{ds.name}: dataset.validation_fraction {fraction:g} of {n} training rows leaves an empty split")
    held = np.zeros(n, dtype=bool)
    held[np.random.default_rng(seed).permutation(n)[:k]] = True

    def rows(mask: np.ndarray) -> MultiLabelSplit:
        idx = np.flatnonzero(mask)
        return MultiLabelSplit(features=ds.train.features[idx], labels=ds.train.labels[idx])

    meta = {**ds.meta, "evaluated_on": f"validation: {k} of the {n} training rows (split_seed {seed})"}
    return dataclasses.replace(ds, train=rows(~held), test=rows(held), meta=meta)


def check_data_files(d: DatasetPlan, data_root: str | None = None) -> None:
    """Raise the loader's own :class:`DataError` for a data file that does not exist, without reading any: a
    configured file (``dataset.format`` arff or xc), or a registered dataset's file under the data root (``data_root``,
    else ``dataset.root``, else ``$SECURE_FED_DATA``). ``secure-fed run`` calls it before importing torch, ``validate``
    before it calls the config valid, a deployment before it starts any process."""
    if d.format is None and d.name not in GENERATED:
        registered_root(d.name, data_root or d.root)
        return
    if d.format not in ("arff", "xc"):
        return
    what = {"train": "data file", "test": "data file", "labels": "label list", "train_split": "split file",
            "test_split": "split file"}  # fmt: skip
    for key, kind in what.items():  # the readers' own wording (secure_fed.data.arff, .xc, .registry)
        path = getattr(d, key)
        if path is None or Path(path).is_file():
            continue
        if d.format == "xc" and kind == "data file":
            raise missing_file_error(path)
        raise DataError(f"{kind} not found: {path}")


def _load_dataset(d: DatasetPlan, seed: int, data_root: str | None = None) -> MultiLabelDataset:
    if d.format in ("voc", "coco") or (d.format is None and d.name == "digit_mosaics"):
        return _with_feature_kind(_load_images(d, seed, data_root), d.feature_kind)
    if d.format is not None:
        return load_from_paths(
            format=d.format,
            train=d.train,
            test=d.test,
            labels=d.labels,
            train_split=d.train_split,
            test_split=d.test_split,
            fold=d.fold,
            test_fraction=d.test_fraction,
            split_seed=d.split_seed,
            drop_attributes=list(d.drop_attributes),
            feature_kind=d.feature_kind,
            name=d.name if d.name != "synthetic" else None,
        )
    if d.name == "synthetic":
        return make_synthetic(SyntheticSpec(**dataclasses.asdict(d.synthetic)), seed=seed)
    return _with_feature_kind(
        load_registered(d.name, data_root or d.root, drop_attributes=list(d.drop_attributes)), d.feature_kind
    )


def _with_feature_kind(ds: MultiLabelDataset, kind: str) -> MultiLabelDataset:
    """``ds`` relabelled with ``dataset.feature_kind`` when that is not ``auto`` (e.g. pixels as ``dense`` features
    for an MLP)."""
    if kind != "auto" and kind != ds.feature_kind:
        ds = MultiLabelDataset(ds.name, ds.train, ds.test, ds.label_names, kind, ds.meta)
    return ds


def _load_images(d: DatasetPlan, seed: int, data_root: str | None) -> MultiLabelDataset:
    """Digit mosaics (generated from the run seed), or a VOC / COCO folder: ``dataset.train`` if given, else
    ``--data-root``, else ``dataset.root``."""
    from secure_fed.data.images import MosaicSpec, load_coco, load_voc, make_digit_mosaics  # torchvision: on demand

    if d.format is None:
        return make_digit_mosaics(MosaicSpec(**dataclasses.asdict(d.mosaics)), seed=seed)
    root = d.train or data_root or d.root
    name = d.name if d.name not in GENERATED else None
    if d.format == "voc":
        return load_voc(root, size=d.image_size, train_set=d.train_set or "trainval", test_set=d.test_set or "test", name=name)
    return load_coco(
        root,
        size=d.image_size,
        train_set=d.train_set or "train2014",
        test_set=d.test_set or "val2014",
        train_annotations=d.train_annotations,
        test_annotations=d.test_annotations,
        name=name,
    )
