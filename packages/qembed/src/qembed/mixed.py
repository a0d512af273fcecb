"""Frequency-aware mixed precision: the rows read most often in calibration ids get more bits, under a bytes budget.

A :class:`MixedTable` is two row sets. The *cold* set covers every row at the low width (``mixed_bits[1]``, per-row
grids of :func:`qembed.table.choose_table_quantization`); the *hot* set holds the most-read rows again at the high
width, behind one zero row (position 0). A hot row's cold slot has scale 0 (and offset 0), so it reads as zeros,
and its first stored bytes hold its position in the hot set as signed base-256 digits (up to
:data:`POSITION_BYTES`). A lookup therefore needs no id remap of its own, only standard ops::

    cold   = cold rows of ids, dequantized              (hot rows: 0)
    digits = first stored bytes of those cold rows
    hot_at = (scale == 0) * sum(digits * 256**k)        (cold rows: 0, the zero row)
    rows   = cold + hot rows of hot_at, dequantized     (x + 0 is exact: bit-equal to either set's rows)

The hot set takes rows by descending ``reads * squared error of the cold row``: every hot row of a table costs the
same bytes, so this order takes the most off the squared error of the calibration reads (the expected error of a
lookup when calibration ids are a sample of traffic). Rows never read, exact rows and padding rows stay cold. It
takes as many as the budget allows after the cold set: the stored bytes are the two sets' codes, scales and
offsets. Tables quantized together (:func:`quantize_mixed_tables`, one ``quant_embedding`` call) pool what their
budgets leave after their cold sets and rank all their rows by that gain per byte, relative to each table's row
energy. The numpy rows (:meth:`MixedTable.rows`) do the same arithmetic as the program.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from qcore.config import short_repr
from qcore.errors import ConfigError, DataError
from qcore.packing import MAX_PACKED_BITS, codes_per_byte, packed_width, signed_fields, unpack_fields

from .table import QuantizedTable, TableChoice, choose_table_quantization, relative_error

#: ``mixed_bits``' default: hot rows int8, cold rows int4.
MIXED_BITS = (8, 4)
#: Stored bytes of a cold row that hold a hot row's position (signed digits; float32 sums them exactly).
POSITION_BYTES = 3


@dataclass
class MixedTable:
    """A table stored as cold rows (all of them, low width) and hot rows (position 1.. of ``hot``, high width)."""

    cold: QuantizedTable
    hot: QuantizedTable  # row 0: zeros (what a cold id reads from it)
    hot_ids: NDArray[np.int64]  # hot row k + 1 is table row hot_ids[k]
    position_bytes: int  # stored bytes of a cold row holding a hot row's position

    @property
    def dim(self) -> int:
        return int(self.cold.dim or 0)

    @property
    def bits(self) -> tuple[int, int]:
        """(hot, cold) code widths."""
        return self.hot.bits, self.cold.bits

    @property
    def stored_bytes(self) -> int:
        return self.cold.stored_bytes + self.hot.stored_bytes

    @property
    def scale_dtype(self) -> str:
        return self.cold.scale_dtype

    def positions(self, ids: ArrayLike) -> NDArray[np.int64]:
        """Each id's row in ``hot`` (0 for a cold id)."""
        where = np.zeros(len(self.cold.codes), np.int64)
        where[self.hot_ids] = np.arange(1, len(self.hot_ids) + 1)
        return where[np.asarray(ids, np.int64)]

    def rows(self, ids: ArrayLike) -> NDArray[np.float32]:
        """The looked-up rows, as the program computes them: cold rows plus hot rows (one of the two is zeros)."""
        return self.cold.rows(ids) + self.hot.rows(self.positions(ids))

    def dequantize(self) -> NDArray[np.float32]:
        return self.rows(np.arange(len(self.cold.codes)))


def row_counts(ids: ArrayLike, rows: int, name: str = "calibration ids") -> NDArray[np.int64]:
    """How often each of ``rows`` rows is read in ``ids`` (any shape); DataError for ids that are no row."""
    idx = np.asarray(ids)
    if idx.size == 0 or idx.dtype.kind not in "iu":
        raise DataError(f"{name} must be a non-empty integer array of row ids; got {idx.dtype} of shape {idx.shape}")
    flat = idx.reshape(-1).astype(np.int64)
    if flat.min() < 0 or flat.max() >= rows:
        raise DataError(f"{name} hold ids {flat.min()}..{flat.max()} but the table has rows 0..{rows - 1}; "
                        "pass the ids this table's lookup reads")
    return np.bincount(flat, minlength=rows)


def check_mixed_bits(value: object) -> tuple[int, int]:
    """``mixed_bits`` as (hot, cold): two ints, hot in 3..8, cold in 2..hot - 1."""
    if (isinstance(value, (tuple, list)) and len(value) == 2
            and all(isinstance(b, numbers.Integral) and not isinstance(b, bool) for b in value)
            and 2 <= value[1] < value[0] <= 8):
        return int(value[0]), int(value[1])
    raise ConfigError(f"mixed_bits={short_repr(value)} is not valid; valid choices: (hot bits, cold bits) with "
                      "2 <= cold < hot <= 8, e.g. (8, 4)")


def check_bytes_budget(value: object) -> float | None:
    """``bytes_budget``: None, or the stored table's bytes as a fraction of its float32 bytes, in (0, 1)."""
    if value is None or (isinstance(value, numbers.Real) and not isinstance(value, bool) and 0 < value < 1):
        return None if value is None else float(value)
    raise ConfigError(f"bytes_budget={short_repr(value)} is not valid; valid choices: None or a fraction of the "
                      "float32 table's bytes in (0, 1), e.g. 0.16")


def _position_bytes(dim: int, bits: int) -> int:
    """Whole stored bytes of a cold row available for a hot row's position."""
    return min(POSITION_BYTES, dim // codes_per_byte(bits) if bits <= MAX_PACKED_BITS else dim)


def _digits(positions: NDArray[np.int64], count: int) -> NDArray[np.int8]:
    """``positions`` as ``count`` signed base-256 digits each (least significant first): sum(d_k * 256**k)."""
    out = np.empty((len(positions), count), np.int8)
    rest = positions.astype(np.int64)
    for k in range(count):
        digit = (rest + 128) % 256 - 128
        out[:, k] = digit
        rest = (rest - digit) // 256
    return out


def _row_bytes(q: QuantizedTable) -> int:
    """Stored bytes per row of ``q``: codes, scale, offset."""
    return q.stored_bytes // len(q.codes)


@dataclass(frozen=True)
class MixedRequest:
    """One table for :func:`quantize_mixed_tables`: its values, its reads per row, and its own settings.

    ``counts``: reads per row in calibration ids (:func:`row_counts`); ``bytes_budget``: this table's share of the
    pooled bytes (a fraction of its float32 bytes); ``bits``: (hot, cold) widths; ``never_hot``: rows kept cold
    whatever their count (padding rows: their lookup reads zeros); ``name``: how error lines name the table.
    """

    table: ArrayLike
    counts: ArrayLike
    bytes_budget: float
    bits: tuple[int, int] = MIXED_BITS
    asymmetric: bool | str = "auto"
    scale_dtype: str = "float32"
    never_hot: ArrayLike = ()
    name: str = ""


@dataclass
class _Cold:
    """A request checked and its cold set made: what choosing its hot rows needs."""

    values: NDArray[np.float32]
    reads: NDArray[np.int64]
    cold: QuantizedTable
    per_hot: int  # stored bytes of one hot row
    position_bytes: int
    order: NDArray[np.int64]  # candidate hot rows, most gain first
    gain: NDArray[np.float64]  # their gain per stored byte, relative to the table's read-weighted row energy


def quantize_mixed(
    table: ArrayLike,
    counts: ArrayLike,
    bytes_budget: float,
    bits: tuple[int, int] = MIXED_BITS,
    asymmetric: bool | str = "auto",
    scale_dtype: str = "float32",
    never_hot: ArrayLike = (),
) -> TableChoice:
    """Quantize one ``table`` as a :class:`MixedTable` within ``bytes_budget`` (a fraction of its float32 bytes);
    the arguments are :class:`MixedRequest`'s, and the result :func:`quantize_mixed_tables`' for that one table."""
    return quantize_mixed_tables([MixedRequest(table, counts, bytes_budget, bits, asymmetric, scale_dtype,
                                               never_hot)])[0]


def quantize_mixed_tables(requests: Sequence[MixedRequest]) -> list[TableChoice]:
    """Quantize tables as :class:`MixedTable` s that together take at most the sum of their budgets' bytes.

    Every row of every table is stored cold first (per-row grids of
    :func:`~qembed.table.choose_table_quantization`; each table's cold set must fit its own budget). The bytes
    left over are pooled: hot rows go, across tables, to the rows with the largest ``reads * squared error of the
    cold row`` per stored byte of a hot row, the error taken relative to the table's read-weighted mean squared row
    norm (so a table counts by its relative error per lookup, whatever its values' scale). Narrow tables, whose
    hot rows cost few bytes, thus take more of them than a budget per table would give. The choice's errors are
    the relative RMS error of the whole table (``per_row_error``) and of the rows weighted by their counts
    (``whole_table_error`` holds the cold set's alone, for comparison). DataError when a table's cold rows alone
    exceed its budget.
    """
    if not requests:
        return []
    colds = [_cold_set(r) for r in requests]
    pool = sum(int(check_bytes_budget(r.bytes_budget) * c.values.nbytes) for r, c in zip(requests, colds))
    pool -= sum(c.cold.stored_bytes + c.per_hot for c in colds)  # + each table's zero hot row
    taken = _pooled_hot_rows(colds, max(pool, 0))
    choices = []
    for request, c, hot_ids in zip(requests, colds, taken):
        hot_bits, _ = check_mixed_bits(request.bits)
        allotted = (len(hot_ids) + 1) * c.per_hot
        hot = _hot_rows(c.values, hot_ids, hot_bits, request.asymmetric, request.scale_dtype)
        while len(hot_ids) and hot.stored_bytes > allotted:  # offsets the estimate did not count
            hot_ids = hot_ids[: len(hot_ids) - max(1, (hot.stored_bytes - allotted) // c.per_hot)]
            hot = _hot_rows(c.values, hot_ids, hot_bits, request.asymmetric, request.scale_dtype)
        mixed = MixedTable(_with_positions(c.cold, hot_ids, c.position_bytes), hot, hot_ids.astype(np.int64),
                           c.position_bytes)
        weights = c.reads.astype(np.float64)
        dequantized = mixed.dequantize()
        read_norm = float(np.sqrt((weights[:, None] * np.square(c.values)).sum()))
        read_err = float(np.sqrt((weights[:, None] * np.square(dequantized - c.values)).sum()))
        choices.append(TableChoice(mixed, True, relative_error(c.values, c.cold), relative_error(c.values, mixed),
                                   c.cold.offsets is not None,
                                   read_error=read_err / read_norm if read_norm else 0.0))
    return choices


def _cold_set(request: MixedRequest) -> _Cold:
    """Check ``request``, store all its rows cold and rank its candidate hot rows; DataError naming the table."""
    prefix = f"{request.name}: " if request.name else ""
    hot_bits, cold_bits = check_mixed_bits(request.bits)
    budget = check_bytes_budget(request.bytes_budget)
    assert budget is not None
    values = np.asarray(request.table, np.float32)
    if values.ndim != 2 or values.size == 0:
        raise DataError(f"{prefix}an embedding table must be a non-empty 2-D array (rows, dim); got shape "
                        f"{values.shape}")
    rows, dim = values.shape
    reads = np.asarray(request.counts, np.int64).reshape(-1)
    if reads.size != rows:
        raise DataError(f"{prefix}counts has {reads.size} entries for a table of {rows} rows; count the reads of "
                        "every row")
    position_bytes = _position_bytes(dim, cold_bits)
    if position_bytes == 0:
        raise DataError(f"{prefix}rows of {dim} values at {cold_bits} bits take less than a byte, too little for a "
                        "hot row's position; use more cold bits or no bytes_budget for this table")
    asymmetric, scale_dtype = request.asymmetric, request.scale_dtype
    cold = choose_table_quantization(values, "abs_max", cold_bits, True, None, asymmetric,
                                     scale_dtype=scale_dtype).table  # "auto" offsets: only where they fit the budget
    if asymmetric == "auto" and cold.offsets is not None and cold.stored_bytes > budget * values.nbytes:
        cold = choose_table_quantization(values, "abs_max", cold_bits, True, None, False, scale_dtype=scale_dtype).table
    if cold.stored_bytes > int(budget * values.nbytes):
        raise DataError(f"{prefix}bytes_budget={budget:g} is below what the {cold_bits}-bit rows alone take "
                        f"({cold.stored_bytes / values.nbytes:.3f} of float32); raise it or lower the cold bits")
    per_hot = packed_width(dim, hot_bits) if hot_bits <= MAX_PACKED_BITS else dim
    per_hot += np.dtype(scale_dtype).itemsize * (2 if asymmetric is True else 1)
    gain = reads * _row_errors(values, cold)  # what a hot row takes off the squared error of the calibration reads
    gain[np.asarray(request.never_hot, np.int64)] = 0
    order = np.argsort(-gain, kind="stable")
    order = order[gain[order] > 0][: 127 * (256**position_bytes - 1) // 255]  # the largest position digits hold
    energy = float(np.dot(reads.astype(np.float64), np.square(values).sum(axis=1, dtype=np.float64)))
    per_byte = gain[order] * (reads.sum() / energy / per_hot) if energy else np.zeros(len(order))
    return _Cold(values, reads, cold, per_hot, position_bytes, order.astype(np.int64), per_byte)


def _pooled_hot_rows(colds: Sequence[_Cold], pool: int) -> list[NDArray[np.int64]]:
    """Each table's hot rows (most gain first): the candidates of all tables by descending gain per byte, taken
    while their bytes fit ``pool`` (ties: the earlier table, then its order)."""
    table_of = np.concatenate([np.full(len(c.order), t, np.int64) for t, c in enumerate(colds)])
    gains = np.concatenate([c.gain for c in colds])
    sizes = np.array([c.per_hot for c in colds], np.int64)[table_of]
    rank = np.argsort(-gains, kind="stable")
    fits = np.cumsum(sizes[rank]) <= pool
    fits = rank[: int(np.argmin(fits)) if not fits.all() else len(rank)]
    chosen = np.zeros(len(gains), bool)
    chosen[fits] = True
    starts = np.cumsum([0] + [len(c.order) for c in colds])
    return [c.order[chosen[starts[t] : starts[t + 1]]] for t, c in enumerate(colds)]


def _row_errors(values: NDArray[np.float32], q: QuantizedTable, block: int = 1 << 16) -> NDArray[np.float64]:
    """Squared error of each row of ``q`` (block by block: no second copy of a large table)."""
    out = np.empty(len(values), np.float64)
    for start in range(0, len(values), block):
        ids = np.arange(start, min(start + block, len(values)))
        out[ids] = np.square(q.rows(ids) - values[ids]).sum(axis=1, dtype=np.float64)
    return out


def _hot_rows(values: NDArray[np.float32], hot_ids: NDArray[np.intp], bits: int, asymmetric: bool | str,
              scale_dtype: str) -> QuantizedTable:
    """The hot set: a zero row, then ``values[hot_ids]`` on per-row grids of ``bits`` bits."""
    dim = values.shape[1]
    if len(hot_ids) == 0:
        return QuantizedTable(np.zeros((1, dim), np.int8), np.zeros(1, np.float32), "abs_max", bits)
    q = choose_table_quantization(values[hot_ids], "abs_max", bits, True, None,
                                  asymmetric if bits <= MAX_PACKED_BITS else False, scale_dtype=scale_dtype).table
    offsets = None if q.offsets is None else np.concatenate([np.zeros(1, q.offsets.dtype), q.offsets])
    return QuantizedTable(np.concatenate([np.zeros((1, dim), np.int8), q.codes]),
                          np.concatenate([np.zeros(1, q.scales.dtype), q.scales]), "abs_max", bits, offsets=offsets)


def _with_positions(cold: QuantizedTable, hot_ids: NDArray[np.intp], position_bytes: int) -> QuantizedTable:
    """``cold`` with each hot row's slot holding scale 0, offset 0 and its position in its first stored bytes."""
    codes, scales = cold.codes.copy(), cold.scales.copy()
    offsets = None if cold.offsets is None else cold.offsets.copy()
    if len(hot_ids):
        stored = np.zeros((len(hot_ids), packed_width(cold.dim or 0, cold.bits) if cold.bits <= MAX_PACKED_BITS
                           else cold.dim or 0), np.int8)
        stored[:, :position_bytes] = _digits(np.arange(1, len(hot_ids) + 1), position_bytes)
        if cold.bits <= MAX_PACKED_BITS:
            fields = unpack_fields(stored, cold.bits, cold.dim or 0)
            stored = (fields if offsets is not None else signed_fields(fields, cold.bits)).astype(np.int8)
        codes[hot_ids] = stored
        scales[hot_ids] = 0
        if offsets is not None:
            offsets[hot_ids] = 0
    return QuantizedTable(codes, scales, "abs_max", cold.bits, offsets=offsets)
