"""One calibration pass: run the float model over the data, keep only mergeable statistics.

Every activation the quantized ops read gets a :class:`~qcore.observers.HistogramObserver`
(its histogram also tracks the per-batch abs max), so memory does not grow with the number of
batches and every threshold algorithm can be scored from the same pass.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from qcore.errors import DataError
from qcore.graph import Graph, Operand, OpRef
from qcore.observers import HistogramObserver
from qcore.onednn import clipping_avg_pools

from .bias_correction import ChannelMean

try:
    from tqdm import tqdm
except ImportError:  # pragma: no cover - tqdm is a declared dependency
    tqdm = None


@dataclass
class Target:
    """One op to quantize: its weight (if any) and the activations it reads."""

    op: OpRef
    weight: Operand | None
    activations: list[Operand]


@dataclass
class Calibration:
    """Observers by activation name, plus how many batches and samples they saw."""

    observers: dict[str, HistogramObserver] = field(default_factory=dict)
    channel_means: dict[str, ChannelMean] = field(default_factory=dict)
    batches: int = 0
    samples: int = 0


def find_targets(graph: Graph, op_types: Iterable[str], skip_patterns: Iterable[str] = ()) -> list[Target]:
    """Every op of ``op_types`` not skipped, with its weight and activation operands."""
    return [
        Target(op, graph.weight_operand(op), graph.activation_operands(op))
        for op in graph.ops(list(op_types), skip_patterns=list(skip_patterns))
    ]


def residual_adds(graph: Graph, skip_patterns: Iterable[str] = ()) -> list[Target]:
    """Every ``elementwise_add`` of two activations (a residual join, not a bias add).

    Quantizing its inputs gives Paddle Inference's oneDNN pass the scales it needs to fuse the
    add into the preceding int8 conv ("conv with residual connection") and keep the chain int8.
    """
    return [
        t for t in find_targets(graph, ["elementwise_add"], skip_patterns)
        if len(t.activations) == 2 and graph.added_param(t.op) is None
    ]


def avg_pool_fixes(graph: Graph, targets: list[Target], keep_float: bool) -> tuple[list[Target], set[str]]:
    """Keep Paddle Inference's int8 average pools from clipping the inputs of ``targets``.

    An int8 pool whose input has no scale of its own quantizes it with its output's narrower
    scale (:func:`qcore.onednn.clipping_avg_pools`). Returns the targets that quantize such
    pools' inputs, so the pool runs with the input's range, and, when ``keep_float``, the
    outputs of global pools instead: the ops reading one value per channel gain nothing from
    int8 and are better left float.
    """
    read = {a.name for t in targets for a in t.activations}
    pools = clipping_avg_pools(graph, read)
    float_inputs = {p.output for p in pools if p.is_global and keep_float}
    extra = [Target(p.op, None, graph.activation_operands(p.op)) for p in pools if p.output not in float_inputs]
    return extra, float_inputs


def calibrate(
    graph: Graph,
    targets: list[Target],
    batches: Iterable[dict[str, np.ndarray]],
    *,
    progress: bool = False,
    channel_means: dict[str, ChannelMean] | None = None,
) -> Calibration:
    """Run ``graph`` over ``batches`` and observe every target activation.

    ``channel_means`` (by activation name) are updated in the same pass (for bias correction).
    """
    unique: dict[str, Operand] = {}
    for target in targets:
        for operand in target.activations:
            unique.setdefault(operand.name, operand)
    names = list(unique)
    result = Calibration({n: HistogramObserver() for n in names}, dict(channel_means or {}))
    fetch = [unique[n].value for n in names]
    iterator = tqdm(batches, desc="calibrating", unit="batch", disable=not progress) if tqdm else batches
    for feed in iterator:
        values = _run(graph, feed, fetch)
        for name, value in zip(names, values):
            try:
                result.observers[name].update(value)
            except DataError as exc:
                raise DataError(f"activation {name!r} at batch {result.batches}: {exc}") from None
            if name in result.channel_means:
                result.channel_means[name].update(value)
        result.batches += 1
        result.samples += len(next(iter(feed.values())))
    return result


def _run(graph: Graph, feed: dict[str, np.ndarray], fetch: list) -> list[np.ndarray]:
    try:
        return graph.run(feed, fetch) if fetch else []
    except Exception as exc:  # Paddle reports shape/dtype problems as bare runtime errors
        shapes = {k: (tuple(v.shape), str(v.dtype)) for k, v in feed.items()}
        first = next((line for line in str(exc).splitlines() if "Error" in line), str(exc)[:200]).strip()
        raise DataError(
            f"the model could not run on a calibration batch with feeds {shapes} ({first}); "
            "check the batch shapes and dtypes against the model's inputs"
        ) from exc
