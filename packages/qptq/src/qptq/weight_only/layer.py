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

from qcore.errors import ConfigError, DataError

from .config import WeightOnlyConfig, layer_group
from .hessian import HessianAccumulator
from .plan import WeightOnlyResult, quantize_tables, quantize_weights


def _linears(model: Any, skip: Sequence[str]) -> list[tuple[str, Any]]:
    import paddle

    found = [(name, layer) for name, layer in model.named_sublayers()
             if isinstance(layer, paddle.nn.Linear) and not any(re.search(p, name) for p in skip)]
    if not found:
        raise ConfigError("the model has no paddle.nn.Linear outside the skip patterns; nothing to quantize "
                          "(weight-only quantization takes Linear layers)")
    return found


def _calibrate(model: Any, linears: list[tuple[str, Any]], batches: Iterable[Any],
               run: Callable[[Any, Any], Any]) -> tuple[dict[str, HessianAccumulator], list[list[str]]]:
    """Input Hessians of every linear over ``batches``, and the linears that read one tensor (by first batch)."""
    import paddle

    sums = {name: HessianAccumulator(int(layer.weight.shape[0])) for name, layer in linears}
    readers: dict[int, list[str]] = {}
    held: list[Any] = []  # the first batch's inputs stay alive, so that no two of them share an id
    first = [True]

    def hook(name: str) -> Callable[[Any, tuple[Any, ...]], None]:
        def pre(layer: Any, inputs: tuple[Any, ...]) -> None:
            sums[name].update(inputs[0].numpy())
            if first[0]:
                readers.setdefault(id(inputs[0]), []).append(name)
                held.append(inputs[0])
        return pre

    handles = [layer.register_forward_pre_hook(hook(name)) for name, layer in linears]
    try:
        with paddle.no_grad():
            for batch in batches:
                run(model, batch)
                first[0] = False
                held.clear()
    finally:
        for handle in handles:
            handle.remove()
    unused = [name for name, acc in sums.items() if not acc.rows]
    if len(unused) == len(sums):
        raise DataError("the calibration batches reached no linear layer; check that they are the model's inputs")
    if unused:
        raise DataError(f"the calibration batches never reached {unused[0]!r} ({len(unused)} linears in all); "
                        "pass batches that run every layer, or skip those layers")
    return sums, list(readers.values())


def _quantize_linears(linears: list[tuple[str, Any]], hessians: dict[str, np.ndarray] | None,
                      shared: list[list[str]], config: WeightOnlyConfig, progress: Callable[[str], None] | None
                      ) -> WeightOnlyResult:
    """Codes of ``linears`` (:func:`.plan.quantize_weights`); each linear's weight then holds the simulation."""
    import paddle

    weights = {n: layer.weight.numpy().astype(np.float64) for n, layer in linears}
    result, effective = quantize_weights(weights, {n: layer.weight.name for n, layer in linears}, hessians,
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


def _quantize_sequential(model: Any, linears: list[tuple[str, Any]], config: WeightOnlyConfig,
                         calibration: Iterable[Any], run: Callable[[Any, Any], Any],
                         progress: Callable[[str], None] | None) -> WeightOnlyResult:
    """Sequential GPTQ order (Frantar et al.; NNCF's layer-wise engine): decoder layer ``i``'s Hessians come from
    the outputs of layers ``0..i-1`` already quantized. One float pass records each layer's inputs (the hidden
    state of the first, the other arguments of every layer: positions, masks), then each layer is calibrated on
    its quantized predecessors' outputs, quantized, and run again to give the next one its inputs. Linears
    outside the layers (an untied LM head) keep Hessians from the float pass. Mixed precision (``ratio``) applies
    within each layer."""
    import paddle

    blocks = decoder_blocks(model)
    inside = [{id(sub) for sub in block.sublayers()} for block in blocks]
    outside = [(n, layer) for n, layer in linears if not any(id(layer) in ids for ids in inside)]
    arguments: list[list[tuple[Any, ...]]] = [[] for _ in blocks]

    def record(i: int) -> Callable[[Any, tuple[Any, ...]], None]:
        def pre(layer: Any, inputs: tuple[Any, ...]) -> None:
            arguments[i].append(inputs if i == 0 else (None, *inputs[1:]))  # later hidden states: recomputed
        return pre

    handles = [block.register_forward_pre_hook(record(i)) for i, block in enumerate(blocks)]
    try:
        if outside:
            sums, outside_shared = _calibrate(model, outside, calibration, run)
            outside_hessians = {name: acc.hessian() for name, acc in sums.items()}
        else:
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
        mine = [(n, layer) for n, layer in linears if id(layer) in ids]
        if mine:
            sums, shared = _calibrate(block, mine, batches, lambda layer, a: layer(*a))
            _merge(result, _quantize_linears(mine, {n: acc.hessian() for n, acc in sums.items()}, shared, config,
                                             progress))
        with paddle.no_grad():
            hidden = [_hidden(block(*b)) for b in batches]
    if outside:
        _merge(result, _quantize_linears(outside, outside_hessians, outside_shared, config, progress))
    return result


def _merge(into: WeightOnlyResult, part: WeightOnlyResult) -> None:
    into.codes.update(part.codes)
    into.input_scales.update(part.input_scales)
    into.layers.extend(part.layers)


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
    linears = [(n, layer) for n, layer in _linears(model, config.skip)
               if layer_group(int(layer.weight.shape[0]), config) is not None]  # a bad group fails here
    tables = {} if config.embedding_bits is None else {
        n: layer for n, layer in model.named_sublayers()
        if isinstance(layer, paddle.nn.Embedding) and not any(re.search(p, n) for p in config.skip)
        and layer_group(int(layer.weight.shape[1]), config, config.embedding_bits) is not None}
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
            sums, shared = _calibrate(model, linears, calibration, run)
            hessians = {name: acc.hessian() for name, acc in sums.items()}
        result = _quantize_linears(linears, hessians, shared, config, progress)
    if tables:
        dequantized = quantize_tables({n: t.weight.numpy() for n, t in tables.items()},
                                      {n: t.weight.name for n, t in tables.items()}, config, result)
        for n, value in dequantized.items():
            tables[n].weight.set_value(paddle.to_tensor(value.astype(np.float32)))
    result.seconds = time.perf_counter() - start
    return result
