"""Shared fixtures. Tests that need the Mulan data use ``data_root``: they skip
when the data is absent on a developer machine, and FAIL under CI (CI=true)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from secure_fed.config import build_plan, load_config
from secure_fed.release import STRICT_ENV

REPO = Path(__file__).resolve().parents[1]


def _share_cores_between_workers() -> None:
    """Under pytest-xdist, give each worker its share of the cores (unless ``OMP_NUM_THREADS`` says otherwise):
    torch's default, a thread per core in every worker, runs workers × cores threads on the cores, and their waiting
    for each other costs more than the threads gain (the suite on 2 cores, 2 workers: 10:50 with 2 threads a worker,
    9:02 with 1). Commands a test starts in a subprocess inherit the setting through ``OMP_NUM_THREADS``."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers <= 1 or "OMP_NUM_THREADS" in os.environ:
        return
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)  # not on macOS
    threads = max(1, cores // workers)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


_share_cores_between_workers()

#: strict release (secure_fed.release): in the suite, a release writer given an untagged value raises, in this process
#: and in every command a test starts (a run outside the suite makes its ε ∞ instead; tests/engine/test_release_tags.py
#: turns strict mode off where it checks that)
os.environ.setdefault(STRICT_ENV, "1")

#: Overrides that shrink the embedded default to a sub-second experiment.
SMALL = [
    "training.rounds=4",
    "evaluation.every=2",
    "output.progress=false",
    "output.checkpoint_every=2",
    "dataset.synthetic.num_train=400",
    "dataset.synthetic.num_test=200",
    "dataset.synthetic.num_labels=8",
    "dataset.synthetic.num_groups=2",
    "dataset.synthetic.num_features=16",
    "dataset.synthetic.feature_noise=0.6",
    "model.embedding_dim=16",
    "model.hidden_dims=[32]",
    "device=cpu",
]


def small_config(*overrides: str):
    return load_config(overrides=[*SMALL, *overrides])


def small_plan(*overrides: str):
    """The run plan of :func:`small_config` (what ``Experiment`` and every reader outside the config package take)."""
    return build_plan(small_config(*overrides))


def register_plugins(monkeypatch, extra: dict[str, dict]) -> None:
    """Add ``extra[group][name] = obj`` to the plugin registries for one test, as installed entry points would (the
    registry as the core, the specs and the config schema read it; the config model rebuilt)."""
    from secure_fed import plugins
    from secure_fed.config import schema

    real = plugins.registry

    def registry(group):
        return {**real(group), **extra.get(group, {})}

    monkeypatch.setattr(plugins, "registry", registry)
    monkeypatch.setattr("secure_fed.plugin_specs.registry", registry)
    monkeypatch.setattr(schema, "registry", registry)
    schema.experiment_config_model.cache_clear()


def _data_root() -> Path | None:
    env = os.environ.get("SECURE_FED_DATA")
    for cand in ([Path(env)] if env else []) + [REPO.parent / "shared" / "datasets"]:
        if (cand / "mulan" / "bibtex" / "bibtex-train.arff").is_file():
            return cand.resolve()
    return None


@pytest.fixture(scope="session")
def data_root() -> Path:
    root = _data_root()
    if root is None:
        msg = "Mulan data not found: set SECURE_FED_DATA or run `secure-fed data download NAME`"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return root


@pytest.fixture(scope="session")
def bibtex(data_root):
    from secure_fed.data import load_registered

    return load_registered("bibtex", data_root)


#: Every DP configuration the suite trains with (tests/engine/test_released_files.py checks each one's released files).
DP_CONFIGS: dict[str, list[str]] = {
    "instance_fedalc": [
        'protocols=["dp"]', "algorithm.normalize_gamma=false", 'privacy.instance={"target_epsilon": 2.0, "sample_rate": 0.2}',
    ],
    "instance_fedalc_fixed": [
        "algorithm.name=fedalc_fixed", "algorithm.fixed_steps=5", 'protocols=["dp"]',
        'privacy.instance={"noise_multiplier": 1.0, "sample_rate": 0.2}',
    ],
    "client_server_noise_poisson": [
        "algorithm.name=fedaws", 'protocols=["dp"]', 'privacy.client={"noise_multiplier": 1.0, "clip_norm": 0.5}',
        "training.client_fraction=0.5", "training.sampling=poisson",
    ],
    "client_adaptive_clipping_poisson": [
        "algorithm.name=fedavg", 'protocols=["dp"]', "training.client_fraction=0.5", "training.sampling=poisson",
        'privacy.client={"noise_multiplier": 1.0, "clip_norm": 0.5, "adaptive_clipping": {"count_noise_multiplier": 2.0}}',
    ],
    "client_noise_secagg": [
        "algorithm.name=fedavg", 'protocols=["dp", "secure_aggregation"]',
        'privacy.client={"noise_multiplier": 2.0, "clip_norm": 0.5, "noise": "clients"}',
    ],
    "client_server_noise_ckks_poisson": [
        "algorithm.name=fedaws", 'protocols=["dp", "ckks"]', "training.client_fraction=0.5", "training.sampling=poisson",
        'privacy.client={"noise_multiplier": 2.0, "clip_norm": 0.5, "noise": "server"}',
    ],
    "client_noise_secagg_poisson": [
        "algorithm.name=fedavg", 'protocols=["dp", "secure_aggregation"]', "training.client_fraction=0.6",
        "training.sampling=poisson", 'privacy.client={"noise_multiplier": 2.0, "clip_norm": 0.5, "noise": "clients"}',
    ],
    "both_units_keyed_ckks_gdp_seeded": [
        'protocols=["keyed_hashing", "dp", "ckks"]', "algorithm.normalize_gamma=false",
        'privacy.instance={"noise_multiplier": 1.0, "sample_rate": 0.2}',
        'privacy.client={"target_epsilon": 8, "clip_norm": 0.5}', "privacy.report_gdp=true", "privacy.noise_seed=1",
    ],
    "instance_both_mechanisms_secagg": [
        'protocols=["dp", "secure_aggregation"]', "algorithm.normalize_gamma=false",
        'privacy.instance={"target_epsilon": 6, "sample_rate": 0.2}',
        'privacy.local={"batch_sample_rate": 0.5, "max_labels_per_instance": 8}',
    ],
    "local_fedaws_ckks": [
        "algorithm.name=fedaws", 'protocols=["dp", "ckks"]', 'privacy.local={"noise_multiplier": 1.5, "clip_norm": 0.5, '
        '"max_labels_per_instance": 8}',
    ],
}  # fmt: skip


@pytest.fixture(autouse=True)
def _released_files_of_every_dp_run(request):
    """After each test: every finished DP run it left in its tmp_path releases only public or DP-protected values
    (the key lists of tests/engine/test_released_files.py). So the check covers every DP configuration the suite
    trains, not only the ones listed in DP_CONFIGS."""
    yield
    tmp = request.node.funcargs.get("tmp_path") if hasattr(request.node, "funcargs") else None
    if tmp is None:
        return
    import json

    from tests.engine.test_released_files import check_released_files

    for summary in Path(tmp).rglob("summary.json"):
        if summary.parent.name == "private" or not (summary.parent / "metrics.jsonl").is_file():
            continue
        try:
            doc = json.loads(summary.read_text())
        except json.JSONDecodeError:
            continue  # a test that writes a broken file on purpose
        if isinstance(doc, dict) and "privacy" in doc and doc["privacy"].get("units"):
            check_released_files(summary.parent)


def whole_and_blocked_metrics(exp, monkeypatch) -> tuple[dict, dict]:
    """A finished run's metrics from the whole score matrix, then from label blocks of 3 (the blocked path forced by
    a tiny ``BLOCK_ELEMENTS``; asserted taken)."""
    from secure_fed.metrics import blocks

    whole = exp.evaluate()
    monkeypatch.setattr(blocks, "BLOCK_ELEMENTS", 64)
    real, used = blocks.evaluate_label_blocks, []
    monkeypatch.setattr(blocks, "evaluate_label_blocks", lambda *a, **k: used.append(1) or real(*a, block=3, **k))
    blocked = exp.evaluate()
    assert used, "the blocked path was not taken"
    return whole, blocked
