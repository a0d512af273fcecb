"""One graph interface over Paddle's two static IRs (PIR and legacy ProgramDesc).

:class:`Graph` (``base.py``) holds the shared logic; ``legacy.py`` and ``pir.py`` implement its
primitives; :class:`Dataflow` (``dataflow.py``) answers producer and reader queries over any graph;
:func:`open_graph`, the one place that knows both backends, picks one.
"""

from ..model_io import Model
from ..optable import OP_TABLE, OpKind, OpSpec, backend_names
from .base import Graph, Operand, OpRef, QuantizedWeight, RowSet
from .dataflow import Dataflow
from .legacy import LegacyGraph
from .pir import PirGraph
from .rewrite import OpQuantization, quantize_op


def open_graph(model: Model) -> Graph:
    """The graph backend for ``model``'s family."""
    return LegacyGraph(model) if model.family == "legacy" else PirGraph(model)


__all__ = [
    "OP_TABLE",
    "Dataflow",
    "Graph",
    "OpQuantization",
    "OpKind",
    "OpRef",
    "OpSpec",
    "Operand",
    "QuantizedWeight",
    "RowSet",
    "backend_names",
    "open_graph",
    "quantize_op",
]
