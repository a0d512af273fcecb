"""qcore.quant against hand-computed values and plain-Python references."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from qcore.errors import ConfigError, DataError
from qcore.quant import (
    abs_max,
    asymmetric_range,
    dequantize,
    fake_quantize,
    log_dequantize,
    log_quantize,
    qmax,
    quantize,
    scale_from_threshold,
)

RNG = np.random.default_rng(1234)
DATA = {
    "normal": RNG.standard_normal((4, 60)),
    "student_t2": RNG.standard_t(2, (4, 60)),
}


def ref_quantize(x, scale, bits, axis=None, rounding="half_even"):
    """Element by element: Python round() is half-to-even; half_away is floor(|v| + 0.5) with the sign."""
    qm = 2 ** (bits - 1) - 1
    x = np.asarray(x, dtype=np.float64)
    out = np.zeros(x.shape, dtype=np.int64)
    for idx in np.ndindex(x.shape):
        s = float(np.ravel(scale)[idx[axis]] if axis is not None else scale)
        if s == 0:
            continue
        v = x[idx] / s
        r = round(v) if rounding == "half_even" else math.copysign(math.floor(abs(v) + 0.5), v)
        out[idx] = min(max(int(r), -qm), qm)
    return out


def test_qmax_values():
    assert [qmax(b) for b in (2, 4, 8, 16)] == [1, 7, 127, 32767]


def test_hand_computed_tiny_tensor():
    x = [-1.0, 0.5, 0.25]
    s = scale_from_threshold(1.0, 8)
    assert s == pytest.approx(1 / 127)
    q = quantize(x, s, 8)
    assert q.dtype == np.int8
    assert q.tolist() == [-127, 64, 32]  # 63.5 -> 64 (half to even), 31.75 -> 32
    np.testing.assert_allclose(dequantize(q, s), [-1.0, 64 / 127, 32 / 127], rtol=1e-6)
    np.testing.assert_allclose(fake_quantize(x, 1.0, 8), [-1.0, 64 / 127, 32 / 127], rtol=1e-6)


def test_rounding_modes_on_ties():
    x = [0.5, 1.5, 2.5, -0.5, -2.5]
    assert quantize(x, 1.0, 8).tolist() == [0, 2, 2, 0, -2]
    assert quantize(x, 1.0, 8, rounding="half_away").tolist() == [1, 2, 3, -1, -3]


def test_range_is_symmetric():
    q = quantize([-10.0, 10.0, -1.0], 1 / 7, 4)
    assert q.tolist() == [-7, 7, -7]  # never -8


@pytest.mark.parametrize("name", DATA)
@pytest.mark.parametrize("bits", range(2, 17))
def test_quantize_matches_reference_per_tensor(name, bits):
    x = DATA[name]
    scale = 0.8 * abs_max(x) / qmax(bits)  # clip some values
    for rounding in ("half_even", "half_away"):
        q = quantize(x, scale, bits, rounding=rounding)
        assert q.dtype == (np.int8 if bits <= 8 else np.int16)
        np.testing.assert_array_equal(q, ref_quantize(x, scale, bits, rounding=rounding))


@pytest.mark.parametrize("name", DATA)
@pytest.mark.parametrize("bits", [2, 4, 8, 12, 16])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_quantize_matches_reference_per_channel(name, bits, axis):
    x = DATA[name]
    scale = scale_from_threshold(abs_max(x, axis), bits)
    q = quantize(x, scale, bits, axis=axis)
    np.testing.assert_array_equal(q, ref_quantize(x, scale, bits, axis=axis % 2))
    deq = dequantize(q, scale, axis=axis)
    shape = [1, 1]
    shape[axis] = -1
    np.testing.assert_allclose(deq, ref_quantize(x, scale, bits, axis=axis % 2) * scale.reshape(shape), rtol=1e-6)


def test_abs_max_matches_loops():
    x = DATA["student_t2"]
    assert abs_max(x) == max(abs(v) for v in x.ravel())
    np.testing.assert_array_equal(abs_max(x, 0), [max(abs(v) for v in row) for row in x])
    np.testing.assert_array_equal(abs_max(x, 1), [max(abs(x[r, c]) for r in range(4)) for c in range(60)])


@pytest.mark.parametrize("name", DATA)
@pytest.mark.parametrize("bits", range(2, 17))
def test_error_bound(name, bits):
    x = DATA[name]
    threshold = 0.5 * abs_max(x)
    scale = threshold / qmax(bits)
    err = np.abs(x - fake_quantize(x, threshold, bits))
    inside = np.abs(x) <= threshold
    tol = 1e-6 * threshold  # float32 output
    assert np.all(err[inside] <= scale / 2 + tol)
    np.testing.assert_allclose(err[~inside], np.abs(x[~inside]) - threshold, atol=tol)


def test_zero_channel_gives_zeros_without_warnings():
    x = np.array([[0.0, 0.0, 0.0], [1.0, -2.0, 0.5]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fq = fake_quantize(x, abs_max(x, 0), 8, axis=0)
        q = quantize([3.0, 1.0], 0.0, 8)
    assert np.isfinite(fq).all()
    assert fq[0].tolist() == [0.0, 0.0, 0.0]
    np.testing.assert_allclose(fq[1], [1.0, -2.0, 0.5], atol=2 / 127 / 2)
    assert q.tolist() == [0, 0]


@pytest.mark.parametrize("bits", [1, 17, 0, 8.0, True])
def test_bad_bits(bits):
    with pytest.raises(ConfigError, match="bits"):
        quantize([1.0], 0.1, bits)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input(bad):
    with pytest.raises(DataError, match="NaN/Inf"):
        quantize([1.0, bad], 0.1, 8)
    with pytest.raises(DataError, match="NaN/Inf"):
        abs_max([bad])


def test_bad_inputs():
    with pytest.raises(DataError, match="empty"):
        quantize([], 0.1, 8)
    with pytest.raises(DataError, match="channels"):
        quantize(np.ones((2, 3)), [0.1, 0.1], 8, axis=1)
    with pytest.raises(DataError, match="axis=None"):
        quantize(np.ones((2, 3)), [0.1, 0.1], 8)
    with pytest.raises(DataError, match="scale"):
        quantize([1.0], -0.1, 8)
    with pytest.raises(ConfigError, match="axis=2"):
        abs_max(np.ones((2, 3)), 2)
    with pytest.raises(ConfigError, match="did you mean 'half_away'"):
        quantize([1.0], 0.1, 8, rounding="half_awya")


def ref_log_levels(absmax, bits):
    qm = 2 ** (bits - 1) - 1
    return [0.0] + [absmax * 2.0**-e for e in range(qm)]


@pytest.mark.parametrize("name", DATA)
@pytest.mark.parametrize("bits", range(2, 9))
def test_log_quantize_picks_nearest_level(name, bits):
    x = DATA[name]
    codes, meta = log_quantize(x, bits)
    assert codes.dtype == np.int8
    assert np.abs(codes).max() <= qmax(bits)
    deq = log_dequantize(codes, meta)
    levels = ref_log_levels(abs_max(x), bits)
    for v, d in zip(x.ravel(), deq.ravel()):
        best = min(levels, key=lambda lv: abs(abs(v) - lv))
        assert d == pytest.approx(math.copysign(best, v) if best else 0.0, rel=1e-6)


@pytest.mark.parametrize("name", DATA)
def test_log_round_trip_relative_error_is_bounded(name):
    x = DATA[name] * 10.0 ** RNG.uniform(-6, 0, DATA[name].shape)  # spread over many octaves
    codes, meta = log_quantize(x, 8)
    deq = log_dequantize(codes, meta)
    rel = np.abs(deq - x) / np.abs(x)
    assert rel.max() <= 1 / 3 + 1e-6
    assert rel.max() > 0.2  # the bound is nearly reached, so it is not vacuous


def test_log_quantize_per_channel_and_small_values():
    x = np.array([[8.0, -2.0, 0.0, 3.0], [0.5, 0.25, -0.001, 0.0]])
    codes, meta = log_quantize(x, 3, axis=0)  # levels: 0, m, m/2, m/4
    np.testing.assert_array_equal(codes, [[1, -3, 0, 2], [1, 2, 0, 0]])
    np.testing.assert_allclose(log_dequantize(codes, meta), [[8.0, -2.0, 0.0, 4.0], [0.5, 0.25, 0.0, 0.0]])
    with pytest.raises(ConfigError, match="int8"):
        log_quantize(x, 9)
    with pytest.raises(DataError, match="log_quantize"):
        log_dequantize(codes, {"bits": 3})


def test_log_quantize_with_a_given_absmax_matches_whole_tensor_chunks():
    x = RNG.standard_normal((100, 8))
    whole, meta = log_quantize(x, 8)
    chunks = [log_quantize(x[i : i + 30], 8, absmax=meta["absmax"])[0] for i in range(0, 100, 30)]
    np.testing.assert_array_equal(np.concatenate(chunks), whole)
    clipped, _ = log_quantize(np.array([4.0, -1.0, 0.5]), 8, absmax=1.0)  # above absmax: top level
    np.testing.assert_array_equal(clipped, [1, -1, 2])


@pytest.mark.parametrize("bits", [3, 8])
def test_log_quantize_float32_path_matches_float64(bits):
    x = (RNG.standard_normal((300, 16)) * 10.0 ** RNG.uniform(-8, 1, (300, 16))).astype(np.float32)
    x[0, :3] = [0.0, 1e-45, -3e-39]  # zero and subnormals
    for axis in (None, 0):
        fast, meta = log_quantize(x, bits, axis)
        slow, _ = log_quantize(x.astype(np.float64), bits, axis)
        assert fast.dtype == np.int8 and (fast != slow).mean() < 1e-3  # only near-ties may differ
        np.testing.assert_allclose(meta["absmax"], np.abs(x).max() if axis is None else np.abs(x).max(1))


def test_asymmetric_range_hand_computed():
    # a hardswish-like tensor: seen in [-0.375, 20], clipped at 8 -> 255 levels over [-0.375, 8]
    half, offset = asymmetric_range(8.0, -0.375, 20.0, 8)
    assert half == pytest.approx(8.375 / 2)
    step = half / 127
    assert offset / step == pytest.approx(round(offset / step), abs=1e-9)  # zero is a grid point
    assert round(offset / step) == round((8.0 - 0.375) / 2 / step) == 116
    assert offset - half <= -0.375 + step / 2 and offset + half >= 8.0 - step / 2  # the span is covered
    # a relu output: [0, t] in 2*127 steps, zero the lowest level (unsigned int8)
    half, offset = asymmetric_range(6.0, 0.0, 9.0, 8)
    assert (half, offset) == (3.0, 3.0)
    # nothing to gain: a tensor reaching both ends, or a threshold inside both ends
    assert asymmetric_range(4.0, -5.0, 4.0, 8) == (4.0, 0.0)
    assert asymmetric_range(1.0, -3.0, 3.0, 8) == (1.0, 0.0)
    assert asymmetric_range(2.0, 0.0, 0.0, 8) == (2.0, 0.0)  # all zeros
    assert asymmetric_range(1.0, -0.85, 1.0, 8) == (1.0, 0.0)  # 7.5 % finer: not worth a zero point
    assert asymmetric_range(1.0, -0.75, 1.0, 8)[1] != 0.0  # 12.5 % finer


def test_asymmetric_grid_error_is_at_most_half_the_symmetric_one_on_relu_outputs():
    x = np.abs(np.random.default_rng(7).standard_normal(10000))
    t = float(x.max())
    half, offset = asymmetric_range(t, float(x.min()), t, 8)
    symmetric = np.abs(fake_quantize(x, t, 8) - x).max()
    asymmetric = np.abs(fake_quantize(x - offset, half, 8) + offset - x).max()
    assert asymmetric <= symmetric / 2 + 1e-12


def test_unsigned_range_hand_computed():
    from qcore.quant import unsigned_range

    threshold, offset = unsigned_range(8.0, 5.1, 8)  # seen up to 5.1, clipped at 8: 256 codes over [0, 5.1]
    step = 5.1 / 255
    assert threshold == pytest.approx(127 * step) and offset == pytest.approx(128 * step)
    # Paddle's kernels clip x - offset to [-128, 127] steps: 0 -> -128 (uint8 0), 5.1 -> 127 (uint8 255)
    codes = np.clip(np.round((np.array([0.0, step, 5.1, 9.0]) - offset) / step), -128, 127)
    np.testing.assert_array_equal(codes, [-128, -127, 127, 127])
    assert unsigned_range(2.0, 3.0, 8)[0] == pytest.approx(127 * 2.0 / 255)  # the threshold still clips
    assert unsigned_range(2.0, 0.0, 8) == (2.0, 0.0)  # all zeros
