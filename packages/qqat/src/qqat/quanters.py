"""Fake quantizers of one tensor, with the threshold state each quantize type keeps.

A quantizer maps a float tensor to its quantize-dequantize copy with a straight-through
gradient (:func:`~qqat.fake_quant.fake_quantize_ste`). What differs between the seeds'
quantize types is where the threshold comes from:

* ``abs_max``: the abs max of the current tensor (per tensor);
* ``channel_wise_abs_max``: the abs max of the current tensor per output channel;
* ``moving_average_abs_max``: Paddle's decayed average (:func:`qcore.observers.moving_average_update`,
  the rule qcore's observer runs too), threshold ``accum / state``;
* ``range_abs_max``: the max of the per-batch abs max over the last ``window_size`` batches.

Activations update the state in training and use the stored threshold in eval, so eval
computes exactly what the exported model will. Weights with ``abs_max`` types always use
the current weight (which is what export quantizes).

:class:`PACTFakeQuanter` is PACT: the clip bound ``alpha`` is a trained parameter and also the
quantization threshold, so its gradient has the clipping term (+-1 outside the range) and
the rounding-error term inside it, and it moves in both directions while training.

Under data parallel (``paddle.DataParallel`` over an initialised ``paddle.distributed``), an
activation quantizer built with ``sync=True`` takes the max of the batch abs max over the ranks
before updating its state, so every rank keeps the same threshold, equal to what one process
would keep on the union of the ranks' batches; a PACT ``alpha`` starts from that max too and is
then a parameter like any other (``DataParallel`` averages its gradient).

PaddleSlim 2.6's quanter factories for :class:`qqat.SlimQAT` (``PACTQuanter``, ``ActLSQplusQuanter``,
``WeightLSQplusQuanter``) are importable from here too; they live in :mod:`qqat.slim_quanters`.
"""

from __future__ import annotations

import numpy as np
import paddle
from paddle import nn

from qcore.distributed import active, all_reduce_max
from qcore.observers import moving_average_update
from qcore.quant import qmax

from .fake_quant import fake_quantize_ste, pact_clip
from .slim_quanters import ActLSQplusQuanter, PACTQuanter, WeightLSQplusQuanter

__all__ = ["STATELESS", "ActLSQplusQuanter", "FakeQuanter", "PACTFakeQuanter", "PACTQuanter", "WeightLSQplusQuanter"]

STATELESS = ("abs_max", "channel_wise_abs_max")


class FakeQuanter(nn.Layer):
    """STE fake quantization of one tensor with a per-type threshold (see the module doc)."""

    def __init__(
        self,
        kind: str,
        bits: int,
        *,
        channels: int = 1,
        channel_axis: int | None = None,
        ndim: int = 4,
        is_weight: bool = False,
        moving_rate: float = 0.9,
        window_size: int = 10000,
        sync: bool = False,
    ) -> None:
        super().__init__()
        self.kind, self.bits, self.is_weight = kind, bits, is_weight
        self.sync = sync and not is_weight  # weights are the same on every rank already
        self.moving_rate, self.window_size = moving_rate, window_size
        self.channel_axis = channel_axis if kind == "channel_wise_abs_max" else None
        self._shape = [1]  # per tensor: broadcasts against any rank
        if self.channel_axis is not None:
            self._shape = [-1 if d == self.channel_axis else 1 for d in range(ndim)]
        width = channels if self.channel_axis is not None else 1
        self.register_buffer("threshold", paddle.zeros([width], "float32"))
        if kind == "moving_average_abs_max":
            self.register_buffer("accum", paddle.zeros([1], "float32"))
            self.register_buffer("state", paddle.zeros([1], "float32"))
        if kind == "range_abs_max":
            self.register_buffer("window", paddle.zeros([window_size], "float32"))
            self.register_buffer("seen", paddle.zeros([1], "int64"))

    def _abs_max(self, x: paddle.Tensor) -> paddle.Tensor:
        x = paddle.abs(x.detach())
        if self.channel_axis is None:
            return x.max().reshape([1])
        dims = [d for d in range(x.ndim) if d != self.channel_axis]
        return x.max(axis=dims)

    def _batch_abs_max(self, x: paddle.Tensor) -> paddle.Tensor:
        """This batch's abs max; with ``sync`` in training, the max over every rank's batch."""
        current = self._abs_max(x)
        if self.sync and self.training and active():
            all_reduce_max(current, "an activation's abs max")
        return current

    def _update(self, x: paddle.Tensor) -> paddle.Tensor:
        current = self._batch_abs_max(x)
        if self.kind in STATELESS:
            return current
        if self.kind == "moving_average_abs_max":
            accum, state = moving_average_update(self.accum, self.state, current, self.moving_rate)
            paddle.assign(accum, self.accum)
            paddle.assign(state, self.state)
            return self.accum / self.state
        slot = int(self.seen.item()) % self.window_size
        self.window[slot] = current[0]
        paddle.assign(self.seen + 1, self.seen)
        return self.window[: min(int(self.seen.item()), self.window_size)].max().reshape([1])

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        if self.training or (self.is_weight and self.kind in STATELESS):
            with paddle.no_grad():
                paddle.assign(self._update(x), self.threshold)
        return fake_quantize_ste(x, self.threshold.reshape(self._shape), self.bits)

    def export_threshold(self) -> np.ndarray:
        """The threshold(s) the deployed model uses (1-D: one per channel, or one value)."""
        return self.threshold.numpy().astype(np.float64)


class PACTFakeQuanter(nn.Layer):
    """PACT: ``clip(x, -alpha, alpha)`` quantized with threshold ``alpha``; ``alpha`` is trained.

    ``alpha`` starts at the abs max of the first tensor seen (nothing clipped at first).
    Its gradient inside the range is the rounding error ``(round(x/s) - x/s) / qmax`` with
    ``s = alpha / qmax`` (straight-through for ``round``); outside it is +-1 as in PACT.
    """

    def __init__(self, bits: int, sync: bool = False) -> None:
        super().__init__()
        self.bits, self.sync = bits, sync
        self.alpha = self.create_parameter([1], dtype="float32", default_initializer=nn.initializer.Constant(1.0))
        self.register_buffer("initialized", paddle.zeros([1], "int32"))

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        if not bool(self.initialized.item()):
            with paddle.no_grad():
                first = paddle.abs(x.detach()).max().reshape([1])
                if self.sync and self.training and active():
                    all_reduce_max(first, "PACT's initial alpha")  # every rank starts from the same alpha
                start = float(first.item()) or 1.0
                self.alpha.set_value(np.array([start], np.float32))
                self.initialized.set_value(np.array([1], np.int32))
        alpha = paddle.abs(self.alpha) + 1e-8
        qm = float(qmax(self.bits))
        y = pact_clip(x, alpha) / alpha * qm
        rounded = y + (paddle.round(y) - y).detach()
        return rounded * alpha / qm

    def export_threshold(self) -> np.ndarray:
        return np.abs(self.alpha.numpy()).astype(np.float64) + 1e-8
