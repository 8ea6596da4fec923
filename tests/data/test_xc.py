import numpy as np
import pytest

from secure_fed.data import read_xc, read_xc_split
from secure_fed.errors import DataError

XC = """4 5 3
0,2 0:1 3:0.5
 1:2 4:1
1 2:1
0,1,2 0:1 1:1
"""


def test_xc_rows_including_a_row_without_labels(tmp_path):
    p = tmp_path / "d.txt"
    p.write_text(XC)
    s = read_xc(p)
    assert s.features.shape == (4, 5) and s.labels.shape == (4, 3)
    np.testing.assert_array_equal(s.labels.toarray(), [[1, 0, 1], [0, 0, 0], [0, 1, 0], [1, 1, 1]])
    np.testing.assert_allclose(s.features.toarray()[1], [0, 2, 0, 0, 1])


def test_xc_fold_files_select_rows(tmp_path):
    (tmp_path / "d.txt").write_text(XC)
    (tmp_path / "d_trSplit.txt").write_text("1 2\n3 4\n")
    (tmp_path / "d_tstSplit.txt").write_text("4 1\n2 3\n")
    tr, te = read_xc_split(tmp_path / "d.txt", tmp_path / "d_trSplit.txt", tmp_path / "d_tstSplit.txt", fold=1)
    np.testing.assert_array_equal(tr.labels.toarray(), [[0, 0, 0], [1, 1, 1]])  # rows 2 and 4
    np.testing.assert_array_equal(te.labels.toarray(), [[1, 0, 1], [0, 1, 0]])  # rows 1 and 3
    with pytest.raises(DataError, match="fold 2"):
        read_xc_split(tmp_path / "d.txt", tmp_path / "d_trSplit.txt", tmp_path / "d_tstSplit.txt", fold=2)


def test_xc_header_mismatch_is_reported(tmp_path):
    p = tmp_path / "d.txt"
    p.write_text(XC.replace("4 5 3", "5 5 3"))
    with pytest.raises(DataError, match="header says 5 rows"):
        read_xc(p)
