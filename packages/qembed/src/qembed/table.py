"""Quantizing embedding tables as plain arrays, for teams that keep tables outside Paddle.

A table is a 2-D float array (rows = ids). ``abs_max`` stores int codes with one scale for the
whole table or one per row; ``log`` stores sign + log-grid codes relative to the abs max (one
per table or per row) on a grid whose spacing is fitted to the table
(:func:`qcore.quant.log_quantize`, :func:`qcore.quant.fit_log_step`). Codes of 4 bits or fewer
can be packed two per byte.

Both schemes run in float32 on cache-sized blocks so one core quantizes over 1 GB/s of fp32
table: abs_max as ``codes = clip(rint(x / scale), -qmax, qmax)`` (the convention of
:mod:`qcore.quant`, which computes in float64 and may differ by one code on exact ties), log by
one table lookup per value (:func:`qcore.quant.log_codes`). ``.npy`` tables are processed in
chunks with plain reads and writes, so a table larger than memory is quantized with bounded RSS,
and a quantized ``.npy`` table opens as a memory map whose lookups read only the requested rows.
``.npy`` inputs are checked from their header (numeric dtype, size) before any work, and outputs
appear only complete (:func:`qcore.outputs.staged_output`), never over an input.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

from qcore.config import short_repr, validate_bits, validate_choice
from qcore.constants import EMBEDDING_QUANTIZE_TYPES
from qcore.errors import ConfigError, DataError, OutputError
from qcore.outputs import check_output_dir, staged_output
from qcore.packing import MAX_PACKED_BITS, packed_width
from qcore.quant import LN2, check_log_step, fit_log_step, log_codes, log_dequantize, qmax


class StoredRows(Protocol):
    """A stored table of another layout (:class:`qembed.mixed.MixedTable`): what errors are measured on."""

    def dequantize(self) -> NDArray[np.float32]: ...

BLOCK_BYTES = 1 << 20  # fp32 bytes per work block: big enough to amortise numpy calls, small enough for L2
READ_BYTES = 1 << 20  # .npy bytes read at a time: still in cache when they are quantized
LOG_FIT_VALUES = 1 << 15  # values (whole rows, evenly spaced) the log grid's spacing is fitted on
_ROUNDER = np.float32(1.5 * 2**23)  # x + this rounds x to an integer (half to even) for |x| < 2**22
#: How per-row scales and offsets are stored (``scale_dtype``); a whole-table scale is one float32 whatever it says.
SCALE_DTYPES = ("float32", "float16")


@dataclass
class QuantizedTable:
    """Integer codes of a table plus what is needed to dequantize any subset of rows.

    ``codes`` is int8 ``[rows, dim]``, or uint8 ``[rows, ceil(dim / 2)]`` when ``packed`` (two
    4-bit codes per byte, low nibble first). It may be a read-only memory map. A log code ``c``
    stands for ``sign(c) * scale * exp(log_step * (1 - |c|))``. With ``offsets`` (one per row) the
    grid is affine: codes are ``0 .. 2**bits - 1`` and stand for ``code * scale + offset``.
    """

    codes: NDArray[np.integer]
    scales: NDArray[np.floating]  # one per row (float32 or float16), or a single float32 value (log: the abs max)
    quantize_type: str
    bits: int
    dim: int | None = None  # defaults to codes.shape[1]; needed when packed with an odd dim
    packed: bool = False
    log_step: float | None = None  # log only: the levels' spacing in the natural-log domain
    offsets: NDArray[np.floating] | None = None  # affine rows: unsigned codes, ``codes * scale + offset``

    def __post_init__(self) -> None:
        if self.dim is None:
            self.dim = int(self.codes.shape[1]) * (2 if self.packed else 1)

    @property
    def per_row(self) -> bool:
        return self.scales.size > 1

    def rows(self, ids: ArrayLike) -> NDArray[np.float32]:
        """Dequantize only the looked-up rows (what a quantized lookup does)."""
        idx = np.asarray(ids, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self.codes)):
            raise DataError(f"ids must be in [0, {len(self.codes)}); got {idx.min()}..{idx.max()}")
        flat = idx.reshape(-1)
        codes = np.asarray(np.take(self.codes, flat, axis=0))  # take: 3x faster than indexing (memory maps too)
        if self.packed:
            codes = unpack_int4(codes, self.dim)
        scales = self.scales[flat] if self.per_row else self.scales[:1]
        values = _dequantize(codes, scales, self.per_row, self.quantize_type, self.log_step)
        if self.offsets is not None:
            values += self.offsets[flat][:, None].astype(np.float32)
        return values.reshape(*idx.shape, self.dim)

    def dequantize(self) -> NDArray[np.float32]:
        """The whole float32 table."""
        return self.rows(np.arange(len(self.codes)))

    def packed_int4(self) -> QuantizedTable:
        """The same table with two codes per byte (for ``bits <= 4``): half the bytes."""
        if self.bits > 4:
            raise DataError(f"only codes of up to 4 bits fit in a nibble; this table has {self.bits}")
        if self.packed:
            return self
        if self.offsets is not None:
            raise DataError("affine rows (offsets) are packed inside Paddle models only; quantize with "
                            "asymmetric=False for a packed numpy table")
        return QuantizedTable(
            pack_int4(self.codes), self.scales, self.quantize_type, self.bits, self.dim, True, self.log_step
        )

    @property
    def scale_dtype(self) -> str:
        """How the per-row scales and offsets are stored: "float32" or "float16" (see :data:`SCALE_DTYPES`)."""
        return str(self.scales.dtype)

    @property
    def stored_bytes(self) -> int:
        """Bytes of the codes as a Paddle model stores them (packed when ``bits`` <= 4), scales and offsets."""
        rows = len(self.codes)
        codes = rows * (packed_width(self.dim, self.bits) if self.bits <= MAX_PACKED_BITS else self.dim)
        return codes + self.scales.nbytes + (0 if self.offsets is None else self.offsets.nbytes)


def pack_int4(codes: NDArray[np.integer]) -> NDArray[np.uint8]:
    """Pack int codes in -8..7 two per byte along the last axis (low nibble first)."""
    c = np.asarray(codes, np.int8)
    if c.shape[-1] % 2:
        c = np.concatenate([c, np.zeros((*c.shape[:-1], 1), np.int8)], axis=-1)
    pairs = np.bitwise_and(np.ascontiguousarray(c).view("<u2"), 0x0F0F)  # even code's nibble | odd's << 8
    pairs |= pairs >> 4  # low byte: even | odd << 4
    return pairs.astype(np.uint8)  # keeps the low byte


def unpack_int4(packed: NDArray[np.uint8], dim: int) -> NDArray[np.int8]:
    """Inverse of :func:`pack_int4` (sign-extends each nibble); keeps the first ``dim`` codes."""
    p = np.asarray(packed, np.uint8)
    out = np.empty((*p.shape[:-1], p.shape[-1] * 2), np.int8)
    out[..., 0::2] = (p << 4).view(np.int8) >> 4
    out[..., 1::2] = p.view(np.int8) >> 4
    return out[..., :dim]


def _dequantize(
    codes: NDArray[np.integer], scales: NDArray[np.float32], per_row: bool, quantize_type: str, log_step: float | None
) -> NDArray[np.float32]:
    """``codes`` (rows) times ``scales`` (one per row, or one), read on the table's grid. float16 scales are
    widened to float32 first, as every reader does."""
    scales = scales.astype(np.float32, copy=False)
    if quantize_type == "log":
        meta = {"scheme": "log2", "absmax": scales if per_row else scales[0], "axis": 0 if per_row else None,
                "step": log_step}
        return log_dequantize(codes, meta)
    # one pass into one new array (astype then multiply: two, and a second array to page in)
    return np.multiply(codes, scales[:, None] if per_row else scales[0], dtype=np.float32)


def _check_finite(table: NDArray[np.float32], absmax: float | NDArray[np.float32], name: str) -> None:
    """NaN/Inf anywhere makes the abs max non-finite, so checking the maxima is enough."""
    if not np.isfinite(absmax).all():
        bad = int(np.count_nonzero(~np.isfinite(table)))
        raise DataError(f"{name} contains {bad} NaN/Inf value(s); clean the table first")


def _to_half(values: NDArray[np.float32], name: str, what: str, up: bool = False) -> NDArray[np.float16]:
    """``values`` as float16, rounded up (scales: no code then leaves its range) or to the nearest (offsets);
    one DataError line when one is beyond float16's range."""
    with np.errstate(over="ignore"):
        half = values.astype(np.float16)
        if up:
            low = half.astype(np.float32) < values
            half[low] = np.nextafter(half[low], np.float16(np.inf))
    if not np.isfinite(half).all():
        raise DataError(f"{name} has a per-row {what} of {float(np.abs(values).max()):.6g}, beyond float16's "
                        f"{float(np.finfo(np.float16).max):g}; use scale_dtype='float32'")
    return half


def _row_absmax(block: NDArray[np.float32], work: NDArray[np.float32]) -> NDArray[np.float32]:
    """Per-row max of |x| (``work`` is a scratch buffer of ``block``'s shape).

    Clearing the sign bit and taking an int32 max gives the same result as a float max of |x|
    (non-negative floats order like their bit patterns; NaN still comes out as NaN) about twice
    as fast, since numpy's float max handles NaN on every element. ``reduceat`` over the flat rows
    is about twice as fast again as ``max(axis=1)`` on short rows.
    """
    bits = work.view(np.int32)
    np.bitwise_and(np.ascontiguousarray(block).view(np.int32), 0x7FFFFFFF, out=bits)
    rows, dim = bits.shape
    return np.maximum.reduceat(bits.reshape(-1), np.arange(0, rows * dim, dim)).view(np.float32)


def _work_buffers(rows: int, dim: int, log: bool) -> tuple[NDArray[np.float32], NDArray[np.intp]]:
    """Scratch buffers of :func:`_table_codes` for tables of up to ``rows`` rows."""
    work = np.empty((min(max(1, BLOCK_BYTES // (4 * dim)), rows), dim), np.float32)
    return work, np.empty(work.size if log else 0, np.intp)


def _table_codes(
    table: NDArray[np.float32], quantize_type: str, bits: int, per_row: bool, threshold: float | None,
    absmax: float | None, log_step: float | None,
    buffers: tuple[NDArray[np.float32], NDArray[np.intp]] | None = None, half: bool = False,
) -> tuple[NDArray[np.integer], NDArray[np.floating]]:
    """Codes and scales, block by block; ``absmax`` is the whole table's (one scale only).

    ``buffers`` (from :func:`_work_buffers`) lets a caller quantizing chunk after chunk reuse them. ``half``:
    per-row scales are float16, rounded up, and the codes are computed against them.
    """
    qm = qmax(bits)
    log = quantize_type == "log"
    per_scale = 1 if log else qm  # scale = abs max / per_scale
    rows, dim = table.shape
    codes = np.empty((rows, dim), np.int8 if bits <= 8 else np.int16)
    scales = np.empty(rows if per_row else 1, np.float32)
    if not per_row:
        top = absmax if absmax is not None else _table_absmax(table, "embedding table")
        scales[0] = (min(top, threshold) if threshold else top) / per_scale
    work, index = buffers or _work_buffers(rows, dim, log)
    block_rows = len(work)
    for start in range(0, rows, block_rows):
        block = table[start : start + block_rows]
        buf = work[: len(block)]
        if per_row:
            top = _row_absmax(block, buf)
            _check_finite(block, top, "embedding table")
            if threshold:
                np.minimum(top, threshold, out=top)
            scale = scales[start : start + len(block)]
            np.divide(top, per_scale, out=scale)
            if half:
                scale[:] = _to_half(scale, "embedding table", "scale", up=True)
            step = np.where(scale > 0, scale, np.float32(1))[:, None]
        else:
            step = scales[0] if scales[0] > 0 else np.float32(1)
        np.divide(block, step, out=buf)
        out = codes[start : start + len(block)]
        if log:
            log_codes(buf, bits, log_step, out=out.reshape(-1), index=index[: buf.size])
            continue
        if bits > 8:
            np.rint(buf, out=buf)
            if threshold:
                np.clip(buf, -qm, qm, out=buf)
            np.copyto(out, buf, casting="unsafe")
            continue
        # rint by adding 1.5 * 2**23: the sum rounds half to even, and its bits end in the code's two's complement
        # (exact for |x| < 2**22; larger values only occur with a threshold, which clips them to +-qm first)
        np.add(buf, _ROUNDER, out=buf)
        if threshold:
            np.clip(buf, _ROUNDER - qm, _ROUNDER + qm, out=buf)
        np.copyto(out, buf.view(np.int32), casting="unsafe")  # keeps the low byte
    return codes, scales.astype(np.float16) if half and per_row else scales


def _sample_rows(rows: int, dim: int) -> NDArray[np.intp]:
    """Evenly spaced row ids holding about ``LOG_FIT_VALUES`` values (every row of a small table)."""
    return np.linspace(0, rows - 1, min(rows, max(1, LOG_FIT_VALUES // dim))).round().astype(np.intp)


def _fit_log_step(sample: NDArray[np.float32], bits: int, per_row: bool, threshold: float | None,
                  absmax: float | None) -> float:
    """The log grid's spacing fitted on sampled rows, against the abs max the codes will use."""
    if not np.isfinite(sample).all():
        return LN2  # the table is refused with its NaN/Inf count while it is quantized
    reference = np.abs(sample).max(axis=1) if per_row else np.float32(absmax)
    if threshold:
        reference = np.minimum(reference, np.float32(threshold))
    return fit_log_step(sample, bits, 0 if per_row else None, reference)


def _table_absmax(table: NDArray[np.float32], name: str) -> float:
    """Max of |x| over the table, block by block (see :func:`_row_absmax`)."""
    block_rows = max(1, BLOCK_BYTES // (4 * table.shape[1]))
    work = np.empty((min(block_rows, len(table)), table.shape[1]), np.float32)
    top = np.float32(0)
    for start in range(0, len(table), block_rows):
        block = table[start : start + block_rows]
        top = np.maximum(top, _row_absmax(block.reshape(1, -1), work[: len(block)].reshape(1, -1))[0])  # keeps NaN
    _check_finite(table, top, name)
    return float(top)


def quantize_table(
    table: ArrayLike,
    quantize_type: str = "abs_max",
    bits: int = 8,
    per_row: bool = False,
    threshold: float | None = None,
    *,
    global_absmax: float | None = None,
    log_step: float | None = None,
    scale_dtype: str = "float32",
) -> QuantizedTable:
    """Quantize a whole table in memory; ``threshold`` clips values first (the seeds' option).

    ``global_absmax`` (whole-table scale only) sets the abs max instead of measuring it and
    ``log_step`` the log grid's spacing instead of fitting it, so a table can be quantized chunk
    by chunk with one scale and one grid. ``scale_dtype="float16"`` stores per-row scales as float16
    (rounded up; the codes are computed against them).
    """
    validate_choice("quantize_type", quantize_type, EMBEDDING_QUANTIZE_TYPES)
    half = validate_choice("scale_dtype", scale_dtype, SCALE_DTYPES) == "float16"
    validate_bits("quantize_bits", bits, 2, 8 if quantize_type == "log" else 16)
    source = np.asarray(table)
    if source.ndim != 2 or source.size == 0:
        raise DataError(f"an embedding table must be a non-empty 2-D array (rows, dim); got shape {source.shape}")
    _check_float32_range(source, "embedding table")
    values = np.asarray(source, dtype=np.float32)
    _check_threshold(threshold)
    if log_step is not None:
        log_step = check_log_step(log_step)
    elif quantize_type == "log":
        if not per_row and global_absmax is None:
            global_absmax = _table_absmax(values, "embedding table")
        sample = values[_sample_rows(*values.shape)]
        log_step = _fit_log_step(sample, bits, per_row, threshold, global_absmax)
    codes, scales = _table_codes(values, quantize_type, bits, per_row, threshold, global_absmax, log_step, half=half)
    _check_not_all_zero(float(scales.max()), "embedding table")
    return QuantizedTable(codes, scales, quantize_type, bits, log_step=log_step if quantize_type == "log" else None)


# ---- searched grids for few-bit rows -------------------------------------------------------
#: Fractions of each row's range tried as its grid (the rest is clipped): few-bit grids gain from
#: clipping a row's outliers (measured on GloVe at 4 bits: relative error 0.107 -> see the benchmark).
CLIP_RATIOS = tuple(np.round(np.linspace(1.0, 0.5, 11), 2))
#: Least-squares refinements of the best clipped grid (measured at 4 bits, relative error: DLRM-style 16-wide rows
#: 0.0814 -> 0.0802 symmetric, 0.0638 -> 0.0589 affine; GloVe 50d 0.1003 -> 0.0997, 0.0848 -> 0.0817).
REFINE_STEPS = 4


def _least_squares_grid(block: NDArray[np.float32], codes: NDArray[np.float32],
                        affine: bool) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
    """Per row, the scale (and ``affine`` offset) minimising ``||codes * scale + offset - row||`` for fixed codes;
    never negative scales (a row whose codes are all equal keeps scale 0 and, affine, its mean as offset)."""
    if affine:
        mean_c, mean_x = codes.mean(axis=1), block.mean(axis=1)
        centred = codes - mean_c[:, None]
        var = np.square(centred).sum(axis=1)
        cov = (centred * (block - mean_x[:, None])).sum(axis=1)
        scale = np.divide(cov, var, out=np.zeros_like(var), where=var > 0)
        scale = np.maximum(scale, 0)
        return scale.astype(np.float32), (mean_x - scale * mean_c).astype(np.float32)
    energy = np.square(codes).sum(axis=1)
    dot = (codes * block).sum(axis=1)
    scale = np.maximum(np.divide(dot, energy, out=np.zeros_like(energy), where=energy > 0), 0)
    return scale.astype(np.float32), np.zeros_like(scale, dtype=np.float32)


def _keep_better(block: NDArray[np.float32], scale: NDArray[np.float32], base: NDArray[np.float32], top: int,
                 affine: bool, half: bool, best: NDArray[np.float32],
                 found: tuple[NDArray[np.int8], NDArray[np.float32], NDArray[np.float32]]) -> NDArray[np.float32]:
    """Encode ``block``'s rows on the grids ``(scale, base)`` (float16-rounded with ``half``); where a row's error is
    below ``best``, store its codes, scale and offset in ``found`` and its error in ``best``. Returns the codes."""
    if half:
        scale = _to_half(scale, "embedding table", "scale", up=True).astype(np.float32)
        base = _to_half(base, "embedding table", "offset").astype(np.float32)
    step = np.where(scale > 0, scale, np.float32(1))[:, None]
    c = np.clip(np.rint((block - base[:, None]) / step), 0 if affine else -top, top)
    err = np.square(c * scale[:, None] + base[:, None] - block).sum(axis=1)
    better = err < best
    best[better] = err[better]
    for target, value in zip(found, (c, scale, base)):
        target[better] = value[better]
    return c


def searched_rows(table: ArrayLike, bits: int, affine: bool, half: bool = False) -> QuantizedTable:
    """Per-row grids of ``bits`` bits whose range is searched per row (:data:`CLIP_RATIOS`) for the least
    squared error: symmetric (codes ``-qmax .. qmax``) or ``affine`` (codes ``0 .. 2**bits - 1`` over
    ``[min, max]`` of the row shrunk towards zero, with a per-row offset). The best range is then refined
    (:data:`REFINE_STEPS` times: the least-squares scale and offset for the codes, codes re-rounded), each row
    keeping its least error. ``half``: scales and offsets are float16 (scales rounded up, offsets to the
    nearest) and the codes and errors are computed against them."""
    values = np.asarray(table, np.float32)
    _check_finite(values, np.abs(values).max(axis=1), "embedding table")
    rows, dim = values.shape
    top = 2**bits - 1 if affine else qmax(bits)
    codes = np.empty((rows, dim), np.int8)
    scales = np.empty(rows, np.float32)
    offsets = np.zeros(rows, np.float32)
    block_rows = max(1, BLOCK_BYTES // (4 * dim))
    for start in range(0, rows, block_rows):
        block = values[start : start + block_rows]
        lo, hi = (block.min(axis=1), block.max(axis=1)) if affine else (None, np.abs(block).max(axis=1))
        best = np.full(len(block), np.inf, np.float32)
        found = (codes[start : start + len(block)], scales[start : start + len(block)],
                 offsets[start : start + len(block)])
        for ratio in CLIP_RATIOS:
            r = np.float32(ratio)
            scale = (hi - lo) * r / top if affine else hi * r / top  # 0 for a constant row: codes 0
            _keep_better(block, scale, lo * r if affine else np.zeros_like(scale), top, affine, half, best, found)
        c = found[0].astype(np.float32)
        for _ in range(REFINE_STEPS):
            c = _keep_better(block, *_least_squares_grid(block, c, affine), top, affine, half, best, found)
    _check_not_all_zero(float(np.abs(values).max()), "embedding table")
    stored = np.float16 if half else np.float32
    return QuantizedTable(codes, scales.astype(stored), "abs_max", bits,
                          offsets=offsets.astype(stored) if affine else None)


# ---- choosing the grid: scales, offsets, bits -------------------------------------------------
@dataclass(frozen=True)
class TableChoice:
    """A quantized table and the measured errors behind the choice.

    Errors are relative RMS errors ``||dequantized - table|| / ||table||`` over the whole table,
    measured against the unclipped table (so clipping by ``threshold`` counts as error).
    ``errors_by_bits``: with ``quantize_bits="auto"``, the error of each width tried. ``read_error`` (mixed tables,
    :mod:`qembed.mixed`): the relative error of the rows weighted by how often calibration ids read them.
    """

    table: QuantizedTable | StoredRows
    per_row: bool
    whole_table_error: float
    per_row_error: float
    asymmetric: bool = False
    errors_by_bits: dict[int, float] | None = None
    read_error: float | None = None

    @property
    def error(self) -> float:
        return self.per_row_error if self.per_row else self.whole_table_error


# per_row="auto" takes per-row scales when they cut the error by at least this factor;
# they cost 4 bytes per row (6% of an int8 table of dim 64). The same rule takes per-row offsets.
AUTO_PER_ROW_GAIN = 0.8
#: quantize_bits="auto" tries these widths, smallest table first, and keeps the first within the error budget.
AUTO_BITS = (2, 4, 8)
#: quantize_bits="auto"'s default budget: relative RMS error of the table (int8 with one scale measures
#: 0.02-0.03 on real tables, which changed no measured task metric by more than 0.3 %).
DEFAULT_MAX_ERROR = 0.02


def relative_error(table: ArrayLike, quantized: QuantizedTable | StoredRows) -> float:
    """``||dequantized - table|| / ||table||`` (0 for an all-zero table)."""
    values = np.asarray(table, np.float32)
    norm = float(np.linalg.norm(values))
    return float(np.linalg.norm(quantized.dequantize() - values)) / norm if norm else 0.0


def choose_table_quantization(
    table: ArrayLike,
    quantize_type: str = "abs_max",
    bits: int | str = 8,
    per_row: bool | str = "auto",
    threshold: float | None = None,
    asymmetric: bool | str = "auto",
    max_error: float = DEFAULT_MAX_ERROR,
    scale_dtype: str = "float32",
) -> TableChoice:
    """Quantize ``table`` with one scale and with per-row scales, measure both, keep one.

    ``per_row`` True or False forces the granularity; ``"auto"`` picks per-row scales when
    their error is below ``AUTO_PER_ROW_GAIN`` times the whole-table error. Per-row abs_max grids
    of <= 4 bits are searched per row (:func:`searched_rows`); ``asymmetric`` adds per-row offsets
    (True), or where they cut the error by the same factor (``"auto"``). ``bits="auto"`` tries
    :data:`AUTO_BITS` and keeps the smallest within ``max_error``. ``scale_dtype``: how per-row
    scales and offsets are stored (:data:`SCALE_DTYPES`); the errors are measured with them.
    """
    half = validate_choice("scale_dtype", scale_dtype, SCALE_DTYPES) == "float16"
    if bits == "auto":
        tried: dict[int, float] = {}
        for width in AUTO_BITS:
            choice = choose_table_quantization(table, quantize_type, width, per_row, threshold, asymmetric,
                                               scale_dtype=scale_dtype)
            tried[width] = choice.error
            if choice.error <= max_error or width == AUTO_BITS[-1]:
                return TableChoice(choice.table, choice.per_row, choice.whole_table_error, choice.per_row_error,
                                   choice.asymmetric, tried)
    assert isinstance(bits, int)
    whole = quantize_table(table, quantize_type, bits, False, threshold)
    few_bits = quantize_type == "abs_max" and bits <= MAX_PACKED_BITS and threshold is None
    rows = searched_rows(table, bits, affine=False, half=half) if few_bits else quantize_table(
        table, quantize_type, bits, True, threshold, scale_dtype=scale_dtype)
    whole_err, row_err = relative_error(table, whole), relative_error(table, rows)
    affine = False
    if few_bits and asymmetric is not False:
        shifted = searched_rows(table, bits, affine=True, half=half)
        shifted_err = relative_error(table, shifted)
        if asymmetric is True or shifted_err < AUTO_PER_ROW_GAIN * row_err:
            rows, row_err, affine = shifted, shifted_err, True
    if per_row == "auto":
        per_row = affine or row_err < AUTO_PER_ROW_GAIN * whole_err
    return TableChoice(rows if per_row else whole, bool(per_row), whole_err, row_err, affine and bool(per_row))


# ---- .npy tables larger than memory --------------------------------------------------------
# .npy header readers by format version; 3.0 is 2.0 with a UTF-8 header, which numeric dtypes never need.
_HEADER_READERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
    (3, 0): np.lib.format.read_array_header_2_0,
}
# key of <stem>.qembed.json -> what a valid value is (log_step: log tables only)
_META_KEYS = {
    "quantize_type": "'abs_max' or 'log'",
    "bits": "an int from 2 to 8",
    "dim": "an int > 0",
    "packed": "true (only with bits <= 4) or false",
    "log_step": "a number > 0",
    "scale_dtype": "'float32' or 'float16' (optional: float32)",
}
_RECREATE = "re-create the table with qembed.quantize_npy"


def _meta_path(dst: str | os.PathLike[str]) -> Path:
    return Path(str(Path(dst).with_suffix("")) + ".qembed.json")


def _scales_path(dst: str | os.PathLike[str]) -> Path:
    return Path(str(Path(dst).with_suffix("")) + ".scales.npy")


def quantize_npy(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    quantize_type: str = "abs_max",
    bits: int = 8,
    per_row: bool = True,
    threshold: float | None = None,
    chunk_rows: int = 65536,
    pack: bool = True,
    scale_dtype: str = "float32",
) -> QuantizedTable:
    """Quantize the ``.npy`` table ``src`` into ``dst`` chunk by chunk; returns it memory-mapped.

    Writes ``dst`` (int8 codes, or uint8 with two 4-bit codes per byte when ``bits <= 4`` and
    ``pack``), ``<stem>.scales.npy`` and ``<stem>.qembed.json`` (how to read them back, see
    :func:`load_quantized_npy`). Only ``chunk_rows`` rows are resident at a time (a whole-table
    scale takes one extra read pass for the abs max), so the table may be larger than memory.
    The three files are written in a staging directory and moved into place (the json last) only
    when the whole table is quantized: a failed run leaves a previous output as it was.
    ``scale_dtype="float16"`` stores per-row scales as float16 (the json says so).
    """
    quantize_type = validate_choice("quantize_type", quantize_type, EMBEDDING_QUANTIZE_TYPES)
    half = validate_choice("scale_dtype", scale_dtype, SCALE_DTYPES) == "float16" and per_row
    bits = validate_bits("quantize_bits", bits, 2, 8)
    _check_threshold(threshold)
    _check_chunk_rows(chunk_rows)
    shape, source_dtype, source_offset = _npy_layout(src)
    if len(shape) != 2 or 0 in shape:
        raise DataError(f"{src}: an embedding table must be a non-empty 2-D array (rows, dim); got shape {shape}")
    dst = Path(dst)
    meta_file = _meta_path(dst)
    _check_outputs([Path(src)], [dst, _scales_path(dst), meta_file])
    rows, dim = shape
    packed = pack and bits <= 4
    chunk_rows = min(chunk_rows, max(1, READ_BYTES // (dim * source_dtype.itemsize)))
    global_absmax = None if per_row else _npy_absmax(src, shape, source_dtype, source_offset, chunk_rows)
    if global_absmax is not None:
        _check_not_all_zero(global_absmax, str(src))
    meta: dict[str, Any] = {"quantize_type": quantize_type, "bits": bits, "dim": dim, "packed": packed}
    if half:
        meta["scale_dtype"] = "float16"
    log_step = None
    if quantize_type == "log":
        sample = _npy_rows(src, _sample_rows(rows, dim), source_dtype, source_offset, dim)
        meta["log_step"] = log_step = _fit_log_step(sample, bits, per_row, threshold, global_absmax)
    scales_name = _scales_path(dst).name
    with staged_output(dst.parent, last=[meta_file.name]) as stage, open(stage / scales_name, "wb") as fscales:
        # plain reads and writes, not memory maps: mapped pages would count against RSS
        with open(src, "rb") as fin, open(stage / dst.name, "wb") as fout:
            _write_npy_header(fout, np.uint8 if packed else np.int8, (rows, (dim + 1) // 2 if packed else dim))
            _write_npy_header(fscales, np.float16 if half else np.float32, (rows if per_row else 1,))
            fin.seek(source_offset)
            buffers = _work_buffers(chunk_rows, dim, quantize_type == "log")
            largest = 0.0
            for chunk in _chunks(fin, source_dtype, rows, dim, chunk_rows):
                _check_float32_range(chunk, str(src))
                codes, scales = _table_codes(np.asarray(chunk, np.float32), quantize_type, bits, per_row, threshold,
                                             global_absmax, log_step, buffers, half)
                fout.write(pack_int4(codes) if packed else codes)
                _start_writeback(fout)
                largest = max(largest, float(scales.max()))
                if per_row:
                    fscales.write(scales)
            if not per_row:
                fscales.write(scales)
            _check_not_all_zero(largest, str(src))  # raised here, nothing is moved into place
        (stage / meta_file.name).write_text(json.dumps(meta))
    return load_quantized_npy(dst)


def load_quantized_npy(path: str | os.PathLike[str]) -> QuantizedTable:
    """Open a table written by :func:`quantize_npy`; codes stay on disk as a read-only memory map.

    The json, the codes and the scales are checked against each other first (DataError).
    """
    meta_file, scales_file = _meta_path(path), _scales_path(path)
    if not meta_file.is_file():
        raise DataError(f"{meta_file} not found; {path} was not written by qembed.quantize_npy")
    meta = _read_meta(meta_file)
    dim, packed = meta["dim"], meta["packed"]
    codes_dtype, width = (np.dtype(np.uint8), (dim + 1) // 2) if packed else (np.dtype(np.int8), dim)
    shape, dtype, _ = _npy_layout(path)
    if dtype != codes_dtype or len(shape) != 2 or shape[0] == 0 or shape[1] != width:
        raise DataError(f"{path} holds {dtype} codes of shape {shape} but {meta_file} describes {codes_dtype} "
                        f"codes of shape (rows, {width}); {_RECREATE}")
    scales_shape, scales_dtype, _ = _npy_layout(scales_file)
    wanted = meta.get("scale_dtype", "float32")
    if scales_dtype != np.dtype(wanted) or scales_shape not in ((shape[0],), (1,)):
        raise DataError(f"{scales_file} holds {scales_dtype} scales of shape {scales_shape}; {path} needs {wanted} "
                        f"of shape ({shape[0]},) or (1,); {_RECREATE}")
    scales = np.load(scales_file, allow_pickle=False)
    if not (np.isfinite(scales) & (scales >= 0)).all():
        raise DataError(f"{scales_file} holds negative or non-finite scales; {_RECREATE}")
    codes = np.load(path, mmap_mode="r", allow_pickle=False)
    return QuantizedTable(codes, scales, meta["quantize_type"], meta["bits"], dim, packed, meta.get("log_step"))


def dequantize_npy(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], chunk_rows: int = 65536
) -> None:
    """Write the float32 table of a :func:`quantize_npy` output to ``dst``, chunk by chunk.

    ``dst`` is written in a staging directory and replaces any old file in one rename when complete.
    """
    _check_chunk_rows(chunk_rows)
    table = load_quantized_npy(src)
    dst = Path(dst)
    _check_outputs([Path(src), _scales_path(src), _meta_path(src)], [dst])
    rows = len(table.codes)
    # one file: a plain replace is atomic, so nothing is held back for last
    with staged_output(dst.parent) as stage, open(stage / dst.name, "wb") as fout:
        _write_npy_header(fout, np.float32, (rows, table.dim))
        for start in range(0, rows, chunk_rows):
            fout.write(table.rows(np.arange(start, min(start + chunk_rows, rows))).tobytes())


def _check_threshold(threshold: float | None) -> None:
    if threshold is not None and not (isinstance(threshold, numbers.Real) and threshold > 0):
        raise DataError(f"threshold must be > 0, got {short_repr(threshold)}; pass a positive clipping value, "
                        "or None for no clipping")


def _check_not_all_zero(largest: float, name: str) -> None:
    """``largest``: the table's largest scale. An all-zero table has nothing to quantize: usually its
    trained values were never loaded."""
    if largest == 0:
        raise DataError(f"{name} is all zeros, so there is nothing to quantize; load its trained values first "
                        "(all-zero rows, such as a padding row, are fine)")


def _check_float32_range(values: NDArray[Any], name: str) -> None:
    """Tables are quantized in float32: a float64 value beyond its range would silently become Inf."""
    if values.dtype.itemsize > 4 and values.dtype.kind == "f":
        finite = np.abs(values[np.isfinite(values)])
        if finite.size and finite.max() > np.finfo(np.float32).max:
            raise DataError(f"{name} holds values up to {finite.max():.3g}, beyond float32's range; "
                            "rescale the table into float32's range first")


def _check_chunk_rows(chunk_rows: int) -> None:
    if isinstance(chunk_rows, bool) or not isinstance(chunk_rows, numbers.Integral) or chunk_rows < 1:
        raise ConfigError(f"chunk_rows={short_repr(chunk_rows)} is not valid; valid choices: an int greater than 0")


def _check_outputs(inputs: list[Path], outputs: list[Path]) -> None:
    """Refuse, before any work, outputs that are directories or would replace an input file."""
    for out in outputs:
        if out.is_dir():
            raise OutputError(f"output {out} is a directory; give a file name for the output")
        for source in inputs:
            if out.resolve() == source.resolve() or (out.exists() and os.path.samefile(out, source)):
                raise OutputError(f"{out} would overwrite the input {source}; "
                                  f"choose another output name than {outputs[0]}")
    check_output_dir(outputs[0].parent)


def _read_meta(meta_file: Path) -> dict[str, Any]:
    """The checked contents of a ``<stem>.qembed.json``."""
    try:
        meta = json.loads(meta_file.read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read {meta_file} ({_one_line(str(exc))}); {_RECREATE}") from None
    keys = list(_META_KEYS)[: 5 if isinstance(meta, dict) and meta.get("quantize_type") == "log" else 4]
    if not isinstance(meta, dict) or set(meta) - {"scale_dtype"} != set(keys):
        raise DataError(f"{meta_file} must hold a JSON object with the keys {', '.join(keys)} (and optionally "
                        f"scale_dtype); {_RECREATE}")
    quantize_type, bits, dim, packed = (meta[k] for k in keys[:4])
    valid = {
        "quantize_type": isinstance(quantize_type, str) and quantize_type in EMBEDDING_QUANTIZE_TYPES,
        "bits": type(bits) is int and 2 <= bits <= 8,
        "dim": type(dim) is int and dim > 0,
        "packed": packed is False or (packed is True and type(bits) is int and bits <= 4),
    }
    if quantize_type == "log":
        step = meta["log_step"]
        valid["log_step"] = type(step) in (int, float) and 0 < step < math.inf
    if "scale_dtype" in meta:
        valid["scale_dtype"] = isinstance(meta["scale_dtype"], str) and meta["scale_dtype"] in SCALE_DTYPES
    for key, ok in valid.items():
        if not ok:
            raise DataError(f"{meta_file}: {key}={short_repr(meta[key])} is not valid (expected {_META_KEYS[key]}); "
                            f"{_RECREATE}")
    return meta


def _chunks(fin, dtype: np.dtype, rows: int, dim: int, chunk_rows: int):  # type: ignore[no-untyped-def]
    """Consecutive row chunks read into one reused buffer (fresh buffers would page-fault every time)."""
    buffer = np.empty((min(chunk_rows, rows), dim), dtype)
    for start in range(0, rows, chunk_rows):
        chunk = buffer[: min(chunk_rows, rows - start)]
        if fin.readinto(memoryview(chunk).cast("B")) != chunk.nbytes:
            raise DataError(f"{fin.name} ends before its {rows} rows; the file is truncated")
        yield chunk


def _npy_absmax(src: str | os.PathLike[str], shape: tuple[int, ...], dtype: np.dtype, offset: int,
                chunk_rows: int) -> float:
    top = 0.0
    with open(src, "rb") as fin:
        fin.seek(offset)
        for chunk in _chunks(fin, dtype, shape[0], shape[1], chunk_rows):
            top = max(top, _table_absmax(np.asarray(chunk, np.float32), f"{src}"))
    return top


def _start_writeback(f: BinaryIO) -> None:
    """Hand what ``f`` holds so far to the disk now (Linux), so the fsync at the end finds little left."""
    f.flush()
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # starts writeback, drops written pages


def _npy_rows(src: str | os.PathLike[str], ids: NDArray[np.intp], dtype: np.dtype, offset: int,
              dim: int) -> NDArray[np.float32]:
    """Rows ``ids`` of a ``.npy`` table, read one by one (a small sample of a table of any size)."""
    out = np.empty((len(ids), dim), np.float32)
    row_bytes = dim * dtype.itemsize
    with open(src, "rb") as f:
        for k, i in enumerate(ids):
            out[k] = np.frombuffer(os.pread(f.fileno(), row_bytes, offset + int(i) * row_bytes), dtype)
    return out


def _one_line(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _write_npy_header(f: BinaryIO, dtype: type[np.generic], shape: tuple[int, ...]) -> None:
    """Start a C-ordered ``.npy`` file; the caller appends the data."""
    descr = np.lib.format.dtype_to_descr(np.dtype(dtype))
    np.lib.format.write_array_header_1_0(f, {"descr": descr, "fortran_order": False, "shape": shape})


def _npy_layout(path: str | os.PathLike[str]) -> tuple[tuple[int, ...], np.dtype, int]:
    """Shape, dtype and data offset of a C-ordered numeric ``.npy`` file, checked against its size.

    Only the header is parsed, by numpy's bounded header reader: nothing is unpickled and no bytes
    are taken for pointers, so a crafted file gives DataError, never a crash.
    """
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            if version not in _HEADER_READERS:
                raise ValueError(f"format version {version[0]}.{version[1]} is not 1.0, 2.0 or 3.0")
            shape, fortran, dtype = _HEADER_READERS[version](f)
            offset, size = f.tell(), os.fstat(f.fileno()).st_size
    except OSError as exc:
        raise DataError(f"cannot read {path} ({_one_line(str(exc))}); give the path of a .npy table") from None
    except (ValueError, TypeError, SyntaxError, tokenize.TokenError) as exc:  # numpy re-tokenizes odd headers
        raise DataError(f"{path} is not a valid .npy file ({_one_line(str(exc))}); save the table with numpy.save"
                        ) from None
    if not (dtype.kind in "iu" or (dtype.kind == "f" and dtype.itemsize <= 8)):
        raise DataError(f"{path} holds {_one_line(str(dtype))} values; save the table as float32 "
                        "(float16/32/64 and integer dtypes also work)")
    if not all(type(n) is int and n >= 0 for n in shape):
        raise DataError(f"{path}: the header's shape {shape} is not valid; save the table with numpy.save")
    if fortran:
        raise DataError(f"{path}: Fortran-ordered tables are not supported; save it C-ordered "
                        "(numpy.ascontiguousarray)")
    expected = offset + math.prod(shape) * dtype.itemsize
    if size != expected:
        raise DataError(f"{path} is truncated or has trailing bytes: its header needs {expected} bytes, the file "
                        f"has {size}; save the table again with numpy.save")
    return shape, dtype, offset
