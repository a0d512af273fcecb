"""Clip search (PaddleSlim's ``AutoClip``, NNCF's scale estimation in spirit): per group of input channels and
per output, the ratio by which the group's range is shrunk before its step is taken, chosen from
:data:`RATIOS` by the layer output error it causes on the calibration inputs.

A group's share of the output error separates: with ``D = W - Q`` restricted to group ``g`` and output ``n``,
its error is ``d^T H_gg d``, ``H_gg`` the group's diagonal block of the input Hessian
(:class:`~qptq.weight_only.hessian.HessianAccumulator`). Every candidate is scored for every group and output at
once; ratio 1 (no clip, round to nearest) is among them, so the search never does worse than it on these
inputs. The cross-group terms of the Hessian are left out, as the methods this follows do.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from qcore.groupwise import Grid, decode, encode, grid_of, group_grid, step_group

#: Candidate ratios of the group's range, 1.0 (no clip) included.
RATIOS = tuple(np.round(np.linspace(0.5, 1.0, 11), 2))


def group_errors(weight: NDArray[np.float64], hessian: NDArray[np.float64], grid: Grid, group_size: int,
                 ratio: float) -> NDArray[np.float64]:
    """``[groups, N]``: each group's output error ``d^T H_gg d`` when quantized with its range times ``ratio`` (the
    groups: ``grid``'s steps; a K-quant's sub-blocks, all at ``ratio``, share their block's float16 step)."""
    k, n = weight.shape
    size = step_group(k, grid, group_size)
    groups = k // size
    g = weight.reshape(groups, size, n)
    step, zero = group_grid(g, grid, ratio)
    zero3 = None if zero is None else zero[:, None, :]
    codes = encode(g, step[:, None, :], zero3, grid)
    d = np.subtract(g, decode(codes, step[:, None, :], zero3, grid, out=codes), out=codes)
    blocks = np.stack([hessian[i * size:(i + 1) * size, i * size:(i + 1) * size] for i in range(groups)])
    return np.sum(d * np.matmul(blocks, d), axis=1)


def search_clip(weight: ArrayLike, hessian: ArrayLike, bits: int = 4, group_size: int = 128,
                symmetric: bool = False, ratios: tuple[float, ...] = RATIOS, family: str = "int"
                ) -> NDArray[np.float64]:
    """The ratio of :data:`RATIOS` with the least output error, per group and output (``[groups, N]``), for
    :func:`qcore.groupwise.quantize_groups`' ``clip`` on the grid of ``family``."""
    grid = grid_of(bits, symmetric, family, group_size)
    w, h = np.asarray(weight, np.float64), np.asarray(hessian, np.float64)
    errors = np.stack([group_errors(w, h, grid, group_size, r) for r in ratios])
    return np.asarray(ratios)[np.argmin(errors, axis=0)]
