import json

import numpy as np
import pytest
import torch

from secure_fed.config import build_plan
from secure_fed.engine import Experiment, sample_clients
from secure_fed.engine.builders import resolve_device
from secure_fed.errors import ConfigError
from tests.conftest import small_config, small_plan


def test_run_directory_contents(tmp_path):
    res = Experiment(small_plan(), run_dir=tmp_path).run(progress=False)
    assert {p.name for p in tmp_path.iterdir()} >= {"config.yaml", "metrics.jsonl", "summary.json", "private"}
    assert (tmp_path / "private" / "checkpoints" / "final.pt").is_file()
    summary = json.loads((tmp_path / "summary.json").read_text())
    for key in ("algorithm", "dataset", "rounds_completed", "final", "privacy"):
        assert key in summary
    assert summary["privacy"]["epsilon"] == "inf"
    assert {"P@1", "P@3", "P@5", "mAP"} <= set(summary["final"])
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["round"] for x in lines] == [1, 2, 3, 4]  # one line per round; metrics on evaluation rounds
    assert [x["round"] for x in lines if "P@1" in x] == [2, 4]
    assert all(("W_mean_cos" in x) == ("P@1" in x) for x in lines)
    assert all(x["privacy"]["epsilon"] == "inf" for x in lines)
    assert res.summary == summary


@pytest.mark.parametrize("algo", ["fedalc", "fedaws"])
def test_same_seed_same_run_and_resume_is_exact(tmp_path, algo):
    ov = [f"algorithm.name={algo}", "training.rounds=4", "output.checkpoint_every=2"]
    a = Experiment(small_plan(*ov), run_dir=tmp_path / "a")
    a.run(progress=False)
    b = Experiment(small_plan(*ov), run_dir=tmp_path / "b")
    b.run(progress=False)
    assert torch.equal(a.W, b.W) and all(torch.equal(a.theta[k], b.theta[k]) for k in a.theta)

    # stop after 2 rounds (checkpoint), then resume in a fresh process-like object
    c = Experiment(small_plan(*ov, "training.rounds=2"), run_dir=tmp_path / "c")
    c.run(progress=False)
    d = Experiment(small_plan(*ov), run_dir=tmp_path / "c")
    assert d.resume() and d.round == 2
    d.run(progress=False)
    assert torch.equal(a.W, d.W) and all(torch.equal(a.theta[k], d.theta[k]) for k in a.theta)
    ha = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    hd = [json.loads(x) for x in (tmp_path / "c" / "metrics.jsonl").read_text().splitlines()]
    assert [x.get("P@1") for x in ha] == [x.get("P@1") for x in hd]
    da = [json.loads(x) for x in (tmp_path / "a" / "private" / "diagnostics.jsonl").read_text().splitlines()]
    dd = [json.loads(x) for x in (tmp_path / "c" / "private" / "diagnostics.jsonl").read_text().splitlines()]
    assert [x["train_loss"] for x in da] == [x["train_loss"] for x in dd] and len(da) == 4


def test_sampling_fraction_and_proportional():
    sizes = np.array([1, 1, 1, 1000.0])
    assert len(sample_clients(sizes, 0.5, "uniform", 0, 0)) == 2
    picks = [3 in sample_clients(sizes, 0.25, "proportional", 0, r) for r in range(50)]
    assert sum(picks) > 45
    assert sample_clients(sizes, 1.0, "uniform", 0, 0).tolist() == [0, 1, 2, 3]


def test_clients_per_round_is_an_absolute_cohort(tmp_path):
    exp = Experiment(small_plan("training.clients_per_round=7", "training.rounds=1", "output.log_messages=true"),
                     run_dir=tmp_path)  # fmt: skip
    exp.run(progress=False)
    assert len(exp.fed.clients) > 7
    assert len({m["client"] for m in exp.messages if m["direction"] == "up" and "theta_delta" in m["message"]}) == 7
    rounds = [set(sample_clients(np.ones(20), 1.0, "uniform", 0, r, size=7).tolist()) for r in (0, 1)]
    assert [len(r) for r in rounds] == [7, 7] and rounds[0] != rounds[1]
    with pytest.raises(ConfigError, match="clients_per_round or training.client_fraction, not both"):
        small_config("training.clients_per_round=7", "training.client_fraction=0.5")
    with pytest.raises(ConfigError, match="sampling: poisson"):
        small_config("training.clients_per_round=7", "training.sampling=poisson")


def test_device_resolution():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device"):
            resolve_device("cuda")


def test_bf16_precision_runs(tmp_path):
    res = Experiment(small_plan("training.precision=bf16"), run_dir=tmp_path).run(progress=False)
    assert np.isfinite(res.summary["final"]["P@1"])


def test_server_optimizer_on_rows_touches_only_participating_rows(tmp_path):
    exp = Experiment(
        small_plan(
            "algorithm.name=fedavg",
            "training.server_optimizer.apply_to_rows=true",
            "training.client_fraction=0.25",
            "training.rounds=1",
        ),
        run_dir=tmp_path,
    )
    W0 = exp.W.clone()
    exp.setup()
    exp.train_round()
    moved = (exp.W - W0).norm(dim=1) > 0
    assert int(moved.sum()) == 2
    assert torch.allclose(exp.W[moved].norm(dim=1), torch.ones(2))


def test_a_run_in_which_every_round_aborts_fails_and_says_why(tmp_path):
    """Dropout so high that no secure sum completes: the run must not say it trained."""
    from tests.config.test_bad_input import cli
    from tests.conftest import SMALL

    args = [x for o in [*SMALL, "algorithm.name=fedavg", 'protocols=["secure_aggregation"]',
                        "secure_aggregation.dropout=0.95", "training.rounds=3"] for x in ("--set", o)]  # fmt: skip
    code, out, err = cli("run", "--out", str(tmp_path / "run"), *args)
    assert code == 1 and err.count("\n") == 1 and err.startswith("error: no round completed"), err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["rounds_aborted"] == 3 and summary["rounds_completed"] == 3
    assert "aborted" in summary["stop_reason"]


def test_evaluation_cut_offs_without_one_work(tmp_path):
    res = Experiment(small_plan("evaluation.ks=[3,5]"), run_dir=tmp_path).run(progress=False)
    assert {"P@3", "P@5", "nDCG@3", "mAP"} <= set(res.summary["final"]) and "P@1" not in res.summary["final"]


def test_the_sweep_cache_reuses_a_run_recorded_before_new_keys_existed(tmp_path):
    """A finished run whose private/config.yaml lacks keys added later (their defaults apply) is a cache hit."""
    import yaml

    from secure_fed.sweep import cached_summary

    cfg = small_config("training.rounds=1")
    Experiment(build_plan(cfg), run_dir=tmp_path).run(progress=False)
    saved = yaml.safe_load((tmp_path / "private" / "config.yaml").read_text())
    del saved["algorithm"]["ann_nprobe"], saved["dataset"]["drop_empty_labels"]  # as an older version wrote
    (tmp_path / "private" / "config.yaml").write_text(yaml.safe_dump(saved))
    assert cached_summary(build_plan(cfg), tmp_path)["status"] == "completed"
    with pytest.raises(Exception, match="another config"):
        cached_summary(small_plan("training.rounds=2"), tmp_path)


def test_a_diverged_run_stops_and_keeps_its_last_good_checkpoint(tmp_path):
    ov = ["training.rounds=6", "output.checkpoint_every=1", "algorithm.name=fedavg"]
    e = Experiment(small_plan(*ov), run_dir=tmp_path)
    e.setup()
    real = e.trainer.update

    def poisoned(payload, data, hp, gen, privatizer=None, objective=None):  # round 3 sends a non-finite update
        reply = real(payload, data, hp, gen, privatizer, objective)
        if e.round == 2:
            reply["theta_delta"] = {n: t * float("nan") for n, t in reply["theta_delta"].items()}
        return reply

    e.trainer.update = poisoned
    s = e.run(progress=False).summary
    assert s["status"] == "diverged" and s["rounds_completed"] == 3 and "round 3" in s["stop_reason"]
    ck = torch.load(tmp_path / "private" / "checkpoints" / "last.pt", weights_only=False)
    assert ck["round"] == 2 and all(torch.isfinite(t).all() for t in ck["theta"].values())
    diag = [json.loads(x) for x in (tmp_path / "private" / "diagnostics.jsonl").read_text().splitlines()]
    assert [d["round"] for d in diag] == [1, 2, 3]


def test_an_audit_of_a_finished_oracle_sees_the_selected_model(tmp_path):
    from threat_models.context import AuditContext

    e = Experiment(small_plan("algorithm.name=oracle", "training.rounds=6", "evaluation.every=1"), run_dir=tmp_path)
    s = e.run(progress=False).summary
    final = torch.load(tmp_path / "private" / "checkpoints" / "final.pt", weights_only=False)
    ctx = AuditContext.from_run_dir(tmp_path)
    assert torch.equal(ctx.exp.W.cpu(), final["W"]) and 1 <= s["selected_round"] <= 6


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm.name=fedalc", "training.executor=vectorized", 'protocols=["dp"]', "privacy.noise_seed=3",
         "privacy.client={noise_multiplier: 0.5, clip_norm: 1.0}"],
        ["algorithm.name=fedaws", 'protocols=["dp"]', "privacy.noise_seed=3",
         "privacy.local={noise_multiplier: 1.0, clip_norm: 1.0, batch_sample_rate: 0.5, max_labels_per_instance: 8}"],
        ["algorithm.name=fedlgt", "model.family=ctran", "model.ctran={layers: 1, heads: 2, token_size: 4}",
         "partition.name=iid", "partition.num_clients=3", "algorithm.ule=false"],
    ],
    ids=["fedalc-vectorized-client-dp", "fedaws-dp-sgd", "fedlgt"],
)  # fmt: skip
def test_the_cuda_switches_leave_cpu_runs_bit_identical(tmp_path, overrides):
    """A CUDA run switches torch to deterministic kernels process-wide (use_deterministic_cuda); a CPU run after it in
    the same process must give the same bits as before (every algorithm was checked once; these three cover the
    vectorised executor, DP-SGD's per-sample gradients and the transformer)."""
    from secure_fed.engine.builders import use_deterministic_cuda

    def two_rounds(name):
        exp = Experiment(small_plan(*overrides, "training.rounds=2"), run_dir=tmp_path / name)
        exp.run(progress=False)
        return exp

    before = two_rounds("before")
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.utils.deterministic.fill_uninitialized_memory, torch.backends.cuda.flash_sdp_enabled(),
             torch.backends.cuda.mem_efficient_sdp_enabled(), torch.backends.cuda.cudnn_sdp_enabled())  # fmt: skip
    try:
        use_deterministic_cuda()
        assert torch.are_deterministic_algorithms_enabled()
        after = two_rounds("after")
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.utils.deterministic.fill_uninitialized_memory = saved[2]
        torch.backends.cuda.enable_flash_sdp(saved[3])
        torch.backends.cuda.enable_mem_efficient_sdp(saved[4])
        torch.backends.cuda.enable_cudnn_sdp(saved[5])
    assert all(torch.equal(before.theta[k], after.theta[k]) for k in before.theta)
    assert (before.W is None and after.W is None) or torch.equal(before.W, after.W)
    assert before.history == after.history


def test_server_aggregate_gets_the_public_count_under_client_level_dp(monkeypatch, tmp_path):
    """An algorithm that reads the aggregate (SCAFFOLD's server step) is given DP's fixed public denominator (q·N), never
    the realised number of updates, which a secret Poisson cohort makes private; without dp, the number summed."""
    from secure_fed.algorithms.fedavg import FedAvg
    from secure_fed.engine import Experiment

    seen: list[float] = []
    monkeypatch.setattr(FedAvg, "reads_aggregate", True)
    monkeypatch.setattr(FedAvg, "server_aggregate", lambda self, theta_mean, count: seen.append(count))
    base = ["algorithm.name=fedavg", "training.rounds=3", "training.client_fraction=0.5", "training.sampling=poisson"]
    dp = ['protocols=["dp"]', 'privacy.client={"noise_multiplier": 1.0, "clip_norm": 0.5}']
    e = Experiment(small_plan(*base, *dp), run_dir=tmp_path / "dp")
    e.run(progress=False)
    n = len(e.fed.clients)
    assert seen and all(c == pytest.approx(0.5 * n) for c in seen)
    seen.clear()
    e = Experiment(small_plan(*base), run_dir=tmp_path / "plain")
    e.run(progress=False)
    assert seen and all(float(c).is_integer() and 0 < c <= n for c in seen)
