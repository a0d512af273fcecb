"""``algo="auto"``'s float decisions, measured per model on the caller's calibration data.

No role, layer or model name is read anywhere: every decision comes from the calibration statistics, the measured
error of each layer and the target runtime's cost rules (data in its module under :mod:`qcore.deploy`).

1. **Speed.** Where the target's whole-model rule says int8 cannot be faster (too little work per sample,
   :attr:`~qcore.deploy.DeployTarget.min_int8_work`), every layer stays float; otherwise the ops its cost rules
   name (:attr:`~qcore.deploy.DeployTarget.slow_int8`, e.g. small depthwise convs) stay float. Work and output
   sizes per sample are read off the kept calibration samples' shapes.
2. **Accuracy.** Each weighted layer is replayed on the kept calibration samples, float against int8 (its input
   on the chosen activation grid, its weight on the per-channel grid): :class:`LayerError`. Its *channel* error
   (the relative output error of every output channel, averaged) is what one per-tensor activation scale loses
   on small channels, which the next layer's per-channel weights and gates scale back up; the input's channel
   spread is reported beside it. Layers are ranked by it.
3. **How many stay float.** Every :data:`HOLD_EVERY`-th calibration batch is held back from calibration. Candidates
   keep float the layers whose channel error stands out from the model's median layer's by each factor of
   :data:`STAND_OUT`; each candidate is the model the run would save, scored on the held-back batches against
   float, per batch (:func:`decision_error`: top class changes of distribution outputs, relative L2 of others).
   The first (fewest float layers) whose mean plus :data:`MARGIN_SE` standard errors is within the budget is
   chosen; when none is, the one with the fewest float layers among those the
   held-back batches cannot tell from the best (:func:`fewest_near_best`). Under ``paddle.distributed`` each rank
   holds back every :data:`HOLD_EVERY`-th of its own batches and all ranks score on all of them, in rank order:
   the same model as one process on the union when every rank's batch count is a multiple of
   :data:`HOLD_EVERY` (the same batches are held back then), otherwise a model of its own, the same on every
   rank. The report gives the estimate and its standard error on batches the thresholds never saw.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import paddle

from qcore.deploy import Deployment, OpTarget, Targets
from qcore.graph import Graph
from qcore.graph.replay import replayable
from qcore.optable import CONV_KINDS, FC, kind_of
from qcore.paddle_env import cpu_threads, eager_mode
from qcore.quant import abs_max as channel_abs_max
from qcore.quant import bounded_thresholds, fake_quantize

from .auto import ReplayedLayer, central_windows, fake_quantize_grid, scored_positions, scored_rows, spatial
from .budget import output_error
from .calibrate import first_rows, run_batches, stacked_by_shape
from .config import DataConfig
from .plan import Plan

#: Every this-many-th calibration batch is held back from calibration and scores the float choices.
HOLD_EVERY = 4
#: A candidate keeps float the layers whose channel error is over this many times the model's median layer's (a
#: layer standing out from the rest of the model), loosest last; the first candidate is all int8 (as the cost rules
#: allow). Relative to the model's own median, so the steps mean the same on any model and data.
STAND_OUT = (16.0, 8.0, 4.0, 2.0)
#: At most this share of the weighted layers stays float for accuracy.
MAX_FLOAT_SHARE = 0.5
#: The default budget: relative L2 error of the model's outputs against float, on the held-back batches.
DEFAULT_OUTPUT_ERROR = 0.05
#: The default budget for outputs that are distributions over their last axis (:func:`decision_error`): the
#: share of positions whose top class differs from float's.
DEFAULT_TOP1_CHANGED = 0.01
#: A candidate is within budget when its held-back mean error plus this many standard errors is.
MARGIN_SE = 2.0


@dataclass(frozen=True)
class LayerError:
    """One weighted layer, int8 against float, on the kept calibration samples (per sample sizes: the mean
    over the kept samples' shapes)."""

    output: float  # ||y_q - y||^2 / ||y||^2
    channels: float  # the same per output channel, averaged over channels
    spread: float  # the input's largest channel abs max over its median channel's (1.0: one channel)
    outputs: int  # output values per sample
    macs: int  # multiply-adds per sample


@dataclass
class HeldOut:
    """The calibration batches held back (:data:`HOLD_EVERY`), filled while calibration reads the others."""

    batches: list[dict[str, np.ndarray]] = field(default_factory=list)
    seen: int = 0


def is_distribution(reference: np.ndarray) -> bool:
    """Whether float's output is a distribution over its last axis at every position (softmax-like: never
    negative, sums to 1): then what a reader takes from it is its top class."""
    if reference.ndim < 2 or reference.shape[-1] < 2 or reference.min() < 0:
        return False
    return bool(np.allclose(reference.sum(axis=-1, dtype=np.float64), 1.0, atol=1e-3))


def decision_error(outputs: Sequence[np.ndarray], reference: Sequence[np.ndarray]) -> float:
    """A candidate's error against float on one batch, the worst over the outputs: for a distribution output
    (:func:`is_distribution`) the share of positions whose top class changed, for any other the relative L2
    error. Relative L2 of a per-position distribution is dominated by the confident positions and ranked
    candidates unlike the task's metric (a CTC text recognizer: the candidate with the lower L2 lost more lines)."""
    worst = 0.0
    for o, r in zip(outputs, reference):
        if is_distribution(r):
            worst = max(worst, float(np.mean(o.argmax(axis=-1) != r.argmax(axis=-1))))
        else:
            worst = max(worst, output_error([o], [r]))
    return worst


def split_data(data: DataConfig, model: Any, held: HeldOut) -> DataConfig:
    """``data`` without every :data:`HOLD_EVERY`-th batch, which goes to ``held`` as calibration reads it."""

    def fit() -> Iterator[dict[str, np.ndarray]]:
        held.batches.clear()
        held.seen = 0
        for i, feed in enumerate(data.batches(model)):
            held.seen += 1
            if i % HOLD_EVERY == HOLD_EVERY - 1:
                held.batches.append(feed)
            else:
                yield feed

    return DataConfig(None, fit, None, data.batch_size, None)


def _per_sample_size(stacks: Sequence[np.ndarray]) -> float:
    """Mean per-sample spatial positions (NCHW) or rows (``[..., channels]``) over the kept samples."""
    total = sum(len(x) for x in stacks)
    if stacks[0].ndim == 4:
        return sum(len(x) * x.shape[2] * x.shape[3] for x in stacks) / total
    return sum(len(x) * int(np.prod(x.shape[1:-1])) for x in stacks) / total


def _channel_error(y: np.ndarray, reference: np.ndarray, axis: int) -> float:
    """The relative squared error of every channel along ``axis``, averaged over channels that are not zero."""
    d = np.moveaxis(y - reference, axis, 0).reshape(reference.shape[axis], -1)
    r = np.moveaxis(reference, axis, 0).reshape(reference.shape[axis], -1)
    norms = np.einsum("ij,ij->i", r, r)
    live = norms > 0
    return float(np.mean(np.einsum("ij,ij->i", d, d)[live] / norms[live])) if live.any() else 0.0


def layer_errors(graph: Graph, targets: Sequence[OpTarget], plan: Plan, deployment: Deployment,
                 samples: dict[str, list[np.ndarray]], per_channel: bool) -> dict[int, LayerError]:
    """:class:`LayerError` of every replayable weighted target with kept samples that the target runs in int8, by
    position in ``targets``."""
    chosen = plan.chosen()
    bits, max_code = deployment.weight_bits, deployment.weight_max_code(graph.family)
    errors = {}
    with eager_mode(), cpu_threads(), paddle.no_grad():
        for i, target in enumerate(targets):
            if target.weight is None or len(target.activations) != 1 or not replayable(graph, target.op):
                continue
            if target.float_reason or deployment.target.op_problem(target.op, graph.family):
                continue  # float on this target whatever is decided here
            name = target.activations[0].name
            if not samples.get(name) or chosen.get(name, 0.0) <= 0:
                continue
            layer = ReplayedLayer(graph, target)
            stacks = stacked_by_shape(samples[name])
            conv = kind_of(target.op.seed_type) in CONV_KINDS
            size = _per_sample_size(stacks)
            x = stacks[0]
            if kind_of(target.op.seed_type) is FC:
                x = first_rows(x, scored_rows([layer]))
            elif spatial(target, layer):
                x = central_windows([x], scored_positions([layer], x.shape[1]))[0]
            axis = graph.weight_channel_axis(target.op) if per_channel else None
            weight = layer.weight
            thresholds = bounded_thresholds(np.atleast_1d(channel_abs_max(weight, axis)), bits, max_code)
            wq = fake_quantize(weight, thresholds if axis is not None else float(thresholds[0]), bits, axis)
            xq = fake_quantize_grid(x, *plan.grid(deployment, name, chosen[name]), deployment.activation_bits)
            reference, y = layer.run(x), layer.run(xq, wq)
            out_axis = 1 if conv and y.ndim == 4 else y.ndim - 1
            d, r = (y - reference).ravel(), reference.ravel()
            norm = float(np.dot(r, r))
            strides = int(np.prod([*np.atleast_1d(graph.attr(target.op, "strides", [1, 1]))][:2])) if conv else 1
            outputs = int(reference.shape[out_axis] * size / max(strides, 1))
            errors[i] = LayerError(
                output=float(np.dot(d, d)) / norm if norm > 0 else 0.0,
                channels=_channel_error(y, reference, out_axis),
                spread=_spread(x, 1 if x.ndim == 4 else x.ndim - 1),
                outputs=outputs,
                macs=int(weight.size * (size / max(strides, 1) if conv else size)),
            )
    return errors


def _spread(x: np.ndarray, axis: int) -> float:
    """The largest channel abs max of ``x`` over its median one (how much one per-tensor scale must stretch)."""
    peaks = np.abs(np.moveaxis(x, axis, 0).reshape(x.shape[axis], -1)).max(axis=1)
    median = float(np.median(peaks))
    return float(peaks.max() / median) if median > 0 else math.inf


def speed_float(deployment: Deployment, targets: Sequence[OpTarget], errors: dict[int, LayerError]
                ) -> tuple[str | None, dict[int, str]]:
    """The target's cost rules on this model: why the whole model stays float (or None), and the layers that
    stay float for speed, by position, with the rule's text."""
    macs = sum(e.macs for e in errors.values())
    whole = deployment.target.model_speed_problem(macs) if errors else None
    if whole is not None:
        return whole, {i: whole for i in range(len(targets))}  # pools and joins too: nothing int8
    slow = {}
    for i, e in errors.items():
        reason = deployment.target.speed_problem(targets[i].op.seed_type, e.outputs)
        if reason is not None:
            slow[i] = reason
    return None, slow


#: How the reason of a layer kept float for accuracy starts (others are a target's speed rules).
ACCURACY = "accuracy: "


def accuracy_reason(e: LayerError) -> str:
    """Why a layer stays float for accuracy, in the report's words."""
    return (f"{ACCURACY}int8 channel error {e.channels:.3g} (output error {e.output:.3g}; input channel ranges "
            f"span {e.spread:.3g}x, one 8-bit per-tensor scale cannot hold them all)")


def candidate_sets(errors: dict[int, LayerError], exclude: set[int]) -> list[list[int]]:
    """The float sets tried, fewest first: none, then the layers whose channel error is over each
    :data:`STAND_OUT` multiple of the median layer's (worst first, at most :data:`MAX_FLOAT_SHARE` of the layers)."""
    ranked = sorted((i for i in errors if i not in exclude), key=lambda i: -errors[i].channels)
    if not ranked:
        return [[]]
    median = float(np.median([errors[i].channels for i in ranked]))
    cap = int(MAX_FLOAT_SHARE * len(errors))
    sets: list[list[int]] = [[]]
    for factor in STAND_OUT:
        chosen = [i for i in ranked if errors[i].channels > factor * median][:cap]
        if len(chosen) > len(sets[-1]):
            sets.append(chosen)
    return sets


@dataclass(frozen=True)
class Estimate:
    """A candidate's output error against float on the held-back batches: mean, standard error, per batch."""

    mean: float
    se: float
    per_batch: list[float]

    @property
    def upper(self) -> float:
        return self.mean + MARGIN_SE * self.se

    @classmethod
    def of(cls, errors: list[float]) -> Estimate:
        n = len(errors)
        se = float(np.std(errors, ddof=1) / math.sqrt(n)) if n > 1 else math.inf
        return cls(float(np.mean(errors)), se, errors)

    def report(self) -> dict[str, Any]:
        return {"mean": round(self.mean, 6), "standard_error": round(self.se, 6), "batches": len(self.per_batch)}


def choose_float(graph: Graph, targets: Targets, errors: dict[int, LayerError], speed: dict[int, str],
                 held: HeldOut, fallback: list[dict[str, np.ndarray]],
                 candidate: Callable[[dict[int, str]], Graph]) -> tuple[dict[int, str], dict[str, Any]]:
    """The layers kept float (speed and accuracy, with the reasons) and the report's ``auto`` section.

    ``candidate(keep_float)`` is the rewritten clone the run would save; scored on ``held``'s batches (on
    ``fallback``, calibration batches, when none was held back: the estimate is then not on unseen data)."""
    start = time.perf_counter()
    batches = held.batches or fallback
    references = [run_batches(graph, [b]) for b in batches]
    top1 = any(is_distribution(r) for r in references[0])
    budget = DEFAULT_TOP1_CHANGED if top1 else DEFAULT_OUTPUT_ERROR
    tried: list[dict[str, Any]] = []
    chosen = None
    scored: list[tuple[dict[int, str], Estimate]] = []
    for float_set in candidate_sets(errors, set(speed)):
        keep = {**speed, **{i: accuracy_reason(errors[i]) for i in float_set}}
        model = candidate(keep)
        outputs = [run_batches(model, [b]) for b in batches]
        estimate = Estimate.of([decision_error(o, r) for o, r in zip(outputs, references)])
        tried.append({"float_for_accuracy": len(float_set), **estimate.report(),
                      "output_error": round(output_error([a for o in outputs for a in o],
                                                         [a for r in references for a in r]), 6)})
        scored.append((keep, estimate))
        if estimate.upper <= budget:
            chosen = (keep, estimate)
            break
    keep, estimate = chosen or fewest_near_best(scored)
    ops = targets.ops
    section = {
        "budget": {"metric": "top-1 changed" if top1 else "relative L2 error", "max": budget,
                   "margin": f"mean + {MARGIN_SE:g} standard errors", "met": chosen is not None},
        "held_out": {**estimate.report(), "batches": len(held.batches), "of": held.seen,
                     "unseen": bool(held.batches)},
        "candidates": tried,
        "float_layers": {_name(ops[i], i): why for i, why in sorted(keep.items())},
        "layer_errors": {_name(ops[i], i): {
            "channels": float(f"{e.channels:.4g}"), "output": float(f"{e.output:.4g}"),
            "input_spread": float(f"{e.spread:.4g}"), "outputs": e.outputs, "macs": e.macs}
            for i, e in sorted(errors.items())},
        "seconds": round(time.perf_counter() - start, 3),
    }
    return keep, section


def fewest_near_best(scored: list[tuple[dict[int, str], Estimate]]) -> tuple[dict[int, str], Estimate]:
    """When no candidate meets the budget: the one with the fewest float layers whose held-out mean is within
    :data:`MARGIN_SE` standard errors of the lowest mean (more float layers must buy a difference the held-out
    batches can tell from noise)."""
    best = min(scored, key=lambda c: c[1].mean)[1]
    return next(c for c in scored if c[1].mean <= best.mean + MARGIN_SE * best.se)


def _name(target: OpTarget, position: int) -> str:
    """A layer as the report names it: position among the targets, op type, scope."""
    return f"{position} {target.op.seed_type} {target.op.scope_name or ''}".strip()


def whole_model_report(reason: str, errors: dict[int, LayerError]) -> dict[str, Any]:
    """The ``auto`` section when the whole model stays float for speed."""
    return {"model": "float", "why": reason, "macs_per_sample": sum(e.macs for e in errors.values())}


def summary(section: dict[str, Any]) -> tuple[str, str]:
    """An ``auto`` report section in words: ``("float", why)`` when the whole model stays float, else ``("int8"`` or
    ``"int8, N layers float"``, the float layers' reasons counted and the held-out estimate``)``."""
    if section.get("model") == "float":
        return "float", section["why"]
    held, budget = section["held_out"], section["budget"]
    where = f"{held['batches']} held-out batches" if held["unseen"] else "calibration batches (none held out)"
    estimate = (f"{budget['metric']} {held['mean']:.3g} +- {held['standard_error']:.2g} on {where} "
                f"(budget {budget['max']:g}{'' if budget['met'] else ', missed'})")
    floats = section["float_layers"]
    if not floats:
        return "int8", estimate
    speed = sum(not why.startswith(ACCURACY) for why in floats.values())
    return f"int8, {len(floats)} layers float", f"{speed} for speed, {len(floats) - speed} for accuracy; {estimate}"
