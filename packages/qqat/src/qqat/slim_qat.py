"""PaddleSlim 2.6's ``SlimQuantConfig`` / ``SlimQAT``: dygraph QAT through Paddle's ``QuantConfig`` flow.

Both are Paddle's own classes with checks added. ``SlimQuantConfig`` is
``paddle.quantization.QuantConfig`` (global, per-type, per-name and per-layer quanter factories);
its methods refuse bad input in one line instead of ignoring it. ``SlimQAT`` is
``paddle.quantization.QAT``: ``quantize`` swaps each configured ``Conv2D`` / ``Linear`` for Paddle's
``QuantedConv2D`` / ``QuantedLinear`` (one weight quanter and one activation quanter, made by the
factories) and wraps other configured leaf layers in Paddle's ``ObserveWrapper``; ``convert`` leaves
Paddle's ``LinearQuanter`` / ``LinearDequanter`` layers with integer-valued weights, which
``paddle.jit.save`` writes as ``quantize_linear`` / ``dequantize_linear`` ops.

``convert`` differs from Paddle's in one place: Paddle 3.3.1's own convert fails on every quanter
whose ``zero_points()`` is None (its ``FakeQuanterWithAbsMaxObserver`` among them: ``LinearQuanter``
calls ``paddle.to_tensor(None)``), so such a quanter is first wrapped to report zeros.
"""

from __future__ import annotations

import copy
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import paddle
from paddle import nn
from paddle.quantization import QAT, QuantConfig
from paddle.quantization.base_quanter import BaseQuanter
from paddle.quantization.factory import QuanterFactory

from qcore.deploy import Deployment
from qcore.errors import ConfigError, QuantError
from qcore.graph import open_graph
from qcore.model_io import ModelFiles, check_model_output, export_layer, load_model
from qcore.paddle_env import layer_mode

log = logging.getLogger(__name__)


def _check_quanter(quanter: Any, what: str) -> None:
    """``quanter`` must be None or a quanter factory (an instance, not the class, not a quanter layer)."""
    if quanter is None or isinstance(quanter, QuanterFactory):
        return
    name = getattr(quanter, "__name__", type(quanter).__name__)
    if isinstance(quanter, type) and issubclass(quanter, QuanterFactory):
        raise ConfigError(f"{what}={name} is a factory class; call it: {name}() (e.g. {name}() with its keywords)")
    if isinstance(quanter, BaseQuanter) or (isinstance(quanter, type) and issubclass(quanter, BaseQuanter)):
        raise ConfigError(f"{what}={name} is a quanter layer; pass its factory, e.g. "
                          "FakeQuanterWithAbsMaxObserver(moving_rate=0.9) or qqat.quanters.PACTQuanter()")
    raise ConfigError(f"{what}={quanter!r} is not a quanter factory; pass e.g. "
                      "paddle.quantization.quanters.FakeQuanterWithAbsMaxObserver(moving_rate=0.9) or None")


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


class SlimQuantConfig(QuantConfig):
    """Paddle's ``QuantConfig`` (PaddleSlim 2.6's name) that refuses bad input in one line.

    ``activation`` / ``weight``: the global quanter factories (None: only the layers configured by
    :meth:`add_type_config`, :meth:`add_name_config` or :meth:`add_layer_config` are quantized).
    Priority as in Paddle: layer > name > type > parent's config > global. Raises
    :class:`qcore.errors.ConfigError` for anything that is not a quanter factory.
    """

    def __init__(self, activation: QuanterFactory | None = None, weight: QuanterFactory | None = None) -> None:
        _check_quanter(activation, "activation")
        _check_quanter(weight, "weight")
        super().__init__(activation, weight)
        self._layer_names: set[str] = set()  # every full_name configured by name or layer: checked by quantize

    def add_type_config(self, layer_type: type[nn.Layer] | Sequence[type[nn.Layer]],
                        activation: QuanterFactory | None = None, weight: QuanterFactory | None = None) -> None:
        """Quanters for every layer of ``layer_type`` (a ``paddle.nn.Layer`` subclass, or a list of them)."""
        for kind in _as_list(layer_type):
            if not (isinstance(kind, type) and issubclass(kind, nn.Layer)):
                hint = "add_layer_config(layer, ...)" if isinstance(kind, nn.Layer) else "paddle.nn.Conv2D"
                raise ConfigError(f"add_type_config: layer type {kind!r} is not a paddle.nn.Layer subclass; "
                                  f"pass the class, e.g. paddle.nn.Conv2D (for one layer: {hint})")
        self._check(activation, weight)
        for kind in _as_list(layer_type):
            super().add_type_config(kind, activation=activation, weight=weight)

    def add_name_config(self, layer_name: str | Sequence[str], activation: QuanterFactory | None = None,
                        weight: QuanterFactory | None = None) -> None:
        """Quanters for the layer(s) whose ``full_name()`` is ``layer_name`` (checked by ``SlimQAT.quantize``)."""
        names = _as_list(layer_name)
        bad = [n for n in names if not isinstance(n, str)]
        if bad:
            raise ConfigError(f"add_name_config: {bad[0]!r} is not a layer name; pass layer.full_name() strings "
                              "or use add_layer_config(layer, ...)")
        self._check(activation, weight)
        self._layer_names.update(names)
        for name in names:
            super().add_name_config(name, activation=activation, weight=weight)

    def add_layer_config(self, layer: nn.Layer | Sequence[nn.Layer], activation: QuanterFactory | None = None,
                         weight: QuanterFactory | None = None) -> None:
        """Quanters for the given layer instance(s)."""
        layers = _as_list(layer)
        bad = [item for item in layers if not isinstance(item, nn.Layer)]
        if bad:
            raise ConfigError(f"add_layer_config: {bad[0]!r} is not a paddle.nn.Layer instance; pass the model's "
                              "layer (for every layer of a type: add_type_config)")
        self.add_name_config([item.full_name() for item in layers], activation=activation, weight=weight)

    def add_constraints(self, constraints: Any) -> None:
        """PaddleSlim's conv+BN training constraints: not supported (one-line :class:`ConfigError`)."""
        raise ConfigError("SlimQuantConfig.add_constraints (PaddleSlim's conv + batch-norm constraints) is not "
                          "supported; drop it (convolutions and batch norms then train unfused) or use qqat.QAT, "
                          "whose save_quantized_model folds batch norms")

    @staticmethod
    def _check(activation: Any, weight: Any) -> None:
        _check_quanter(activation, "activation")
        _check_quanter(weight, "weight")


class _ZeroPointed(BaseQuanter):
    """A trained quanter seen by ``convert`` with zero points (zeros) where it reports None."""

    def __init__(self, quanter: BaseQuanter) -> None:
        super().__init__()
        self.quanter = quanter

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.quanter(x)

    def scales(self) -> Any:
        return self.quanter.scales()

    def zero_points(self) -> paddle.Tensor:
        return paddle.zeros_like(paddle.to_tensor(self.quanter.scales(), dtype="float32"))

    def quant_axis(self) -> Any:
        return self.quanter.quant_axis()

    def bit_length(self) -> Any:
        return self.quanter.bit_length()


def _quanters(model: nn.Layer) -> list[tuple[nn.Layer, str, BaseQuanter]]:
    """Every quanter in ``model`` as (parent, attribute name, quanter); quanters inside quanters are not listed."""
    found = []
    for parent in [model, *model.sublayers()]:
        if isinstance(parent, BaseQuanter):
            continue
        for name, child in parent.named_children():
            if isinstance(child, BaseQuanter):
                found.append((parent, name, child))
    return found


class SlimQAT(QAT):
    """Paddle's ``QAT`` (PaddleSlim 2.6's ``SlimQAT``) driven by a :class:`SlimQuantConfig`.

    ``config`` may also be Paddle's own ``paddle.quantization.QuantConfig``; anything else raises
    :class:`qcore.errors.ConfigError` (the dict configs of the seeds' ``paddleslim.QAT`` go to
    :class:`qqat.QAT`).
    """

    def __init__(self, config: QuantConfig) -> None:
        if not isinstance(config, QuantConfig):
            raise ConfigError(f"SlimQAT takes a SlimQuantConfig, got {type(config).__name__}; build "
                              "SlimQuantConfig(activation=..., weight=...) (for a dict config use qqat.QAT)")
        super().__init__(config)

    def quantize(self, model: nn.Layer, inplace: bool = False, inputs: Any = None) -> nn.Layer:
        """Swap every configured layer for its quantized form (Paddle's QAT); returns the quantized model.

        ``inplace=False`` works on a deep copy. ``inputs`` (optional: a tensor or a list of tensors, as
        PaddleSlim takes them) are run once through the quantized model in eval mode without gradients;
        quantized layers the forward never reaches are named in a warning (they would train nothing and
        export their initial scales). The model may be in train or eval mode (Paddle's QAT requires train).
        """
        if isinstance(model, paddle.DataParallel):
            raise QuantError("quantize the model before wrapping it: paddle.DataParallel(SlimQAT(config).quantize"
                             "(model)), not SlimQAT(config).quantize(paddle.DataParallel(model))")
        if not isinstance(model, nn.Layer):
            raise QuantError(f"quantize expects a paddle.nn.Layer, got {type(model).__name__}")
        names = getattr(self._config, "_layer_names", set())
        missing = sorted(names - {layer.full_name() for layer in model.sublayers()})
        if missing:
            raise ConfigError(f"add_name_config / add_layer_config named {', '.join(missing)}, which no layer of "
                              "this model has as full_name(); pass names from [l.full_name() for l in "
                              "model.sublayers()]")
        with layer_mode(model, training=True):  # Paddle's QAT.quantize asserts train mode
            quantized = super().quantize(model, inplace=inplace)
        if not model.training:
            quantized.eval()
        if not _quanters(quantized):
            log.warning("SlimQAT.quantize: no layer of the model is configured; nothing is quantized")
        elif inputs is not None:
            self._check_reached(quantized, inputs)
        return quantized

    @staticmethod
    def _check_reached(model: nn.Layer, inputs: Any) -> None:
        """Run ``inputs`` once (eval, no gradients) and warn about the quanters the forward never reaches."""
        quanters = {id(q): f"{_path(model, parent)}{name}" for parent, name, q in _quanters(model)}
        reached: set[int] = set()
        hooks = [q.register_forward_post_hook(lambda layer, _in, _out: reached.add(id(layer)))
                 for _, _, q in _quanters(model)]
        try:
            with layer_mode(model, training=False), paddle.no_grad():
                model(*_as_list(inputs))
        finally:
            for hook in hooks:
                hook.remove()
        unreached = [path for key, path in quanters.items() if key not in reached]
        if unreached:
            log.warning("SlimQAT.quantize: the forward on `inputs` never reaches %d quanter(s): %s; they will "
                        "train nothing and export their initial scales", len(unreached), ", ".join(unreached))

    def convert(self, model: nn.Layer, inplace: bool = False, remain_weight: bool = False) -> nn.Layer:
        """Replace every quanter by Paddle's ``LinearQuanter`` / ``LinearDequanter`` (Paddle's QAT convert).

        Weights become their integer codes (float32 tensors holding integers) read through
        ``LinearDequanter``, unless ``remain_weight=True``. Raises :class:`qcore.errors.QuantError`
        naming the quanter when a scale is not a positive finite number (nothing trained it) and
        :class:`qcore.errors.ConfigError` for a learned offset (``ActLSQplusQuanter(symmetric=False)``).
        """
        converted = model if inplace else copy.deepcopy(model)
        for parent, name, quanter in _quanters(converted):
            where = f"{_path(converted, parent)}{name}"
            problem = getattr(quanter, "offset_problem", lambda: None)()
            if problem is not None:
                raise ConfigError(f"cannot convert {where}: {problem}")
            scales = quanter.scales()
            if scales is None:
                continue  # Paddle's convert leaves such a layer as it is
            values = paddle.to_tensor(scales, dtype="float32")
            if not bool(paddle.all(paddle.isfinite(values))) or float(values.min()) <= 0:
                raise QuantError(f"cannot convert {where}: its scale is {values.numpy().ravel()[:4]}, not positive "
                                 "and finite; train the quantized model (forward passes in train mode) before convert")
            if quanter.zero_points() is None:
                setattr(parent, name, _ZeroPointed(quanter))
        return super().convert(converted, inplace=True, remain_weight=remain_weight)


    def save_quantized_model(
        self, model: nn.Layer, path: str | os.PathLike[str], input_spec: Sequence[Any] | None = None, *,
        deploy_backend: str | None = None,
    ) -> ModelFiles:
        """Write a converted model (:meth:`convert`) as ``<path>.pdmodel`` + ``<path>.pdiparams`` for a runtime.

        ``paddle.jit.save`` (legacy: Paddle 3.3.1's PIR save of ``LinearQuanter`` is broken) into a scratch
        directory, then the weight codes Paddle stores as float32 become int8 (:meth:`qcore.graph.Graph.
        int8_weight_codes`: oneDNN int8 runs float32 codes wrongly, 9.75 % instead of 86 % top-1 on the demo)
        and the model is saved atomically through ``deploy_backend``'s door (marked for it, with the
        companion files it runs, e.g. ``inference.onnx`` for the ONNX targets).
        """
        deployment = Deployment(deploy_backend)
        prefix = Path(path)
        names = (prefix.name + ".pdmodel", prefix.name + ".pdiparams")
        check_model_output(prefix.parent, "legacy", *names)
        with tempfile.TemporaryDirectory(prefix="slimqat-export-") as scratch:
            export_layer(model, Path(scratch) / "model", input_spec, "legacy")
            graph = open_graph(load_model(scratch))
            if not graph.int8_weight_codes():
                raise QuantError("the model has no integer weight codes: call SlimQAT.convert(model) before saving")
            return deployment.save(graph, prefix.parent, *names)


def _path(model: nn.Layer, layer: nn.Layer) -> str:
    """``layer``'s sublayer path in ``model`` with a trailing dot ('' for the model itself)."""
    for name, sub in model.named_sublayers():
        if sub is layer:
            return f"{name}."
    return ""
