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

from .columns import column_chunks

#: Candidate ratios of the group's range, 1.0 (no clip) included.
RATIOS = tuple(np.round(np.linspace(0.5, 1.0, 11), 2))


def diagonal_blocks(hessian: ArrayLike, size: int) -> NDArray[np.float32]:
    """``[groups, size, size]``: the diagonal blocks of ``hessian`` that a group's output error reads, in float32."""
    h = np.asarray(hessian)
    return np.stack([h[lo:lo + size, lo:lo + size] for lo in range(0, len(h), size)]).astype(np.float32)


def group_errors(weight: NDArray[np.float32], blocks: NDArray[np.float32], grid: Grid, ratio: float
                 ) -> NDArray[np.float32]:
    """``[groups, N]``: each group's output error ``d^T H_gg d`` when quantized with its range times ``ratio`` (the
    groups: the ``blocks`` of :func:`diagonal_blocks` at ``grid``'s step groups; a K-quant's sub-blocks, all at
    ``ratio``, share their block's float16 step)."""
    groups, size, _ = blocks.shape
    g = weight.reshape(groups, size, -1)
    step, zero = group_grid(g, grid, ratio)
    step3 = step[:, None, :].astype(g.dtype)
    zero3 = None if zero is None else zero[:, None, :].astype(g.dtype)
    codes = encode(g, step3, zero3, grid)
    d = np.subtract(g, decode(codes, step3, zero3, grid, out=codes), out=codes)
    return np.sum(d * np.matmul(blocks, d), axis=1)


def search_clip(weight: ArrayLike, hessian: ArrayLike, bits: int = 4, group_size: int = 128,
                symmetric: bool = False, ratios: tuple[float, ...] = RATIOS, family: str = "int"
                ) -> NDArray[np.float64]:
    """The ratio of :data:`RATIOS` with the least output error, per group and output (``[groups, N]``), for
    :func:`qcore.groupwise.quantize_groups`' ``clip`` on the grid of ``family``. Scored in float32: the errors only
    rank the ratios, and float64 took twice the time."""
    grid = grid_of(bits, symmetric, family, group_size)
    w = np.asarray(weight, np.float32)
    blocks = diagonal_blocks(hessian, step_group(w.shape[0], grid, group_size))
    best = []
    for part in column_chunks(w.shape[1]):  # a column's scores from the same products wherever it is
        chunk = np.ascontiguousarray(w[:, part])
        best.append(np.argmin(np.stack([group_errors(chunk, blocks, grid, r) for r in ratios]), axis=0))
    return np.asarray(ratios)[np.concatenate(best, axis=1)]
