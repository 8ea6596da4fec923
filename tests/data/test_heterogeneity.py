import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp

from secure_fed.data import ClientShard
from secure_fed.data.heterogeneity import EPSILON, heterogeneity_report, kl_matrix, write_report


def _two_clients():
    # client 0: label counts (3, 1) -> p = (3/4, 1/4); client 1: counts (1, 1) -> q = (1/2, 1/2)
    y = sp.csr_matrix(np.array([[1, 1], [1, 0], [1, 0], [1, 0], [0, 1]], dtype=np.int8))
    return y, [ClientShard(0, np.array([0, 1, 2])), ClientShard(1, np.array([3, 4]))]


def test_kl_matches_a_hand_computed_two_client_example():
    y, shards = _two_clients()
    rep = heterogeneity_report(y, shards)
    assert rep["sizes"] == [3, 2] and rep["size_stats"] == {"min": 2, "median": 2.5, "max": 3, "mean": 2.5}
    assert rep["label_counts"] == [[3, 1], [1, 1]]
    np.testing.assert_allclose(rep["label_distribution"], [[0.75, 0.25], [0.5, 0.5]])
    # by hand: KL(p||q) = 3/4 ln(3/2) + 1/4 ln(1/2) = 0.1308120..., KL(q||p) = 1/2 ln(2/3) + 1/2 ln 2 = 0.1438410...
    kl_pq = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    kl_qp = 0.5 * math.log(2 / 3) + 0.5 * math.log(2)
    assert kl_pq == pytest.approx(0.1308120, abs=1e-7) and kl_qp == pytest.approx(0.1438410, abs=1e-7)
    np.testing.assert_allclose(rep["kl"], [[0.0, kl_pq], [kl_qp, 0.0]], rtol=1e-5)
    assert rep["kl_total"] == pytest.approx(kl_pq + kl_qp, rel=1e-5)  # the sum over ordered pairs i != j
    assert rep["kl_mean"] == pytest.approx((kl_pq + kl_qp) / 2, rel=1e-5)
    assert rep["epsilon"] == EPSILON == 1e-6


def test_smoothing_keeps_disjoint_supports_finite():
    # p = (1, 0), q = (0, 1): KL is infinite without smoothing; with eps it is about ln(1/eps)
    kl = kl_matrix(np.array([[1.0, 0.0], [0.0, 1.0]]), epsilon=1e-6)
    a, b = (1 + 1e-6) / (1 + 2e-6), 1e-6 / (1 + 2e-6)
    expected = a * math.log(a / b) + b * math.log(b / a)
    np.testing.assert_allclose(kl, [[0, expected], [expected, 0]], rtol=1e-9)
    assert expected == pytest.approx(math.log(1e6), rel=1e-4)


def test_client_without_labels_is_listed_and_report_is_json(tmp_path):
    y = sp.csr_matrix(np.array([[1, 0, 1], [0, 0, 0], [0, 1, 0], [0, 0, 0]], dtype=np.int8))
    shards = [ClientShard(0, np.array([0, 2])), ClientShard(1, np.array([1, 3])), ClientShard(2, np.array([], dtype=np.int64))]
    rep = heterogeneity_report(y, shards, label_names=["a", "b", "c"])
    assert rep["clients_without_labels"] == [1, 2] and rep["sizes"] == [2, 2, 0]
    assert np.isfinite(rep["kl"]).all() and rep["kl"][1][2] == 0.0  # both smoothed to the uniform distribution
    json_path, png_path = write_report(rep, tmp_path / "out", title="toy")
    assert json.loads(json_path.read_text()) == json.loads(json.dumps(rep))
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _cli(*args, cwd):
    return subprocess.run([sys.executable, "-m", "secure_fed.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ}, timeout=300)  # fmt: skip


def test_partition_command_writes_the_report_and_errors_are_one_line(tmp_path):
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        "dataset: {name: synthetic, synthetic: {num_train: 300, num_test: 50, num_labels: 8, num_groups: 2}}\n"
        "algorithm: {name: fedavg}\npartition: {name: cmda, num_clients: 4, kmodes_inits: 2}\n"
    )
    r = _cli("partition", str(cfg), "--set", f"output.dir={tmp_path / 'runs'}", cwd=repo)
    assert r.returncode == 0, r.stderr
    assert "cmda" in r.stdout and "total KL" in r.stdout
    out = tmp_path / "runs" / "partition-synthetic-cmda"  # the default: output.dir/partition-DATASET-PARTITIONER
    rep = json.loads((out / "heterogeneity.json").read_text())
    assert rep["num_clients"] == 4 and sum(rep["sizes"]) == 300 and rep["partition"]["name"] == "cmda"
    assert (out / "heterogeneity.png").is_file()
    ids = tmp_path / "ids.txt"
    ids.write_text("0\n1\n")
    r = _cli("partition", str(cfg), "--set", "partition.name=natural", "--set", f"partition.client_ids_file={ids}",
             "--set", "partition.num_clients=null", "--out", str(tmp_path / "rep"), cwd=repo)  # fmt: skip
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr
    assert r.stderr.startswith("error: ") and f"partition.client_ids_file {ids}: has 2 client ids" in r.stderr
