"""Who writes and who reads each tensor of an ONNX graph: the index every rewrite of the export walks by."""

from __future__ import annotations

from typing import Any


def producers(graph: Any) -> dict[str, Any]:
    """Tensor name -> the node writing it."""
    return {out: node for node in graph.node for out in node.output}


def readers(graph: Any) -> dict[str, list[Any]]:
    """Tensor name -> the nodes reading it, in graph order."""
    found: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            found.setdefault(name, []).append(node)
    return found
