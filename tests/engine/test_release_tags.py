"""The release gate (:mod:`secure_fed.release`, issue 52): every value a release writer takes (``summary.json``, each
``metrics.jsonl`` line, the released ``config.yaml``, the export) is tagged ``public`` or ``protected``; an untagged
one raises under strict mode (the suite's) and, in a run, makes the run's reported ε ∞ with one line naming the field.

The introspection walks the documents the writers hand to the gate with its own walker (not the gate's), and checks
that each file holds exactly what went through the gate."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from protocols.dp.mechanisms import MECHANISMS
from secure_fed import release
from secure_fed.engine import Experiment
from secure_fed.engine.callbacks import Callback
from secure_fed.export import export_model
from secure_fed.privacy_lines import privacy_lines
from secure_fed.release import NO_MECHANISM, PROTECTED, PUBLIC, RELEASED_MODEL, STRICT_ENV, Released, UntaggedRelease
from tests.conftest import DP_CONFIGS, small_plan

DP = DP_CONFIGS["client_adaptive_clipping_poisson"]  # a DP run with a mechanism output in its report (C_t)
TWO_ROUNDS = ["training.rounds=2", "evaluation.every=1"]


# ----------------------------------------------------------------------------------------------- the gate alone
def test_the_gate_unwraps_tags_and_names_each_untagged_field(monkeypatch):
    monkeypatch.setenv(STRICT_ENV, "0")
    doc = {
        "a": release.public(1, "config"),
        "final": {"mAP": release.public(2.0, "a metric"), "loss": 0.5},  # a plain dict is walked: each key a field
        "report": release.public({"x": [1, 2], "y": release.protected(3, RELEASED_MODEL)}, "ledger"),  # tag covers
        "none": None,
        "clients": release.protected(4, NO_MECHANISM),
        "made_up": release.protected(5, "no_such_mechanism"),
    }
    plain, found = release.release_fields(doc, "summary.json")
    assert plain == {"a": 1, "final": {"mAP": 2.0, "loss": 0.5}, "report": {"x": [1, 2], "y": 3}, "none": None,
                     "clients": 4, "made_up": 5}  # fmt: skip
    assert found == [
        "ε = ∞: summary.json field final.loss is untagged",
        "ε = ∞: summary.json field none is untagged",
        "ε = ∞: summary.json field clients is released with no DP mechanism on it",
        "ε = ∞: summary.json field made_up names mechanism 'no_such_mechanism', which is not registered",
    ]
    monkeypatch.setenv(STRICT_ENV, "1")
    with pytest.raises(UntaggedRelease, match="summary.json field final.loss is untagged"):
        release.release_fields(doc, "summary.json")
    # strict mode lets a value said out loud to have no mechanism through (it makes ε ∞), and nothing else
    assert release.release_fields({"c": release.protected(4, NO_MECHANISM)}, "f")[1] == [
        "ε = ∞: f field c is released with no DP mechanism on it"
    ]
    with pytest.raises(UntaggedRelease, match="no_such_mechanism"):
        release.release_fields({"m": release.protected(5, "no_such_mechanism")}, "f")
    with pytest.raises(ValueError):
        release.public(1, " ")


def test_an_infinite_epsilon_keeps_the_reports_own_why_first():
    rep = {"epsilon": 3.0, "delta": 1e-5, "why": "no ε bounds the released W"}
    assert release.with_infinite_epsilon(rep, []) == rep
    out = release.with_infinite_epsilon(rep, ["ε = ∞: metrics.jsonl field loss is untagged"])
    assert out["epsilon"] == "inf" and out["why"] == "no ε bounds the released W; ε = ∞: metrics.jsonl field loss is untagged"
    assert rep["epsilon"] == 3.0  # a copy


# ------------------------------------------------------------------------------------------- every field tagged
def _tags(value, path: str, out: dict[str, Released]) -> None:
    """The test's own walk: every tagged node by dotted path; a leaf that is neither tagged nor a dict fails."""
    if isinstance(value, Released):
        out[path] = value
    elif isinstance(value, dict):
        for k, v in value.items():
            _tags(v, f"{path}.{k}" if path else str(k), out)
    else:
        raise AssertionError(f"{path} reaches a writer untagged: {value!r}")


@pytest.fixture
def gate_inputs(monkeypatch):
    """Every document handed to the release gate in this test, as ``(file, tagged document)``."""
    seen: list[tuple[str, dict]] = []
    real = release.release_fields

    def spy(doc, file):
        seen.append((file, doc))
        return real(doc, file)

    monkeypatch.setattr("secure_fed.engine.run_records.release_fields", spy)
    monkeypatch.setattr("secure_fed.export.release_fields", spy)
    return seen


def _as_json(x):
    return json.loads(json.dumps(x))


@pytest.mark.parametrize("case", ["default", "dp_adaptive_clipping"])
def test_every_released_field_of_a_run_and_its_export_is_tagged(tmp_path, gate_inputs, case):
    overrides = [*TWO_ROUNDS, *(DP if case != "default" else [])]
    res = Experiment(small_plan(*overrides), run_dir=tmp_path / "run").run(progress=False)
    export_model(tmp_path / "run", tmp_path / "model.pt")
    files = [f for f, _ in gate_inputs]
    assert files == ["config.yaml", "metrics.jsonl", "metrics.jsonl", "summary.json", "export"]
    tags: dict[str, dict[str, Released]] = {}
    for file, doc in gate_inputs:
        found: dict[str, Released] = {}
        _tags(doc, "", found)
        for path, tag in found.items():
            assert tag.tag in (PUBLIC, PROTECTED) and tag.why.strip(), (file, path)
            if tag.tag == PROTECTED:  # a registered mechanism, or the released model
                assert tag.why in MECHANISMS or tag.why == RELEASED_MODEL, (file, path, tag.why)
        tags.setdefault(file, {}).update(found)

    # each file holds exactly what went through the gate: no field added after it
    run = tmp_path / "run"
    plain = {f: [release.release_fields(d, f)[0] for g, d in gate_inputs if g == f] for f in files}
    assert yaml.safe_load((run / "config.yaml").read_text()) == plain["config.yaml"][0]
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert lines == _as_json(plain["metrics.jsonl"])
    assert json.loads((run / "summary.json").read_text()) == _as_json(plain["summary.json"][0]) == _as_json(res.summary)
    model = torch.load(tmp_path / "model.pt", map_location="cpu", weights_only=False)
    assert set(model) == set(plain["export"][0]) and model["privacy"] == plain["export"][0]["privacy"]

    s, e = tags["summary.json"], tags["export"]
    assert s["final.mAP"].tag == PUBLIC and "test split" in s["final.mAP"].why
    assert e["theta"] == release.protected(e["theta"].value, RELEASED_MODEL) and e["W"].why == RELEASED_MODEL
    assert set(tags["config.yaml"]) == set(plain["config.yaml"][0])  # every section of the released config
    if case == "default":
        assert res.privacy["epsilon"] == "inf" and "why" not in res.privacy  # no DP, and nothing untagged
        assert not any(t.tag == PROTECTED for t in s.values())
    else:  # adaptive clipping's C_t: that mechanism's output; the ledger's numbers public
        assert float(res.privacy["epsilon"]) < 100 and "why" not in res.privacy
        assert s["privacy.units.client.clip_norm"] == release.protected(s["privacy.units.client.clip_norm"].value,
                                                                        "adaptive_clipping")  # fmt: skip
        assert s["privacy.units.client.adaptive_clipping.clip_norm_by_round"].why == "adaptive_clipping"
        assert s["privacy.units.client.adaptive_clipping.target_quantile"].tag == PUBLIC
        assert tags["metrics.jsonl"]["privacy.client.clip_norm"].why == "adaptive_clipping"
        assert s["privacy.epsilon"].tag == PUBLIC


# ------------------------------------------------------------------------------------- a mutant writer: ε = ∞
class LeaksTrainingLoss(Callback):
    """A mutant: puts the round's training loss (a statistic of private data) on the released line, untagged."""

    name = "leaks_training_loss"

    def on_record(self, ctx, record, diagnostics) -> None:
        record["train_loss"] = diagnostics["train_loss"]


LOSS_LINE = "ε = ∞: metrics.jsonl field train_loss is untagged"


@pytest.fixture
def mutant_dir(tmp_path_factory):
    """A folder for a mutant's run, outside ``tmp_path``: the suite's after-the-fact key check (tests/conftest.py)
    would, rightly, fail on the training loss it leaks."""
    return tmp_path_factory.mktemp("mutant")


def test_an_untagged_metrics_field_makes_the_runs_epsilon_infinite_with_its_line(tmp_path, mutant_dir, monkeypatch):
    monkeypatch.setenv(STRICT_ENV, "0")  # a run outside the suite
    ref = Experiment(small_plan(*DP, *TWO_ROUNDS), run_dir=tmp_path / "ref").run(progress=False)
    assert float(ref.privacy["epsilon"]) < 100  # the same run without the mutant: a finite ε
    run = mutant_dir / "run"
    res = Experiment(small_plan(*DP, *TWO_ROUNDS), run_dir=run, callbacks=[LeaksTrainingLoss()]).run(progress=False)
    summary = json.loads((run / "summary.json").read_text())
    # the summary's final metrics are the last line's: the untagged one stays untagged there (not re-tagged public)
    both = f"{LOSS_LINE}; ε = ∞: summary.json field final.train_loss is untagged"
    assert summary["privacy"]["epsilon"] == "inf" and summary["privacy"]["why"] == both
    assert res.privacy == summary["privacy"]
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(x["privacy"]["epsilon"] == "inf" and x["privacy"]["why"] == LOSS_LINE for x in lines)
    assert all("train_loss" in x for x in lines)  # written as the writer asked, not hidden: the ε says what it costs
    model = torch.load(export_model(run, mutant_dir / "m.pt"), map_location="cpu", weights_only=False)
    assert model["privacy"]["epsilon"] == "inf" and model["privacy"]["why"] == both
    # the console says the same, not the un-noised-step sentence of another ∞ (this run's mechanisms cover θ and W)
    assert privacy_lines(summary["privacy"]) == [f"  privacy: {x}" for x in both.split("; ")]
    assert privacy_lines(ref.privacy)[0].startswith("  privacy: ε = ")


def test_strict_mode_refuses_the_untagged_field(mutant_dir):
    exp = Experiment(small_plan(*DP, *TWO_ROUNDS), run_dir=mutant_dir, callbacks=[LeaksTrainingLoss()])
    with pytest.raises(UntaggedRelease, match=LOSS_LINE):
        exp.run(progress=False)
    assert not (mutant_dir / "metrics.jsonl").read_text().strip()  # no line of it was written


def test_an_untagged_summary_or_config_field_makes_epsilon_infinite(mutant_dir, monkeypatch):
    from secure_fed.engine import run_summaries, runner

    monkeypatch.setenv(STRICT_ENV, "0")
    real_summary, real_config = run_summaries.summary, runner.tagged_config
    monkeypatch.setattr(run_summaries, "summary", lambda ctx, status: {**real_summary(ctx, status), "wall_seconds": 1.5})
    res = Experiment(small_plan(*DP, *TWO_ROUNDS), run_dir=mutant_dir / "summary").run(progress=False)
    assert res.privacy["epsilon"] == "inf" and res.privacy["why"] == "ε = ∞: summary.json field wall_seconds is untagged"
    lines = [json.loads(x) for x in (mutant_dir / "summary" / "metrics.jsonl").read_text().splitlines()]
    assert all(float(x["privacy"]["epsilon"]) < 100 for x in lines)  # written before the summary's finding

    monkeypatch.setattr(run_summaries, "summary", real_summary)
    monkeypatch.setattr(runner, "tagged_config", lambda doc: {**real_config(doc), "seed": doc["seed"]})
    res = Experiment(small_plan(*DP, *TWO_ROUNDS), run_dir=mutant_dir / "config").run(progress=False)
    assert res.privacy["why"] == "ε = ∞: config.yaml field seed is untagged" and res.privacy["epsilon"] == "inf"
    lines = [json.loads(x) for x in (mutant_dir / "config" / "metrics.jsonl").read_text().splitlines()]
    assert all(x["privacy"]["epsilon"] == "inf" for x in lines)  # the config is released before every line


def test_an_untagged_export_field_makes_the_exports_epsilon_infinite(tmp_path, monkeypatch):
    import secure_fed.export as export

    Experiment(small_plan(*DP, *TWO_ROUNDS), run_dir=tmp_path / "run").run(progress=False)
    monkeypatch.setattr(export, "public", lambda value, why: value)  # the mutant: the export's public tags dropped
    with pytest.raises(UntaggedRelease, match=r"export field config\.seed is untagged"):  # a dict: walked, key by key
        export_model(tmp_path / "run", tmp_path / "strict.pt")
    assert not (tmp_path / "strict.pt").exists()
    monkeypatch.setenv(STRICT_ENV, "0")
    model = torch.load(export_model(tmp_path / "run", tmp_path / "m.pt"), map_location="cpu", weights_only=False)
    assert model["privacy"]["epsilon"] == "inf"
    why = model["privacy"]["why"]
    assert "ε = ∞: export field config.seed is untagged" in why and "ε = ∞: export field privacy.epsilon is untagged" in why
    assert "\n" not in why and "theta" not in why  # one line; θ and W keep their tags


def test_the_findings_survive_a_resume(mutant_dir, monkeypatch):
    """A finding is part of the run's ledger: kept in its checkpoint, so a resumed run's ε stays ∞."""
    monkeypatch.setenv(STRICT_ENV, "0")
    ov = [*DP, "training.rounds=2", "evaluation.every=1", "output.checkpoint_every=1"]
    Experiment(small_plan(*ov), run_dir=mutant_dir, callbacks=[LeaksTrainingLoss()]).run(progress=False)
    exp = Experiment(small_plan(*ov[:-3], "training.rounds=3", "evaluation.every=1", "output.checkpoint_every=1"),
                     run_dir=mutant_dir)  # fmt: skip
    assert exp.resume()
    res = exp.run(progress=False)
    assert res.privacy["epsilon"] == "inf" and res.privacy["why"].startswith(LOSS_LINE)
    lines = [json.loads(x) for x in (mutant_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 3 and lines[-1]["privacy"]["why"] == LOSS_LINE and "train_loss" not in lines[-1]


def test_client_models_metrics_are_released_only_with_no_mechanism_said(tmp_path):
    """Without DP, AmAP/WmAP (the clients' own, un-noised models) are released tagged with no mechanism: ε is ∞
    already, and the report says why, field by field."""
    general = ["model.family=linear_head", "partition.name=cmda", "partition.num_clients=5", "partition.kmodes_inits=2",
               "algorithm.name=fedavg", "training.rounds=1"]  # fmt: skip
    res = Experiment(small_plan(*general), run_dir=tmp_path).run(progress=False)
    assert "AmAP" in res.summary["final"] and res.privacy["epsilon"] == "inf"
    assert "ε = ∞: metrics.jsonl field AmAP is released with no DP mechanism on it" in res.privacy["why"]
    assert "ε = ∞: summary.json field final.WmAP is released with no DP mechanism on it" in res.privacy["why"]


def test_the_private_selections_record_goes_through_the_gate(tmp_path, monkeypatch):
    """``selection.json`` (threat_models/private_selection.py): the selected candidate is the private selection's
    output, the rest public; a field added untagged makes its ε ∞ with the line (strict mode: raises)."""
    from protocols.dp.private_selection import PrivateSelection
    from threat_models.private_selection import selection_record, write_selection

    tagged = selection_record(["training.client_lr=0.2"], 2.5, 4.0, {"P@1": 30.0}, 100, "P@1")
    found: dict[str, Released] = {}
    _tags(tagged, "", found)
    assert found["selected"] == release.protected(["training.client_lr=0.2"], PrivateSelection.kind)
    assert all(t.tag == PUBLIC for k, t in found.items() if k != "selected")
    info = write_selection(tmp_path, tagged)
    assert json.loads((tmp_path / "selection.json").read_text()) == info and info["epsilon"] == 4.0 and "why" not in info

    leaky = {**tagged, "candidates_run": 3}  # the mutant: K, the one number the selection must keep secret
    with pytest.raises(UntaggedRelease, match="selection.json field candidates_run is untagged"):
        write_selection(tmp_path / "strict", leaky)
    monkeypatch.setenv(STRICT_ENV, "0")
    info = write_selection(tmp_path, leaky)
    assert info["epsilon"] == float("inf") and info["why"] == "ε = ∞: selection.json field candidates_run is untagged"


def test_a_tag_does_not_hide_what_is_tagged_inside_it_and_lists_of_tags_unwrap(monkeypatch):
    """An outer public tag over a value released with no mechanism (or naming an unregistered one) is still a finding;
    a field that is a list of tagged values is unwrapped item by item (review of the gate)."""
    from secure_fed import release

    monkeypatch.delenv(release.STRICT_ENV, raising=False)
    doc = {"a": release.public({"x": release.protected(1, release.NO_MECHANISM), "y": 2}, "config")}
    plain, found = release.release_fields(doc, "summary.json")
    assert plain == {"a": {"x": 1, "y": 2}} and any("a.x" in f and "no DP mechanism" in f for f in found)
    plain, found = release.release_fields({"b": [release.public(1, "config"), release.public(2, "config")]}, "f.json")
    assert plain == {"b": [1, 2]} and not found
    _, found = release.release_fields({"c": [1, 2]}, "f.json")
    assert found == [release.untagged_line("f.json", "c")]
    _, found = release.release_fields({"d": release.public([release.protected(3, "bogus")], "config")}, "f.json")
    assert any("bogus" in f for f in found)


def test_a_finding_makes_every_released_model_epsilon_infinite():
    from secure_fed import release

    report = {
        "epsilon": 3.0,
        "delta": 1e-5,
        "units": {
            "instance": {
                "epsilon": 3.0,
                "adversaries": {
                    "observer": {"epsilon": 3.0, "composed": ["w"]},
                    "server": {"epsilon": "inf", "why": "its own noise"},
                },
            }
        },
    }
    out = release.with_infinite_epsilon(report, ["ε = ∞: f field x is untagged"])
    assert out["epsilon"] == "inf" and out["units"]["instance"]["epsilon"] == 3.0  # the ledger's own spend stays
    assert {a["epsilon"] for a in out["units"]["instance"]["adversaries"].values()} == {"inf"}
    assert report["units"]["instance"]["adversaries"]["observer"]["epsilon"] == 3.0  # the input is not changed
