import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments"))
import recipe_dp_statistics as ds  # noqa: E402

from protocols.dp.accountant import epsilon_of  # noqa: E402


def test_the_statistics_multiplier_is_the_smallest_that_keeps_the_total_within_one():
    ledger = [(20.0, 0.1, 1), (6.308, 1.0, 2)]  # the recipe's W step and DP-SGD at ε ≈ 0.9
    z = ds.statistics_multiplier(ledger)
    assert epsilon_of([*ledger, (z, 1.0, 1), (z, 1.0, 1)], 1e-5, "rdp") <= 1.0
    assert epsilon_of([*ledger, (z * 0.99, 1.0, 1), (z * 0.99, 1.0, 1)], 1e-5, "rdp") > 1.0
    assert 5.0 < z < 50.0


def test_kept_labels_are_at_most_m_of_each_instances_own():
    rng = np.random.default_rng(0)
    y = sp.csr_matrix((rng.random((60, 8)) < 0.4).astype(float))
    keep = ds.kept_labels(y, 2, np.random.default_rng(1))
    dense = y.toarray()
    assert np.all(keep <= dense)  # never a label the instance lacks
    assert np.array_equal(keep.sum(1), np.minimum(dense.sum(1), 2))


def test_a_ledger_that_does_not_recompose_to_the_units_epsilon_is_refused():
    mech = {"noise_multiplier": 6.308, "sample_rate": 1.0, "steps": 2}
    eps = epsilon_of([(6.308, 1.0, 2)], 1e-5, "rdp")
    good = {"privacy": {"units": {"instance": {"epsilon": eps, "mechanisms": {"a": mech}}}}}
    assert ds.run_ledger(good) == [(6.308, 1.0, 2)]
    bad = {"privacy": {"units": {"instance": {"epsilon": eps * 1.1, "mechanisms": {"a": mech}}}}}
    with pytest.raises(SystemExit, match="ledger"):
        ds.run_ledger(bad)
