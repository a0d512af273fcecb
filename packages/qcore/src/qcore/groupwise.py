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

Those are the ``"int"`` grids. The ``"gguf"`` grids are llama.cpp's block types (:data:`GGUF_GRIDS`), so that
the algorithms choose codes on the grid the file stores rather than a re-rounding of it: blocks of 32 input
channels, float16 steps; ``Q4_0`` / ``Q5_0`` / ``Q8_0`` symmetric (codes -8..7, -16..15, -127..127, the step's
sign chosen so that the group's largest magnitude lands on the lowest code, as llama.cpp does), ``Q4_1`` /
``Q5_1`` with a float16 offset, the group's minimum: ``value = code * step + offset``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .errors import ConfigError
from .quant import as_finite, qmax

#: Code widths of the ``"int"`` grids (ONNX's ``MatMulNBits``, OpenVINO's compressed weights).
GROUP_BITS = (4, 8)
#: Grid families: ours (:func:`grid_of`), or llama.cpp's GGUF block types.
GRID_FAMILIES = ("int", "gguf")


@dataclass(frozen=True)
class Grid:
    """Where a group's values may land: codes ``lowest..highest`` and, by ``zero``, ``value = code * step``
    (``"none"``), ``(code - zero_point) * step`` (``"integer"``) or ``code * step + offset`` (``"float"``).
    ``half``: steps and offsets are float16 values; ``block``: the group size the format fixes (None: any)."""

    name: str
    bits: int
    lowest: int
    highest: int
    zero: str = "none"
    half: bool = False
    block: int | None = None

    @property
    def code_dtype(self) -> type[np.integer]:
        return np.int8 if self.lowest < 0 else np.uint8


#: llama.cpp's block types (``ggml_type`` names) by ``(bits, symmetric)``; 8 bits is ``Q8_0`` either way.
GGUF_GRIDS = {
    (4, True): Grid("Q4_0", 4, -8, 7, "none", True, 32),
    (4, False): Grid("Q4_1", 4, 0, 15, "float", True, 32),
    (5, True): Grid("Q5_0", 5, -16, 15, "none", True, 32),
    (5, False): Grid("Q5_1", 5, 0, 31, "float", True, 32),
    (8, True): Grid("Q8_0", 8, -127, 127, "none", True, 32),
    (8, False): Grid("Q8_0", 8, -127, 127, "none", True, 32),
}


@dataclass(frozen=True)
class GroupCodes:
    """A ``[K, N]`` weight as codes, a step and (by its grid) a zero point or offset per group of input
    channels."""

    codes: NDArray[np.integer]  # [K, N]: int8 (codes below 0) or uint8
    scales: NDArray[np.float32]  # [K / group_size, N]
    zero_points: NDArray[np.uint8] | None  # [K / group_size, N], "integer" grids only
    bits: int
    group_size: int  # input channels per group (K for per-channel)
    offsets: NDArray[np.float32] | None = None  # [K / group_size, N], "float" grids only
    grid: Grid | None = None  # None: the "int" grid of bits and zero_points

    def dequantize(self) -> NDArray[np.float32]:
        """The float weight the codes stand for, ``[K, N]``."""
        codes = self.codes.astype(np.float32)
        if self.zero_points is not None:
            codes = codes - np.repeat(self.zero_points.astype(np.float32), self.group_size, axis=0)
        values = codes * np.repeat(self.scales, self.group_size, axis=0)
        if self.offsets is not None:
            values = values + np.repeat(self.offsets, self.group_size, axis=0)
        return values

    def select_outputs(self, index: NDArray[np.integer]) -> GroupCodes:
        """The same codes with output channels ``index`` (a reordering of the ``N`` columns)."""
        pick = (lambda a: None if a is None else np.ascontiguousarray(a[:, index]))
        return replace(self, codes=pick(self.codes), scales=pick(self.scales), zero_points=pick(self.zero_points),
                       offsets=pick(self.offsets))


def join_outputs(parts: list[GroupCodes]) -> GroupCodes | None:
    """The codes of weights that read the same input, side by side (``[K, sum of N]``, in order), when they are
    on one grid (bits, group, zero points or not, offsets or not, dtypes); else None."""
    def kind(q: GroupCodes) -> tuple:
        return (q.codes.shape[0], q.codes.dtype, q.scales.dtype, q.bits, q.group_size, q.grid,
                q.zero_points is None, q.offsets is None)

    first = parts[0]
    if any(kind(q) != kind(first) for q in parts[1:]):
        return None

    def side_by_side(field: str) -> NDArray | None:
        arrays = [getattr(q, field) for q in parts]
        return None if arrays[0] is None else np.concatenate(arrays, axis=1)

    return replace(first, codes=side_by_side("codes"), scales=side_by_side("scales"),
                   zero_points=side_by_side("zero_points"), offsets=side_by_side("offsets"))


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


def family_bits(family: str) -> tuple[int, ...]:
    """The code widths the grids of ``family`` have."""
    return GROUP_BITS if family == "int" else tuple(sorted({b for b, _ in GGUF_GRIDS}))


def check_bits(bits: int, family: str = "int") -> int:
    allowed = family_bits(family)
    if bits not in allowed:
        raise ConfigError(f"weight_bits={bits!r} is not supported for weight-only groups; use one of {allowed}")
    return bits


def grid_of(bits: int, symmetric: bool, family: str = "int") -> Grid:
    """The grid of ``bits`` codes (symmetric or with a zero point / offset) in ``family`` (:data:`GRID_FAMILIES`)."""
    if family not in GRID_FAMILIES:
        raise ConfigError(f"grid={family!r} is not valid; use one of {GRID_FAMILIES}")
    check_bits(bits, family)
    if family == "gguf":
        return GGUF_GRIDS[(bits, bool(symmetric))]
    if symmetric:
        return Grid(f"int{bits}", bits, -qmax(bits), qmax(bits))
    return Grid(f"uint{bits}", bits, 0, 2**bits - 1, "integer")


def check_group(grid: Grid, group_size: int) -> None:
    """One :class:`ConfigError` line when ``grid`` fixes a block that ``group_size`` is not."""
    if grid.block is not None and group_size != grid.block:
        raise ConfigError(f"{grid.name} blocks hold {grid.block} input channels; use group_size={grid.block} "
                          f"(got {group_size})")


def _half(values: NDArray[np.float64]) -> NDArray[np.float64]:
    return values.astype(np.float16).astype(np.float64)


def group_grid(
    rows: NDArray[np.floating], grid: Grid, clip: ArrayLike = 1.0
) -> tuple[NDArray[np.float64], NDArray[np.float64] | None]:
    """The step and zero point or offset (None when the grid has neither) of each group of ``rows``
    (``[..., size, N]``: the group's input channels on the second-last axis), its range shrunk by ``clip``."""
    ratio = np.asarray(clip, np.float64)
    levels = grid.highest - grid.lowest
    if grid.zero == "none":
        if grid.lowest == -grid.highest:
            step = np.abs(rows).max(axis=-2) * ratio / grid.highest
        else:  # one more code below 0: the largest magnitude, whatever its sign, takes the lowest code
            at = np.abs(rows).argmax(axis=-2)
            extreme = np.take_along_axis(rows, np.expand_dims(at, -2), axis=-2).squeeze(-2)
            step = extreme * ratio / grid.lowest
        return (_half(step) if grid.half else step), None
    if grid.zero == "integer":
        lo = np.minimum(rows.min(axis=-2), 0.0) * ratio
        hi = np.maximum(rows.max(axis=-2), 0.0) * ratio
        step = (hi - lo) / levels
        return step, np.clip(np.rint(-lo / np.where(step > 0, step, 1.0)), 0, levels)
    lo, hi = rows.min(axis=-2), rows.max(axis=-2)
    trim = (hi - lo) * (1.0 - ratio) / 2
    lo, hi = lo + trim, hi - trim
    if grid.half:
        lo = _half(lo)
        return _half((hi - lo) / levels), lo
    return (hi - lo) / levels, lo


def encode(values: NDArray[np.floating], step: NDArray[np.float64], zero: NDArray[np.float64] | None, grid: Grid
           ) -> NDArray[np.float64]:
    """Codes of ``values`` on ``grid`` with ``(step, zero)`` (broadcast against them); a zero step gives the
    code of the zero point (0 without one)."""
    safe = np.where(step != 0, step, 1.0)
    if grid.zero == "float":
        return np.clip(np.rint((values - zero) / safe), grid.lowest, grid.highest)
    return np.clip(np.rint(values / safe) + (0.0 if zero is None else zero), grid.lowest, grid.highest)


def decode(codes: NDArray[np.floating], step: NDArray[np.float64], zero: NDArray[np.float64] | None, grid: Grid
           ) -> NDArray[np.float64]:
    """The values of ``codes`` on ``grid`` with ``(step, zero)``."""
    if grid.zero == "float":
        return codes * step + zero
    return (codes - (0.0 if zero is None else zero)) * step


def pack_group_codes(codes: NDArray[np.float64], step: NDArray[np.float64], zero: NDArray[np.float64] | None,
                     grid: Grid, group_size: int) -> GroupCodes:
    """:class:`GroupCodes` of ``[K, N]`` codes chosen on ``grid`` with per-group ``(step, zero)``."""
    integer, offsets = grid.zero == "integer", grid.zero == "float"
    return GroupCodes(
        codes.astype(grid.code_dtype),
        step.astype(np.float32),
        zero.astype(np.uint8) if integer else None,
        grid.bits,
        group_size,
        zero.astype(np.float32) if offsets else None,
        grid,
    )


def quantize_groups(
    weight: ArrayLike, bits: int = 4, group_size: int = 128, symmetric: bool = False, clip: ArrayLike = 1.0,
    *, family: str = "int"
) -> GroupCodes:
    """Codes of ``weight`` (``[K, N]``) per group of ``group_size`` input channels (-1: per output channel).

    ``clip``: a ratio (scalar, or ``[K / group_size, N]``) the group's range is shrunk by before the step is
    taken; values beyond it clip to the end codes. ``family``: the grid (:func:`grid_of`).
    """
    grid = grid_of(bits, symmetric, family)
    w = as_finite(weight, "weight")
    if w.ndim != 2:
        raise ConfigError(f"weight has shape {w.shape}; group-wise codes take a 2-D [in, out] matmul weight")
    k, n = w.shape
    groups = group_count(k, group_size)
    check_group(grid, k // groups)
    g = w.reshape(groups, k // groups, n)
    step, zero = group_grid(g, grid, clip)
    codes = encode(g, step[:, None, :], None if zero is None else zero[:, None, :], grid)
    return pack_group_codes(codes.reshape(k, n), step, zero, grid, k // groups)
