"""COCO (classification use) from local files, read with torchvision's ``CocoDetection`` (needs ``pycocotools``).

The default layout under ``ROOT``, for split names ``train2014`` and ``val2014``::

    ROOT/annotations/instances_train2014.json     ROOT/train2014/*.jpg
    ROOT/annotations/instances_val2014.json       ROOT/val2014/*.jpg

The split names (``dataset.train_set`` / ``dataset.test_set``) name the image folders and, by default, the
annotation files; ``dataset.train_annotations`` / ``dataset.test_annotations`` give other annotation files. An
image's labels are the categories of its annotations (crowd annotations count); an image with none has an empty
label set. Labels are the training file's categories in id order, named by their ``name``. Images are resized to
``size × size`` with ``torchvision.transforms.v2`` and stored as uint8.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

from torchvision.datasets import CocoDetection

from secure_fed.data.images.common import first_line, image_dataset, image_transform, read_split, require_dir, require_file
from secure_fed.errors import DataError


def _coco(images: Path, annotations: Path, size: int) -> CocoDetection:
    require_file(annotations, "COCO annotation file", "set dataset.train_annotations / dataset.test_annotations")
    require_dir(images, "COCO image folder", "dataset.train_set / dataset.test_set name the folders under dataset.root")
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress lines
            ds = CocoDetection(str(images), str(annotations), transform=image_transform(size))
    except (OSError, ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
        raise DataError(f"cannot read COCO annotations {annotations}: {first_line(exc)}") from None
    for img_id in ds.ids:  # name the first missing image before decoding any
        require_file(os.path.join(images, ds.coco.imgs[img_id]["file_name"]), "COCO image")
    return ds


def load_coco(
    root: str | os.PathLike,
    *,
    size: int = 224,
    train_set: str = "train2014",
    test_set: str = "val2014",
    train_annotations: str | os.PathLike | None = None,
    test_annotations: str | os.PathLike | None = None,
    name: str | None = None,
):
    """The COCO files under ``root`` as an image :class:`~secure_fed.data.MultiLabelDataset`, images
    ``size × size`` (see the module docstring for the layout)."""
    root = Path(root).expanduser()
    require_dir(root, "COCO folder")
    train_ann = (
        Path(train_annotations).expanduser() if train_annotations else root / "annotations" / f"instances_{train_set}.json"
    )
    test_ann = Path(test_annotations).expanduser() if test_annotations else root / "annotations" / f"instances_{test_set}.json"
    train = _coco(root / train_set, train_ann, size)
    test = _coco(root / test_set, test_ann, size)
    cat_ids = sorted(train.coco.cats)
    column = {c: j for j, c in enumerate(cat_ids)}
    unknown = sorted(set(test.coco.cats) - set(column))
    if unknown:
        raise DataError(f"{test_ann} has categories {unknown[:5]} that {train_ann} does not define")
    names = [str(train.coco.cats[c].get("name", c)) for c in cat_ids]

    def labels_of(target: list[dict], i: int, ann: Path) -> list[int]:
        try:
            return [column[a["category_id"]] for a in target]
        except KeyError as exc:
            raise DataError(f"{ann}: an annotation of image {i} has an undefined category ({first_line(exc)})") from None

    def path_of(ds: CocoDetection):
        return lambda i: os.path.join(ds.root, ds.coco.imgs[ds.ids[i]]["file_name"])

    splits = [
        read_split(ds, size, lambda t, i, ann=ann: labels_of(t, i, ann), len(names), path_of(ds))
        for ds, ann in ((train, train_ann), (test, test_ann))
    ]
    return image_dataset(name or root.name, splits[0], splits[1], names, size, format="coco", root=str(root))
