"""The rewrite stage of static PTQ: a :class:`~qptq.plan.Plan` applied to a graph, then bias correction.

The same two steps make the saved model and every accuracy-budget candidate (on a clone), so a
candidate is exactly the model the budget would save.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from qcore.deploy import Deployment, OpTarget, Targets
from qcore.deploy.apply import Planned
from qcore.deploy.session import Rewritten
from qcore.graph import Graph

from .bias_correction import correct_bias
from .calibrate import Calibration
from .plan import Plan


@dataclass
class Quantized:
    """What the rewrite did (:class:`qcore.deploy.Rewritten`), the ``(threshold, offset)`` each activation
    deploys with, and each corrected bias's largest shift (by position among the applied ops)."""

    rewritten: Rewritten
    grids: dict[str, tuple[float, float]]
    bias_shifts: dict[int, float | None]


def quantize_graph(graph: Graph, targets: Targets, plan: Plan, deployment: Deployment, calibration: Calibration,
                   *, per_channel: bool, keep_float: Mapping[int, str] | None = None) -> Quantized:
    """Rewrite ``graph`` (whose ops ``targets`` lists, in the plan's order) as ``plan`` says, leaving float the
    layers ``keep_float`` names (default: the plan's), then correct the biases where calibration measured means."""
    keep_float = plan.keep_float if keep_float is None else keep_float
    grids: dict[str, tuple[float, float]] = {}

    def per_operand(values: dict[str, float], target: OpTarget) -> list[float]:
        """By position among the op's activation operands (PIR names shift as ops are inserted, positions
        do not); 0.0 (float) for the operands ``target`` leaves out (e.g. the conv side of a fused add)."""
        wanted = {a.name for a in target.activations}
        return [values[a.name] if a.name in wanted else 0.0 for a in graph.activation_operands(target.op)]

    def planned(shared: Mapping[str, float]) -> list[Planned]:
        """Each op with the thresholds the target runs (oneDNN shares scales along some chains) on our grids."""
        grids.update((name, plan.grid(deployment, name, threshold)) for name, threshold in shared.items())
        deployed = {name: grid[0] for name, grid in grids.items()}
        offsets = {name: grid[1] for name, grid in grids.items()}
        rounded = plan.rounded
        return [
            Planned(t, per_operand(deployed, t), per_channel=per_channel, keep_float=keep_float.get(i),
                    act_offsets=per_operand(offsets, t) if plan.grids != "symmetric" else None,
                    weight_thresholds=rounded[i].thresholds if i in rounded else None,
                    weight_value=rounded[i].weight if i in rounded else None)
            for i, t in enumerate(targets.ops)
        ]  # fmt: skip

    rewritten = deployment.rewrite(graph, targets, plan.chosen(), planned)
    return Quantized(rewritten, grids, correct_biases(graph, rewritten, calibration))


def rewritten_clone(graph: Graph, plan: Plan, deployment: Deployment, calibration: Calibration,
                    targets_of: Callable[[Graph], Targets], *, per_channel: bool, keep_float: Mapping[int, str]
                    ) -> Graph:
    """A clone of ``graph`` rewritten as ``plan`` says with the ``keep_float`` layers float: exactly the model a run
    would save with that choice (accuracy-budget and ``auto`` candidates)."""
    clone = graph.clone()
    quantize_graph(clone, targets_of(clone), plan, deployment, calibration, per_channel=per_channel,
                   keep_float=keep_float)
    return clone


def correct_biases(graph: Graph, rewritten: Rewritten, calibration: Calibration) -> dict[int, float | None]:
    """Subtract each quantized weight's mean output shift from its op's bias (:func:`correct_bias`) where
    calibration measured the input's channel means; the largest shift by position among the applied ops."""
    shifts = {}
    for i, applied in enumerate(rewritten.applied):
        target, done = applied.planned.target, applied.done
        if applied.left_float is not None or done is None or done.weight is None or target.weight is None:
            continue
        if target.activations and target.activations[0].name in calibration.channel_means:
            shifts[i] = correct_bias(graph, target, done.weight, calibration.channel_means[target.activations[0].name])
    return shifts
