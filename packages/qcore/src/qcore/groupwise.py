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

llama.cpp's K-quants (:data:`K_GRIDS`, ``group_size=256``) have two levels: blocks of 256 input channels cut
into sub-blocks (32 for ``Q4_K`` / ``Q5_K``, 16 for ``Q6_K``) whose steps (and, for ``Q4_K`` / ``Q5_K``, offsets
``-dmin * m``, ``m >= 0``) are integer codes (6-bit ``0..63``, or 8-bit ``-128..127`` for ``Q6_K``) times a float16
step of the block. A group of :class:`GroupCodes` is then a sub-block, and its step and offset are the values those
codes stand for (``d * sc``, ``-dmin * m``): the grid the algorithms choose codes on is the one the file holds.
The block's float16 step puts the sub-block step of largest magnitude on its end code (63, or -128), so the
writer recovers ``d`` from the steps alone (:func:`factor_steps`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

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
    ``half``: steps and offsets are float16 values; ``block``: the group size the format fixes (None: any);
    ``sub``: channels per step inside a block when the steps are two-level (K-quants), whose codes against the
    block's float16 step are ``sub_codes`` (lowest, highest)."""

    name: str
    bits: int
    lowest: int
    highest: int
    zero: str = "none"
    half: bool = False
    block: int | None = None
    sub: int | None = None
    sub_codes: tuple[int, int] | None = None

    @property
    def code_dtype(self) -> type[np.integer]:
        return np.int8 if self.lowest < 0 else np.uint8

    def step_channels(self, group_size: int) -> int:
        """Input channels sharing one step when the group size is ``group_size``."""
        return group_size if self.sub is None else self.sub


#: llama.cpp's block types (``ggml_type`` names) by ``(bits, symmetric)``; 8 bits is ``Q8_0`` either way.
GGUF_GRIDS = {
    (4, True): Grid("Q4_0", 4, -8, 7, "none", True, 32),
    (4, False): Grid("Q4_1", 4, 0, 15, "float", True, 32),
    (5, True): Grid("Q5_0", 5, -16, 15, "none", True, 32),
    (5, False): Grid("Q5_1", 5, 0, 31, "float", True, 32),
    (8, True): Grid("Q8_0", 8, -127, 127, "none", True, 32),
    (8, False): Grid("Q8_0", 8, -127, 127, "none", True, 32),
}
#: llama.cpp's K-quants by bits (``group_size=256``): sub-block steps (and offsets) are 6-bit codes of a float16
#: block step (``Q4_K``, ``Q5_K``: 8 sub-blocks of 32, ``value = code * d * sc - dmin * m``) or 8-bit signed ones
#: (``Q6_K``: 16 sub-blocks of 16, codes -32..31).
K_GRIDS = {
    4: Grid("Q4_K", 4, 0, 15, "float", True, 256, 32, (0, 63)),
    5: Grid("Q5_K", 5, 0, 31, "float", True, 256, 32, (0, 63)),
    6: Grid("Q6_K", 6, -32, 31, "none", True, 256, 16, (-128, 127)),
}
#: The GGUF block sizes ``group_size`` may take: blocks of 32 (:data:`GGUF_GRIDS`) or the K-quants' 256.
GGUF_GROUPS = (32, 256)


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
    return GROUP_BITS if family == "int" else tuple(sorted({b for b, _ in GGUF_GRIDS} | set(K_GRIDS)))


def check_bits(bits: int, family: str = "int") -> int:
    allowed = family_bits(family)
    if bits not in allowed:
        raise ConfigError(f"weight_bits={bits!r} is not supported for weight-only groups; use one of {allowed}")
    return bits


def grid_of(bits: int, symmetric: bool, family: str = "int", group_size: int | None = None) -> Grid:
    """The grid of ``bits`` codes (symmetric or with a zero point / offset) in ``family`` (:data:`GRID_FAMILIES`).
    GGUF: ``group_size`` 32 (or None) picks a block type of :data:`GGUF_GRIDS`, 256 a K-quant (:data:`K_GRIDS`,
    whatever ``symmetric`` says: ``Q4_K`` / ``Q5_K`` have offsets, ``Q6_K`` has none)."""
    if family not in GRID_FAMILIES:
        raise ConfigError(f"grid={family!r} is not valid; use one of {GRID_FAMILIES}")
    check_bits(bits, family)
    if family == "gguf":
        if group_size == 256:
            if bits not in K_GRIDS:
                raise ConfigError(f"weight_bits={bits} has no K-quant block of 256; use {sorted(K_GRIDS)} "
                                  f"(Q{'_K, Q'.join(map(str, K_GRIDS))}_K), or group_size=32 for Q8_0")
            return K_GRIDS[bits]
        if (bits, bool(symmetric)) not in GGUF_GRIDS:
            raise ConfigError(f"weight_bits={bits} is the K-quant Q{bits}_K only; use group_size=256")
        return GGUF_GRIDS[(bits, bool(symmetric))]
    if symmetric:
        return Grid(f"int{bits}", bits, -qmax(bits), qmax(bits))
    return Grid(f"uint{bits}", bits, 0, 2**bits - 1, "integer")


def check_group(grid: Grid, group_size: int) -> None:
    """One :class:`ConfigError` line when ``grid`` fixes a block that ``group_size`` is not."""
    if grid.block is not None and group_size != grid.block:
        raise ConfigError(f"{grid.name} blocks hold {grid.block} input channels; use group_size={grid.block} "
                          f"(got {group_size})")


def step_group(k: int, grid: Grid, group_size: int) -> int:
    """Input channels per step of a weight of ``k`` input channels in groups of ``group_size`` (-1: all) on
    ``grid`` (a K-quant's sub-block); one :class:`ConfigError` line when they do not fit."""
    size = k // group_count(k, group_size)
    check_group(grid, size)
    return grid.step_channels(size)


def _half(values: NDArray[np.float64]) -> NDArray[np.float64]:
    return values.astype(np.float16).astype(np.float64)


def _largest(values: NDArray[np.floating], axis: int) -> tuple[NDArray[np.intp], NDArray[np.floating]]:
    """Where along ``axis`` the value of largest magnitude is (kept as a length-1 axis), and that value."""
    at = np.expand_dims(np.abs(values).argmax(axis=axis), axis)
    return at, np.take_along_axis(values, at, axis=axis)


def _two_level(values: NDArray[np.float64], grid: Grid) -> NDArray[np.float64]:
    """``values`` (``[..., N]``, one per sub-block, leading axes whole blocks in order) as ``d * code``: ``d`` a
    float16 step per block, codes ``grid.sub_codes``, the value of largest magnitude exactly on the end code (the
    highest when codes are unsigned, else the lowest)."""
    lowest, highest = grid.sub_codes
    end = highest if lowest == 0 else lowest
    shape = values.shape
    per_block = values.reshape(-1, grid.block // grid.sub, shape[-1])
    at, extreme = _largest(per_block, axis=1)
    d = _half(extreme / end)
    codes = np.clip(np.rint(per_block / np.where(d != 0, d, 1.0)), lowest, highest)
    np.put_along_axis(codes, at, end, axis=1)
    return (d * codes).reshape(shape)


def factor_steps(values: NDArray[np.floating], grid: Grid) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """The float16 block step ``d`` (``[..., 1]``) and the integer codes (``[..., subs]``) of a block's sub-block
    values (``[..., subs]``: steps, or offsets negated) on a two-level ``grid``; one :class:`ConfigError` line when
    ``values`` are not such products."""
    lowest, highest = grid.sub_codes
    end = highest if lowest == 0 else lowest
    v = np.asarray(values, np.float64)
    _, extreme = _largest(v, axis=-1)
    d = extreme / end
    codes = v / np.where(d != 0, d, 1.0)
    if (np.any(_half(d) != d) or np.any(codes != np.rint(codes)) or np.any(codes < lowest)
            or np.any(codes > highest)):
        raise ConfigError(f"the steps are not {grid.name}'s (a float16 step per block times codes {lowest}.."
                          f"{highest}); quantize with grid='gguf', group_size=256 so that they are chosen on it")
    return d, codes


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
            step = _largest(rows, axis=-2)[1].squeeze(-2) * ratio / grid.lowest
        if grid.sub is not None:
            return _two_level(step, grid), None
        return (_half(step) if grid.half else step), None
    if grid.zero == "integer":
        lo = np.minimum(rows.min(axis=-2), 0.0) * ratio
        hi = np.maximum(rows.max(axis=-2), 0.0) * ratio
        step = (hi - lo) / levels
        return step, np.clip(np.rint(-lo / np.where(step > 0, step, 1.0)), 0, levels)
    lo, hi = rows.min(axis=-2), rows.max(axis=-2)
    trim = (hi - lo) * (1.0 - ratio) / 2
    lo, hi = lo + trim, hi - trim
    if grid.sub is not None:  # offsets -dmin * m with m >= 0: the range reaches down to 0 at least
        lo = np.minimum(lo, 0.0)
        return _two_level((hi - lo) / levels, grid), -_two_level(-lo, grid)
    if grid.half:
        lo = _half(lo)
        return _half((hi - lo) / levels), lo
    return (hi - lo) / levels, lo


def _in_place(result: Any, operand: Any) -> Any:
    """``result`` as the ``out`` of its next operation with ``operand`` when that keeps its dtype, else None (a new
    array of the promoted dtype: the result is the same as without ``out``)."""
    return result if isinstance(result, np.ndarray) and result.dtype == np.result_type(result, operand) else None


def encode(values: NDArray[np.floating], step: NDArray[np.float64], zero: NDArray[np.float64] | None, grid: Grid
           ) -> NDArray[np.float64]:
    """Codes of ``values`` on ``grid`` with ``(step, zero)`` (broadcast against them); a zero step gives the
    code of the zero point (0 without one). In place after the first operation: searches encode whole weights
    many times, and fresh temporaries measured 2.5x the time."""
    safe = np.where(step != 0, step, 1.0)
    if grid.zero == "float":
        shifted = np.subtract(values, zero)
        codes = np.divide(shifted, safe, out=_in_place(shifted, safe))
    else:
        codes = np.divide(values, safe)
    codes = np.rint(codes, out=codes if isinstance(codes, np.ndarray) else None)
    if grid.zero != "float":
        offset = 0.0 if zero is None else zero
        codes = np.add(codes, offset, out=_in_place(codes, offset))
    return np.clip(codes, grid.lowest, grid.highest, out=codes if isinstance(codes, np.ndarray) else None)


def decode(codes: NDArray[np.floating], step: NDArray[np.float64], zero: NDArray[np.float64] | None, grid: Grid,
           out: NDArray[np.float64] | None = None) -> NDArray[np.float64]:
    """The values of ``codes`` on ``grid`` with ``(step, zero)``; into ``out`` if given (it may be ``codes``)."""
    if grid.zero == "float":
        values = np.multiply(codes, step, out=out)
        return np.add(values, zero, out=_in_place(values, zero))
    values = np.subtract(codes, 0.0 if zero is None else zero, out=out)
    return np.multiply(values, step, out=_in_place(values, step))


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

    ``clip``: a ratio (scalar, or ``[groups, N]``) each group's range is shrunk by before the step is taken;
    values beyond it clip to the end codes. ``family``: the grid (:func:`grid_of`); the groups are the grid's
    steps (a K-quant's sub-blocks for ``group_size=256``).
    """
    grid = grid_of(bits, symmetric, family, group_size)
    w = as_finite(weight, "weight")
    if w.ndim != 2:
        raise ConfigError(f"weight has shape {w.shape}; group-wise codes take a 2-D [in, out] matmul weight")
    k, n = w.shape
    size = step_group(k, grid, group_size)
    g = w.reshape(k // size, size, n)
    step, zero = group_grid(g, grid, clip)
    codes = encode(g, step[:, None, :], None if zero is None else zero[:, None, :], grid)
    return pack_group_codes(codes.reshape(k, n), step, zero, grid, size)
