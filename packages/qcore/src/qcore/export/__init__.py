"""Exporting any model the toolkit reads or writes to ONNX, its quantization as standard QDQ.

:func:`export_onnx` takes the program's float form (:meth:`qcore.graph.Graph.unquantize`),
converts it with paddle2onnx (:mod:`.paddle2onnx_float`), repairs what paddle2onnx writes wrongly
(:mod:`.repair`), writes the Paddle model's QDQ pairs and integer weights back as
``QuantizeLinear`` / ``DequantizeLinear`` (:mod:`.qdq`) and runs the result beside the Paddle model
(:mod:`.check`): a graph that computes something else is refused. The exporter is a writer: what is
quantized, and with which scales, was decided when the Paddle model was quantized for its
deployment target.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..custom_ops import PROVIDERS
from ..errors import ConfigError, ExportError
from ..graph import Graph, open_graph
from ..graph.base import StoredWeight, Unquantized
from ..model_io import Model, ModelFiles, find_model_files, load_model, save_model
from ..outputs import check_output_dir, write_bytes
from .check import FLOAT_TOLERANCE, QDQ_TOLERANCE, check_export, check_inputs
from .fusable import biases_into_convs
from .gather_nbits import TABLE_RUNTIMES
from .lookups import unpad_code_lookups, write_lookups
from .paddle2onnx_float import OPSET, float_onnx, require_onnx
from .qdq import ACTIVATION_TYPES, write_qdq
from .repair import repair

if TYPE_CHECKING:
    import onnx


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


def _refuse_custom_ops(op_types: Iterable[str]) -> None:
    """One line when a custom op (:data:`qcore.custom_ops.PROVIDERS`) is among ``op_types``: paddle2onnx cannot
    convert it."""
    custom = sorted({t for t in op_types for op in PROVIDERS if t.endswith(op)})
    if custom:
        raise ExportError(f"the model uses the custom op {custom[0]}, which paddle2onnx cannot convert; quantize it "
                          "again without it for the ONNX runtimes (quant_embedding: fused_lookup=False)")


def onnx_bytes(model: Model | ModelFiles | str | os.PathLike[str], *, activation_type: str = "uint8",
               dynamic: bool = False, opset: int = OPSET, feed: Mapping[str, np.ndarray] | None = None,
               runtime: str = "onnxruntime") -> bytes:
    """``model`` (loaded, its files, or a model directory / file; float or quantized, PIR or legacy) as a
    serialized ONNX model that passes ``onnx.checker`` and computes what the model computes on ``feed``
    (default: :func:`.check.check_inputs`), else :class:`ExportError` (:mod:`.check`). The model is never
    changed.

    Activations are written as ``activation_type`` (``"uint8"``: what ONNX Runtime's int8 kernels run;
    ``"int8"``: TensorRT's symmetric form). ``dynamic``: a ``MatMul`` with an int8 weight and a float input
    quantizes the input at run time (ONNX Runtime's ``DynamicQuantizeLinear`` + ``MatMulInteger``). qembed's
    quantized lookups are written in ``runtime``'s quantized-table form (:mod:`.lookups`: ``"onnxruntime"`` or
    ``"openvino-runtime"``; both runtimes run both forms).
    """
    require_onnx()
    if activation_type not in ACTIVATION_TYPES:
        raise ExportError(f"activation_type={activation_type!r}: choose one of {', '.join(ACTIVATION_TYPES)}")
    if runtime not in TABLE_RUNTIMES:
        raise ExportError(f"runtime={runtime!r}: choose one of {', '.join(TABLE_RUNTIMES)}")
    if not isinstance(model, Model):  # refused before loading: loading needs the op built on this machine
        files = model if isinstance(model, ModelFiles) else find_model_files(model)
        program = files.model_file.read_bytes()
        _refuse_custom_ops(op for op in PROVIDERS if op.encode() in program)
        model = load_model(files)
    graph = open_graph(model).clone()
    _refuse_custom_ops(graph.op_types())
    taken = fold_batch_norms(graph, graph.unquantize())
    padded = unpad_code_lookups(graph)
    with tempfile.TemporaryDirectory(prefix="qcore-onnx-") as tmp:
        files = save_model(graph.model, Path(tmp) / "float")
        proto = float_onnx(files, opset)
    repair(proto)
    biases_into_convs(proto)
    source = model.source.model_file if model.source else "the model"
    feed = check_inputs(graph) if feed is None else feed
    check_export(proto.SerializeToString(), graph.model, feed, FLOAT_TOLERANCE, f"paddle2onnx's graph of {source}")
    tables = write_lookups(proto, runtime, padded)
    qdq = bool(taken.markers or taken.weights)
    if not qdq and not tables:
        return _checked(proto, source)
    if qdq:
        write_qdq(proto, taken, activation_type, dynamic)
    data = _checked(proto, source)
    what = "QDQ" if qdq else "quantized-table"
    check_export(data, model, feed, QDQ_TOLERANCE if qdq else FLOAT_TOLERANCE, f"the {what} export of {source}")
    return data


def _checked(proto: onnx.ModelProto, source: object) -> bytes:
    """``proto`` serialized, once ``onnx.checker`` passes it."""
    import onnx

    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as error:
        raise ExportError(f"the exported graph of {source} is not valid ONNX: {str(error).splitlines()[0]}") from None
    return proto.SerializeToString()


def export_onnx(
    model: Model | ModelFiles | str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    activation_type: str = "uint8",
    dynamic: bool = False,
    opset: int = OPSET,
    feed: Mapping[str, np.ndarray] | None = None,
    runtime: str = "onnxruntime",
) -> Path:
    """Write :func:`onnx_bytes` of ``model`` to ``path`` (an ``.onnx`` file) atomically, once checked on ``feed``;
    returns ``path``."""
    path = Path(path)
    if path.suffix != ".onnx":
        raise ConfigError(f"{path}: name the ONNX file with the .onnx suffix")
    check_output_dir(path.parent)
    data = onnx_bytes(model, activation_type=activation_type, dynamic=dynamic, opset=opset, feed=feed, runtime=runtime)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes(path, data)
    return path


__all__ = ["ACTIVATION_TYPES", "OPSET", "export_onnx", "fold_batch_norms", "onnx_bytes", "require_onnx"]
