"""Quantizing embedding tables as plain arrays, for teams that keep tables outside Paddle.

A table is a 2-D float array (rows = ids). ``abs_max`` stores int codes with one scale for the
whole table or one per row; ``log`` stores sign + power-of-two exponent codes. Tables given as
``.npy`` files are processed in chunks of rows through memory maps, so a table larger than
memory is quantized with bounded resident memory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike, NDArray

from qcore.config import validate_bits, validate_choice
from qcore.constants import EMBEDDING_QUANTIZE_TYPES
from qcore.errors import DataError
from qcore.quant import (
    abs_max,
    as_finite,
    dequantize,
    log_dequantize,
    log_quantize,
    quantize,
    scale_from_threshold,
)


@dataclass
class QuantizedTable:
    """Integer codes of a table plus what is needed to dequantize any subset of rows."""

    codes: NDArray[np.integer]
    scales: NDArray[np.float32]  # one per row, or a single value
    quantize_type: str
    bits: int

    def rows(self, ids: ArrayLike) -> NDArray[np.float32]:
        """Dequantize only the looked-up rows (what a quantized lookup does)."""
        idx = np.asarray(ids, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self.codes)):
            raise DataError(f"ids must be in [0, {len(self.codes)}); got {idx.min()}..{idx.max()}")
        codes = self.codes[idx].reshape(-1, self.codes.shape[1])
        per_row = self.scales.size > 1
        scales = self.scales[idx.reshape(-1)] if per_row else self.scales[0]
        if self.quantize_type == "log":
            meta = {"scheme": "log2", "absmax": scales, "axis": 0 if per_row else None}
            rows = log_dequantize(codes, meta)
        else:
            rows = dequantize(codes, scales, 0 if per_row else None)
        return rows.reshape(*idx.shape, self.codes.shape[1])


def quantize_table(
    table: ArrayLike,
    quantize_type: str = "abs_max",
    bits: int = 8,
    per_row: bool = False,
    threshold: float | None = None,
) -> QuantizedTable:
    """Quantize a whole table in memory; ``threshold`` clips values first (the seeds' option)."""
    validate_choice("quantize_type", quantize_type, EMBEDDING_QUANTIZE_TYPES)
    validate_bits("quantize_bits", bits, 2, 8 if quantize_type == "log" else 16)
    values = as_finite(table, "embedding table")
    if values.ndim != 2:
        raise DataError(f"an embedding table must be 2-D (rows, dim); got shape {values.shape}")
    if threshold is not None:
        if not threshold > 0:
            raise DataError(f"threshold must be > 0, got {threshold}")
        values = np.clip(values, -threshold, threshold)
    axis = 0 if per_row else None
    if quantize_type == "log":
        codes, meta = log_quantize(values, bits, axis=axis)
        return QuantizedTable(codes, np.asarray(meta["absmax"], np.float32).reshape(-1), "log", bits)
    scales = np.atleast_1d(np.asarray(scale_from_threshold(abs_max(values, axis), bits), np.float64))
    codes = quantize(values, scales if per_row else scales[0], bits, axis)
    scales = scales.astype(np.float32)
    return QuantizedTable(codes, scales, "abs_max", bits)


@dataclass(frozen=True)
class TableChoice:
    """A quantized table and the measured error of both scale granularities.

    Errors are relative RMS errors ``||dequantized - table|| / ||table||`` over the whole table,
    measured against the unclipped table (so clipping by ``threshold`` counts as error).
    """

    table: QuantizedTable
    per_row: bool
    whole_table_error: float
    per_row_error: float


# per_row="auto" takes per-row scales when they cut the error by at least this factor;
# they cost 4 bytes per row (6% of an int8 table of dim 64).
AUTO_PER_ROW_GAIN = 0.8


def relative_error(table: ArrayLike, quantized: QuantizedTable) -> float:
    """``||dequantized - table|| / ||table||`` (0 for an all-zero table)."""
    values = np.asarray(table, np.float32)
    norm = float(np.linalg.norm(values))
    back = quantized.rows(np.arange(len(values)))
    return float(np.linalg.norm(back - values)) / norm if norm else 0.0


def choose_table_quantization(
    table: ArrayLike,
    quantize_type: str = "abs_max",
    bits: int = 8,
    per_row: bool | str = "auto",
    threshold: float | None = None,
) -> TableChoice:
    """Quantize ``table`` with one scale and with per-row scales, measure both, keep one.

    ``per_row`` True or False forces the granularity; ``"auto"`` picks per-row scales when
    their error is at most ``AUTO_PER_ROW_GAIN`` times the whole-table error.
    """
    whole = quantize_table(table, quantize_type, bits, False, threshold)
    rows = quantize_table(table, quantize_type, bits, True, threshold)
    whole_err, row_err = relative_error(table, whole), relative_error(table, rows)
    if per_row == "auto":
        per_row = row_err <= AUTO_PER_ROW_GAIN * whole_err
    return TableChoice(rows if per_row else whole, bool(per_row), whole_err, row_err)


def quantize_npy(
    src: str | os.PathLike[str],
    dst: str | os.PathLike[str],
    bits: int = 8,
    chunk_rows: int = 65536,
) -> NDArray[np.float32]:
    """Per-row abs_max quantization of a ``.npy`` table into ``dst`` (int codes ``.npy``), in chunks.

    Returns the per-row scales (also saved next to ``dst`` as ``<stem>.scales.npy``). Only
    ``chunk_rows`` rows are resident at a time, so the table may be larger than memory.
    """
    shape, source_dtype, source_offset = _npy_layout(src)
    if len(shape) != 2:
        raise DataError(f"{src}: an embedding table must be 2-D (rows, dim); got shape {shape}")
    rows, dim = shape
    dtype = np.dtype(np.int8 if bits <= 8 else np.int16)
    np.lib.format.open_memmap(dst, mode="w+", dtype=dtype, shape=shape).flush()
    _, _, target_offset = _npy_layout(dst)
    scales = np.empty(rows, np.float32)
    # plain reads and writes, not memory maps: mapped pages would count against RSS
    with open(src, "rb") as fin, open(dst, "r+b") as fout:
        fin.seek(source_offset)
        fout.seek(target_offset)
        for start in range(0, rows, chunk_rows):
            n = min(chunk_rows, rows - start)
            chunk = np.fromfile(fin, dtype=source_dtype, count=n * dim).reshape(n, dim)
            quantized = quantize_table(chunk, "abs_max", bits, per_row=True)
            fout.write(quantized.codes.astype(dtype, copy=False).tobytes())
            scales[start : start + n] = quantized.scales
    np.save(Path(dst).with_suffix("").as_posix() + ".scales.npy", scales)
    return scales


def _npy_layout(path: str | os.PathLike[str]) -> tuple[tuple[int, ...], np.dtype, int]:
    """Shape, dtype and data offset of a C-ordered ``.npy`` file."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(f)
        if fortran:
            raise DataError(f"{path}: Fortran-ordered tables are not supported; save it C-ordered")
        return shape, dtype, f.tell()
