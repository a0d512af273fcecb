"""Writing a toolkit model's quantization into a float ONNX graph as standard QDQ.

The float graph comes from paddle2onnx with each activation QDQ pair of the Paddle model
standing as a marker ``Cast`` (float -> float) and each integer weight as a float initializer
(:meth:`qcore.graph.Graph.unquantize`). This module replaces them:

* a marker becomes one ``QuantizeLinear`` and one ``DequantizeLinear`` **per reader** (same scale and
  zero point): ONNX Runtime fuses a ``DequantizeLinear`` into an int8 kernel only when it feeds that
  kernel alone, and the op writing the tensor only when one ``QuantizeLinear`` reads it; OpenVINO
  and TensorRT read either form. A ``Shape`` (paddle2onnx's flatten reads its input's shape) reads the
  codes themselves: a dequantize there would be a pass over the tensor for nothing;
* a weight becomes an int8 initializer read through ``DequantizeLinear`` (per-channel scales
  along the Paddle weight's channel axis, which paddle2onnx keeps), one per reader, each reader after
  the first with its own copy (:func:`_weight_dq`).

Activations are written ``uint8`` (ONNX Runtime runs int8 kernels only for U8S8: uint8
activations, int8 weights) or ``int8`` (TensorRT's explicit quantization wants symmetric int8).
Nothing here decides what is quantized: the Paddle model's QDQ pairs, placed by its deployment
target's rules, are written as they are, and the exported model computes what the Paddle
model's simulation computes (round half to even, the same clipping).
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

import numpy as np

from ..errors import ExportError
from ..graph.base import ActivationGrid, StoredWeight, Unquantized
from . import links

if TYPE_CHECKING:
    import onnx

#: paddle2onnx's name for the output of the ``k``-th ``cast`` of a program.
MARKER_NAME = "p2o.pd_op.cast.{}.0"
#: The ONNX element types activations may be written in, with the code each grid's lowest level gets.
ACTIVATION_TYPES = {"uint8": 0, "int8": -128}


def _readers(graph: onnx.GraphProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    found: dict[str, list[tuple[onnx.NodeProto, int]]] = defaultdict(list)
    for node in graph.node:
        for slot, name in enumerate(node.input):
            found[name].append((node, slot))
    return found


#: ONNX ops whose output is never negative when their input is not (or never, for Relu).
_KEEPS_SIGN = {"MaxPool", "AveragePool", "GlobalAveragePool", "Identity", "Reshape", "Flatten", "Transpose"}


def _never_negative(name: str, producers: dict[str, onnx.NodeProto]) -> bool:
    node = producers.get(name)
    while node is not None and node.op_type in _KEEPS_SIGN:
        node = producers.get(node.input[0])
    return node is not None and node.op_type == "Relu"


def _zero_point(grid: ActivationGrid, activation_type: str, where: str, never_negative: bool = False) -> int:
    """The ONNX zero point that runs ``grid`` in ``activation_type`` (ONNX clips to the type's range).

    Exact for every input, except one case: a never-negative tensor whose grid puts zero one code above
    the lowest (the toolkit's asymmetric grid of a relu output: 255 codes over ``[0, t]``) gets zero at the
    type's lowest code, so ONNX Runtime can drop the relu and fuse the op before it. Its codes never reach
    the grid's lowest one, so only values above the threshold deploy differently (one step more).
    """
    if grid.qmax - grid.qmin != 255:
        raise ExportError(
            f"{where}: its grid has {grid.qmax - grid.qmin + 1} levels; ONNX QDQ runs 8-bit activations only "
            "(quantize with activation_bits=8 to export)"
        )
    lowest = ACTIVATION_TYPES[activation_type]
    if activation_type == "int8" and (grid.qmin != -128 or grid.zero_point):
        raise ExportError(
            f"{where}: an unsigned or asymmetric grid does not fit int8 activations with zero point 0 (TensorRT's "
            "form); export with activation_type='uint8' or quantize with symmetric activations"
        )
    bottom = grid.qmin + 1 if never_negative and grid.zero_point == grid.qmin + 1 else grid.qmin
    zero = grid.zero_point + lowest - bottom
    if not lowest <= zero <= lowest + 255:
        raise ExportError(f"{where}: its grid does not hold zero (zero point {grid.zero_point} outside "
                          f"[{grid.qmin}, {grid.qmax}]); ONNX cannot write it: quantize for deploy_backend="
                          "'onnxruntime' or 'openvino-runtime', whose grids always hold zero")
    return zero


def write_qdq(model: onnx.ModelProto, taken: Unquantized, activation_type: str = "uint8",
              dynamic: bool = False) -> None:
    """Put ``taken`` (grids and integer weights) into ``model``, paddle2onnx's float graph of the program
    :meth:`~qcore.graph.Graph.unquantize` left, in place. ``dynamic``: an int8-weight ``MatMul`` whose input
    carries no QDQ quantizes it at run time (:func:`_dynamic_matmul`)."""
    from onnx import TensorProto, helper, numpy_helper

    if activation_type not in ACTIVATION_TYPES:
        raise ExportError(f"activation_type={activation_type!r}: choose one of {', '.join(ACTIVATION_TYPES)}")
    elem = {"uint8": TensorProto.UINT8, "int8": TensorProto.INT8}[activation_type]
    graph = model.graph
    readers = _readers(graph)
    producers = links.producers(graph)
    outputs = {o.name for o in graph.output}
    before: dict[int, list[onnx.NodeProto]] = defaultdict(list)  # new nodes to place before a node (by id)
    removed: set[int] = set()
    initializers: list[onnx.TensorProto] = []

    def pairs(cast: onnx.NodeProto, name: str, scale: str, zero: str, at: list[tuple[onnx.NodeProto, int]]) -> None:
        q = f"{name}.q"
        before[id(cast)].append(helper.make_node("QuantizeLinear", [cast.input[0], scale, zero], [q], name=q))
        for i, (node, slot) in enumerate(at):
            if node.op_type == "Shape":  # reads only the shape: the codes have it, no dequantize pass needed
                node.input[slot] = q
                continue
            dq = f"{name}.dq{i}"
            before[id(node)].append(helper.make_node("DequantizeLinear", [q, scale, zero], [dq], name=dq))
            node.input[slot] = dq
        if name in outputs:  # a model output keeps its name, now written by its own dequantize
            before[id(cast)].append(helper.make_node("DequantizeLinear", [q, scale, zero], [name], name=name))

    for k, grid in sorted(taken.markers.items()):
        name = MARKER_NAME.format(k)
        cast = producers.get(name)
        if cast is None or cast.op_type != "Cast" or cast.attribute[0].i != TensorProto.FLOAT:
            raise ExportError(
                f"paddle2onnx did not keep QDQ marker {k} as a float Cast named {name!r}; this paddle2onnx "
                "version names ops differently (paddle2onnx 2.1 is tested)"
            )
        scale, zero = f"{name}.scale", f"{name}.zero_point"
        initializers += [numpy_helper.from_array(np.array(grid.step, np.float32), scale),
                         numpy_helper.from_array(np.array(_zero_point(grid, activation_type, name,
                                                                      _never_negative(cast.input[0], producers)),
                                                          helper.tensor_dtype_to_np_dtype(elem)), zero)]
        removed.add(id(cast))
        pairs(cast, name, scale, zero, readers.get(name, []))

    weight_nodes = []
    stored = {i.name: i for i in graph.initializer}
    quantized_inputs = {dq for nodes in before.values() for dq in (n.output[0] for n in nodes)}
    for weight in taken.weights:
        at = readers.get(weight.name, [])
        if dynamic:
            runtime_quantized = [n for n, s in at if n.op_type == "MatMul" and s == 1
                                 and n.input[0] not in quantized_inputs]
            for node in runtime_quantized:
                before[id(node)] += _dynamic_matmul(node, weight)
                removed.add(id(node))
            at = [(n, s) for n, s in at if id(n) not in {id(m) for m in runtime_quantized}]
        weight_nodes += _weight_dq(weight, stored, at, initializers)
        graph.initializer.remove(stored.pop(weight.name))

    nodes = list(weight_nodes)
    for node in graph.node:
        nodes += before.get(id(node), [])
        if id(node) not in removed:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(initializers)


def _dynamic_matmul(matmul: onnx.NodeProto, weight: StoredWeight) -> list[onnx.NodeProto]:
    """``matmul`` as ``DynamicQuantizeLinear(x) -> MatMulInteger(x_q, codes) -> Cast -> Mul(x_scale * steps)``
    (the nodes that replace it); its int8 weight initializer is written by :func:`_weight_dq`."""
    from onnx import TensorProto, helper

    name = out = matmul.output[0]
    codes, scale, zero = f"{weight.name}.int8", f"{weight.name}.scale", f"{weight.name}.zero_point"
    names = {k: f"{name}.dynamic.{k}" for k in ("x_q", "x_scale", "x_zero", "int32", "float", "scale")}
    return [
        helper.make_node("DynamicQuantizeLinear", [matmul.input[0]], [names["x_q"], names["x_scale"], names["x_zero"]],
                         name=f"{name}.dynamic.quantize"),
        helper.make_node("MatMulInteger", [names["x_q"], codes, names["x_zero"], zero], [names["int32"]],
                         name=f"{name}.dynamic.matmul"),
        helper.make_node("Cast", [names["int32"]], [names["float"]], to=TensorProto.FLOAT, name=f"{name}.dynamic.cast"),
        helper.make_node("Mul", [names["x_scale"], scale], [names["scale"]], name=f"{name}.dynamic.scales"),
        helper.make_node("Mul", [names["float"], names["scale"]], [out], name=f"{name}.dynamic.rescale"),
    ]


def _weight_dq(weight: StoredWeight, stored: dict[str, onnx.TensorProto],
               at: list[tuple[onnx.NodeProto, int]], initializers: list[onnx.TensorProto]) -> list[onnx.NodeProto]:
    """The int8 initializer, scales and one ``DequantizeLinear`` per reader of float initializer ``weight.name``.

    Each reader after the first gets copies of the three initializers: OpenVINO 2026.4 computes convs sharing
    one int8 weight wrongly (measured: a conv applied twice, 0.52 off its simulation with one initializer read
    by two ``DequantizeLinear`` or by one, 4e-4 with a copy each)."""
    from onnx import helper, numpy_helper

    float_init = stored.get(weight.name)
    if float_init is None or tuple(float_init.dims) != weight.codes.shape:
        found = "missing" if float_init is None else f"of shape {list(float_init.dims)}"
        raise ExportError(f"weight {weight.name!r} is {found} in paddle2onnx's graph (expected shape "
                          f"{list(weight.codes.shape)}); paddle2onnx rewrote it, so its int8 form cannot be placed")
    steps = weight.steps if weight.axis is not None else np.float32(weight.steps.ravel()[0])
    attrs = {"axis": weight.axis} if weight.axis is not None else {}
    nodes = []
    for i in range(max(len(at), 1)):  # the initializers are written once without a reader (dynamic matmuls read them)
        copy = f".{i}" if i else ""
        codes, scale, zero = (f"{weight.name}.{kind}{copy}" for kind in ("int8", "scale", "zero_point"))
        initializers += [numpy_helper.from_array(weight.codes.astype(np.int8), codes),
                         numpy_helper.from_array(np.asarray(steps, np.float32), scale),
                         numpy_helper.from_array(np.zeros(np.shape(steps), np.int8), zero)]
        if i < len(at):
            node, slot = at[i]
            out = weight.name if len(at) == 1 else f"{weight.name}.dq{i}"
            nodes.append(helper.make_node("DequantizeLinear", [codes, scale, zero], [out], name=out, **attrs))
            node.input[slot] = out
    return nodes
