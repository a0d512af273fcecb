"""Dynamic (weight-only) post-training quantization.

Weights of the chosen ops are stored as int8 (or int16) with per-channel scales and read
through a dequantize step, so the model file shrinks to about 1/4 (1/2) and the output runs
in the executor and in ``paddle.inference`` on CPU. Activations stay in float.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from qcore.config import validate_choice
from qcore.constants import WEIGHT_QUANTIZE_TYPES
from qcore.errors import ConfigError
from qcore.graph import open_graph
from qcore.model_io import ModelFiles, load_model
from qcore.onednn import INT8_WEIGHT_UNSUPPORTED

from .naming import output_names

log = logging.getLogger(__name__)
DYNAMIC_OP_TYPES = ("conv2d", "depthwise_conv2d", "mul", "conv2d_transpose", "matmul", "matmul_v2")


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
) -> ModelFiles:
    """Store the weights of ``quantizable_op_type`` ops as int8/int16 and save the model.

    ``generate_test_model=True`` also writes ``<save_model_dir>/test_model``: the same model
    with float weights that hold the dequantized values (the seeds' "fake quantized" model).
    """
    if weight_bits not in (8, 16) or isinstance(weight_bits, bool):
        raise ConfigError(
            f"weight_bits={weight_bits!r} is not supported; quant_post_dynamic stores int8 or int16: use 8 or 16"
        )
    for op_type in quantizable_op_type:
        validate_choice("quantizable_op_type", op_type, DYNAMIC_OP_TYPES)
    validate_choice("weight_quantize_type", weight_quantize_type, WEIGHT_QUANTIZE_TYPES[:2])
    per_channel = weight_quantize_type == "channel_wise_abs_max"
    graph = open_graph(load_model(model_dir, model_filename, params_filename))
    test_graph = open_graph(load_model(model_dir, model_filename, params_filename)) if generate_test_model else None
    ops = graph.ops(list(quantizable_op_type))
    twins = test_graph.ops(list(quantizable_op_type)) if test_graph is not None else [None] * len(ops)
    for op, twin in zip(ops, twins):
        weight = graph.weight_operand(op)
        if weight is None:
            continue
        if graph.family == "legacy" and op.seed_type in INT8_WEIGHT_UNSUPPORTED:
            log.warning("%r left in float: %s", op, INT8_WEIGHT_UNSUPPORTED[op.seed_type])
            continue
        stored = graph.quantize_weight(weight, weight_bits, graph.weight_channel_axis(op) if per_channel else None)
        if test_graph is not None:
            test_graph.replace_weight(test_graph.weight_operand(twin), stored.dequantized(), "fake_quantized")
    names = output_names(graph.family, save_model_filename, save_params_filename)
    files = graph.save(save_model_dir, *names)
    if test_graph is not None:
        test_graph.save(Path(save_model_dir) / "test_model", *names)
    return files
