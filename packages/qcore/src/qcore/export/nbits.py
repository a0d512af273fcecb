"""Group-wise weights (:class:`qcore.groupwise.GroupCodes`) as ONNX Runtime's ``com.microsoft.MatMulNBits``.

The contrib op's layout (ONNX Runtime 1.17 and later): ``B`` is uint8 ``[N, K / block, block * bits / 8]``,
each output's codes in input order, two 4-bit codes a byte (first in the low nibble); ``scales`` is
``[N, K / block]`` in the activation type; ``zero_points`` uint8 packed the same way, ``[N, ceil(K / block *
bits / 8)]``; without them the zero point is ``2 ** (bits - 1)``, so symmetric codes are stored shifted by
it. ``block_size`` is the group size (a power of two, at least 16). ``accuracy_level`` 4 lets the CPU
kernel quantize the activations to int8 per block and multiply in integers (the fast path); 0 keeps float
activations.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..graph import open_graph
from ..groupwise import GroupCodes
from ..model_io import ModelFiles, load_model
from .check import FLOAT_TOLERANCE, check_export, check_inputs
from .gather_nbits import BLOCK_DQ_OPSET, replace_tables
from .nbits_layout import FLOAT_ACTIVATIONS, INT8_ACTIVATIONS, MS_DOMAIN, matmul_nbits
from .paddle2onnx_float import float_onnx, require_onnx

__all__ = ["FLOAT_ACTIVATIONS", "INT8_ACTIVATIONS", "MS_DOMAIN", "matmul_nbits", "replace_matmuls", "weight_only_onnx"]

def replace_matmuls(model: Any, codes: dict[str, GroupCodes], input_scales: dict[str, np.ndarray] | None = None,
                    accuracy_level: int = INT8_ACTIVATIONS, runtime: str = "onnxruntime") -> int:
    """Replace, in the ONNX ``model`` (paddle2onnx's float export: weights as initializers or ``Constant`` nodes,
    under their Paddle names), every ``MatMul`` whose weight is named in ``codes`` by ``MatMulNBits``, after a
    ``Mul`` by ``1 / input_scales[name]`` where there is one (AWQ's scales). A weight of ``codes`` that a
    ``Gather`` reads is an embedding table: its lookups and tied head are written in ``runtime``'s form
    (:func:`.gather_nbits.replace_tables`). Returns how many weights were replaced; one
    :class:`~qcore.errors.ExportError` line names a weight of ``codes`` that no MatMul reads."""
    from onnx import helper, numpy_helper

    from ..errors import ExportError

    input_scales = input_scales or {}
    tables = replace_tables(model, codes, runtime, accuracy_level)
    codes = {k: v for k, v in codes.items() if k not in tables}
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    readers: dict[str, int] = {}
    for n in graph.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    nodes = []
    done: set[str] = set()
    for node in graph.node:
        weight = node.input[1] if node.op_type == "MatMul" else None
        if weight not in codes or readers.get(weight, 0) != 1 or weight in done:
            nodes.append(node)
            continue
        a = node.input[0]
        if weight in input_scales:
            scaled = f"{weight}.awq_input"
            inverse = (1.0 / input_scales[weight]).astype(np.float32)
            graph.initializer.append(numpy_helper.from_array(inverse, f"{weight}.awq_inverse"))
            nodes.append(helper.make_node("Mul", [a, f"{weight}.awq_inverse"], [scaled], name=f"{weight}.awq"))
            a = scaled
        packed, new_inits = matmul_nbits(codes[weight], a, node.output[0], f"{weight}.nbits", accuracy_level)
        nodes.append(packed)
        graph.initializer.extend(new_inits)
        done.add(weight)
    missing = sorted(set(codes) - done)
    if missing:
        raise ExportError(f"no MatMul of the ONNX graph reads {missing[0]!r} alone ({len(missing)} weights in all); "
                          "a weight shared by several ops or transposed first stays float")
    kept = [n for n in nodes if not (n.op_type == "Constant" and n.output[0] in done)]
    del graph.node[:]
    graph.node.extend(kept)
    for name in done & set(inits):
        graph.initializer.remove(inits[name])
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return len(done) + len(tables)


def weight_only_onnx(files: ModelFiles, codes: dict[str, GroupCodes], input_scales: dict[str, np.ndarray] | None = None,
                     accuracy_level: int = INT8_ACTIVATIONS, feed: dict[str, np.ndarray] | None = None,
                     runtime: str = "onnxruntime") -> bytes:
    """The ONNX file of the simulated model in ``files`` (its weights the dequantized ``codes``) with every
    quantized matmul as ``MatMulNBits`` at ``accuracy_level`` and every quantized embedding table in
    ``runtime``'s form (:mod:`.gather_nbits`; the OpenVINO form exports opset 21), serialized.

    Checked before it is returned (:mod:`.check`): with float activations (accuracy level 0) the file must
    compute the Paddle model within :data:`~.check.FLOAT_TOLERANCE` on ``feed`` (default: inputs from the
    model's specs), which the encoding of every code, step and zero point decides; the level is set after."""
    require_onnx()
    model = float_onnx(files)
    if runtime == "openvino-runtime" and any(n.op_type == "Gather" and n.input[0] in codes for n in model.graph.node):
        model = float_onnx(files, BLOCK_DQ_OPSET)
    replace_matmuls(model, codes, input_scales, FLOAT_ACTIVATIONS, runtime)
    paddle_model = load_model(files)
    check_export(model.SerializeToString(), paddle_model, feed or check_inputs(open_graph(paddle_model)),
                 FLOAT_TOLERANCE, f"the MatMulNBits export of {files.model_file.name}")
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            next(a for a in node.attribute if a.name == "accuracy_level").i = accuracy_level
    return model.SerializeToString()
