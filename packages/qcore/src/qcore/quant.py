"""Symmetric linear and log2 quantization math (pure numpy).

Convention: ``qmax = 2**(bits-1) - 1``, ``scale = threshold / qmax`` and
``q = clip(round(x / scale), -qmax, qmax)``. The integer range is symmetric: the lowest
code is ``-qmax``, never ``-qmax - 1``. Per-channel functions take ``axis``, the channel
axis of ``x``, and a 1-D ``scale``/``threshold`` with one entry per channel. A zero scale
(an all-zero channel) maps every value to 0 instead of dividing by zero.
"""

from __future__ import annotations

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


def log_quantize(
    x: ArrayLike, bits: int = 8, axis: int | None = None, absmax: ArrayLike | None = None
) -> tuple[NDArray[np.int8], dict[str, Any]]:
    """Sign + power-of-two codes relative to the abs max (per tensor, or per channel along ``axis``).

    Scheme: code 0 is zero; a code ``c != 0`` stands for ``sign(c) * absmax * 2**-(|c| - 1)``, so
    ``|c| - 1`` is an exponent ``e`` in ``0..qmax(bits) - 1``. ``|x|`` goes to the nearer of its two
    bracketing powers of two in the linear domain (the split is at 3/4 of the upper one), so the
    relative error is at most 1/3 for ``|x| >= absmax * 2**-(qmax-1)``; smaller values go to that
    smallest level or to 0, whichever is nearer. ``bits`` is 2..8 (codes are int8). ``absmax``
    overrides the reference (e.g. the abs max of a whole table quantized chunk by chunk); values
    above it get the top level. Returns ``(codes, meta)`` where ``meta`` holds ``scheme``,
    ``bits``, ``axis`` and ``absmax``.
    """
    qm = qmax(bits)
    if bits > 8:
        raise ConfigError(f"log_quantize stores int8 codes; use bits from 2 to 8, not {bits}")
    a = np.asarray(x)
    if a.dtype != np.float32 or a.size == 0 or not np.isfinite(a).all():
        a = as_finite(x, "x")  # float32 input stays float32 (about 10x faster); ties may differ by a level
    mag = np.abs(a)
    if absmax is None:
        reduced = tuple(i for i in range(a.ndim) if axis is None or i != _channel_axis(axis, a.ndim))
        m = mag.max(axis=reduced).astype(np.float64)
        m = float(m) if axis is None else m
    else:
        m = absmax
    mb = _broadcast(m, a.shape, axis, "absmax").astype(a.dtype)
    ratio = np.minimum(np.divide(mag, np.where(mb > 0, mb, 1), out=mag), 1, out=mag)
    # ratio = 1.f * 2**E: the nearer power of two is 2**-(e) with e = -E - (top bit of f), read from the bits
    int_type, mantissa, bias = (np.int32, 23, 127) if a.dtype == np.float32 else (np.int64, 52, 1023)
    raw = ratio.view(int_type)
    emax = qm - 1
    codes = bias + 1 - (raw >> mantissa) - ((raw >> (mantissa - 1)) & 1)  # e + 1
    np.minimum(codes, emax + 1, out=codes)
    codes[ratio < a.dtype.type(np.ldexp(0.5, -emax))] = 0  # nearer to 0 than to the smallest level (and 0)
    sign = a.view(int_type) >> (8 * a.itemsize - 1)  # -1 where x is negative, else 0
    return ((codes ^ sign) - sign).astype(np.int8), {"scheme": "log2", "bits": int(bits), "axis": axis, "absmax": m}


def log_dequantize(codes: ArrayLike, meta: dict[str, Any]) -> NDArray[np.float32]:
    """Inverse of :func:`log_quantize`: ``sign(c) * absmax * 2**-(|c| - 1)`` as float32."""
    if meta.get("scheme") != "log2" or "absmax" not in meta:
        raise DataError("meta is not a log2 quantization record; pass the meta returned by log_quantize")
    c = as_finite(codes, "codes")
    m = _broadcast(meta["absmax"], c.shape, meta.get("axis"), "absmax")
    return (np.ldexp(np.sign(c), (1 - np.abs(c)).astype(np.int64)) * m).astype(np.float32)
