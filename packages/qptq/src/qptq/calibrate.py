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
from qcore.onednn import clipping_avg_pools, pooled_residual_outputs, residual_fusions

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
    activations: list[Operand]  # the ones to quantize: all the op reads, or fewer
    # the conv this op is quantized for (oneDNN computes the add in it, or it writes the pool's input): only with it
    for_conv: OpRef | None = None
    runs_float: bool = False  # only its input is quantized (for the op writing it); oneDNN runs the op float


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


def residual_adds(graph: Graph, targets: list[Target], skip_patterns: Iterable[str] = ()) -> list[Target]:
    """The residual joins (``elementwise_add`` of two activations) to quantize along with ``targets``.

    Legacy programs (Paddle Inference's oneDNN int8 path): the adds oneDNN computes inside a conv
    of ``targets`` (:func:`qcore.onednn.residual_fusions`), with only their residual input; its
    scale keeps the fused conv int8 end to end. oneDNN never rounds the conv's own output and
    runs other adds in float, so quantizing more would only make the simulation differ from
    what deploys. PIR programs: both inputs of every residual join (TensorRT's int8 adds).
    """
    adds = [
        t for t in find_targets(graph, ["elementwise_add"], skip_patterns)
        if len(t.activations) == 2 and graph.added_param(t.op) is None
    ]
    if graph.family != "legacy":
        return adds
    by_op = {id(t.op.raw): t for t in adds}
    convs = {id(t.op.raw) for t in targets}
    return [
        Target(fusion.add, None, [a for a in by_op[id(fusion.add.raw)].activations if a.name == fusion.residual],
               for_conv=fusion.conv)
        for fusion in residual_fusions(graph)
        if id(fusion.add.raw) in by_op and id(fusion.conv.raw) in convs
    ]  # fmt: skip


def residual_output_pools(graph: Graph, targets: list[Target]) -> list[Target]:
    """The pools whose input to quantize so the fused residual convs of ``targets`` writing it run int8.

    Legacy programs (:func:`qcore.onednn.pooled_residual_outputs`); the pools themselves run float.
    """
    convs = {id(t.op.raw) for t in targets}
    read = [a.name for t in targets for a in t.activations]
    return [
        Target(pool, None, graph.activation_operands(pool), for_conv=found.fusion.conv, runs_float=True)
        for found in pooled_residual_outputs(graph, read)
        if id(found.fusion.conv.raw) in convs
        for pool in found.pools
    ]


def avg_pool_fixes(graph: Graph, targets: list[Target], keep_float: bool) -> tuple[list[Target], set[str]]:
    """Keep Paddle Inference's int8 average pools from clipping the inputs of ``targets``.

    An int8 pool whose input has no scale of its own quantizes it with its output's narrower
    scale (:func:`qcore.onednn.clipping_avg_pools`). Returns the targets that quantize such
    pools' inputs, so the pool runs with the input's range, and, when ``keep_float``, the
    vars global pools take their scale from instead (their outputs, or a reshape of them):
    the ops reading one value per channel gain nothing from int8 and are better left float.
    """
    read = {a.name for t in targets for a in t.activations}
    pools = clipping_avg_pools(graph, read)
    kept_float = [p for p in pools if p.is_global and keep_float]
    extra = [Target(p.op, None, graph.activation_operands(p.op)) for p in pools if p not in kept_float]
    return extra, {p.scale_from for p in kept_float}


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
