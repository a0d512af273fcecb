"""Who writes and who reads each tensor of a graph: the producer and reader queries rules need.

A :class:`Dataflow` reads a :class:`~qcore.graph.Graph` once, in either IR, through the graph's own
per-op queries (:meth:`Graph.input_names`, :meth:`Graph.output_names`), so its answers name tensors as
:attr:`Operand.name` does. It is a snapshot: build a new one after editing the graph.
"""

from __future__ import annotations

from .base import Graph, OpRef


class Dataflow:
    """The producer and readers of every tensor of ``graph``, in program order."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.ops = graph.ops()
        self.params = frozenset(graph.param_names())
        self._producer = {name: op for op in self.ops for name in graph.output_names(op)}
        self._readers: dict[str, list[OpRef]] = {}
        for op in self.ops:
            for name in graph.input_names(op):
                self._readers.setdefault(name, []).append(op)

    def producer(self, name: str) -> OpRef | None:
        """The op that writes tensor ``name`` (the last one, if several do), or None (a feed, a parameter)."""
        return self._producer.get(name)

    def readers(self, name: str) -> list[OpRef]:
        """The ops that read tensor ``name``, once per read (an op reading it twice is listed twice)."""
        return self._readers.get(name, [])

    def input(self, op: OpRef, slot: str) -> str:
        """The (first) tensor ``op`` reads in input ``slot``."""
        return self.graph.input_names(op, slot)[0]

    def output(self, op: OpRef, slot: str) -> str:
        """The (first) tensor ``op`` writes in output ``slot``."""
        return self.graph.output_names(op, slot)[0]

    def reads_param(self, op: OpRef, slot: str | None = None) -> bool:
        """``op`` reads a parameter (in input ``slot``, or in any)."""
        return not self.params.isdisjoint(self.graph.input_names(op, slot))

    def reaches(self, source: str, target: str) -> bool:
        """Tensor ``target`` is ``source`` or is computed from it."""
        seen, todo = set(), [source]
        while todo:
            name = todo.pop()
            if name == target:
                return True
            for op in self.readers(name):
                outputs = self.graph.output_names(op)
                todo.extend(out for out in outputs if out not in seen)
                seen.update(outputs)
        return False
