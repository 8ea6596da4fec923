"""The CUDA path. Tests marked ``cuda`` run only where torch sees a GPU, and never under ``CI=true`` (CI has no GPU);
elsewhere they skip cleanly. ``benchmarks/cuda_check.sh`` runs them on a lent GPU machine with the benchmarks.

What they hold: ``device: auto`` puts the data, the models and the server's state on the GPU; an fp32 round there
follows the same round on the CPU for every algorithm (the client draws come from the run's CPU generators, and
C-Tran runs without dropout, whose masks come from the device's generator), within a bound far below how far the
rounds move the state; the vectorised executor gives the sequential executor's rounds there under every protocol
layer (the CPU equivalence cases, same bound); bf16 autocast under both executors stays within bf16 rounding of the
fp32 round; a run resumed from a checkpoint ends exactly where an uninterrupted run ends; ResNet-18 learns on images;
DP-SGD in client training follows the CPU. An op that torch's deterministic mode has no kernel for would only warn
in a run (and cost exact resume); here it fails the test."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from secure_fed.algorithms.batched_sgd import relative_error
from secure_fed.config import load_plan
from secure_fed.engine import Experiment
from tests.conftest import SMALL, small_plan
from tests.engine.test_images_end_to_end import IMAGES, _frequency_baseline_map
from tests.engine.test_vectorized import CASES, PLAIN, _after_rounds, _theta_and_W

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(os.environ.get("CI", "").lower() == "true", reason="CI runs no GPU tests"),
    # torch's warning when deterministic mode meets an op without a deterministic kernel (or a non-deterministic
    # attention backward): in a run it only warns; a resumed run would then not be exact
    pytest.mark.filterwarnings("error:.*deterministic"),
]

GPU = "device=cuda"

CTRAN = ["model.family=ctran", "model.ctran={layers: 1, heads: 2, token_size: 4, dropout: 0.0}"]

#: every algorithm of the two settings, with what it needs beyond the small synthetic default
ALGORITHMS = {
    "fedavg": [],
    "fedavg_fixed": [],
    "fedaws": [],
    "fedalc": [],
    # W's pre-training on reg_fc is chaotic at this size: 500 steps at η = 1 (the defaults) turn a 4e-7 change of W
    # into a relative difference of 1.5 on the CPU alone; 10 steps at η = 0.05 keep it at 2e-7
    "fedalc_fixed": ["algorithm.fixed_steps=10", "algorithm.fixed_lr=0.05"],
    "oracle": [],
    "flag": ["model.family=linear_head", "partition.name=dirichlet", "partition.num_clients=6"],
    # C-Tran without dropout: its masks come from torch's generator on the device, another stream than the CPU's
    # (FedLGT's CA-MLE masks come from the client's CPU generator); with client SGD a 1e-7 change of θ stays 1e-7
    # after the two rounds on the CPU (with Adam it grows to 5e-6)
    "fedctran": [*CTRAN, "partition.name=iid", "partition.num_clients=3"],
    "fedlgt": [*CTRAN, "partition.name=iid", "partition.num_clients=3", "algorithm.ule=false"],
}

#: how far two rounds move the state (relative to it) must dwarf the device bound: measured on the CPU 0.0078 (flag)
#: to 0.17 (oracle), against 1e-4
MOVED = 5e-3


def _on(device: str, tmp_path, name: str, *overrides: str, rounds: int = 2) -> Experiment:
    """``rounds`` rounds after set-up; the state after set-up is kept as ``exp.initial``."""
    exp = Experiment(small_plan(*PLAIN, *overrides, f"device={device}"), run_dir=tmp_path / name)
    exp.setup()
    exp.initial = _cpu(_theta_and_W(exp))
    for _ in range(rounds):
        exp.train_round()
    return exp


def _cpu(state: dict) -> dict:
    return {k: v.detach().cpu() for k, v in state.items()}


def test_auto_puts_the_data_the_models_and_the_servers_state_on_the_gpu(tmp_path):
    exp = Experiment(small_plan("device=auto"), run_dir=tmp_path)
    exp.setup()
    assert exp.device.type == "cuda"
    assert all(p.is_cuda for p in exp.worker.parameters()) and all(p.is_cuda for p in exp.encoder.parameters())
    assert all(v.is_cuda for v in exp.theta.values()) and exp.W.is_cuda
    assert exp.fed.clients[0].x.is_cuda
    assert exp.memory.gpu and exp.memory.host_available  # the memory check weighs the GPU's and the host's terms apart
    exp.train_round()
    assert all(v.is_cuda for v in exp.theta.values()) and exp.W.is_cuda
    res = exp.run(progress=False)
    assert res.summary["status"] == "completed" and np.isfinite(res.summary["final"]["P@1"])


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
def test_an_fp32_round_on_the_gpu_follows_the_same_round_on_the_cpu(tmp_path, algo):
    """The kernels sum in other orders (and TF32 stays off for fp32 products), so the two agree to rounding."""
    ov = [f"algorithm.name={algo}", *ALGORITHMS[algo]]
    cpu, gpu = _on("cpu", tmp_path, "cpu", *ov), _on("cuda", tmp_path, "gpu", *ov)
    assert relative_error(_theta_and_W(cpu), cpu.initial) > MOVED
    assert relative_error(_cpu(_theta_and_W(gpu)), _theta_and_W(cpu)) < 1e-4


@pytest.mark.parametrize("algo,extra", CASES, ids=[f"{a}-{'-'.join(e) or 'plain'}" for a, e in CASES])
def test_the_vectorised_rounds_equal_the_sequential_rounds_on_the_gpu(tmp_path, monkeypatch, algo, extra):
    seq, s_stats = _after_rounds(tmp_path, "seq", f"algorithm.name={algo}", *extra, GPU, monkeypatch=monkeypatch)
    vec, v_stats = _after_rounds(
        tmp_path, "vec", f"algorithm.name={algo}", *extra, GPU, "training.executor=vectorized", monkeypatch=monkeypatch
    )
    assert vec.device.type == "cuda" and vec.executor.batched > 0 and not vec.executor.unbatched
    assert relative_error(_cpu(_theta_and_W(vec)), _cpu(_theta_and_W(seq))) < 1e-5
    assert v_stats["train_loss"] == pytest.approx(s_stats["train_loss"], rel=1e-4)


def test_bf16_autocast_runs_on_the_gpu_under_both_executors_within_bf16_rounding_of_fp32(tmp_path):
    """On the CPU both executors' bf16 rounds end 9e-5 and 1.6e-4 (relative) from the fp32 round, which moved the
    state by 0.087: bf16 really ran (fp32 alone differs by ~1e-7), and only rounding separates them."""
    fp32 = _on("cuda", tmp_path, "fp32")
    ref = _cpu(_theta_and_W(fp32))
    moved = relative_error(ref, fp32.initial)
    runs = {ex: _on("cuda", tmp_path, ex, "training.precision=bf16", f"training.executor={ex}") for ex in
            ("sequential", "vectorized")}  # fmt: skip
    errs = {ex: relative_error(_cpu(_theta_and_W(e)), ref) for ex, e in runs.items()}
    assert all(1e-5 < e < moved / 50 for e in errs.values()), (errs, moved)
    assert runs["vectorized"].executor.batched > 0
    assert all(v.dtype == torch.float32 for v in runs["vectorized"].theta.values())  # the state stays fp32


#: FedALC under client-level DP with both executors (its regulariser's backward is an index_add_ with repeated
#: indices); FedLGT's transformer with dropout (each client's turn reseeds the device's generator) and CA-MLE
RESUMED = {
    "fedalc-sequential": ["algorithm.name=fedalc", "training.executor=sequential"],
    "fedalc-vectorized": ["algorithm.name=fedalc", "training.executor=vectorized"],
    "fedlgt": [
        "algorithm.name=fedlgt",
        "model.family=ctran",
        "model.ctran={layers: 1, heads: 2, token_size: 4}",
        "partition.name=iid",
        "partition.num_clients=3",
        "algorithm.ule=false",
        "training.client_optimizer=adam",
    ],
}


@pytest.mark.parametrize("case", sorted(RESUMED))
def test_a_resumed_gpu_run_ends_exactly_where_an_uninterrupted_one_ends(tmp_path, case):
    """CUDA sums with atomic adds (index_add_ with repeated indices) would make two runs differ in their last bits;
    the engine switches CUDA to deterministic kernels, so a resumed run is exact (on an H200, without the switch
    both FedALC cases failed; the FedLGT case passed either way at this size)."""
    ov = [*RESUMED[case], "training.rounds=4", "output.checkpoint_every=2", GPU, 'protocols=["dp"]',
          "privacy.noise_seed=11", 'privacy.client={"noise_multiplier": 0.5, "clip_norm": 1.0}']  # fmt: skip
    full = Experiment(small_plan(*ov), run_dir=tmp_path / "full")
    full.run(progress=False)
    Experiment(small_plan(*ov, "training.rounds=2"), run_dir=tmp_path / "cut").run(progress=False)
    resumed = Experiment(small_plan(*ov), run_dir=tmp_path / "cut")
    assert resumed.resume() and resumed.round == 2
    resumed.run(progress=False)
    assert all(torch.equal(full.theta[k], resumed.theta[k]) for k in full.theta)
    assert (full.W is None and resumed.W is None) or torch.equal(full.W, resumed.W)
    lines = [[json.loads(x) for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()] for d in ("full", "cut")]
    assert [x.get("mAP") for x in lines[0]] == [x.get("mAP") for x in lines[1]]


def test_resnet_images_learn_on_the_gpu(tmp_path):
    """Two rounds of ResNet-18 (random init) on 300 mosaics: on the CPU mAP 45.2 against 34.2 for scoring every
    mosaic with the training label frequencies."""
    ov = [*IMAGES, GPU, "training.rounds=2", "evaluation.every=2",
          "dataset.mosaics={grid: 2, tile_size: 8, num_train: 300, num_test: 100}"]  # fmt: skip
    exp = Experiment(load_plan(overrides=ov), run_dir=tmp_path)
    res = exp.run(progress=False)
    assert next(exp.worker.parameters()).is_cuda
    assert res.summary["status"] == "completed"
    assert res.summary["final"]["mAP"] > _frequency_baseline_map(exp.dataset) + 5


def test_the_cli_runs_the_embedded_default_on_the_gpu_and_reports_epsilon(tmp_path):
    from tests.config.test_bad_input import cli

    args = [x for o in [*SMALL, "device=auto"] for x in ("--set", o)]
    code, out, err = cli("run", "--out", str(tmp_path / "run"), *args)
    assert code == 0, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["privacy"]["epsilon"] == "inf" and summary["status"] == "completed"
    assert summary["device"].startswith("cuda")


def test_a_round_whose_cohort_is_empty_runs_fedaws_server_step_on_the_gpu(tmp_path):
    """Poisson sampling can draw nobody; FedAwS's server step then mines negatives among no participating class,
    an empty index that must live on the GPU too."""
    ov = ["algorithm.name=fedaws", GPU, "training.sampling=poisson", "training.client_fraction=0.01", "training.rounds=3"]
    exp = Experiment(small_plan(*ov), run_dir=tmp_path)
    res = exp.run(progress=False)
    rounds = [json.loads(x) for x in (tmp_path / "private" / "diagnostics.jsonl").read_text().splitlines()]
    assert res.summary["status"] == "completed" and len(rounds) == 3
    assert any(r["clients"] == 0 for r in rounds)  # the case this test is about happened


#: DP-SGD in client training: FedAwS's MLP takes the linear fast path (per-sample gradients of a Linear chain in
#: closed form), C-Tran the general per-sample path
LOCAL_DP = {
    "mlp": ["algorithm.name=fedaws"],
    "ctran": ["algorithm.name=fedctran", *ALGORITHMS["fedctran"]],
}


@pytest.mark.parametrize("model", sorted(LOCAL_DP))
def test_dp_sgd_in_client_training_on_the_gpu_follows_the_cpu(tmp_path, model):
    """Per-sample gradients, their clip and the noise on the GPU: the batches and the noise come from the run's secret
    streams on the CPU, so a fixed ``privacy.noise_seed`` gives both devices the same draws. (Passed on an H200,
    ``results/cuda_h200/call4_tests_bench``.)"""
    ov = [*LOCAL_DP[model], 'protocols=["dp"]', "privacy.noise_seed=5",
          "privacy.local={noise_multiplier: 1.0, clip_norm: 1.0, batch_sample_rate: 0.5, "
          "max_labels_per_instance: 8}"]  # fmt: skip
    cpu, gpu = _on("cpu", tmp_path, "cpu", *ov), _on("cuda", tmp_path, "gpu", *ov)
    assert relative_error(_theta_and_W(cpu), cpu.initial) > MOVED
    assert relative_error(_cpu(_theta_and_W(gpu)), _theta_and_W(cpu)) < 1e-4
    assert 0 < gpu.privacy_summary()["epsilon"] < float("inf")
