"""Every file a run releases (all outside ``private/``, and the ``export``) is the same on neighbouring data sets,
but the fields computed from the released model (issue 52, "Release").

Bibtex and Bibtex minus its one 28-label instance (:func:`tests.engine.test_contribution_bounding.neighbours`), one
round each with the same ``privacy.noise_seed`` (a test device: the secret streams are the same in both runs; the
seed is a secret setting, so the released ``config.yaml`` leaves it out), for four configurations: the W step only,
the private recipe, instance + client units, FedAvg with DP-SGD. Every path outside ``private/`` is compared: the
same paths, every non-JSON file byte for byte, every JSON file equal once the allowlisted fields are taken out, and
each allowlisted field equal to its value recomputed here from the exported θ and W and the public test split. The
exported file holds the same config and privacy report.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from secure_fed.config import build_plan, load_config
from secure_fed.data.from_config import build_dataset
from secure_fed.engine import Experiment
from secure_fed.engine.evaluation import evaluate
from secure_fed.export import export_model
from tests.engine.test_contribution_bounding import neighbours
from tests.engine.test_released_files import EVAL

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "experiments" / "configs"

#: the fields of the released JSON files that are functions of the released model and the public test split; the
#: test recomputes each. Every other byte outside private/ must be equal
METRIC_FIELDS = EVAL | {"W_mean_cos"}

SMALL_MODEL = ["model.embedding_dim=16", "model.embed_dim=16", "model.hidden_dims=[16]"]
ONE_ROUND = ["training.rounds=1", "evaluation.every=1", "device=cpu", "privacy.noise_seed=52", "output.progress=false"]
CASES = {
    "w_step_only": ("bibtex_fedalc_dp.yaml", SMALL_MODEL),
    "private_recipe": ("bibtex_private.yaml", []),
    "instance_and_client_units": (
        "bibtex_fedalc_dp.yaml",
        [*SMALL_MODEL, 'privacy.client={"target_epsilon": 4, "clip_norm": 1, "max_labels_per_instance": 3}'],
    ),
    "fedavg_dp_sgd": (
        "bibtex_fedavg.yaml",
        [*SMALL_MODEL, "protocols=[dp]",
         'privacy.local={"target_epsilon": 4, "clip_norm": 1, "batch_sample_rate": 0.5, "max_labels_per_instance": 3}'],
    ),
}  # fmt: skip


def released_paths(run_dir: Path) -> dict[str, Path]:
    """Every file and folder of ``run_dir`` outside its ``private/`` folder, by relative path."""
    paths = sorted(run_dir.rglob("*"))
    return {p.relative_to(run_dir).as_posix(): p for p in paths if "private" not in p.relative_to(run_dir).parts}


def split_json(path: Path) -> tuple[list, list[dict]]:
    """A released JSON file (``.json``, or ``.jsonl`` one document a line) as (documents without the allowlisted
    fields, the allowlisted fields of each document, ``final`` included)."""
    docs = [json.loads(x) for x in path.read_text().splitlines()] if path.suffix == ".jsonl" else [json.loads(path.read_text())]
    rest, fields = [], []
    for doc in docs:
        got = {k: doc.pop(k) for k in list(doc) if k in METRIC_FIELDS}
        if isinstance(doc.get("final"), dict):
            got.update({f"final.{k}": v for k, v in doc.pop("final").items()})
        rest.append(doc)
        fields.append(got)
    return rest, fields


def recomputed_metrics(run_dir: Path, model_file: Path, ds, tmp: Path) -> dict[str, float]:
    """The metrics of the exported model on the public test split, and W's mean row cosine, recomputed from the
    released config and the export (not read from the run)."""
    import torch

    from secure_fed.models import mean_pairwise_cosine

    cfg = load_config(run_dir / "config.yaml")  # the released config: no secret in it, none needed
    exp = Experiment(build_plan(cfg), run_dir=tmp, dataset=ds)
    model = torch.load(model_file, map_location="cpu", weights_only=False)
    exp.model.theta = {n: t.to(exp.device) for n, t in model["theta"].items()}
    exp.model.W = None if model["W"] is None else model["W"].to(exp.device)
    out = dict(evaluate(exp.model, exp.fed, exp.plan.evaluation))
    if model["W"] is not None:
        out["W_mean_cos"] = float(mean_pairwise_cosine(model["W"]))
    return out


def check_metric_fields(fields: list[dict], metrics: dict[str, float], where: str) -> None:
    """Each allowlisted field equals its recomputed value (float32 evaluation: within 1e-5 relative)."""
    for doc in fields:
        for key, value in doc.items():
            name = key.removeprefix("final.")
            assert name in metrics, f"{where}: {key} is not a metric recomputed from the released model"
            assert value == pytest.approx(metrics[name], rel=1e-5, abs=1e-6), (where, key, value, metrics[name])


@pytest.mark.data
@pytest.mark.parametrize("case", list(CASES))
def test_every_released_file_is_the_same_on_bibtex_and_its_neighbour(tmp_path, data_root, case):
    config, overrides = CASES[case]
    cfg = load_config(CONFIGS / config, [*overrides, *ONE_ROUND])
    sets = neighbours(build_dataset(build_plan(cfg), str(data_root)))
    import numpy as np

    assert np.diff(sets["D"].train.labels.indptr).max() == 28
    runs, exports = {}, {}
    for name in ("D", "D-"):
        run = tmp_path / name.replace("-", "minus")
        Experiment(build_plan(cfg), run_dir=run, dataset=sets[name]).run(progress=False)
        runs[name], exports[name] = run, export_model(run, tmp_path / f"{run.name}.pt")
    assert "noise_seed" not in (runs["D"] / "config.yaml").read_text()  # a secret setting: never released

    paths = {name: released_paths(run) for name, run in runs.items()}
    assert list(paths["D"]) == list(paths["D-"]), "the neighbours release different files"
    assert set(paths["D"]) >= {"config.yaml", "metrics.jsonl", "summary.json"}
    metrics = {n: recomputed_metrics(runs[n], exports[n], sets[n], tmp_path / f"recompute-{runs[n].name}") for n in runs}
    compared = []
    for rel, p in paths["D"].items():
        q = paths["D-"][rel]
        if p.is_dir():
            continue
        if p.suffix in (".json", ".jsonl"):
            rest_d, fields_d = split_json(p)
            rest_n, fields_n = split_json(q)
            assert rest_d == rest_n, f"{rel} differs between the neighbours outside the recomputed fields"
            for name, fields in (("D", fields_d), ("D-", fields_n)):
                check_metric_fields(fields, metrics[name], f"{name}: {rel}")
        else:
            assert p.read_bytes() == q.read_bytes(), f"{rel} differs between the neighbours"
        compared.append(rel)
    assert {"config.yaml", "metrics.jsonl", "summary.json"} <= set(compared)

    # the one model artifact outside private/: θ and W (DP-protected), the same config and privacy report
    import torch

    docs = {n: torch.load(f, map_location="cpu", weights_only=False) for n, f in exports.items()}
    assert docs["D"]["config"] == docs["D-"]["config"] and docs["D"]["privacy"] == docs["D-"]["privacy"]
    assert "noise_seed" not in docs["D"]["config"].get("privacy", {})
    assert json.loads((runs["D"] / "summary.json").read_text())["privacy"]["units"]  # a DP run, with its report
