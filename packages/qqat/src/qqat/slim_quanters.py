"""PaddleSlim 2.6's quanter factories for Paddle's ``QuantConfig`` flow (:class:`qqat.SlimQAT`).

Each name is a ``paddle.quantization.factory.QuanterFactory``: the config holds the factory, and
Paddle's quantized layers call it once per layer for an instance (a ``BaseQuanter``). The instances
report ``scales()`` as Paddle's ``quantize_linear`` reads them (the threshold: codes are
``round(x / threshold * qmax)``), so ``SlimQAT.convert`` turns them into Paddle's
``LinearQuanter`` / ``LinearDequanter`` like Paddle's own quanters.

* :class:`PACTQuanter`: PACT. ``clip(x, -alpha, alpha)`` with a trained ``alpha``, then any other
  quanter (by default Paddle's ``FakeQuanterWithAbsMaxObserver``), whose scale is what is exported.
* :class:`ActLSQplusQuanter` / :class:`WeightLSQplusQuanter`: LSQ / LSQ+. A trained step ``s``
  (per tensor; per output channel for weights with ``per_channel=True``), for activations with
  ``symmetric=False`` also a trained offset ``beta``: ``clip(round((x - beta) / s), qmin, qmax) * s + beta``
  with ``qmin = -2**(bits-1)``, ``qmax = 2**(bits-1) - 1``. ``round`` passes gradients straight through;
  ``s`` (and ``beta``) get LSQ's gradient, scaled by ``g = 1 / sqrt(n * qmax)`` where ``n`` is the number
  of values one step covers (a weight's elements per channel; an activation's elements per example).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import paddle
from paddle import nn
from paddle.quantization.base_quanter import BaseQuanter
from paddle.quantization.factory import QuanterFactory
from paddle.quantization.quanters import FakeQuanterWithAbsMaxObserver
from paddle.utils import unique_name

from qcore.distributed import active, all_reduce_max
from qcore.errors import ConfigError
from qcore.quant import qmax as _qmax

from .fake_quant import pact_clip

__all__ = ["ActLSQplusQuanter", "PACTQuanter", "WeightLSQplusQuanter"]


def _param(layer: nn.Layer, name: str | None, what: str, shape: list[int], value: float, dtype: str,
           learning_rate: float = 1.0) -> paddle.Tensor:
    """A trainable parameter of ``layer`` named ``<name>.<what>_<n>`` (Paddle's quanters' naming)."""
    attr = paddle.ParamAttr(name=unique_name.generate(f"{name or 'quant_dequant'}.{what}"),
                            initializer=nn.initializer.Constant(value), learning_rate=learning_rate)
    return layer.create_parameter(shape, attr=attr, dtype=dtype)


def _scaled_grad(x: paddle.Tensor, g: float) -> paddle.Tensor:
    """``x`` in the forward; its gradient multiplied by ``g`` in the backward."""
    return (x - x * g).detach() + x * g


def _round_ste(x: paddle.Tensor) -> paddle.Tensor:
    """``round(x)`` in the forward, the identity in the backward."""
    return x + (paddle.round(x) - x).detach()


def _lsq_fake_quantize(x: paddle.Tensor, step: paddle.Tensor, g: float, bits: int,
                      offset: paddle.Tensor | None = None) -> paddle.Tensor:
    """LSQ(+): ``clip(round((x - offset) / step), -qmax-1, qmax) * step + offset`` with LSQ's gradients.

    ``step`` (and ``offset``) broadcast against ``x``; their gradients are multiplied by ``g``. The
    gradient of ``x`` is 1 where the code is inside the range and 0 where it is clipped.
    """
    qm = _qmax(bits)
    s = _scaled_grad(step, g)
    shift = _scaled_grad(offset, g) if offset is not None else None
    codes = paddle.clip(_round_ste((x - shift if shift is not None else x) / s), -qm - 1, qm)
    out = codes * s
    return out + shift if shift is not None else out


def _check_bits(quant_bits: int, reduce_type: str | None, batch_init: int) -> None:
    _qmax(quant_bits)  # ConfigError for anything but an int from 2 to 16
    if reduce_type not in (None, "max"):
        raise ConfigError(f"reduce_type={reduce_type!r} is not supported; use None or 'max'")
    if isinstance(batch_init, bool) or not isinstance(batch_init, int) or batch_init < 1:
        raise ConfigError(f"batch_init={batch_init!r}: pass the number of batches (>= 1) that set the initial step")


class _LSQLayer(BaseQuanter):
    """What both LSQ quanters share: the step parameter, its start from the data, the export view."""

    def __init__(self, bits: int, shape: list[int], batch_init: int, reduce_type: str | None, dtype: str,
                 name: str | None) -> None:
        super().__init__()
        self._bits, self._batch_init, self._reduce_type = bits, batch_init, reduce_type
        self.step = _param(self, name, "scale", shape, 1.0, dtype)
        self.register_buffer("seen", paddle.zeros([1], "int64"))  # training batches that set the step

    def _learned(self) -> list[paddle.Tensor]:
        return [self.step]

    def _targets(self, x: paddle.Tensor) -> list[paddle.Tensor]:
        """What each of :meth:`_learned` starts at for the data ``x``."""
        raise NotImplementedError

    def _start(self, x: paddle.Tensor) -> None:
        """In the first ``batch_init`` training batches, set the learned values from ``x`` (running 0.9/0.1 mean,
        the first batch taken as is); with ``reduce_type='max'`` under ``paddle.distributed``, then take their
        max over the ranks, so every rank starts alike."""
        seen = int(self.seen.item())
        if not self.training or seen >= self._batch_init:
            return
        with paddle.no_grad():
            for param, target in zip(self._learned(), self._targets(x.detach())):
                paddle.assign(target.astype(param.dtype) if seen == 0 else 0.9 * param + 0.1 * target, param)
                if self._reduce_type == "max" and active():
                    all_reduce_max(param, "an LSQ quanter's initial step")
            self.seen.set_value(np.array([seen + 1], np.int64))

    def bit_length(self) -> int:
        return self._bits

    def scales(self) -> paddle.Tensor:
        """The threshold ``step * qmax``: what Paddle's ``quantize_linear`` takes as ``Scale``."""
        return paddle.abs(self.step.detach()) * _qmax(self._bits)

    def zero_points(self) -> paddle.Tensor:
        return paddle.zeros_like(self.step.detach())


class ActLSQplusQuanterLayer(_LSQLayer):
    """The per-layer instance :class:`ActLSQplusQuanter` makes (see the module doc)."""

    def __init__(self, layer: nn.Layer, quant_bits: int = 8, sign: bool = True, symmetric: bool = True,
                 per_channel: bool = False, batch_init: int = 20, quant_linear: bool = False,
                 reduce_type: str | None = None, dtype: str = "float32", name: str | None = None) -> None:
        super().__init__(quant_bits, [1], batch_init, reduce_type, dtype, name)
        self.offset = None if symmetric else _param(self, name, "beta", [1], 0.0, dtype)

    def _learned(self) -> list[paddle.Tensor]:
        return [self.step] if self.offset is None else [self.step, self.offset]

    def _targets(self, x: paddle.Tensor) -> list[paddle.Tensor]:
        """The batch's abs max over ``qmax``; with an offset, ``min..max`` spread over all ``2**bits`` codes."""
        qm = _qmax(self._bits)
        if self.offset is None:
            return [paddle.clip(paddle.abs(x).max().reshape([1]) / qm, min=1e-8)]
        low, high = x.min().reshape([1]), x.max().reshape([1])
        step = paddle.clip((high - low) / (2 * qm + 1), min=1e-8)
        return [step, low + step * (qm + 1)]  # low maps to code -qmax-1

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        self._start(x)
        n = max(int(np.prod(x.shape[1:])), 1)  # the values one example puts through this step
        return _lsq_fake_quantize(x, self.step, 1.0 / math.sqrt(n * _qmax(self._bits)), self._bits, self.offset)

    def quant_axis(self) -> int:
        return -1

    def offset_problem(self) -> str | None:
        """Why this quanter cannot be exported as Paddle's QDQ layers, or None."""
        if self.offset is None:
            return None
        return ("it learned an offset (ActLSQplusQuanter(symmetric=False)) and Paddle's quantize_linear / "
                "dequantize_linear kernels ignore zero points; train with symmetric=True to export")


class WeightLSQplusQuanterLayer(_LSQLayer):
    """The per-layer instance :class:`WeightLSQplusQuanter` makes (see the module doc)."""

    def __init__(self, layer: nn.Layer, quant_bits: int = 8, sign: bool = True, symmetric: bool = True,
                 per_channel: bool = False, batch_init: int = 20, quant_linear: bool | None = None,
                 channel_num: int | None = None, reduce_type: str | None = None, dtype: str = "float32",
                 name: str | None = None) -> None:
        weight = getattr(layer, "weight", None)
        if weight is None:
            raise ConfigError(f"WeightLSQplusQuanter was configured for {type(layer).__name__}, which has no "
                              "weight; configure it for layers such as paddle.nn.Conv2D and paddle.nn.Linear")
        linear = isinstance(layer, nn.Linear) if quant_linear is None else quant_linear
        axis = 1 if linear else 0  # the output channels of Linear's [in, out] and Conv2D's [out, in, kh, kw]
        channels = weight.shape[axis]
        if channel_num is not None and channel_num != channels:
            raise ConfigError(f"channel_num={channel_num} but {type(layer).__name__}'s weight has {channels} output "
                              "channels; drop channel_num (it is read from the layer)")
        super().__init__(quant_bits, [channels if per_channel else 1], batch_init, reduce_type, dtype, name)
        self._axis, self._per_channel = axis, per_channel
        self._shape = [-1 if d == axis else 1 for d in range(len(weight.shape))] if per_channel else [1]

    def _targets(self, w: paddle.Tensor) -> list[paddle.Tensor]:
        """LSQ+'s start: ``max(|mean - 3 std|, |mean + 3 std|) / qmax`` per step."""
        if self._per_channel:
            rows = paddle.moveaxis(w, self._axis, 0).reshape([w.shape[self._axis], -1])
            mean, std = rows.mean(axis=1), rows.std(axis=1)
        else:
            mean, std = w.mean().reshape([1]), w.std().reshape([1])
        bound = paddle.maximum(paddle.abs(mean - 3 * std), paddle.abs(mean + 3 * std))
        return [paddle.clip(bound / _qmax(self._bits), min=1e-8)]

    def forward(self, w: paddle.Tensor) -> paddle.Tensor:
        self._start(w)
        per_step = int(np.prod(w.shape)) // self.step.shape[0]
        g = 1.0 / math.sqrt(per_step * _qmax(self._bits))
        return _lsq_fake_quantize(w, self.step.reshape(self._shape), g, self._bits)

    def quant_axis(self) -> int:
        return self._axis if self._per_channel else -1


class ActLSQplusQuanter(QuanterFactory):
    """LSQ+ for activations (PaddleSlim 2.6's keywords): a trained step, and with ``symmetric=False`` a
    trained offset.

    The first ``batch_init`` training batches set the step from the data (running 0.9/0.1 mean): the
    abs max over ``qmax``, or with an offset the range ``min..max`` over all ``2**bits - 1`` steps of the grid.
    ``reduce_type='max'``: under ``paddle.distributed``, each of those updates takes the max over the ranks.
    ``sign`` must be True (Paddle's ``LinearQuanter`` has only signed codes); ``per_channel`` must be
    False (activations have one step); ``quant_linear`` is accepted and has no effect. An offset trains
    but is refused by :meth:`qqat.SlimQAT.convert` (Paddle's kernels ignore zero points).
    """

    def __init__(self, quant_bits: int = 8, sign: bool = True, symmetric: bool = True, per_channel: bool = False,
                 batch_init: int = 20, quant_linear: bool = False, reduce_type: str | None = None,
                 dtype: str = "float32", name: str | None = None) -> None:
        _check_bits(quant_bits, reduce_type, batch_init)
        if not sign:
            raise ConfigError("ActLSQplusQuanter(sign=False): Paddle's LinearQuanter has signed codes only; "
                              "use sign=True")
        if per_channel:
            raise ConfigError("ActLSQplusQuanter(per_channel=True): activations have one step; use per_channel=False "
                              "(per-channel steps are for WeightLSQplusQuanter)")
        super().__init__(quant_bits=quant_bits, sign=sign, symmetric=symmetric, per_channel=per_channel,
                         batch_init=batch_init, quant_linear=quant_linear, reduce_type=reduce_type, dtype=dtype,
                         name=name)

    def _get_class(self) -> type[BaseQuanter]:
        return ActLSQplusQuanterLayer


class WeightLSQplusQuanter(QuanterFactory):
    """LSQ+ for weights (PaddleSlim 2.6's keywords): a trained step per tensor or, with
    ``per_channel=True``, per output channel.

    The first ``batch_init`` training batches set the step from the weight (LSQ+'s
    ``max(|mean - 3 std|, |mean + 3 std|) / qmax``, running 0.9/0.1 mean; ``reduce_type='max'`` as for
    :class:`ActLSQplusQuanter`). The channel axis is read from
    the layer (``Linear``: 1, convolutions: 0); ``quant_linear`` forces it (True: 1, False: 0) and
    ``channel_num``, if given, must match the layer. ``sign`` and ``symmetric`` must be True (weights
    have no offset).
    """

    def __init__(self, quant_bits: int = 8, sign: bool = True, symmetric: bool = True, per_channel: bool = False,
                 batch_init: int = 20, quant_linear: bool | None = None, channel_num: int | None = None,
                 reduce_type: str | None = None, dtype: str = "float32", name: str | None = None) -> None:
        _check_bits(quant_bits, reduce_type, batch_init)
        if not (sign and symmetric):
            raise ConfigError("WeightLSQplusQuanter quantizes weights on a signed symmetric grid; "
                              "use sign=True, symmetric=True")
        super().__init__(quant_bits=quant_bits, sign=sign, symmetric=symmetric, per_channel=per_channel,
                         batch_init=batch_init, quant_linear=quant_linear, channel_num=channel_num,
                         reduce_type=reduce_type, dtype=dtype, name=name)

    def _get_class(self) -> type[BaseQuanter]:
        return WeightLSQplusQuanterLayer


class PACTQuanterLayer(BaseQuanter):
    """The per-layer instance :class:`PACTQuanter` makes: PACT's clip, then the wrapped quanter."""

    def __init__(self, layer: nn.Layer, quanter: Any = None, init_value: float = 100.0,
                 learning_rate: float = 1000.0, dtype: str = "float32", name: str | None = None) -> None:
        super().__init__()
        inner = FakeQuanterWithAbsMaxObserver() if quanter is None else quanter
        self.quanter = inner._instance(layer) if isinstance(inner, QuanterFactory) else inner(layer)
        self.alpha = _param(self, name, "pact", [1], init_value, dtype, learning_rate)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.quanter(pact_clip(x, self.alpha))

    def bit_length(self) -> Any:
        return self.quanter.bit_length()

    def quant_axis(self) -> Any:
        return self.quanter.quant_axis()

    def scales(self) -> Any:
        return self.quanter.scales()

    def zero_points(self) -> Any:
        return self.quanter.zero_points()


class PACTQuanter(QuanterFactory):
    """PACT (PaddleSlim 2.6's keywords): clip to ``[-alpha, alpha]`` with a trained ``alpha``, then quantize
    with ``quanter``.

    ``quanter``: a quanter factory (``FakeQuanterWithAbsMaxObserver(moving_rate=0.9)``, the default) or,
    as PaddleSlim's examples pass it, a ``BaseQuanter`` layer class. ``alpha`` starts at ``init_value``
    and learns with ``learning_rate`` times the optimizer's rate; its gradient is +1 for values clipped
    above, -1 for values clipped below, 0 inside (the quanter passes gradients straight through). The
    export keeps ``quanter``'s scale, not ``alpha``: values beyond that scale saturate there.
    """

    def __init__(self, quanter: Any = None, init_value: float = 100.0, learning_rate: float = 1000.0,
                 dtype: str = "float32", name: str | None = None) -> None:
        factory = isinstance(quanter, QuanterFactory)
        layer_class = isinstance(quanter, type) and issubclass(quanter, BaseQuanter)
        if quanter is not None and not (factory or layer_class):
            raise ConfigError(f"PACTQuanter(quanter={quanter!r}): pass a quanter factory such as "
                              "FakeQuanterWithAbsMaxObserver(moving_rate=0.9), or a BaseQuanter layer class")
        if not (isinstance(init_value, (int, float)) and init_value > 0):
            raise ConfigError(f"PACTQuanter(init_value={init_value!r}): alpha must start positive")
        super().__init__(quanter=quanter, init_value=float(init_value), learning_rate=learning_rate, dtype=dtype,
                         name=name)

    def _get_class(self) -> type[BaseQuanter]:
        return PACTQuanterLayer
