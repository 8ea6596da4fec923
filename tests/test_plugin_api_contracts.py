"""The import contracts of issue 54 cover every module of the core, and the example plugins keep to the plugin API.

``pyproject.toml``'s forbidden contracts list modules by name, so a module added to ``secure_fed`` later would be left
out of them silently: these tests read the contracts and compare their lists with the package's modules. The example
plugins under ``examples/plugins/`` are installable packages outside the import-linter's root packages, so their
``import`` statements are scanned here (an AST scan, nothing imported).
"""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import tomllib

import secure_fed

ROOT = Path(__file__).resolve().parents[1]
#: what a plugin may import from secure-fed: the plugin API and the config package's loading functions
PUBLIC = ("secure_fed.plugin_api", "secure_fed.config")


def _contract(name_start: str) -> dict:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (found,) = [c for c in contracts if c["name"].startswith(name_start)]
    return found


def _core_modules() -> set[str]:
    return {f"secure_fed.{m.name}" for m in pkgutil.iter_modules(secure_fed.__path__)}


def test_the_plugin_api_contract_forbids_every_module_of_the_core_but_the_public_ones():
    forbidden = set(_contract("protocols and threat_models import the core only")["forbidden_modules"])
    assert forbidden == _core_modules() - set(PUBLIC)


def test_the_config_contract_lists_every_module_of_the_core_outside_the_config_package():
    sources = set(_contract("only the config package imports the config's schema")["source_modules"])
    assert _core_modules() - {"secure_fed.config"} <= sources


def _secure_fed_imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
        elif isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
    return [m for m in out if m == "secure_fed" or m.startswith("secure_fed.")]


def _private(module: str) -> bool:
    return not any(module == p or module.startswith(p + ".") for p in PUBLIC)


def test_the_example_plugins_import_secure_fed_only_through_the_plugin_api():
    files = sorted((ROOT / "examples" / "plugins").rglob("*.py"))
    assert files, "no example plugin found"
    bad = {str(p.relative_to(ROOT)): m for p in files for m in _secure_fed_imports(p) if _private(m)}
    assert not bad, f"example plugins importing internal modules: {bad}"


def test_the_scan_sees_an_internal_import(tmp_path):
    src = tmp_path / "x.py"
    src.write_text("def f():\n    from secure_fed.engine.layers import ProtocolLayer\nimport secure_fed.plugin_api\n")
    assert [m for m in _secure_fed_imports(src) if _private(m)] == ["secure_fed.engine.layers"]
