import contextlib
import hashlib

import numpy as np
import pytest
import scipy.sparse as sp

from secure_fed.data import PARTITIONERS, MultiLabelSplit, SyntheticSpec, build_partitioner, load_registered, make_synthetic
from secure_fed.data.heterogeneity import heterogeneity_report
from secure_fed.errors import ConfigError


@pytest.fixture(scope="module")
def split():
    return make_synthetic(SyntheticSpec(num_train=500, num_test=10, num_labels=10, cooccurrence=0.4), seed=0).train


@pytest.fixture(scope="module")
def single():
    return make_synthetic(SyntheticSpec(num_train=600, num_test=10, cooccurrence=0.0, noise_label_rate=0.0), seed=0).train


def _split(labels: np.ndarray) -> MultiLabelSplit:
    """A split with the given 0/1 label matrix (features do not matter to partitioners)."""
    return MultiLabelSplit(sp.csr_matrix(np.ones((len(labels), 2), dtype=np.float32)), sp.csr_matrix(labels.astype(np.int8)))


def _covers_once(shards, n: int) -> bool:
    rows = np.concatenate([s.indices for s in shards])
    return sorted(rows.tolist()) == list(range(n))


def test_positive_only_one_client_per_label(split):
    shards = build_partitioner("positive_only").partition(split, np.random.default_rng(0))
    y = split.labels.toarray()
    assert len(shards) == y.shape[1]
    for s in shards:
        assert s.label == s.client_id
        np.testing.assert_array_equal(s.indices, np.flatnonzero(y[:, s.label]))
    # an instance with k labels is on exactly k clients
    copies = np.zeros(len(y), dtype=int)
    for s in shards:
        copies[s.indices] += 1
    np.testing.assert_array_equal(copies, y.sum(1))


def test_iid_covers_every_row_once(split):
    shards = build_partitioner("iid", num_clients=7).partition(split, np.random.default_rng(0))
    assert _covers_once(shards, split.num_instances)
    assert all(s.label is None for s in shards)


def test_dirichlet_single_label_is_skewed(single):
    shards = build_partitioner("dirichlet", num_clients=4, alpha=0.1).partition(single, np.random.default_rng(0))
    assert sum(len(s.indices) for s in shards) == 600
    # small alpha gives more skewed label mixes than iid shards of the same data
    y = single.labels.toarray()

    def top_share(parts):
        return np.mean([y[s.indices].sum(0).max() / len(s.indices) for s in parts if len(s.indices)])

    iid = build_partitioner("iid", num_clients=4).partition(single, np.random.default_rng(0))
    assert top_share(shards) > top_share(iid) + 0.1


# --- golden: the partitioners that existed before cmda/natural keep their exact outputs ----------------------------

#: SHA-256 (first 32 hex digits) over (client_id, label, indices) of every shard, computed with the partitioners as they
#: were before cmda, natural and multi-label dirichlet were added (rng = default_rng([seed, 11]), the engine's stream)
GOLDEN = [
    ("split", "positive_only", {}, 0, "b69b479e86fd26b963239750a1b9ae4b"),
    ("split", "iid", {"num_clients": 7}, 0, "1c2ec1b50c07ab93749644289daf8258"),
    ("single", "iid", {"num_clients": 3}, 0, "0c4fcd7158cd6ec504af3cf371f63581"),
    ("single", "dirichlet", {"num_clients": 4, "alpha": 0.1}, 0, "f35422168032d70a8e7254d27215b8cf"),
    ("single", "dirichlet", {"num_clients": 4, "alpha": 0.1}, 1, "baf65577141867a819cbed292fc1df8f"),
    ("single", "dirichlet", {"num_clients": 9, "alpha": 2.0}, 0, "335e4072b16627b451c5dd31861c9c90"),
]


@pytest.mark.parametrize("data, name, kwargs, seed, digest", GOLDEN)
def test_existing_partitioners_are_bit_identical(request, data, name, kwargs, seed, digest):
    shards = build_partitioner(name, **kwargs).partition(request.getfixturevalue(data), np.random.default_rng([seed, 11]))
    h = hashlib.sha256()
    for s in shards:
        h.update(str((s.client_id, s.label)).encode())
        h.update(np.asarray(s.indices, dtype=np.int64).tobytes())
    assert h.hexdigest()[:32] == digest


def test_registry_lists_every_partitioner():
    assert set(PARTITIONERS) == {"positive_only", "iid", "dirichlet", "cmda", "natural"}
    with pytest.raises(ConfigError, match="unknown partitioner 'kmeans'"):
        build_partitioner("kmeans")


# --- cmda ------------------------------------------------------------------------------------------------------------


def _planted(n: int = 400, k: int = 4, block: int = 6, flip: float = 0.03, seed: int = 0):
    """Label vectors from k prototypes on disjoint label blocks, with a few bits flipped; returns (labels, truth)."""
    rng = np.random.default_rng(seed)
    truth = rng.integers(k, size=n)
    protos = np.zeros((k, k * block), dtype=np.int8)
    for c in range(k):
        protos[c, c * block : c * block + 4] = 1  # 4 of the block's 6 labels on
    y = protos[truth] ^ (rng.random((n, k * block)) < flip)
    return y.astype(np.int8), truth


def test_cmda_recovers_planted_clusters():
    from sklearn.metrics import adjusted_rand_score

    y, truth = _planted()
    part = build_partitioner("cmda", num_clients=4, kmodes_inits=3, seed=0)
    shards = part.partition(_split(y), np.random.default_rng(0))
    assert len(shards) == 4 and _covers_once(shards, len(y))
    found = np.empty(len(y), dtype=int)
    for s in shards:
        found[s.indices] = s.client_id
        assert s.label is None
    assert adjusted_rand_score(truth, found) > 0.95
    assert part.centres.shape == (4, y.shape[1])


def test_cmda_assigns_other_splits_with_the_same_centres():
    y, _ = _planted(seed=1)
    part = build_partitioner("cmda", num_clients=4, kmodes_inits=2, seed=3)
    train = part.partition(_split(y), np.random.default_rng(0))
    client_of = np.empty(len(y), dtype=int)
    for s in train:
        client_of[s.indices] = s.client_id
    # a test split made of copies of training label vectors (in another order) plus unseen noisy vectors
    picks = np.random.default_rng(5).choice(len(y), size=60, replace=False)
    fresh, _ = _planted(n=40, seed=9, flip=0.1)
    test_y = np.vstack([y[picks], fresh])
    test = part.assign(_split(test_y), np.random.default_rng(123))
    assert len(test) == 4 and _covers_once(test, len(test_y))
    test_client = np.empty(len(test_y), dtype=int)
    for s in test:
        test_client[s.indices] = s.client_id
    np.testing.assert_array_equal(test_client[:60], client_of[picks])
    # assigning the training split again gives the training partition (Algorithm 1: train is assigned by the centres)
    again = part.assign(_split(y))
    assert all(np.array_equal(a.indices, b.indices) for a, b in zip(again, train, strict=True))


def test_cmda_is_deterministic_per_seed():
    y, _ = _planted(seed=2, flip=0.2)
    runs = [build_partitioner("cmda", num_clients=5, kmodes_inits=2, seed=7).partition(_split(y), None) for _ in range(2)]
    assert all(np.array_equal(a.indices, b.indices) for a, b in zip(*runs, strict=True))


def test_cmda_empty_clusters_and_bad_sizes_are_clear_errors():
    y = np.array([[1, 0], [0, 1]] * 10, dtype=np.int8)  # two distinct label vectors cannot fill three clusters
    with pytest.raises(ConfigError, match=r"partition\.num_clients=3") as exc:
        build_partitioner("cmda", num_clients=3, seed=0).partition(_split(y), np.random.default_rng(0))
    assert "2 distinct label vectors" in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(ConfigError, match=r"partition\.num_clients=30 exceeds the 20 training instances"):
        build_partitioner("cmda", num_clients=30, seed=0).partition(_split(y), np.random.default_rng(0))
    with pytest.raises(RuntimeError, match="call partition"):
        build_partitioner("cmda", num_clients=2).assign(_split(y))


def test_cmda_is_more_heterogeneous_than_iid(split):
    def kl_total(name):
        shards = build_partitioner(name, num_clients=5, kmodes_inits=2, seed=0).partition(split, np.random.default_rng(0))
        return heterogeneity_report(split.labels, shards)["kl_total"]

    assert kl_total("cmda") > 20 * kl_total("iid")


# --- dirichlet on multi-label data -------------------------------------------------------------------------------------


def test_dirichlet_multi_label_covers_every_row_once_and_skews(split):
    def shards(name, alpha=0.5, seed=0):
        return build_partitioner(name, num_clients=5, alpha=alpha).partition(split, np.random.default_rng(seed))

    skewed = shards("dirichlet", alpha=0.1)
    assert len(skewed) == 5 and _covers_once(skewed, split.num_instances)
    assert all(s.label is None for s in skewed)
    kl = {name: heterogeneity_report(split.labels, s)["kl_mean"] for name, s in
          [("iid", shards("iid")), ("skewed", skewed), ("flat", shards("dirichlet", alpha=1000.0))]}  # fmt: skip
    assert kl["skewed"] > 10 * kl["iid"]
    assert kl["flat"] < 3 * kl["iid"]  # a huge alpha spreads every label evenly: close to iid
    again = shards("dirichlet", alpha=0.1)
    assert all(np.array_equal(a.indices, b.indices) for a, b in zip(skewed, again, strict=True))


def test_dirichlet_multi_label_follows_the_per_label_mixture():
    # two labels, two clients, alpha tiny: each label's mix is (almost) one-hot, so instances with only label 0 all go to
    # one client and instances with only label 1 all go to one client; instances without a label are spread uniformly
    y = np.array([[1, 0]] * 100 + [[0, 1]] * 100 + [[0, 0]] * 400, dtype=np.int8)
    found = np.empty(len(y), dtype=int)
    for s in build_partitioner("dirichlet", num_clients=2, alpha=1e-3).partition(_split(y), np.random.default_rng(0)):
        found[s.indices] = s.client_id
    assert len(set(found[:100])) == 1 and len(set(found[100:200])) == 1
    assert 150 < np.sum(found[200:] == 0) < 250


# --- natural -----------------------------------------------------------------------------------------------------------


def test_natural_reads_client_ids(tmp_path, split):
    ids = np.random.default_rng(0).choice([3, 7, 42], size=split.num_instances)
    f = tmp_path / "ids.csv"
    f.write_text("\n".join(map(str, ids)) + "\n\n")
    part = build_partitioner("natural", client_ids_file=str(f))
    shards = part.partition(split, np.random.default_rng(0))
    assert part.num_clients == 3 and part.client_ids.tolist() == [3, 7, 42]
    for s, cid in zip(shards, [3, 7, 42], strict=True):
        np.testing.assert_array_equal(s.indices, np.flatnonzero(ids == cid))
    assert len(build_partitioner("natural", client_ids_file=str(f), num_clients=3).partition(split, None)) == 3


@pytest.mark.parametrize(
    "content, needle",
    [
        (None, "not found"),
        ("0\n1\n", "has 2 client ids but the training split has 500 instances"),
        ("0\n" * 10 + "two\n" + "1\n" * 489, "line 11 ('two') is not an integer"),
        ("0\n" * 10 + "1.0\n" + "1\n" * 489, "line 11 ('1.0') is not an integer"),
        ("0\n" * 10 + "\n" + "1\n" * 489, "line 11 ('') is not an integer"),
        ("0\n" * 499 + "-1\n", "line 500 ('-1') is negative"),
    ],
)
def test_natural_errors_are_one_line_and_name_the_file(tmp_path, split, content, needle):
    f = tmp_path / "ids.txt"
    if content is not None:
        f.write_text(content)
    with pytest.raises(ConfigError) as exc:
        build_partitioner("natural", client_ids_file=str(f)).partition(split, np.random.default_rng(0))
    msg = str(exc.value)
    assert needle in msg and f"partition.client_ids_file {f}" in msg and "\n" not in msg


def test_natural_needs_a_file_and_a_matching_client_count(tmp_path, split):
    with pytest.raises(ConfigError, match="needs partition.client_ids_file"):
        build_partitioner("natural")
    f = tmp_path / "ids.txt"
    f.write_text("0\n1\n" * 250)
    with pytest.raises(ConfigError, match=r"holds 2 distinct client ids but partition.num_clients=4"):
        build_partitioner("natural", client_ids_file=str(f), num_clients=4).partition(split, None)


def test_config_fields_are_bounded():
    from tests.conftest import small_config

    cfg = small_config("algorithm.name=fedavg", "partition.name=cmda", "partition.kmodes_inits=2")
    assert cfg.partition.kmodes_inits == 2 and cfg.partition.client_ids_file is None
    for bad, needle in [
        (["partition.kmodes_inits=0"], "kmodes_inits"),
        (["partition.name=natural"], "needs partition.client_ids_file"),
        (['partition.client_ids_file=""'], "client_ids_file"),
    ]:
        with pytest.raises(ConfigError, match=needle):
            small_config("algorithm.name=fedavg", *bad)


# --- assign: the other splits ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["iid", "dirichlet", "natural"])
def test_assign_is_uniformly_random_and_seeded(tmp_path, split, name):
    f = tmp_path / "ids.txt"
    f.write_text("\n".join(str(i % 4) for i in range(split.num_instances)))
    part = build_partitioner(name, num_clients=4, alpha=0.1, client_ids_file=str(f))
    with pytest.raises(RuntimeError, match="call partition") if name == "natural" else contextlib.nullcontext():
        part.assign(split, np.random.default_rng(0))
    part.partition(split, np.random.default_rng(0))
    test = make_synthetic(SyntheticSpec(num_train=10, num_test=203, num_labels=10), seed=1).test
    a = part.assign(test, np.random.default_rng(5))
    b = part.assign(test, np.random.default_rng(5))
    assert len(a) == 4 and _covers_once(a, 203)
    assert sorted(len(s.indices) for s in a) == [50, 51, 51, 51]
    assert all(np.array_equal(x.indices, y.indices) for x, y in zip(a, b, strict=True))


def test_positive_only_assigns_by_label(split):
    part = build_partitioner("positive_only")
    test = make_synthetic(SyntheticSpec(num_train=10, num_test=100, num_labels=10, cooccurrence=0.4), seed=2).test
    y = test.labels.toarray()
    for s in part.assign(test, np.random.default_rng(0)):
        np.testing.assert_array_equal(s.indices, np.flatnonzero(y[:, s.label]))


# --- real data -----------------------------------------------------------------------------------------------------


def test_scene_cmda_gives_every_client_train_and_test_from_the_same_centres(data_root):
    ds = load_registered("scene", data_root)
    part = build_partitioner("cmda", num_clients=6, kmodes_inits=2, seed=0)
    train = part.partition(ds.train, np.random.default_rng(0))
    test = part.assign(ds.test)
    assert _covers_once(train, ds.train.num_instances) and _covers_once(test, ds.test.num_instances)
    iid = build_partitioner("iid", num_clients=6).partition(ds.train, np.random.default_rng(0))
    assert heterogeneity_report(ds.train.labels, train)["kl_total"] > 20 * heterogeneity_report(ds.train.labels, iid)["kl_total"]
    # each client's test label distribution follows its training one: its most frequent label is the same on both
    y_tr, y_te = ds.train.labels.toarray(), ds.test.labels.toarray()
    same = [y_tr[a.indices].sum(0).argmax() == y_te[b.indices].sum(0).argmax() for a, b in zip(train, test, strict=True)]
    assert sum(same) >= 5
