"""The package's import graph has no loop: every import of one of its modules by another, at the top of a file or
inside a function (a deferred import still runs, and a loop through it breaks whichever module a process happens to
import first), is an edge; imports for annotations only (under `if TYPE_CHECKING:`) are not. Read from the source,
so no module is imported here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lit_transformer"


def module_names() -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name, for its __init__.py)."""
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _absolute(node: ast.ImportFrom, name: str, path: Path) -> str:
    """The module a `from ... import` names, relative levels resolved against module `name`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    if not node.level:
        return node.module or ""
    anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{anchor}.{node.module}" if node.module else anchor


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that module `name` imports, wherever in the file, outside `if TYPE_CHECKING:`."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, name, path)
            for alias in node.names:  # `from package import module` imports the module
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return {target for target in found if target in modules and target != name}


def import_graph() -> dict[str, set[str]]:
    modules = module_names()
    return {name: imported(name, path, modules) for name, path in modules.items()}


def find_loop(graph: dict[str, set[str]]) -> list[str] | None:
    """A loop of imports (its modules in order, the first again at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (loop := walk(target)):
                return loop
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (loop := walk(node)):
            return loop
    return None


def test_the_package_has_no_import_loop():
    graph = import_graph()
    assert len(graph) > 40 and "lit_transformer.model.generation" in graph["lit_transformer.model.transformer"]
    loop = find_loop(graph)
    assert loop is None, "import loop: " + " -> ".join(loop)


@pytest.mark.parametrize(
    ("source", "target"),
    [
        ("lit_transformer.model.generation", "lit_transformer.transforms.int8"),  # decoding: a hook on the layer
        ("lit_transformer.transforms.int8", "lit_transformer.model"),  # quantization: annotations only
    ],
)
def test_modules_that_must_not_import_each_other(source, target):
    assert target not in import_graph()[source]


def room(module: str) -> str:
    """The room a module belongs to: its sub-package (data, tasks, model, interop), else the module itself (each of
    the engine's top-level modules: module, cli, checkpointing, ...)."""
    parts = module.split(".")
    return ".".join(parts[:2])


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between rooms: a loop here is a loop between layers, even where no two modules loop."""
    rooms: dict[str, set[str]] = {}
    for source, targets in graph.items():
        rooms.setdefault(room(source), set()).update(room(t) for t in targets if room(t) != room(source))
    return rooms


def test_no_two_rooms_import_each_other():
    """data -> tasks -> data through function-local imports was such a loop: every import counts, wherever it is."""
    loop = find_loop(room_graph(import_graph()))
    assert loop is None, "import loop between rooms: " + " -> ".join(loop)


# What the data layer may import outside itself: the plain model config, the user-error types and the safe reading of
# a checkpoint (a tokenizer may come from a .ckpt). Never the tasks, the engine or interop: what they need of the data they hand it.
DATA_MAY_IMPORT = {"lit_transformer.config", "lit_transformer.errors", "lit_transformer.checkpoints.files"}


def test_the_data_layer_imports_nothing_above_it():
    graph = import_graph()
    above = {
        f"{source} -> {target}"
        for source, targets in graph.items()
        if room(source) == "lit_transformer.data"
        for target in targets
        if room(target) != "lit_transformer.data" and target not in DATA_MAY_IMPORT
    }
    assert not above, sorted(above)


def test_a_loop_between_rooms_is_found_where_no_two_modules_loop():
    """The checker itself: a.x -> b.y -> a.z has no module loop, but rooms a and b import each other."""
    graph = {"p.a.x": {"p.b.y"}, "p.b.y": {"p.a.z"}, "p.a.z": set()}
    assert find_loop(graph) is None
    assert find_loop(room_graph(graph)) == ["p.a", "p.b", "p.a"]


def test_a_loop_is_found_through_a_deferred_import_and_not_through_annotations(tmp_path):
    """The checker itself: a loop closed by an import inside a function is one; an import for annotations is not."""
    graph = {"a": {"b"}, "b": {"c"}, "c": set()}
    assert find_loop(graph) is None
    source = (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\ndef f():\n    from pkg import b\n"
    )
    (tmp_path / "pkg").mkdir()
    path = tmp_path / "pkg" / "c.py"
    path.write_text(source)
    modules = {"pkg.a": tmp_path / "pkg" / "a.py", "pkg.b": tmp_path / "pkg" / "b.py", "pkg.c": path}
    graph["c"] = {m.rpartition(".")[2] for m in imported("pkg.c", path, modules)}
    assert graph["c"] == {"b"} and find_loop(graph) == ["b", "c", "b"]


def test_no_module_imports_a_private_name_of_another():
    """A name with a leading underscore is its file's own: another module that needs it needs a public name."""
    modules = module_names()
    private = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and _absolute(node, name, path) in modules:
                base = _absolute(node, name, path)
                private += [f"{name}: {base}.{a.name}" for a in node.names if a.name.startswith("_")]
    assert not private, private


def test_the_top_level_reads_as_a_table_of_contents():
    """At most 8 modules beside the folders; a module's folder and name say what it is for, so no two modules share a
    name, but for the parallel rooms (a task's file in tasks/ and in data/) and each folder's base.py."""
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 8, top
    parallel = {p.stem for p in (PACKAGE / "tasks").glob("*.py")} & {p.stem for p in (PACKAGE / "data").glob("*.py")}
    seen: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.stem not in ("__init__", "__main__", "base") and path.stem not in parallel:
            seen.setdefault(path.stem, []).append(str(path.relative_to(PACKAGE)))
    assert not {name: paths for name, paths in seen.items() if len(paths) > 1}


def test_every_moved_module_path_resolves_to_its_new_homes():
    """Each module path of the flat layout (lit_transformer.moved.MOVED) imports, and the names configs and
    checkpoints of that layout name resolve to today's classes."""
    import importlib

    from lit_transformer.engine.monitoring import LearningRateLogger
    from lit_transformer.moved import MOVED

    for old, homes in MOVED.items():
        assert not (PACKAGE.parent / (old.replace(".", "/") + ".py")).exists(), (
            f"{old} exists again: drop it from MOVED"
        )
        module = importlib.import_module(old)
        assert set(dir(module)) >= set(dir(importlib.import_module(homes[0]))) - {"__builtins__"}
    assert importlib.import_module("lit_transformer.callbacks").LearningRateLogger is LearningRateLogger
    assert (
        importlib.import_module("lit_transformer.data").LanguageModelingDataModule.__name__
        == "LanguageModelingDataModule"
    )
