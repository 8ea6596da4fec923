"""Every bad input is one ``error:`` line, exit status 2, no traceback, and nothing written.

One test per class of mistake, and a property test that mutates a valid config (types, ranges,
non-finite numbers, unicode, empty and huge lists, unknown keys): ``validate`` either accepts it (exit 0)
or prints exactly one ``error:`` line (exit 2), and every accepted mutation of the tiny synthetic config
runs one round without a traceback.
"""

from __future__ import annotations

import contextlib
import io
import traceback
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from secure_fed.cli import main
from tests.conftest import SMALL


def cli(*args: str) -> tuple[int, str, str]:
    """Run the CLI in process; returns (exit status, stdout, stderr). A traceback fails the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse usage errors
            code = e.code if isinstance(e.code, int) else 2
        except Exception:  # noqa: BLE001 - the point: any other exception is a traceback the user would see
            pytest.fail(f"traceback for {args}:\n{traceback.format_exc()}")
    return code, out.getvalue(), err.getvalue()


def assert_one_error_line(code: int, err: str, *needles: str) -> None:
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for n in needles:
        assert n in lines[0], (n, lines[0])


def write(tmp_path: Path, name: str, data: bytes | str) -> Path:
    p = tmp_path / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return p


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "not UTF-8"),
        ("training:\n  rounds: 3\n  client_lr: 0.1\n".encode("utf-16"), "not UTF-8"),
        (b"seed: 1\x00\n", "NUL"),
        (b"training:\n  rounds: 3\n  rounds: 4\n", "duplicate key 'rounds'"),
        (b"training: {client_lr: .inf}\n", "training.client_lr"),
        (b"training: {client_lr: .nan}\n", "training.client_lr"),
        (b"evaluation: {ks: []}\n", "evaluation.ks"),
        (b"dataset: {synthetic: {num_labels: 4, num_groups: 9}}\n", "num_groups"),
        (b"training: [1, 2]\n", "training"),
        (b"- a\n- b\n", "top level"),
        (b"model: {hidden_dims: [0]}\n", "model.hidden_dims"),
        (b"evaluation: {ks: [1, 1]}\n", "evaluation.ks"),
        (b"dataset: {name: digit_mosaics}\npartition: {name: iid}\nmodel: {name: auto}\n", "model.weights: random"),
    ],
    ids=[
        "binary",
        "utf16",
        "nul",
        "duplicate",
        "inf",
        "nan",
        "empty-ks",
        "groups>labels",
        "wrong-type",
        "list-top",
        "zero-width-hidden",
        "dup-ks",
        "images-no-weights",
    ],  # fmt: skip
)
def test_bad_config_file_is_one_line(tmp_path, content, needle):
    path = write(tmp_path, "bad.yaml", content)
    assert_one_error_line(*cli("validate", str(path))[::2], needle)
    out = tmp_path / "run"
    assert_one_error_line(*cli("run", str(path), "--out", str(out))[::2], needle)
    assert not out.exists()  # nothing written for a config error


@pytest.mark.parametrize(
    "unit, needle",
    [
        # below the RDP accountant's floor (about 0.1 at δ = 1e-5): no σ is ever calibrated to it (was a traceback
        # from Opacus, "The privacy budget is too low")
        ('{"clip_norm": 1.0, "target_epsilon": 0.0001}', "cannot be met at any noise_multiplier"),
    ],
)
def test_a_target_epsilon_no_sigma_can_be_calibrated_to_is_one_line(tmp_path, unit, needle):
    ov = ["--set", 'protocols=["dp"]', "--set", "training.rounds=1", "--set", f"privacy.client={unit}"]
    assert_one_error_line(*cli("validate", *_default(tmp_path), *ov)[::2], "privacy.client.target_epsilon", needle)
    out = tmp_path / "run"
    assert_one_error_line(*cli("run", "--out", str(out), *ov)[::2], "privacy.client.target_epsilon", needle)
    assert not out.exists()


def test_unmeetable_dp_target_is_rejected_before_training_naming_the_achievable_epsilon(tmp_path):
    ov = ["--set", 'protocols=["dp"]', "--set", "algorithm.name=fedaws",
          "--set", 'privacy.client={"noise_multiplier": 0.5, "target_epsilon": 0.01, "clip_norm": 1.0}']  # fmt: skip
    code, _, err = cli("validate", *_default(tmp_path), *ov)
    assert_one_error_line(code, err, "privacy.client.target_epsilon 0.01 cannot be met", "ε = ")
    out = tmp_path / "run"
    assert_one_error_line(*cli("run", "--out", str(out), *ov)[::2], "cannot be met")
    assert not out.exists()


@pytest.mark.parametrize(
    ("sets", "needles"),
    [
        (['privacy.local={"target_epsilon": 4}'], ["privacy.local", "is set but 'dp' is not listed"]),
        (['protocols=["dp"]', 'privacy.local={"target_epsilon": 4}'], ["privacy.local with fedalc", "privacy.instance"]),
        (['protocols=["dp"]', "algorithm.normalize_gamma=false", 'privacy.local={"target_epsilon": 4}',
          'privacy.instance={"target_epsilon": 2}'], ["differ", "one budget"]),
        (['protocols=["dp"]', "algorithm.name=fedaws",
          'privacy.local={"noise_multiplier": 0.3, "target_epsilon": 1, "max_labels_per_instance": 8}'],
         ["privacy.local.target_epsilon 1 cannot be met"]),
        (['protocols=["dp"]', "algorithm.name=fedaws", 'privacy.local={"noise_multiplier": 2.0, "target_epsilon": 3, '
          '"batch_sample_rate": 0.5, "max_labels_per_instance": 8}'],
         ["privacy.local.target_epsilon 3 cannot be met: the first round"]),
        (['protocols=["dp"]', "algorithm.name=fedaws", 'privacy.local={"target_epsilon": 4}'],
         ["privacy.local on the positive_only partition needs privacy.local.max_labels_per_instance", "public"]),
        (['protocols=["dp"]', "algorithm.name=fedaws", 'privacy.local={"target_epsilon": 4, "max_labels_per_instance": -2}'],
         ["privacy.local.max_labels_per_instance", "greater than or equal to 1"]),
        (['protocols=["dp"]', "algorithm.name=fedaws", 'privacy.local={"target_epsilon": 4, "max_labels_per_instance": 3}',
          'privacy.client={"target_epsilon": 4, "max_labels_per_instance": 5}'], ["differ", "once a run"]),
        (['protocols=["dp"]', "algorithm.name=fedavg", "partition.name=iid", "model.family=linear_head",
          'privacy.local={"target_epsilon": 4, "max_labels_per_instance": 3}'], ["positive_only", "remove it"]),
        (['protocols=["dp"]', "algorithm.name=fedavg", "dataset.name=digit_mosaics", "partition.name=iid",
          "model.family=linear_head", "model.name=resnet18", "model.weights=random", 'privacy.local={"target_epsilon": 4}'],
         ["cannot run on a ResNet", "batch norm"]),
        (['protocols=["dp"]', "algorithm.name=fedaws", "training.aggregation=num_examples",
          'privacy.local={"target_epsilon": 4}'], ["training.aggregation must be uniform"]),
        (['protocols=["dp"]', "algorithm.name=flag", "partition.name=iid", "model.family=linear_head",
          'privacy.local={"target_epsilon": 4}'], ["privacy.local with flag", "weight_cap"]),
        (['protocols=["dp"]', "algorithm.name=fedaws", "training.client_fraction=0.5", "training.sampling=proportional",
          'privacy.local={"target_epsilon": 4}'], ["sampling: proportional"]),
        (['protocols=["dp"]', "algorithm.name=fedavg", "partition.name=iid", 'privacy.local={"target_epsilon": 4}'],
         ["model.family embedding on a iid partition"]),
    ],
    ids=["no-dp", "fedalc-without-instance", "two-budgets", "unmeetable-first-step", "unmeetable-first-round",
         "bound-missing", "bound-negative", "bounds-differ", "bound-outside-positive-only", "resnet",
         "weighted-aggregation", "flag", "proportional", "rows-outside-positive-only"],
)  # fmt: skip
def test_bad_client_dp_sgd_settings_are_one_line(tmp_path, sets, needles):
    """privacy.local mistakes: a clear line before anything is written (the first-round check needs the data, so
    ``run`` is the command that must refuse them all)."""
    ov = [x for o in sets for x in ("--set", o)]
    out = tmp_path / "run"
    assert_one_error_line(*cli("run", "--out", str(out), *ov)[::2], *needles)
    assert not out.exists()


@pytest.mark.parametrize(
    ("sets", "needles"),
    [
        (["dataset.name=bibtex", 'protocols=["dp"]', "algorithm.normalize_gamma=false",
          'privacy.instance={"target_epsilon": 4}'], ["privacy.instance.expected_batch_size", "public", "private divisor"]),
        (['protocols=["dp"]', "algorithm.normalize_gamma=false",
          'privacy.instance={"target_epsilon": 4, "expected_batch_size": "measured"}'],
         ["privacy.instance.expected_batch_size", "positive number", "auto"]),
        (['protocols=["dp"]', "algorithm.normalize_gamma=false",
          'privacy.instance={"target_epsilon": 4, "expected_batch_size": 0}'], ["privacy.instance.expected_batch_size"]),
    ],
    ids=["divisor-missing", "divisor-not-a-number", "divisor-zero"],
)  # fmt: skip
def test_a_w_step_divisor_that_is_not_public_is_one_line(tmp_path, sets, needles):
    """The W step divides by a public B̄: missing where no public size exists, or not a positive number, is refused by
    ``validate`` and ``run`` alike, before anything is written."""
    ov = [x for o in sets for x in ("--set", o)]
    assert_one_error_line(*cli("validate", *_default(tmp_path), *ov)[::2], *needles)
    out = tmp_path / "run"
    assert_one_error_line(*cli("run", "--out", str(out), *ov)[::2], *needles)
    assert not out.exists()


@pytest.mark.parametrize(
    ("sets", "needles"),
    [
        (["ckks.coeff_mod_bit_sizes=[40,60]"], ["ckks.coeff_mod_bit_sizes [40, 60]", "global_scale_bits 40"]),
        (["ckks.coeff_mod_bit_sizes=[61,40,60]"], ["ckks.coeff_mod_bit_sizes [61, 40, 60]", "2 to 60 bits"]),
        (["ckks.coeff_mod_bit_sizes=[60,40,40,40,39]"], ["total 219 bits", "limit of 218"]),
        (["ckks.poly_modulus_degree=16384", "ckks.coeff_mod_bit_sizes=[60,19]"], ["19-bit primes", "≡ 1 mod 32768"]),
        (["ckks.poly_modulus_degree=65536", "ckks.coeff_mod_bit_sizes=[60,60]"], ["ckks.poly_modulus_degree 65536"]),
        (["ckks.coeff_mod_bit_sizes=[60]"], ["at least 2 primes"]),
    ],
    ids=["scale-above-data-primes", "prime-61-bits", "total-219-at-8192", "no-19-bit-primes", "degree-65536", "one-prime"],
)  # fmt: skip
def test_a_ckks_modulus_chain_tenseal_refuses_is_one_line(tmp_path, sets, needles):
    """Chains TenSEAL refuses when the run builds its context or encrypts (``validate`` used to accept them and the run
    died in TenSEAL with a traceback) are refused by ``validate`` and ``run`` alike, before anything is written."""
    ov = [x for o in ['protocols=["ckks"]', "training.rounds=1", *sets] for x in ("--set", o)]
    assert_one_error_line(*cli("validate", *_default(tmp_path), *ov)[::2], *needles)
    out = tmp_path / "run"
    assert_one_error_line(*cli("run", "--out", str(out), *ov)[::2], *needles)
    assert not out.exists()


def _default(tmp_path: Path) -> list[str]:
    from secure_fed.config import default_config_text

    return [str(write(tmp_path, "default.yaml", default_config_text()))]


def test_output_directory_that_cannot_be_created_or_written(tmp_path):
    blocker = write(tmp_path, "a_file", "x")
    code, _, err = cli("run", "--out", str(blocker / "run"), "--set", "training.rounds=1")
    assert_one_error_line(code, err, "cannot be created", str(blocker))


def test_output_path_that_is_a_file(tmp_path):
    f = write(tmp_path, "taken", "x")
    code, _, err = cli("run", "--out", str(f), "--set", "training.rounds=1")
    assert_one_error_line(code, err, "not a directory")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["sweep", "--seeds", "a", "--grid", "training.rounds=1"], "--seeds 'a'"),
        (["sweep", "--seeds", ",", "--grid", "training.rounds=1"], "at least one seed"),
        (["sweep", "--grid", "training.rounds"], "--grid"),
        (["sweep", "--grid", "training.rounds=0"], "training.rounds"),
        # a point listed twice would share one run directory; a grid over seed would be overridden by --seeds
        (["sweep", "--seeds", "0,0", "--grid", "training.rounds=1"], "seed 0 listed twice"),
        (["sweep", "--grid", "algorithm.lam=1,1"], "value '1' listed twice"),
        (["sweep", "--grid", "algorithm.lam=1", "--grid", "algorithm.lam=2"], "given twice"),
        (["sweep", "--grid", "seed=1,2"], "--seeds"),
    ],
)
def test_sweep_argument_mistakes(tmp_path, args, needle):
    code, _, err = cli(*args, "--out", str(tmp_path / "sweep"))
    assert_one_error_line(code, err, needle)
    assert not (tmp_path / "sweep").exists()


def test_report_argument_mistakes(tmp_path):
    assert_one_error_line(*cli("report", str(tmp_path / "nope"))[::2], "no metrics.jsonl")
    run = tmp_path / "run"
    assert cli("run", "--out", str(run), *[x for o in SMALL for x in ("--set", o)])[0] == 0
    assert_one_error_line(*cli("report", str(run), "--out", str(tmp_path))[::2], ".png")
    blocker = write(tmp_path, "a_file", "x")
    assert_one_error_line(*cli("report", str(run), "--out", str(blocker / "r.png"))[::2], "not a directory")
    assert cli("report", str(run), "--out", str(tmp_path / "new" / "r.png"))[0] == 0  # a new folder is made
    assert (tmp_path / "new" / "r.png").is_file()


def test_report_of_runs_with_no_evaluated_round_writes_nothing(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    write(run, "metrics.jsonl", "{bad\n")  # a run's one half-written line: nothing evaluated yet
    assert_one_error_line(*cli("report", str(run))[::2], "nothing to report")
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["data", "download", "scene", "--mirror", "notaurl"], "--mirror 'notaurl': not a URL"),
        (["data", "download", "scene", "--mirror", "file:///nonexistent/mulan"], "could not fetch"),
        (["data", "download", "scene", "--root", "{file}"], "is not a directory"),
        (["data", "synth-xc", "--like", "eurlex-4k", "--scale", "0.01", "--out", "{file}/xc"], "cannot be created"),
        (["flower", "certificates", "--out", "{tmp}/certs", "--days", "0"], "--days 0"),
        (["flower", "certificates", "--out", "{tmp}/certs", "--host", ""], "--host ''"),
        (["flower", "local", "--out", "{tmp}/fl", "--timeout", "-1"], "--timeout -1"),
        (["flower", "local", "--resume"], "--resume needs --out"),
        (["flower", "local", "--out", "{tmp}/fl", "--link-loss", "1.5"], "link loss 1.5"),
        (["flower", "local", "--out", "{tmp}/fl", "--link-delay", "-1"], "link delay -1.0 ms"),
        (["validate", "{default}", "--set", "dataset.name=yeast", "--data-root", "{tmp}/nowhere"], "not found"),
        (["validate", "{default}", "--set", "algorithm.name=flag", "--set", "partition.name=natural",
          "--set", "partition.client_ids_file={tmp}/ids.txt"], "client_ids_file"),
    ],
)  # fmt: skip
def test_command_argument_mistakes_are_one_line_and_write_nothing(tmp_path, monkeypatch, args, needle):
    """Each was a traceback, exit 0, or left files behind (a CLI audit): now one line, exit 2, nothing new on disk."""
    monkeypatch.setenv("SECURE_FED_DATA", str(tmp_path / "data"))
    blocker = write(tmp_path, "a_file", "x")
    default = _default(tmp_path)[0]
    args = [a.format(file=blocker, tmp=tmp_path, default=default) for a in args]
    before = sorted(tmp_path.rglob("*"))
    assert_one_error_line(*cli(*args)[::2], needle)
    assert sorted(tmp_path.rglob("*")) == before


def test_a_sweep_never_reuses_a_run_of_another_config(tmp_path):
    grid = ["--grid", "training.rounds=2", *[x for o in SMALL if not o.startswith("training.rounds") for x in ("--set", o)]]
    assert cli("sweep", *grid, "--out", str(tmp_path / "s"))[0] == 0
    grid[1] = "training.rounds=3"  # the cache is keyed on the whole config: a changed round count is no hit
    code, _, err = cli("sweep", *grid, "--out", str(tmp_path / "s"))
    assert code == 0 or "another config" in err
    # the same tag directory now must hold a 3-round run, or the sweep said why it would not reuse it
    import json

    runs = list((tmp_path / "s").glob("*-seed0/summary.json"))
    assert any(json.loads(p.read_text())["rounds_completed"] == 3 for p in runs) or "another config" in err


# --------------------------------------------------------------------------------------- property test
EDGE_VALUES = st.sampled_from(
    [
        0,
        -1,
        1,
        2,
        3,
        2**31,
        -(2**63),
        0.5,
        -0.5,
        1e-300,
        1e308,
        float("nan"),
        float("inf"),
        float("-inf"),
        "",
        "ü",
        "🙂",
        "none",
        True,
        False,
        None,
        [],
        {},
        [0],
        ["a"],
        list(range(5000)),
        {"x": 1},
    ]  # fmt: skip
)


def _paths(d: dict, prefix: tuple = ()) -> list[tuple]:
    out = []
    for k, v in d.items():
        p = (*prefix, k)
        out.append(p)
        if isinstance(v, dict):
            out.extend(_paths(v, p))
    return out


def _tiny() -> dict:
    from secure_fed.config import apply_overrides, default_config_text

    return apply_overrides(yaml.safe_load(default_config_text()), [*SMALL, "training.rounds=1", "evaluation.every=1"])


TINY_PATHS = _paths(_tiny())


@settings(
    max_examples=200,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    mutations=st.lists(
        st.one_of(
            st.tuples(st.just("set"), st.sampled_from(TINY_PATHS), EDGE_VALUES),
            st.tuples(st.just("unknown"), st.sampled_from(TINY_PATHS), st.text(min_size=1, max_size=8)),
        ),
        min_size=1,
        max_size=3,
    )
)
def test_mutated_configs_validate_to_one_error_line_or_run_one_round(tmp_path_factory, mutations):
    data = _tiny()
    for kind, path, value in mutations:
        node = data
        for part in path[:-1]:
            if not isinstance(node.get(part), dict):
                break
            node = node[part]
        else:
            if kind == "set":
                node[path[-1]] = value
            elif isinstance(node.get(path[-1]), dict):
                node[path[-1]][value] = 1
            else:
                node[value] = 1
    tmp = tmp_path_factory.mktemp("mut")
    try:
        text = yaml.safe_dump(data, allow_unicode=True)
    except yaml.YAMLError:
        return
    cfg = write(tmp, "m.yaml", text)
    code, _, err = cli("validate", str(cfg))
    if code != 0:
        assert_one_error_line(code, err)
        return
    out = tmp / "run"
    code, _, err = cli("run", str(cfg), "--out", str(out), "--set", "training.rounds=1", "--set", "output.progress=false")
    if code == 2:  # a data-dependent refusal (e.g. a partition the data cannot fill) is still one line
        assert_one_error_line(code, err)
    elif code == 1:  # training diverged (non-finite parameters): said in one line, status "diverged"
        lines = [x for x in err.splitlines() if x.strip()]
        assert len(lines) == 1 and "diverged" in lines[0], err
    else:
        assert code == 0, err


@pytest.mark.parametrize(
    ("sets", "needle"),
    [
        (["training.rounds=abc"], "--set training.rounds=abc: training.rounds: Input should be a valid integer"),
        (["trainin.rounds=1"], "--set trainin.rounds=1: trainin: unknown key (did you mean 'training'?)"),
        (["training.rounds=3", "protocols=[foo]"], "--set protocols=[foo]: (top level): unknown protocol layer 'foo'"),
    ],
)
def test_a_set_flag_that_breaks_a_valid_file_is_named_in_the_error(tmp_path, sets, needle):
    """The error names the ``--set`` that caused it, not the file (an unknown section under the key; a check with no
    key, found by applying the flags one by one to the valid file)."""
    default = _default(tmp_path)[0]
    for cmd in ("validate", "run"):
        args = [cmd, default, *[x for s in sets for x in ("--set", s)]]
        assert_one_error_line(*cli(*args)[::2], needle)


def test_a_missing_xc_file_hints_synth_xc_and_validate_never_says_valid(tmp_path):
    cfg = write(tmp_path, "xc.yaml", f"dataset: {{format: xc, train: {tmp_path}/xc/train.txt, test: {tmp_path}/xc/test.txt}}\n")
    for cmd in ("validate", "run"):
        code, out, err = cli(cmd, str(cfg))
        assert_one_error_line(code, err, f"data file not found: {tmp_path}/xc/train.txt")
        assert "secure-fed data synth-xc" in err and "valid" not in out


# ---------------------------------------------------------------- the newcomer's edges (issue 53, point 5)


@pytest.mark.parametrize("command", ["run", "validate"])
def test_a_set_without_its_equals_sign_names_the_missing_equals_not_a_config_file(tmp_path, command):
    """``--set training.rounds 5``: argparse leaves ``5`` as CONFIG; the mistake is the missing ``=``."""
    code, out, err = cli(
        command, "--set", "training.rounds", "5", "--out" if command == "run" else "--data-root", str(tmp_path / "o")
    )
    assert_one_error_line(code, err, "--set training.rounds: missing '='", "--set training.rounds=5")
    assert "config file not found" not in err and not (tmp_path / "o").exists()


def test_validate_without_a_config_checks_the_embedded_default_as_run_does():
    code, out, err = cli("validate", "--set", "training.rounds=5")
    assert code == 0, err
    assert out.splitlines()[0].startswith("the embedded default: valid (fedalc on synthetic, 5 rounds)"), out


def test_an_unknown_privacy_key_suggests_the_blocks_keys_it_may_mean():
    code, _, err = cli("validate", "--set", "privacy.epsilon=2")
    assert_one_error_line(code, err, "privacy.epsilon: unknown key", "did you mean", "'privacy.instance.target_epsilon'",
                          "'privacy.local.target_epsilon'", "'privacy.client.target_epsilon'")  # fmt: skip
    code, _, err = cli("validate", "--set", "privacy.client.target_epsilo=2")  # inside an optional block, too
    assert_one_error_line(code, err, "privacy.client.target_epsilo: unknown key (did you mean 'target_epsilon'?)")
