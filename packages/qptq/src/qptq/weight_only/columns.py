"""Output columns in fixed chunks. The weight-only math takes every matrix product over a weight's output columns
:data:`COLUMN_CHUNK` columns at a time (GPTQ's lazy updates, clip search's scores, the output errors), so each
column's result comes from the same BLAS calls whichever columns it is computed with: OpenBLAS's AVX2 kernels
round a product's elements differently with the matrix's width (its AVX-512 ones did not, measured). Ranks that
share out a weight's columns (:func:`.plan.column_bounds`) cut them at multiples of it."""

from __future__ import annotations

#: Output columns per matrix product.
COLUMN_CHUNK = 256


def column_chunks(columns: int) -> list[slice]:
    """``0 .. columns`` in :data:`COLUMN_CHUNK`-wide slices (the last one narrower)."""
    return [slice(lo, min(lo + COLUMN_CHUNK, columns)) for lo in range(0, columns, COLUMN_CHUNK)]
