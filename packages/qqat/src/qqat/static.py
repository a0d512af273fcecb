"""Static-graph quantization-aware training on PIR programs: ``quant_aware`` and ``convert``.

``quant_aware`` puts fake-quant ops in front of every quantized op of a *forward* program:

* training program (``for_test=False``): activations go through
  ``pd_op.fake_quantize_dequantize_moving_average_abs_max_`` (its accum/state are written
  back to persistable variables each step; ``activation_quantize_type='abs_max'`` uses
  ``fake_quantize_dequantize_abs_max`` and keeps the last batch's scale; ``range_abs_max``
  has no PIR op with a gradient and is trained as ``moving_average_abs_max``), weights through
  ``pd_op.fake_channel_wise_quantize_dequantize_abs_max`` (``channel_wise_abs_max``) or the
  per-tensor ``fake_quantize_dequantize_abs_max`` (every other weight type: weights change
  every step, so a range or moving average of them only lags). All have straight-through
  gradients registered in Paddle, so ``optimizer.minimize`` called *afterwards* builds a
  backward through them.
* test program (``for_test=True``): the same weight op and the activation op with
  ``is_test=True``, reading the scale the training program learns (shared by name in the
  scope). This activation op is exactly the deployable PIR form ``qcore.graph`` writes.

``convert`` freezes a trained test program: the weight fake-quant ops go away and each
weight becomes a float parameter holding its quantize-dequantized values (``save_int8``:
also a copy with int8-stored weights, the form ``qcore.graph.Graph.quantize_weight`` writes).

PIR builds the backward when ``optimizer.minimize`` runs, so ``quant_aware`` must be called
on the forward program *before* ``minimize`` (and the test program cloned before both).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import paddle

from qcore.config import QuantConfig
from qcore.deploy import Deployment
from qcore.errors import ConfigError, GraphError, QuantError
from qcore.graph import Graph, Operand, OpRef, PirGraph
from qcore.model_io import Model
from qcore.paddle_env import static_mode
from qcore.quant import abs_max, fake_quantize

from .config import static_config
from .hooks import Hook, apply_hooks, initialise_new
from .legacy_static import convert_legacy, learned_scales, quant_aware_legacy
from .legacy_static import graph_of as legacy_graph

log = logging.getLogger(__name__)

_ACT_OP = "pd_op.fake_quantize_dequantize_moving_average_abs_max"
_WEIGHT_OPS = ("pd_op.fake_channel_wise_quantize_dequantize_abs_max", "pd_op.fake_quantize_dequantize_abs_max")
_INT8_MAPS: dict[Any, Any] = {}  # int8 program -> IrMapping from the converted program


def _family(program: Any, what: str) -> str:
    """'pir' or 'legacy' for the two static program kinds; one line for anything else."""
    if isinstance(program, paddle.pir.Program):
        return "pir"
    if isinstance(program, paddle.base.framework.Program):
        return "legacy"
    if isinstance(program, paddle.static.CompiledProgram):
        raise QuantError(f"{what} takes the Program, not a CompiledProgram; pass the program you compiled")
    raise QuantError(f"{what} takes a paddle.static.Program (legacy) or paddle.pir.Program; got "
                     f"{type(program).__name__}")


def _check_slim_keywords(calib_config: Mapping[str, Any] | None, model_type: str | None) -> None:
    if calib_config:
        raise ConfigError("calib_config (PTQ-initialised scales) is not supported; pass scale_dict={tensor: scale} "
                          "from qptq.quant_post_static's report, or leave it out (scales learn from 0)")
    if model_type is not None:
        raise ConfigError(f"model_type={model_type!r} is not supported; list the op types to quantize in "
                          "config['quantize_op_types'] (e.g. add 'matmul_v2' for transformers)")


def _graph(program: Any, scope: Any) -> PirGraph:
    return PirGraph(Model(program, [], [], scope or paddle.static.global_scope(), "pir"))


def _targets(graph: Graph, cfg: QuantConfig) -> list[tuple[OpRef, Operand | None, list[Operand]]]:
    """(op, weight operand, activation operands) of every op to quantize, read before any edit."""
    return [
        (op, graph.weight_operand(op), graph.activation_operands(op))
        for op in graph.ops(cfg.effective_op_types, skip_patterns=cfg.not_quant_pattern)
    ]


class _Builder:
    """Builds the fake quantization of an op's inputs, or the hooks' ops, into a PIR program just before the op."""

    def __init__(self, graph: PirGraph, cfg: QuantConfig, for_test: bool) -> None:
        self.graph, self.cfg, self.for_test = graph, cfg, for_test

    def activation(self, op: OpRef, x: Any, name: str, hooks: tuple[Hook, Hook]) -> Any:
        cfg = self.cfg
        # activation_quantize_type='abs_max': this batch's abs max; the test program reads the last
        return apply_hooks(x, hooks, lambda v: self.graph.fake_quant_activation(
            op, v, name, cfg.activation_bits, cfg.moving_rate, test=self.for_test,
            batch_abs_max=cfg.activation_quantize_type == "abs_max"))

    def weight(self, op: OpRef, w: Any, axis: int | None, hooks: tuple[Hook, Hook]) -> Any:
        return apply_hooks(w, hooks, lambda v: self.graph.fake_quant_weight(op, v, self.cfg.weight_bits, axis))


def quant_aware(
    program: Any,
    place: Any,
    config: Mapping[str, Any] | QuantConfig | None,
    scope: Any = None,
    for_test: bool = False,
    weight_quantize_func: Hook = None,
    act_quantize_func: Hook = None,
    weight_preprocess_func: Hook = None,
    act_preprocess_func: Hook = None,
    optimizer_func: Callable[[], Any] | None = None,
    executor: Any = None,
    return_program: bool = False,
    calib_config: Mapping[str, Any] | None = None,
    draw_graph: bool = False,
    return_scale_dict: bool = False,
    scale_dict: Mapping[str, float] | None = None,
    model_type: str | None = None,
    pattern_ops: Any = None,
) -> Any:
    """Insert fake quantization into ``program`` (PIR or legacy) in place and return it.

    PIR: call it on the training program *before* ``optimizer.minimize`` and on the test program
    (cloned with ``clone(for_test=True)`` before both) with ``for_test=True``. The hooks take
    and return a ``paddle.pir.Value`` and replace (``*_quantize_func``) or precede
    (``*_preprocess_func``) the built-in quantization; parameters they create are initialised
    right away with ``executor`` (a CPU executor when None) and are trained by the program's
    own ``minimize``, which is why ``optimizer_func`` is not needed under PIR (see the docs).
    Legacy programs (:mod:`qqat.legacy_static`): before or after ``minimize``; the hooks take and return a
    legacy ``Variable``; after ``minimize`` the hooks' ops get their gradient ops and their parameters are
    trained by ``optimizer_func()`` (PaddleSlim's order), before it the program's own ``minimize`` trains them.
    ``place`` is accepted for compatibility; the executor decides the device. PaddleSlim 2.6's keywords:
    ``scale_dict`` ({activation: scale}) starts the activation scales there (legacy programs);
    ``return_scale_dict`` returns ``(program, {activation: scale})``; ``return_program`` and ``draw_graph``
    are accepted (a Program is always returned, nothing is drawn); ``calib_config``, ``model_type`` and
    ``pattern_ops`` are refused with the alternative named when set.
    """
    family = _family(program, "quant_aware")
    cfg = static_config(config)
    _check_slim_keywords(calib_config, model_type)
    if pattern_ops is not None:
        raise ConfigError("pattern_ops is not supported; list the op types in config['quantize_op_types']")
    del return_program, draw_graph
    if family == "legacy":
        graph = legacy_graph(program, scope)
        hooks = (act_preprocess_func, act_quantize_func, weight_preprocess_func, weight_quantize_func)
        with static_mode("legacy", graph.model.scope):
            scales = quant_aware_legacy(graph, cfg, for_test, scale_dict, hooks, optimizer_func, executor)
        if not scales:
            log.warning("no op of %s found in the program: nothing to quantize", list(cfg.effective_op_types))
        return (program, learned_scales(graph)) if return_scale_dict else program
    if scale_dict:
        raise ConfigError("scale_dict starts legacy programs' scales; PIR programs learn them from 0")
    if optimizer_func is not None:
        log.info("optimizer_func is not used under PIR: minimize() after quant_aware trains the hooks' parameters")
    graph = _graph(program, scope)
    targets = _targets(graph, cfg)
    if not targets:
        log.warning("no op of %s found in the program: nothing to quantize", list(cfg.effective_op_types))
    builder = _Builder(graph, cfg, for_test)
    done: dict[str, Any] = {}
    with static_mode("pir", graph.model.scope):
        for op, weight, activations in targets:
            with graph.inserting_before(op):
                for i, act in enumerate(activations):
                    if act.name not in done:  # a tensor several ops read is quantized once
                        name = f"{weight.name}@act{i}" if weight is not None else f"{act.name}@act"
                        hooks = (act_preprocess_func, act_quantize_func)
                        done[act.name] = builder.activation(op, act.value, name, hooks)
                    graph.rename_input(op, act.value, done[act.name])
                if weight is not None:
                    hooks = (weight_preprocess_func, weight_quantize_func)
                    graph.rename_input(op, weight.value, builder.weight(op, weight.value, _axis(graph, op, cfg), hooks))
    initialise_new(graph.startup, graph.model.scope, executor)
    if return_scale_dict:
        return program, {name: 0.0 for name in done}
    return program


def _strip_weight_quant(graph: Graph) -> None:
    """Make each op read its float weight again; drop the weight fake-quant ops."""
    for op in [op for op in graph.ops() if op.type in _WEIGHT_OPS]:
        graph.bypass(op, "x")


def convert(
    program: Any,
    place: Any,
    config: Mapping[str, Any] | QuantConfig | None,
    scope: Any = None,
    save_int8: bool = False,
    *,
    deploy_backend: str | None = None,
) -> Any:
    """Freeze a trained test program (from ``quant_aware(..., for_test=True)``) in place.

    Returns the program, whose weights are float parameters holding quantize-dequantized
    values and whose activations go through the frozen QDQ op. Ops quantized by custom
    ``*_quantize_func`` hooks keep the hooks' ops (qqat cannot know what they compute). With ``save_int8`` returns
    ``(program, int8_program)``; the second stores int8 weights (a quarter of the size) and
    runs in the executor and ``paddle.inference`` too. Get its feed/fetch values for
    ``paddle.static.save_inference_model`` with :func:`int8_values`. ``deploy_backend`` (PaddleSlim 2.6's
    keyword, see :mod:`qcore.deploy`) is validated; the program is PIR, which only ``tensorrt`` runs with
    int8 kernels (not run here), so for the CPU backends it warns that the result runs float kernels there.
    """
    family = _family(program, "convert")
    cfg = static_config(config)
    if deploy_backend is None and isinstance(config, Mapping):
        deploy_backend = config.get("deploy_backend")  # PaddleSlim 2.6's config key
    scope = scope or paddle.static.global_scope()
    if family == "legacy":
        deployment = Deployment(deploy_backend, weight_bits=cfg.weight_bits, activation_bits=cfg.activation_bits)
        deployment.check("", "legacy")
        with static_mode("legacy", scope):
            left_float = convert_legacy(legacy_graph(program, scope), cfg, deployment)
        for weight, why in left_float.items():
            log.info("convert: %s stays float (%s)", weight, why)
        return (program, program) if save_int8 else program
    float_kernels = Deployment(deploy_backend).float_kernels_problem("pir")
    if deploy_backend is not None and float_kernels is not None:
        log.warning("convert: %s; for int8 speed on it export a legacy model (QAT.save_quantized_model(..., "
                    "family='legacy'))", float_kernels)
    graph = _graph(program, scope)
    acts = [op for op in graph.ops() if op.type in (_ACT_OP, _ACT_OP + "_")]
    if any(not graph.attr(op, "is_test") for op in acts):
        raise QuantError("convert takes the test program: call quant_aware(test_program, ..., for_test=True)")
    if not acts:
        raise QuantError("the program has no fake-quant op; call quant_aware(program, ..., for_test=True) first")
    with static_mode("pir", scope):
        _strip_weight_quant(graph)
        targets = [(op, w) for op, w, _ in _targets(graph, cfg) if w is not None]
        int8 = None
        if save_int8:
            mapping = paddle.pir.IrMapping()
            int8 = program.clone(mapping)
            _INT8_MAPS[int8] = mapping
            int8_graph = _graph(int8, scope)
            for op, weight, _ in _targets(int8_graph, cfg):
                if weight is not None:
                    int8_graph.quantize_weight(weight, cfg.weight_bits, _axis(int8_graph, op, cfg))
        for op, weight in targets:
            w = graph.get_param(weight.name)
            axis = _axis(graph, op, cfg)
            graph.replace_weight(weight, fake_quantize(w, abs_max(w, axis), cfg.weight_bits, axis), "quant_dequant")
    return (program, int8) if save_int8 else program


def _axis(graph: Graph, op: OpRef, cfg: QuantConfig) -> int | None:
    return graph.weight_channel_axis(op) if cfg.weight_quantize_type == "channel_wise_abs_max" else None


def int8_values(int8_program: Any, values: Iterable[Any]) -> list[Any]:
    """The values of ``int8_program`` (from ``convert(save_int8=True)``) matching ``values``
    of the converted program, e.g. the feed and fetch values for ``save_inference_model``."""
    mapping = _INT8_MAPS.get(int8_program)
    if mapping is None:
        raise GraphError("int8_program does not come from convert(..., save_int8=True) in this process")
    return [mapping.look_up(v) for v in values]


__all__ = ["convert", "int8_values", "quant_aware"]
