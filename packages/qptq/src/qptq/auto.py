"""``algo="auto"``: per activation, the candidate threshold that least disturbs the layers reading it.

The one calibration pass already gives every algorithm's threshold for every activation
(:func:`qcore.thresholds.thresholds_all_algos`). Each algorithm minimises an error of the
*histogram*; what matters is the error of the *layer output*. For an activation ``x`` read by a
weighted op ``y = op(x, W)``, each candidate ``t`` is scored by the relative squared error
``||op(q_t(x), W) - op(x, W)||^2 / ||op(x, W)||^2`` on the calibration samples kept for it
(``q_t``: fake quantization at threshold ``t``), summed over the activation's readers. A reader
without an eager form (pools, adds, concats) counts as the identity: the error of ``x`` itself.
The lowest total wins; ties go to the first algorithm in :data:`qcore.thresholds.ALGOS` order.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import paddle

from qcore.deploy import OpTarget
from qcore.graph import Graph
from qcore.graph.replay import LayerReplay, replayable
from qcore.optable import CONV, DEPTHWISE, FC, kind_of
from qcore.paddle_env import cpu_threads, eager_mode
from qcore.quant import qmax
from qcore.thresholds import ALGOS

from .calibrate import SCORED_ROWS, first_rows, stacked_by_shape

AUTO = "auto"
#: ``(activation name, threshold) -> (threshold, offset)``: the grid an activation deploys with
Grid = Callable[[str, float], tuple[float, float]]


@dataclass(frozen=True)
class AutoChoice:
    """What ``auto`` chose for one activation and the layer output error of every algorithm."""

    algo: str
    errors: dict[str, float]
    #: "asymmetric" where the asymmetric grid of ``alternative`` won, with its errors; None: the run's grid
    grid: str | None = None
    alternative_errors: dict[str, float] | None = None


#: An asymmetric grid replaces the run's grid for one activation only where it divides the layer output error by
#: at least this much: a zero point on a tensor reaching both signs costs a runtime a compensation term.
ASYMMETRIC_GAIN = 1.5


def choose_thresholds(
    graph: Graph,
    targets: Sequence[OpTarget],
    candidates: dict[str, dict[str, float]],
    samples: dict[str, list[np.ndarray]],
    bits: int,
    grid: Grid | None = None,
    alternative: Grid | None = None,
) -> dict[str, AutoChoice]:
    """Add ``"auto"`` to ``candidates[name]`` for every activation with samples; returns the choices.

    ``grid(name, threshold)`` gives the ``(threshold, offset)`` an activation deploys with (an
    asymmetric grid, :func:`qcore.quant.asymmetric_range`); by default the symmetric one. ``alternative``
    (the asymmetric grid, for runs whose grid is symmetric for tensors reaching both signs) is scored too and
    wins an activation where it divides the error by :data:`ASYMMETRIC_GAIN`.
    """
    readers: dict[str, list[OpTarget]] = {}
    for target in targets:
        for operand in target.activations:
            readers.setdefault(operand.name, []).append(target)
    choices = {}
    with eager_mode(), cpu_threads(), paddle.no_grad():
        for name, algos in candidates.items():
            kept = samples.get(name)
            if not kept:
                continue
            stacks = stacked_by_shape(kept)
            layers = [ReplayedLayer(graph, t) if replayable(graph, t.op) else None for t in readers[name]]
            weighted = [layer for layer in layers if layer is not None]
            if all(kind_of(t.op.seed_type) is FC for t in readers[name]):  # rows are independent: bound the time
                rows = scored_rows(weighted)
                stacks = [first_rows(x, rows) for x in stacks]
            elif all(spatial(t, layer) for t, layer in zip(readers[name], layers)):  # so are image windows
                stacks = central_windows(stacks, scored_positions(weighted, stacks[0].shape[1]))
            references = [[layer.run(x) if layer else x for layer in layers] for x in stacks]

            replays = _Replays(stacks, references, layers, bits)
            errors = replays.errors(algos, functools.partial(grid, name) if grid else lambda t: (t, 0.0))
            if not errors:
                continue
            best = min(errors, key=lambda a: errors[a])  # dicts keep ALGOS order: ties go to the first
            choice = AutoChoice(best, errors)
            differs = grid is not None and alternative is not None and alternative(name, algos[best]) != grid(
                name, algos[best])
            if differs:
                other = replays.errors(algos, functools.partial(alternative, name))
                best_other = min(other, key=lambda a: other[a])
                if other[best_other] * ASYMMETRIC_GAIN <= errors[best]:
                    choice = AutoChoice(best_other, errors, "asymmetric", other)
            algos[AUTO] = algos[choice.algo]
            choices[name] = choice
    return choices


class _Replays:
    """The readers of one activation replayed on its kept samples, fake-quantized on candidate grids."""

    def __init__(self, stacks: list[np.ndarray], references: list[list[np.ndarray]], layers: list[ReplayedLayer | None],
                 bits: int) -> None:
        self.stacks, self.references, self.layers, self.bits = stacks, references, layers, bits
        self.by_grid: dict[tuple[float, float], float] = {}

    def errors(self, algos: dict[str, float], on_grid: Callable[[float], tuple[float, float]]) -> dict[str, float]:
        """Each algo's summed relative output error with its threshold on ``on_grid(threshold)``."""
        errors: dict[str, float] = {}
        for algo in (a for a in ALGOS if a in algos):
            t = algos[algo]
            if t <= 0:
                continue
            key = on_grid(t)
            if key not in self.by_grid:
                self.by_grid[key] = 0.0
                for x, refs in zip(self.stacks, self.references):
                    xq = fake_quantize_grid(x, *key, self.bits)
                    outputs = [layer.run(xq) if layer else xq for layer in self.layers]
                    self.by_grid[key] += sum(squared_relative_error(y, r) for y, r in zip(outputs, refs))
            errors[algo] = self.by_grid[key]
        return errors


def fake_quantize_grid(x: np.ndarray, threshold: float, offset: float, bits: int) -> np.ndarray:
    """:func:`qcore.quant.fake_quantize` of ``x - offset``, plus ``offset``, in float32 (the replayed
    layers run in float32 anyway). A shifted grid has all ``2 ** bits`` codes (its zero point is a code of the
    type: :func:`qcore.quant.unsigned_range` puts 0 on ``-qmax - 1``), a symmetric one ``-qmax..qmax``."""
    top = qmax(bits)
    scale, shift = np.float32(threshold / top), np.float32(offset)
    return np.clip(np.rint((x - shift) / scale), -top - (1 if offset else 0), top) * scale + shift


def squared_relative_error(y: np.ndarray, reference: np.ndarray) -> float:
    """``||y - reference||^2 / ||reference||^2`` (the plain squared error when the reference is zero), with
    float32 dot products: a few times faster than float64 sums on large activations."""
    d, r = (y - reference).ravel(), reference.ravel()
    norm = float(np.dot(r, r))
    diff = float(np.dot(d, d))
    return diff / norm if norm > 0 else diff


#: Multiply-adds one candidate's scoring may cost (rows x the readers' weight sizes): wider matmuls are scored on
#: fewer rows, down to :data:`MIN_SCORED_ROWS` (all-MiniLM-L6-v2's widest readers get the full :data:`SCORED_ROWS`;
#: all-mpnet-base-v2's FFN 256: scoring every matmul on 1024 rows made its ``auto`` 6x ``hist``'s time).
SCORED_MACS = SCORED_ROWS * 384 * 1536
MIN_SCORED_ROWS = 256


def scored_rows(layers: Sequence[ReplayedLayer]) -> int:
    """Rows of an activation read by the matmuls ``layers`` to score candidates on: :data:`SCORED_ROWS`, fewer
    for wide readers (within :data:`SCORED_MACS`), at least :data:`MIN_SCORED_ROWS`."""
    macs = sum(layer.weight_size for layer in layers)
    return int(min(SCORED_ROWS, max(MIN_SCORED_ROWS, SCORED_MACS // max(macs, 1))))


#: Smallest side of a scored window: well above any kernel's reach, so a window's border stays a small part of it.
MIN_WINDOW = 32


def spatial(target: OpTarget, layer: ReplayedLayer | None) -> bool:
    """True when ``target`` reads an NCHW image position by position, so a window of it scores like the whole: a
    conv or depthwise conv (not a transposed one: its ``output_size`` may fix the input size), or a reader
    without an eager form (scored as the identity)."""
    if layer is None:
        return True
    kind = kind_of(target.op.seed_type)
    return kind in (CONV, DEPTHWISE) and str(layer.replay.attrs.get("data_format", "NCHW")) == "NCHW"


def central_windows(stacks: list[np.ndarray], positions: int) -> list[np.ndarray]:
    """Samples of NCHW ``stacks`` (most samples first) holding at most ``positions`` positions in all: whole
    samples while they fit, then one central window of at least :data:`MIN_WINDOW` a side (or the whole side).

    Scoring a candidate threshold replays the readers on every kept sample; det's pages (up to 960 x 960)
    made ``auto`` 11x KL's time. Stacks of other ranks are kept whole."""
    kept, left = [], positions
    for x in stacks:
        if x.ndim != 4:
            kept.append(x)
            continue
        if left <= 0:
            break
        n, _, h, w = x.shape
        if n * h * w <= left:
            kept.append(x)
            left -= n * h * w
            continue
        if h * w <= left:
            kept.append(x[: left // (h * w)])
            break
        wh = min(h, max(MIN_WINDOW, int(np.sqrt(left * h / w))))
        ww = min(w, max(MIN_WINDOW, left // wh))
        top, start = (h - wh) // 2, (w - ww) // 2
        kept.append(np.ascontiguousarray(x[:1, :, top : top + wh, start : start + ww]))
        break
    return kept


#: Image positions (samples x height x width) a conv activation's candidates are scored on: within
#: :data:`SCORED_MACS` and :data:`SCORED_VALUES`, from a 64 x 64 window to a 256 x 256 one.
SCORED_POSITIONS = (64 * 64, 256 * 256)
#: Activation values one candidate's scoring may read (a matmul's widest scored input: 1024 rows x 1536): depthwise
#: convs cost little per value but Paddle's eager CPU kernel for them is slow (~0.1 s on a 256 x 256 x 96 map).
SCORED_VALUES = SCORED_ROWS * 1536


def scored_positions(layers: Sequence[ReplayedLayer], channels: int) -> int:
    """Positions of a conv activation of ``channels`` channels to score candidates on (:data:`SCORED_POSITIONS`,
    by the readers' size and the activation's width)."""
    macs = sum(layer.weight_size for layer in layers)
    budget = min(SCORED_MACS // max(macs, 1), SCORED_VALUES // max(channels, 1))
    return int(min(SCORED_POSITIONS[1], max(SCORED_POSITIONS[0], budget)))


class ReplayedLayer:
    """One weighted reader of an activation, replayed eagerly with its float weight (or another one)."""

    def __init__(self, graph: Graph, target: OpTarget) -> None:
        self.replay = LayerReplay(graph, target.op)  # only an op with a parameter weight replays
        weight = graph.weight_operand(target.op)  # its float weight, quantized or not (``target.weight`` may be None)
        assert weight is not None
        self.weight = graph.get_param(weight.name).astype(np.float32)

    @property
    def weight_size(self) -> int:
        """Multiply-adds per input row (of a matmul) or per output position (of a stride-1 conv)."""
        return int(self.weight.size)

    def run(self, x: np.ndarray, weight: np.ndarray | None = None) -> np.ndarray:
        """The layer's output for ``x``, with ``weight`` in place of its own when given."""
        return self.replay.array(x, self.weight if weight is None else np.asarray(weight, np.float32))
