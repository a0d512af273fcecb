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

from ..errors import ConfigError
from ..graph import open_graph
from ..groupwise import GroupCodes
from ..model_io import ModelFiles, load_model
from ..packing import pack_codes
from .check import FLOAT_TOLERANCE, check_export, check_inputs
from .paddle2onnx_float import float_onnx, require_onnx

#: ``accuracy_level`` values: int8 activations per block (fast), float activations (exact to the codes).
INT8_ACTIVATIONS, FLOAT_ACTIVATIONS = 4, 0
MS_DOMAIN = "com.microsoft"


def _packed(codes: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned codes along the last axis as bytes: two to a byte for 4 bits, one for 8."""
    if bits == 8:
        return codes.astype(np.uint8)
    return pack_codes(codes.astype(np.int16), bits).view(np.uint8)


def matmul_nbits(
    q: GroupCodes, a: str, y: str, name: str, accuracy_level: int = INT8_ACTIVATIONS
) -> tuple[Any, list[Any]]:
    """The ``MatMulNBits`` node computing ``y = a @ dequantize(q)`` and its initializers (named after ``name``)."""
    from onnx import helper, numpy_helper

    k, n = q.codes.shape
    block = q.group_size
    if block == k:  # one group per output: the next power-of-two block, its tail padded with zero-valued codes
        block = max(16, 1 << (k - 1).bit_length())
    if block < 16 or block & (block - 1):
        raise ConfigError(f"group_size={block} cannot be a MatMulNBits block; use a power of two >= 16 (32, 64, 128)")
    blocks = -(-k // block)
    zero = np.full((1, n), 2 ** (q.bits - 1)) if q.zero_points is None else q.zero_points[:1].astype(np.int16)
    codes = q.codes.astype(np.int16) + (2 ** (q.bits - 1) if q.zero_points is None else 0)
    codes = np.concatenate([codes, np.repeat(zero, blocks * block - k, axis=0)])  # the padding reads as 0
    b = _packed(codes.T.reshape(n, blocks, block), q.bits)  # [N, blocks, block * bits / 8]
    inits = [numpy_helper.from_array(b, f"{name}.B"),
             numpy_helper.from_array(np.ascontiguousarray(q.scales.T, np.float32), f"{name}.scales")]
    inputs = [a, f"{name}.B", f"{name}.scales"]
    if q.zero_points is not None:
        inits.append(numpy_helper.from_array(_packed(q.zero_points.T, q.bits), f"{name}.zero_points"))
        inputs.append(f"{name}.zero_points")
    node = helper.make_node("MatMulNBits", inputs, [y], name=name, domain=MS_DOMAIN, K=k, N=n, bits=q.bits,
                            block_size=block, accuracy_level=accuracy_level)
    return node, inits


def replace_matmuls(model: Any, codes: dict[str, GroupCodes], input_scales: dict[str, np.ndarray] | None = None,
                    accuracy_level: int = INT8_ACTIVATIONS) -> int:
    """Replace, in the ONNX ``model`` (paddle2onnx's float export: weights as initializers or ``Constant`` nodes,
    under their Paddle names), every ``MatMul`` whose weight is named in ``codes`` by ``MatMulNBits``, after a
    ``Mul`` by ``1 / input_scales[name]`` where there is one (AWQ's scales). Returns how many were replaced;
    one :class:`~qcore.errors.ExportError` line names a weight of ``codes`` that no MatMul reads."""
    from onnx import helper, numpy_helper

    from ..errors import ExportError

    input_scales = input_scales or {}
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
    return len(done)


def weight_only_onnx(files: ModelFiles, codes: dict[str, GroupCodes], input_scales: dict[str, np.ndarray] | None = None,
                     accuracy_level: int = INT8_ACTIVATIONS, feed: dict[str, np.ndarray] | None = None) -> bytes:
    """The ONNX file of the simulated model in ``files`` (its weights the dequantized ``codes``) with every
    quantized matmul as ``MatMulNBits`` at ``accuracy_level``, serialized.

    Checked before it is returned (:mod:`.check`): with float activations (accuracy level 0) the file must
    compute the Paddle model within :data:`~.check.FLOAT_TOLERANCE` on ``feed`` (default: inputs from the
    model's specs), which the encoding of every code, step and zero point decides; the level is set after."""
    require_onnx()
    model = float_onnx(files)
    replace_matmuls(model, codes, input_scales, FLOAT_ACTIVATIONS)
    paddle_model = load_model(files)
    check_export(model.SerializeToString(), paddle_model, feed or check_inputs(open_graph(paddle_model)),
                 FLOAT_TOLERANCE, f"the MatMulNBits export of {files.model_file.name}")
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            next(a for a in node.attribute if a.name == "accuracy_level").i = accuracy_level
    return model.SerializeToString()
