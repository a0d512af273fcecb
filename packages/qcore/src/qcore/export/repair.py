"""Repairs of what paddle2onnx 2.1 writes wrongly, each found on a real model."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx


def _ranks(model: onnx.ModelProto) -> dict[str, int]:
    """The rank of every value ONNX's shape inference can tell (initializers included)."""
    from onnx import shape_inference

    inferred = shape_inference.infer_shapes(model, strict_mode=False)
    values = [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in values if v.type.tensor_type.HasField("shape")}
    ranks.update({i.name: len(i.dims) for i in model.graph.initializer})
    return ranks


def scalars_in_shape_concats(model: onnx.ModelProto) -> int:
    """Make every rank-0 input of a ``Concat`` of 1-D pieces 1-D (an ``Unsqueeze``); returns how many.

    paddle2onnx builds a reshape's target shape by concatenating its pieces and writes a scalar
    piece as a rank-0 tensor: ONNX Runtime and OpenVINO both refuse the model ("All inputs to
    Concat must have same rank"). Seen in PP-OCRv4 rec (5 Concats, its SVTR reshapes).
    """
    import numpy as np
    from onnx import helper, numpy_helper

    ranks = _ranks(model)
    fixed = 0
    axes = "qcore.repair.unsqueeze_axes"
    nodes = []
    for node in model.graph.node:
        if node.op_type == "Concat" and {ranks.get(i) for i in node.input} == {0, 1}:
            for slot, name in enumerate(node.input):
                if ranks.get(name) == 0:
                    out = f"{name}.qcore_1d"
                    nodes.append(helper.make_node("Unsqueeze", [name, axes], [out], name=out))
                    node.input[slot] = out
                    fixed += 1
        nodes.append(node)
    if fixed:
        model.graph.initializer.append(numpy_helper.from_array(np.array([0], np.int64), axes))
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return fixed


def constants_to_initializers(model: onnx.ModelProto) -> int:
    """Turn every ``Constant`` node holding a tensor into an initializer of the same name; returns how many.

    paddle2onnx writes some parameters as ``Constant`` nodes instead of initializers (seen: the batch-norm
    folded conv weights of PP-OCR v2 cls); the QDQ writer finds weights among the initializers.
    """
    constants = [n for n in model.graph.node if n.op_type == "Constant" and len(n.attribute) == 1
                 and n.attribute[0].name == "value"]
    for node in constants:
        tensor = node.attribute[0].t
        tensor.name = node.output[0]
        model.graph.initializer.append(tensor)
        model.graph.node.remove(node)
    return len(constants)


def repair(model: onnx.ModelProto) -> list[str]:
    """Fix ``model`` in place; returns one line per kind of repair made."""
    done = []
    constants = constants_to_initializers(model)
    if constants:
        done.append(f"{constants} Constant node(s) made initializers")
    scalars = scalars_in_shape_concats(model)
    if scalars:
        done.append(f"{scalars} rank-0 Concat input(s) made 1-D")
    return done
