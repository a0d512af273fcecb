"""``quant_post_dynamic(model_dir, out, weight_bits=4, group_size=128, algo=...)`` on a saved model: group-wise
weight-only codes for its matmuls, saved as the simulation plus, for the ONNX runtimes, ``inference.onnx``
with ``MatMulNBits`` (and, with ``embedding_bits``, the quantized tables in that runtime's form:
:mod:`qcore.export.gather_nbits`).

Paddle Inference has no int4 (or group-wise int8) matmul on CPU, so the Paddle model written holds the
dequantized weights (it runs anywhere, at float size and speed); the compressed, fast form is the ONNX file
for ``deploy_backend="onnxruntime"`` or ``"openvino-runtime"``. Targets that run Paddle's own int8 kernels
(``onednn``, ``openvino``, ``tensorrt``) are refused with one line. Paddle's GPU ``weight_only_linear``
format is not written (no GPU here).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from qcore.deploy import get_target
from qcore.deploy.onnx_runtimes import ONNX_FILE, OnnxTarget
from qcore.errors import ConfigError
from qcore.graph import open_graph
from qcore.model_io import ModelFiles, check_model_output, find_model_files, load_model

from ..data import feed_batches
from ..naming import dynamic_output_names
from ..progress import Progress
from ..progress import progress as shown
from .config import WeightOnlyConfig
from .plan import WeightOnlyResult
from .program import MATMUL_TYPES, quantize_program

#: Backends the output is made for: the simulation only, or it plus the ONNX file.
WEIGHT_ONLY_BACKENDS = ("native", "onnxruntime", "openvino-runtime")


def _backend(deploy_backend: str | None) -> OnnxTarget | None:
    """The ONNX target to write ``inference.onnx`` for, None for the simulation alone; one line for the rest."""
    target = get_target(deploy_backend or "native")
    if target.name == "native":
        return None
    if not isinstance(target, OnnxTarget):
        raise ConfigError(f"deploy_backend={deploy_backend!r} has no int4 or group-wise matmul kernel (Paddle "
                          f"Inference on CPU); weight-only groups deploy with one of {WEIGHT_ONLY_BACKENDS}")
    problem = target.unavailable()
    if problem is not None:
        raise ConfigError(f"deploy_backend={deploy_backend!r} cannot be verified here: {problem}")
    return target


def quant_post_weight_only(
    model_dir: str | os.PathLike[str],
    save_model_dir: str | os.PathLike[str],
    config: WeightOnlyConfig,
    *,
    model_filename: str | None = None,
    params_filename: str | None = None,
    save_model_filename: str | None = None,
    save_params_filename: str | None = None,
    quantizable_op_type: Sequence[str] = MATMUL_TYPES,
    deploy_backend: str | None = None,
    sample_generator: Callable[[], Iterable[Any]] | None = None,
    batch_generator: Callable[[], Iterable[Any]] | None = None,
    data_loader: Iterable[Any] | None = None,
    batch_size: int = 16,
    batch_nums: int | None = None,
    progress: bool = False,
) -> tuple[ModelFiles, WeightOnlyResult]:
    """Quantize the matmul weights of the model in ``model_dir`` as ``config`` says and save it in
    ``save_model_dir`` (names as :func:`qptq.quant_post_dynamic`'s); the files and the report. ``progress``
    shows the calibration batches and the matmuls quantized."""
    target = _backend(deploy_backend)
    op_types = [t for t in quantizable_op_type if t in MATMUL_TYPES]
    if not op_types:
        raise ConfigError(f"quantizable_op_type={list(quantizable_op_type)!r} holds no matmul type; weight-only "
                          f"groups quantize {list(MATMUL_TYPES)}")
    graph = open_graph(load_model(model_dir, model_filename, params_filename))
    names = dynamic_output_names(graph.family, save_model_filename, save_params_filename, graph.model.source)
    check_model_output(save_model_dir, graph.family, *names, graph.model.source)
    sources = (sample_generator, batch_generator, data_loader)
    batches = None
    if any(s is not None for s in sources):
        specs = graph.model.feed_specs()
        batches = feed_batches(list(specs), sample_generator=sample_generator, batch_generator=batch_generator,
                               data_loader=data_loader, batch_size=batch_size, batch_nums=batch_nums, specs=specs)
        if progress:
            batches = shown(batches, "calibrating", "batch")
    counter = Progress("quantizing weights", "matmul") if progress else None
    try:
        result = quantize_program(graph, config, batches, op_types, counter.step if counter else None)
    finally:
        if counter is not None:
            counter.close()
    extra: dict[str, bytes] = {}
    if target is not None:
        from qcore.export.nbits import weight_only_onnx

        with tempfile.TemporaryDirectory(prefix="qptq-wo-") as tmp:
            simulated = graph.save(Path(tmp) / "sim", *names)
            extra[ONNX_FILE] = weight_only_onnx(find_model_files(simulated.directory), result.codes,
                                                result.input_scales, runtime=target.name)
    return graph.save(save_model_dir, *names, extra_files=extra), result
