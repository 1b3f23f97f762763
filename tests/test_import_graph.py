"""The package's import graph, read from the source (every `import`, those inside functions too):
no circle, and the gin registry (configurables.py) imported only by the programs."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "samtone_jax"
PROGRAMS = {"samtone_jax.cli", "samtone_jax.commands", "samtone_jax.demo", "samtone_jax.main"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()

    def owner(name: str) -> str | None:  # the module a dotted name lives in
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {m: set() for m in modules}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names]
            for name in targets:
                if name.startswith("samtone_jax"):
                    target = owner(name)
                    if target and target != module:
                        graph[module].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_reader_sees_every_import_and_finds_a_planted_circle():
    graph = _graph()
    assert "samtone_jax.train" in graph["samtone_jax.configurables"]  # a top-level import
    assert "samtone_jax.inference" in graph["samtone_jax.export"]  # one inside a function
    planted = {k: set(v) for k, v in graph.items()}
    planted["samtone_jax.losses"].add("samtone_jax.train")  # train imports losses (through gin_utils)
    assert any({"samtone_jax.losses", "samtone_jax.train"} <= set(c) for c in _cycles(planted))


def test_the_import_graph_has_no_circle():
    assert _cycles(_graph()) == []


def test_only_the_programs_import_the_gin_registry():
    importers = {m for m, targets in _graph().items() if "samtone_jax.configurables" in targets}
    assert importers <= PROGRAMS, importers - PROGRAMS
