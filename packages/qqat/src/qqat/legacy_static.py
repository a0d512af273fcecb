"""Static-graph QAT on legacy ProgramDesc programs (``FLAGS_enable_pir_api=0``, PaddleSlim-era scripts).

:func:`quant_aware` inserts Paddle's legacy fake quant-dequant ops in front of every quantized op:
``fake_quantize_dequantize_moving_average_abs_max`` on activations (``is_test`` in the test program,
which reads the scale the training program learns: the state variables are persistable and shared by
name in the scope) and ``fake_channel_wise_quantize_dequantize_abs_max`` (or the per-tensor
``fake_quantize_dequantize_abs_max``) on weights. Both have straight-through gradients, so
``optimizer.minimize`` may run after ``quant_aware``. When it ran before (the PaddleSlim demo's order),
each quantized op's gradient op is pointed at the quantized inputs: the weight and activation gradients
are then those of the quantized forward, passed straight through to the float tensors.

:func:`convert` freezes a trained test program into the form post-training quantization writes: the fake
ops go, and the learned activation scales and the weights' abs max go through the deployment target's rules
(:meth:`qcore.deploy.Deployment.rewrite`), so the result runs on every target like a PTQ output.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import paddle

from qcore.config import QuantConfig
from qcore.deploy import Deployment, OpTarget
from qcore.deploy.apply import Planned
from qcore.errors import QuantError
from qcore.graph import LegacyGraph
from qcore.model_io import Model

ACT_OP = "fake_quantize_dequantize_moving_average_abs_max"
WEIGHT_OPS = ("fake_channel_wise_quantize_dequantize_abs_max", "fake_quantize_dequantize_abs_max")


def graph_of(program: Any, scope: Any) -> LegacyGraph:
    return LegacyGraph(Model(program, [], [], scope or paddle.static.global_scope(), "legacy"))


def quant_aware_legacy(graph: LegacyGraph, cfg: QuantConfig, for_test: bool,
                       scale_dict: Mapping[str, float] | None) -> dict[str, str]:
    """Insert the fake quant-dequant ops into the graph's program in place; returns {activation: its scale variable}."""
    targets = [(op, graph.weight_operand(op), graph.activation_operands(op))
               for op in graph.ops(cfg.effective_op_types, skip_patterns=cfg.not_quant_pattern)]
    done: dict[str, str] = {}
    scales: dict[str, str] = {}
    for op, weight, activations in targets:
        renames = {}
        for i, act in enumerate(activations):
            if act.name not in done:  # a tensor several ops read is quantized once
                state = f"{weight.name}@act{i}" if weight is not None else f"{act.name}@act"
                initial = (scale_dict or {}).get(act.name, 0.0)
                done[act.name] = graph.fake_quant_activation(op, act.name, state, cfg.activation_bits,
                                                             cfg.moving_rate, test=for_test, initial=initial)
                scales[act.name] = f"{state}@scale"
            renames[act.name] = done[act.name]
        if weight is not None:
            axis = graph.weight_channel_axis(op) if cfg.weight_quantize_type == "channel_wise_abs_max" else None
            renames[weight.name] = graph.fake_quant_weight(op, weight.name, cfg.weight_bits, axis)
        for old, new in renames.items():
            graph.rename_input(op, old, new)
        if not for_test:
            for grad in graph.gradient_ops(op):
                for old, new in renames.items():
                    graph.rename_input(grad, old, new)
    return scales


def learned_scales(graph: LegacyGraph) -> dict[str, float]:
    """{activation: learned scale} of the test program's activation fake ops."""
    return {graph.input_names(op, "X")[0]: float(graph.get_param(graph.input_names(op, "InScale")[0]).reshape(-1)[0])
            for op in graph.ops() if op.type == ACT_OP}


def convert_legacy(graph: LegacyGraph, cfg: QuantConfig, deployment: Deployment) -> dict[str, str]:
    """Freeze the trained test program in place (PTQ's deployable form); returns {weight: why left float}."""
    acts = [op for op in graph.ops() if op.type == ACT_OP]
    if any(not graph.attr(op, "is_test") for op in acts):
        raise QuantError("convert takes the test program: call quant_aware(test_program, ..., for_test=True)")
    if not acts:
        raise QuantError("the program has no fake-quant op; call quant_aware(program, ..., for_test=True) first")
    scales = learned_scales(graph)
    if any(v <= 0 for v in scales.values()):
        raise QuantError("an activation scale is still 0: train the program (or pass scale_dict) before convert")
    for op in [op for op in graph.ops() if op.type in (ACT_OP, *WEIGHT_OPS)]:
        graph.bypass(op, "X")
    ops = [OpTarget(op, graph.weight_operand(op), graph.activation_operands(op))
           for op in graph.ops(cfg.effective_op_types, skip_patterns=cfg.not_quant_pattern)]
    per_channel = cfg.weight_quantize_type == "channel_wise_abs_max"

    def plan(thresholds: Mapping[str, float]) -> list[Planned]:
        return [Planned(t, {a.name: thresholds.get(a.name, scales.get(a.name, 0.0)) for a in t.activations},
                        per_channel=per_channel) for t in ops if all(a.name in scales for a in t.activations)]

    done = deployment.rewrite(graph, deployment.plan(graph, ops, calibrated=False), scales, plan)
    return {a.planned.target.weight.name: a.left_float for a in done.applied
            if a.left_float and a.planned.target.weight is not None}
