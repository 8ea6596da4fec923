"""``secure-fed report`` draws runs side by side only when they differ in ε and seed (and in what ``--vary`` names):
otherwise one ``error:`` line, exit 2, nothing written; ``--allow-mixed`` draws them under a warning."""

from __future__ import annotations

import math

import pytest

from secure_fed.report_setup import mixed_runs_message, setup_differences
from tests.config.test_bad_input import assert_one_error_line, cli
from tests.report_runs import fake_run

WRITTEN = ("report.png", "report.html", "private/report.html")


def _nothing_written(*runs) -> bool:
    return not any((r / f).exists() for r in runs for f in WRITTEN)


def test_runs_that_differ_in_epsilon_seed_and_the_dp_layer_compare(tmp_path):
    runs = [fake_run(tmp_path, f"e{e}-s{s}", eps=e, seed=s) for e in (1.0, 4.0, math.inf) for s in (0, 1)]
    assert setup_differences(runs) == []


def test_a_10_round_no_dp_run_and_a_20_round_dp_run_do_not(tmp_path):
    """The issue's case: utility seemed to fall as ε grew because the ε = ∞ run trained half as long."""
    a, b = fake_run(tmp_path, "inf-r10", rounds=10), fake_run(tmp_path, "eps4-r20", eps=4.0, rounds=20)
    assert setup_differences([a, b]) == ["training.rounds: 10 in inf-r10, 20 in eps4-r20"]


def test_privacy_settings_other_than_epsilon_must_match_among_dp_runs(tmp_path):
    a, b = fake_run(tmp_path, "a", eps=1.0), fake_run(tmp_path, "b", eps=4.0, clip=5.0)
    assert setup_differences([a, b]) == ["privacy.local.clip_norm: 1.0 in a, 5.0 in b"]
    assert setup_differences([a, fake_run(tmp_path, "nodp")]) == []  # a run without DP has no privacy settings to match


def test_algorithm_settings_compare_within_a_method_and_vary_names_a_swept_one(tmp_path):
    a, b = fake_run(tmp_path, "a", lam=1.0), fake_run(tmp_path, "b", lam=100.0)
    assert setup_differences([a, b]) == ["algorithm.lam: 1.0 in a, 100.0 in b"]
    assert setup_differences([a, b], vary=("algorithm.lam",)) == []
    other = fake_run(tmp_path, "c", method="fedalc", lam=100.0)  # another method: its own line, its own settings
    assert setup_differences([a, other]) == []


def test_a_run_without_its_config_cannot_be_compared(tmp_path):
    a, b = fake_run(tmp_path, "a"), fake_run(tmp_path, "b")
    (b / "config.yaml").unlink()
    assert setup_differences([a, b]) == ["no config.yaml in b (its setup is unknown)"]
    assert setup_differences([b]) == []  # one run: nothing to compare


def test_the_message_is_one_line_and_says_how_many_more():
    msg = mixed_runs_message([f"k{i}: 1 in a, 2 in b" for i in range(5)])
    assert "\n" not in msg and msg.startswith("the runs differ in more than ε and seed: k0") and msg.endswith("and 2 more")


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda t: [fake_run(t, "inf-r10", rounds=10), fake_run(t, "eps4-r20", eps=4.0, rounds=20)], "training.rounds"),
        (lambda t: [fake_run(t, "a", eps=1.0), fake_run(t, "b", eps=4.0, clip=5.0)], "privacy.local.clip_norm"),
        (lambda t: [fake_run(t, "a", lam=1.0), fake_run(t, "b", lam=100.0)], "algorithm.lam"),
    ],
)
def test_report_refuses_runs_that_do_not_compare(tmp_path, make, needle):
    runs = make(tmp_path)
    code, out, err = cli("report", *map(str, runs))
    assert_one_error_line(code, err, "differ in more than ε and seed", needle, "--allow-mixed", "--vary")
    assert _nothing_written(*runs)
    code, out, err = cli("report", *map(str, runs), "--out", str(tmp_path / "new" / "r.png"))
    assert_one_error_line(code, err, needle)
    assert not (tmp_path / "new").exists()


def test_allow_mixed_draws_them_under_a_warning(tmp_path):
    runs = [fake_run(tmp_path, "inf-r10", rounds=10), fake_run(tmp_path, "eps4-r20", eps=4.0, rounds=20)]
    code, out, err = cli("report", *map(str, runs), "--allow-mixed")
    assert code == 0, err
    assert err.strip() == "warning: the runs differ in more than ε and seed: training.rounds: 10 in inf-r10, 20 in eps4-r20"
    page = (runs[0] / "report.html").read_text()
    assert '<p class="note warning" id="warning">warning: the runs differ' in page
    assert (runs[0] / "report.png").stat().st_size > 1000


def test_vary_lets_a_swept_setting_differ(tmp_path):
    runs = [fake_run(tmp_path, "a", lam=1.0), fake_run(tmp_path, "b", lam=100.0)]
    code, out, err = cli("report", *map(str, runs), "--vary", "algorithm.lam")
    assert code == 0 and not err.strip(), err
    assert 'id="warning"' not in (runs[0] / "report.html").read_text()


def test_no_seed_is_compared_or_printed():
    """Seeds may differ between the runs of a study, and a secret seed's value must never reach a report."""
    from secure_fed.report_setup import comparable_setup

    cfg = {"seed": 1, "protocols": ["dp", "secure_aggregation"], "privacy": {"noise_seed": 7, "delta": 1e-5},
           "secure_aggregation": {"graph_seed": 9, "k": 3}}  # fmt: skip
    flat = comparable_setup(cfg)
    assert "secure_aggregation.k" in flat and "privacy.delta" in flat
    assert not any(k.rsplit(".", 1)[-1].endswith("seed") for k in flat), flat


def test_a_config_that_is_not_a_mapping_is_one_error(tmp_path):
    from secure_fed.errors import SecureFedError
    from secure_fed.report_setup import read_config

    (tmp_path / "config.yaml").write_text("- a\n- b\n")
    with pytest.raises(SecureFedError, match="not a config"):
        read_config(tmp_path)
