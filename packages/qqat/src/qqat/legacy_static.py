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

import numpy as np
import paddle

from qcore.config import QuantConfig
from qcore.deploy import Deployment, OpTarget
from qcore.deploy.apply import Planned
from qcore.errors import QuantError
from qcore.graph import Graph, open_graph
from qcore.model_io import Model

ACT_OP = "fake_quantize_dequantize_moving_average_abs_max"
WEIGHT_OPS = ("fake_channel_wise_quantize_dequantize_abs_max", "fake_quantize_dequantize_abs_max")
_ROUND_HALF_EVEN = 0  # Paddle's round_type 0, what qcore.quant uses
_BACKWARD = 0x0001  # op_role bit of gradient ops


def graph_of(program: Any, scope: Any) -> Graph:
    return open_graph(Model(program, [], [], scope or paddle.static.global_scope(), "legacy"))


def quant_aware_legacy(program: Any, graph: Graph, cfg: QuantConfig, for_test: bool,
                       scale_dict: Mapping[str, float] | None) -> dict[str, str]:
    """Insert the fake quant-dequant ops into ``program`` in place; returns {activation: its scale variable}."""
    block = program.global_block()
    scope = graph.model.scope
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
                done[act.name] = _activation(block, scope, op.raw, act.name, state, cfg, for_test, initial)
                scales[act.name] = f"{state}@scale"
            renames[act.name] = done[act.name]
        if weight is not None:
            axis = graph.weight_channel_axis(op) if cfg.weight_quantize_type == "channel_wise_abs_max" else None
            renames[weight.name] = _weight(block, op.raw, weight.name, axis, cfg.weight_bits)
        for old, new in renames.items():
            op.raw._rename_input(old, new)
        if not for_test:
            for grad in _gradient_ops(block, op.raw):
                for old, new in renames.items():
                    grad._rename_input(old, new)
    return scales


def _state(block: Any, scope: Any, name: str, value: float) -> str:
    if not block.has_var(name):
        block.create_var(name=name, shape=[1], dtype="float32", persistable=True)
    if scope.find_var(name) is None:  # the test program reads what the training program learns
        scope.var(name).get_tensor().set(np.array([value], np.float32), paddle.CPUPlace())
    return name


def _tmp(block: Any, base: str, like: str) -> str:
    name, k = base, 1
    while block.has_var(name):
        k += 1
        name = f"{base}_{k}"
    src = block._find_var_recursive(like)
    block.create_var(name=name, shape=src.shape if src is not None else None, dtype="float32")
    return name


def _activation(block: Any, scope: Any, before: Any, x: str, state: str, cfg: QuantConfig, for_test: bool,
                initial: float) -> str:
    scale, accum, flag = (_state(block, scope, f"{state}@{k}", v)
                          for k, v in (("scale", initial), ("accum", initial), ("state", 1.0 if initial else 0.0)))
    out = _tmp(block, f"{x}.quant_dequant", x)
    block._insert_op(
        _index(block, before), type=ACT_OP,
        inputs={"X": [x], "InScale": [scale], "InAccum": [accum], "InState": [flag]},
        outputs={"Out": [out], "OutScale": [scale], "OutAccum": [accum], "OutState": [flag]},
        attrs={"moving_rate": cfg.moving_rate, "bit_length": cfg.activation_bits, "is_test": for_test,
               "round_type": _ROUND_HALF_EVEN},
    )
    return out


def _weight(block: Any, before: Any, w: str, axis: int | None, bits: int) -> str:
    out = _tmp(block, f"{w}.quant_dequant", w)
    op_scale = _tmp(block, f"{w}.quant_dequant@scale", w)
    attrs: dict[str, Any] = {"bit_length": bits, "round_type": _ROUND_HALF_EVEN}
    if axis is not None:
        attrs["quant_axis"] = axis
    block._insert_op(_index(block, before), type=WEIGHT_OPS[0] if axis is not None else WEIGHT_OPS[1],
                     inputs={"X": [w]}, outputs={"Out": [out], "OutScale": [op_scale]}, attrs=attrs)
    return out


def _index(block: Any, raw: Any) -> int:
    return next(i for i, op in enumerate(block.ops) if op.desc == raw.desc)


def _gradient_ops(block: Any, forward: Any) -> list[Any]:
    """The gradient ops of ``forward`` already in the program: they read its outputs' gradients."""
    grads = {f"{name}@GRAD" for name in forward.output_arg_names}
    return [op for op in block.ops
            if op.has_attr("op_role") and int(op.attr("op_role")) & _BACKWARD and op.type == f"{forward.type}_grad"
            and grads & set(op.input_arg_names)]


def learned_scales(program: Any, scope: Any) -> dict[str, float]:
    """{activation: learned scale} of the test program's activation fake ops."""
    scales = {}
    for op in program.global_block().ops:
        if op.type == ACT_OP:
            var = scope.find_var(op.input("InScale")[0])
            scales[op.input("X")[0]] = float(np.array(var.get_tensor()).reshape(-1)[0])
    return scales


def convert_legacy(program: Any, graph: Graph, cfg: QuantConfig, deployment: Deployment) -> dict[str, str]:
    """Freeze the trained test program in place (PTQ's deployable form); returns {weight: why left float}."""
    block = program.global_block()
    acts = [op for op in block.ops if op.type == ACT_OP]
    if any(not op.attr("is_test") for op in acts):
        raise QuantError("convert takes the test program: call quant_aware(test_program, ..., for_test=True)")
    if not acts:
        raise QuantError("the program has no fake-quant op; call quant_aware(program, ..., for_test=True) first")
    scales = learned_scales(program, graph.model.scope)
    if any(v <= 0 for v in scales.values()):
        raise QuantError("an activation scale is still 0: train the program (or pass scale_dict) before convert")
    for op in [op for op in block.ops if op.type in (ACT_OP, *WEIGHT_OPS)]:
        source, out = op.input("X")[0], op.output("Out")[0]
        for reader in block.ops:
            if out in reader.input_arg_names:
                reader._rename_input(out, source)
        block._remove_op(_index(block, op))
    graph = graph_of(program, graph.model.scope)
    ops = [OpTarget(op, graph.weight_operand(op), graph.activation_operands(op))
           for op in graph.ops(cfg.effective_op_types, skip_patterns=cfg.not_quant_pattern)]
    per_channel = cfg.weight_quantize_type == "channel_wise_abs_max"

    def plan(thresholds: Mapping[str, float]) -> list[Planned]:
        return [Planned(t, {a.name: thresholds.get(a.name, scales.get(a.name, 0.0)) for a in t.activations},
                        per_channel=per_channel) for t in ops if all(a.name in scales for a in t.activations)]

    done = deployment.rewrite(graph, deployment.plan(graph, ops, calibrated=False), scales, plan)
    return {a.planned.target.weight.name: a.left_float for a in done.applied
            if a.left_float and a.planned.target.weight is not None}
