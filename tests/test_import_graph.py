"""The package's import graph, read from the source (every `import`, those inside functions too):
no circle between modules or between rooms (a top-level module or a sub-package), every import
pointing down or sideways in the layer order below, and the gin registry (cli/gin_registry.py)
imported only by the programs. `python tests/test_import_graph.py` prints the rooms' imports."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "samtone_jax"
# The rooms are the package's folders (and the three modules allowed at its root), lowest layer first:
# a room imports rooms of its own layer or of a lower one, never of a higher one (docs/DESIGN.md
# explains each layer). A new folder must be placed here.
ROOT_MODULES = {"__init__", "version", "main"}
LAYERS = (
    {"version", "core"},  # errors, storage (local and gs://), the folders we write, process set-up, log sinks
    {"data"},  # official formats -> collections, tokenisation, the tf.data pipeline, packing
    {"models", "objectives", "compression"},  # towers and sharding; the losses; compressed codes
    {"config", "checkpoints"},  # models and losses from gin text; parameters in and out of checkpoints
    {"tasks"},  # the task catalogue, prompts, seqio registration, mixture batches
    {"inference"},  # a trained model as an encoder of text
    {"evaluation"},  # retrieval evaluation
    {"training"},  # the optimizer, the loop every mode shares, the contrastive mode
    {"hard_negatives"},  # mining, teachers and their scores, ADORE's mode
    {"export", "analysis"},  # what reads a trained model out: export, the embedding-space analysis
    {"cli", "main", "samtone_jax"},  # the programs and the gin registry; the package's public entry
)
# Only these import the gin registry (cli/gin_registry.py): a library module never pulls in every configurable.
PROGRAMS = {"cli", "main"}


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


def _room(module: str) -> str:
    """samtone_jax.data.pipeline -> data; samtone_jax.training.train -> train; samtone_jax -> samtone_jax."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _rooms(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    rooms = {_room(m): set() for m in graph}
    for module, targets in graph.items():
        rooms[_room(module)] |= {_room(t) for t in targets} - {_room(module)}
    return rooms


def _layer_of() -> dict[str, int]:
    return {room: i for i, layer in enumerate(LAYERS) for room in layer}


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """'module -> target' for every import of a room in a higher layer than the importer's."""
    layer = _layer_of()
    return sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets if layer[_room(t)] > layer[_room(m)])


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
    assert "samtone_jax.training.train" in graph["samtone_jax.cli.gin_registry"]  # a top-level import
    assert "samtone_jax.inference.encoder" in graph["samtone_jax.export.folder"]  # one inside a function
    planted = {k: set(v) for k, v in graph.items()}
    planted["samtone_jax.objectives.losses"].add("samtone_jax.training.train")  # train imports losses
    assert any({"samtone_jax.objectives.losses", "samtone_jax.training.train"} <= set(c) for c in _cycles(planted))


def test_the_import_graph_has_no_circle():
    assert _cycles(_graph()) == []


def test_only_the_programs_import_the_gin_registry():
    importers = {_room(m) for m, targets in _graph().items() if "samtone_jax.cli.gin_registry" in targets}
    assert importers <= PROGRAMS, importers - PROGRAMS


def test_the_package_root_holds_only_folders_and_three_modules():
    loose = {p.stem for p in PACKAGE.glob("*.py")}
    assert loose <= ROOT_MODULES, f"move {sorted(loose - ROOT_MODULES)} into the folder of its layer"


def test_the_rooms_have_no_circle():
    assert _cycles(_rooms(_graph())) == []


def test_every_room_has_a_layer():
    assert set(_rooms(_graph())) <= set(_layer_of()), set(_rooms(_graph())) - set(_layer_of())
    assert sum(len(layer) for layer in LAYERS) == len(_layer_of()), "a room is in two layers"


def test_no_import_points_up_the_layers():
    assert _upward(_graph()) == []


def _family_tests(tree: ast.AST, config_names: set[str]) -> list[int]:
    """Lines that test which tower family a value holds: isinstance(x, <a family's config>) or a
    comparison with a config class's name ('BertConfig')."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance" and len(node.args) == 2:
            named = {getattr(n, "id", None) or getattr(n, "attr", None) for n in ast.walk(node.args[1])}
            if named & config_names:
                lines.append(node.lineno)
        if isinstance(node, ast.Compare):
            strings = {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
            if strings & config_names:
                lines.append(node.lineno)
    return lines


def test_no_code_outside_a_family_folder_tests_which_family_it_holds():
    from samtone_jax.models import families

    config_names = {family.gin_name for family in families.FAMILIES}
    family_folders = {PACKAGE / "models" / family.name for family in families.FAMILIES}
    offences = [
        f"{path.relative_to(PACKAGE)}:{line}"
        for path in PACKAGE.rglob("*.py")
        if not any(folder in path.parents for folder in family_folders)
        for line in _family_tests(ast.parse(path.read_text()), config_names)
    ]
    assert offences == [], "ask the family's record (models/families.py: families.of(config)) instead"
    planted = "bert = isinstance(config, BertConfig)\nkind = 'T5Config' if type(c).__name__ == 'BertConfig' else 1"
    assert _family_tests(ast.parse(planted), config_names) == [1, 2]


def test_the_checks_catch_a_planted_upward_import_and_a_room_circle():
    planted = {k: set(v) for k, v in _graph().items()}
    planted["samtone_jax.data.pipeline"].add("samtone_jax.tasks.registration")  # data -> tasks: up
    assert _upward(planted) == ["samtone_jax.data.pipeline -> samtone_jax.tasks.registration"]
    assert any({"data", "tasks"} <= set(c) for c in _cycles(_rooms(planted)))  # tasks imports data


if __name__ == "__main__":  # the rooms' imports, by layer, and any upward import (the closing note's before / after)
    rooms, layer = _rooms(_graph()), _layer_of()

    def order(r):
        return layer.get(r, -1), r

    for room in sorted(rooms, key=order):
        print(f"{layer.get(room, '?')!s:>2} {room:18s} -> {', '.join(sorted(rooms[room], key=order))}")
    print("upward:", *_upward(_graph()) or ["none"], sep="\n  ")
    print("room circles:", _cycles(_rooms(_graph())) or "none")
