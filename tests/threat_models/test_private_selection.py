"""``tradeoff --select private``: the selection's ε (Papernot & Steinke Thm 2), its secret draw, and its options."""

from __future__ import annotations

import csv
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def test_gaussian_rdp_at_q1_is_the_closed_form():
    """With q = 1 one Gaussian step is (α, α/(2σ²))-RDP; T steps add up."""
    from protocols.dp.private_selection import ORDERS, rdp_curve

    curve = rdp_curve([(2.0, 1.0, 3)])
    assert np.allclose(curve, [3 * a / (2 * 2.0**2) for a in ORDERS])


def test_theorem_2_by_hand_for_the_geometric_distribution():
    """η = 1, γ = 1/μ: ε'(λ) = ε(λ) + 2 min_λ̂ [(1 − 1/λ̂) ε(λ̂) + log(μ)/λ̂] + log μ/(λ − 1), Q the Gaussian at q = 1."""
    from protocols.dp.private_selection import ORDERS, rdp_curve, selection_epsilon, selection_rdp

    sigma, mu, delta = 3.0, 4.0, 1e-5
    curve = rdp_curve([(sigma, 1.0, 1)])
    lam = np.array(ORDERS)
    hat = min((1 - 1 / b) * b / (2 * sigma**2) + math.log(mu) / b for b in ORDERS)
    by_hand = lam / (2 * sigma**2) + 2 * hat + math.log(mu) / (lam - 1)
    assert np.allclose(selection_rdp(curve, eta=1.0, gamma=1 / mu), by_hand)
    # Opacus's conversion: ε = min_λ ε'(λ) + log((λ − 1)/λ) − (log δ + log λ)/(λ − 1)
    conv = by_hand + np.log((lam - 1) / lam) - (math.log(delta) + np.log(lam)) / (lam - 1)
    assert selection_epsilon([[(sigma, 1.0, 1)]], delta=delta, eta=1.0, gamma=1 / mu) == pytest.approx(conv.min())


def test_the_selection_costs_more_than_one_run_and_more_with_more_runs():
    from protocols.dp.private_selection import gamma_for_mean, rdp_curve, rdp_to_epsilon, selection_epsilon

    h = [(1.2, 0.1, 100)]
    one = rdp_to_epsilon(rdp_curve(h), 1e-5)
    eps = [selection_epsilon([h], delta=1e-5, eta=1.0, gamma=gamma_for_mean(m, 1.0)) for m in (1.5, 3, 10, 100)]
    assert one < eps[0] < eps[1] < eps[2] < eps[3]
    # the worst candidate binds: a noisier second candidate changes nothing, a less noisy one raises ε
    assert selection_epsilon([h, [(3.0, 0.1, 100)]], delta=1e-5, eta=1.0, gamma=1 / 3) == pytest.approx(eps[1])
    assert selection_epsilon([h, [(0.8, 0.1, 100)]], delta=1e-5, eta=1.0, gamma=1 / 3) > eps[1]


@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0, 2.0])
def test_the_count_distribution_has_the_mean_it_is_given(eta):
    from protocols.dp.private_selection import count_pmf, draw_count, expected_count, gamma_for_mean

    gamma = gamma_for_mean(4.0, eta)
    assert expected_count(eta, gamma) == pytest.approx(4.0)
    ks = np.arange(1, 3000)
    p = np.array([count_pmf(int(k), eta, gamma) for k in ks])
    assert p.sum() == pytest.approx(1.0, abs=1e-6) and (p * ks).sum() == pytest.approx(4.0, rel=1e-4)
    rng = random.Random(0)
    assert np.mean([draw_count(rng, eta, gamma) for _ in range(4000)]) == pytest.approx(4.0, rel=0.1)


def test_the_per_run_target_is_calibrated_so_the_total_holds():
    from threat_models.private_selection import calibrate_per_run

    plans = [([(0.5, 8, None)], 1e-5, "rdp"), ([(0.25, 16, None)], 1e-5, "rdp")]
    eps_r, total = calibrate_per_run(4.0, plans, eta=1.0, gamma=1 / 3)
    assert 0 < eps_r < 4.0 and 3.8 < total <= 4.0
    eps_r10, _ = calibrate_per_run(4.0, plans, eta=1.0, gamma=1 / 10)
    assert eps_r10 < eps_r  # more runs on average: less budget for each


def test_k_and_the_candidates_come_from_the_secret_rng_and_are_reused_on_resume(tmp_path, monkeypatch):
    """The draw uses secrets.SystemRandom (not the config seed): with it replaced, the draw is the replacement's;
    the stored draw (mode 0600) is reused on a rerun, never redrawn."""
    import secrets

    from threat_models import private_selection as ps

    calls = []

    class Fixed(random.Random):
        def __init__(self):
            calls.append(1)
            super().__init__(12345)

    monkeypatch.setattr(secrets, "SystemRandom", Fixed)
    d = ps.draw(tmp_path / "p", 5, eta=1.0, gamma=1 / 3)
    rng = random.Random(12345)
    from protocols.dp.private_selection import draw_count

    k = draw_count(rng, 1.0, 1 / 3)
    assert calls == [1] and d == {"K": k, "candidates": [rng.randrange(5) for _ in range(k)]}
    path = tmp_path / "p" / "draw.json"
    assert (os.stat(path).st_mode & 0o777) == 0o600 and (os.stat(path.parent).st_mode & 0o077) == 0
    assert ps.draw(tmp_path / "p", 5, eta=1.0, gamma=1 / 3) == d and calls == [1]  # resumed: no second draw


def test_two_draws_with_the_same_config_differ():
    """The real RNG: 40 draws are not all equal (a draw from the config seed would be)."""
    from protocols.dp.private_selection import draw_count
    from threat_models.private_selection import secret_rng

    assert len({tuple(draw_count(secret_rng(), 1.0, 0.1) for _ in range(5)) for _ in range(8)}) > 1


def test_the_selection_and_report_rows_are_disjoint_and_public():
    from threat_models.private_selection import split_rows

    sel, rep = split_rows(200, 0, 0.5)
    assert len(sel) == len(rep) == 100 and not set(sel) & set(rep) and set(sel) | set(rep) == set(range(200))
    assert np.array_equal(split_rows(200, 0, 0.5)[0], sel)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--select", "private"], "--candidates"),
        (["--select", "private", "--candidates", "training.client_lr"], "--candidates"),
        (["--select", "private", "--candidates", "training.client_lr=0.1", "--select-mean", "1"], "--select-mean"),
        (["--select", "private", "--candidates", "training.client_lr=0.1", "--select-eta", "-0.5"], "--select-eta"),
        (["--candidates", "training.client_lr=0.1"], "--select private"),
    ],
)
def test_bad_selection_options_are_one_line(tmp_path, extra, needle):
    args = [sys.executable, "-m", "secure_fed.cli", "tradeoff", "--epsilons", "4", "--seeds", "0", *extra,
            "--out", str(tmp_path / "s")]  # fmt: skip
    done = subprocess.run(args, capture_output=True, text=True, cwd=REPO)
    err = done.stderr.strip()
    assert done.returncode == 2 and err.startswith("error: ") and needle in err and "\n" not in err
    assert not (tmp_path / "s").exists()


def test_a_private_selection_study_releases_one_row_per_point_and_nothing_of_the_rest(tmp_path):
    """End to end, K secret (mean 2) over a 2-candidate grid: the released study holds one run per point and one row,
    the total ε ≤ the target and above the per-run ε, the row's metrics from the report half, and no trace of K: no
    scratch directory, no candidate index in any released file."""
    from tests.threat_models.test_tradeoff import _tradeoff

    out = tmp_path / "study"
    done = _tradeoff(out, "--select", "private", "--candidates", "training.client_lr=0.05,0.2", "--select-mean", "2",
                     "--epsilons", "4", "--attacks", "")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 1
    r = rows[0]
    assert float(r["target_epsilon"]) == 4.0 and float(r["per_run_epsilon"]) < float(r["epsilon"]) <= 4.0
    assert r["selected"] in ("training.client_lr=0.05", "training.client_lr=0.2")
    assert "report half" in r["metrics_on"] and "seeds" in r["composed"]
    assert [p.name for p in (out / "runs").iterdir()] == [r["run"]]
    assert not Path(f"{out}.selection-private").exists()
    assert not {"k", "K", "draw", "candidates_run"} & set(r)  # no column says how many runs there were
    for f in out.rglob("*"):  # every file, checkpoints included: the chosen one's index would leak K
        if f.is_file():
            data = f.read_bytes()
            assert b"candidate-" not in data and b"selection-private" not in data, f
            if f.suffix in (".json", ".jsonl"):
                assert '"K"' not in data.decode(errors="replace"), f
    # the released metrics are the report half's, recomputed here from the released model
    from threat_models.private_selection import half_metrics

    _, report, _ = half_metrics(out / "runs" / r["run"], 0, 0.5, None)
    assert float(r["P@1"]) == pytest.approx(report["P@1"])


def test_the_grid_may_not_set_what_the_epsilon_is_computed_from():
    """A candidate axis over privacy settings (other than a clip norm), protocols, the seed or the attacks would train
    runs the selection's ε does not describe: refused before anything runs."""
    from secure_fed.errors import SecureFedError
    from threat_models.private_selection import parse_candidates

    for bad in ("privacy.local.target_epsilon=50", "privacy.local.noise_multiplier=0.1", "privacy.delta=0.1",
                "protocols=[]", "seed=1,2", "attacks.run=[]", "privacy.noise_seed=1"):  # fmt: skip
        with pytest.raises(SecureFedError, match="may not set"):
            parse_candidates([bad])
    assert parse_candidates(["privacy.local.clip_norm=0.5,1", "training.client_lr=0.1"]) == [
        ["privacy.local.clip_norm=0.5", "training.client_lr=0.1"],
        ["privacy.local.clip_norm=1", "training.client_lr=0.1"],
    ]


def test_a_candidate_that_spent_more_than_its_plan_is_not_released(tmp_path):
    """After training, every candidate's ledger must lie within the planned (σ, q, steps) the ε was computed from."""
    import json

    from secure_fed.errors import SecureFedError
    from threat_models.private_selection import check_within_plan

    plan = ([(0.5, 8, 2.0)], 1e-5, "rdp")  # a fixed σ: the planned history is (2.0, 0.5, 8)

    def run(sigma, steps):
        d = tmp_path / f"run-{sigma}-{steps}"
        d.mkdir()
        unit = {"epsilon": 1.0, "delta": 1e-5, "noise_multiplier": sigma, "sample_rate": 0.5, "steps": steps}
        (d / "summary.json").write_text(json.dumps({"privacy": {"units": {"local": unit}}}))
        return d

    cache = {}
    check_within_plan(run(2.0, 8), plan, 1.0, "local", cache)  # as planned
    check_within_plan(run(2.5, 6), plan, 1.0, "local", cache)  # less: more noise, fewer steps
    for sigma, steps in ((2.0, 9), (1.9, 8)):
        with pytest.raises(SecureFedError, match="spent more than the plan"):
            check_within_plan(run(sigma, steps), plan, 1.0, "local", cache)


def _released_times(out: Path) -> dict[str, int]:
    """The modification time of every released path of a study: the study folder and all under it, except under
    private/. (Not the access time: stamped as well, but any later read, this listing's included, sets it.)"""
    found = {".": out.stat().st_mtime_ns}
    for p in out.rglob("*"):
        if "private" not in p.relative_to(out).parts:
            found[p.relative_to(out).as_posix()] = p.lstat().st_mtime_ns
    return found


def test_the_released_files_times_do_not_depend_on_k(tmp_path, monkeypatch):
    """The selection is written after all K candidates are scored, so its time (and the study's) would grow with K:
    issue 52 measured 6.7 s at K = 1 and 51.0 s at K = 7 between summary.json and selection.json. Every released file
    and folder carries the public RELEASE_MTIME instead: K = 1 and K = 3 (the draw fixed here) leave the same times."""
    import threat_models.private_selection as ps
    from secure_fed.cli import main
    from secure_fed.run_files import RELEASE_MTIME
    from tests.conftest import SMALL

    times = {}
    for k in (1, 3):
        monkeypatch.setattr(ps, "draw", lambda scratch, grid_size, k=k, **_: {"K": k, "candidates": [0] * k})
        out = tmp_path / f"k{k}"
        sets = [x for o in [*SMALL, "training.rounds=1", "algorithm.name=fedavg"] for x in ("--set", o)]
        code = main(["tradeoff", "--methods", "fedavg", "--epsilons", "inf", "--seeds", "0", "--attacks", "", "--workers",
                     "1", "--reference", "none", "--prior", "none", "--select", "private",
                     "--candidates", "training.client_lr=0.05",
                     *sets, "--out", str(out)])  # fmt: skip
        assert code == 0
        times[k] = _released_times(out)
        assert any(p.endswith("selection.json") for p in times[k]) and any(p.endswith("summary.json") for p in times[k])
    assert times[1] == times[3]
    assert set(times[1].values()) == {RELEASE_MTIME * 10**9}


def test_the_selection_refuses_a_unit_whose_released_epsilon_composes_another_units_mechanisms():
    """Instance + client units: the released model's ε per instance composes the client mechanism (a group bound), which
    the instance ledger the selection accounts leaves out; the selection refuses, the instance unit alone passes."""
    from secure_fed.config import load_plan
    from secure_fed.errors import SecureFedError
    from threat_models.private_selection import planned_parts

    base = ["algorithm.name=fedalc", "algorithm.normalize_gamma=false", "training.rounds=2", 'protocols=["dp"]',
            "dataset.synthetic.num_train=64",
            'privacy.instance={"target_epsilon": 4, "clip_norm": 1.0, "max_labels_per_instance": 2}']  # fmt: skip
    parts, delta, _ = planned_parts(load_plan(overrides=base), "instance")
    assert parts and delta > 0
    both = [*base, 'privacy.client={"target_epsilon": 4, "clip_norm": 1.0, "max_labels_per_instance": 2}']
    with pytest.raises(SecureFedError, match="one DP unit"):
        planned_parts(load_plan(overrides=both), "instance")


def test_half_metrics_rank_with_the_runs_scores_and_threshold_the_raw_ones(tmp_path):
    """A selection half's metrics are the run's own on those rows: ranking metrics from the centred scores of the rows
    without their shared direction, threshold metrics from the uncentred ones (as ``evaluate`` computes them)."""
    import numpy as np

    from secure_fed.config import load_plan
    from secure_fed.engine import Experiment
    from secure_fed.engine.evaluation import model_scores, scoring_rows
    from secure_fed.metrics import evaluate_scores
    from tests.conftest import SMALL
    from threat_models.private_selection import half_metrics, split_rows

    plan = load_plan(overrides=[*SMALL, "training.rounds=2", "evaluation.center_scores=true",
                                "evaluation.remove_shared_direction=true", "evaluation.threshold=0.1"])  # fmt: skip
    exp = Experiment(plan, run_dir=tmp_path / "run")
    exp.run(progress=False)
    raw = model_scores(exp.model, exp.model.theta, exp.fed.x_test, scoring_rows(exp.model, plan.evaluation))
    raw = raw.astype(np.float64)
    y = exp.fed.y_test.toarray()
    sel, rep = split_rows(len(y), 0, 0.5)
    want = evaluate_scores((raw - raw.mean(1, keepdims=True))[rep], y[rep], ks=tuple(plan.evaluation.ks), threshold=0.1,
                           threshold_scores=raw[rep])  # fmt: skip
    _, report, n_sel = half_metrics(tmp_path / "run", 0, 0.5, None)
    assert n_sel == len(sel)
    for k in ("P@1", "P@3", "mAP", "C-F1", "O-F1", "C-P"):
        assert report[k] == pytest.approx(want[k], abs=1e-4), k


def test_a_selected_infinity_point_runs_the_noiseless_control(tmp_path):
    """``--select private --infinity noiseless``: the ε = ∞ point's candidates keep the dp layer at σ = 0, so the
    released row has σ 0 and ε ∞ (with the default ``no-dp`` it would have no σ at all)."""
    from secure_fed.cli import main
    from tests.conftest import SMALL

    sets = [x for o in [*SMALL, "training.rounds=1", "algorithm.name=fedaws", "protocols=[dp]",
                        'privacy.local={"batch_sample_rate": 1.0, "target_epsilon": 4.0, "max_labels_per_instance": 8}']
            for x in ("--set", o)]  # fmt: skip
    out = tmp_path / "study"
    code = main(["tradeoff", "--methods", "fedaws", "--epsilons", "inf", "--infinity", "noiseless", "--seeds", "0",
                 "--attacks", "", "--workers", "1", "--reference", "none", "--prior", "none", "--select", "private",
                 "--candidates", "training.client_lr=0.05", *sets, "--out", str(out)])  # fmt: skip
    assert code == 0
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert len(rows) == 1 and rows[0]["epsilon"] == "inf" and float(rows[0]["sigma"]) == 0.0, rows
