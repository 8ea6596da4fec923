import numpy as np
import pytest

from secure_fed.data import load_registered, read_arff, read_label_names
from secure_fed.errors import DataError

# (train rows, test rows, features, labels) from the Mulan dataset pages / FedALC Table VI
EXPECTED = {
    "bibtex": (4880, 2515, 1836, 159),
    "scene": (1211, 1196, 294, 6),
    "yeast": (1500, 917, 103, 14),
    "emotions": (391, 202, 72, 6),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_registered_datasets_have_exact_counts(data_root, name):
    ds = load_registered(name, data_root)
    n_tr, n_te, d, n_l = EXPECTED[name]
    assert ds.train.features.shape == (n_tr, d)
    assert ds.test.features.shape == (n_te, d)
    assert ds.train.labels.shape == (n_tr, n_l) and ds.test.labels.shape == (n_te, n_l)
    assert len(ds.label_names) == n_l
    assert set(np.unique(ds.train.labels.data)) <= {1}


def test_bibtex_first_row_matches_file(bibtex):
    # first training row of bibtex-train.arff starts "{0 1,5 1,6 1,20 1,..."
    row = bibtex.train.features[0]
    assert list(row.indices[:4]) == [0, 5, 6, 20]
    assert bibtex.label_names[0] == "TAG_2005"
    assert bibtex.feature_kind == "sparse"


DENSE = """% comment
@relation t
@attribute lab_b {0,1}
@attribute f1 numeric
@attribute 'f 2' numeric
@attribute lab_a {0,1}
@data
1,0.5,-2,0
0,1.5,0,1
"""

SPARSE = """@relation t
@attribute lab_b {0,1}
@attribute f1 numeric
@attribute 'f 2' numeric
@attribute lab_a {0,1}
@data
{0 1,1 0.5,2 -2}
{1 1.5,3 1}
{}
"""

XML = """<?xml version="1.0" encoding="utf-8"?>
<labels xmlns="http://mulan.sourceforge.net/labels"><label name="lab_a"></label><label name="lab_b"></label></labels>
"""


@pytest.mark.parametrize("body", [DENSE, SPARSE])
def test_dense_and_sparse_rows_and_label_names_not_positions(tmp_path, body):
    (tmp_path / "d.arff").write_text(body)
    (tmp_path / "d.xml").write_text(XML)
    names = read_label_names(tmp_path / "d.xml")
    split = read_arff(tmp_path / "d.arff", names)
    assert names == ["lab_a", "lab_b"]
    np.testing.assert_allclose(split.features.toarray()[:2], [[0.5, -2.0], [1.5, 0.0]])
    # label columns follow the XML order, wherever the attributes stand in the ARFF
    np.testing.assert_array_equal(split.labels.toarray()[:2], [[0, 1], [1, 0]])


def test_missing_label_attribute_is_a_clear_error(tmp_path):
    (tmp_path / "d.arff").write_text(DENSE)
    with pytest.raises(DataError, match="missing in the ARFF"):
        read_arff(tmp_path / "d.arff", ["lab_a", "nope"])


def test_malformed_row_names_file_and_line(tmp_path):
    (tmp_path / "d.arff").write_text(DENSE.replace("0,1.5,0,1", "0,abc,0,1"))
    with pytest.raises(DataError, match=r"d\.arff:9"):
        read_arff(tmp_path / "d.arff", ["lab_a", "lab_b"])
