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


def _reads(node: Any) -> set[str]:
    """The tensors ``node`` reads, with those its subgraphs (``If`` / ``Loop`` bodies) read from outside."""
    names = set(node.input)
    for attribute in node.attribute:
        bodies = [*attribute.graphs, *([attribute.g] if attribute.HasField("g") else [])]
        for inner in (n for body in bodies for n in body.node):
            names |= _reads(inner)
    return names


def prune(model: Any) -> None:
    """Remove the nodes nothing reads any more (the sequences a rewrite replaced, the constants a rewrite folded
    elsewhere) and the initializers no node reads."""
    graph = model.graph
    outputs = {o.name for o in graph.output}
    while True:
        read = outputs.union(*(_reads(n) for n in graph.node))
        dead = [n for n in graph.node if not any(o in read for o in n.output)]
        if not dead:
            break
        for n in dead:
            graph.node.remove(n)
    read = outputs.union(*(_reads(n) for n in graph.node))
    for init in [i for i in graph.initializer if i.name not in read]:
        graph.initializer.remove(init)
