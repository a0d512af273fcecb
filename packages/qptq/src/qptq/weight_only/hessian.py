"""The input Hessian of a matmul, ``H = 2 X^T X / rows`` over the calibration inputs ``X``, and the layer output
error a weight change ``D`` causes through it, ``tr(D^T H D) = ||X D||^2 * 2 / rows``: what every weight-only
algorithm scores its candidates by.

Two ways to sum it (:class:`HessianAccumulator`): in float64 as the batches come (one pass), or **exactly**, when
the largest magnitude of every input channel over all the calibration rows is known first (:class:`InputRange`, a
first pass): each input is then a fixed-point integer of ``bits`` bits per channel (:func:`fixed_point_bits`),
and every product and partial sum is an integer below ``2**53``, which float64 holds exactly. The exact sum is
the same whatever the order of the rows, the BLAS threads or the split of the batches over the ranks of
``paddle.distributed`` (whose sums of the parts are exact too): the codes chosen from it are the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from qcore.errors import DataError

from .columns import column_chunks

#: Bits of float64's significand: integers up to ``2**53`` are exact.
EXACT_BITS = 53
#: A float32 input has 24 significant bits: finer fixed points add nothing.
MAX_FIXED_BITS = 24


def _rows(x: ArrayLike, k: int) -> NDArray[np.float64]:
    a = np.asarray(x, np.float64)
    a = a.reshape(-1, a.shape[-1])
    if a.shape[1] != k:
        raise DataError(f"input has {a.shape[1]} channels; this matmul reads {k}")
    return a


def _add_gram(total: NDArray[np.float64], a: NDArray[np.float64]) -> NDArray[np.float64]:
    """``total + a^T a`` into ``total`` (symmetric ``[K, K]``) by one BLAS ``gemm`` with ``beta = 1``: no
    ``[K, K]`` temporary (640 MB for K = 8960)."""
    from scipy.linalg.blas import get_blas_funcs

    gemm = get_blas_funcs("gemm", (a,))
    rows = a.T  # Fortran order: a [K, rows] matrix M, and M M^T = a^T a; total.T is total (symmetric)
    return gemm(1.0, rows, rows, beta=1.0, c=total.T, trans_b=1, overwrite_c=1).T


class InputRange:
    """The largest magnitude of each of a matmul's ``k`` input channels, and the rows seen (the first pass of an
    exact Hessian); ranks combine theirs by an element-wise max and a sum."""

    def __init__(self, k: int) -> None:
        self.absmax = np.zeros(k, np.float64)
        self.rows = 0

    def update(self, x: ArrayLike) -> None:
        a = _rows(x, self.absmax.shape[0])
        np.maximum(self.absmax, np.abs(a).max(axis=0, initial=0.0), out=self.absmax)
        self.rows += a.shape[0]


def fixed_point_bits(rows: int) -> int:
    """Bits per channel that keep ``rows`` products of two such integers summed below ``2**53``."""
    if rows < 1:
        raise DataError("no calibration rows reached this matmul; give at least one batch")
    return min(MAX_FIXED_BITS, (EXACT_BITS - math.ceil(math.log2(rows))) // 2)


class HessianAccumulator:
    """``2 X^T X / rows`` over every calibration batch of a matmul's input (``[..., K]``), summed in float64 and
    handed out in float32, what GPTQ, clip search and the reports compute in (half the memory of a ``[K, K]``).

    With ``span`` (an :class:`InputRange` over all the rows to come, every rank's), the sum is exact
    (module docstring); ``update`` then refuses more rows than the range counted, and :meth:`hessian` scales the
    sum in place and releases it (the accumulator is spent).
    """

    def __init__(self, k: int, span: InputRange | None = None) -> None:
        self.sum = np.zeros((k, k), np.float64)
        self.rows = 0
        self.step: NDArray[np.float64] | None = None
        self.limit = 0
        self.taken: NDArray[np.float32] | None = None  # the exact sum's Hessian, once hessian() took it
        if span is not None:
            self.limit = span.rows
            self.step = np.where(span.absmax > 0, span.absmax, 1.0) / 2.0 ** fixed_point_bits(span.rows)

    def update(self, x: ArrayLike) -> None:
        if self.taken is not None:
            raise DataError("this Hessian was already taken; sum the rows before calling hessian()")
        a = _rows(x, self.sum.shape[0])
        if self.step is not None:
            if self.rows + a.shape[0] > self.limit:
                raise DataError(f"more calibration rows ({self.rows + a.shape[0]}) than the first pass counted "
                                f"({self.limit}); pass the same batches to both passes")
            a = np.divide(a, self.step)  # a new array (the input may be the caller's), rounded in place
            np.rint(a, out=a)
        self.sum = _add_gram(self.sum, a)
        self.rows += a.shape[0]

    def hessian(self) -> NDArray[np.float32]:
        if self.taken is not None:
            return self.taken
        if not self.rows:
            raise DataError("no calibration rows reached this matmul; give GPTQ at least one batch")
        if self.step is None:
            return (2.0 * self.sum / self.rows).astype(np.float32)
        self.sum *= 2.0 / self.rows
        self.sum *= self.step[:, None]
        self.sum *= self.step[None, :]
        self.taken = self.sum.astype(np.float32)
        self.sum = np.zeros((0, 0))  # released: only the float32 Hessian stays
        return self.taken


def column_errors(changes: Sequence[NDArray[np.floating]], hessian: NDArray[np.floating]) -> list[NDArray[np.float64]]:
    """Per output column, ``d_n^T H d_n`` for each ``[K, N_i]`` weight change ``D`` of ``changes``: float32 matrix
    products (BLAS, not a triple loop; a report's four digits need no float64, which took twice the time) over
    :data:`.columns.COLUMN_CHUNK` columns at a time, each column summed on its own. A column's value thus depends
    on that column alone, so the columns of a weight split over ranks give what one process gets."""
    h = np.asarray(hessian, np.float32)
    out = []
    for d in changes:
        d = np.asarray(d, np.float32)
        sums = np.empty(d.shape[1], np.float64)
        for part in column_chunks(d.shape[1]):
            block = np.ascontiguousarray(d[:, part])
            sums[part] = np.sum(block * (h @ block), axis=0, dtype=np.float64)
        out.append(sums)
    return out


def output_errors(changes: Sequence[NDArray[np.floating]], hessian: NDArray[np.floating]) -> list[float]:
    """``tr(D^T H D)`` for each ``[K, N_i]`` weight change ``D`` of ``changes``: the sum of :func:`column_errors`."""
    return [float(np.sum(c)) for c in column_errors(changes, hessian)]


def output_error(d: NDArray[np.floating], hessian: NDArray[np.floating]) -> float:
    """``tr(D^T H D)`` for a ``[K, N]`` weight change ``d`` (:func:`output_errors`)."""
    return output_errors([d], hessian)[0]
