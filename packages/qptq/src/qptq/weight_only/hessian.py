"""The input Hessian of a matmul, ``H = 2 X^T X / rows`` over the calibration inputs ``X``, and the layer output
error a weight change ``D`` causes through it, ``tr(D^T H D) = ||X D||^2 * 2 / rows``: what every weight-only
algorithm scores its candidates by."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from qcore.errors import DataError


class HessianAccumulator:
    """``2 X^T X / rows`` over every calibration batch of a matmul's input (``[..., K]``), in float64."""

    def __init__(self, k: int) -> None:
        self.sum = np.zeros((k, k), np.float64)
        self.rows = 0

    def update(self, x: ArrayLike) -> None:
        a = np.asarray(x, np.float64)
        a = a.reshape(-1, a.shape[-1])
        if a.shape[1] != self.sum.shape[0]:
            raise DataError(f"input has {a.shape[1]} channels; this matmul reads {self.sum.shape[0]}")
        self.sum += a.T @ a
        self.rows += a.shape[0]

    def hessian(self) -> NDArray[np.float64]:
        if not self.rows:
            raise DataError("no calibration rows reached this matmul; give GPTQ at least one batch")
        return 2.0 * self.sum / self.rows


def output_error(d: NDArray[np.float64], hessian: NDArray[np.float64]) -> float:
    """``tr(D^T H D)`` for a ``[K, N]`` weight change ``d`` (one matrix product: BLAS, not a triple loop)."""
    return float(np.sum(d * (hessian @ d)))
