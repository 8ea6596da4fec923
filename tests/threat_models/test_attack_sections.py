"""Attacks own their settings: the ``attacks:`` section is built from the registered attacks' specs (``settings``),
the recording asks each listed attack's spec what it needs (``records``), and the audit asks it for its headline.

Every config the repository ships (experiments/, and the YAML and ``--set attacks.…`` the docs and the README show)
still loads, with its settings reaching the attack's own typed section; an unknown key is one ``error:`` line that
lists the known ones; a third-party attack registered through an entry point gets its section, its recorder and its
headline with no change to the product.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from secure_fed.config import load_config, load_plan
from secure_fed.errors import ConfigError
from secure_fed.plugin_specs import attack_specs

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted((REPO / "docs").rglob("*.md")) + [REPO / "README.md"]


@pytest.fixture(autouse=True)
def _pyproject_attacks(tmp_path_factory, monkeypatch):
    """The attacks ``pyproject.toml`` registers, as ``pip install -e .`` leaves them (an install made before an
    attack's entry point was added lacks it; the docs may show its settings)."""
    import tomllib

    from secure_fed import plugins
    from secure_fed.config import schema

    eps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["secure_fed.attacks"]
    site = tmp_path_factory.mktemp("site")
    info = site / "secure_fed_attacks-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: secure-fed-attacks\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[secure_fed.attacks]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))  # the CLI's too
    plugins.registry.cache_clear()
    schema.experiment_config_model.cache_clear()
    yield
    plugins.registry.cache_clear()
    schema.experiment_config_model.cache_clear()


def _holds(section: dict, given: dict) -> None:
    """Every key ``given`` sets is in the validated ``section`` with that value (nested sections too)."""
    for key, value in given.items():
        assert key in section, key
        if isinstance(value, dict):
            _holds(section[key], value)
        else:
            assert section[key] == value, (key, section[key], value)


def test_the_section_has_run_and_one_key_per_attack_with_settings():
    cfg = load_config()
    specs = attack_specs()
    owned = {n for n, s in specs.items() if s.settings is not None}
    assert set(type(cfg.attacks).model_fields) == {"run"} | owned
    assert owned >= {"membership_inference", "one_run_audit", "canary_client_audit", "gradient_inversion"}
    for name in owned:
        assert isinstance(getattr(cfg.attacks, name), specs[name].settings), name
        assert getattr(cfg.attacks, name) == specs[name].settings(), name  # defaults: the attack's own


def test_the_sections_are_not_shared_between_configs():
    a, b = load_config(), load_config()
    a.attacks.membership_inference.shadows = 3
    assert b.attacks.membership_inference.shadows == attack_specs()["membership_inference"].settings().shadows


@pytest.mark.parametrize("path", sorted((REPO / "experiments").rglob("*.y*ml")), ids=lambda p: p.name)
def test_every_yaml_under_experiments_loads(path):
    doc = yaml.safe_load(path.read_text())
    if {"nodes", "events"} <= set(doc):  # a SecAgg+ fault schedule (secure_aggregation.fault_schedule): its own loader
        from protocols.secagg.fault_schedule import load_fault_schedule

        assert load_fault_schedule(path).nodes == doc["nodes"]
        return
    if not ({"algorithm", "dataset", "training", "attacks", "protocols"} & set(doc)):
        assert path.parent.name == "grids", f"{path} is neither a config nor a grid"  # a sweep's grid: lists, no config
        return
    cfg = load_config(path)
    _holds(cfg.attacks.model_dump(mode="json"), doc.get("attacks") or {})


def _doc_attack_sections() -> list[tuple[str, dict]]:
    """``(where, attacks section)`` of each YAML block and inline snippet of the docs and the README that sets one."""
    found = []
    for page in PAGES:
        text = page.read_text()
        for block in re.findall(r"```ya?ml\n(.*?)```", text, flags=re.S):
            doc = yaml.safe_load(block)
            if isinstance(doc, dict) and isinstance(doc.get("attacks"), dict):
                found.append((f"{page.name} yaml block", doc["attacks"]))
        for snippet in re.findall(r"`(attacks: \{[^`]*\})`", text):
            found.append((f"{page.name}: {snippet}", yaml.safe_load(snippet)["attacks"]))
    return found


def _doc_attack_overrides() -> list[tuple[str, str]]:
    return [
        (page.name, m.strip("'\""))
        for page in PAGES
        for m in re.findall(r"--set (['\"]?attacks\.[A-Za-z0-9_.]+=[^\s)`'\"]*['\"]?)", page.read_text())
    ]


def test_the_docs_show_attack_settings_to_load():
    assert len(_doc_attack_sections()) >= 2 and len(_doc_attack_overrides()) >= 5


@pytest.mark.parametrize("where, section", _doc_attack_sections(), ids=lambda x: str(x)[:60])
def test_every_attacks_section_the_docs_show_loads(where, section):
    cfg = load_config(overrides=[f"attacks={yaml.safe_dump(section, default_flow_style=True).strip()}"])
    _holds(cfg.attacks.model_dump(mode="json"), section)


@pytest.mark.parametrize("where, override", _doc_attack_overrides(), ids=lambda x: str(x)[:60])
def test_every_attacks_override_the_docs_show_loads(where, override):
    key, _, value = override.partition("=")
    cfg = load_config(overrides=[override])
    got = cfg.attacks.model_dump(mode="json")
    for part in key.split(".")[1:]:
        got = got[part]
    assert got == yaml.safe_load(value), override


def test_an_unknown_key_is_one_error_line_listing_the_known_ones(tmp_path):
    out = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-m", "secure_fed.cli", "run", "--set", "attacks.membership_inferense.shadows=2", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: ") and "Traceback" not in r.stderr and not out.exists()
    assert "unknown key 'membership_inferense'" in line and "did you mean 'membership_inference'" in line
    keys = line.rsplit("available: ", 1)[1].split(", ")
    assert set(keys) == set(type(load_config().attacks).model_fields), line


def test_a_registered_attack_without_settings_says_so():
    bare = next(n for n, s in attack_specs().items() if s.settings is None)
    with pytest.raises(ConfigError, match=f"attack '{bare}' takes no settings"):
        load_config(overrides=[f"attacks.{bare}.x=1"])


# ---------------------------------------------------------------- a third-party attack, registered by an entry point

PLUGIN = """
from pydantic import BaseModel, ConfigDict, Field

from secure_fed.plugin_specs import AttackSpec
from threat_models.recorder import Recorder

CALLS = []


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    k: int = Field(3, ge=1)
    whole: bool = False


def records(settings, plan, exp):
    CALLS.append(settings.k)
    return Recorder(whole_uplinks=True) if settings.whole else None


SPEC = AttackSpec(
    name="probe_attack", role="server", description="a probe", needs="nothing", defended_by="nothing",
    implementation="probe_attack_spec:Probe", settings=Settings, records=records,
    headline=lambda entry: f"probe k={entry['details']['k']}",
)


def _probe():
    from threat_models.base import Attack, AttackResult

    class Probe(Attack):
        spec = SPEC

        def prepare(self, ctx):
            return {}, {}

        def run(self, view, aux):
            return self.options.k

        def score(self, guess, truth):
            return AttackResult(attack=self.name, role=self.role.value, metrics={"k": guess}, details={"k": guess})

    return Probe


def __getattr__(name):
    if name == "Probe":
        return _probe()
    raise AttributeError(name)
"""


@pytest.fixture
def probe(tmp_path, monkeypatch):
    """``probe_attack``, registered as ``pip install`` of a third-party package would leave it."""
    from secure_fed import plugins
    from secure_fed.config import schema

    (tmp_path / "probe_attack_spec.py").write_text(PLUGIN)
    info = tmp_path / "probe_attack-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: probe-attack\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[secure_fed.attacks]\nprobe_attack = probe_attack_spec:SPEC\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins.registry.cache_clear()
    schema.experiment_config_model.cache_clear()
    import probe_attack_spec

    yield probe_attack_spec
    plugins.registry.cache_clear()
    schema.experiment_config_model.cache_clear()
    sys.modules.pop("probe_attack_spec", None)


def test_a_third_party_attack_gets_its_section(probe):
    cfg = load_config(overrides=["attacks.run=[probe_attack]", "attacks.probe_attack.k=5"])
    assert isinstance(cfg.attacks.probe_attack, probe.Settings) and cfg.attacks.probe_attack.k == 5
    assert load_config().attacks.probe_attack.k == 3  # its defaults
    with pytest.raises(ConfigError, match=r"attacks\.probe_attack\.k: Input should be greater than or equal to 1"):
        load_config(overrides=["attacks.probe_attack.k=0"])
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(overrides=["attacks.probe_attack.j=1"])


def test_a_third_party_attack_is_asked_what_to_record(probe):
    from threat_models.recording import AttackRecording

    def run_of(plan):  # what on_init reads of a run: θ and the run's (resolved) plan
        return SimpleNamespace(theta={"w": torch.zeros(2)}, plan=plan)

    for whole in (False, True):
        plan = load_plan(overrides=["attacks.run=[probe_attack]", f"attacks.probe_attack.whole={whole}"])
        rec = AttackRecording(plan)
        rec.on_init(run_of(plan))
        assert rec.tap.full is whole and set(rec.recorders) == ({"probe_attack"} if whole else set())
    plan = load_plan(overrides=["attacks.run=[token_linkage]", "attacks.probe_attack.whole=true"])
    unlisted = AttackRecording(plan)
    unlisted.on_init(run_of(plan))
    assert probe.CALLS == [3, 3] and not unlisted.tap.full  # asked only when listed


def test_a_third_party_attack_is_built_with_its_settings_and_gives_its_headline(probe, tmp_path):
    from threat_models.audit import audit, headline

    plan = load_plan(overrides=["attacks.run=[probe_attack]", "attacks.probe_attack.k=7"])
    ctx = SimpleNamespace(plan=plan, exp=SimpleNamespace(run_dir=tmp_path), view_for=lambda role: None, privacy=lambda: {})
    doc = audit(ctx, out_dir=tmp_path, progress=False)
    entry = doc["attacks"]["probe_attack"]
    assert entry["metrics"] == {"k": 7} and headline("probe_attack", entry) == "probe k=7"
    assert headline("probe_attack", {"skipped": "why"}) == "skipped: why"


# ---------------------------------------------------------------- what the recording does with the recorders


class _Wrapper:
    """Secrets whose ``client_mod`` notes, on each call of the wrapped function, that it ran (outer first)."""

    def __init__(self, tag, trace):
        self.tag, self.trace = tag, trace

    def client_mod(self, fn):
        def wrapped(*a):
            self.trace.append(self.tag)
            return fn(*a)

        return wrapped


def test_a_recorder_whose_reply_replaces_the_clients_wraps_outermost():
    from threat_models.recorder import Recorder
    from threat_models.recording import AttackRecording

    trace = []
    rec = AttackRecording(load_plan())
    rec.recorders = {  # the outermost one first in order: the recording, not the order, puts it outside
        "outer": Recorder(secrets=_Wrapper("outer", trace), file="o.pt", outermost=True),
        "inner": Recorder(secrets=_Wrapper("inner", trace), file="i.pt"),
        "off": Recorder(secrets=_Wrapper("off", trace), file="f.pt", wraps_clients=False),
    }
    rec.client_mod(lambda: trace.append("client"))()
    assert trace == ["outer", "inner", "client"] and rec.acts_on_clients()


def test_an_audit_of_an_attack_the_run_did_not_insert_for_finds_nothing_inserted(tmp_path):
    """Trained without ``one_run_audit`` listed, the run holds no canaries: an audit that lists it now builds fresh
    ones when the run is rebuilt, and must not score them (the attack reports itself skipped)."""
    from secure_fed.plugin_api.attacks import build_experiment
    from tests.conftest import SMALL
    from threat_models.audit import audit
    from threat_models.context import AuditContext

    run = tmp_path / "run"
    plan = load_plan(overrides=[*SMALL, "attacks.run=[token_linkage]", "training.rounds=2"])
    build_experiment(plan, run_dir=run).run(progress=False)
    ctx = AuditContext.from_run_dir(run, attacks=["one_run_audit"])
    assert ctx.inserted("one_run_audit") is None
    res = audit(ctx, ["one_run_audit"], out_dir=tmp_path / "audit", progress=False)["attacks"]["one_run_audit"]
    assert res["skipped"].startswith("no canaries were inserted")
