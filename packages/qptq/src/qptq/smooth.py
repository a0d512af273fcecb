"""Activation smoothing (SmoothQuant, Xiao et al. 2023), applied where it lowers the layer output error.

A matmul input with a few large channels (transformer LayerNorm and GELU outputs) gets one coarse
per-tensor grid. Dividing its channel ``j`` by ``s_j`` and multiplying row ``j`` of every weight that
reads it by ``s_j`` leaves the float model unchanged (``(x / s) (s W) = x W``) and moves the spread
into the weights, which are quantized per output channel. With
``s_j = max|x_j| ** alpha / max_k |W_jk| ** (1 - alpha)`` (the max over every reader's row ``j``), the
strength ``alpha`` is chosen per activation among :data:`ALPHAS` and "off" (unless one divides the error by
:data:`MIN_GAIN`) by the readers' output error
with both operands quantized, ``sum ||op(Q(x / s), Qw(s W)) - op(x, W)||^2 / ||op(x, W)||^2`` on the
samples calibration keeps, each candidate at its best threshold (of :data:`SCORED_ALGOS`) on the deployment grid.
The division is a multiply by ``1 / s`` inserted before the readers (:meth:`qcore.graph.Graph.scale_activation`);
runtimes fuse it into the quantize step that follows.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import paddle

from qcore.deploy import OpTarget
from qcore.graph import Graph
from qcore.graph.replay import replayable
from qcore.model_io import Model
from qcore.observers import HistogramObserver
from qcore.optable import FC, kind_of
from qcore.paddle_env import cpu_threads, eager_mode
from qcore.quant import fake_quantize
from qcore.thresholds import search_threshold

from .auto import ReplayedLayer, fake_quantize_grid, scored_rows, squared_relative_error
from .calibrate import first_rows, stacked_by_shape
from .sharded import calibrate_sharded

if TYPE_CHECKING:
    from .config import PTQConfig

log = logging.getLogger(__name__)

#: Smoothing strengths tried per activation (besides leaving it as it is).
ALPHAS = (0.25, 0.5, 0.75, 0.9)
#: Smoothing applies only where it divides the error by at least this much: the multiply it adds runs on every
#: inference (transformer LayerNorm / GELU outputs: 2 to 5x; a CNN's fc input: about 1.2x, left alone).
MIN_GAIN = 1.5
#: The thresholds each candidate is scored at (the final one is ``auto``'s choice among every algo).
SCORED_ALGOS = ("abs_max", "hist", "mse")
#: ``(threshold, lo, hi) -> (threshold, offset)``: the grid an activation seen over ``[lo, hi]`` deploys with.
Grid = Callable[[float, float, float], tuple[float, float]]


@dataclass(frozen=True)
class Smoothing:
    """The choice for one activation: ``alpha`` (None: left as it is) and the error of every candidate."""

    activation: str
    alpha: float | None
    errors: dict[str, float]
    factors: np.ndarray | None = None  # s (the activation is divided by it, the weight rows multiplied)


def smoothable(graph: Graph, targets: Sequence[OpTarget]) -> dict[str, list[OpTarget]]:
    """Activations read by weighted matmul-kind targets with 2-D weights, with those readers (in program
    order); an activation also read by another kind of weighted target (a conv), or by a matmul whose weight
    another op reads too (an LM head tied to the embedding table: scaling its rows would scale the lookup),
    is left out."""
    weight_readers = Counter(w.name for op in graph.ops() if (w := graph.weight_operand(op)) is not None)
    groups: dict[str, list[OpTarget]] = {}
    other: set[str] = set()
    for target in targets:
        if target.weight is None or len(target.activations) != 1:
            continue
        name = target.activations[0].name
        fits = (kind_of(target.op.seed_type) is FC and replayable(graph, target.op)
                and graph.get_param(target.weight.name).ndim == 2 and weight_readers[target.weight.name] == 1)
        (groups.setdefault(name, []).append(target) if fits else other.add(name))
    return {name: readers for name, readers in groups.items() if name not in other}


def choose_smoothing(
    graph: Graph,
    groups: dict[str, list[OpTarget]],
    samples: dict[str, list[np.ndarray]],
    *,
    weight_bits: int,
    activation_bits: int,
    grid: Grid,
    hist_percent: float = 0.99999,
) -> list[Smoothing]:
    """The smoothing of every activation in ``groups`` that has kept samples (see the module doc)."""
    choices = []
    with eager_mode(), cpu_threads(), paddle.no_grad():
        for name, readers in groups.items():
            kept = samples.get(name)
            if not kept:
                continue
            stacks = stacked_by_shape(kept)  # scored on the largest stack, channel maxima from all
            layers = [_Reader(graph, t) for t in readers]
            x = first_rows(stacks[0], scored_rows(layers))
            references = [layer.run(x) for layer in layers]
            x_max = np.max([np.abs(s.reshape(-1, s.shape[-1])).max(0) for s in stacks], axis=0)
            w_max = np.max([layer.row_max() for layer in layers], axis=0)
            errors: dict[str, float] = {}
            factors: dict[str, np.ndarray | None] = {"off": None}
            for alpha in ALPHAS:
                s = np.power(np.maximum(x_max, 1e-5), alpha) / np.power(np.maximum(w_max, 1e-5), 1 - alpha)
                factors[str(alpha)] = (s / np.exp(np.log(s).mean())).astype(np.float32)  # geometric mean 1
            for label, s in factors.items():
                errors[label] = _error(x, s, layers, references, weight_bits, activation_bits, grid, hist_percent)
            best = min(errors, key=lambda k: errors[k])
            if errors[best] * MIN_GAIN > errors["off"]:
                best = "off"
            choices.append(Smoothing(name, None if best == "off" else float(best), errors, factors[best]))
    return choices


def apply_smoothing(graph: Graph, groups: dict[str, list[OpTarget]], choices: Sequence[Smoothing]) -> int:
    """Divide each chosen activation by its factors and multiply its readers' weight rows; returns how many."""
    done = 0
    for choice in choices:
        if choice.factors is None:
            continue
        readers = groups[choice.activation]
        for target in readers:
            assert target.weight is not None
            weight = graph.get_param(target.weight.name)
            rows = choice.factors[:, None] if graph.weight_channel_axis(target.op) == 1 else choice.factors[None, :]
            graph.set_param(target.weight.name, (weight * rows).astype(weight.dtype))
        graph.scale_activation([t.activations[0] for t in readers], 1.0 / choice.factors)
        done += 1
    return done


def smooth_graph(graph: Graph, targets: list[OpTarget], config: PTQConfig, model: Model, keep_samples: int
                 ) -> list[Smoothing]:
    """Graph preparation for ``auto``: activation smoothing where it lowers the matmul outputs' error
    (:mod:`qptq.smooth`), from a pass that keeps samples of the matmul inputs; returns the choice for each."""
    groups = smoothable(graph, targets)
    if not groups:
        return []
    readers = [t for group in groups.values() for t in group]
    seen = calibrate_sharded(graph, readers, config, model, keep_samples=keep_samples)
    deployment, grids = config.target.deployment, config.target.grids
    choices = choose_smoothing(graph, groups, seen.activation_samples, weight_bits=deployment.weight_bits,
                               activation_bits=deployment.activation_bits,
                               hist_percent=config.calibration.hist_percent,
                               grid=lambda threshold, lo, hi: deployment.activation_grid(grids, threshold, lo, hi))
    smoothed = apply_smoothing(graph, groups, choices)
    log.info("activation smoothing: %d of %d matmul inputs smoothed", smoothed, len(groups))
    return choices


def _error(x: np.ndarray, s: np.ndarray | None, layers: list[_Reader], references: list[np.ndarray],
           weight_bits: int, activation_bits: int, grid: Grid, hist_percent: float) -> float:
    """The readers' summed output error with ``x / s`` and ``s W`` quantized, at the best threshold."""
    xs = x if s is None else x / s
    observer = HistogramObserver()
    observer.update(xs)
    weights = [layer.quantized_weight(s, weight_bits) for layer in layers]
    lo, hi = float(xs.min()), float(xs.max())
    best = np.inf
    options = {"hist": {"hist_percent": hist_percent}}
    thresholds = {search_threshold(a, observer, activation_bits, **options.get(a, {})) for a in SCORED_ALGOS}
    for threshold in sorted(thresholds):
        if threshold <= 0:
            continue
        xq = fake_quantize_grid(xs, *grid(threshold, lo, hi), activation_bits)
        error = sum(squared_relative_error(layer.run(xq, w), r) for layer, w, r in zip(layers, weights, references))
        best = min(best, error)
    return float(best)


class _Reader(ReplayedLayer):
    """One matmul reading the activation, replayed eagerly; its weight rows are the input channels."""

    def __init__(self, graph: Graph, target: OpTarget) -> None:
        super().__init__(graph, target)
        self.out_axis = graph.weight_channel_axis(target.op) or 0  # 1: [in, out]; 0: transposed [out, in]
        self.in_axis = 1 - self.out_axis

    def row_max(self) -> np.ndarray:
        return np.abs(self.weight).max(axis=self.out_axis)


    def quantized_weight(self, s: np.ndarray | None, bits: int) -> np.ndarray:
        """``s W`` (rows scaled) fake-quantized per output channel at its abs max."""
        w = self.weight if s is None else self.weight * np.expand_dims(s, self.out_axis)
        return fake_quantize(w, np.maximum(np.abs(w).max(axis=self.in_axis), 1e-12), bits, axis=self.out_axis)
