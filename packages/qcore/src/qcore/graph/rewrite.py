"""Thresholds -> deployable QDQ form for one op: the rewrite every static method ends with.

Post-training quantization (thresholds from calibration) and quantization-aware training
(thresholds learned during training) both finish the same way: store the op's weight as
integer codes with per-channel (or per-tensor) scales and put a quantize/dequantize pair
on each activation input. :func:`quantize_op` is that step, on any :class:`Graph` backend.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Union

import numpy as np

from ..errors import GraphError
from ..quant import abs_max, quantize, scale_from_threshold
from .base import Graph, OpRef, QuantizedWeight

#: a value per activation operand: by name, by position in :meth:`Graph.activation_operands`, or one for all
PerOperand = Union[Mapping[str, float], Sequence[float], float]


def operand_value(values: PerOperand, index: int, name: str) -> float:
    """The entry of ``values`` for the activation operand at ``index`` named ``name`` (0.0 if a mapping omits it)."""
    if isinstance(values, Mapping):
        return float(values.get(name, 0.0))
    if isinstance(values, Sequence):
        return float(values[index])
    return float(values)


@dataclass
class OpQuantization:
    """What :func:`quantize_op` did to one op."""

    weight: QuantizedWeight | None = None
    activations: dict[str, float] = field(default_factory=dict)  # operand name -> threshold
    left_float: list[str] = field(default_factory=list)  # activations with threshold <= 0


def quantize_op(
    graph: Graph,
    op: OpRef,
    act_thresholds: PerOperand,
    *,
    weight_bits: int = 8,
    activation_bits: int = 8,
    per_channel: bool = True,
    weight_thresholds: np.ndarray | float | None = None,
    weight_value: np.ndarray | None = None,
    unsigned: Collection[str] = (),
    float_dequant: bool = False,
    weight_max_code: int | None = None,
    act_offsets: PerOperand | None = None,
    zero_points: bool = False,
    lookup_rows: bool = False,
) -> OpQuantization:
    """Quantize ``op``'s weight (if it has one) and insert QDQ on its activation inputs.

    ``act_thresholds`` maps activation operand names to thresholds (operands it leaves out stay
    float), lists them in the order of
    :meth:`Graph.activation_operands` (names of PIR values can change as other ops are
    rewritten; positions do not), or is one threshold for every activation input of the op.
    An activation whose threshold is not positive (it was
    all zeros) stays float and is listed in ``left_float``. ``weight_thresholds`` defaults to
    the weight's abs max, per output channel when ``per_channel``; ``weight_value`` replaces the
    float weight that is quantized (e.g. AdaRound's, whose nearest codes are the learned ones). Activations named in
    ``unsigned`` get the unsigned QDQ of :meth:`Graph.insert_act_qdq`; ``float_dequant`` reads the
    weight through cast -> multiply and ``weight_max_code`` bounds its codes (:meth:`Graph.quantize_weight`).
    ``act_offsets`` (keyed like ``act_thresholds``) shift activations onto asymmetric grids
    (:meth:`Graph.insert_act_qdq`'s ``offset``), deployed as zero points when ``zero_points``.
    ``lookup_rows`` stores a lookup's table as int8 codes (``weight_bits`` <= 8) with one scale per row and
    dequantizes only the rows it looks up (:meth:`Graph.quantize_lookup`): a weight-only table.
    """
    result = OpQuantization()
    activations = graph.activation_operands(op)
    weight = graph.weight_operand(op)
    if weight is not None and lookup_rows:
        if weight_bits > 8:
            raise GraphError(f"{op!r}: lookup tables are stored as int8 codes; use weight_bits <= 8")
        table = graph.get_param(weight.name) if weight_value is None else weight_value
        rows = np.asarray(abs_max(table, axis=0), np.float64)
        thresholds = np.where(rows > 0, rows, 1.0)  # an all-zero row keeps code 0 at any scale
        scales = np.asarray(scale_from_threshold(thresholds, weight_bits), np.float64)
        codes = quantize(table, scales, weight_bits, axis=0)
        graph.quantize_lookup(op, codes, scales.astype(np.float32))
        result.weight = QuantizedWeight(codes, thresholds, 0, weight_bits)
    elif weight is not None:
        axis = graph.weight_channel_axis(op) if per_channel else None
        result.weight = graph.quantize_weight(
            weight, weight_bits, axis, weight_thresholds, float_dequant, max_code=weight_max_code, value=weight_value
        )
    for index, operand in enumerate(activations):
        threshold = operand_value(act_thresholds, index, operand.name)
        if threshold > 0:
            offset = operand_value(act_offsets, index, operand.name) if act_offsets is not None else 0.0
            graph.insert_act_qdq(operand, threshold, activation_bits, unsigned=operand.name in unsigned,
                                 offset=offset, zero_point=zero_points)
            result.activations[operand.name] = threshold
        else:
            result.left_float.append(operand.name)
    return result
