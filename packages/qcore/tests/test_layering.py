"""Imports point one way. qcore's layers import downwards only (verify -> scoring -> inference -> deploy -> graph
-> model_io), and no module of any package imports, directly or through others, a module that imports it back.

Read off the source with ``ast``, so an import inside a function or under ``TYPE_CHECKING`` counts too: a lazy or
type-only import that closes a circle still ties the two modules together (neither can be read, moved or tested
without the other), it only hides the circle from the interpreter.
"""

from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

import pytest

import qcore

ROOT = Path(qcore.__file__).parent
#: Every package's source tree in this repository (``packages/<name>/src/<name>``), read as files: the test needs
#: none of the other packages installed.
SOURCES = sorted(init.parent for init in Path(__file__).resolve().parents[2].glob("*/src/*/__init__.py"))
#: Top to bottom: a module may import the layers below its own, never one above.
LAYERS = ("qcore.verify", "qcore.scoring", "qcore.inference", "qcore.deploy", "qcore.graph", "qcore.model_io")
#: What runs and scores models: no qcore module outside the layers imports these.
RUNNERS = LAYERS[:3]


def _module(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str, root: Path = ROOT) -> bool:
    path = root.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(path: Path, root: Path = ROOT) -> set[str]:
    """The modules of ``root``'s package that ``path`` imports (``from pkg import submodule`` names the submodule)."""
    module = _module(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            submodules = {f"{source}.{alias.name}" for alias in node.names
                          if _is_module(f"{source}.{alias.name}", root)}
            found |= submodules if len(submodules) == len(node.names) else {*submodules, source}
    return {name for name in found if name == root.name or name.startswith(root.name + ".")}


def _layer(module: str) -> int | None:
    return next((i for i, top in enumerate(LAYERS) if module == top or module.startswith(top + ".")), None)


def test_no_layer_imports_one_above_it():
    back = []
    for path in sorted(ROOT.rglob("*.py")):
        module = _module(path)
        own = _layer(module)
        for imported in sorted(_imports(path)):
            other = _layer(imported)
            if other is not None and other < (len(RUNNERS) if own is None else own):
                back.append(f"{module} -> {imported}")
    assert back == []


def test_the_layers_exist():
    assert all(_is_module(name) for name in LAYERS)


def import_graph(root: Path) -> dict[str, set[str]]:
    """``{module: the modules of the same package it imports}`` for every module under ``root``."""
    return {_module(path, root): _imports(path, root) - {_module(path, root)} for path in sorted(root.rglob("*.py"))}


def circles(graph: dict[str, set[str]]) -> list[tuple[list[str], list[str]]]:
    """Every group of modules that import each other (a strongly connected component) as ``(circle, members)``:
    the shortest path ``[a, b, ..., a]`` through the group's first module by name, and the group's modules
    sorted. Empty when the imports form no circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = {stack.pop()}
            while node not in group:
                group.add(stack.pop())
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted((_shortest_circle(graph, group), sorted(group)) for group in groups)


def _shortest_circle(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """The shortest path from ``group``'s first module back to itself (breadth first, inside the group)."""
    start = min(group)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in sorted(graph.get(node, set()) & group):
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if nxt not in came_from:
                came_from[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"{sorted(group)} is not a circle")


@pytest.mark.parametrize("root", SOURCES, ids=[root.name for root in SOURCES])
def test_no_module_imports_itself_back_through_others(root):
    found = circles(import_graph(root))
    assert not found, "import circles: " + "; ".join(
        f"{' -> '.join(circle)} (modules in this circle: {', '.join(members)})" for circle, members in found)


def test_every_package_is_read():
    assert [root.name for root in SOURCES] == ["qcli", "qcore", "qdemo", "qembed", "qptq", "qqat"]


def test_a_circle_is_named_module_by_module():
    graph = {"p.a": {"p.b", "p.d"}, "p.b": {"p.c"}, "p.c": {"p.a", "p.d"}, "p.d": {"p.e"}, "p.e": {"p.d"},
             "p.f": {"p.a"}}
    assert circles(graph) == [(["p.a", "p.b", "p.c", "p.a"], ["p.a", "p.b", "p.c"]),
                              (["p.d", "p.e", "p.d"], ["p.d", "p.e"])]
    graph["p.e"] = set()
    assert circles(graph) == [(["p.a", "p.b", "p.c", "p.a"], ["p.a", "p.b", "p.c"])]
