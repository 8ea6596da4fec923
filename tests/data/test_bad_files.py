"""A user's own data files with mistakes in them: each is one DataError naming what is wrong (a second CLI audit
found tracebacks, silent acceptance and a run directory written for each of these)."""

from __future__ import annotations

import pytest

from secure_fed.config import build_plan
from secure_fed.data.registry import load_from_paths
from secure_fed.errors import DataError

HEADER = (
    "@relation t\n"
    + "".join(f"@attribute f{i} numeric\n" for i in range(3))
    + ("@attribute a {0,1}\n@attribute b {0,1}\n@data\n")
)
ROWS = ["0.1,0.2,0.3,1,0", "0.4,0.5,0.6,0,1", "0.7,0.8,0.9,1,1", "0.2,0.1,0.0,1,0"]
XML = '<?xml version="1.0"?>\n<labels xmlns="http://mulan.sourceforge.net/labels"><label name="a"/><label name="b"/></labels>\n'


def arff(rows, header=HEADER):
    return header + "\n".join(rows) + "\n"


CASES = {
    "a label without a name": ({"labels.xml": XML.replace('<label name="b"/>', "<label/>")}, "without a name attribute"),
    "a label listed twice": ({"labels.xml": XML.replace('name="b"', 'name="a"')}, "listed twice"),
    "test rows wider than training rows": (
        {"test.arff": arff(["0.1,0.2,0.3,0.4,1,0"], HEADER.replace("@attribute a", "@attribute f3 numeric\n@attribute a"))},
        "features and the test rows",
    ),
    "a test file with no rows": ({"test.arff": arff([])}, "the test split has no rows"),
    "a NaN feature": ({"train.arff": arff([*ROWS, "nan,0.1,0.2,1,0"])}, "NaN or infinite"),
    "an infinite feature": ({"train.arff": arff([*ROWS, "inf,0.1,0.2,1,0"])}, "NaN or infinite"),
    "a sparse row with a negative index": ({"train.arff": arff([*ROWS, "{-1 1, 0 0.5}"])}, "attribute index -1"),
    "a dense row too short": ({"train.arff": arff([*ROWS, "0.1,0.2,1"])}, "3 values for 5 attributes"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_own_data_file_is_one_data_error(tmp_path, case):
    files = {"train.arff": arff(ROWS), "test.arff": arff(ROWS[:2]), "labels.xml": XML}
    changed, needle = CASES[case]
    files.update(changed)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    paths = {k: str(tmp_path / f) for k, f in (("train", "train.arff"), ("test", "test.arff"), ("labels", "labels.xml"))}
    with pytest.raises(DataError, match=needle):
        load_from_paths(format="arff", **paths)


def test_unparseable_fold_files_and_label_lists_are_data_errors_naming_the_files(tmp_path):
    (tmp_path / "all.arff").write_text(arff(ROWS))
    (tmp_path / "labels.xml").write_text(XML)
    (tmp_path / "tr.txt").write_text("1\nx\n")  # a word in a fold file
    (tmp_path / "te.txt").write_text("3\n4\n")
    with pytest.raises(DataError, match=r"train_split .*tr.txt.* cannot be read"):
        load_from_paths(format="arff", train=tmp_path / "all.arff", labels=tmp_path / "labels.xml",
                        train_split=tmp_path / "tr.txt", test_split=tmp_path / "te.txt")  # fmt: skip
    (tmp_path / "d.xc").write_text("2 3 2\n0 0:1.0\n1 1:1.0\n")
    (tmp_path / "names.txt").write_bytes(b"\xff\xfe a\n")  # a label list that is not UTF-8
    with pytest.raises(DataError, match=r"labels .*names.txt.* cannot be read: UnicodeDecodeError"):
        load_from_paths(format="xc", train=tmp_path / "d.xc", test=tmp_path / "d.xc", labels=tmp_path / "names.txt")


def test_data_with_no_positive_label_is_refused(tmp_path):
    from secure_fed.config import load_config
    from secure_fed.data.from_config import build_dataset

    (tmp_path / "train.arff").write_text(arff(["0.1,0.2,0.3,0,0", "0.4,0.5,0.6,0,0"]))
    (tmp_path / "labels.xml").write_text(XML)
    data = tmp_path / "train.arff"
    cfg = load_config(overrides=["dataset.format=arff", f"dataset.train={data}", f"dataset.test={data}",
                                 f"dataset.labels={tmp_path / 'labels.xml'}"])  # fmt: skip
    with pytest.raises(DataError, match="no training instance has a positive label"):
        build_dataset(build_plan(cfg))
