"""``round_type="adaround"``: learn each weight's rounding direction against the layer's float output.

Round-to-nearest minimises each weight's own error, not the layer's. AdaRound (Nagel et al.,
"Up or Down? Adaptive Rounding for Post-Training Quantization", 2020) rounds each weight down
or up, chosen by optimising a soft rounding variable ``V`` per weight:

* ``h(V) = clip(sigmoid(V) * (zeta - gamma) + gamma, 0, 1)`` with ``zeta = 1.1``, ``gamma = -0.1``;
* soft weight ``w~ = s * clip(floor(w / s) + h(V), -m, m)`` (``s``: the weight's scale, ``m``: its top code);
* loss ``sum_c (op(x, w~) - op(x, w))^2`` (summed over output channels, averaged over the rest)
  ``+ lambda * sum (1 - |2 h(V) - 1|^beta)``, the regulariser off for the first ``warmup`` of the
  iterations, then with ``beta`` annealed from 20 to 2 so every ``h`` ends at 0 or 1.

``V`` starts where ``h(V)`` is the fractional part (so the first soft weight is the float one).
The final codes are ``floor(w / s) + (h(V) >= 0.5)``. A layer whose learned rounding does not
beat round-to-nearest on the calibration samples keeps round-to-nearest (reported).
Inputs ``x`` are the float model's activations kept by calibration; each layer is optimised on
its own, so the cost is ``iters`` forward/backward passes of one layer per layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import paddle

from qcore.deploy import Deployment, OpTarget
from qcore.graph import Graph
from qcore.graph.replay import LayerReplay, replayable
from qcore.paddle_env import eager_mode
from qcore.quant import abs_max, bounded_thresholds, qmax, scale_from_threshold

from .calibrate import stacked_by_shape

ZETA, GAMMA = 1.1, -0.1


@dataclass(frozen=True)
class AdaRoundSettings:
    """Optimisation settings (the defaults suit layers of up to a few hundred thousand weights)."""

    iters: int = 1000
    learning_rate: float = 1e-2
    reg_weight: float = 0.01
    beta: tuple[float, float] = (20.0, 2.0)
    warmup: float = 0.2
    batch: int = 32
    seed: int = 0


@dataclass(frozen=True)
class AdaRounded:
    """One layer's result: the weight to store (its round-to-nearest codes are the learned ones)."""

    weight: np.ndarray  # codes * scale, float32
    thresholds: np.ndarray  # per channel (or one), the abs max the scale was derived from
    loss_nearest: float  # reconstruction loss of round-to-nearest on the samples
    loss_adaround: float  # reconstruction loss of the learned rounding on the samples
    flipped: float  # fraction of weights rounded the other way than round-to-nearest
    used: bool  # False: the learned rounding did not beat round-to-nearest, which is kept


def _scale(weight: np.ndarray, axis: int | None, bits: int, max_code: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The thresholds and the broadcastable scale :meth:`qcore.graph.Graph.quantize_weight` will use."""
    thresholds = np.atleast_1d(np.asarray(abs_max(weight, axis), dtype=np.float64))
    scale = np.asarray(scale_from_threshold(bounded_thresholds(thresholds, bits, max_code), bits))
    scale = np.where(scale > 0, scale, 1.0)  # all-zero channels: codes 0 whatever the scale
    shape = [1] * weight.ndim
    if axis is not None:
        shape[axis] = -1
    return thresholds, scale.reshape(shape)


def _soft(v: paddle.Tensor) -> paddle.Tensor:
    return paddle.clip(paddle.nn.functional.sigmoid(v) * (ZETA - GAMMA) + GAMMA, 0.0, 1.0)


def adaround(
    replay: Callable[[paddle.Tensor, paddle.Tensor], paddle.Tensor],
    x: np.ndarray,
    weight: np.ndarray,
    *,
    bits: int,
    axis: int | None,
    max_code: int | None = None,
    settings: AdaRoundSettings = AdaRoundSettings(),  # noqa: B008 - frozen dataclass
) -> AdaRounded:
    """Learn the rounding of ``weight`` for the layer ``replay(x, w)`` (e.g. a
    :class:`qcore.graph.replay.LayerReplay`) on the float inputs ``x``."""
    top = max_code or qmax(bits)
    thresholds, scale = _scale(weight, axis, bits, max_code)
    w64 = weight.astype(np.float64)
    floor = np.floor(w64 / scale)
    rest = np.clip(w64 / scale - floor, 1e-4, 1 - 1e-4)
    p = (rest - GAMMA) / (ZETA - GAMMA)
    rng = np.random.default_rng(settings.seed)
    out_axis = 1 if x.ndim == 4 else -1  # NCHW convs: channels; matmuls: the last axis

    s_t = paddle.to_tensor(scale.astype(np.float32))
    floor_t = paddle.to_tensor(floor.astype(np.float32))
    w_t = paddle.to_tensor(weight.astype(np.float32))
    x_all = paddle.to_tensor(np.ascontiguousarray(x, dtype=np.float32))
    with paddle.no_grad():
        target_all = replay(x_all, w_t)

    def weight_of(h: paddle.Tensor) -> paddle.Tensor:
        return s_t * paddle.clip(floor_t + h, -top, top)

    def loss_of(y: paddle.Tensor, target: paddle.Tensor) -> paddle.Tensor:
        return ((y - target) ** 2).sum(axis=out_axis).mean()

    def hard_loss(codes: np.ndarray) -> float:
        with paddle.no_grad():
            w = paddle.to_tensor((codes * scale).astype(np.float32))
            return float(loss_of(replay(x_all, w), target_all))

    start_v = np.log(p / (1 - p)).astype(np.float32)
    v = paddle.create_parameter(list(weight.shape), "float32",
                                default_initializer=paddle.nn.initializer.Assign(start_v))
    optimizer = paddle.optimizer.Adam(learning_rate=settings.learning_rate, parameters=[v])
    n = x.shape[0]
    start, end = settings.beta
    warm = int(settings.warmup * settings.iters)
    for step in range(settings.iters):
        pick = rng.choice(n, size=min(settings.batch, n), replace=False) if n > settings.batch else np.arange(n)
        index = paddle.to_tensor(np.sort(pick))
        h = _soft(v)
        rec = loss_of(replay(paddle.gather(x_all, index), weight_of(h)), paddle.gather(target_all, index))
        loss = rec
        if step >= warm:
            progress = (step - warm) / max(1, settings.iters - warm)
            beta = end + (start - end) * (1 - progress)
            loss = rec + settings.reg_weight * (1 - paddle.abs(2 * h - 1) ** beta).sum()
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
    nearest = np.clip(np.round(w64 / scale), -top, top)
    learned = np.clip(floor + (_soft(v).numpy() >= 0.5), -top, top)
    loss_nearest, loss_learned = hard_loss(nearest), hard_loss(learned)
    used = loss_learned < loss_nearest
    codes = learned if used else nearest
    return AdaRounded(
        weight=(codes * scale).astype(np.float32), thresholds=thresholds, loss_nearest=loss_nearest,
        loss_adaround=loss_learned, flipped=float(np.mean(learned != nearest)), used=bool(used),
    )


def adaround_targets(graph: Graph, targets: Sequence[OpTarget], samples: dict[str, list[np.ndarray]],
                     deployment: Deployment, *, per_channel: bool) -> dict[int, AdaRounded]:
    """AdaRound's weight for every replayable weighted target with kept input ``samples``, by position in
    ``targets``; each on the largest stack of same-shape samples, run eagerly whatever the caller's mode."""
    max_code = deployment.weight_max_code(graph.family)
    rounded = {}
    for i, target in enumerate(targets):
        if target.weight is None or not target.activations or not replayable(graph, target.op):
            continue
        kept = samples.get(target.activations[0].name)
        if not kept:
            continue
        axis = graph.weight_channel_axis(target.op) if per_channel else None
        with eager_mode():
            rounded[i] = adaround(LayerReplay(graph, target.op), stacked_by_shape(kept)[0],
                                  graph.get_param(target.weight.name), bits=deployment.weight_bits, axis=axis,
                                  max_code=max_code)
    return rounded
