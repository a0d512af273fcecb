"""One graph interface over Paddle's two static IRs (PIR and legacy ProgramDesc)."""

from .base import Graph, Operand, OpRef, QuantizedWeight, open_graph
from .optable import OP_TABLE, OpSpec, backend_names
from .rewrite import OpQuantization, quantize_op

__all__ = [
    "OP_TABLE",
    "Graph",
    "OpQuantization",
    "OpRef",
    "OpSpec",
    "Operand",
    "QuantizedWeight",
    "backend_names",
    "open_graph",
    "quantize_op",
]
