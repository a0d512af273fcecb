"""The report of a static PTQ run: read-only, from the plan, the calibration and what the rewrite did."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from qcore.deploy import Deployment
from qcore.deploy.apply import RUNS_FLOAT_NOTE, Applied

from .calibrate import Calibration
from .plan import Plan
from .rewrite import Quantized

log = logging.getLogger(__name__)


def run_report(plan: Plan, quantized: Quantized, calibration: Calibration, deployment: Deployment, family: str,
               budget: dict[str, Any] | None = None) -> dict[str, Any]:
    """Per layer: its thresholds (and every algo's), grid, weight, bias shift, AdaRound's and ``auto``'s
    measurements, or why it stayed float; the run's algo, target and calibration size; one line when the
    target left most weighted layers float; the accuracy budget's search (:func:`qptq.budget.report`);
    the smoothing chosen."""
    done = quantized.rewritten
    chosen = plan.chosen()
    layers = [_layer(plan, a, chosen, done.thresholds, quantized.grids, done.unsigned) for a in done.applied]
    for i, shift in quantized.bias_shifts.items():
        layers[i]["weight"]["bias_shift_max"] = shift
    for i, rounded in plan.rounded.items():
        if "weight" in layers[i]:
            layers[i]["weight"]["adaround"] = {
                "used": rounded.used, "loss_nearest": round(rounded.loss_nearest, 6),
                "loss_adaround": round(rounded.loss_adaround, 6), "flipped": round(rounded.flipped, 4)}
    float_summary = deployment.float_summary(done.applied, family)
    report = {"algo": plan.algo, "deploy_backend": deployment.name,
              "weight_max_code": deployment.weight_max_code(family),
              "batches": calibration.batches, "samples": calibration.samples, "layers": layers,
              **done.rewrites, **({"float_layers": float_summary} if float_summary else {})}
    if budget is not None:
        report["budget"] = budget
    if plan.smoothing:
        report["smoothing"] = {c.activation: {"alpha": c.alpha, "layer_output_error": report_errors(c.errors)}
                               for c in plan.smoothing}
    return report


def _layer(plan: Plan, applied: Applied, chosen: dict[str, float], shared: dict[str, float],
           grids: dict[str, tuple[float, float]], unsigned: set[str]) -> dict[str, Any]:
    target = applied.planned.target
    entry: dict[str, Any] = {"op": target.op.seed_type or target.op.type, "scope": target.op.scope_name, "inputs": {}}
    if applied.left_float is not None:
        entry["left_float"] = applied.left_float
        return entry
    done = applied.done
    assert done is not None
    if target.runs_float:
        entry["runs_float"] = RUNS_FLOAT_NOTE
    if done.weight is not None and target.weight is not None:
        entry["weight"] = {"name": target.weight.name, "thresholds": done.weight.thresholds.round(6).tolist()}
    for operand in target.activations:
        threshold, offset = grids[operand.name]
        info: dict[str, Any] = {"threshold": threshold,
                                "all_algos": {k: round(v, 6) for k, v in plan.candidates[operand.name].items()}}
        if offset:  # asymmetric: the grid spans offset +- threshold
            info["offset"] = offset
        if operand.name in unsigned:
            info["unsigned"] = True  # oneDNN runs it as u8; the simulation does too
        if operand.name in plan.auto:
            choice = plan.auto[operand.name]
            info["auto"] = {"algo": choice.algo, "layer_output_error": report_errors(choice.errors)}
            if choice.alternative_errors is not None:  # the asymmetric grid won this activation
                info["auto"]["grid"] = choice.grid
                info["auto"]["layer_output_error_asymmetric"] = report_errors(choice.alternative_errors)
        if shared[operand.name] != chosen[operand.name]:
            info["own_threshold"] = chosen[operand.name]  # oneDNN runs it with another tensor's scale
        if info["threshold"] <= 0:
            info["left_float"] = "activation was all zeros during calibration"
            log.warning("activation %s was all zeros during calibration; left in float", operand.name)
        entry["inputs"][operand.name] = info
    return entry


def report_errors(errors: Mapping[str, float]) -> dict[str, float]:
    """Layer output errors as the report shows them: six significant digits."""
    return {k: float(f"{v:.6g}") for k, v in errors.items()}
