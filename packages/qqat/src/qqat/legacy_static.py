"""Static-graph QAT on legacy ProgramDesc programs (``FLAGS_enable_pir_api=0``, PaddleSlim-era scripts).

:func:`quant_aware` inserts Paddle's legacy fake quant-dequant ops in front of every quantized op:
``fake_quantize_dequantize_moving_average_abs_max`` on activations (``is_test`` in the test program,
which reads the scale the training program learns: the state variables are persistable and shared by
name in the scope) and ``fake_channel_wise_quantize_dequantize_abs_max`` (or the per-tensor
``fake_quantize_dequantize_abs_max``) on weights. Both have straight-through gradients, so
``optimizer.minimize`` may run after ``quant_aware``. When it ran before (the PaddleSlim demo's order),
each quantized op's gradient op is pointed at the quantized inputs: the weight and activation gradients
are then those of the quantized forward, passed straight through to the float tensors. The user-defined hooks
(:mod:`qqat.hooks`) are built before the op too; in that order their own gradient ops follow the op's.

:func:`convert` freezes a trained test program into the form post-training quantization writes: the fake
ops go, and the learned activation scales and the weights' abs max go through the deployment target's rules
(:meth:`qcore.deploy.Deployment.rewrite`), so the result runs on every target like a PTQ output.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import paddle
from paddle.base.framework import Operator, Parameter

from qcore.config import QuantConfig
from qcore.deploy import Deployment, OpTarget
from qcore.deploy.apply import Planned
from qcore.errors import ConfigError, QuantError
from qcore.graph import LegacyGraph, OpRef
from qcore.model_io import Model

from .hooks import Hook, apply_hooks, initialise_new

Hooks = tuple[Hook, Hook, Hook, Hook]

ACT_OP = "fake_quantize_dequantize_moving_average_abs_max"
WEIGHT_OPS = ("fake_channel_wise_quantize_dequantize_abs_max", "fake_quantize_dequantize_abs_max")


def graph_of(program: Any, scope: Any) -> LegacyGraph:
    return LegacyGraph(Model(program, [], [], scope or paddle.static.global_scope(), "legacy"))


@dataclass
class _Hooked:
    """A tensor the hooks rewrote: ``source`` is read as ``out``; the gradient at ``end`` (the last hook's output,
    the built-in fake quant passing it straight through) flows back to ``source`` and ``params``."""

    source: str
    slot: str
    end: str
    params: list[Any]


def _index(block: Any, op: OpRef) -> int:
    return next(i for i, raw in enumerate(block.ops) if raw is op.raw)


def _move_tail(block: Any, start: int, index: int) -> None:
    """Move the ops appended to ``block`` from ``start`` on to position ``index`` (< ``start``), in order."""
    tail = block.ops[start:]
    for k, raw in enumerate(tail):
        desc = block.desc._insert_op(index + k)
        desc.copy_from(raw.desc)
        block.ops.insert(index + k, Operator(block, desc))
    for i in reversed(range(start + len(tail), start + 2 * len(tail))):
        block._remove_op(i)


def _with_hooks(graph: LegacyGraph, op: OpRef, name: str, hooks: tuple[Hook, Hook], startup: Any,
                builtin: Callable[[str], str]) -> tuple[str, _Hooked]:
    """Build the hooks (and ``builtin`` when no quantize hook) on tensor ``name`` just before ``op``."""
    block = graph.block
    start, known = len(block.ops), set(block.vars)
    ends: list[str] = []

    def builtin_end(x: Any) -> Any:
        ends.append(x.name)  # the built-in fake quant passes gradients straight through
        return x

    with paddle.static.program_guard(graph.model.program, startup):
        last = apply_hooks(block.var(name), hooks, builtin_end)
    _move_tail(block, start, _index(block, op))
    out = builtin(last.name) if ends else last.name
    params = [v for n, v in block.vars.items() if n not in known and isinstance(v, Parameter) and v.trainable]
    slot = next(k for k in op.raw.input_names if name in op.raw.input(k))
    return out, _Hooked(name, slot, last.name, params)


def _hooks_backward(graph: LegacyGraph, op: OpRef, hooked: list[_Hooked], startup: Any) -> list[tuple[Any, Any]]:
    """Append the hooks' gradient ops after ``op``'s (``minimize`` ran before ``quant_aware``): its gradient op
    now writes the gradient at each hook chain's end, and the chain's own gradient ops carry it to the source
    tensor and the hooks' parameters. Returns the (parameter, gradient) pairs to optimise."""
    block, pairs = graph.block, []
    for grad in graph.gradient_ops(op):
        for h in hooked:
            source_grads = grad.raw.output(h.slot + "@GRAD") if h.slot + "@GRAD" in grad.raw.output_names else []
            if not source_grads and not h.params:
                continue
            source = block.var(h.source)
            at_end = block.create_var(name=paddle.utils.unique_name.generate(f"{h.end}@GRAD"), shape=source.shape,
                                      dtype=source.dtype)
            if source_grads:
                grad.raw._rename_output(source_grads[0], at_end.name)
            else:  # e.g. a feed: the gradient op is asked for the gradient the hooks' parameters need
                grad.raw.desc.set_output(h.slot + "@GRAD", [at_end.name])
            start = len(block.ops)
            with paddle.static.program_guard(graph.model.program, startup):
                inputs = h.params + ([block.var(h.source)] if source_grads else [])
                grads = paddle.static.gradients([block.var(h.end)], inputs, target_gradients=[at_end])
                if source_grads:
                    paddle.assign(grads[-1], output=block.var(source_grads[0]))
            _move_tail(block, start, _index(block, grad) + 1)
            pairs += [(p, g) for p, g in zip(h.params, grads) if g is not None]
    return pairs


def _activation_quant(graph: LegacyGraph, op: OpRef, cfg: QuantConfig, for_test: bool, state: str, initial: float,
                      scales: dict[str, str]) -> Callable[[str], str]:
    """The built-in activation fake quant of ``op``'s input, recording its scale variable in ``scales``."""
    def build(x: str) -> str:
        scales[x] = f"{state}@scale"
        return graph.fake_quant_activation(op, x, state, cfg.activation_bits, cfg.moving_rate, test=for_test,
                                           initial=initial)
    return build


def quant_aware_legacy(graph: LegacyGraph, cfg: QuantConfig, for_test: bool, scale_dict: Mapping[str, float] | None,
                       hooks: Hooks = (None, None, None, None), optimizer_func: Callable[[], Any] | None = None,
                       executor: Any = None) -> dict[str, str]:
    """Insert the fake quant-dequant ops into the graph's program in place; returns {activation: its scale variable}.

    ``hooks`` = (act_preprocess, act_quantize, weight_preprocess, weight_quantize) (:mod:`qqat.hooks`); with
    any set, each op's activation gets its own hook ops. Hooks' parameters are trained by the program's
    ``minimize`` when it runs later, else by ``optimizer_func()`` (required then).
    """
    act_hooks, weight_hooks = hooks[:2], hooks[2:]
    hooked_acts = any(h is not None for h in act_hooks)
    startup = paddle.static.Program()
    targets = [(op, graph.weight_operand(op), graph.activation_operands(op))
               for op in graph.ops(cfg.effective_op_types, skip_patterns=cfg.not_quant_pattern)]
    done: dict[str, str] = {}
    scales: dict[str, str] = {}
    pairs: list[tuple[Any, Any]] = []
    for op, weight, activations in targets:
        renames, hooked = {}, []
        for i, act in enumerate(activations):
            state = f"{weight.name}@act{i}" if weight is not None else f"{act.name}@act"
            initial = (scale_dict or {}).get(act.name, 0.0)

            act_builtin = _activation_quant(graph, op, cfg, for_test, state, initial, scales)
            if hooked_acts:
                renames[act.name], h = _with_hooks(graph, op, act.name, act_hooks, startup, act_builtin)
                hooked.append(h)
            else:
                if act.name not in done:  # a tensor several ops read is quantized once
                    done[act.name] = act_builtin(act.name)
                renames[act.name] = done[act.name]
        if weight is not None:
            axis = graph.weight_channel_axis(op) if cfg.weight_quantize_type == "channel_wise_abs_max" else None
            weight_builtin = functools.partial(graph.fake_quant_weight, op, bits=cfg.weight_bits, axis=axis)
            if any(h is not None for h in weight_hooks):
                renames[weight.name], h = _with_hooks(graph, op, weight.name, weight_hooks, startup, weight_builtin)
                hooked.append(h)
            else:
                renames[weight.name] = weight_builtin(weight.name)
        for old, new in renames.items():
            graph.rename_input(op, old, new)
        if not for_test:
            for grad in graph.gradient_ops(op):
                for old, new in renames.items():
                    graph.rename_input(grad, old, new)
            pairs += _hooks_backward(graph, op, hooked, startup)
    if pairs:
        if optimizer_func is None:
            raise ConfigError("optimizer_func is required: minimize() ran before quant_aware, so the hooks' "
                              "parameters need their own optimizer (e.g. optimizer_func=lambda: "
                              "paddle.optimizer.Momentum(0.0001, 0.9))")
        with paddle.static.program_guard(graph.model.program, startup):
            optimizer_func().apply_gradients(pairs)
    initialise_new(startup, graph.model.scope, executor)
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
