"""Released files hold only public or DP-protected values.

In every DP configuration of the suite, each key of ``metrics.jsonl`` and ``summary.json`` must be on the
list below: a public fact about the run, a metric of the released model on the test split, or the privacy
report. Statistics of private data (losses, participant counts, clipping statistics, regulariser values,
label-set statistics, protocol timings) must be in ``private/`` instead, and the keys behind the DP noise
only in the private checkpoints of the party that holds them. The list is written here, not imported
from the code under test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from protocols.dp.layer import DifferentialPrivacy
from secure_fed.engine import Experiment
from tests.conftest import DP_CONFIGS, small_plan

EVAL = {"mAP", "O-AP", "C-P", "C-R", "C-F1", "O-P", "O-R", "O-F1"} | {f"{m}@{k}" for m in ("P", "nDCG") for k in (1, 3, 5)}
# the general setting: the released model's mAP on each client's test rows (mean, std, worst). Not AmAP/WmAP: those
# score the clients' own, un-noised local models
EVAL |= {"GmAP", "GmAP_std", "GmAP_worst"}
METRICS_LINE = {"round", "W_mean_cos", "privacy"} | EVAL
# why: the one line saying which un-noised step makes the top-level ε ∞ (config facts only)
METRICS_PRIVACY = {"epsilon", "delta", "unit", "instance", "client", "why"}
# clip_norm: adaptive clipping's C_t, a function of noisy (DP-protected) counts and public constants
METRICS_UNIT = {"epsilon", "delta", "steps", "clip_norm"}
# rounds_aborted: how many rounds a protocol could not finish (dropouts below the secure sum's threshold)
SUMMARY = {"algorithm", "dataset", "rounds_completed", "rounds_planned", "rounds_aborted", "status", "final", "W_mean_cos",
           "privacy", "protocols", "stop_reason", "device", "executor", "precision", "num_clients", "dropped_labels",
           "target", "aborted_charge", "threads"}  # fmt: skip
# threads: training.threads and what it picked from the machine's CPU count, and the OpenMP variables (no data)
THREADS = {"setting", "torch_threads", "why", "cpus", "wait_policy"}
# aborted_charge: the ledger's steps at the aborted rounds (read from the released per-round ledger)
ABORTED_CHARGE = {"steps", "of"}
SUMMARY_PRIVACY = {"epsilon", "delta", "unit", "units", "note", "warning", "why"}
UNIT = {"epsilon", "delta", "accountant", "noise_multiplier", "sample_rate", "clip_norm", "steps", "planned_steps",
        "target_epsilon", "sigma_calibrated", "scope", "not_covered", "fixed", "sensitivity", "sensitivity_note", "adversaries",
        "instance_level", "warning", "stopped", "approximate", "mechanisms", "composition",
        "contribution_bound", "unnoised", "expected_batch_size", "adaptive_clipping", "tree", "banded"}  # fmt: skip
# adaptive clipping: the released C_t (from noisy counts), its public settings and the noise split of Theorem 1
ADAPTIVE_CLIPPING = {"clip_norm_by_round", "next_clip_norm", "target_quantile", "learning_rate", "count_noise_std",
                     "expected_clients", "update_noise_multiplier", "note"}  # fmt: skip
# privacy.client.mechanism: tree (DP-FTRL): the mechanism's name and its accounting, functions of σ and the rounds only
TREE = {"name", "sampling_amplification", "participation", "tree_rounds", "tree_depth", "gaussian_equivalents",
        "effective_noise_multiplier", "zcdp_rho", "note"}  # fmt: skip
# privacy.client.mechanism: banded (banded MF): the strategy and its accounting, functions of the config and the rounds only
BANDED_MF = {"name", "strategy", "bands", "coefficients", "participation", "period", "participations", "max_column_norm",
             "sensitivity", "effective_noise_multiplier", "zcdp_rho", "lattice_bits", "theorem"}  # fmt: skip
# the instance unit's mechanisms (server's W step, DP-SGD in client training): configuration and accounting only
MECHANISM = {"scope", "noise_multiplier", "sample_rate", "clip_norm", "steps", "planned_steps", "sigma_calibrated",
             "sensitivity", "sensitivity_note", "expected_batch_size"}  # fmt: skip
ADVERSARY = {"epsilon", "why"}
# group_size is twice the public bound on the clients one training instance sits on (config, never the data)
CONTRIBUTION_BOUND = {"max_labels_per_instance", "over_bound"}
INSTANCE_LEVEL = {"group_size", "epsilon", "delta", "note"}
APPROXIMATE = {"epsilon", "warning"}
# a step that shapes a released tensor with no DP mechanism on it: named from the config, never from the data
UNNOISED = {"step", "released", "why"}


def _check(keys, allowed, where):
    extra = set(keys) - allowed
    assert not extra, f"{where}: unprotected keys {sorted(extra)}"


def _check_unit(unit: dict, where: str) -> None:
    _check(unit, UNIT, where)
    for name, adv in unit.get("adversaries", {}).items():
        assert name in ("observer", "server")
        _check(adv, ADVERSARY, f"{where}.adversaries.{name}")
    _check(unit.get("instance_level", {}), INSTANCE_LEVEL, f"{where}.instance_level")
    _check(unit.get("contribution_bound", {}), CONTRIBUTION_BOUND, f"{where}.contribution_bound")
    _check(unit.get("adaptive_clipping", {}), ADAPTIVE_CLIPPING, f"{where}.adaptive_clipping")
    for name, mech in unit.get("mechanisms", {}).items():
        # a unit's mechanisms: the built-ins, and a DP mechanism plugin's (the label prior, per instance and per client;
        # the client unit's own mechanism is then listed beside it as "client")
        assert name in ("server_w_step", "client_training", "client", "label_prior", "label_prior_client")
        _check(mech, MECHANISM, f"{where}.mechanisms.{name}")
    _check(unit.get("tree", {}), TREE, f"{where}.tree")
    _check(unit.get("banded", {}), BANDED_MF, f"{where}.banded")
    for x in unit.get("unnoised", []):
        _check(x, UNNOISED, f"{where}.unnoised")
    for name, rep in unit.get("approximate", {}).items():
        assert name == "gdp"
        _check(rep, APPROXIMATE, f"{where}.approximate.{name}")


def check_released_files(run_dir: Path) -> None:
    """Every key of a finished run's metrics.jsonl and summary.json is on the lists above.

    Called for the configurations below, and (tests/conftest.py) for every DP run any test of the suite leaves
    in its tmp_path."""
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert lines
    for line in lines:
        _check(line, METRICS_LINE, "metrics.jsonl")
        _check(line["privacy"], METRICS_PRIVACY, "metrics.jsonl privacy")
        for unit in ("instance", "client"):
            _check(line["privacy"].get(unit, {}), METRICS_UNIT, f"metrics.jsonl privacy.{unit}")

    summary = json.loads((run_dir / "summary.json").read_text())
    _check(summary, SUMMARY, "summary.json")
    _check(summary["final"], EVAL, "summary.json final")
    if summary.get("threads") is not None:  # an in-process run's pick (tests/test_threads.py); null on Flower (the
        # nodes set their own), absent from the report tests' fake runs
        _check(summary["threads"], THREADS, "summary.json threads")
        _check(summary["threads"]["wait_policy"], {"OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "set_by"}, "summary.json wait policy")
    for unit, charge in summary.get("aborted_charge", {}).items():
        assert unit in summary["privacy"]["units"]
        _check(charge, ABORTED_CHARGE, f"summary.json aborted_charge.{unit}")
    _check(summary["privacy"], SUMMARY_PRIVACY, "summary.json privacy")
    assert summary["privacy"]["units"]
    for unit_name, unit in summary["privacy"]["units"].items():
        _check_unit(unit, f"summary.json privacy.units.{unit_name}")


@pytest.mark.parametrize("name", list(DP_CONFIGS))
def test_released_files_hold_only_public_or_dp_protected_values(tmp_path, name):
    exp = Experiment(small_plan(*DP_CONFIGS[name], "training.rounds=2", "evaluation.every=1"), run_dir=tmp_path)
    exp.run(progress=False)
    assert {p.name for p in tmp_path.iterdir()} == {"config.yaml", "metrics.jsonl", "summary.json", "private",
                                                   ".lock"}  # fmt: skip
    assert (tmp_path / ".lock").stat().st_size == 0  # the run directory's lock holds nothing
    check_released_files(tmp_path)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]

    # the diagnostics moved, they did not vanish: the operator still has them in private/
    diag = [json.loads(x) for x in (tmp_path / "private" / "diagnostics.jsonl").read_text().splitlines()]
    assert len(diag) == len(lines) and all({"train_loss", "clients"} <= set(d) for d in diag)
    private_summary = json.loads((tmp_path / "private" / "summary.json").read_text())
    assert "setup" in private_summary


@pytest.mark.parametrize("name", ["client_noise_secagg", "both_units_keyed_ckks_gdp_seeded", "local_fedaws_ckks"])
def test_noise_keys_live_only_in_their_holders_private_checkpoints(tmp_path, name):
    """Searched: every file of the run directory (with the server's recorded view), and every message logged."""
    import pickle

    ov = [*DP_CONFIGS[name], "training.rounds=2", "output.log_messages=true", "attacks.run=[update_inversion]"]
    exp = Experiment(small_plan(*ov), run_dir=tmp_path)
    exp.run(progress=False)
    assert (tmp_path / "private" / "checkpoints" / "server_view.pt").is_file()
    (tmp_path / "messages.pkl").write_bytes(pickle.dumps(exp.messages, protocol=4))  # searched with the files below
    dp = next(layer for layer in exp.stack.layers if isinstance(layer, DifferentialPrivacy))
    server_key = dp.server_stream.state_dict()["key"]
    client_keys = [s.state_dict()["key"] for s in dp._client_streams.values()]
    # secure aggregation's graph secret (the order of each round's cohort): the server's, like its noise key
    graph_keys = [la.graph_stream.state_dict()["key"] for la in exp.stack.layers if hasattr(la, "graph_stream")]
    holders: dict[bytes, set[str]] = {server_key: set(), **{k: set() for k in [*client_keys, *graph_keys]}}
    for path in Path(tmp_path).rglob("*"):
        if path.is_file():
            blob = path.read_bytes()
            for key in holders:  # raw, or as pickle protocol 2 stores bytes (latin-1 text in UTF-8)
                if key in blob or key.decode("latin-1").encode("utf-8") in blob:
                    holders[key].add(str(path.relative_to(tmp_path)))
    assert holders[server_key] == {"private/checkpoints/server_secrets.pt"}
    for key in client_keys:  # noise shares and client DP-SGD: each client's own key, in the clients' storage only
        assert holders[key] == {"private/checkpoints/clients.pt"}
    assert bool(client_keys) == (name in ("client_noise_secagg", "local_fedaws_ckks"))
    for key in graph_keys:
        assert holders[key] == {"private/checkpoints/server_secrets.pt"}
    assert bool(graph_keys) == (name == "client_noise_secagg")
