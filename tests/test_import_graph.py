"""No file-level import circles in secure_fed/, protocols/ and threat_models/.

An AST scan (nothing is imported): every ``import`` statement of every module, at module level or inside a function,
becomes an edge of the module graph; ``from x import y`` points at ``x.y`` when that is a module of the project (a
submodule), else at ``x``; relative imports resolve against the importing module's package. An edge to a package
means its ``__init__``. The test fails with each circle written as a chain ``a -> b -> ... -> a``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("secure_fed", "protocols", "threat_models")


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the scanned packages, by dotted name (a package's name is its ``__init__``)."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _resolve_relative(module: str, is_package: bool, level: int, target: str | None) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, *([target] if target else [])])


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The project module ``name`` is, or the nearest project package above it (None outside the project)."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in modules:
            return ".".join(parts)
        parts.pop()
    return None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``module`` imports (anywhere in its file)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_relative(module, is_package, node.level, node.module) if node.level else node.module
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            owner = _owner(target, modules)
            if owner is not None and owner != module:
                out.add(owner)
    return out


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = project_modules(root)
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def _shortest_circle(graph: dict[str, set[str]], members: set[str], start: str) -> list[str]:
    """Breadth-first from ``start`` inside one strongly connected component, back to ``start``: the chain, closed."""
    parent: dict[str, str] = {}
    frontier, seen = [start], {start}
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    chain = [v]
                    while chain[-1] != start:
                        chain.append(parent[chain[-1]])
                    return [*reversed(chain), start]
                if w not in seen:
                    seen.add(w)
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{start} is on no circle of its component")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles, as closed chains (first module repeated at the end): for each strongly connected component with
    more than one module (Tarjan), shortest circles through its modules until every module is on one printed."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = 0

    def strongconnect(v: str) -> None:  # iterative enough for this graph's depth (a few hundred modules)
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)

    chains = []
    for comp in components:
        members, covered = set(comp), set()
        for start in comp:  # a shortest circle through each module no circle printed so far goes through
            if start not in covered:
                chain = _shortest_circle(graph, members, start)
                covered.update(chain)
                chains.append(chain)
    return chains


def test_the_module_graph_has_no_circle():
    found = cycles(import_graph())
    report = "\n".join(" -> ".join(chain) for chain in found)
    print(report)
    assert not found, f"{len(found)} import circle(s):\n{report}"


def test_the_scan_sees_in_function_submodule_and_relative_imports(tmp_path):
    pkg = tmp_path / "secure_fed"
    (pkg / "sub").mkdir(parents=True)
    for name in ("protocols", "threat_models"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from secure_fed.sub import b\n")  # in a function, a submodule
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from .c import thing\n")  # relative
    (pkg / "sub" / "c.py").write_text("from ..a import f\nthing = 1\n")  # relative, two levels
    graph = import_graph(tmp_path)
    assert graph["secure_fed.a"] == {"secure_fed.sub.b"}
    assert graph["secure_fed.sub.b"] == {"secure_fed.sub.c"}
    assert graph["secure_fed.sub.c"] == {"secure_fed.a"}
    assert cycles(graph) == [["secure_fed.a", "secure_fed.sub.b", "secure_fed.sub.c", "secure_fed.a"]]
