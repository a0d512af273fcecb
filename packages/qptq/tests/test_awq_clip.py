"""AWQ-style scales and clip search: scaling leaves the float function unchanged before rounding; both never
do worse than round to nearest on their calibration inputs and do better where the inputs call for it."""

from __future__ import annotations

import numpy as np
import pytest

from qcore.groupwise import grid_of, quantize_groups
from qptq.weight_only.awq import search_scales
from qptq.weight_only.clip_search import RATIOS, diagonal_blocks, group_errors, search_clip


def _inputs(rng, k=64, rows=400, outliers=(3, 17, 40)):
    x = rng.standard_normal((rows, k))
    x[:, list(outliers)] *= 25.0  # a few channels with large activations, as in LLM hidden states
    return x


def _error(x, w, q):
    return float(np.linalg.norm(x @ q - x @ w) / np.linalg.norm(x @ w))


def test_awq_scales_leave_the_float_function_unchanged_and_lower_the_int4_error():
    rng = np.random.default_rng(0)
    x = _inputs(rng)
    hessian = 2 * x.T @ x / len(x)
    q, k, v = (rng.standard_normal((64, n)) for n in (32, 16, 16))  # three readers of one input share the scales
    found = search_scales([q, k, v], hessian, bits=4, group_size=32)
    s = found.scales
    assert found.alpha > 0 and s[[3, 17, 40]].min() > s.max() / 3  # the outlier channels get the largest scales
    assert s.max() * s.min() == pytest.approx(1.0)
    for w in (q, k, v):  # before rounding: the input divided by s, the rows multiplied by it
        np.testing.assert_allclose((x / s) @ (w * s[:, None]), x @ w, rtol=1e-10, atol=1e-10)
    assert found.errors[found.alpha] == min(found.errors.values()) < found.errors[0.0]
    rtn = sum(_error(x, w, quantize_groups(w, 4, 32).dequantize()) for w in (q, k, v))
    awq = sum(_error(x, w, quantize_groups(w * s[:, None], 4, 32).dequantize() / s[:, None]) for w in (q, k, v))
    assert awq < 0.8 * rtn, (awq, rtn)


def test_clip_search_scores_each_group_by_its_output_error_and_beats_no_clip():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((300, 64))
    w = rng.standard_normal((64, 8))
    w[5, 2] = 9.0  # one large weight stretches its group's range
    hessian = 2 * x.T @ x / len(x)
    # a group's error by hand: d^T H_gg d for ratio 1 on group 0, output 2
    d = w - quantize_groups(w, 4, 32).dequantize()
    by_hand = d[:32, 2] @ hessian[:32, :32] @ d[:32, 2]
    blocks = diagonal_blocks(hessian, 32)
    np.testing.assert_array_equal(blocks[1], hessian[32:, 32:].astype(np.float32))
    errors = group_errors(w.astype(np.float32), blocks, grid_of(4, False), 1.0)  # scored in float32
    assert errors[0, 2] == pytest.approx(by_hand, rel=1e-5)
    clip = search_clip(w, hessian, 4, 32)
    assert clip.shape == (2, 8) and set(np.unique(clip)) <= set(RATIOS)
    clipped = _error(x, w, quantize_groups(w, 4, 32, clip=clip).dequantize())
    plain = _error(x, w, quantize_groups(w, 4, 32).dequantize())
    assert clipped < plain
    assert clip[0, 2] < 1.0  # the stretched group clips its outlier
