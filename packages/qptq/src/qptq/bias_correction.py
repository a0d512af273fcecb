"""Bias correction: cancel the mean output shift that rounding the weights causes.

With weight error ``e = W_q - W``, a layer's output moves on average by ``e · E[x]``. The
calibration pass records ``E[x]`` per input channel (:class:`qptq.calibrate.ChannelMean`, a
mergeable sum and count), and the correction ``e · E[x]`` per output channel is subtracted
from the layer's bias (Nagel et al., "Data-Free Quantization", 2019, empirical variant).
Conv borders (padding) are ignored.
"""

from __future__ import annotations

import numpy as np

from qcore.deploy import OpTarget
from qcore.graph import Graph, QuantizedWeight
from qcore.optable import CONV_KINDS, kind_of

from .calibrate import ChannelMean


def output_shift(
    weight: np.ndarray, quantized: np.ndarray, input_mean: np.ndarray, *, conv: bool, transposed: bool = False
) -> np.ndarray:
    """Mean change of each output channel when ``weight`` is replaced by ``quantized``.

    ``conv``: weight is ``[C_out, C_in/groups, kh, kw]`` (groups inferred from ``input_mean``);
    otherwise a matmul weight ``[K, N]`` (``[N, K]`` when ``transposed``).
    """
    error = quantized.astype(np.float64) - weight.astype(np.float64)
    if not conv:
        return (error @ input_mean) if transposed else (input_mean @ error)
    c_out, c_in_group = error.shape[:2]
    groups = input_mean.size // c_in_group
    per_tap = error.reshape(c_out, c_in_group, -1).sum(-1)  # [C_out, C_in/groups]
    group_of_out = np.arange(c_out) // (c_out // groups)
    means = input_mean.reshape(groups, c_in_group)[group_of_out]  # [C_out, C_in/groups]
    return (per_tap * means).sum(-1)


def input_means(targets: list[OpTarget]) -> dict[str, ChannelMean]:
    """A channel-mean accumulator for the input of every op whose kind has a bias-correction axis."""
    means = {}
    for target in targets:
        kind = kind_of(target.op.seed_type)
        if target.weight is not None and target.activations and kind is not None and kind.bias_axis is not None:
            means[target.activations[0].name] = ChannelMean(axis=kind.bias_axis)
    return means


def correct_bias(graph: Graph, target: OpTarget, stored: QuantizedWeight, mean: ChannelMean) -> float | None:
    """Subtract the mean output shift of the rounded weight from the op's bias; returns its max."""
    bias = graph.bias_operand(target.op)
    if bias is None or target.weight is None:  # no bias to absorb the shift
        return None
    conv = kind_of(target.op.seed_type) in CONV_KINDS
    transposed = not conv and graph.weight_channel_axis(target.op) == 0
    shift = output_shift(graph.get_param(target.weight.name), stored.dequantized(), mean.mean, conv=conv,
                         transposed=transposed)
    old = graph.get_param(bias.name)
    if old.size != shift.size:
        return None
    graph.replace_weight(bias, old - shift.reshape(old.shape).astype(old.dtype), "bias_corrected")
    return round(float(np.abs(shift).max()), 6)
