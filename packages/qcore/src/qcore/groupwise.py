"""Group-wise weight codes: a scale (and a zero point) per group of ``group_size`` input channels.

The weight-only form of LLM quantization. A ``[K, N]`` matmul weight (Paddle's ``linear`` layout: ``K``
input channels, ``N`` outputs) is cut along ``K`` into ``K / group_size`` groups per output; each group
gets its own step. ``group_size=-1`` is one group per output (per-channel).

* symmetric: codes ``-qmax..qmax`` (``qmax = 2**(bits-1) - 1``), ``step = absmax / qmax``, no zero point;
* asymmetric: codes ``0..2**bits - 1``, ``step = (max - min) / (2**bits - 1)`` over the group's range
  stretched to hold 0, zero point ``round(-min / step)``: ``value = (code - zero_point) * step``.

``clip`` shrinks each group's range before the step is taken (the ratio a clip search chooses). Codes
of 4 bits pack two to a byte with :func:`qcore.packing.pack_codes`, first code in the low nibble, as
ONNX Runtime's ``MatMulNBits`` and ONNX's ``int4`` / ``uint4`` read them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .errors import ConfigError
from .quant import as_finite, qmax

#: Code widths weight-only quantization writes.
GROUP_BITS = (4, 8)


@dataclass(frozen=True)
class GroupCodes:
    """A ``[K, N]`` weight as codes, a step and (asymmetric) a zero point per group of input channels."""

    codes: NDArray[np.integer]  # [K, N]: int8 (symmetric) or uint8 (asymmetric)
    scales: NDArray[np.float32]  # [K / group_size, N]
    zero_points: NDArray[np.uint8] | None  # [K / group_size, N], None when symmetric
    bits: int
    group_size: int  # input channels per group (K for per-channel)

    def dequantize(self) -> NDArray[np.float32]:
        """The float weight the codes stand for, ``[K, N]``."""
        codes = self.codes.astype(np.float32)
        if self.zero_points is not None:
            codes = codes - np.repeat(self.zero_points.astype(np.float32), self.group_size, axis=0)
        return codes * np.repeat(self.scales, self.group_size, axis=0)


def group_count(k: int, group_size: int) -> int:
    """Groups along ``k`` input channels; ``group_size=-1`` is one. One :class:`ConfigError` line when
    ``group_size`` does not divide ``k``."""
    if group_size == -1:
        return 1
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or group_size < 1:
        raise ConfigError(f"group_size={group_size!r} is not valid; use a positive int such as 128, or -1 per channel")
    if k % group_size:
        divisors = [g for g in (32, 64, 128, 256) if k % g == 0]
        hint = f"one of {divisors} or -1" if divisors else "-1 (per channel)"
        raise ConfigError(f"group_size={group_size} does not divide the {k} input channels; use {hint}")
    return k // group_size


def check_bits(bits: int) -> int:
    if bits not in GROUP_BITS:
        raise ConfigError(f"weight_bits={bits!r} is not supported for weight-only groups; use one of {GROUP_BITS}")
    return bits


def group_grid(
    rows: NDArray[np.floating], bits: int, symmetric: bool, clip: ArrayLike = 1.0
) -> tuple[NDArray[np.float64], NDArray[np.float64] | None]:
    """The step and zero point (None when symmetric) of each group of ``rows`` (``[..., size, N]``: the group's
    input channels on the second-last axis), its range shrunk by ``clip``."""
    ratio = np.asarray(clip, np.float64)
    if symmetric:
        return np.abs(rows).max(axis=-2) * ratio / qmax(bits), None
    levels = 2**bits - 1
    lo = np.minimum(rows.min(axis=-2), 0.0) * ratio
    hi = np.maximum(rows.max(axis=-2), 0.0) * ratio
    step = (hi - lo) / levels
    return step, np.clip(np.rint(-lo / np.where(step > 0, step, 1.0)), 0, levels)


def encode(
    values: NDArray[np.floating], step: NDArray[np.float64], zero: NDArray[np.float64] | None, bits: int
) -> NDArray[np.float64]:
    """Codes of ``values`` on the grid ``(step, zero)`` (broadcast against them); a zero step gives code
    ``zero`` (0 when symmetric), whose value is 0."""
    safe = np.where(step > 0, step, 1.0)
    if zero is None:
        top = qmax(bits)
        return np.clip(np.rint(values / safe), -top, top)
    return np.clip(np.rint(values / safe) + zero, 0, 2**bits - 1)


def decode(codes: NDArray[np.floating], step: NDArray[np.float64], zero: NDArray[np.float64] | None
           ) -> NDArray[np.float64]:
    """The values of ``codes`` on the grid ``(step, zero)``."""
    return (codes - (0.0 if zero is None else zero)) * step


def quantize_groups(
    weight: ArrayLike, bits: int = 4, group_size: int = 128, symmetric: bool = False, clip: ArrayLike = 1.0
) -> GroupCodes:
    """Codes of ``weight`` (``[K, N]``) per group of ``group_size`` input channels (-1: per output channel).

    ``clip``: a ratio (scalar, or ``[K / group_size, N]``) the group's range is shrunk by before the step is
    taken; values beyond it clip to the end codes.
    """
    check_bits(bits)
    w = as_finite(weight, "weight")
    if w.ndim != 2:
        raise ConfigError(f"weight has shape {w.shape}; group-wise codes take a 2-D [in, out] matmul weight")
    k, n = w.shape
    groups = group_count(k, group_size)
    g = w.reshape(groups, k // groups, n)
    step, zero = group_grid(g, bits, symmetric, clip)
    codes = encode(g, step[:, None, :], None if zero is None else zero[:, None, :], bits)
    return GroupCodes(
        codes.reshape(k, n).astype(np.int8 if symmetric else np.uint8),
        step.astype(np.float32),
        None if zero is None else zero.astype(np.uint8),
        bits,
        k // groups,
    )
