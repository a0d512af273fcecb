"""Weight-only quantization of a ``paddle.nn.Layer`` in one call: ``quantize_(model, WeightOnlyConfig(...),
calibration)``.

Every ``paddle.nn.Linear`` (``[in, out]`` weight) whose name does not match ``skip`` gets group-wise codes
(:func:`.plan.quantize_weights`). Calibration runs the float model once over the given batches with a
pre-hook on each linear summing its input Hessian (memory: one ``[in, in]`` float64 matrix per linear, flat
in the number of batches); round to nearest needs none. Every input Hessian comes from the float model (the
linears are not re-run one after another on quantized predecessors, as GPTQ's reference implementation does).

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
    shared: list[list[str]] = [[name] for name, _ in linears]
    hessians = None
    if calibration is not None:
        sums, shared = _calibrate(model, linears, calibration, run)
        hessians = {name: acc.hessian() for name, acc in sums.items()}
    by_name = dict(linears)
    weights = {n: layer.weight.numpy().astype(np.float64) for n, layer in linears}
    result, effective = quantize_weights(weights, {n: layer.weight.name for n, layer in linears}, hessians,
                                         shared, config, progress)
    for n, value in effective.items():
        by_name[n].weight.set_value(paddle.to_tensor(value.astype(np.float32)))
    if tables:
        dequantized = quantize_tables({n: t.weight.numpy() for n, t in tables.items()},
                                      {n: t.weight.name for n, t in tables.items()}, config, result)
        for n, value in dequantized.items():
            tables[n].weight.set_value(paddle.to_tensor(value.astype(np.float32)))
    result.seconds = time.perf_counter() - start
    return result
