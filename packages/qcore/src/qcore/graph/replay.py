"""Run one weighted op of a graph eagerly, on arrays: ``y = op(x, w)`` with the op's own attributes.

Layer-wise methods need a layer's output for inputs and weights other than the graph's: the
threshold choice by layer output error (``algo="auto"``) and AdaRound's rounding optimisation,
which also needs gradients. One handler per backend op type turns the op's attributes into a
``paddle.nn.functional`` call; ops without a handler are simply not replayable
(:func:`replayable`). Works under dygraph; inputs and weights are paddle tensors.
:meth:`LayerReplay.array` is the forward-only form on numpy arrays: matmul kinds run on numpy's BLAS
(:data:`ARRAY_HANDLERS`; Paddle 3.3.1's eager CPU matmul measured 3.5 to 6x slower on 1024 x 384 @ 384 x 1536).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import paddle
import paddle.nn.functional as F

from ..errors import GraphError
from .base import Graph, OpRef

Handler = Callable[[paddle.Tensor, paddle.Tensor, dict[str, Any]], paddle.Tensor]
ArrayHandler = Callable[[np.ndarray, np.ndarray, dict[str, Any]], np.ndarray]


def _padding(attrs: dict[str, Any]) -> Any:
    algorithm = str(attrs.get("padding_algorithm", "EXPLICIT")).upper()
    return algorithm if algorithm in ("SAME", "VALID") else list(attrs.get("paddings", [0, 0]))


def _conv(x: paddle.Tensor, w: paddle.Tensor, a: dict[str, Any]) -> paddle.Tensor:
    return F.conv2d(x, w, stride=list(a.get("strides", [1, 1])), padding=_padding(a),
                    dilation=list(a.get("dilations", [1, 1])), groups=int(a.get("groups", 1)),
                    data_format=str(a.get("data_format", "NCHW")))


def _conv_transpose(x: paddle.Tensor, w: paddle.Tensor, a: dict[str, Any]) -> paddle.Tensor:
    output_size = list(a.get("output_size", []))
    return F.conv2d_transpose(x, w, stride=list(a.get("strides", [1, 1])), padding=_padding(a),
                              output_padding=list(a.get("output_padding", [])) or 0,
                              dilation=list(a.get("dilations", [1, 1])), groups=int(a.get("groups", 1)),
                              output_size=output_size or None, data_format=str(a.get("data_format", "NCHW")))


def _mul(x: paddle.Tensor, w: paddle.Tensor, a: dict[str, Any]) -> paddle.Tensor:
    """Legacy ``mul``: ``x`` flattened to 2-D at ``x_num_col_dims``, the leading shape kept."""
    lead = list(x.shape[: int(a.get("x_num_col_dims", 1))])
    rows = 1
    for n in lead:
        rows *= int(n)
    return paddle.matmul(x.reshape([rows, -1]), w).reshape([*lead, w.shape[-1]])


def _matmul(transpose_x: str, transpose_y: str, alpha: str | None = None) -> Handler:
    def run(x: paddle.Tensor, w: paddle.Tensor, a: dict[str, Any]) -> paddle.Tensor:
        y = paddle.matmul(x, w, transpose_x=bool(a.get(transpose_x, False)),
                          transpose_y=bool(a.get(transpose_y, False)))
        return y * float(a[alpha]) if alpha is not None and float(a.get(alpha, 1.0)) != 1.0 else y

    return run


def _mul_array(x: np.ndarray, w: np.ndarray, a: dict[str, Any]) -> np.ndarray:
    lead = x.shape[: int(a.get("x_num_col_dims", 1))]
    return (x.reshape(int(np.prod(lead)), -1) @ w).reshape(*lead, w.shape[-1])


def _matmul_array(transpose_x: str, transpose_y: str, alpha: str | None = None) -> ArrayHandler:
    def run(x: np.ndarray, w: np.ndarray, a: dict[str, Any]) -> np.ndarray:
        x = np.swapaxes(x, -1, -2) if a.get(transpose_x, False) else x
        w = np.swapaxes(w, -1, -2) if a.get(transpose_y, False) else w
        y = np.matmul(x, w)
        return y * np.float32(a[alpha]) if alpha is not None and float(a.get(alpha, 1.0)) != 1.0 else y

    return run


#: Backend op type -> eager form (both IRs' names).
HANDLERS: dict[str, Handler] = {
    "conv2d": _conv,
    "depthwise_conv2d": _conv,
    "pd_op.conv2d": _conv,
    "pd_op.depthwise_conv2d": _conv,
    "conv2d_transpose": _conv_transpose,
    "pd_op.conv2d_transpose": _conv_transpose,
    "mul": _mul,
    "matmul": _matmul("transpose_X", "transpose_Y", "alpha"),
    "matmul_v2": _matmul("trans_x", "trans_y"),
    "pd_op.matmul": _matmul("transpose_x", "transpose_y"),
}


#: Backend op type -> forward-only form on numpy arrays (the others run :data:`HANDLERS` on converted arrays).
ARRAY_HANDLERS: dict[str, ArrayHandler] = {
    "mul": _mul_array,
    "matmul": _matmul_array("transpose_X", "transpose_Y", "alpha"),
    "matmul_v2": _matmul_array("trans_x", "trans_y"),
    "pd_op.matmul": _matmul_array("transpose_x", "transpose_y"),
}


def replayable(graph: Graph, op: OpRef) -> bool:
    """Whether ``op`` has an eager form and a parameter weight (so ``y = op(x, w)`` is defined)."""
    return op.type in HANDLERS and graph.weight_operand(op) is not None and len(graph.activation_operands(op)) == 1


class LayerReplay:
    """``op(x, w)`` for one op of ``graph``, its attributes read once."""

    def __init__(self, graph: Graph, op: OpRef) -> None:
        if not replayable(graph, op):
            raise GraphError(f"{op!r} cannot be replayed eagerly (no handler, no parameter weight, or two inputs)")
        self.handler = HANDLERS[op.type]
        self.array_handler = ARRAY_HANDLERS.get(op.type)
        self.attrs = graph.attrs(op)

    def __call__(self, x: paddle.Tensor, w: paddle.Tensor) -> paddle.Tensor:
        return self.handler(x, w, self.attrs)

    def array(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        """``op(x, w)`` on float32 arrays, forward only (call under dygraph for ops without an array form)."""
        if self.array_handler is not None:
            return self.array_handler(x, w, self.attrs)
        return self.handler(paddle.to_tensor(x), paddle.to_tensor(w), self.attrs).numpy()
