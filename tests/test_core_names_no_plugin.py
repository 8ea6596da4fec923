"""The core names no plugin's config section.

The plugins' config sections (``secure_fed.plugins.registry("config_sections")``: attacks, ckks, keyed_hashing,
privacy, secure_aggregation) belong to the plugins that register them; the core reaches their settings only through
the plugins' hooks. An AST scan of every module of secure_fed/ flags each place that names a section: a string
literal equal to a section's name (``cfg.get("privacy")``, ``cfg["attacks"]``, ``getattr(cfg, "ckks")``, a tuple of
config paths) and an attribute read or write named like a section (``cfg.privacy``, ``x.attacks``), on anything.
"""

from __future__ import annotations

import ast
import re
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


# ---------------------------------------------------------------- attacks: nothing outside an attack's modules names it

#: the product's packages scanned for attack names
PRODUCT = ("secure_fed", "protocols", "threat_models")

#: ``(file, attack)`` allowed to name an attack outside its modules, each for its reason
ATTACK_ALLOWED: dict[tuple[str, str], str] = {
    ("threat_models/self_test.py", "one_run_audit"): "the self-test of the one-run audit: its recipe is a config listing "
    "that attack (a user of it, as a config in experiments/ is)",
}


def attack_owners() -> dict[str, set[str]]:
    """Attack → the files of its own modules: its spec's module (its entry point in ``pyproject.toml``) and its
    implementation (the spec's ``implementation``). Read from ``pyproject.toml``, the registration the commit holds
    (an older install's metadata may still point at the compatibility module ``threat_models.attack_specs``)."""
    import tomllib

    from secure_fed.plugins import load_object

    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["secure_fed.attacks"]
    owners = {}
    for name, value in eps.items():
        modules = {value.partition(":")[0], load_object(value).implementation.partition(":")[0]}
        owners[name] = {m.replace(".", "/") + ".py" for m in modules}
    return owners


def _docstrings(tree: ast.AST) -> set[int]:
    """``id`` of each docstring node (prose that documents, e.g. a cross-reference to an attack's module)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                out.add(id(first.value))
    return out


def attack_naming_sites(source: str, names: set[str]) -> list[tuple[int, str, str]]:
    """``(line, attack, what)`` for each place in ``source`` that names an attack: a string (not a docstring) holding
    its name as a word (``"one_run_audit"``, ``f"attacks.one_run_audit.canaries"``), an identifier or attribute named
    as it (``cfg.attacks.one_run_audit``), its spec's constant (``ONE_RUN_AUDIT``), or an import of its modules
    (``threat_models.attacks.one_run_audit``, ``…_spec``)."""
    import re

    tree = ast.parse(source)
    docs = _docstrings(tree)
    words = {n: re.compile(rf"(?<![A-Za-z0-9_]){re.escape(n)}(?![A-Za-z0-9_])") for n in names}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            out += [(node.lineno, n, repr(node.value)[:60]) for n, w in words.items() if w.search(node.value)]
        elif isinstance(node, ast.Name | ast.Attribute):
            ident = node.id if isinstance(node, ast.Name) else node.attr
            out += [(node.lineno, n, ident) for n in names if ident in (n, n.upper())]
        elif isinstance(node, ast.Import | ast.ImportFrom):
            paths = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            paths += [f"{node.module}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom) and node.module else []
            for path in paths:
                parts = set(path.split("."))
                out += [(node.lineno, n, path) for n in names if parts & {n, f"{n}_spec", n.upper()}]
    return sorted(set(out))


def test_the_scan_sees_an_attacks_names_strings_and_imports_but_not_its_docstrings():
    src = (
        '"""Module docs may cite ``one_run_audit``."""\n'
        'a = cfg.attacks.one_run_audit.canaries\nb = "attacks.run=[x,one_run_audit]"\n'
        "from threat_models.attacks.one_run_audit_spec import SPEC\nfrom threat_models.attack_specs import ONE_RUN_AUDIT\n"
        'c = "one_run_audits"\n'
        "def f():\n"
        '    """one_run_audit in a docstring"""\n'
    )
    sites = attack_naming_sites(src, {"one_run_audit"})
    assert sorted({line for line, _, _ in sites}) == [2, 3, 4, 5], sites


def test_no_product_module_names_an_attack_outside_its_own_modules():
    """Each attack's name is written in its own modules only (spec and implementation); the core, the audit harness,
    the recording, the config section and the other attacks reach it through its spec (docstrings excepted)."""
    owners = attack_owners()
    assert set(owners) >= {"membership_inference", "one_run_audit", "canary_client_audit", "gradient_inversion"}
    found = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for line, name, what in attack_naming_sites(path.read_text(), set(owners)):
                if rel not in owners[name] and (rel, name) not in ATTACK_ALLOWED:
                    found.append(f"{rel}:{line}: {name} ({what})")
    print("\n".join(found))
    assert not found, f"{len(found)} place(s) name an attack outside its own modules:\n" + "\n".join(found)


#: the example algorithm plugins (examples/plugins/) and what is theirs alone: the core reaches them only through
#: the client objective's hooks and the algorithm's public methods (:mod:`secure_fed.plugin_api`)
PLUGIN_ALGORITHM_WORDS = re.compile(r"\b(fedprox|scaffold|moon)\b|control[ _-]?variates?", re.IGNORECASE)
#: identifiers (names, attributes, arguments, keywords, string keys) the core must not use: the plugins' settings
PLUGIN_IDENTIFIERS = {"mu", "fedprox", "scaffold", "moon", "control", "control_variate", "control_variates", "c_i"}


def plugin_algorithm_sites(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` for each place in ``source`` that names a plugin algorithm or its settings: the words anywhere
    in the text (code, strings, docstrings, comments), and the identifiers of :data:`PLUGIN_IDENTIFIERS`."""
    out = [(source.count("\n", 0, m.start()) + 1, m.group(0)) for m in PLUGIN_ALGORITHM_WORDS.finditer(source)]
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.arg):
            names = [node.arg]
        elif isinstance(node, ast.keyword) and node.arg:
            names = [node.arg]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value]
        out += [(node.lineno, repr(n)) for n in names if n.lower() in PLUGIN_IDENTIFIERS]
    return sorted(out)


def test_no_core_module_names_a_plugin_algorithm():
    found = []
    for path in sorted((ROOT / "secure_fed").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        found += [f"{rel}:{line}: {what}" for line, what in plugin_algorithm_sites(path.read_text())]
    assert not found, f"{len(found)} place(s) in secure_fed/ name a plugin algorithm:\n" + "\n".join(found)


def test_the_algorithm_scan_sees_words_identifiers_and_keys():
    src = '"""FedProx."""\nx = cfg.mu\n# SCAFFOLD\ndef f(mu): pass\ng(c_i=1)\nd["moon"]\ny = "control variates"\n'
    assert [line for line, _ in plugin_algorithm_sites(src)] == [1, 2, 3, 4, 5, 6, 6, 7]


def test_the_example_plugins_import_secure_fed_through_the_public_api_only():
    """Each of the objective plugins imports from ``secure_fed`` only :mod:`secure_fed.plugin_api`."""
    for package in ("fedprox", "scaffold", "moon"):
        files = sorted((ROOT / "examples" / "plugins" / package / package).glob("*.py"))
        assert files
        for path in files:
            for node in ast.walk(ast.parse(path.read_text())):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                mods += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
                for mod in mods:
                    assert not mod.startswith("secure_fed") or mod == "secure_fed.plugin_api", f"{path}: imports {mod}"
