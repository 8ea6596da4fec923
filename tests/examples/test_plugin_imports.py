"""The example plugins reach secure-fed only through its public plugin API (``secure_fed.plugin_api`` and its
``.layers`` / ``.attacks`` modules): they are what a third-party package copies. (They are not import-linter root
packages, so this test reads their imports.)"""

from __future__ import annotations

import ast
from pathlib import Path

PLUGINS = Path(__file__).resolve().parents[2] / "examples" / "plugins"
PUBLIC = ("secure_fed.plugin_api",)


def _secure_fed_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m == "secure_fed" or m.startswith("secure_fed.")}


def test_the_example_plugins_import_secure_fed_only_through_the_plugin_api():
    files = sorted(PLUGINS.rglob("*.py"))
    assert len(files) >= 10  # every example package's modules are read
    outside = {
        (str(f.relative_to(PLUGINS)), m)
        for f in files
        for m in _secure_fed_imports(f)
        if not any(m == p or m.startswith(p + ".") for p in PUBLIC)
    }
    assert not outside, sorted(outside)
