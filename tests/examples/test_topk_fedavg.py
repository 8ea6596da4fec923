"""The example algorithm (``examples/plugins/topk_fedavg``), registered by entry point alone: its params validate,
it runs under ``dp`` (client-level DP, with and without secure aggregation) through its declared capabilities, and
its clients send only the top-k entries of their update. The runs are in a fresh process, as an installed plugin's
(:func:`~tests.examples.helpers.run_fresh`)."""

from __future__ import annotations

import math

import pytest

from tests.config.test_bad_input import assert_one_error_line
from tests.examples.helpers import CLIENT_DP, run_fresh, validate

DENSITY = 0.05


def runs(plugin_path, tmp_path, stack: str) -> tuple[dict, dict]:
    """Two runs under ``stack`` with the same seeds, the DP noise's included (``privacy.noise_seed``: else each run
    draws fresh noise and any two runs differ): density :data:`DENSITY`, and density 1 (FedAvg)."""
    common = ["algorithm.name=topk_fedavg", f"protocols={stack}", CLIENT_DP, "privacy.noise_seed=7"]
    sparse, dense = run_fresh(plugin_path, tmp_path, [*common, f"algorithm.density={DENSITY}"], [*common, "algorithm.density=1"])
    for result in (sparse, dense):
        s = result["summary"]
        assert s["rounds_completed"] == 2 and s["algorithm"] == "topk_fedavg"
        assert isinstance(s["privacy"]["epsilon"], float) and math.isfinite(s["privacy"]["epsilon"])
        assert s["privacy"]["epsilon"] > 0
    # the same seeds (data, cohorts, noise, masks cancel exactly): the sparsification alone makes the models differ
    assert sparse["summary"]["final"] != dense["summary"]["final"]
    return sparse, dense


def test_clients_send_the_top_k_entries_under_client_dp(tmp_path, plugin_path):
    sparse, dense = runs(plugin_path, tmp_path, '["dp"]')
    # the server's noise: the wire updates are the clients' clipped plaintext updates
    assert len(sparse["sent"]) == 2 * sparse["summary"]["num_clients"]
    assert all(0 < nz <= math.ceil(DENSITY * d) for nz, d, _ in sparse["sent"]), sparse["sent"]
    assert all(norm <= 1.0 * (1 + 1e-6) for _, _, norm in sparse["sent"])  # dp's clip_norm
    assert max(nz / d for nz, d, _ in dense["sent"]) > 0.5  # density 1: FedAvg's dense updates


def test_it_runs_under_dp_and_secure_aggregation(tmp_path, plugin_path):
    sparse, _ = runs(plugin_path, tmp_path, '["dp", "secure_aggregation"]')
    assert sparse["summary"]["protocols"] == ["dp", "secure_aggregation"]
    assert sparse["sent"] == []  # the server saw masked updates only


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["algorithm.density=0"], "algorithm.density"),
        (["algorithm.density=2"], "algorithm.density"),
        (["algorithm.k=3"], "algorithm.k: unknown key; algorithm.name=topk_fedavg takes loss, density"),
        (['protocols=["dp"]', 'privacy.instance={"noise_multiplier": 1.0, "sample_rate": 0.2}'], "topk_fedavg does not have"),
    ],
    ids=["zero", "above-one", "unknown-key", "instance-dp-undeclared"],
)
def test_a_bad_algorithm_section_is_refused_with_one_error_line(plugin_path, overrides, needle):
    assert_one_error_line(*validate(plugin_path, "algorithm.name=topk_fedavg", *overrides), needle)
