import hashlib

import numpy as np
import scipy.sparse as sp
import torch

from secure_fed.algorithms.label_sets import Sha256Tokenizer, canonical_instance_bytes, merge_label_sets
from secure_fed.algorithms.regularizers import correlation_sigma
from secure_fed.config import build_plan
from secure_fed.engine import Experiment
from tests.conftest import small_config, small_plan


def test_canonical_encoding_is_representation_independent():
    dense = np.array([0.0, 1.0, 0.0, 2.5], dtype=np.float32)
    a = canonical_instance_bytes(dense)
    b = canonical_instance_bytes(sp.csr_matrix(dense))
    c = canonical_instance_bytes(sp.csr_matrix((np.array([2.5, 1.0]), (np.array([0, 0]), np.array([3, 1]))), shape=(1, 4)))
    assert a == b == c
    assert canonical_instance_bytes(np.array([0.0, 1.0, 0.0, 2.5, 0.0])) != a  # dimension is encoded


def test_sha256_tokens_are_plain_sha256_of_the_encoding():
    x = sp.csr_matrix(np.array([[0, 1, 0], [3, 0, 0]], dtype=np.float32))
    toks = Sha256Tokenizer().tokens(x)
    assert toks[0] == hashlib.sha256(canonical_instance_bytes(x[0])).digest()
    assert len(toks[0]) == 32 and toks[0] != toks[1]


def test_merge_label_sets():
    msgs = [([b"a", b"b"], 0), ([b"a"], 1), ([b"c", b"b"], 2)]
    Y = merge_label_sets(msgs, 3)
    assert sp.issparse(Y) and Y.toarray().tolist() == [[1, 1, 0], [1, 0, 1], [0, 0, 1]]


def _collected_sets(exp):
    exp.setup()
    Y = exp.algorithm.label_sets
    assert sp.issparse(Y)  # the server keeps them sparse (O(tokens) memory)
    return torch.from_numpy(Y.toarray())


def test_collected_label_sets_equal_true_label_sets_on_synthetic(tmp_path):
    exp = Experiment(small_plan("algorithm.name=fedalc"), run_dir=tmp_path)
    Y_server = _collected_sets(exp)
    Y_true = torch.from_numpy(exp.dataset.train.labels.toarray()).float()
    # synthetic features are continuous, so no two instances share a token
    assert Y_server.shape == Y_true.shape
    rows = sorted(map(tuple, Y_server.int().tolist()))
    assert rows == sorted(map(tuple, Y_true.int().tolist()))
    assert torch.allclose(correlation_sigma(Y_server), correlation_sigma(Y_true))


def test_collected_label_sets_on_bibtex_group_identical_instances(data_root, tmp_path):
    cfg = small_config(
        "dataset.name=bibtex",
        f"dataset.root={data_root}",
        "algorithm.name=fedalc",
        "model.name=sparse_text",
        "model.hidden_dims=[16]",
        "model.embed_dim=16",
    )
    exp = Experiment(build_plan(cfg), run_dir=tmp_path)
    Y_server = _collected_sets(exp)
    x = exp.dataset.train.features
    y = exp.dataset.train.labels.toarray()
    groups: dict[bytes, np.ndarray] = {}
    for i in range(x.shape[0]):
        key = canonical_instance_bytes(x[i])
        groups[key] = np.maximum(groups.get(key, 0), y[i])
    expected = sorted(tuple(v.tolist()) for v in groups.values())
    assert Y_server.shape[0] == len(groups)  # one label set per distinct instance
    assert sorted(map(tuple, Y_server.int().tolist())) == expected
    assert exp.setup_facts["tokens_received"] == int(y.sum())


def test_canonical_rows_equal_the_per_row_encoding():
    """The vectorised encoding of all rows equals :func:`canonical_instance_bytes` of each row: duplicates summed,
    explicit zeros dropped, unsorted indices, empty rows, float64 values and dense input."""
    from secure_fed.algorithms.label_sets import canonical_rows

    rng = np.random.default_rng(0)
    m = sp.random(30, 50, density=0.1, format="csr", random_state=1, dtype=np.float64)
    m = sp.csr_matrix(m.toarray())
    m[4] = 0
    m.eliminate_zeros()
    dup = sp.csr_matrix((np.array([1.5, 2.0, 0.0, 3.0]), np.array([7, 7, 2, 1]), np.array([0, 4])), shape=(1, 50))
    x = sp.vstack([m, dup]).tocsr()
    x.has_sorted_indices = False
    rows = [bytes(r) for r in canonical_rows(x)]
    assert rows == [canonical_instance_bytes(x[i]) for i in range(x.shape[0])]
    dense = rng.random((5, 9)) * (rng.random((5, 9)) < 0.4)
    assert [bytes(r) for r in canonical_rows(dense)] == [canonical_instance_bytes(dense[i]) for i in range(5)]
