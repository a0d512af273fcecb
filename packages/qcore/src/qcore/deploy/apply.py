"""The one loop that puts a quantized model in the form a deployment target runs.

Post-training quantization (thresholds from calibration) and the QAT export (thresholds
learned in training) both end here: for every planned op, ask the target's
:class:`~qcore.deploy.base.ModelRules` whether it stays float, otherwise store its weight as
integer codes and put QDQ on its activations (:func:`qcore.graph.quantize_op`); then let the
rules finish the graph (e.g. the oneDNN simulation of int8 outputs).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..graph import Graph, OpQuantization, quantize_op
from ..graph.rewrite import PerOperand
from .base import ModelRules, OpTarget

log = logging.getLogger(__name__)

#: Why an op quantized only for a conv (its fused residual add, the pool it feeds) stays float with it.
FOR_FLOAT_CONV_REASON = "quantized only for a conv that stays float (its residual add or the pool it feeds)"
#: Report text for :attr:`OpTarget.runs_float` ops.
RUNS_FLOAT_NOTE = "its input is quantized for the op writing it; the runtime runs this op float"


@dataclass
class Planned:
    """One op to rewrite and the thresholds to rewrite it with."""

    target: OpTarget
    # by activation name, by position in ``Graph.activation_operands`` (PIR names shift), or one for all
    act_thresholds: PerOperand
    per_channel: bool = True
    weight_thresholds: np.ndarray | None = None  # None: the weight's abs max
    weight_value: np.ndarray | None = None  # the float weight to store (None: the parameter's; AdaRound's)
    keep_float: str | None = None  # the caller's reason to leave this op float (e.g. an accuracy budget)
    act_offsets: PerOperand | None = None  # asymmetric grids, keyed like the thresholds


@dataclass
class Applied:
    """What :func:`apply_rules` did with one :class:`Planned` op."""

    planned: Planned
    left_float: str | None = None  # the rule that kept it float
    done: OpQuantization | None = None


def apply_rules(
    graph: Graph, rules: ModelRules, planned: Sequence[Planned], *, weight_bits: int = 8, activation_bits: int = 8
) -> list[Applied]:
    """Quantize every ``planned`` op the ``rules`` let run int8; returns what happened to each, in order.

    The ops are rewritten in program order: an activation's shared QDQ pair is built before the first reader
    rewritten, which must be its earliest (a decoder's RMSNorm reads the residual stream before the residual
    add that the targets list first does)."""
    float_ops: dict[int, bool] = {}  # key of an op left float -> whether the caller's choice left it (or its conv)
    max_code = rules.target.weight_max_code(weight_bits, graph.family)
    position = {op.key: i for i, op in enumerate(graph.ops())}
    results: dict[int, Applied] = {}
    for index in sorted(range(len(planned)), key=lambda i: position.get(planned[i].target.op.key, -1)):
        item = planned[index]
        target = item.target
        reason = item.keep_float or target.float_reason or rules.problem(target.op, weight_bits, item.per_channel)
        callers = item.keep_float is not None
        conv = None if target.for_conv is None else target.for_conv.key
        if reason is None and conv in float_ops:
            reason, callers = FOR_FLOAT_CONV_REASON, float_ops[conv]
        if reason is not None:
            float_ops[target.op.key] = callers
            # a caller's own reason (e.g. each accuracy-budget candidate) is its business, not a warning; what
            # follows from it (the residual add of a conv it keeps float) is logged at info level
            log_as = log.warning if not callers else log.debug if item.keep_float else log.info
            log_as("%r left in float: %s", target.op, reason)
            results[index] = Applied(item, left_float=reason)
            continue
        done = quantize_op(
            graph, target.op, item.act_thresholds, weight_bits=weight_bits, activation_bits=activation_bits,
            per_channel=item.per_channel, weight_thresholds=item.weight_thresholds, weight_value=item.weight_value,
            unsigned=rules.unsigned, act_offsets=item.act_offsets, zero_points=rules.target.activation_zero_points,
            float_dequant=target.op.seed_type in rules.target.float_dequant_weights, weight_max_code=max_code,
            lookup_rows=target.op.seed_type in rules.target.weight_only_ops,
        )  # fmt: skip
        if target.runs_float:
            rules.keep_float(target.op)
        results[index] = Applied(item, done=done)
    ordered = [results[i] for i in range(len(planned))]
    quantized = [a.planned.target.op for a in ordered if a.done is not None]
    rules.finish(quantized, [name for a in ordered if a.done is not None for name in a.done.activations])
    return ordered
