"""Putting paddle2onnx's float graph into the forms the runtimes' QDQ fusions match.

paddle2onnx writes a conv's bias as a separate ``Add`` of a reshaped constant (Paddle's ``conv2d``
and ``conv2d_transpose`` have no bias input). ONNX Runtime fuses ``DequantizeLinear -> Conv -> QuantizeLinear``
into one int8 ``QLinearConv`` only when nothing sits between the conv and its output's
``QuantizeLinear``, and it cannot fold the ``Add`` into a conv whose weight is read through
``DequantizeLinear``; so the bias goes into the ``Conv`` (or ``ConvTranspose``) here, on the float graph.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from . import links

if TYPE_CHECKING:
    import onnx


def _constant(name: str, initializers: dict[str, np.ndarray],
              producers: dict[str, onnx.NodeProto]) -> np.ndarray | None:
    """The value of ``name`` when it is an initializer, or a reshape / unsqueeze / identity of one."""
    if name in initializers:
        return initializers[name]
    node = producers.get(name)
    if node is None or node.op_type not in ("Reshape", "Unsqueeze", "Identity"):
        return None
    source = _constant(node.input[0], initializers, producers)
    if source is None:
        return None
    if node.op_type == "Identity":
        return source
    if node.op_type == "Reshape":
        shape = _constant(node.input[1], initializers, producers)  # 0 copies the input's dimension
        return None if shape is None else source.reshape([source.shape[i] if d == 0 else int(d)
                                                          for i, d in enumerate(shape.ravel())])
    axes = _constant(node.input[1], initializers, producers) if len(node.input) > 1 else None
    if axes is None:
        return None
    out = source
    for axis in sorted(int(a) for a in axes.ravel()):
        out = np.expand_dims(out, axis)
    return out


def _output_channels(conv: onnx.NodeProto, weight: np.ndarray | None) -> int | None:
    """The output channels of a ``Conv`` (weight ``[C_out, C_in / g, ...]``) or ``ConvTranspose`` (weight
    ``[C_in, C_out / g, ...]``) whose weight is ``weight``."""
    if weight is None:
        return None
    if conv.op_type == "Conv":
        return weight.shape[0]
    group = next((a.i for a in conv.attribute if a.name == "group"), 1)
    return weight.shape[1] * group


def biases_into_convs(model: onnx.ModelProto) -> int:
    """Move every constant per-channel ``Add`` that alone reads a ``Conv``'s or ``ConvTranspose``'s output into
    that conv's bias, and drop the constants (and the reshapes of them) nothing reads then; returns how many. Same
    values (up to float rounding of the sum with an existing bias)."""
    from onnx import numpy_helper

    graph = model.graph
    initializers = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    producers, readers = links.producers(graph), links.readers(graph)
    outputs = {o.name for o in graph.output}
    removed = []
    for conv in [n for n in graph.node if n.op_type in ("Conv", "ConvTranspose")]:
        out = conv.output[0]
        users = readers.get(out, [])
        if len(users) != 1 or users[0].op_type != "Add" or out in outputs:
            continue
        add = users[0]
        other = add.input[1] if add.input[0] == out else add.input[0]
        bias = _constant(other, initializers, producers)
        channels = _output_channels(conv, initializers.get(conv.input[1]))
        if bias is None or channels is None or bias.size != channels or (bias.ndim > 1 and bias.shape[1] != channels):
            continue
        bias = bias.reshape(-1).astype(np.float32)
        name = f"{conv.output[0]}.bias"
        if len(conv.input) > 2 and conv.input[2]:
            existing = _constant(conv.input[2], initializers, producers)
            if existing is None:
                continue
            bias = bias + existing
        graph.initializer.append(numpy_helper.from_array(bias, name))
        initializers[name] = bias
        del conv.input[2:]
        conv.input.append(name)
        conv.output[0] = add.output[0]
        removed.append(add)
    for node in removed:
        graph.node.remove(node)
    if removed:
        links.prune(model)  # the folded bias parameters, e.g. ``*.bn_folded_bias``, were left unread
    return len(removed)
