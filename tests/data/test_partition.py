import numpy as np
import pytest

from secure_fed.data import SyntheticSpec, build_partitioner, make_synthetic
from secure_fed.errors import ConfigError


@pytest.fixture(scope="module")
def split():
    return make_synthetic(SyntheticSpec(num_train=500, num_test=10, num_labels=10, cooccurrence=0.4), seed=0).train


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
    allrows = np.concatenate([s.indices for s in shards])
    assert sorted(allrows.tolist()) == list(range(split.num_instances))
    assert all(s.label is None for s in shards)


def test_dirichlet_needs_single_label_data(split):
    with pytest.raises(ConfigError, match="single-label"):
        build_partitioner("dirichlet", num_clients=3).partition(split, np.random.default_rng(0))
    single = make_synthetic(SyntheticSpec(num_train=600, num_test=10, cooccurrence=0.0, noise_label_rate=0.0), seed=0).train
    shards = build_partitioner("dirichlet", num_clients=4, alpha=0.1).partition(single, np.random.default_rng(0))
    assert sum(len(s.indices) for s in shards) == 600
    # small alpha gives more skewed label mixes than iid shards of the same data
    y = single.labels.toarray()

    def top_share(parts):
        return np.mean([y[s.indices].sum(0).max() / len(s.indices) for s in parts if len(s.indices)])

    iid = build_partitioner("iid", num_clients=4).partition(single, np.random.default_rng(0))
    assert top_share(shards) > top_share(iid) + 0.1
