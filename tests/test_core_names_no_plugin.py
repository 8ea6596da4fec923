"""The core names no plugin's config section.

The plugins' config sections (``secure_fed.plugins.registry("config_sections")``: attacks, ckks, keyed_hashing,
privacy, secure_aggregation) belong to the plugins that register them; the core reaches their settings only through
the plugins' hooks. An AST scan of every module of secure_fed/ flags each place that names a section: a string
literal equal to a section's name (``cfg.get("privacy")``, ``cfg["attacks"]``, ``getattr(cfg, "ckks")``, a tuple of
config paths) and an attribute read or write named like a section (``cfg.privacy``, ``x.attacks``), on anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

from secure_fed.plugins import registry

ROOT = Path(__file__).resolve().parents[1]

#: ``(file, literal)`` allowed to spell a section's name, each for its reason; never a config key
ALLOWED: dict[tuple[str, str], str] = {
    # the keys of released records, defined once (PRIVACY_RECORD, ATTACKS_RECORD) and named by constant everywhere else
    ("secure_fed/run_files.py", "privacy"): "the privacy ledger's key in summary.json, metrics lines and exports",
    ("secure_fed/run_files.py", "attacks"): "the audit results' key in private/attacks.json",
    # the entry-point group secure_fed.attacks (attack specs), not the config section
    ("secure_fed/plugins.py", "attacks"): "the plugin groups",
    ("secure_fed/plugin_specs.py", "attacks"): "registry('attacks'): the attack specs' group",
}


def section_names() -> set[str]:
    return set(registry("config_sections"))


def naming_sites(source: str, sections: set[str]) -> list[tuple[int, str]]:
    """``(line, what)`` for each place in ``source`` that names a section."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in sections:
            out.append((node.lineno, repr(node.value)))
        elif isinstance(node, ast.Attribute) and node.attr in sections:
            out.append((node.lineno, f".{node.attr}"))
    return sorted(out)


def test_the_plugins_register_the_sections_this_test_looks_for():
    assert section_names() >= {"attacks", "ckks", "keyed_hashing", "privacy", "secure_aggregation"}


def test_no_core_module_names_a_plugin_config_section():
    sections = section_names()
    found = []
    for path in sorted((ROOT / "secure_fed").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for line, what in naming_sites(path.read_text(), sections):
            if (rel, what.strip("'")) not in ALLOWED:
                found.append(f"{rel}:{line}: {what}")
    print("\n".join(found))
    assert not found, f"{len(found)} place(s) in secure_fed/ name a plugin's config section:\n" + "\n".join(found)


def test_the_scan_sees_keys_getattr_and_attributes():
    src = 'a = cfg.get("privacy")\nb = cfg["attacks"]\nc = getattr(cfg, "ckks", None)\nd = cfg.keyed_hashing.x\ne = "dp"\n'
    names = {"attacks", "ckks", "keyed_hashing", "privacy", "secure_aggregation"}
    assert naming_sites(src, names) == [(1, "'privacy'"), (2, "'attacks'"), (3, "'ckks'"), (4, ".keyed_hashing")]
