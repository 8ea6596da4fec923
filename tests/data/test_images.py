"""Image datasets: digit mosaics (labels are the digits shown; train and test tiles from disjoint digit images),
and VOC / COCO folders built here with PIL, read through torchvision."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image
from sklearn.datasets import load_digits

from secure_fed.config import load_config, load_plan
from secure_fed.data.from_config import build_dataset
from secure_fed.data.images import VOC_CLASSES, MosaicSpec, load_coco, load_voc, make_digit_mosaics
from secure_fed.errors import DataError

# ------------------------------------------------------------------------------------------- digit mosaics


@pytest.fixture(scope="module")
def digits():
    d = load_digits()
    return np.rint(d.images * (255 / 16)).astype(np.uint8), d.target


def _tiles(x: np.ndarray, grid: int, t: int) -> np.ndarray:
    """(n, grid*grid, t, t): each mosaic's tiles, row-major, from channel 0 (after checking the 3 channels agree)."""
    side = grid * t
    img = x.reshape(len(x), 3, side, side)
    assert (img == img[:, :1]).all()  # gray repeated over 3 channels
    return img[:, 0].reshape(len(x), grid, t, grid, t).transpose(0, 1, 3, 2, 4).reshape(len(x), grid * grid, t, t)


def test_mosaic_labels_are_the_digits_shown(digits):
    """Identify every tile from its pixels alone (the digit images it equals) and check the labels are those digits."""
    images, targets = digits
    by_pixels: dict[bytes, set[int]] = {}
    for im, t in zip(images, targets, strict=True):
        by_pixels.setdefault(im.tobytes(), set()).add(int(t))
    ds = make_digit_mosaics(MosaicSpec(grid=2, tile_size=8, num_train=300, num_test=120), seed=3)
    for split in (ds.train, ds.test):
        tiles = _tiles(split.features, 2, 8)
        expected = np.zeros((split.num_instances, 10), dtype=np.int8)
        for i in range(split.num_instances):
            for tile in tiles[i]:
                shown = by_pixels[tile.tobytes()]  # KeyError: a tile that is no digit image
                assert len(shown) == 1
                expected[i, next(iter(shown))] = 1
        assert np.array_equal(split.labels.toarray(), expected)
    card = ds.train.labels.sum(axis=1).mean()
    assert 3.0 < card < 3.8  # 4 tiles drawn with replacement from 10 digits: 3.44 distinct on average


def test_mosaic_train_and_test_tiles_come_from_disjoint_digit_images(digits):
    images, _ = digits
    ds = make_digit_mosaics(MosaicSpec(grid=2, tile_size=8, num_train=400, num_test=200), seed=0)
    used = {}
    for split, key in ((ds.train, "train_tiles"), (ds.test, "test_tiles")):
        picks = ds.meta[key]
        tiles = _tiles(split.features, 2, 8)
        assert np.array_equal(tiles, images[picks])  # the recorded digit indices are the images shown
        used[key] = set(picks.ravel().tolist())
    assert not used["train_tiles"] & used["test_tiles"]
    assert len(used["train_tiles"]) > 500 and len(used["test_tiles"]) > 250  # both pools are used, not a few images


def test_mosaic_shapes_seed_and_upscaled_tiles(digits):
    images, targets = digits
    spec = MosaicSpec(grid=3, tile_size=12, num_train=50, num_test=20)
    ds = make_digit_mosaics(spec, seed=1)
    assert ds.feature_kind == "image" and ds.meta["image_shape"] == (3, 36, 36) and ds.image_shape == (3, 36, 36)
    assert ds.train.features.shape == (50, 3 * 36 * 36) and ds.train.features.dtype == np.uint8
    assert ds.test.features.shape == (20, 3 * 36 * 36) and ds.label_names == [str(d) for d in range(10)]
    assert "3×36×36 images" in ds.describe()
    picks = ds.meta["train_tiles"]
    assert picks.shape == (50, 9)
    tiles = _tiles(ds.train.features, 3, 12)
    # an upscaled tile still shows its digit: it correlates with a nearest-neighbour upscaling of the 8×8 image
    near = np.arange(12) * 8 // 12
    for i, k in ((0, 0), (7, 4), (49, 8)):
        src = images[picks[i, k]].astype(float)[np.ix_(near, near)]
        assert np.corrcoef(src.ravel(), tiles[i, k].astype(float).ravel())[0, 1] > 0.8
    expected = np.zeros((50, 10), np.int8)
    np.put_along_axis(expected, targets[picks], 1, axis=1)
    assert np.array_equal(ds.train.labels.toarray(), expected)
    again, other = make_digit_mosaics(spec, seed=1), make_digit_mosaics(spec, seed=2)
    assert np.array_equal(again.train.features, ds.train.features)
    assert not np.array_equal(other.train.features, ds.train.features)


def test_mosaics_from_config_follow_the_run_seed():
    ov = ["dataset.name=digit_mosaics", "dataset.mosaics={grid: 2, tile_size: 8, num_train: 30, num_test: 10}"]
    a, b = build_dataset(load_plan(overrides=ov)), build_dataset(load_plan(overrides=[*ov, "seed=5"]))
    assert a.train.features.shape == (30, 3 * 16 * 16) and a.name == "digit_mosaics"
    assert not np.array_equal(a.train.features, b.train.features)


# ------------------------------------------------------------------------------------------------- VOC
COLOURS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255), "white": (255, 255, 255)}
#: image id -> (colour, size, objects as (class, difficult))
VOC_IMAGES = {
    "000001": ("red", (40, 30), [("dog", 0), ("person", 0), ("dog", 0)]),
    "000002": ("green", (25, 50), [("car", 1)]),
    "000003": ("blue", (33, 33), [("tvmonitor", 0), ("aeroplane", 0)]),
    "000004": ("white", (20, 20), [("sheep", 0)]),
}


def _voc_tree(root, sets=None):
    sets = sets or {"trainval": ["000001", "000002", "000003"], "test": ["000004"]}
    for sub in ("JPEGImages", "Annotations", "ImageSets/Main"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for i, (colour, (w, h), objects) in VOC_IMAGES.items():
        Image.new("RGB", (w, h), COLOURS[colour]).save(root / "JPEGImages" / f"{i}.jpg", quality=95)
        objs = "".join(
            f"<object><name>{c}</name><difficult>{d}</difficult><bndbox><xmin>1</xmin><ymin>1</ymin>"
            f"<xmax>5</xmax><ymax>5</ymax></bndbox></object>"
            for c, d in objects
        )
        (root / "Annotations" / f"{i}.xml").write_text(
            f"<annotation><filename>{i}.jpg</filename><size><width>{w}</width><height>{h}</height>"
            f"<depth>3</depth></size>{objs}</annotation>"
        )
    for name, ids in sets.items():
        (root / "ImageSets" / "Main" / f"{name}.txt").write_text("\n".join(ids) + "\n")
    return root


def _vector(names: list[str], label_names) -> list[int]:
    return [int(n in names) for n in label_names]


def _mean_rgb(row: np.ndarray, size: int) -> np.ndarray:
    return row.reshape(3, size, size).reshape(3, -1).mean(axis=1)


def test_voc_folder_loads_label_vectors_and_resized_images(tmp_path):
    root = _voc_tree(tmp_path / "VOC2007")
    ds = load_voc(root, size=24)
    assert ds.name == "VOC2007" and ds.feature_kind == "image" and ds.meta["image_shape"] == (3, 24, 24)
    assert ds.label_names == list(VOC_CLASSES) and len(ds.label_names) == 20
    assert ds.train.features.shape == (3, 3 * 24 * 24) and ds.train.features.dtype == np.uint8
    expected = [
        _vector(["dog", "person"], VOC_CLASSES),
        _vector(["car"], VOC_CLASSES),
        _vector(["tvmonitor", "aeroplane"], VOC_CLASSES),
    ]
    assert ds.train.labels.toarray().tolist() == expected
    assert ds.test.labels.toarray().tolist() == [_vector(["sheep"], VOC_CLASSES)]
    for row, colour in zip(ds.train.features, ("red", "green", "blue"), strict=True):  # channel-major RGB
        assert np.abs(_mean_rgb(row, 24) - COLOURS[colour]).max() < 8
    assert np.abs(_mean_rgb(ds.test.features[0], 24) - 255).max() < 8


def test_voc_from_config_with_image_sets_and_size(tmp_path):
    root = _voc_tree(tmp_path / "voc", sets={"train": ["000002", "000004"], "val": ["000001"]})
    ov = [
        "dataset.format=voc",
        f"dataset.root={root}",
        "dataset.image_size=16",
        "dataset.train_set=train",
        "dataset.test_set=val",
    ]
    ds = build_dataset(load_plan(overrides=ov))
    assert ds.train.features.shape == (2, 3 * 16 * 16) and ds.test.num_instances == 1
    # labels no training image has (here 18 of 20) are dropped by dataset.drop_empty_labels, in both splits
    assert ds.label_names == ["car", "sheep"] and ds.train.labels.toarray().tolist() == [[1, 0], [0, 1]]
    assert ds.test.labels.toarray().tolist() == [[0, 0]]
    same = build_dataset(load_plan(overrides=[x.replace("dataset.root=", "dataset.train=") for x in ov]))
    assert np.array_equal(same.train.features, ds.train.features)  # dataset.train may name the folder instead


def test_voc_missing_image_set_names_the_file(tmp_path):
    root = _voc_tree(tmp_path / "voc", sets={"trainval": ["000001"]})  # a VOC2012-like folder: no test.txt
    with pytest.raises(DataError) as exc:
        load_voc(root)
    msg = str(exc.value)
    assert str(root / "ImageSets" / "Main" / "test.txt") in msg and "dataset.test_set" in msg and "\n" not in msg


def test_voc_missing_image_or_root_names_the_path(tmp_path):
    root = _voc_tree(tmp_path / "voc")
    (root / "JPEGImages" / "000003.jpg").unlink()
    with pytest.raises(DataError, match="VOC image not found: missing .*000003.jpg"):  # before decoding any image
        load_voc(root)
    with pytest.raises(DataError) as exc:
        load_voc(tmp_path / "nowhere")
    assert f"VOC folder not found: missing {tmp_path / 'nowhere'} (" in str(exc.value)
    with pytest.raises(DataError, match=str(tmp_path / "nowhere")):
        build_dataset(load_plan(overrides=["dataset.format=voc", f"dataset.root={tmp_path / 'nowhere'}"]))


def test_voc_unknown_class_names_the_annotation(tmp_path):
    root = _voc_tree(tmp_path / "voc")
    ann = root / "Annotations" / "000002.xml"
    ann.write_text(ann.read_text().replace("<name>car</name>", "<name>unicorn</name>"))
    with pytest.raises(DataError, match="unicorn") as exc:
        load_voc(root)
    assert str(ann) in str(exc.value)


# ------------------------------------------------------------------------------------------------ COCO
CATEGORIES = [{"id": 1, "name": "person"}, {"id": 3, "name": "car"}, {"id": 18, "name": "dog"}]


def _coco_tree(root):
    (root / "annotations").mkdir(parents=True)
    splits = {
        "train2014": [("a.jpg", "red", [1, 18, 1]), ("b.jpg", "green", [3]), ("c.jpg", "blue", [])],
        "val2014": [("d.jpg", "white", [18, 3])],
    }
    next_ann = 1
    for split, items in splits.items():
        (root / split).mkdir()
        images, anns = [], []
        for k, (fname, colour, cats) in enumerate(items):
            Image.new("RGB", (30 + k, 20), COLOURS[colour]).save(root / split / fname, quality=95)
            img_id = 100 * (split == "val2014") + k + 1
            images.append({"id": img_id, "file_name": fname, "width": 30 + k, "height": 20})
            for c in cats:
                anns.append(
                    {"id": next_ann, "image_id": img_id, "category_id": c, "bbox": [1, 1, 4, 4], "area": 16, "iscrowd": 0}
                )
                next_ann += 1
        doc = {"images": images, "annotations": anns, "categories": CATEGORIES}
        (root / "annotations" / f"instances_{split}.json").write_text(json.dumps(doc))
    return root


def test_coco_folder_loads_label_vectors_and_resized_images(tmp_path):
    root = _coco_tree(tmp_path / "coco")
    ds = load_coco(root, size=20)
    assert ds.label_names == ["person", "car", "dog"] and ds.feature_kind == "image"
    assert ds.train.features.shape == (3, 3 * 20 * 20) and ds.meta["image_shape"] == (3, 20, 20)
    assert ds.train.labels.toarray().tolist() == [[1, 0, 1], [0, 1, 0], [0, 0, 0]]  # c.jpg has no annotation
    assert ds.test.labels.toarray().tolist() == [[0, 1, 1]]
    for row, colour in zip(ds.train.features, ("red", "green", "blue"), strict=True):
        assert np.abs(_mean_rgb(row, 20) - COLOURS[colour]).max() < 8


def test_coco_from_config_with_annotation_files(tmp_path):
    root = _coco_tree(tmp_path / "coco")
    moved = tmp_path / "elsewhere.json"
    (root / "annotations" / "instances_val2014.json").rename(moved)
    ov = ["dataset.format=coco", f"dataset.root={root}", "dataset.image_size=16", "dataset.drop_empty_labels=false"]
    with pytest.raises(DataError) as exc:
        build_dataset(load_plan(overrides=ov))
    assert f"COCO annotation file not found: missing {root / 'annotations' / 'instances_val2014.json'}" in str(exc.value)
    ds = build_dataset(load_plan(overrides=[*ov, f"dataset.test_annotations={moved}"]))
    assert ds.test.labels.toarray().tolist() == [[0, 1, 1]] and ds.train.features.shape == (3, 3 * 16 * 16)


def test_coco_missing_image_or_bad_json_names_the_file(tmp_path):
    root = _coco_tree(tmp_path / "coco")
    (root / "train2014" / "b.jpg").unlink()
    with pytest.raises(DataError, match="COCO image not found: missing .*b.jpg"):
        load_coco(root)
    root2 = _coco_tree(tmp_path / "coco2")
    bad = root2 / "annotations" / "instances_train2014.json"
    bad.write_text("{not json")
    with pytest.raises(DataError) as exc:
        load_coco(root2)
    assert str(bad) in str(exc.value)
    with pytest.raises(DataError, match=str(tmp_path / "none")):
        load_coco(tmp_path / "none")


def test_coco_categories_the_training_file_does_not_define_are_refused(tmp_path):
    root = _coco_tree(tmp_path / "coco")
    val = root / "annotations" / "instances_val2014.json"
    doc = json.loads(val.read_text())
    doc["categories"].append({"id": 99, "name": "zebra"})
    val.write_text(json.dumps(doc))
    with pytest.raises(DataError, match=r"categories \[99\]"):
        load_coco(root)
    root2 = _coco_tree(tmp_path / "coco2")
    train = root2 / "annotations" / "instances_train2014.json"
    doc = json.loads(train.read_text())
    doc["annotations"][0]["category_id"] = 42  # an annotation of a category the file does not list
    train.write_text(json.dumps(doc))
    with pytest.raises(DataError, match="undefined category") as exc:
        load_coco(root2)
    assert str(train) in str(exc.value)


def test_image_settings_of_another_format_are_refused():
    from secure_fed.errors import ConfigError

    with pytest.raises(ConfigError, match="dataset.train_set"):
        load_config(overrides=["dataset.train_set=trainval"])
    with pytest.raises(ConfigError, match="annotation"):
        load_config(overrides=["dataset.format=voc", "dataset.root=/x", "dataset.train_annotations=a.json"])
    with pytest.raises(ConfigError, match="dataset.root"):
        load_config(overrides=["dataset.format=coco"])
    with pytest.raises(ConfigError, match="dataset.mosaics"):
        load_config(overrides=["dataset.name=digit_mosaics", "dataset.mosaics.grid=8", "dataset.mosaics.tile_size=256"])


def test_dense_features_are_never_taken_for_bag_of_words():
    import scipy.sparse as sp

    from secure_fed.data import MultiLabelSplit
    from secure_fed.data.registry import _looks_sparse

    binary = (np.arange(200).reshape(20, 10) % 7 == 0).astype(np.float32)  # 0/1 values, 14% dense
    labels = sp.csr_matrix(np.ones((20, 1), np.int8))
    assert _looks_sparse(MultiLabelSplit(sp.csr_matrix(binary), labels))
    assert not _looks_sparse(MultiLabelSplit(binary, labels))
