"""The command line as a user meets it: real subprocesses, real exit codes."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import SMALL


def cli(*args, cwd=None, env=None):
    return subprocess.run(
        [sys.executable, "-m", "secure_fed.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        timeout=300,
    )


def test_run_default_with_overrides_writes_run_dir(tmp_path):
    sets = [x for s in SMALL for x in ("--set", s)]
    r = cli("run", *sets, "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["algorithm"] == "fedalc" and summary["rounds_completed"] == 4
    assert "privacy: ε = ∞" in r.stdout
    # a second run into the same directory is refused; resuming a finished run is a no-op that succeeds
    again = cli("run", *sets, "--out", str(tmp_path / "run"))
    assert again.returncode == 2 and "already holds a run" in again.stderr
    res = cli("resume", str(tmp_path / "run"))
    assert res.returncode == 0 and "resuming" in res.stdout


def test_resume_continues_to_more_rounds(tmp_path):
    sets = [x for s in SMALL for x in ("--set", s)]
    assert cli("run", *sets, "--set", "training.rounds=2", "--out", str(tmp_path / "r")).returncode == 0
    r = cli("run", "--resume", str(tmp_path / "r"), "--set", "training.rounds=4")
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["rounds_completed"] == 4


@pytest.mark.parametrize(
    "content, needle",
    [
        ("algorithm:\n  lamda: 10\n", "algorithm.lamda: unknown key (did you mean 'lam'?)"),
        ("training:\n  rounds: many\n", "training.rounds: Input should be a valid integer"),
    ],
)
def test_bad_config_one_line_no_traceback(tmp_path, content, needle):
    p = tmp_path / "bad.yaml"
    p.write_text(content)
    for cmd in (["validate", str(p)], ["run", str(p)]):
        r = cli(*cmd)
        assert r.returncode == 2
        assert r.stderr.strip().count("\n") == 0 and "Traceback" not in r.stderr
        assert needle in r.stderr


def test_missing_data_file_is_one_clear_line(tmp_path):
    r = cli("run", "--set", "dataset.name=bibtex", "--data-root", str(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0
    assert str(tmp_path / "mulan" / "bibtex" / "bibtex-train.arff") in r.stderr
    assert "secure-fed data download bibtex" in r.stderr


def test_list_shows_every_registry():
    r = cli("list")
    assert r.returncode == 0
    for word in (
        "fedavg_fixed",
        "fedaws",
        "fedalc_fixed",
        "oracle",
        "bibtex",
        "synthetic",
        "positive_only",
        "dirichlet",
        "protocols:",
        "attacks:",
    ):
        assert word in r.stdout
    from secure_fed.plugin_specs import layer_specs

    for name, spec in layer_specs().items():  # each protocol layer with its one-sentence threat model
        assert f"{name}" in r.stdout and spec.threat_model[:60] in r.stdout
    from threat_models import ATTACKS

    for name, atk in ATTACKS.items():  # each attack with its role and what it needs
        assert f"{name}" in r.stdout and f"[{atk.role.value}]" in r.stdout and atk.needs in r.stdout


def test_output_piped_into_a_reader_that_went_away_ends_quietly():
    """`secure-fed list | head -1`: the reader has closed the pipe; no BrokenPipeError traceback, exit 141."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written: every write fails with EPIPE
    try:
        r = subprocess.run([sys.executable, "-m", "secure_fed.cli", "list"], stdout=write_end, stderr=subprocess.PIPE,
                           text=True, timeout=120)  # fmt: skip
    finally:
        os.close(write_end)
    assert r.returncode == 141, r.stderr
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr


def test_invalid_protocol_stack_is_one_line_with_the_reason(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("protocols: [ckks, dp]\nprivacy: {client: {noise_multiplier: 1}}\n")
    r = cli("run", str(bad))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "'dp' must come before 'ckks'" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_secure_sum_range_that_would_clip_noise_shares_is_one_line_and_writes_nothing(tmp_path):
    sets = [x for s in [*SMALL, "algorithm.name=fedavg", "protocols=[dp, secure_aggregation]",
                        "privacy.client={noise_multiplier: 1.0, clip_norm: 1.0, noise: clients}",
                        "secure_aggregation.clip_range=5"] for x in ("--set", s)]  # fmt: skip
    (tmp_path / "c.yaml").write_text("seed: 0\n")
    for cmd in (["validate", str(tmp_path / "c.yaml")], ["run", "--out", str(tmp_path / "run")]):
        r = cli(*cmd, *sets)
        assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert "secure_aggregation.clip_range 5 would clip the clients' noise shares" in r.stderr
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").rglob("*.*"))


def test_sweep_and_report(tmp_path):
    sets = [x for s in SMALL for x in ("--set", s)]
    r = cli("sweep", "--grid", "algorithm.lam=1,100", *sets, "--set", "training.rounds=2", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "sweep.json").read_text())
    assert [row["point"]["algorithm.lam"] for row in rows] == ["1", "100"]
    rep = cli("report", *(row["run_dir"] for row in rows), "--vary", "algorithm.lam", "--out", str(tmp_path / "r.png"))
    assert rep.returncode == 0 and (tmp_path / "r.png").stat().st_size > 1000


def test_run_with_attacks_then_audit_a_finished_run(tmp_path):
    sets = [x for s in SMALL for x in ("--set", s)]
    run = tmp_path / "r"
    r = cli("run", *sets, "--set", "attacks.run=[token_linkage,one_run_audit]", "--set", "attacks.one_run_audit.canaries=50",
            "--out", str(run))  # fmt: skip
    assert r.returncode == 0, r.stderr
    # computed from the members: operator-only, in private/ (nothing of it beside the released files)
    assert "token_linkage: linked" in r.stdout and (run / "private" / "attacks.json").is_file()
    assert not (run / "attacks.json").exists() and not (run / "roc.png").exists()
    doc = json.loads((run / "private" / "attacks.json").read_text())
    assert set(doc["attacks"]) == {"token_linkage", "one_run_audit"}
    for entry in doc["attacks"].values():
        assert {"role", "metrics", "chance"} <= set(entry)
    # audit again from the run directory, adding an attack: earlier results are kept
    a = cli("audit", str(run), "--attacks", "label_deanonymization")
    assert a.returncode == 0, a.stderr
    assert f"wrote {run / 'private' / 'attacks.json'}" in a.stdout and not (run / "attacks.json").exists()
    doc = json.loads((run / "private" / "attacks.json").read_text())
    assert set(doc["attacks"]) == {"token_linkage", "one_run_audit", "label_deanonymization"}
    assert doc["attacks"]["label_deanonymization"]["metrics"]["reidentified"] == 1.0
    # the report: its page beside the run holds no audit result; the operator's, in private/, has them all
    rep = cli("report", str(run))
    assert rep.returncode == 0, rep.stderr
    public, operator = (run / "report.html").read_text(), (run / "private" / "report.html").read_text()
    assert "token_linkage" not in public and "reidentified" not in public
    assert "operator.label_deanonymization.reidentified" in operator and "operator-only" in operator


def test_audit_errors_are_one_line(tmp_path):
    r = cli("audit", str(tmp_path / "nope"))
    assert r.returncode == 2 and "not a run directory" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "c.yaml"
    bad.write_text("attacks: {run: [token_linkag]}\n")
    v = cli("validate", str(bad))
    assert v.returncode == 2 and "did you mean 'token_linkage'" in v.stderr and "Traceback" not in v.stderr
    sets = [x for s in SMALL for x in ("--set", s)]
    assert cli("run", *sets, "--out", str(tmp_path / "r")).returncode == 0
    u = cli("audit", str(tmp_path / "r"), "--attacks", "foo")
    assert u.returncode == 2 and "unknown attack 'foo'" in u.stderr
    e = cli("audit", str(tmp_path / "r"), "--attacks", "")  # was read as "every attack" (16 shadow models)
    assert e.returncode == 2 and "name at least one attack" in e.stderr
    assert not (tmp_path / "r" / "private" / "attacks.json").exists()
    final = tmp_path / "r" / "private" / "checkpoints" / "final.pt"
    kept = final.read_bytes()
    final.write_bytes(b"x")  # a damaged released model: one line naming the file (was an UnpicklingError traceback)
    d = cli("audit", str(tmp_path / "r"), "--attacks", "embedding_identification")
    assert d.returncode == 2 and "final.pt: not a readable checkpoint" in d.stderr and "Traceback" not in d.stderr
    final.write_bytes(kept)
    summary = tmp_path / "r" / "summary.json"
    doc = json.loads(summary.read_text())
    summary.write_text(json.dumps({**doc, "status": "interrupted"}))  # a partial model is not audited
    i = cli("audit", str(tmp_path / "r"), "--attacks", "embedding_identification")
    assert i.returncode == 2 and "has not finished (status interrupted)" in i.stderr
    summary.write_text(json.dumps(doc))
    # a run trained without attacks configured: server-view attacks say why they are skipped
    s = cli("audit", str(tmp_path / "r"), "--attacks", "token_linkage")  # named, so not done: exit 2 (was 0)
    assert s.returncode == 2 and "skipped (the run recorded no server view" in s.stdout
    why = "the run recorded no server view (set attacks.run before training)"
    assert s.stderr == f"error: --attacks token_linkage: skipped: {why}\n"


def test_ctrl_c_before_training_is_one_line_not_a_traceback(monkeypatch, capsys):
    """Ctrl-C while a command still loads (before the run's own handler saves a checkpoint) ends with status 130."""
    from secure_fed import cli as cli_module

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_module, "cmd_validate", interrupted)
    assert cli_module.main(["validate", "x.yaml"]) == 130
    assert capsys.readouterr().err.strip() == "interrupted"


def test_version_is_the_installed_distributions():
    from importlib.metadata import version

    r = cli("--version")
    assert r.returncode == 0 and r.stdout == f"secure-fed {version('secure-fed')}\n", (r.stdout, r.stderr)


@pytest.mark.parametrize(
    "argv",
    [["run", "nonexistent.yaml"], ["run", "--set", "training.nope=1"], ["resume", "/nonexistent/run"],
     ["run", "--set", "dataset.format=xc", "--set", "dataset.train=/nonexistent/train.txt",
      "--set", "dataset.test=/nonexistent/test.txt"]],
)  # fmt: skip
def test_a_config_error_comes_before_torch_is_imported(argv):
    """``run``/``resume`` check the config (and its data files) before importing the engine, so the error line is
    there in about a second, not after torch's import (~3 s on the project's machine)."""
    code = (
        "import contextlib, io, sys\nfrom secure_fed.cli import main\n"
        f"with contextlib.redirect_stderr(io.StringIO()) as err: status = main({argv!r})\n"
        "print(status, 'torch' in sys.modules, err.getvalue().count('error: '))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["2", "False", "1"], (r.stdout, r.stderr)


def test_validate_prints_each_dp_units_plan_as_the_layer_builds_it(tmp_path):
    """The DP spec's ``describe`` (what ``validate`` prints) against the layer's own units: same σ, steps and ε."""
    import re
    import types

    from protocols.dp.accountant import epsilon_of
    from protocols.dp.discrete_gaussian_accounting import discrete_gaussian_epsilon
    from protocols.dp.layer import DifferentialPrivacy
    from secure_fed.config import load_plan
    from secure_fed.plugin_specs import layer_specs

    p = tmp_path / "dp.yaml"
    p.write_text(
        "protocols: [dp]\nalgorithm: {normalize_gamma: false}\ntraining: {rounds: 5, local_epochs: 1}\n"
        "privacy:\n  delta: 1.0e-5\n  instance: {target_epsilon: 4.0, sample_rate: 0.1, max_labels_per_instance: 3}\n"
        "  local: {target_epsilon: 4.0, batch_sample_rate: 0.25}\n  client: {noise_multiplier: 1.1}\n"
    )
    cfg = load_plan(p)
    n = 20  # the synthetic default's clients; every one in a round (client_fraction 1)
    described = layer_specs()["dp"].describe(cfg, n)
    lines = [x for x in described if " unit: " in x]  # the units' plans
    released = [x for x in described if x.startswith("dp released model, per ")]  # the graph's plan per unit
    # the layer as a run builds it: an instance sits on ≤ min(m, labels) = 3 clients (20 labels)
    env = types.SimpleNamespace(num_clients=n, max_clients_per_instance=3, theta={}, update_layout=lambda: None, has_rows=True)
    layer = DifferentialPrivacy(layer_specs()["dp"].settings(cfg), env)
    units = layer.units
    assert sorted(units) == ["client", "instance"] and len(lines) == 2 and len(released) == 2
    for line, unit in zip(lines, [units["instance"], units["client"]], strict=True):
        mechs = list(unit.mechanisms.values())
        shown = re.findall(r"σ ([\d.]+) \((?:calibrated|given)\), q ([\d.]+), ([\d,]+) planned steps", line)
        assert len(shown) == len(mechs), line
        for (sigma, q, steps), m in zip(shown, mechs, strict=True):
            assert float(sigma) == pytest.approx(m.sigma, rel=1e-3) and float(q) == m.sample_rate
            assert int(steps.replace(",", "")) == m.planned_steps
        eps = epsilon_of([(m.sigma, m.sample_rate, m.planned_steps) for m in mechs], unit.delta, unit.accountant_name)
        assert float(re.search(r"plans ε = ([\d.e+]+)", line).group(1)) == pytest.approx(eps, rel=1e-3), line
        # the discrete Gaussian's proven bound beside it: the RDP ledger's own value (integer-order RDP, exact for it)
        proven = discrete_gaussian_epsilon([(m.sigma, m.sample_rate, m.planned_steps) for m in mechs], unit.delta)
        shown = float(re.search(r"discrete Gaussian, proven bound: ε = ([\d.e+]+)", line).group(1))
        assert shown == pytest.approx(proven, rel=1e-3) and proven >= eps * (1 - 1e-3), line
    assert "60 planned steps" in lines[0] and "calibrated" in lines[0] and "(given)" in lines[1]
    # the released model's planned ε per unit: the layer's own graph over its planned steps
    graph = layer.privacy_graph(planned=True)
    for line, unit in zip(released, ["instance", "client"], strict=True):
        assert line.startswith(f"dp released model, per {unit} (observer): plans ε = ")
        want = graph.epsilon(unit, "observer", delta=1e-5, accountant="rdp")["epsilon"]
        got = line.split("plans ε = ")[1].split(" ")[0]
        assert (got == "∞") if want == "inf" else float(got) == pytest.approx(want, rel=1e-3), line
    assert "∞" not in released[0] and "∞" in released[1]  # the W step bounds instances, not clients


def test_audit_of_a_named_attack_that_is_skipped_exits_non_zero(tmp_path, monkeypatch, capsys):
    """An attack named in --attacks that cannot run on the run is one error line (exit 2), not a quiet success;
    with --attacks all, skipped attacks are reported and the audit succeeds."""
    import threat_models.audit as audit
    from secure_fed.cli import main

    run = tmp_path / "r"
    run.mkdir()
    (run / "config.yaml").write_text("{}\n")
    why = "fedavg collects no label sets"
    doc = {"attacks": {"token_linkage": {"role": "server", "skipped": why}, "one_run_audit": {"metrics": {}}}}
    monkeypatch.setattr(audit, "audit_run_dir", lambda *a, **k: doc)
    assert main(["audit", str(run), "--attacks", "token_linkage"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --attacks token_linkage: skipped: {why}\n"
    assert main(["audit", str(run), "--attacks", "one_run_audit"]) == 0
    assert main(["audit", str(run), "--attacks", "all"]) == 0


def test_ctrl_c_in_training_prints_the_resume_command_and_keeps_the_checkpoint(tmp_path, monkeypatch, capsys):
    """A KeyboardInterrupt in round 2 (Ctrl-C): exit 130, the checkpoint in place, the resume command printed, and
    that command continues the run to its end."""
    from secure_fed import cli as cli_module
    from secure_fed.engine.runner import Experiment

    real = Experiment.train_round

    def train_round(self):
        if self.round == 2:
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(Experiment, "train_round", train_round)
    run = tmp_path / "run"
    code = cli_module.main(["run", *[x for s in SMALL for x in ("--set", s)], "--out", str(run)])
    out, err = capsys.readouterr()
    assert code == 130
    assert err.strip().splitlines()[-1].endswith(f"to continue: secure-fed resume {run}")
    assert "interrupted after round 2" in err and "[interrupted]" in out
    assert (run / "private" / "checkpoints" / "last.pt").is_file()
    monkeypatch.setattr(Experiment, "train_round", real)
    r = cli("resume", str(run))
    assert r.returncode == 0 and "resuming" in r.stdout and "[completed]" in r.stdout
    assert json.loads((run / "summary.json").read_text())["rounds_completed"] == 4


def test_the_last_lines_give_epsilon_delta_unit_and_adversaries(tmp_path):
    """A client-level DP run ends with the released model's ε and δ and one line for the client unit: what it
    covers, the adversary it holds against (the observer), the one it does not (the server, ε = ∞), what is not
    covered; a run without DP ends with one line: ε = ∞ and why."""
    sets = [x for s in [*SMALL, "training.rounds=2", "algorithm.name=fedavg", "protocols=[dp]",
                        'privacy.client={"noise_multiplier": 1.0, "clip_norm": 1.0}'] for x in ("--set", s)]  # fmt: skip
    r = cli("run", *sets, "--out", str(tmp_path / "dp"))
    assert r.returncode == 0, r.stderr
    priv = json.loads((tmp_path / "dp" / "summary.json").read_text())["privacy"]
    head, unit = r.stdout.strip().splitlines()[-2:]
    assert head == f"  privacy: ε = {priv['epsilon']:.4g}, δ = 1e-05 per client for the released model"
    assert unit.startswith(f"  privacy per client unit: ε = {priv['epsilon']:.4g}, δ = 1e-05 (rdp, 2 of 2 steps) over "
                           "each client's whole update of θ and its class rows; holds against the observer (")  # fmt: skip
    assert "; not against the server (ε = ∞: the server sees each clipped update before it adds the noise)" in unit
    assert "per training instance (on up to 8 clients), by the group bound" in unit
    assert unit.endswith("; not covered: nothing listed")

    plain = cli("run", *[x for s in [*SMALL, "training.rounds=2"] for x in ("--set", s)], "--out", str(tmp_path / "plain"))
    assert plain.returncode == 0, plain.stderr
    last = plain.stdout.strip().splitlines()[-1]
    assert last.startswith("  privacy: ε = ∞: ") and "privacy per" not in plain.stdout


def test_noise_multiplier_and_target_epsilon_together_is_a_cap_validate_states_and_the_run_keeps(tmp_path):
    """Both in one block: σ as given, the target a cap (the ledger's stop). ``validate`` says so and after how many
    steps the run stops; the run stops there (budget_exhausted)."""
    import re

    sets = [x for s in [*SMALL, "training.rounds=20", "algorithm.name=fedaws", "protocols=[dp]",
                        "privacy.client={noise_multiplier: 2, target_epsilon: 8}"] for x in ("--set", s)]  # fmt: skip
    v = cli("validate", *sets)
    assert v.returncode == 0, v.stderr
    m = re.search(r"target 8: a cap on the given σ: training stops before the step that would pass it, after (\d+) of "
                  r"the 20 planned steps", v.stdout)  # fmt: skip
    assert m, v.stdout
    r = cli("run", *sets, "--out", str(tmp_path / "run"))
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "budget_exhausted" and summary["rounds_completed"] == int(m.group(1)), r.stdout


def test_opacus_largest_order_warning_does_not_reach_run_or_validate(tmp_path):
    """σ 20 at q 1: after one round the best Rényi order lies past Opacus's 63, where Opacus warned "Optimal order is
    the largest alpha" into the run's output; the ledger's orders reach past it (protocols.dp.accountant.RDP_ORDERS)."""
    sets = [x for s in [*SMALL, "training.rounds=2", "protocols=[dp]", "privacy.client={noise_multiplier: 20}"]
            for x in ("--set", s)]  # fmt: skip
    env = {"PYTHONWARNINGS": "default"}  # every warning shown, as a user's shell shows it
    for r in (cli("validate", *sets, env=env), cli("run", *sets, "--out", str(tmp_path / "run"), env=env)):
        assert r.returncode == 0, r.stderr
        assert "Optimal order" not in r.stdout + r.stderr and "Warning" not in r.stderr, r.stderr


def test_audit_announces_its_cost_first_takes_set_and_ends_with_a_verdict(tmp_path):
    """`audit --attacks membership_inference --set attacks.membership_inference.shadows=2`: the estimate is the first
    line, the verdict the last; the result's scores are the ones its spec declares (and `secure-fed list` shows)."""
    from secure_fed.plugin_specs import attack_specs

    sets = [x for s in SMALL for x in ("--set", s)]
    run = tmp_path / "r"
    assert cli("run", *sets, "--out", str(run)).returncode == 0
    a = cli("audit", str(run), "--attacks", "membership_inference", "--set", "attacks.membership_inference.shadows=2")
    assert a.returncode == 0, a.stderr
    lines = a.stdout.strip().splitlines()
    assert lines[0].startswith(f"audit of {run}: 1 attack(s); membership_inference trains 2 shadow runs × 4 rounds = 8 "
                               "shadow rounds; estimated "), lines[0]  # fmt: skip
    assert lines[-2] == "verdict:" and lines[-1].startswith("  membership_inference: "), lines[-2:]
    assert ("leak:" in lines[-1]) != ("no leakage measurable" in lines[-1])
    doc = json.loads((run / "private" / "attacks.json").read_text())["attacks"]["membership_inference"]
    assert doc["details"]["shadows"] == 2
    assert set(doc["metrics"]) == set(attack_specs()["membership_inference"].scores)
    bad = cli("audit", str(run), "--set", "training.rounds=3")  # the run's own settings are what it trained with
    assert bad.returncode == 2 and "attacks.* settings only" in bad.stderr and len(bad.stderr.splitlines()) == 1
    eq = cli("audit", str(run), "--set", "attacks.membership_inference.shadows")
    assert eq.returncode == 2 and "missing '='" in eq.stderr
