"""``data_size_ranking``: an attack added in one module and one entry point (its settings, what it records and its
headline come with its spec). Its ρ is recomputed here, independently, from the server's recorded view and the
clients' true sizes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tomllib
from scipy import stats

from secure_fed.config import load_plan
from secure_fed.plugin_api.attacks import build_experiment
from tests.conftest import SMALL, small_config
from threat_models.attacks.data_size_ranking import spearman
from threat_models.audit import audit, headline
from threat_models.context import AuditContext


def small_plan(*overrides: str):
    """The small test run's plan (``tests.conftest.SMALL``) with ``overrides``."""
    return load_plan(overrides=[*SMALL, *overrides])


REPO = Path(__file__).resolve().parents[2]
NAME = "data_size_ranking"


@pytest.fixture
def registered(tmp_path, monkeypatch):
    """The attack's entry point as ``pyproject.toml`` declares it, registered as ``pip install -e .`` leaves it
    (the installed metadata may predate it)."""
    from secure_fed import plugins
    from secure_fed.config import schema

    value = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["secure_fed.attacks"][NAME]
    info = tmp_path / "site" / "secure_fed_data_size_ranking-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: secure-fed-data-size-ranking\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[secure_fed.attacks]\n{NAME} = {value}\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    plugins.registry.cache_clear()
    schema.experiment_config_model.cache_clear()
    yield
    plugins.registry.cache_clear()
    schema.experiment_config_model.cache_clear()


def test_spearman_matches_scipy_with_ties():
    rng = np.random.default_rng(0)
    for _ in range(20):
        a, b = rng.integers(0, 5, 12), rng.normal(size=12)
        assert spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic, abs=1e-12)
    assert spearman([1, 1, 1], [1, 2, 3]) == 0.0


def _run(tmp_path, *ov):
    e = build_experiment(small_plan(f"attacks.run=[{NAME}]", "training.rounds=2", *ov), run_dir=tmp_path)
    e.run(progress=False)
    return e, audit(AuditContext(e), progress=False)["attacks"][NAME]


def test_the_ranking_of_first_parameter_norms_is_scored_against_the_true_sizes(tmp_path, registered):
    e, res = _run(tmp_path)
    cap = AuditContext(e).tap.capture
    assert "updates" not in cap  # parameters: first asks for no whole uplinks
    cohort = sorted(cap["individual"])
    norms = [float(np.linalg.norm(cap["individual"][c].double().numpy())) for c in cohort]
    sizes = [e.fed.clients[c].num_examples for c in cohort]
    assert len(set(sizes)) > 1  # the run's clients differ in size: there is a ranking to recover
    assert res["metrics"]["spearman"] == pytest.approx(stats.spearmanr(norms, sizes).statistic, abs=1e-9)
    assert res["chance"] == {"spearman": 0.0} and res["details"] == {"clients": len(cohort), "parameters": "first"}
    assert headline(NAME, res).startswith(f"Spearman ρ {res['metrics']['spearman']:.3f} (chance 0.0) over {len(cohort)}")


def test_all_parameters_are_recorded_whole_when_its_settings_ask(tmp_path, registered):
    e, res = _run(tmp_path, f"attacks.{NAME}.parameters=all")
    cap = AuditContext(e).tap.capture
    cohort = sorted(cap["updates"])
    norms = [np.sqrt(sum(float((t.double() ** 2).sum()) for t in cap["updates"][c].values())) for c in cohort]
    sizes = [e.fed.clients[c].num_examples for c in cohort]
    assert len(cap["updates"][cohort[0]]) == len(e.theta)  # every parameter of θ, recorded for this attack
    assert res["metrics"]["spearman"] == pytest.approx(stats.spearmanr(norms, sizes).statistic, abs=1e-9)
    assert res["details"]["parameters"] == "all"


def test_it_is_skipped_under_secure_aggregation(tmp_path, registered):
    _, res = _run(tmp_path, "protocols=[secure_aggregation]")
    assert "masked" in res["skipped"]


def test_its_settings_are_its_own_section(registered):
    from secure_fed.errors import ConfigError

    assert small_config(f"attacks.{NAME}.min_clients=5").attacks.data_size_ranking.min_clients == 5
    with pytest.raises(ConfigError, match=f"attacks.{NAME}.parameters"):
        small_config(f"attacks.{NAME}.parameters=some")
