"""Activation-aware weight scaling (AWQ, Lin et al., 2023), searched by layer output error.

Input channels that carry large activations matter most to the output; multiplying their weight rows by
``s > 1`` before rounding gives them relatively finer steps, and dividing the input by ``s`` (folded into the
op that writes it: a norm's weight, a previous matmul's columns) leaves the float function unchanged:
``(x / s) @ (diag(s) W) = x @ W``. The scales are ``s = a ** alpha``, ``a`` each input channel's RMS
(``sqrt(diag(H) / 2)`` of the input Hessian, where AWQ takes the mean absolute value), normalised so that
``max(s) * min(s) = 1``; ``alpha`` is searched over :data:`ALPHAS` by the output error of every matmul that
reads the input (q, k and v share one), ``tr(D^T H D)`` with ``D = diag(1 / s) Q(diag(s) W) - W``. ``alpha =
0`` (no scaling) is a candidate, so the search never does worse than round to nearest on these inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from qcore.groupwise import quantize_groups

from .hessian import output_error as hessian_error

#: Candidate strengths, 0 (no scaling) included.
ALPHAS = tuple(np.round(np.linspace(0.0, 1.0, 21), 2))


@dataclass(frozen=True)
class AwqScales:
    scales: NDArray[np.float64]  # [K]: multiply the weight rows, divide the input
    alpha: float
    errors: dict[float, float]  # alpha -> summed output error of the readers


def output_error(weight: NDArray[np.float64], hessian: NDArray[np.float64], scales: NDArray[np.float64], bits: int,
                 group_size: int, symmetric: bool) -> float:
    """``tr(D^T H D)`` for ``D = diag(1 / s) Q(diag(s) W) - W``: the output error after scaling and rounding."""
    scaled = quantize_groups(weight * scales[:, None], bits, group_size, symmetric).dequantize()
    d = scaled / scales[:, None] - weight
    return hessian_error(d, hessian)


def search_scales(weights: Sequence[ArrayLike], hessian: ArrayLike, bits: int = 4, group_size: int = 128,
                  symmetric: bool = False, alphas: tuple[float, ...] = ALPHAS) -> AwqScales:
    """The scales (one per input channel) shared by ``weights`` (each ``[K, N_i]``, all reading the input of
    Hessian ``hessian``) with the least summed output error."""
    h = np.asarray(hessian)  # as given (float32 from HessianAccumulator): only read by the errors' products
    ws = [np.asarray(w, np.float64) for w in weights]
    rms = np.sqrt(np.maximum(np.diag(h).astype(np.float64), 0.0) / 2)
    rms = np.where(rms > 0, rms, rms[rms > 0].min() if (rms > 0).any() else 1.0)
    errors: dict[float, float] = {}
    best: tuple[float, float, NDArray[np.float64]] | None = None
    for alpha in alphas:
        s = rms ** alpha
        s = s / np.sqrt(s.max() * s.min())
        error = sum(output_error(w, h, s, bits, group_size, symmetric) for w in ws)
        errors[float(alpha)] = error
        if best is None or error < best[0]:
            best = (error, float(alpha), s)
    assert best is not None
    return AwqScales(best[2], best[1], errors)
