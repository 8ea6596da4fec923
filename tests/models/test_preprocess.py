"""Preprocessing takes CSR or dense features alike; ``image`` uses ImageNet's public constants only."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from secure_fed.data import MultiLabelSplit, as_dense, row_nnz
from secure_fed.models.preprocess import IMAGENET_MEAN, IMAGENET_STD, Preprocessor


@pytest.mark.parametrize("kind", ["standardize", "rsqrt_nnz", "none"])
def test_dense_and_csr_features_preprocess_the_same(kind):
    rng = np.random.default_rng(0)
    dense = (rng.random((20, 7)) * (rng.random((20, 7)) < 0.4)).astype(np.float32)
    csr = sp.csr_matrix(dense)
    a = Preprocessor.fit(kind, csr).transform(csr)
    b = Preprocessor.fit(kind, dense).transform(dense)
    assert a.dtype == b.dtype == np.float32 and np.array_equal(a, b)
    if kind == "rsqrt_nnz":
        nnz = (dense != 0).sum(axis=1)
        assert np.allclose(b, dense / np.sqrt(np.maximum(nnz, 1))[:, None])
    if kind == "none":
        b[0, 0] = 99.0
        assert dense[0, 0] != 99.0  # a copy: the caller may write to it


def test_image_preprocessing_uses_imagenet_constants_per_channel():
    img = np.zeros((2, 3, 4, 5), np.uint8)
    img[0, 0], img[0, 1], img[0, 2] = 255, 0, 51  # R, G, B planes of image 0
    img[1] = 255
    x = img.reshape(2, -1)
    fitted_on_other_data = Preprocessor.fit("image", np.full((9, 60), 7, np.uint8))
    out = fitted_on_other_data.transform(x).reshape(2, 3, 4, 5)
    mean, std = np.array(IMAGENET_MEAN), np.array(IMAGENET_STD)
    assert out.dtype == np.float32
    assert np.allclose(out[0, :, 0, 0], (np.array([1.0, 0.0, 0.2]) - mean) / std, atol=1e-6)
    assert np.allclose(out[1], ((1.0 - mean) / std)[:, None, None], atol=1e-6)
    as_float = fitted_on_other_data.transform(x.astype(np.float32) / 255)  # float pixels are taken to be in [0, 1]
    assert np.allclose(as_float, out.reshape(2, -1), atol=1e-6)
    with pytest.raises(ValueError, match="RGB"):
        Preprocessor.fit("image", np.zeros((2, 10), np.uint8))


def test_image_preprocessing_in_chunks_matches_the_formula():
    from secure_fed.models import preprocess

    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, size=(preprocess._CHUNK + 3, 12), dtype=np.uint8)
    out = Preprocessor.fit("image", x).transform(x)
    expected = (x.reshape(-1, 3, 4) / 255.0 - np.array(IMAGENET_MEAN)[:, None]) / np.array(IMAGENET_STD)[:, None]
    assert np.allclose(out, expected.reshape(len(x), 12), atol=1e-5)


def test_dense_split_helpers_and_checks():
    x = np.array([[0, 2, 0], [1, 1, 1]], np.uint8)
    assert as_dense(x) is x and np.array_equal(as_dense(sp.csr_matrix(x)), x)
    assert row_nnz(x).tolist() == [1, 3] == row_nnz(sp.csr_matrix(x)).tolist()
    labels = sp.csr_matrix(np.eye(2, dtype=np.int8))
    assert MultiLabelSplit(x, labels).is_dense and not MultiLabelSplit(sp.csr_matrix(x, dtype=np.float32), labels).is_dense
    with pytest.raises(ValueError, match="float32 or uint8"):
        MultiLabelSplit(x.astype(np.float64), labels)
    with pytest.raises(ValueError, match="2-D"):
        MultiLabelSplit(x.ravel(), labels)
