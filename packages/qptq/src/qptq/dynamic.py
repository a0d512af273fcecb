"""Dynamic (weight-only) post-training quantization.

Weights of the chosen ops are stored as int8 (or int16) with per-channel scales and read
through a dequantize step, so the model file shrinks to about 1/4 (1/2) and the output runs
in the executor and in ``paddle.inference`` on CPU. Activations stay in float.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from qcore.config import validate_choice, validate_names
from qcore.constants import WEIGHT_ONLY_OP_TYPES, WEIGHT_QUANTIZE_TYPES
from qcore.deploy import Deployment
from qcore.errors import ConfigError
from qcore.graph import open_graph
from qcore.model_io import check_model_output, load_model

from .naming import dynamic_output_names
from .weight_only.config import WeightOnlyConfig
from .weight_only.saved import quant_post_weight_only


def quant_post_dynamic(
    model_dir: str | os.PathLike[str],
    save_model_dir: str | os.PathLike[str],
    model_filename: str | None = None,
    params_filename: str | None = None,
    save_model_filename: str | None = None,
    save_params_filename: str | None = None,
    quantizable_op_type: Sequence[str] = ("conv2d", "mul"),
    weight_bits: int = 8,
    generate_test_model: bool = False,
    weight_quantize_type: str = "channel_wise_abs_max",
    *,
    deploy_backend: str | None = None,
    group_size: int | None = None,
    algo: str | None = None,
    weight_only: WeightOnlyConfig | None = None,
    sample_generator: Callable[[], Iterable[Any]] | None = None,
    batch_generator: Callable[[], Iterable[Any]] | None = None,
    data_loader: Iterable[Any] | None = None,
    batch_size: int = 16,
    batch_nums: int | None = None,
    format: str | None = None,
    calibration: Any = None,
) -> Any:
    """Store the weights of ``quantizable_op_type`` ops as int8/int16 and save the model.

    With both ``save_*_filename`` left None the files are named as the input is (:mod:`qptq.naming`):
    ``*.pdmodel`` in, ``model.pdmodel`` + ``model.pdiparams`` out (PaddleSlim 2.6's names); ``__model__`` in,
    ``__model__`` + ``__params__`` out (the seeds'); PIR in, ``model.json`` + ``model.pdiparams``.
    ``generate_test_model=True`` also writes ``<save_model_dir>/test_model``: the same model with float
    weights that hold the dequantized values (the seeds' "fake quantized" model).
    ``deploy_backend`` (see :mod:`qcore.deploy`) decides how weights the runtime cannot read as int8
    are handled: the default (oneDNN's rules) keeps a legacy ``conv2d_transpose`` float, ``"openvino"``
    stores it int8 read through cast -> multiply.

    Group-wise weight-only quantization of matmuls (LLMs, :mod:`qptq.weight_only`) runs instead when
    ``weight_bits=4``, ``group_size`` or ``algo`` (``"rtn"``, ``"gptq"``) is given, or a whole
    ``weight_only`` config: see :func:`quant_post_weight_only`; ``sample_generator`` / ``batch_generator``
    / ``data_loader`` (``batch_size``, ``batch_nums``) feed its calibration.

    An LLM checkpoint (a ``.gguf`` file, or a PaddleNLP checkpoint directory: ``config.json`` + weights +
    ``tokenizer.json``) goes to :func:`qptq.llm.route.quantize_llm` instead, streamed a decoder layer at a time:
    ``format`` (``"gguf"``, ``"onnxruntime-genai"``, ``"openvino-genai"``) names what to write, ``calibration``
    the text file or token ids GPTQ and clip search need, and ``weight_only`` (or ``weight_bits`` / ``group_size``
    / ``algo``) what to do; the return value is then the route's :class:`~qptq.llm.route.LlmReport`.
    """
    if format is not None or _is_llm_checkpoint(Path(model_dir)):
        return _quantize_llm_checkpoint(Path(model_dir), Path(save_model_dir), format, weight_only, weight_bits,
                                        group_size, algo, calibration)
    if weight_only is not None or weight_bits == 4 or group_size is not None or algo is not None:
        config = weight_only or WeightOnlyConfig(bits=weight_bits, group_size=128 if group_size is None else group_size,
                                                 algo=algo or "rtn")
        return quant_post_weight_only(
            model_dir, save_model_dir, config, model_filename=model_filename, params_filename=params_filename,
            save_model_filename=save_model_filename, save_params_filename=save_params_filename,
            quantizable_op_type=quantizable_op_type, deploy_backend=deploy_backend,
            sample_generator=sample_generator, batch_generator=batch_generator, data_loader=data_loader,
            batch_size=batch_size, batch_nums=batch_nums)[0]
    deployment = Deployment(deploy_backend)
    if isinstance(weight_bits, bool) or not isinstance(weight_bits, int) or weight_bits not in (8, 16):
        raise ConfigError(
            f"weight_bits={weight_bits!r} is not supported; quant_post_dynamic stores int8 or int16 per channel: "
            "use 8 or 16 (or 4: int4 codes per group of input channels of matmul weights)"
        )
    validate_names("quantizable_op_type", quantizable_op_type, WEIGHT_ONLY_OP_TYPES)
    validate_choice("weight_quantize_type", weight_quantize_type, WEIGHT_QUANTIZE_TYPES[:2])
    per_channel = weight_quantize_type == "channel_wise_abs_max"
    graph = open_graph(load_model(model_dir, model_filename, params_filename))
    names = dynamic_output_names(graph.family, save_model_filename, save_params_filename, graph.model.source)
    check_model_output(save_model_dir, graph.family, *names, graph.model.source)
    test_graph = open_graph(load_model(model_dir, model_filename, params_filename)) if generate_test_model else None
    stored = deployment.store_weights(graph, graph.ops(list(quantizable_op_type)), weight_bits, per_channel)
    if test_graph is not None:
        for twin, weight in zip(test_graph.ops(list(quantizable_op_type)), stored):
            if weight is not None:
                test_graph.replace_weight(test_graph.weight_operand(twin), weight.dequantized(), "fake_quantized")
    files = deployment.save(graph, save_model_dir, *names)
    if test_graph is not None:
        test_graph.save(Path(save_model_dir) / "test_model", *names)
    return files


def _is_llm_checkpoint(path: Path) -> bool:
    return path.suffix == ".gguf" or (path / "config.json").is_file()


def _quantize_llm_checkpoint(source: Path, out: Path, format: str | None, weight_only: WeightOnlyConfig | None,
                             weight_bits: int, group_size: int | None, algo: str | None, calibration: Any) -> Any:
    from .llm.route import LLM_FORMATS, quantize_llm

    if format is None:
        format = "gguf" if source.suffix == ".gguf" else None
        if format is None:
            raise ConfigError(f"{source} is an LLM checkpoint directory: say what to write with "
                              "format='onnxruntime-genai' or format='openvino-genai'")
    if format not in LLM_FORMATS:
        raise ConfigError(f"format={format!r} is not written; use one of {sorted(LLM_FORMATS)}")
    grid = LLM_FORMATS[format][1]
    config = weight_only or WeightOnlyConfig(
        bits=weight_bits, group_size=group_size or (32 if grid == "gguf" else 128), algo=algo or "rtn", grid=grid,
        symmetric=grid == "gguf")
    return quantize_llm(source, out, config, calibration, format=format)


#: PaddleSlim's older name for :func:`quant_post_dynamic` (same signature), kept so its scripts run unchanged.
quant_post_only_weight = quant_post_dynamic
