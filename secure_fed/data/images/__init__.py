"""Image datasets, read and resized with torchvision: digit mosaics (generated, no download), Pascal VOC and
COCO layouts on local disk.

Every loader returns a :class:`~secure_fed.data.MultiLabelDataset` with ``feature_kind="image"``: each row is
one RGB image flattened in channel-major order, ``(3*H*W,)`` uint8, and ``meta["image_shape"]`` is
``(3, H, W)``. The modules import torch and torchvision; import them only where images are loaded (the engine's
builders do), so that ``secure-fed validate`` and ``list`` stay torch-free.
"""

from secure_fed.data.images.coco import load_coco
from secure_fed.data.images.mosaics import MosaicSpec, make_digit_mosaics
from secure_fed.data.images.voc import VOC_CLASSES, load_voc

__all__ = ["VOC_CLASSES", "MosaicSpec", "load_coco", "load_voc", "make_digit_mosaics"]
