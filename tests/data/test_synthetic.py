import numpy as np

from secure_fed.data import SyntheticSpec, make_synthetic


def test_deterministic_per_seed():
    a = make_synthetic(SyntheticSpec(num_train=200, num_test=50), seed=1)
    b = make_synthetic(SyntheticSpec(num_train=200, num_test=50), seed=1)
    c = make_synthetic(SyntheticSpec(num_train=200, num_test=50), seed=2)
    assert (a.train.features != b.train.features).nnz == 0
    assert (a.train.features != c.train.features).nnz > 0


def test_cooccurrence_controls_label_cardinality_and_correlation():
    def stats(co):
        ds = make_synthetic(
            SyntheticSpec(num_train=3000, num_test=10, num_labels=12, num_groups=3, cooccurrence=co, noise_label_rate=0.0), seed=0
        )
        y = ds.train.labels.toarray()
        same_group = np.equal.outer(np.arange(12) % 3, np.arange(12) % 3) & ~np.eye(12, dtype=bool)
        co_counts = y.T @ y
        return y.sum(1).mean(), co_counts[same_group].mean(), co_counts[~same_group & ~np.eye(12, dtype=bool)].mean()

    card0, within0, across0 = stats(0.0)
    card5, within5, across5 = stats(0.5)
    assert card0 == 1.0 and within0 == 0 and across0 == 0
    assert card5 > 1.5
    assert within5 > 10 * max(across5, 1)  # co-occurrence happens inside groups only
