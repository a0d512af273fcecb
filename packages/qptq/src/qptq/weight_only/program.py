"""Weight-only quantization of a saved model's matmuls (either IR), through :func:`.plan.quantize_weights`.

A matmul qualifies when its second operand is a 2-D parameter read as ``[in, out]`` (not transposed) by that
op alone; a tied LM head reading the embedding table transposed is quantized only as the table. Calibration
fetches every qualifying matmul's input in the executor, batch by batch, into one input Hessian per matmul; matmuls
reading the same value share AWQ's scales. With ``embedding_bits``, the tables of the lookups (``embedding`` /
``lookup_table``) get round-to-nearest codes too (:func:`.plan.quantize_tables`), which a tied head reads. The
program's parameters afterwards hold the dequantized weights (the simulation).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import numpy as np

from qcore.errors import ConfigError
from qcore.graph import Graph, OpRef

from .config import WeightOnlyConfig, layer_group
from .hessian import HessianAccumulator
from .plan import WeightOnlyResult, quantize_tables, quantize_weights, table_rows

log = logging.getLogger(__name__)
#: Seed op types whose weight is a matmul's ``[in, out]`` operand.
MATMUL_TYPES = ("mul", "matmul", "matmul_v2")


def weight_matmuls(graph: Graph, config: WeightOnlyConfig, op_types: Iterable[str] = MATMUL_TYPES) -> list[OpRef]:
    """The matmuls whose weight ``config`` quantizes (a bad group size is one error line here)."""
    readers: dict[str, int] = {}
    for op in graph.ops(list(op_types)):
        weight = graph.weight_operand(op)
        if weight is not None:
            readers[weight.name] = readers.get(weight.name, 0) + 1
    found = []
    for op in graph.ops(list(op_types)):
        weight = graph.weight_operand(op)
        if weight is None or len(graph.shape(weight.name)) != 2:
            continue
        if graph.weight_channel_axis(op) != 1 or readers[weight.name] > 1:
            log.info("%r left float: its weight is transposed or shared (a tied LM head)", op)
            continue
        if layer_group(graph.shape(weight.name)[0], config) is not None:
            found.append(op)
    if not found:
        raise ConfigError("the model has no matmul with an [in, out] weight parameter to quantize; weight-only "
                          "quantization takes fc / matmul weights (convs: use quant_post_dynamic's 8-bit path)")
    return found


def quantize_program(graph: Graph, config: WeightOnlyConfig, batches: Iterable[dict[str, np.ndarray]] | None,
                     op_types: Iterable[str] = MATMUL_TYPES, progress: Callable[[str], None] | None = None
                     ) -> WeightOnlyResult:
    """Quantize the weights of ``graph``'s matmuls in place (its parameters hold the simulation)."""
    if config.sequential:
        raise ConfigError("sequential=True calibrates a decoder's layers one after another, which needs them as "
                          "paddle.nn layers (quantize_ on the model, or an LLM checkpoint); a saved program is "
                          "calibrated in one pass: use sequential=False")
    ops = weight_matmuls(graph, config, op_types)
    tables = [] if config.embedding_bits is None else sorted({
        w.name for w in (graph.weight_operand(op) for op in graph.ops(["lookup_table"])) if w is not None
        and layer_group(graph.shape(w.name)[1], config, config.embedding_bits) is not None})  # bad groups fail here
    keys = [graph.weight_operand(op).name for op in ops]  # each read by its op alone
    names = {k: k for k in keys}
    inputs = [graph.activation_operands(op)[0] for op in ops]
    if config.calibrated and batches is None:
        raise ConfigError(f"algo={config.algo!r}{', awq' if config.awq else ''}"
                          f"{', clip_search' if config.clip_search else ''} needs calibration data; pass "
                          "sample_generator, batch_generator or data_loader, or use algo='rtn'")
    hessians = None
    if batches is not None:
        sums = {k: HessianAccumulator(graph.shape(names[k])[0]) for k in keys}
        with graph.test_mode():
            for feed in batches:
                for k, value in zip(keys, graph.run(feed, [i.value for i in inputs])):
                    sums[k].update(value)
        hessians = {k: acc.hessian() for k, acc in sums.items()}
    by_input: dict[str, list[str]] = {}
    for k, operand in zip(keys, inputs):
        by_input.setdefault(operand.name, []).append(k)
    weights = {k: graph.get_param(names[k]).astype(np.float64) for k in keys}
    result, effective = quantize_weights(weights, names, hessians, list(by_input.values()), config, progress)
    for t in quantize_tables({t: graph.get_param(t) for t in tables}, {t: t for t in tables}, config, result):
        effective[t] = table_rows(result.codes[t])
    for k, value in effective.items():
        graph.set_param(k, value.astype(np.float32))
    return result
