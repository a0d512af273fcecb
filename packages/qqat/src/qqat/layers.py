"""The wrapper that makes one Conv2D / Linear / Conv2DTranspose quantization-aware.

:class:`QuantedLayer` holds the original layer (so its parameters, names and state-dict
entries are unchanged), fake-quantizes the input activation and the weight, and runs the
layer's own functional op on the fake-quantized pair.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn

from qcore.config import QuantConfig

from .quanters import FakeQuanter, PACTFakeQuanter


def _pad(layer: nn.Layer, x: paddle.Tensor) -> paddle.Tensor:
    """The explicit padding Conv2D applies for padding_mode other than 'zeros'."""
    if layer._padding_mode == "zeros":
        return x
    return F.pad(x, layer._reversed_padding_repeated_twice, mode=layer._padding_mode, data_format=layer._data_format)


# layer class name -> (output-channel axis of its weight, the functional op it runs)
_LAYERS: dict[str, tuple[int, Callable[[nn.Layer, paddle.Tensor, paddle.Tensor], paddle.Tensor]]] = {
    "Conv2D": (0, lambda layer, x, w: F.conv2d(
        _pad(layer, x), w, layer.bias, layer._stride, 0 if layer._padding_mode != "zeros" else layer._padding,
        layer._dilation, layer._groups, layer._data_format,
    )),
    "Linear": (1, lambda layer, x, w: F.linear(x, w, layer.bias)),
    "Conv2DTranspose": (1, lambda layer, x, w: F.conv2d_transpose(
        x, w, layer.bias, stride=layer._stride, padding=layer._padding, output_padding=layer.output_padding,
        dilation=layer._dilation, groups=layer._groups, data_format=layer._data_format,
    )),
}  # fmt: skip


def layer_kind(layer: nn.Layer) -> str | None:
    """The seed layer-type name of ``layer`` ('Conv2D', 'Linear', ...), or None."""
    name = type(layer).__name__
    return name if name in _LAYERS else None


class QuantedLayer(nn.Layer):
    """Fake-quantized input activation and weight around one quantizable layer.

    ``sync``: under data parallel, activation thresholds (and PACT's initial alpha) take the max
    over every rank (:mod:`qqat.quanters`).
    """

    def __init__(self, layer: nn.Layer, config: QuantConfig, sync: bool = False) -> None:
        super().__init__()
        kind = layer_kind(layer)
        if kind is None:
            raise TypeError(f"{type(layer).__name__} is not quantizable; use one of {', '.join(_LAYERS)}")
        self.kind = kind
        self.layer = layer
        axis, self._run = _LAYERS[kind]
        weight = layer.weight
        if config.weight_preprocess_type == "PACT":
            self.weight_quanter: nn.Layer = PACTFakeQuanter(config.weight_bits)  # weights agree on every rank
        else:
            self.weight_quanter = FakeQuanter(
                config.weight_quantize_type, config.weight_bits, channels=weight.shape[axis], channel_axis=axis,
                ndim=len(weight.shape), is_weight=True, moving_rate=config.moving_rate,
                window_size=config.window_size,
            )
        if config.activation_preprocess_type == "PACT":
            self.act_quanter: nn.Layer = PACTFakeQuanter(config.activation_bits, sync=sync)
        else:
            self.act_quanter = FakeQuanter(
                config.activation_quantize_type, config.activation_bits,
                moving_rate=config.moving_rate, window_size=config.window_size, sync=sync,
            )
        self.weight_axis = axis
        self.per_channel = isinstance(self.weight_quanter, FakeQuanter) and self.weight_quanter.channel_axis is not None

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self._run(self.layer, self.act_quanter(x), self.weight_quanter(self.layer.weight))

    def activation_threshold(self) -> float:
        """The learned threshold of the input activation (what export writes)."""
        return float(self.act_quanter.export_threshold()[0])

    def weight_thresholds(self) -> np.ndarray | float:
        """Per-channel (1-D) or per-tensor (float) weight thresholds for export."""
        if isinstance(self.weight_quanter, FakeQuanter) and self.weight_quanter.kind == "channel_wise_abs_max":
            w = np.abs(self.layer.weight.numpy())
            return w.max(axis=tuple(d for d in range(w.ndim) if d != self.weight_axis)).astype(np.float64)
        if isinstance(self.weight_quanter, FakeQuanter) and self.weight_quanter.kind == "abs_max":
            return float(np.abs(self.layer.weight.numpy()).max())
        return float(self.weight_quanter.export_threshold()[0])
