"""Pascal VOC (classification use) from a local directory, read with torchvision's ``VOCDetection``.

The directory is a VOC year's own folder (e.g. ``VOCdevkit/VOC2007``)::

    ROOT/JPEGImages/ID.jpg
    ROOT/Annotations/ID.xml
    ROOT/ImageSets/Main/{train,val,trainval,test}.txt     (one image id per line)

``torchvision.datasets.VOCDetection`` expects ``ROOT/VOCdevkit/VOC<year>`` and a fixed list of image-set names,
so :class:`LocalVOCDetection` points it at the folder itself; its ``__getitem__`` (PIL decoding, the XML parsing of
``VOCDetection.parse_voc_xml``) is torchvision's, and nothing is downloaded. An image's labels are the classes of
its annotated objects (objects marked ``difficult`` count too). Images are resized to ``size × size`` with
``torchvision.transforms.v2`` and stored as uint8.
"""

from __future__ import annotations

import os
from pathlib import Path

from torchvision.datasets import VOCDetection
from torchvision.datasets.vision import VisionDataset

from secure_fed.data.images.common import image_dataset, image_transform, read_split, require_dir, require_file
from secure_fed.errors import DataError

#: the 20 VOC classes, in the order of the label columns
VOC_CLASSES = (
    "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor",
)  # fmt: skip
_INDEX = {name: i for i, name in enumerate(VOC_CLASSES)}


class LocalVOCDetection(VOCDetection):
    """torchvision's ``VOCDetection`` on a plain VOC folder (no ``VOCdevkit/VOC<year>`` nesting) with any image-set
    name; it never downloads. Items are ``(transformed image, parsed XML dict)`` as in ``VOCDetection``."""

    def __init__(self, root: str | os.PathLike, image_set: str, transform=None):
        """The images listed in ``ROOT/ImageSets/Main/IMAGE_SET.txt``; a missing list, image or annotation file is a
        one-line :class:`DataError` naming it."""
        VisionDataset.__init__(self, str(root), transform=transform)  # VOCDetection.__init__ wants VOCdevkit/VOC<year>
        self.image_set = image_set
        split_file = Path(root) / "ImageSets" / self._SPLITS_DIR / f"{image_set}.txt"
        require_file(split_file, "VOC image set", "set dataset.train_set / dataset.test_set to a file there, e.g. val")
        ids = [line.strip() for line in split_file.read_text().splitlines() if line.strip()]
        self.images = [os.path.join(root, "JPEGImages", f"{i}.jpg") for i in ids]
        self.targets = [os.path.join(root, self._TARGET_DIR, f"{i}{self._TARGET_FILE_EXT}") for i in ids]
        for img, ann in zip(self.images, self.targets, strict=True):  # name the first missing file, before decoding
            require_file(img, "VOC image")
            require_file(ann, "VOC annotation")


def voc_labels(target: dict, where: str = "") -> list[int]:
    """Label indices of a parsed VOC annotation: the classes of its objects."""
    objects = target.get("annotation", {}).get("object", [])
    if isinstance(objects, dict):
        objects = [objects]
    out = []
    for obj in objects:
        name = str(obj.get("name", "")).strip()
        if name not in _INDEX:
            raise DataError(f"{where}: unknown VOC class '{name}' (expected one of the 20 VOC classes)")
        out.append(_INDEX[name])
    return out


def load_voc(
    root: str | os.PathLike, *, size: int = 224, train_set: str = "trainval", test_set: str = "test", name: str | None = None
):
    """The VOC folder ``root`` as an image :class:`~secure_fed.data.MultiLabelDataset` (20 labels), images
    ``size × size``; ``train_set`` / ``test_set`` name files of ``ROOT/ImageSets/Main``."""
    root = Path(root).expanduser()
    hint = "dataset.root must be a VOC year's folder, e.g. VOCdevkit/VOC2007"
    require_dir(root, "VOC folder", hint)
    for sub in ("JPEGImages", "Annotations", os.path.join("ImageSets", "Main")):
        require_dir(root / sub, "VOC folder", hint)
    splits = []
    for image_set in (train_set, test_set):
        ds = LocalVOCDetection(root, image_set, transform=image_transform(size))
        splits.append(
            read_split(
                ds,
                size,
                lambda t, i, ds=ds: voc_labels(t, where=ds.targets[i]),
                len(VOC_CLASSES),
                lambda i, ds=ds: f"{ds.images[i]} / {ds.targets[i]}",
            )
        )
    return image_dataset(name or root.name, splits[0], splits[1], list(VOC_CLASSES), size, format="voc", root=str(root))
