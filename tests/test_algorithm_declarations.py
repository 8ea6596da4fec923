"""Algorithms declare, the rest asks: each algorithm owns its parameters model and capabilities, no module outside its
own tests its name, and a third-party algorithm registered by entry point validates like a built-in."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from secure_fed.algorithms.capabilities import AlgorithmCapabilities
from secure_fed.algorithms.params.base import AlgorithmParams
from secure_fed.algorithms.registry import algorithm_specs, builtin_specs
from secure_fed.config import load_config
from secure_fed.errors import ConfigError
from tests.conftest import SMALL

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("secure_fed", "protocols", "threat_models")
NAMES = frozenset(builtin_specs())

#: string constants equal to an algorithm's name that are not algorithm names, each where it is allowed
NOT_ALGORITHMS: dict[str, set[str]] = {
    # the server optimiser FedAvg (training.server_optimizer.name), not the algorithm
    "fedavg": {
        "secure_fed/engine/server_optimizers.py",
        "secure_fed/config/schema.py",
        "secure_fed/plan.py",
        "protocols/dp/tree_ledger.py",
    },
    # the local DP unit (privacy.local, the instance unit's client-training block) and `secure-fed flower local`
    "local": {
        "secure_fed/algorithms/capabilities.py", "secure_fed/html_report.py",
        "secure_fed/cli.py", "protocols/config_sections.py", "protocols/dp/privacy_units.py", "protocols/layer_specs.py",
        "threat_models/tradeoff.py", "threat_models/tradeoff_points.py", "threat_models/attacks/one_run_audit.py",
    },
    # the DP mechanism plugin of the same name (privacy.label_prior), which releases what the algorithm reads
    "label_prior": {"protocols/dp/label_prior.py"},
}  # fmt: skip


#: an expression that holds an algorithm's name (``cfg.algorithm.name``, ``algo``, ``method`` as the tradeoff calls it)
ALGORITHM_NAME = re.compile(r"algorithm\.name\b|\balgo\b|\bmethod\b")


def _module_file(path: str) -> str:
    return path.partition(":")[0].replace(".", "/") + ".py"


def _own_files(name: str) -> set[str]:
    """Where algorithm ``name``'s literal belongs: its implementation's module, its params module, the registry."""
    spec = builtin_specs()[name]
    return {_module_file(spec.implementation), spec.params.__module__.replace(".", "/") + ".py",
            "secure_fed/algorithms/registry.py"}  # fmt: skip


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _names_in(node: ast.AST) -> list[str]:
    """Algorithm names a comparison operand holds: a constant, or the constants of a tuple, list or set."""
    elts = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return [e.value for e in elts if isinstance(e, ast.Constant) and e.value in NAMES]


def violations(source: str, rel: str) -> list[str]:
    """The algorithm-name literals of one file (``rel``: its path from the repository root) that are not allowed:
    any constant equal to a name outside the name's own files and :data:`NOT_ALGORITHMS`, and (allow-list or not)
    any comparison of such a constant with an expression that holds an algorithm's name (:data:`ALGORITHM_NAME`)."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value in NAMES and id(node) not in docs:
            if rel not in _own_files(node.value) and rel not in NOT_ALGORITHMS.get(node.value, ()):
                out.append(f"{rel}:{node.lineno}: {node.value!r}")
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            names = [n for op in operands for n in _names_in(op)]
            named = any(ALGORITHM_NAME.search(ast.unparse(op)) for op in operands)
            if names and named and not all(rel in _own_files(n) for n in names):
                out.append(f"{rel}:{node.lineno}: compares an algorithm with {names}")
    return out


def test_no_algorithm_name_literal_outside_its_own_modules_and_the_registry():
    found = []
    for package in SCANNED:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            found += violations(path.read_text(), rel)
    assert not found, "algorithm names tested outside their declarations:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "snippet, rel",
    [
        ('if cfg.algorithm.name == "fedalc_fixed":\n    pass\n', "protocols/dp/layer.py"),
        ('ROWLESS = ("fedavg", "flag")\n', "secure_fed/config/schema.py"),
        # allowed as the DP unit in this file, but never compared with an algorithm
        ('if cfg.algorithm.name in ("oracle", "local"):\n    pass\n', "protocols/layer_specs.py"),
        ('if algo != "local":\n    pass\n', "protocols/layer_specs.py"),
    ],
)
def test_the_scan_finds_a_name_check(snippet, rel):
    assert violations(snippet, rel)


def test_the_scan_allows_the_non_algorithm_uses():
    assert not violations('block = "instance" if x else "local"\n', "protocols/layer_specs.py")
    assert not violations('if self.name == "fedavg":\n    pass\n', "secure_fed/engine/server_optimizers.py")
    assert not violations('INSTANCE_BLOCKS = ("instance", "local")\n', "threat_models/tradeoff.py")
    assert not violations('"""The fedalc docstring."""\n', "protocols/layer_specs.py")


@pytest.mark.parametrize("name", sorted(NAMES))
def test_each_algorithm_declares_its_params_and_capabilities(name):
    spec = builtin_specs()[name]
    assert issubclass(spec.params, AlgorithmParams) and spec.params().name == name
    assert isinstance(spec.capabilities, AlgorithmCapabilities)
    cls = spec.load()
    assert cls.params is spec.params and cls.name == name
    # the heavy class agrees with the declaration (it reads it: Algorithm.__init_subclass__)
    assert cls.trains_rows == spec.capabilities.trains_rows
    assert cls.centralized == spec.capabilities.centralised
    assert spec.capabilities.private_w_step == hasattr(cls, "per_set_gradients")
    assert spec.capabilities.collects_label_sets == hasattr(cls, "collect_label_sets")


def test_params_and_validation_import_no_torch():
    code = (
        "import sys\nfrom secure_fed.config import load_config\nfrom secure_fed.algorithms.registry import algorithm_specs\n"
        "load_config(None, ['algorithm.name=fedaws'])\nassert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["algorithm.name=fedavg", "algorithm.normalize_gamma=false"], "algorithm.normalize_gamma"),
        (["algorithm.name=fedaws", "algorithm.fixed_steps=3"], "algorithm.fixed_steps"),
        (["algorithm.name=flag", "partition.name=iid", "model.family=linear_head", "algorithm.k=3"], "algorithm.k"),
    ],
)
def test_a_key_of_another_algorithm_is_refused_naming_it(overrides, key):
    with pytest.raises(ConfigError) as exc:
        load_config(overrides=overrides)
    assert "\n" not in str(exc.value) and f"{key}: unknown key" in str(exc.value)


def test_switching_algorithm_drops_the_keys_given_for_the_previous_one():
    # the default file's fedalc keys (lam, reg_lr, k) and an earlier --set are the previous algorithm's
    cfg = load_config(overrides=["algorithm.normalize_gamma=false", "algorithm.name=fedaws"])
    assert cfg.algorithm.name == "fedaws" and cfg.algorithm.reg_lr == 1e-3  # the file's, which fedaws takes
    assert not hasattr(cfg.algorithm, "normalize_gamma")
    assert load_config(overrides=["algorithm.name=fedavg"]).algorithm.model_dump() == {"name": "fedavg", "loss": "auto"}
    # every switch counts, not only the last: a list that names the algorithm twice (a script's base overrides plus a
    # cell's) drops the file's fedalc keys at the first
    twice = load_config(overrides=["algorithm.name=fedavg", "training.rounds=2", "algorithm.name=fedavg"])
    assert twice.algorithm.model_dump() == {"name": "fedavg", "loss": "auto"}
    assert load_config(overrides=["algorithm.name=fedavg", "algorithm.name=flag"]).algorithm.name == "flag"


THIRD_PARTY = """
from typing import ClassVar, Literal

from pydantic import Field

from secure_fed.algorithms.capabilities import AlgorithmCapabilities
from secure_fed.algorithms.params.base import AlgorithmParams
from secure_fed.algorithms.spec import AlgorithmSpec


class ScaledParams(AlgorithmParams):
    capabilities: ClassVar[AlgorithmCapabilities] = AlgorithmCapabilities(has_rows=True)
    name: Literal["scaled_fedavg"] = "scaled_fedavg"
    scale: float = Field(1.0, gt=0.0)


SPEC = AlgorithmSpec(ScaledParams, "secure_fed.algorithms.fedavg:FedAvg", "FedAvg under another name (a test)")
"""


@pytest.fixture
def third_party(tmp_path, monkeypatch):
    """A third-party package registering an algorithm through the ``secure_fed.algorithms`` entry point group."""
    from secure_fed.config.schema import experiment_config_model
    from secure_fed.plugins import registry

    (tmp_path / "thirdparty_algorithm.py").write_text(textwrap.dedent(THIRD_PARTY))
    info = tmp_path / "thirdparty_algorithm-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-algorithm\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[secure_fed.algorithms]\nscaled_fedavg = thirdparty_algorithm:SPEC\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.cache_clear()
    experiment_config_model.cache_clear()
    yield
    registry.cache_clear()
    experiment_config_model.cache_clear()
    sys.modules.pop("thirdparty_algorithm", None)


def test_a_third_party_algorithm_registers_validates_and_refuses_unknown_keys(third_party):
    assert "scaled_fedavg" in algorithm_specs()
    cfg = load_config(overrides=[*SMALL, "algorithm.name=scaled_fedavg", "algorithm.scale=2"])
    assert cfg.algorithm.scale == 2.0 and cfg.algorithm.capabilities.has_rows
    # the dp layer's checks read its capabilities: client-level DP validates, instance-level is refused by declaration
    load_config(overrides=[*SMALL, "algorithm.name=scaled_fedavg", 'protocols=["dp"]',
                           'privacy.client={"noise_multiplier": 1.0, "clip_norm": 1.0}'])  # fmt: skip
    with pytest.raises(ConfigError, match="scaled_fedavg does not have"):
        load_config(overrides=[*SMALL, "algorithm.name=scaled_fedavg", 'protocols=["dp"]',
                               'privacy.instance={"noise_multiplier": 1.0, "sample_rate": 0.2}'])  # fmt: skip
    with pytest.raises(ConfigError) as exc:
        load_config(overrides=["algorithm.name=scaled_fedavg", "algorithm.k=3"])
    assert "algorithm.k: unknown key; algorithm.name=scaled_fedavg takes loss, scale" in str(exc.value)
    with pytest.raises(ConfigError, match="algorithm.scale: unknown key"):
        load_config(overrides=["algorithm.name=fedavg", "algorithm.scale=2"])


def test_the_entry_points_are_the_builtins():
    """A built-in algorithm is registered by its ``pyproject.toml`` entry point alone: the registry's built-ins are
    those entry points, in their order, read from the source tree even where the installed metadata predates one."""
    import tomllib

    from secure_fed.plugins import load_object, source_entry_points

    eps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["secure_fed.algorithms"]
    assert source_entry_points("algorithms") == eps
    assert list(builtin_specs()) == [load_object(path).name for path in eps.values()]
    assert all(load_object(path).name == name for name, path in eps.items())


def test_declarations_that_would_leave_a_release_outside_dp_are_refused():
    """The DP layer noises row deltas only where W is not fixed, and DP-SGD covers the update, not a weight sent
    beside it: a plugin cannot declare its way around either."""
    from secure_fed.algorithms.capabilities import AlgorithmCapabilities

    with pytest.raises(ValueError, match="fixed_w"):
        AlgorithmCapabilities(has_rows=True, fixed_w=True, trains_rows=True)
    with pytest.raises(ValueError, match="sends_weights"):
        AlgorithmCapabilities(sends_weights=True)  # the default dp_units hold 'local'
    AlgorithmCapabilities(sends_weights=True, dp_units=frozenset({"client"}))
    AlgorithmCapabilities(has_rows=True, fixed_w=True, trains_rows=False)
