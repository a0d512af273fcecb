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

from ..errors import ExportError
from ..graph import open_graph
from ..model_io import Model, ModelFiles, load_model, save_model
from ..outputs import check_output_dir, write_bytes
from .paddle2onnx_float import OPSET, float_onnx, require_onnx
from .qdq import ACTIVATION_TYPES, write_qdq
from .repair import repair


def export_onnx(
    model: Model | ModelFiles | str | os.PathLike[str],
    path: str | os.PathLike[str],
    *,
    activation_type: str = "uint8",
    opset: int = OPSET,
) -> Path:
    """Write ``model`` (loaded, its files, or a model directory / file; float or quantized, PIR or legacy)
    as one ONNX file at ``path``, atomically; returns ``path``.

    Activations are written as ``activation_type`` (``"uint8"``: what ONNX Runtime's int8 kernels run;
    ``"int8"``: TensorRT's symmetric form). The file passes ``onnx.checker``; the input is never changed.
    """
    require_onnx()
    import onnx

    if activation_type not in ACTIVATION_TYPES:
        raise ExportError(f"activation_type={activation_type!r}: choose one of {', '.join(ACTIVATION_TYPES)}")
    path = Path(path)
    if path.suffix != ".onnx":
        raise ExportError(f"{path}: name the ONNX file with the .onnx suffix")
    check_output_dir(path.parent)
    if not isinstance(model, Model):
        model = load_model(model)
    graph = open_graph(model).clone()
    taken = graph.unquantize()
    with tempfile.TemporaryDirectory(prefix="qcore-onnx-") as tmp:
        files = save_model(graph.model, Path(tmp) / "float")
        proto = float_onnx(files, opset)
    repair(proto)
    write_qdq(proto, taken, activation_type)
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as error:
        raise ExportError(f"the exported graph of {model.source or 'the model'} is not valid ONNX: "
                          f"{str(error).splitlines()[0]}") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes(path, proto.SerializeToString())
    return path


__all__ = ["ACTIVATION_TYPES", "OPSET", "export_onnx"]
