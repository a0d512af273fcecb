"""PaddleSlim 2.6's ``paddleslim.quant.advanced`` weight-only names, so that its GPTQ / AutoClip loops run by an
import change: ``from qptq.advanced import GPTQ, AutoClip``.

Both work on a dygraph model's ``paddle.nn.Linear`` layers (``[in, out]`` weights) and leave float weights that
hold the quantized (GPTQ) or clipped (AutoClip) values, as PaddleSlim's do; the algorithms are this package's
(:func:`qptq.weight_only.gptq.gptq`, :func:`qptq.weight_only.clip_search.search_clip`), scored through the input
Hessian of all calibration rows rather than a sample of them. To deploy int4 / int8 weights on a CPU runtime,
use :func:`qptq.weight_only.quantize_` (the one-call form of the same algorithms, with ONNX export).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import paddle

from qcore.errors import ConfigError, DataError
from qcore.groupwise import GroupCodes, group_count

from .weight_only.clip_search import search_clip
from .weight_only.gptq import gptq
from .weight_only.hessian import HessianAccumulator

__all__ = ["GPTQ", "AutoClip"]

#: ``weight_quant_method`` values PaddleSlim's GPTQ takes, and what they mean here.
_GPTQ_METHODS = ("abs_max_channel_wise",)


def _check_linear(layer: Any, who: str) -> None:
    if not isinstance(layer, paddle.nn.Linear):
        raise ConfigError(f"{who} takes a paddle.nn.Linear; got {type(layer).__name__} (wrap each Linear of "
                          "the model, as PaddleSlim's loop over named_sublayers() does)")


def _record(acc: HessianAccumulator) -> Any:
    def pre(layer: Any, inputs: tuple[Any, ...]) -> None:
        acc.update(inputs[0].astype("float32").numpy())
    return pre


class GPTQ(paddle.nn.Layer):
    """GPTQ on one ``paddle.nn.Linear``: its inputs are recorded while the model runs on calibration data, then
    :meth:`fasterquant` replaces its weight by the GPTQ-chosen symmetric codes' values.

    Use it as PaddleSlim's: put it in the model in place of the layer (``setattr(parent, name, GPTQ(layer))``),
    or leave the layer in place and keep the object (its inputs are recorded either way, once).
    """

    def __init__(self, layer: Any, quant_bits: int = 4, weight_quant_method: str = "abs_max_channel_wise") -> None:
        super().__init__()
        _check_linear(layer, "GPTQ")
        if weight_quant_method not in _GPTQ_METHODS:
            raise ConfigError(f"weight_quant_method={weight_quant_method!r} is not offered; use "
                              "'abs_max_channel_wise' (groups: fasterquant(groupsize=128))")
        if quant_bits not in (4, 8):
            raise ConfigError(f"quant_bits={quant_bits!r} is not supported; use 4 or 8")
        self.layer = layer
        self.quant_bits = quant_bits
        self.quantized = False
        self.codes: GroupCodes | None = None
        self._hessian = HessianAccumulator(int(layer.weight.shape[0]))
        self._hook = layer.register_forward_pre_hook(_record(self._hessian))

    @property
    def nsamples(self) -> int:
        """Calibration rows (tokens) recorded so far."""
        return self._hessian.rows

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.layer(*args, **kwargs)

    def fasterquant(self, blocksize: int = 128, percdamp: float = 0.01, groupsize: int = -1,
                    actorder: bool = True) -> None:
        """Quantize the weight (per output channel, or per ``groupsize`` input channels) and stop recording.
        The codes stay in :attr:`codes`."""
        if self.quantized:
            raise ConfigError("this layer is already quantized; wrap the float layer again to redo it")
        if not self._hessian.rows:
            raise DataError("no calibration inputs reached this layer; run the model on data between "
                            "GPTQ(layer) and fasterquant()")
        weight = self.layer.weight.numpy().astype(np.float64)
        group_count(weight.shape[0], groupsize)  # one line when groupsize does not divide the inputs
        self.codes = gptq(weight, self._hessian.hessian(), self.quant_bits, groupsize, symmetric=True,
                          block_size=blocksize, damp=percdamp, act_order=actorder)
        self.layer.weight.set_value(paddle.to_tensor(self.codes.dequantize().astype(np.float32)))
        self._hook.remove()
        self.quantized = True


class AutoClip:
    """AWQ's weight clipping on every ``paddle.nn.Linear`` of ``model``: inputs are recorded while the model runs
    on calibration data, then :meth:`auto_clip` clips each group of input channels, per output, to the share of
    its largest magnitude whose ``weight_bits`` symmetric codes change the layer's output least.

    Candidates: ``1 - i / n_grid`` for ``i < max_shrink * n_grid`` (1.0, no clip, is always one). The error is
    the output's squared error over every recorded row (``loss_function`` other than that is refused;
    ``n_sample_token`` and ``sample_function`` are accepted for PaddleSlim's scripts: every row counts here).
    """

    def __init__(self, model: Any, weight_bits: int = 8, weight_quant_method: str = "groupwise",
                 loss_function: Any = None, sample_function: Any = None, n_grid: int = 20,
                 max_shrink: float = 0.5, n_sample_token: int = 128, group_size: int = -1) -> None:
        if weight_quant_method != "groupwise":
            raise ConfigError(f"weight_quant_method={weight_quant_method!r} is not offered; use 'groupwise'")
        if loss_function is not None:
            raise ConfigError("loss_function is not offered: the clip is chosen by the layer output's squared "
                              "error; leave it None")
        if weight_bits not in (4, 8):
            raise ConfigError(f"weight_bits={weight_bits!r} is not supported; use 4 or 8")
        if not (isinstance(n_grid, int) and n_grid >= 1 and 0 < max_shrink < 1):
            raise ConfigError(f"n_grid={n_grid!r}, max_shrink={max_shrink!r}: use an int >= 1 and a share in (0, 1)")
        self.model = model
        self.weight_bits = weight_bits
        self.group_size = group_size
        self.ratios = tuple(1 - i / n_grid for i in range(max(int(max_shrink * n_grid), 1)))
        self._linears = {name: layer for name, layer in model.named_sublayers()
                         if isinstance(layer, paddle.nn.Linear)}
        if not self._linears:
            raise ConfigError("the model has no paddle.nn.Linear; AutoClip clips Linear weights")
        self._hessians = {name: HessianAccumulator(int(layer.weight.shape[0]))
                          for name, layer in self._linears.items()}
        self._hooks = [layer.register_forward_pre_hook(_record(self._hessians[name]))
                       for name, layer in self._linears.items()]
        self.ratio: dict[str, np.ndarray] = {}

    def auto_clip(self, group_size: int | None = 128, oc_batch_size: int = 1024) -> None:
        """Clip every recorded layer's weight in place (``[groups, out]`` ratios kept in :attr:`ratio`) and stop
        recording. ``oc_batch_size`` (PaddleSlim's GPU memory bound) has no effect here."""
        size = self.group_size if group_size is None else group_size
        reached = {name: acc for name, acc in self._hessians.items() if acc.rows}
        if not reached:
            raise DataError("no calibration inputs reached any Linear; run the model on data between "
                            "AutoClip(model) and auto_clip()")
        for name in reached:
            group_count(int(self._linears[name].weight.shape[0]), size)  # every bad width before any work
        for handle in self._hooks:
            handle.remove()
        for name, acc in reached.items():
            layer = self._linears[name]
            weight = layer.weight.numpy().astype(np.float64)
            ratio = search_clip(weight, acc.hessian(), self.weight_bits, size, True, self.ratios)
            groups = ratio.shape[0]
            g = weight.reshape(groups, -1, weight.shape[1])
            bound = np.abs(g).max(axis=1, keepdims=True) * ratio[:, None, :]
            clipped = np.clip(g, -bound, bound).reshape(weight.shape)
            layer.weight.set_value(paddle.to_tensor(clipped.astype(np.float32)))
            self.ratio[name] = ratio
