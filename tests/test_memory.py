"""The memory estimate (secure_fed.memory): its terms against independent counts, and a run sized past the
machine refused before anything is built or written, with one ``error:`` line and exit 2."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

from secure_fed import memory
from secure_fed.config import load_plan
from secure_fed.data.dataset import MultiLabelDataset, MultiLabelSplit
from tests.config.test_bad_input import assert_one_error_line, cli
from tests.conftest import SMALL

HUGE = ["--set", "model.hidden_dims=[65536, 65536]"]  # 4.3e9 parameters: about 86 GB for θ's copies alone


@pytest.fixture(autouse=True)
def _a_24_gb_machine(monkeypatch):
    """The refusals below must not depend on the memory of the machine the tests run on."""
    monkeypatch.setattr(memory, "available_bytes", lambda device: 24e9)


def test_a_run_sized_past_the_machine_stops_before_anything_is_written(tmp_path):
    out = tmp_path / "run"
    code, _, err = cli("run", *[a for s in SMALL for a in ("--set", s)], *HUGE, "--out", str(out))
    assert_one_error_line(code, err, "the planned run needs about", "largest term is model", "GB available")
    assert not out.exists()


def test_validate_prints_the_estimate_and_refuses_what_cannot_fit(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("training: {rounds: 1}\n")
    code, out, err = cli("validate", str(cfg))
    assert code == 0, err
    assert "estimated peak memory" in out and "total" in out and "model" in out
    code, out, err = cli("validate", str(cfg), *HUGE)
    assert_one_error_line(code, err, "the planned run needs about", "largest term is model")
    assert "model" in out


def _dataset(n=50, D=30, C=7, seed=0):
    rng = np.random.default_rng(seed)
    x = sp.random(n, D, density=0.2, format="csr", dtype=np.float32, random_state=seed)
    y = sp.csr_matrix((rng.random((n, C)) < 0.3).astype(np.int8))
    return MultiLabelDataset("t", MultiLabelSplit(x, y), MultiLabelSplit(x[:10], y[:10]), [f"l{i}" for i in range(C)], "sparse")


def test_terms_follow_the_data_and_the_model():
    ds = _dataset()
    cfg = load_plan(overrides=[*SMALL, "model.name=sparse_text", "model.embed_dim=8", "model.hidden_dims=[16]",
                                 "model.embedding_dim=4"])  # fmt: skip
    shape = memory.DataShape.of(ds)
    assert shape.train_values == ds.train.features.nnz and shape.label_entries == ds.train.labels.nnz
    params = 30 * 8 + (8 * 16 + 16) + (16 * 4 + 4)  # counted by hand: embed (no bias), hidden, output layers
    assert memory.parameter_count(cfg, ds) == params
    sparse = memory.estimate_memory(cfg, shape, params=params, sparse_rows=True)
    dense = memory.estimate_memory(cfg, shape, params=params, sparse_rows=False)
    assert sparse.terms["model"] == memory.MODEL_HELD * 4 * params
    pair_block = min(7 * cfg.algorithm.k * 4, memory.PAIR_BLOCK_ELEMENTS) * 4 * memory.PAIR_TENSORS  # the default fedalc
    assert sparse.transient["round"] == memory.MODEL_ROUND * 4 * params + pair_block
    assert sparse.terms["row table"] == memory.ROW_COPIES * 7 * 4 * 4
    assert sparse.terms["client rows"] == 12 * ds.train.features.nnz + 8 * 50
    # dense rows: a float32 row of D features per client row, one per (instance, label) pair in positive-only
    assert dense.terms["client rows"] == 4 * 30 * ds.train.labels.nnz
    # the phases do not overlap: the total counts only the largest
    assert sparse.total == pytest.approx(memory.BASELINE + sum(sparse.terms.values()) + max(sparse.transient.values()))


@pytest.mark.parametrize(
    ("model", "family"),
    [("sparse_text", "embedding"), ("mlp", "embedding"), ("mlp", "linear_head"), ("sparse_text", "linear_head")],
)
def test_closed_form_parameter_count_equals_the_built_model(model, family):
    """validate counts θ without torch; the count is the built model's."""
    from secure_fed.engine.builders import build_model

    ds = _dataset()
    part = ["partition.name=iid", "algorithm.name=fedavg"] if family == "linear_head" else []
    cfg = load_plan(overrides=[*SMALL, f"model.name={model}", f"model.family={family}", *part, "model.embed_dim=8",
                                 "model.hidden_dims=[16, 12]", "model.embedding_dim=5"])  # fmt: skip
    assert not memory.needs_torch(cfg, ds)
    assert memory.parameter_count(cfg, ds) == sum(p.numel() for p in build_model(cfg, ds).parameters())


def test_the_refusal_names_the_largest_term():
    est = memory.MemoryEstimate({"data": 2e9, "client rows": 9e9}, {"round": 1e9}, available=4e9, device="cpu")
    with pytest.raises(Exception, match=r"largest term is client rows \(9.0 GB\): keep sparse rows"):
        memory.check_memory(est)
    memory.check_memory(memory.MemoryEstimate({"data": 1e9}, {}, available=4e9))  # fits: no error


def test_a_gpu_run_checks_the_gpu_terms_against_the_gpu_and_the_host_terms_against_the_host():
    """On a GPU the data (scipy/numpy) stays in host memory: 20 GB of it must not count against an 8 GB card."""
    gpu = lambda avail, host: memory.MemoryEstimate(  # noqa: E731
        {"data": 20e9, "client rows": 5e9, "co-occurrence": 1e9}, {"round": 1e9, "secure sums": 3e9, "label sets": 2e9},
        available=avail, device="cuda", host_available=host,
    )  # fmt: skip
    memory.check_memory(gpu(8e9, 32e9))  # GPU 6 GB (rows + round), host 0.6 + 21 + 3 GB: both fit
    with pytest.raises(Exception, match=r"needs about 6.0 GB but cuda has 4.0 GB available; the largest term is client rows"):
        memory.check_memory(gpu(4e9, 32e9))
    with pytest.raises(Exception, match=r"needs about 24.6 GB but host memory has 16.0 GB available; the largest term is data"):
        memory.check_memory(gpu(8e9, 16e9))
    assert memory.MemoryEstimate({"data": 20e9, "client rows": 5e9}, {}, available=8e9, device="cpu").total > 8e9
    with pytest.raises(Exception, match="cpu has 8.0 GB"):  # on the CPU every term counts against one memory
        memory.check_memory(memory.MemoryEstimate({"data": 20e9, "client rows": 5e9}, {}, available=8e9, device="cpu"))
    text = "\n".join(gpu(8e9, 32e9).lines())
    assert "data                20.00 GB  held, host memory" in text and "client rows          5.00 GB  held, cuda" in text
    assert "6.00 GB on cuda of 8.0 GB available" in text and "24.60 GB on host memory of 32.0 GB available" in text


def test_the_secure_layers_vectors_are_their_own_host_phase_on_a_gpu(monkeypatch):
    """The protocols' float64 vectors are numpy arrays: on the CPU part of a round's peak, on a GPU run a host phase."""
    monkeypatch.setattr(memory, "available_bytes", lambda device: 64e9 if device == "cpu" else 8e9)
    cfg = load_plan(overrides=[*SMALL, 'protocols=["secure_aggregation"]'])
    shape = memory.DataShape.of(_dataset())
    cpu = memory.estimate_memory(cfg, shape, params=1000, sparse_rows=True, device="cpu")
    gpu = memory.estimate_memory(cfg, shape, params=1000, sparse_rows=True, device="cuda")
    assert "secure sums" not in cpu.transient and gpu.transient["secure sums"] > 0
    assert cpu.transient["round"] == pytest.approx(gpu.transient["round"] + gpu.transient["secure sums"])
    assert (gpu.available, gpu.host_available, cpu.host_available) == (8e9, 64e9, None)
    assert memory.on_host("secure sums") and memory.on_host("data") and memory.on_host("attack membership_inference")
    assert not memory.on_host("client rows") and not memory.on_host("round")


def test_an_attack_that_densifies_labels_is_refused_up_front_on_xc_sized_labels(tmp_path):
    """label_deanonymization matches C × C co-occurrence profiles: at a million labels it cannot run, and the run
    stops before training, naming the attack."""
    ds = _dataset()
    cfg = load_plan(overrides=[*SMALL, 'attacks={run: ["label_deanonymization"]}'])
    shape = memory.DataShape.of(ds)
    est = memory.estimate_memory(cfg, shape, params=10, sparse_rows=True)
    assert est.transient["attack label_deanonymization"] == 50 * 7 * 4 + 10 * 7 + 4 * 8 * 7 * 7
    big = memory.DataShape(train=10**6, test=10**5, features=10, labels=10**6, train_values=10**6, test_values=10**5,
                           label_entries=5 * 10**6, dense=False)  # fmt: skip
    est = memory.estimate_memory(cfg, big, params=10, sparse_rows=True)
    est.available = 64e9
    with pytest.raises(Exception, match="largest term is attack label_deanonymization .* leave it out of attacks.run"):
        memory.check_memory(est)


def test_fedalc_fixed_eq12_memory_is_blocked_not_all_pairs():
    """Eq. 12 runs in row blocks and chunks of pairs, its DP per-set gradients in chunks: at EURLex-4K's C and
    d = 512 the phase is about a gigabyte (the dense (C, C, d) tensors it replaced were ~100 GB), growing with C·d,
    not C²·d."""
    shape = memory.DataShape(train=15539, test=3809, features=5000, labels=3993, train_values=15539 * 236,
                             test_values=3809 * 236, label_entries=15539 * 5, dense=False)  # fmt: skip
    over = ["algorithm.name=fedalc_fixed", "protocols=[dp]", "privacy.instance={noise_multiplier: 1.0, sample_rate: 0.01}"]
    cfg = load_plan(overrides=[*over, "model.embedding_dim=512"])
    phase = memory.estimate_memory(cfg, shape, params=10, sparse_rows=True).transient["eq. 12 pairs"]
    # written out: 4 row blocks (here all C² < 2^24 cosines), 6 pair tensors of 2^24, 4 tables of C·d and 3 per-set
    # chunks of 2^26 floats
    assert phase == 4 * (4 * 3993**2 + 6 * 2**24 + 4 * 3993 * 512 + 3 * 2**26)
    assert phase < 2e9
    # at Amazon-670K's C the blocks are the same size; the tables grow with C·d, and a chunk of per-set gradients
    # holds at least one set's (C, d) gradient
    big = memory.DataShape(train=490449, test=153025, features=135909, labels=670091, train_values=490449 * 76,
                           test_values=153025 * 76, label_entries=490449 * 5, dense=False)  # fmt: skip
    phase_big = memory.estimate_memory(cfg, big, params=10, sparse_rows=True).transient["eq. 12 pairs"]
    assert phase_big == 4 * (4 * 2**24 + 6 * 2**24 + 4 * 670091 * 512 + 3 * 670091 * 512)


def test_fedalc_approximate_search_counts_its_index():
    """FedALC's approximate neighbour search holds the index during the server step (at Amazon-670K's C about
    3 GB, which put the measured peak 0.8 GB over an estimate without it): written out here."""
    big = memory.DataShape(train=490449, test=2000, features=135909, labels=573929, train_values=490449 * 76,
                           test_values=2000 * 76, label_entries=490449 * 5, dense=False)  # fmt: skip
    cfg = load_plan(overrides=["algorithm.name=fedalc", "algorithm.neighbour_search=approximate", "algorithm.k=50",
                                 "model.embedding_dim=512"])  # fmt: skip
    est = memory.estimate_memory(cfg, big, params=10, sparse_rows=True)
    C = 573929
    # HNSW with M = 32: 2·32 links at the base level, about 2 more above, 4 bytes each
    assert est.transient["neighbour index"] == 8 * C * 512 + C * 66 * 4 + C * 51 * 12 + C * 50 * 8
    # NN-descent (degree 64, pool 80 of 12 bytes, four lists of up to R = 100 ids, the final 64 ids)
    nnd = load_plan(overrides=["algorithm.name=fedalc", "algorithm.neighbour_search=approximate", "algorithm.k=50",
                                 "algorithm.ann_index=nndescent", "model.embedding_dim=512"])  # fmt: skip
    est_nnd = memory.estimate_memory(nnd, big, params=10, sparse_rows=True)
    per_row = 12 * 80 + 16 * 100 + 4 * 64
    assert est_nnd.transient["neighbour index"] == 8 * C * 512 + C * per_row + C * 51 * 12 + C * 50 * 8
    exact = load_plan(overrides=["algorithm.name=fedalc", "model.embedding_dim=512"])
    assert "neighbour index" not in memory.estimate_memory(exact, big, params=10, sparse_rows=True).transient
