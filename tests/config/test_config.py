from pathlib import Path

import pytest

from secure_fed.config import load_config
from secure_fed.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_embedded_default_is_fedalc_on_synthetic():
    cfg = load_config()
    assert cfg.algorithm.name == "fedalc" and cfg.dataset.name == "synthetic"
    assert cfg.protocols == []


EXPERIMENT_CONFIGS = [p for p in sorted((REPO / "experiments" / "configs").glob("*.yaml"))]


@pytest.mark.parametrize("path", EXPERIMENT_CONFIGS, ids=lambda p: p.name)
def test_shipped_experiment_configs_validate(path):
    assert load_config(path).training.rounds >= 1


@pytest.mark.parametrize(
    "yaml_text, expected",
    [
        ("algorithm: {name: fedalc, lamda: 3}\n", "algorithm.lamda: unknown key (did you mean 'lam'?)"),
        ("training: {rounds: ten}\n", "training.rounds: Input should be a valid integer"),
        ("training: {client_lr: -0.1}\n", "training.client_lr: Input should be greater than 0"),
        ("algorithm: {name: fedsgd}\n", "algorithm.name: unknown algorithm 'fedsgd'"),
        # each algorithm takes its own keys: fedalc's λ is no key of fedavg's
        ("algorithm: {name: fedavg, lam: 3}\n", "algorithm.lam: unknown key; algorithm.name=fedavg takes loss"),
        ("algorithm: {name: flag, k: 3}\n", "algorithm.k: unknown key; algorithm.name=flag takes loss, flag_alpha"),
        ("bogus: 1\n", "bogus: unknown key"),
        ("protocols: [dp]\n", "none of privacy.instance, privacy.local, privacy.client is set"),
        ("protocols: [secure_agregation]\n", "did you mean 'secure_aggregation'"),
        ("protocols: [secure_aggregation, ckks]\n", "choose one"),
        ("protocols: [keyed_hashing]\nalgorithm: {name: fedavg}\n", "only fedalc and fedalc_fixed collect label sets"),
        ("algorithm: {name: fedalc}\npartition: {name: iid}\n", "partition.name must be positive_only"),
    ],
)
def test_bad_config_gives_one_line_naming_the_key(tmp_path, yaml_text, expected):
    p = tmp_path / "c.yaml"
    p.write_text(yaml_text)
    with pytest.raises(ConfigError) as exc:
        load_config(p)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(str(p))
    assert expected in msg


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("training:\n  rounds: [1,\n")
    with pytest.raises(ConfigError, match=r"c\.yaml:\d+: not valid YAML"):
        load_config(p)


def test_overrides_parse_yaml_values():
    cfg = load_config(overrides=["training.rounds=7", "model.hidden_dims=[8, 4]", "training.server_optimizer.lr=1e-2"])
    assert cfg.training.rounds == 7 and cfg.model.hidden_dims == [8, 4]
    assert cfg.training.server_optimizer.lr == 0.01
    with pytest.raises(ConfigError, match=r"--set training.rounds: missing '=' .*--set training.rounds=VALUE"):
        load_config(overrides=["training.rounds"])


def test_missing_config_file():
    with pytest.raises(ConfigError, match="config file not found"):
        load_config("/nonexistent/x.yaml")


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["training.roundz=1"], "--set training.roundz=1: training.roundz: unknown key (did you mean 'rounds'?)"),
        (["protocols=[dp]", "privacy.client={clip_norm: -1}"], "--set privacy.client={clip_norm: -1}: privacy.client.clip_norm"),
        (["training.rounds=3", "training.rounds=x"], "--set training.rounds=x: training.rounds"),  # the last one wins
    ],
)
def test_an_error_in_an_override_names_the_override_not_the_file(tmp_path, overrides, expected):
    path = tmp_path / "c.yaml"
    path.write_text("training: {rounds: 2}\n")
    with pytest.raises(ConfigError) as exc:
        load_config(path, overrides)
    assert str(exc.value).startswith(expected), str(exc.value)


def test_a_directory_given_as_the_config_says_so(tmp_path):
    (tmp_path / "config.yaml").write_text("training: {rounds: 2}\n")  # a run directory
    with pytest.raises(ConfigError, match=r"is a directory, not a config file \(to continue a run: secure-fed resume"):
        load_config(tmp_path)
