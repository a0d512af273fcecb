"""Repairs of what paddle2onnx 2.1 writes wrongly, each found on a real model."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import links

if TYPE_CHECKING:
    import onnx

#: The prefix paddle2onnx gives a symbolic dimension's name.
DYNAMIC_DIM = "DynamicDimension."


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


def numbered_dim_names(model: onnx.ModelProto) -> int:
    """Rename the symbolic dimensions (``dim_param``) ``DynamicDimension.<k>`` by order of first appearance
    (inputs, outputs, value infos); returns how many names changed.

    paddle2onnx 2.1 numbers them in an order that changes from run to run (seen on all-MiniLM-L6-v2: the
    batch dimension was ``.0`` in one export and ``.2`` in the next), so the same model gave different bytes.
    A one-to-one renaming keeps which dimensions are equal.
    """
    values = [*model.graph.input, *model.graph.output, *model.graph.value_info]
    dims = [d for v in values if v.type.tensor_type.HasField("shape") for d in v.type.tensor_type.shape.dim
            if d.dim_param.startswith(DYNAMIC_DIM)]
    names: dict[str, str] = {}
    for dim in dims:
        names.setdefault(dim.dim_param, f"{DYNAMIC_DIM}{len(names)}")
    for dim in dims:
        dim.dim_param = names[dim.dim_param]
    return sum(old != new for old, new in names.items())


def identities_around_transposed_convs(model: onnx.ModelProto) -> int:
    """Drop the ``Identity`` nodes paddle2onnx puts around each ``ConvTranspose``; returns how many.

    paddle2onnx 2.1 reads a transposed conv's input and weight through its auto-cast (an ``Identity`` when the
    type already fits, named ``auto.cast.<k>``) and writes its output through another ``Identity`` (to the
    name ``p2o.pd_op.conv2d_transpose.<k>.0``). The QDQ writer finds a weight and a quantized input by their
    readers, the bias fold (:mod:`.fusable`) the ``Add`` by the conv's output, and a runtime fuses
    ``DequantizeLinear -> ConvTranspose -> QuantizeLinear`` only when nothing sits between them. An
    ``Identity`` another node also reads stays for that node.
    """
    graph = model.graph
    producers, readers = links.producers(graph), links.readers(graph)
    outputs = {o.name for o in graph.output}
    bypassed, dropped = [], 0
    for conv in [n for n in graph.node if n.op_type == "ConvTranspose"]:
        for slot, name in enumerate(conv.input):
            node = producers.get(name)
            if node is not None and node.op_type == "Identity":
                conv.input[slot] = node.input[0]
                bypassed.append(node)
        after = readers.get(conv.output[0], [])
        if len(after) == 1 and after[0].op_type == "Identity" and conv.output[0] not in outputs:
            conv.output[0] = after[0].output[0]
            graph.node.remove(after[0])
            dropped += 1
    read = {name for node in graph.node for name in node.input} | outputs
    for node in bypassed:
        if node.output[0] not in read and node in graph.node:
            graph.node.remove(node)
            dropped += 1
    return dropped


def repair(model: onnx.ModelProto) -> list[str]:
    """Fix ``model`` in place; returns one line per kind of repair made."""
    done = []
    renamed = numbered_dim_names(model)
    if renamed:
        done.append(f"{renamed} symbolic dimension(s) renumbered")
    constants = constants_to_initializers(model)
    if constants:
        done.append(f"{constants} Constant node(s) made initializers")
    scalars = scalars_in_shape_concats(model)
    if scalars:
        done.append(f"{scalars} rank-0 Concat input(s) made 1-D")
    identities = identities_around_transposed_convs(model)
    if identities:
        done.append(f"{identities} Identity node(s) around ConvTranspose dropped")
    return done
