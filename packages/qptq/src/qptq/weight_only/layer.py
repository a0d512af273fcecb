"""Weight-only quantization of a ``paddle.nn.Layer`` in one call: ``quantize_(model, WeightOnlyConfig(...),
calibration)``.

Every ``paddle.nn.Linear`` (``[in, out]`` weight) whose name does not match ``skip`` gets group-wise codes
(:func:`.plan.quantize_weights`). Calibration runs the float model once over the given batches with a
pre-hook on each linear summing its input Hessian (memory: one ``[in, in]`` float64 matrix per linear, flat
in the number of batches); round to nearest needs none. Every input Hessian comes from the float model, unless
``config.sequential``: then a decoder's layers are calibrated one after another on the outputs of the layers
already quantized, as GPTQ's reference implementation does (:func:`_quantize_sequential`).

With ``embedding_bits``, every ``paddle.nn.Embedding`` table outside ``skip`` gets round-to-nearest codes too
(:func:`.plan.quantize_tables`); an LM head reading the table (tied) computes with the same dequantized values.

The layer afterwards computes the simulation: each linear's weight holds the dequantized codes (divided by
its AWQ scales), each quantized table its dequantized rows, and :data:`WeightOnlyResult.codes` keeps the codes
by weight name for the ONNX writers (:func:`qcore.export.nbits.replace_matmuls`). The model is changed in place,
as ``torchao.quantize_`` does.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from qcore.distributed import all_gather, all_reduce_array
from qcore.errors import ConfigError, DataError

from .config import WeightOnlyConfig, layer_group
from .hessian import HessianAccumulator, InputRange
from .plan import WeightOnlyResult, quantize_tables, quantize_weights, table_rows


def selected_linears(named: Iterable[tuple[str, Any]], config: WeightOnlyConfig) -> list[tuple[str, Any]]:
    """The ``paddle.nn.Linear`` of ``named`` (name, sublayer) that ``config`` quantizes: outside its ``skip``
    patterns, with a group its fallback does not leave float (a bad group fails here, in one line)."""
    import paddle

    return [(name, layer) for name, layer in named
            if isinstance(layer, paddle.nn.Linear) and not any(re.search(p, name) for p in config.skip)
            and layer_group(int(layer.weight.shape[0]), config) is not None]


def quantizes_table(name: str, width: int, config: WeightOnlyConfig) -> bool:
    """Whether ``config.embedding_bits`` quantizes the table ``name`` of rows ``width`` wide."""
    return (config.embedding_bits is not None and not any(re.search(p, name) for p in config.skip)
            and layer_group(width, config, config.embedding_bits) is not None)


def selected_tables(named: Iterable[tuple[str, Any]], config: WeightOnlyConfig) -> dict[str, Any]:
    """The ``paddle.nn.Embedding`` of ``named`` whose tables ``config.embedding_bits`` quantizes."""
    import paddle

    return {name: layer for name, layer in named if isinstance(layer, paddle.nn.Embedding)
            and quantizes_table(name, int(layer.weight.shape[1]), config)}


def calibrate_linears(model: Any, linears: list[tuple[str, Any]], batches: Iterable[Any],
                      run: Callable[[Any, Any], Any]) -> tuple[dict[str, np.ndarray], list[list[str]]]:
    """Exact input Hessians of every linear over ``batches`` (:mod:`.hessian`: a pass for each input channel's
    range, a pass for the sums), added over the ranks of ``paddle.distributed`` when there are several (each
    passes its share of the batches), and the linears that read one tensor (by the first batch), which share
    one Hessian (one array, summed once)."""
    batches = batches if isinstance(batches, Sequence) else list(batches)
    spans = {name: InputRange(int(layer.weight.shape[0])) for name, layer in linears}
    readers: dict[int, list[str]] = {}
    held: list[Any] = []  # the first batch's inputs stay alive, so that no two of them share an id

    def first_pass(name: str, first: list[bool]) -> Callable[[Any, np.ndarray], None]:
        def record(inputs: Any, x: np.ndarray) -> None:
            spans[name].update(x)
            if first[0]:
                readers.setdefault(id(inputs), []).append(name)
                held.append(inputs)
        return record

    first = [True]
    _run_hooked(model, linears, batches, run, lambda name: first_pass(name, first), first, held)
    rows = dict(zip(spans, np.sum(all_gather([s.rows for s in spans.values()], "calibration rows"), axis=0)))
    unused = [name for name in spans if not rows[name]]
    if len(unused) == len(spans):
        raise DataError("the calibration batches reached no linear layer; check that they are the model's inputs")
    if unused:
        raise DataError(f"the calibration batches never reached {unused[0]!r} ({len(unused)} linears in all); "
                        "pass batches that run every layer, or skip those layers")
    groups = list(readers.values())
    sums = {}
    for group in groups:  # one range and one sum per input tensor
        span = spans[group[0]]
        span.absmax = all_reduce_array(span.absmax, "max", f"the input range of {group[0]}")
        span.rows = int(rows[group[0]])
        sums[group[0]] = HessianAccumulator(span.absmax.shape[0], span)
    readers_of = [(name, layer) for name, layer in linears if name in sums]
    _run_hooked(model, readers_of, batches, run, lambda name: lambda inputs, x: sums[name].update(x), [False], [])
    hessians = {}
    for group in groups:
        acc = sums.pop(group[0])
        acc.sum = all_reduce_array(acc.sum, "sum", f"the input Hessian of {group[0]}")
        acc.rows = spans[group[0]].rows
        hessians.update(dict.fromkeys(group, acc.hessian()))
    return hessians, groups


def _run_hooked(model: Any, linears: list[tuple[str, Any]], batches: Sequence[Any], run: Callable[[Any, Any], Any],
                hook: Callable[[str], Callable[[Any, np.ndarray], None]], first: list[bool], held: list[Any]) -> None:
    """Run ``model`` over ``batches`` with ``hook(name)(input, input as numpy)`` on each linear's input."""
    import paddle

    def pre(name: str) -> Callable[[Any, tuple[Any, ...]], None]:
        call = hook(name)
        return lambda layer, inputs: call(inputs[0], inputs[0].numpy())

    handles = [layer.register_forward_pre_hook(pre(name)) for name, layer in linears]
    try:
        with paddle.no_grad():
            for batch in batches:
                run(model, batch)
                first[0] = False
                held.clear()
    finally:
        for handle in handles:
            handle.remove()


def quantize_linears(linears: list[tuple[str, Any]], hessians: dict[str, np.ndarray] | None,
                      shared: list[list[str]], config: WeightOnlyConfig, progress: Callable[[str], None] | None,
                      names: Callable[[str, Any], str] | None = None) -> WeightOnlyResult:
    """Codes of ``linears`` (:func:`.plan.quantize_weights`); each linear's weight then holds the simulation.
    ``names(name, layer)``: the weight's name in the result (default: its Paddle parameter name)."""
    import paddle

    weights = {n: layer.weight.numpy() for n, layer in linears}
    label = names or (lambda n, layer: layer.weight.name)
    result, effective = quantize_weights(weights, {n: label(n, layer) for n, layer in linears}, hessians,
                                         shared, config, progress)
    by_name = dict(linears)
    for n, value in effective.items():
        by_name[n].weight.set_value(paddle.to_tensor(value.astype(np.float32)))
    return result


def decoder_blocks(model: Any) -> list[Any]:
    """The model's decoder layers: its longest ``paddle.nn.LayerList`` (one line when it has none)."""
    import paddle

    lists = [layer for _, layer in model.named_sublayers() if isinstance(layer, paddle.nn.LayerList)]
    if not lists:
        raise ConfigError("sequential=True quantizes a decoder's layers one after another; the model has no "
                          "paddle.nn.LayerList of layers (use sequential=False)")
    return list(max(lists, key=len))


def _hidden(output: Any) -> Any:
    """A block's hidden state: its output, or the first of its outputs."""
    return output[0] if isinstance(output, (tuple, list)) else output


def call_block(block: Any, arguments: tuple[Any, ...]) -> Any:
    return block(*arguments)


def _outputs(block: Any, batches: Sequence[tuple[Any, ...]]) -> list[Any]:
    import paddle

    with paddle.no_grad():
        return [_hidden(block(*arguments)) for arguments in batches]


def quantize_block(block: Any, linears: list[tuple[str, Any]], batches: Sequence[tuple[Any, ...]],
                   config: WeightOnlyConfig, progress: Callable[[str], None] | None = None, *,
                   names: Callable[[str, Any], str] | None = None) -> tuple[WeightOnlyResult, list[Any]]:
    """Quantize ``linears`` (named sublayers of ``block``) from exact Hessians of ``block(*arguments)`` over
    ``batches`` (summed over the ranks), and return the codes and ``block``'s hidden state for each batch: the
    quantized block's outputs when ``config.sequential`` (GPTQ's order), else the float block's. The unit of
    sequential and layer-by-layer quantization (:func:`_quantize_sequential`, :mod:`qptq.llm.streaming`)."""
    start = time.perf_counter()
    float_outputs = None if config.sequential else _outputs(block, batches)
    result = WeightOnlyResult()
    if linears:
        hessians, shared = calibrate_linears(block, linears, batches, call_block)
        middle = time.perf_counter()
        result = quantize_linears(linears, hessians, shared, config, progress, names)
        result.math_seconds = time.perf_counter() - middle
    outputs = float_outputs if float_outputs is not None else _outputs(block, batches)
    result.calibration_seconds = time.perf_counter() - start - result.math_seconds
    return result, outputs


def _quantize_sequential(model: Any, linears: list[tuple[str, Any]], config: WeightOnlyConfig,
                         calibration: Iterable[Any], run: Callable[[Any, Any], Any],
                         progress: Callable[[str], None] | None) -> WeightOnlyResult:
    """Sequential GPTQ order (Frantar et al.; NNCF's layer-wise engine): decoder layer ``i``'s Hessians come from
    the outputs of layers ``0..i-1`` already quantized (:func:`quantize_block`). One float pass records each
    layer's inputs (the hidden state of the first, the other arguments of every layer: positions, masks). Linears
    outside the layers (an untied LM head) are calibrated last, on the model with its layers quantized. Mixed
    precision (``ratio``) applies within each layer."""
    import paddle

    blocks = decoder_blocks(model)
    inside = [{id(sub) for sub in block.sublayers()} for block in blocks]
    outside = [(n, layer) for n, layer in linears if not any(id(layer) in ids for ids in inside)]
    arguments: list[list[tuple[Any, ...]]] = [[] for _ in blocks]
    calibration = calibration if isinstance(calibration, Sequence) else list(calibration)

    def record(i: int) -> Callable[[Any, tuple[Any, ...]], None]:
        def pre(layer: Any, inputs: tuple[Any, ...]) -> None:
            arguments[i].append(inputs if i == 0 else (None, *inputs[1:]))  # later hidden states: recomputed
        return pre

    handles = [block.register_forward_pre_hook(record(i)) for i, block in enumerate(blocks)]
    try:
        with paddle.no_grad():
            for batch in calibration:
                run(model, batch)
    finally:
        for handle in handles:
            handle.remove()
    if not arguments[0]:
        raise DataError("the calibration batches reached no decoder layer; check that they are the model's inputs")
    result = WeightOnlyResult()
    hidden = [args[0] for args in arguments[0]]
    for block, ids, args in zip(blocks, inside, arguments):
        batches = [(h, *rest[1:]) for h, rest in zip(hidden, args)]
        part, hidden = quantize_block(block, [(n, layer) for n, layer in linears if id(layer) in ids], batches,
                                      config, progress)
        merge_results(result, part)
    if outside:
        hessians, shared = calibrate_linears(model, outside, calibration, run)
        merge_results(result, quantize_linears(outside, hessians, shared, config, progress))
    return result


def merge_results(into: WeightOnlyResult, part: WeightOnlyResult) -> None:
    into.codes.update(part.codes)
    into.input_scales.update(part.input_scales)
    into.layers.extend(part.layers)
    into.calibration_seconds += part.calibration_seconds
    into.math_seconds += part.math_seconds


def _default_run(model: Any, batch: Any) -> Any:
    import paddle

    items = batch if isinstance(batch, (list, tuple)) else (batch,)
    return model(*(paddle.to_tensor(x) if isinstance(x, np.ndarray) else x for x in items))


def quantize_(model: Any, config: WeightOnlyConfig, calibration: Iterable[Any] | None = None, *,
              run: Callable[[Any, Any], Any] = _default_run, progress: Callable[[str], None] | None = None
              ) -> WeightOnlyResult:
    """Quantize the weights of ``model``'s linears in place; return the codes and a report.

    ``calibration``: batches of the model's inputs (arrays or tensors; a tuple per batch for several inputs),
    needed by GPTQ, AWQ and clip search; ``run(model, batch)`` calls the model on one.
    """
    import paddle

    start = time.perf_counter()
    if not any(isinstance(layer, paddle.nn.Linear) and not any(re.search(p, n) for p in config.skip)
               for n, layer in model.named_sublayers()):
        raise ConfigError("the model has no paddle.nn.Linear outside the skip patterns; nothing to quantize "
                          "(weight-only quantization takes Linear layers)")
    linears = selected_linears(model.named_sublayers(), config)
    tables = selected_tables(model.named_sublayers(), config)
    if config.calibrated and calibration is None:
        raise ConfigError(f"algo={config.algo!r}{', awq' if config.awq else ''}"
                          f"{', clip_search' if config.clip_search else ''} needs calibration batches; pass "
                          "calibration=... (a few hundred sequences) or use algo='rtn'")
    if config.sequential and calibration is not None:
        result = _quantize_sequential(model, linears, config, calibration, run, progress)
    else:
        shared: list[list[str]] = [[name] for name, _ in linears]
        hessians = None
        if calibration is not None:
            hessians, shared = calibrate_linears(model, linears, calibration, run)
        middle = time.perf_counter()
        result = quantize_linears(linears, hessians, shared, config, progress)
        result.calibration_seconds, result.math_seconds = middle - start, time.perf_counter() - middle
    if tables:
        for n in quantize_tables({n: t.weight.numpy() for n, t in tables.items()},
                                 {n: t.weight.name for n, t in tables.items()}, config, result):
            tables[n].weight.set_value(paddle.to_tensor(table_rows(result.codes[tables[n].weight.name])))
    result.seconds = time.perf_counter() - start
    return result
