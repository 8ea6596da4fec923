import numpy as np
import pytest

from secure_fed.config import build_plan
from secure_fed.data import load_registered, read_arff, read_label_names
from secure_fed.data.registry import load_from_paths
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


# ---------------------------------------------------------------- ARFF quirks of real Mulan files
QUIRKS = r"""@relation 'quirks, and more'
@attribute id string
@attribute 'TAG_m\'usica' {0,1}
@attribute "say \"hi\"" {0,1}
@attribute where {north, 'south east', 'west, far'}
@attribute x numeric
@attribute when date "yyyy-MM-dd"
@attribute plain {0,1}
@data
'row, one',1,0,north,0.5,"2020-01-01",1
"row \"two\"",0,1,'south east',-1,?,0
r3,1,1,'west, far',2.0,2021-02-02,0
{0 r4,1 1,3 north,4 3}
"""

QUIRKS_XML = """<?xml version="1.0" encoding="utf-8"?>
<labels xmlns="http://mulan.sourceforge.net/labels"><label name="TAG_m'usica"></label><label name='say "hi"'></label>
<label name="plain"></label></labels>
"""


def test_quoted_names_nominal_features_and_string_attributes(tmp_path, caplog):
    """Escaped quotes in names (' and "), quoted values holding commas, nominal features one-hot in the header's
    order, string and date attributes skipped with a one-line note, sparse rows with nominal values."""
    (tmp_path / "q.arff").write_text(QUIRKS)
    (tmp_path / "q.xml").write_text(QUIRKS_XML)
    names = read_label_names(tmp_path / "q.xml")
    assert names == ["TAG_m'usica", 'say "hi"', "plain"]
    with caplog.at_level("WARNING"):
        split = read_arff(tmp_path / "q.arff", names)
    assert any("2 string/date attribute(s) skipped (id, when)" in r.getMessage() for r in caplog.records)
    # features: where=north, where=south east, where=west, far, x
    np.testing.assert_array_equal(
        split.features.toarray(),
        [[1, 0, 0, 0.5], [0, 1, 0, -1], [0, 0, 1, 2.0], [1, 0, 0, 3]],
    )
    np.testing.assert_array_equal(split.labels.toarray(), [[1, 0, 1], [0, 1, 0], [1, 1, 0], [1, 0, 0]])


def test_unknown_nominal_value_and_unknown_type_are_clear_errors(tmp_path):
    (tmp_path / "q.arff").write_text(QUIRKS.replace("r3,1,1,'west, far'", "r3,1,1,'nowhere'"))
    with pytest.raises(DataError, match=r"q\.arff:\d+: malformed data row .*no category 'nowhere'"):
        read_arff(tmp_path / "q.arff", ["plain"])
    (tmp_path / "r.arff").write_text(QUIRKS.replace("@attribute x numeric", "@attribute x relational"))
    with pytest.raises(DataError, match="attribute 'x': unknown attribute type 'relational'"):
        read_arff(tmp_path / "r.arff", ["plain"])


def _one_file_dataset(tmp_path, n=120, seed=0):
    """A one-file Mulan-style data set with every quirk: string id, nominal feature, escaped label names."""
    rng = np.random.default_rng(seed)
    lines = [
        "@relation one_file", "@attribute id string", "@attribute colour {red, 'dark green', blue}",
        *[f"@attribute f{i} numeric" for i in range(6)],
        r"@attribute 'TAG_m\'usica' {0,1}", '@attribute "jazz" {0,1}', "@attribute rock {0,1}", "@data",
    ]  # fmt: skip
    for r in range(n):
        labels = rng.random(3) < 0.4
        labels[r % 3] = True
        colour = ["red", "'dark green'", "blue"][int(rng.integers(3))]
        feats = ",".join(f"{v:.3f}" for v in rng.normal(size=6) + labels.repeat(2).astype(float))
        lines.append(f"'id {r}',{colour},{feats}," + ",".join(str(int(b)) for b in labels))
    (tmp_path / "one.arff").write_text("\n".join(lines) + "\n")
    (tmp_path / "one.xml").write_text(
        '<labels xmlns="http://mulan.sourceforge.net/labels"><label name="TAG_m\'usica"/><label name="jazz"/>'
        '<label name="rock"/></labels>'
    )
    return tmp_path / "one.arff", tmp_path / "one.xml"


def test_a_one_file_dataset_gets_a_seeded_split_or_uses_fold_files(tmp_path):
    from secure_fed.data import load_from_paths

    arff, xml = _one_file_dataset(tmp_path)
    a = load_from_paths(format="arff", train=arff, labels=xml, test_fraction=0.25, split_seed=3)
    b = load_from_paths(format="arff", train=arff, labels=xml, test_fraction=0.25, split_seed=3)
    c = load_from_paths(format="arff", train=arff, labels=xml, test_fraction=0.25, split_seed=4)
    assert a.test.num_instances == 30 and a.train.num_instances == 90
    assert (a.train.features != b.train.features).nnz == 0  # the same seed, the same split
    assert (a.train.features != c.train.features).nnz > 0  # another seed, another split
    # the two splits partition the file's rows: together they hold every row exactly once
    full = read_arff(arff, read_label_names(xml))
    rows = lambda m: sorted(map(tuple, np.round(m.toarray(), 3)))  # noqa: E731
    assert rows(sp_vstack(a.train.features, a.test.features)) == rows(full.features)
    (tmp_path / "tr.txt").write_text("\n".join(str(i) for i in range(1, 101)))
    (tmp_path / "te.txt").write_text("\n".join(str(i) for i in range(101, 121)))
    f = load_from_paths(format="arff", train=arff, labels=xml, train_split=tmp_path / "tr.txt", test_split=tmp_path / "te.txt")
    assert f.train.num_instances == 100 and f.test.num_instances == 20
    assert (f.test.features != full.features[100:]).nnz == 0


def sp_vstack(a, b):
    import scipy.sparse as sp

    return sp.vstack([a, b]).tocsr()


def test_a_sparse_row_omitting_a_nominal_attribute_holds_its_first_category(tmp_path):
    """ARFF (Weka) rule: a sparse row omits zeros, and a nominal attribute's value 0 is its first category; an
    explicit ``?`` stays missing (no category). ``{1, 0}`` declared in that order is nominal (first category "1"),
    where ``{0, 1}`` is one numeric column."""
    (tmp_path / "s.arff").write_text(
        "@relation s\n@attribute where {north, south, west}\n@attribute x numeric\n@attribute flag {1,0}\n"
        "@attribute bit {0,1}\n@attribute lab {0,1}\n@data\n"
        "{0 west,1 2,2 0,3 1,4 1}\n{1 3}\n{0 south}\n{0 ?,2 ?}\n"
    )
    split = read_arff(tmp_path / "s.arff", ["lab"])
    # columns: where=north, where=south, where=west, x, flag=1, flag=0, bit
    np.testing.assert_array_equal(
        split.features.toarray(),
        [[0, 0, 1, 2, 0, 1, 1], [1, 0, 0, 3, 1, 0, 0], [0, 1, 0, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0, 0]],
    )
    np.testing.assert_array_equal(split.labels.toarray(), [[1], [0], [0], [0]])


def _id_file(tmp_path, rows=25):
    body = "".join(f"p{i},{'a' if i % 2 else 'b'},{i % 2}\n" for i in range(rows))
    (tmp_path / "ids.arff").write_text(
        "@relation ids\n@attribute protein {" + ",".join(f"p{i}" for i in range(rows)) + "}\n"
        "@attribute motif {a,b}\n@attribute lab {0,1}\n@data\n" + body
    )
    return tmp_path / "ids.arff"


def test_an_identifier_attribute_gets_a_note_and_drop_attributes_leaves_it_out(tmp_path, caplog):
    """genbase's quirk: a nominal 'protein' id, a different value on every row, one-hot into one column per row."""
    path = _id_file(tmp_path)
    with caplog.at_level("WARNING"):
        split = read_arff(path, ["lab"])
    notes = [r.getMessage() for r in caplog.records]
    assert split.features.shape == (25, 25 + 2)
    assert any("'protein' takes a different value on each of the 25 rows" in m for m in notes)
    assert not any("'motif'" in m for m in notes)
    caplog.clear()
    with caplog.at_level("WARNING"):
        dropped = read_arff(path, ["lab"], drop=["protein"])
    assert dropped.features.shape == (25, 2)
    np.testing.assert_array_equal(dropped.features.toarray(), split.features.toarray()[:, 25:])
    assert not any("takes a different value" in r.getMessage() for r in caplog.records)
    with pytest.raises(DataError, match="drop_attributes: 'nope' is not an attribute"):
        read_arff(path, ["lab"], drop=["nope"])
    with pytest.raises(DataError, match="drop_attributes: 'lab' is a label"):
        read_arff(path, ["lab"], drop=["lab"])


def test_drop_attributes_on_a_registered_set(data_root):
    full = load_registered("emotions", data_root)
    dropped = load_registered("emotions", data_root, drop_attributes=["Mean_Acc1298_Mean_Mem40_Centroid"])
    for a, b in ((full.train, dropped.train), (full.test, dropped.test)):
        assert b.features.shape == (a.features.shape[0], a.features.shape[1] - 1)
        np.testing.assert_array_equal(b.features.toarray(), a.features.toarray()[:, 1:])


def test_drop_attributes_is_a_config_key_checked_against_the_source(tmp_path):
    from secure_fed.config import load_config
    from secure_fed.data.from_config import build_dataset
    from secure_fed.errors import ConfigError

    path = _id_file(tmp_path)
    (tmp_path / "ids.xml").write_text('<labels xmlns="http://mulan.sourceforge.net/labels"><label name="lab"/></labels>')
    cfg = load_config(None, [
        "dataset.name=null", "dataset.format=arff", f"dataset.train={path}", f"dataset.labels={tmp_path / 'ids.xml'}",
        "dataset.drop_attributes=[protein]", "dataset.drop_empty_labels=false",
    ])  # fmt: skip
    ds = build_dataset(build_plan(cfg))
    assert ds.train.features.shape[1] == 2 and ds.train.num_instances + ds.test.num_instances == 25
    for source in ([], ["dataset.name=digit_mosaics"]):
        with pytest.raises(ConfigError, match="drop_attributes names ARFF attributes"):
            load_config(None, [*source, "dataset.drop_attributes=[protein]"])
    with pytest.raises(DataError, match="drop_attributes applies to format 'arff'"):
        load_from_paths(format="xc", train=path, test=path, drop_attributes=["protein"])


def test_a_one_file_quirky_arff_runs_end_to_end(tmp_path):
    """The one-file data set with a string id, a nominal feature and an escaped label name: FedAvg trains on it."""
    from secure_fed.config import load_config
    from secure_fed.engine import Experiment

    arff, xml = _one_file_dataset(tmp_path)
    cfg = load_config(None, [
        "dataset.name=null", "dataset.format=arff", f"dataset.train={arff}", f"dataset.labels={xml}",
        "algorithm.name=fedavg", "training.rounds=2", "evaluation.every=1",
        "model={name: mlp, embedding_dim: 16, hidden_dims: [16]}",
    ])  # fmt: skip
    result = Experiment(build_plan(cfg), run_dir=tmp_path / "run").run(progress=False)
    assert result.summary["status"] == "completed" and result.summary["rounds_completed"] == 2
    exp_ds = Experiment(build_plan(cfg), run_dir=tmp_path / "run2").dataset
    assert exp_ds.label_names == ["TAG_m'usica", "jazz", "rock"]
    assert exp_ds.train.features.shape == (84, 3 + 6) and exp_ds.test.num_instances == 36
