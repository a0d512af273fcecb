"""Symmetric linear and log2 quantization math (pure numpy).

Convention: ``qmax = 2**(bits-1) - 1``, ``scale = threshold / qmax`` and
``q = clip(round(x / scale), -qmax, qmax)``. The integer range is symmetric: the lowest
code is ``-qmax``, never ``-qmax - 1``. Per-channel functions take ``axis``, the channel
axis of ``x``, and a 1-D ``scale``/``threshold`` with one entry per channel. A zero scale
(an all-zero channel) maps every value to 0 instead of dividing by zero.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .errors import ConfigError, DataError, did_you_mean

ROUNDINGS = ("half_even", "half_away")


def qmax(bits: int) -> int:
    """Largest integer code for ``bits`` (2..16): ``2**(bits-1) - 1``."""
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 2 <= bits <= 16:
        raise ConfigError(f"bits={bits!r} is not supported; use an integer from 2 to 16")
    return 2 ** (int(bits) - 1) - 1


def as_finite(x: ArrayLike, name: str = "input") -> NDArray[np.float64]:
    """Return ``x`` as a float64 array; raise DataError if it is empty or holds NaN/Inf."""
    a = np.asarray(x, dtype=np.float64)
    if a.size == 0:
        raise DataError(f"{name} is empty; pass at least one value")
    bad = a.size - int(np.count_nonzero(np.isfinite(a)))
    if bad:
        raise DataError(f"{name} contains {bad} NaN/Inf value(s); clean the data or skip this batch")
    return a


def _channel_axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise ConfigError(f"axis={axis} is out of range for a {ndim}-D array; use -{ndim}..{ndim - 1}")
    return axis % ndim


def _broadcast(values: ArrayLike, shape: tuple[int, ...], axis: int | None, name: str) -> NDArray[np.float64]:
    """Check a per-tensor or per-channel scale/threshold and shape it to broadcast against ``shape``."""
    v = np.asarray(values, dtype=np.float64)
    if axis is None:
        if v.size != 1:
            raise DataError(
                f"{name} has {v.size} values but axis=None; pass one {name} or set axis to the channel axis"
            )
        v = v.reshape(())
    else:
        ax = _channel_axis(axis, len(shape))
        if v.ndim != 1 or v.size != shape[ax]:
            raise DataError(
                f"{name} has shape {v.shape} but axis {axis} has {shape[ax]} channels; pass a 1-D {name} of that length"
            )
        v = v.reshape([shape[ax] if i == ax else 1 for i in range(len(shape))])
    if not np.isfinite(v).all() or (v < 0).any():
        raise DataError(f"{name} must be finite and >= 0; recompute it from finite data")
    return v


def scale_from_threshold(threshold: ArrayLike, bits: int) -> float | NDArray[np.float64]:
    """``threshold / qmax(bits)``; a float for a scalar threshold, else an array."""
    t = np.asarray(threshold, dtype=np.float64)
    if not np.isfinite(t).all() or (t < 0).any():
        raise DataError("threshold must be finite and >= 0; recompute it from finite data")
    s = t / qmax(bits)
    return float(s) if s.ndim == 0 else s


def bounded_thresholds(thresholds: ArrayLike, bits: int, max_code: int | None) -> NDArray[np.float64]:
    """``thresholds`` widened so that their codes stay within +-``max_code`` (None: unchanged), as 1-D.

    The overflow fix of :mod:`qcore.deploy.host`: the scale becomes ``threshold / max_code``.
    """
    thr = np.atleast_1d(np.asarray(thresholds, dtype=np.float64))
    return thr if max_code is None else thr * (qmax(bits) / max_code)


#: how much finer (relative step) an asymmetric grid must be than the symmetric one to be used
ASYMMETRIC_MIN_GAIN = 0.1


def asymmetric_range(threshold: float, lo: float, hi: float, bits: int) -> tuple[float, float]:
    """The ``(threshold, offset)`` of a grid for values seen in ``[lo, hi]``, clipped at ``threshold``.

    A symmetric grid spends its levels on ``[-threshold, threshold]``; a tensor that reaches only
    ``[max(lo, -threshold), min(hi, threshold)]`` (a relu or hardswish output, a softmax) gets the
    same ``2 * qmax(bits) + 1`` levels over that span instead: quantize ``x - offset`` with the
    returned, smaller threshold and add ``offset`` back. ``offset`` is a whole number of steps, so
    zero stays exactly representable (the integer zero point of an asymmetric int8 grid is
    ``-offset / step``). A span less than :data:`ASYMMETRIC_MIN_GAIN` narrower than the symmetric
    one keeps the symmetric grid, ``(threshold, 0.0)``: a zero point costs the runtime a
    compensation term per output.
    """
    a, b = max(lo, -threshold), min(hi, threshold)
    half = (b - a) / 2
    if not 0 < half <= threshold * (1 - ASYMMETRIC_MIN_GAIN):
        return threshold, 0.0
    step = half / qmax(bits)
    return half, round((a + b) / 2 / step) * step


def unsigned_range(threshold: float, hi: float, bits: int) -> tuple[float, float]:
    """The ``(threshold, offset)`` of the grid for a tensor that is never negative: every code of
    ``[-qmax - 1, qmax]`` (``2 ** bits`` levels) over ``[0, min(hi, threshold)]``, zero on the lowest code.

    Quantizing ``x - offset`` symmetrically with the returned threshold and clipping to
    ``[-qmax - 1, qmax]`` (Paddle's kernels, ONNX) puts 0 at code ``-qmax - 1``: the unsigned form
    runtimes run natively (uint8 with zero point 0), where ONNX Runtime and OpenVINO drop a relu
    and keep u8 x s8 kernels. Not for :func:`quantize`, which clips at ``-qmax``.
    """
    top = min(hi, threshold)
    if not top > 0:
        return threshold, 0.0
    step = top / (2 * qmax(bits) + 1)
    return qmax(bits) * step, (qmax(bits) + 1) * step


def quantize(
    x: ArrayLike, scale: ArrayLike, bits: int, axis: int | None = None, rounding: str = "half_even"
) -> NDArray[np.int8] | NDArray[np.int16]:
    """Integer codes ``clip(round(x / scale), -qmax, qmax)``: int8 for bits <= 8, else int16.

    ``rounding`` is ``'half_even'`` (numpy/Paddle ``round``) or ``'half_away'`` (ties away from 0).
    """
    qm = qmax(bits)
    if rounding not in ROUNDINGS:
        raise ConfigError(f"unknown rounding {rounding!r}{did_you_mean(rounding, ROUNDINGS)}; use one of {ROUNDINGS}")
    a = as_finite(x, "x")
    s = _broadcast(scale, a.shape, axis, "scale")
    with np.errstate(over="ignore"):
        v = a / np.where(s > 0, s, 1.0)
    r = np.rint(v) if rounding == "half_even" else np.copysign(np.floor(np.abs(v) + 0.5), v)
    q = np.where(s > 0, np.clip(r, -qm, qm), 0.0)
    return q.astype(np.int8 if bits <= 8 else np.int16)


def dequantize(q: ArrayLike, scale: ArrayLike, axis: int | None = None) -> NDArray[np.float32]:
    """``q * scale`` as float32 (per channel along ``axis`` when it is given)."""
    a = as_finite(q, "q")
    return (a * _broadcast(scale, a.shape, axis, "scale")).astype(np.float32)


def fake_quantize(
    x: ArrayLike, threshold: ArrayLike, bits: int, axis: int | None = None, rounding: str = "half_even"
) -> NDArray[np.float32]:
    """Quantize then dequantize ``x`` with ``scale = threshold / qmax(bits)``."""
    s = scale_from_threshold(threshold, bits)
    return dequantize(quantize(x, s, bits, axis, rounding), s, axis)


def abs_max(x: ArrayLike, axis: int | None = None) -> float | NDArray[np.float64]:
    """Max of ``|x|``: a float, or per channel (reduced over every axis but ``axis``) a 1-D array."""
    a = np.abs(as_finite(x, "x"))
    if axis is None:
        return float(a.max())
    ax = _channel_axis(axis, a.ndim)
    return a.max(axis=tuple(i for i in range(a.ndim) if i != ax))


LN2 = math.log(2.0)  # log level spacing of one level per octave (powers of two)
# fit_log_step's candidate spacings: ln2 / k for k = 2**(i/4) levels per octave, k from 1/4 to 32
LOG_STEP_CANDIDATES = tuple(LN2 / 2.0 ** (i / 4) for i in range(-8, 21))


def log_levels(bits: int, step: float) -> NDArray[np.float64]:
    """Magnitudes of the nonzero log codes 1..qmax as fractions of the abs max: ``exp(-step * (c - 1))``."""
    return np.exp(-step * np.arange(qmax(bits)))


def log_error_bound(step: float) -> float:
    """Largest relative error of :func:`log_quantize` for ``absmax * min level <= |x| <= absmax``.

    Nearest-level rounding errs by at most ``tanh(step / 2)`` of the value (half the gap between
    two levels ``step`` apart, at the midpoint). The decision is read from the top 16 bits of the
    float32 ratio, so a value within ``2**-8`` of itself from a midpoint may take the farther level.
    """
    return (1 + 2.0**-8) * math.tanh(step / 2) + 2.0**-8


@functools.lru_cache(maxsize=16)
def _log_code_table(bits: int, step: float) -> NDArray[np.int8]:
    """The signed code of every float32 ratio ``x / absmax``, indexed by its top 16 bits.

    A key covers the floats sharing sign, exponent and the first 7 mantissa bits; it gets the
    level nearest to its middle (ties to the larger level) in the linear domain, or 0 when that
    is nearer than the smallest level.
    """
    keys = np.arange(1 << 15, dtype=np.uint32)
    levels = np.concatenate([[0.0], log_levels(bits, step)[::-1]])  # ascending: 0, smallest .. 1
    with np.errstate(invalid="ignore", over="ignore"):  # the keys of inf/NaN
        lo = (keys << 16).view(np.float32).astype(np.float64)
        hi = ((keys + 1) << 16).view(np.float32).astype(np.float64)
        nearest = np.searchsorted((levels[1:] + levels[:-1]) / 2, (lo + hi) / 2, side="right")
    codes = np.where(nearest > 0, len(levels) - nearest, 0).astype(np.int8)  # level index -> code
    return np.concatenate([codes, -codes])


def log_codes(
    ratio: NDArray[np.float32], bits: int, step: float, out: NDArray[np.int8] | None = None,
    index: NDArray[np.intp] | None = None,
) -> NDArray[np.int8]:
    """Log codes of a C-contiguous float32 ``ratio = x / absmax`` (flat int8; see :func:`log_quantize`).

    One table lookup per value; ``out`` and ``index`` (intp, ``ratio.size``) are optional buffers.
    """
    if index is None:
        index = np.empty(ratio.size, np.intp)
    np.right_shift(ratio.reshape(-1).view(np.uint32), 16, out=index, casting="unsafe")
    return np.take(_log_code_table(bits, float(step)), index, out=out, mode="wrap")


def check_log_step(step: float) -> float:
    """``step`` as a float; ConfigError unless it is a finite number > 0."""
    if isinstance(step, bool) or not isinstance(step, (int, float, np.floating)) or not 0 < step < math.inf:
        raise ConfigError(f"log step {step!r} is not valid; use a level spacing > 0 (math.log(2): one per octave)")
    return float(step)


def _log_absmax(a: NDArray[Any], axis: int | None, absmax: ArrayLike | None) -> NDArray[np.float64]:
    """The reference abs max (measured, or ``absmax``) shaped to broadcast against ``a``."""
    if absmax is None:
        reduced = tuple(i for i in range(a.ndim) if axis is None or i != _channel_axis(axis, a.ndim))
        absmax = np.abs(a).max(axis=reduced)
    return _broadcast(absmax, a.shape, axis, "absmax")


def log_quantize(
    x: ArrayLike, bits: int = 8, axis: int | None = None, absmax: ArrayLike | None = None, step: float = LN2
) -> tuple[NDArray[np.int8], dict[str, Any]]:
    """Sign + log-grid codes relative to the abs max (per tensor, or per channel along ``axis``).

    Scheme: code 0 is zero; a code ``c != 0`` stands for ``sign(c) * absmax * exp(-step * (|c| - 1))``,
    so the levels are ``step`` apart in the log domain (``step = ln 2``: powers of two;
    ``ln 2 / k``: k levels per octave). ``|x|`` goes to the nearest level in the linear domain,
    so the relative error is at most :func:`log_error_bound` down to the smallest level; smaller
    values go to it or to 0, whichever is nearer. ``bits`` is 2..8 (codes are int8). ``absmax``
    overrides the reference (e.g. the abs max of a whole table quantized chunk by chunk); values
    above it get the top level. Returns ``(codes, meta)`` where ``meta`` holds ``scheme``,
    ``bits``, ``axis``, ``absmax`` and ``step``.
    """
    qmax(bits)
    if bits > 8:
        raise ConfigError(f"log_quantize stores int8 codes; use bits from 2 to 8, not {bits}")
    step = check_log_step(step)
    a = np.asarray(x)
    if a.dtype != np.float32 or a.size == 0 or not np.isfinite(a).all():
        a = as_finite(x, "x")
    m = _log_absmax(a, axis, absmax)
    ratio = np.ascontiguousarray(a / np.where(m > 0, m, 1).astype(a.dtype), dtype=np.float32)
    codes = log_codes(ratio, bits, step).reshape(a.shape)
    reference = m.reshape(-1) if axis is not None else float(m)
    return codes, {"scheme": "log2", "bits": int(bits), "axis": axis, "absmax": reference, "step": step}


def log_dequantize(codes: ArrayLike, meta: dict[str, Any]) -> NDArray[np.float32]:
    """Inverse of :func:`log_quantize`: ``sign(c) * absmax * exp(step * (1 - |c|))`` as float32."""
    if meta.get("scheme") != "log2" or "absmax" not in meta or "step" not in meta:
        raise DataError("meta is not a log2 quantization record; pass the meta returned by log_quantize")
    c = np.asarray(codes)
    if c.dtype != np.int8:
        c = as_finite(codes, "codes")
        if (c != np.rint(c)).any() or np.abs(c).max() > 127:
            raise DataError("log codes must be integers in -127..127; pass the codes returned by log_quantize")
    m = _broadcast(meta["absmax"], c.shape, meta.get("axis"), "absmax")
    every = np.arange(-128, 128)
    values = np.sign(every) * np.exp(check_log_step(meta["step"]) * (1 - np.abs(every)))  # of each int8 code
    return (np.take(values, c.astype(np.intp) + 128) * m).astype(np.float32)


def _log_sq_error(ratio: NDArray[np.float32], neg_log: NDArray[np.float32], qm: int, step: float) -> NDArray[Any]:
    """Squared error of rounding each ``ratio = |x| / absmax`` (``neg_log = -ln ratio >= 0``) to the nearest
    of 0 and the levels: the nearer of the level at or just above it and the next one down."""
    levels = np.append(np.exp(-step * np.arange(qm)), 0.0).astype(np.float32)
    j = np.minimum(neg_log * np.float32(1 / step), qm - 1).astype(np.int32)
    return np.minimum(np.square(ratio - np.take(levels, j)), np.square(ratio - np.take(levels, j + 1)))


def fit_log_step(
    x: ArrayLike, bits: int = 8, axis: int | None = None, absmax: ArrayLike | None = None,
    candidates: tuple[float, ...] = LOG_STEP_CANDIDATES,
) -> float:
    """The level spacing among ``candidates`` whose log codes give ``x`` the least squared error.

    Finer steps cut the error of values in range; coarser ones reach smaller values before
    they fall to 0. ``x``, ``axis`` and ``absmax`` as in :func:`log_quantize` (pass a sample of a big
    table; ties go to the first candidate).
    """
    qm = qmax(bits)
    a = as_finite(x, "x")
    m = _log_absmax(a, axis, absmax)
    ratio = (np.abs(a) / np.where(m > 0, m, 1)).astype(np.float32).reshape(-1)
    weight = np.broadcast_to(m * m, a.shape).astype(np.float32).reshape(-1)
    with np.errstate(divide="ignore"):
        neg_log = np.maximum(-np.log(ratio), 0)  # values above the abs max take the top level
    errors = [float(weight @ _log_sq_error(ratio, neg_log, qm, check_log_step(s))) for s in candidates]
    return float(candidates[int(np.argmin(errors))])
