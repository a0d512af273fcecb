"""qcore's layers import downwards only: verify -> scoring -> inference -> deploy -> graph -> model_io.

Read off the source with ``ast``, so an import inside a function or under ``TYPE_CHECKING`` counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import qcore

ROOT = Path(qcore.__file__).parent
#: Top to bottom: a module may import the layers below its own, never one above.
LAYERS = ("qcore.verify", "qcore.scoring", "qcore.inference", "qcore.deploy", "qcore.graph", "qcore.model_io")
#: What runs and scores models: no qcore module outside the layers imports these.
RUNNERS = LAYERS[:3]


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    path = ROOT.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(path: Path) -> set[str]:
    """The qcore modules ``path`` imports (``from pkg import submodule`` names the submodule)."""
    module = _module(path)
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
            submodules = {f"{source}.{alias.name}" for alias in node.names if _is_module(f"{source}.{alias.name}")}
            found |= submodules if len(submodules) == len(node.names) else {*submodules, source}
    return {name for name in found if name == "qcore" or name.startswith("qcore.")}


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
