"""Exporting any model the toolkit reads or writes to ONNX, its quantization as standard QDQ.

:func:`export_onnx` takes the program's float form (:meth:`qcore.graph.Graph.unquantize`),
converts it with paddle2onnx (:mod:`.paddle2onnx_float`), repairs what paddle2onnx writes wrongly
(:mod:`.repair`) and writes the Paddle model's QDQ pairs and integer weights back as
``QuantizeLinear`` / ``DequantizeLinear`` (:mod:`.qdq`). The exporter is a writer: what is
quantized, and with which scales, was decided when the Paddle model was quantized for its
deployment target.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from ..errors import ConfigError, ExportError
from ..graph import Graph, open_graph
from ..graph.base import StoredWeight, Unquantized
from ..model_io import Model, ModelFiles, load_model, save_model
from ..outputs import check_output_dir, write_bytes
from .fusable import biases_into_convs
from .paddle2onnx_float import OPSET, float_onnx, require_onnx
from .qdq import ACTIVATION_TYPES, write_qdq
from .repair import repair


def fold_batch_norms(graph: Graph, taken: Unquantized) -> Unquantized:
    """Fold every conv's batch norm into it (:meth:`Graph.fold_conv_bn`) and the factors into the steps of
    its integer weight: the codes stay, so the folded weight is still exactly int8 codes times steps.

    Runtimes fuse a QDQ conv into an int8 kernel only when no batch norm sits behind it, and cannot
    fold one into a weight read through ``DequantizeLinear`` themselves.
    """
    graph.fold_conv_bn()
    channel_axis = {conv_weight.name: graph.weight_channel_axis(conv_weight.op)
                    for conv_weight in (graph.weight_operand(op) for op in graph.ops()) if conv_weight is not None}
    weights = []
    for weight in taken.weights:
        if weight.name not in graph.bn_folded:
            weights.append(weight)
            continue
        name, factor = graph.bn_folded[weight.name]
        axis = channel_axis[name]
        shape = [1] * weight.codes.ndim
        shape[axis] = -1
        steps = weight.steps.reshape(-1 if weight.axis == axis else 1) * factor
        value = weight.codes * steps.reshape(shape)
        graph.set_param(name, value.astype(np.float32))  # codes x folded steps, bit for bit what is exported
        weights.append(StoredWeight(name, weight.codes, steps.astype(np.float32), axis))
    return Unquantized(taken.markers, weights)


def onnx_bytes(model: Model | ModelFiles | str | os.PathLike[str], *, activation_type: str = "uint8",
               dynamic: bool = False, opset: int = OPSET) -> bytes:
    """``model`` (loaded, its files, or a model directory / file; float or quantized, PIR or legacy) as a
    serialized ONNX model that passes ``onnx.checker``. The model is never changed.

    Activations are written as ``activation_type`` (``"uint8"``: what ONNX Runtime's int8 kernels run;
    ``"int8"``: TensorRT's symmetric form). ``dynamic``: a ``MatMul`` with an int8 weight and a float input
    quantizes the input at run time (ONNX Runtime's ``DynamicQuantizeLinear`` + ``MatMulInteger``).
    """
    require_onnx()
    import onnx

    if activation_type not in ACTIVATION_TYPES:
        raise ExportError(f"activation_type={activation_type!r}: choose one of {', '.join(ACTIVATION_TYPES)}")
    if not isinstance(model, Model):
        model = load_model(model)
    graph = open_graph(model).clone()
    taken = fold_batch_norms(graph, graph.unquantize())
    with tempfile.TemporaryDirectory(prefix="qcore-onnx-") as tmp:
        files = save_model(graph.model, Path(tmp) / "float")
        proto = float_onnx(files, opset)
    repair(proto)
    biases_into_convs(proto)
    write_qdq(proto, taken, activation_type, dynamic)
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as error:
        raise ExportError(f"the exported graph of {model.source or 'the model'} is not valid ONNX: "
                          f"{str(error).splitlines()[0]}") from None
    return proto.SerializeToString()


def export_onnx(
    model: Model | ModelFiles | str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    activation_type: str = "uint8",
    dynamic: bool = False,
    opset: int = OPSET,
) -> Path:
    """Write :func:`onnx_bytes` of ``model`` to ``path`` (an ``.onnx`` file) atomically; returns ``path``."""
    path = Path(path)
    if path.suffix != ".onnx":
        raise ConfigError(f"{path}: name the ONNX file with the .onnx suffix")
    check_output_dir(path.parent)
    data = onnx_bytes(model, activation_type=activation_type, dynamic=dynamic, opset=opset)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes(path, data)
    return path


__all__ = ["ACTIVATION_TYPES", "OPSET", "export_onnx", "fold_batch_norms", "onnx_bytes"]
