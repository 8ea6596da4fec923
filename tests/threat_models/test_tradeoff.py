"""``secure-fed tradeoff``: one command runs the grid (resumable), the attacks and the report."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SMALL

REPO = Path(__file__).resolve().parents[2]


def _tradeoff(out: Path, *extra: str) -> subprocess.CompletedProcess:
    sets = [x for o in [*SMALL, "training.rounds=2", "protocols=[dp]", "attacks.membership_inference.shadows=0",
                        'privacy.local={"batch_sample_rate": 0.5, "noise_multiplier": 1.0, '
                        '"max_labels_per_instance": 8}'] for x in ("--set", o)]  # fmt: skip
    args = [sys.executable, "-m", "secure_fed.cli", "tradeoff", "--methods", "fedaws", "--epsilons", "4,inf",
            "--seeds", "0", "--attacks", "membership_inference", "--workers", "1", "--reference", "none", "--prior", "none",
            *sets,
            "--out", str(out), *extra]  # fmt: skip
    return subprocess.run(args, capture_output=True, text=True, cwd=REPO)


def test_tradeoff_runs_the_grid_then_skips_finished_runs(tmp_path):
    out = tmp_path / "study"
    done = _tradeoff(out)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[2/2]" in done.stdout
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 2 and {r["method"] for r in rows} == {"fedaws"}
    for r in rows:
        if r["target_epsilon"] == "inf":
            assert r["epsilon"] == "inf"
        else:  # the fixed noise_multiplier was dropped: σ calibrated to the target, which holds
            assert float(r["target_epsilon"]) == 4.0 and 0 < float(r["epsilon"]) <= 4.0 and float(r["sigma"]) != 1.0
        assert not any("membership_inference" in k for k in r)  # the released table: no attack column
    # the attacks' results are computed from the members: operator-only, in DIR/private/ (read from runs' private/)
    operator = list(csv.DictReader((out / "private" / "results.csv").open()))
    assert [r["run"] for r in operator] == [r["run"] for r in rows]
    for r in operator:
        assert 0.0 <= float(r["operator.membership_inference.loss.auc"]) <= 1.0
    assert all((out / "runs" / r["run"] / "private" / "attacks.json").is_file() for r in rows)
    assert not list(out.glob("runs/*/attacks.json")) and not list(out.glob("runs/*/roc.png"))
    page = (out / "report.html").read_text()
    assert page.count("<figure data-plot=") >= 2 and '<table id="runs">' in page and "loss.auc" not in page
    # the curve in its seed band, said to be one (the band's kind in the legend, the caption and the note)
    assert 'id="curve-0"' in page and 'id="band-0"' in page and "fedaws: seed min–max over seeds" in page
    assert "band: seed min–max" in page and "Bands: min–max over seeds [0]" in page
    assert (out / "utility_vs_epsilon.png").is_file() and not list(out.glob("attack_*.png"))
    private_page = (out / "private" / "report.html").read_text()
    assert private_page.count("<figure data-plot=") >= 3 and "operator.membership_inference.loss.auc" in private_page
    assert 'id="cibar-0"' in private_page and "fedaws: each run's 95% CI</text>" in private_page  # the CI bars' legend
    assert list((out / "private").glob("attack_*.png"))
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/summary.json")}
    again = _tradeoff(out)  # every run is finished: nothing retrains, the report is rewritten
    assert again.returncode == 0, again.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in out.glob("runs/*/summary.json")} == stamps
    assert math.isfinite(float(rows[0]["P@1"]))


@pytest.mark.parametrize(
    ("extra", "needle"),
    [(["--epsilons", "0,1"], "error: --epsilons"), (["--seeds", "0,0"], "listed twice"), (["--workers", "0"], "--workers 0")],
)
def test_bad_arguments_are_one_line_and_write_nothing(tmp_path, extra, needle):
    done = _tradeoff(tmp_path / "s", *extra)
    err = done.stderr.strip()
    assert done.returncode == 2 and err.startswith("error: ") and needle in err and "\n" not in err
    assert not (tmp_path / "s").exists()


def test_grid_points_set_the_one_target_and_drop_what_a_method_lacks():
    from secure_fed.config import load_config, load_plan
    from threat_models.tradeoff_points import point_overrides

    base_ov = ['protocols=["dp", "secure_aggregation"]', "algorithm.normalize_gamma=false",
               'privacy.instance={"noise_multiplier": 2.0}',
                   'privacy.local={"noise_multiplier": 1.0, "max_labels_per_instance": 8}']  # fmt: skip
    base = load_plan(overrides=base_ov)
    fedalc = point_overrides(base, method="fedalc", eps=2.0, seed=1, unit="instance", attacks=[])
    assert {"privacy.instance.target_epsilon=2", "privacy.local.target_epsilon=2", "privacy.instance.noise_multiplier=null",
            "privacy.local.noise_multiplier=null", "seed=1", "algorithm.name=fedalc"} <= set(fedalc)  # fmt: skip
    cfg = load_config(overrides=[*base_ov, *fedalc])
    assert cfg.privacy.instance.target_epsilon == cfg.privacy.local.target_epsilon == 2.0
    assert cfg.privacy.local.noise_multiplier is None and cfg.protocols == ["dp", "secure_aggregation"]
    fedaws = point_overrides(base, method="fedaws", eps=2.0, seed=0, unit="instance", attacks=[])
    assert "privacy.instance=null" in fedaws and "privacy.local.target_epsilon=2" in fedaws
    plain = point_overrides(base, method="fedaws", eps=float("inf"), seed=0, unit="instance", attacks=["one_run_audit"])
    cfg = load_config(overrides=[*base_ov, *plain])
    assert cfg.protocols == ["secure_aggregation"] and cfg.privacy.local is None and cfg.attacks.names() == ["one_run_audit"]


def test_fedaws_on_the_tradeoff_config_written_for_fedalc_runs(tmp_path):
    """tradeoff_synthetic.yaml sets privacy.instance (fedalc's label-set step), which fedaws refuses: the base of a
    method without that step is read without it, and its points drop it (was: exit 2 before anything ran)."""
    from protocols.config_sections import PrivacyConfig
    from threat_models.tradeoff_points import method_base, point_overrides

    config = str(REPO / "experiments" / "configs" / "tradeoff_synthetic.yaml")
    base = method_base(config, [], "fedaws")
    assert base.part(PrivacyConfig).instance is None and base.part(PrivacyConfig).local is not None
    from secure_fed.config import load_config

    cfg = load_config(config, point_overrides(base, method="fedaws", eps=4.0, seed=0, unit="instance", attacks=[]))
    assert cfg.algorithm.name == "fedaws" and cfg.privacy.instance is None and cfg.privacy.local.target_epsilon == 4.0
    tiny = ["training.rounds=1", "evaluation.every=1", "dataset.synthetic.num_train=300", "dataset.synthetic.num_test=100"]
    args = [sys.executable, "-m", "secure_fed.cli", "tradeoff", config, "--methods", "fedaws", "--epsilons", "4",
            "--seeds", "0", "--workers", "1", "--reference", "none", "--prior", "none", *[x for o in tiny for x in ("--set", o)],
            "--out", str(tmp_path / "s")]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = list(csv.DictReader((tmp_path / "s" / "results.csv").open()))
    assert row["method"] == "fedaws" and 0 < float(row["epsilon"]) <= 4.0


def test_a_block_that_gives_its_sigma_keeps_it_beside_a_calibrated_one():
    """The private recipe fixes the W step's σ (heavy noise, little budget) and calibrates DP-SGD's: the sweep sets the
    target on both blocks and frees only the σ the config leaves free."""
    from secure_fed.config import load_config, load_plan
    from threat_models.tradeoff_points import point_overrides

    base_ov = ["protocols=[dp]", "algorithm.normalize_gamma=false", 'privacy.instance={"noise_multiplier": 20.0}',
               'privacy.local={"target_epsilon": 4.0, "max_labels_per_instance": 2}']  # fmt: skip
    base = load_plan(overrides=base_ov)
    ov = point_overrides(base, method="fedalc", eps=1.0, seed=0, unit="instance", attacks=[])
    cfg = load_config(overrides=[*base_ov, *ov])
    assert cfg.privacy.instance.noise_multiplier == 20.0 and cfg.privacy.local.noise_multiplier is None
    assert cfg.privacy.instance.target_epsilon == cfg.privacy.local.target_epsilon == 1.0


def test_the_central_reference_reports_its_last_epoch_at_every_epsilon():
    """An epoch selected on a split of the training data would be a choice outside ε: the oracle's points in a study
    set validation_fraction 0, and under dp it validates as the central DP reference (privacy.local only)."""
    from secure_fed.config import load_config
    from threat_models.tradeoff_points import method_base, point_overrides

    base_ov = ["protocols=[dp]", "algorithm.normalize_gamma=false", 'privacy.instance={"noise_multiplier": 20.0}',
               'privacy.local={"target_epsilon": 4.0, "max_labels_per_instance": 2}']  # fmt: skip
    base = method_base(None, base_ov, "oracle")
    for eps in (2.0, float("inf")):
        ov = point_overrides(base, method="oracle", eps=eps, seed=0, unit="instance", attacks=[])
        assert "algorithm.validation_fraction=0" in ov
        cfg = load_config(overrides=[*base_ov, *ov])
        assert cfg.algorithm.validation_fraction == 0 and (cfg.privacy.local is None) == math.isinf(eps)


def test_the_central_dp_reference_is_drawn_beside_positive_only_methods():
    from threat_models.tradeoff_points import central_reference_method

    local = ["protocols=[dp]", 'privacy.local={"target_epsilon": 4.0, "max_labels_per_instance": 2}']
    assert central_reference_method(None, local, ["fedaws"], unit="instance")[0] == ["oracle"]
    assert central_reference_method(None, local, ["fedaws", "oracle"], unit="instance")[0] == []
    assert central_reference_method(None, local, ["fedaws"], unit="client")[0] == []
    extra, why = central_reference_method(None, ["protocols=[dp]", 'privacy.client={"target_epsilon": 4.0}'], ["fedaws"],
                                          unit="instance")  # fmt: skip
    assert extra == [] and "does not run as oracle" in why and "privacy.local only" in why


def _die_like_the_oom_killer() -> None:
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def test_a_worker_killed_by_the_system_ends_the_study_with_one_clear_error():
    """A worker the system kills (the OOM killer's SIGKILL) is a ``SecureFedError`` naming memory and --workers, which
    the CLI prints as one ``error:`` line, not a BrokenProcessPool traceback."""
    from secure_fed.plugin_api.attacks import SecureFedError
    from threat_models.tradeoff_points import worker_pool

    with pytest.raises(SecureFedError, match=r"worker process of the study died .*memory.*--workers"):
        with worker_pool(1) as pool:
            pool.submit(_die_like_the_oom_killer).result()


def test_the_studys_noiseless_infinity_keeps_the_dp_layer_and_zeroes_every_blocks_sigma():
    from secure_fed.config import build_plan
    from secure_fed.plugin_api.attacks import SecureFedError
    from tests.conftest import small_config
    from threat_models.tradeoff_points import point_overrides

    config = small_config("algorithm.name=fedalc", "algorithm.normalize_gamma=false", "protocols=[dp]",
                          "privacy.instance={noise_multiplier: 20.0, sample_rate: 0.5}",
                          "privacy.local={target_epsilon: 4.0, batch_sample_rate: 1.0, max_labels_per_instance: 2}")  # fmt: skip
    base = build_plan(config)
    ov = point_overrides(base, method="fedalc", eps=math.inf, seed=0, unit="instance", attacks=[], infinity="noiseless")
    assert not any(o.startswith("protocols=") for o in ov), ov  # the dp layer stays
    for block in ("instance", "local"):
        assert f"privacy.{block}.noise_multiplier=0" in ov and f"privacy.{block}.target_epsilon=null" in ov, ov
    plain = point_overrides(base, method="fedalc", eps=math.inf, seed=0, unit="instance", attacks=[])
    assert "protocols=[]" in plain  # the default ε = ∞ point: no dp layer
    with pytest.raises(SecureFedError, match="--infinity 'zero'"):
        point_overrides(base, method="fedalc", eps=math.inf, seed=0, unit="instance", attacks=[], infinity="zero")


def test_the_noiseless_infinity_reaches_the_runs_and_the_note(tmp_path):
    """``--infinity noiseless`` on the command line: the ε = ∞ run keeps the dp layer at σ = 0 (results.csv), and the
    study's note says what its ε = ∞ points ran."""
    sets = [x for o in [*SMALL, "training.rounds=1", "protocols=[dp]",
                        'privacy.local={"batch_sample_rate": 1.0, "target_epsilon": 4.0, "max_labels_per_instance": 8}']
            for x in ("--set", o)]  # fmt: skip
    out = tmp_path / "study"
    done = subprocess.run([sys.executable, "-m", "secure_fed.cli", "tradeoff", "--methods", "fedaws", "--epsilons", "inf",
                           "--infinity", "noiseless", "--seeds", "0", "--workers", "1", "--reference", "none", *sets,
                           "--out", str(out)], capture_output=True, text=True, cwd=REPO)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {r["method"]: r for r in csv.DictReader((out / "results.csv").open())}
    assert rows["fedaws"]["epsilon"] == "inf" and float(rows["fedaws"]["sigma"]) == 0.0, rows["fedaws"]
    assert rows["label_prior"]["sigma"] == ""  # the label prior's ∞: its exact counts, no dp layer
    page = (out / "report.html").read_text()
    assert "the same dp layer with noise_multiplier 0" in page and "its exact statistic, without the dp layer" in page
