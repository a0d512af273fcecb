"""GPTQ (Frantar et al., 2022): quantize a matmul weight one input channel at a time, each channel's rounding
error spread over the channels not yet quantized so that the layer's output on the calibration inputs moves
least.

For a ``[K, N]`` weight read by inputs ``X`` (``[rows, K]``) the objective is ``||X W - X Q||^2``, whose
Hessian in ``W`` is ``H = 2 X^T X`` (:class:`~.hessian.HessianAccumulator` sums it over calibration batches in memory
flat in their number). Quantizing input channel ``i`` to ``q_i`` is followed by the optimal update of the
channels after it, ``W[j] -= (w_i - q_i) / U[i, i] * U[i, j]``, with ``U`` the upper Cholesky factor of
``H^-1``. The updates are applied lazily: in full inside a block of ``block_size`` channels, then once
to the rest of the weight per block (one matrix product instead of ``K`` rank-1 updates).

Options: ``damp`` adds ``damp * mean(diag(H))`` to the diagonal (a Hessian from few rows is singular);
``act_order`` quantizes the channels of largest ``diag(H)`` (largest inputs) first, with the group grids
fixed beforehand from the float weight so that groups stay contiguous input channels (what
``MatMulNBits`` and ``DequantizeLinear`` blocks store); without it each group's grid is taken from
the updated weight when its first channel is reached (a whole K-quant block's, whose sub-block steps share one
float16 step, when its first channel is). Inputs that are always zero get a zero weight.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from qcore.errors import ConfigError, DataError
from qcore.groupwise import GroupCodes, decode, encode, grid_of, group_grid, pack_group_codes, step_group

from .columns import column_chunks

#: Channels updated in full before the rest of the weight receives the block's errors.
BLOCK_SIZE = 128
#: Fraction of the mean Hessian diagonal added to it.
DAMP = 0.01


#: Channels of the diagonal blocks :func:`inverse_cholesky` factors with LAPACK on one thread; the rest is gemm.
FACTOR_BLOCK = 256


def inverse_cholesky(h: np.ndarray, dtype: type[np.floating] = np.float64) -> np.ndarray:
    """The upper triangular ``U`` with ``U^T U = H^-1``: the inverse of the lower Cholesky factor of ``H`` with its
    channel order reversed, reversed back (:func:`invert_cholesky_in_place`), in ``dtype``."""
    return invert_cholesky_in_place(np.array(h[::-1, ::-1], dtype))[::-1, ::-1]


def invert_cholesky_in_place(a: np.ndarray) -> np.ndarray:
    """``a`` (symmetric positive definite, C-contiguous float32 or float64) overwritten by ``L^-1``, ``L`` its lower
    Cholesky factor (two triangular factorisations, a third of an explicit inverse's work, no second ``[K, K]``
    array). :func:`gptq` factors in float32: half float64's time, and its codes' output error within 0.02 %.

    Blocked: :data:`FACTOR_BLOCK`-wide diagonal blocks are factored and inverted by LAPACK on one thread, and
    everything else is matrix products. LAPACK's own blocked factorisations round differently with other thread
    counts (measured), BLAS's products do not: the codes do not depend on how many threads or ranks a machine
    gives, and the products still use every thread."""
    from scipy.linalg import lapack
    from threadpoolctl import threadpool_limits

    potrf, trtri = lapack.get_lapack_funcs(("potrf", "trtri"), (a,))
    k = a.shape[0]
    starts = list(range(0, k, FACTOR_BLOCK))
    inverses = []  # of each diagonal block of L
    for lo in starts:  # left-looking: block column j of L from the columns before it
        hi = min(lo + FACTOR_BLOCK, k)
        left = a[lo:hi, :lo]
        with threadpool_limits(1, user_api="blas"):
            block, info = potrf(a[lo:hi, lo:hi] - left @ left.T, lower=1, clean=1)
            if info == 0:
                inverse, info = trtri(block, lower=1)
        if info != 0:
            raise DataError("the calibration Hessian is not positive definite even after dampening; "
                            "give more calibration rows or raise damp")
        if hi < k:
            a[hi:, lo:hi] = (a[hi:, lo:hi] - a[hi:, :lo] @ left.T) @ inverse.T
        a[lo:hi, lo:hi] = block
        a[lo:hi, hi:] = 0.0
        inverses.append(inverse)
    for j in reversed(range(len(starts))):  # X = L^-1 right to left: X_[>j, j] = -(X_[>j, >j] L_[>j, j]) X_jj
        lo, hi = starts[j], min(starts[j] + FACTOR_BLOCK, k)
        if hi < k:
            a[hi:, lo:hi] = -(a[hi:, hi:] @ a[hi:, lo:hi]) @ inverses[j]
        a[lo:hi, lo:hi] = inverses[j]
    return a


@dataclass(frozen=True)
class Factor:
    """A Hessian prepared for GPTQ's channel loop (:func:`factor_hessian`); every output column uses the same one, so
    ranks that quantize different columns of a weight share it (:mod:`.plan`)."""

    order: np.ndarray  # the input channels in quantization order
    upper: np.ndarray  # [K, K] float32: U with U^T U = H^-1 (dampened), rows and columns in that order
    dead: np.ndarray  # input channels that are always zero (their weight rows become zero)


def channel_order(hessian: ArrayLike, act_order: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The quantization order of the input channels (largest ``diag(H)`` first with ``act_order``) and the dead ones
    (zero diagonal)."""
    diagonal = np.diag(np.asarray(hessian))
    dead = diagonal == 0
    order = np.argsort(-np.where(dead, 1.0, diagonal.astype(np.float64)), kind="stable") if act_order else \
        np.arange(len(diagonal))
    return order, dead


def factor_hessian(hessian: ArrayLike, damp: float = DAMP, act_order: bool = True) -> Factor:
    """The inverse Cholesky factor of ``hessian`` plus ``damp`` times its mean diagonal (dead inputs' diagonal set
    to 1), in the quantization order of :func:`channel_order`; one ``[K, K]`` float32 copy, factored in place."""
    hessian = np.asarray(hessian)
    if hessian.ndim != 2 or hessian.shape[0] != hessian.shape[1]:
        raise ConfigError(f"the Hessian has shape {hessian.shape}; it must be square, [K, K]")
    if not 0 <= damp < 1:
        raise ConfigError(f"damp={damp!r} is not valid; use a fraction of the mean diagonal in [0, 1)")
    order, dead = channel_order(hessian, act_order)
    diagonal = np.where(dead, 1.0, np.diag(hessian).astype(np.float64))
    reverse = order[::-1]  # the one [K, K] copy: the Hessian in quantization order, reversed, factored in place
    h = np.asarray(hessian[np.ix_(reverse, reverse)], np.float32)
    h[np.diag_indices(len(h))] = diagonal[reverse] + damp * np.mean(diagonal)
    return Factor(order, invert_cholesky_in_place(h)[::-1, ::-1], dead)


def gptq(
    weight: ArrayLike,
    hessian: ArrayLike,
    bits: int = 4,
    group_size: int = 128,
    symmetric: bool = False,
    *,
    block_size: int = BLOCK_SIZE,
    damp: float = DAMP,
    act_order: bool = True,
    clip: ArrayLike = 1.0,
    family: str = "int",
    factor: Factor | None = None,
) -> GroupCodes:
    """Group-wise codes of ``weight`` (``[K, N]``) chosen by GPTQ for inputs of Hessian ``hessian`` (``[K, K]``)
    on the grid of ``family`` (:func:`qcore.groupwise.grid_of`); ``clip`` shrinks the ranges of the grids fixed up
    front (act order; :func:`.clip_search.search_clip`). ``factor``: :func:`factor_hessian` of ``hessian`` (with
    this ``damp`` and ``act_order``) when already computed. Each output column's codes depend on that column and
    the factor only, so columns quantized apart equal those of the whole weight."""
    grid = grid_of(bits, symmetric, family, group_size)
    w = np.array(weight, np.float32)
    k, n = w.shape
    if np.shape(hessian) != (k, k):
        raise ConfigError(f"the Hessian has shape {np.shape(hessian)}; a [{k}, {n}] weight needs [{k}, {k}]")
    if not act_order and np.any(np.asarray(clip) != 1.0):
        raise ConfigError("clip applies to the grids act order fixes up front; use act_order=True")
    f = factor if factor is not None else factor_hessian(hessian, damp, act_order)
    size = step_group(k, grid, group_size)
    groups = k // size
    unit = grid.block if grid.sub is not None else size  # channels whose steps are fixed together
    w[f.dead] = 0.0
    # grids fixed up front (act order), else filled in as each group's first channel is reached
    steps = np.zeros((groups, n))
    zeros = None if grid.zero == "none" else np.zeros((groups, n))
    if act_order:
        step, zero = group_grid(w.reshape(groups, size, n), grid, clip)
        steps[:], zeros = step, zero
    order, upper = f.order, f.upper
    w = w[order]
    codes = np.zeros((k, n), np.float32)
    # a block holds whole grid units, so that a unit's grid is taken from fully updated channels
    block = max(block_size // unit, 1) * unit if not act_order else block_size
    for start in range(0, k, block):
        end = min(start + block, k)
        errors = np.zeros((end - start, n), np.float32)
        for i in range(start, end):
            g = order[i] // size
            if not act_order and order[i] % unit == 0:
                step, zero = group_grid(w[i:i + unit].reshape(unit // size, size, n), grid)
                steps[g:g + unit // size] = step
                if zeros is not None:
                    zeros[g:g + unit // size] = zero
            zero_g = None if zeros is None else zeros[g]
            codes[i] = encode(w[i], steps[g], zero_g, grid)
            errors[i - start] = (w[i] - decode(codes[i], steps[g], zero_g, grid)) / upper[i, i]
            w[i + 1:end] -= np.outer(upper[i, i + 1:end], errors[i - start])
        lazy = np.ascontiguousarray(upper[start:end, end:].T)
        for part in column_chunks(n):
            w[end:, part] -= lazy @ errors[:, part]
    codes[order] = codes.copy()
    return pack_group_codes(codes, steps, zeros, grid, size)
