"""Group-wise weight codes (weight-only LLM quantization): steps, zero points and codes by hand."""

from __future__ import annotations

import numpy as np
import pytest

from qcore.errors import ConfigError
from qcore.groupwise import group_count, join_outputs, quantize_groups
from qcore.packing import pack_codes, unpack_fields


def test_asymmetric_int4_groups_by_hand():
    # K=4 inputs in two groups of 2, N=2 outputs
    w = np.array([[-1.0, 0.5], [2.0, 1.5], [0.3, -0.6], [0.9, -0.2]], np.float32)
    q = quantize_groups(w, bits=4, group_size=2)
    # group 0, output 0: range [-1, 2] -> step 3/15 = 0.2, zero point round(1 / 0.2) = 5
    # group 0, output 1: range [0, 1.5] (stretched to hold 0) -> step 0.1, zero point 0
    # group 1, output 0: [0, 0.9] -> 0.06, zero 0; output 1: [-0.6, 0] -> 0.04, zero 15
    np.testing.assert_allclose(q.scales, [[0.2, 0.1], [0.06, 0.04]], rtol=1e-6)
    np.testing.assert_array_equal(q.zero_points, [[5, 0], [0, 15]])
    np.testing.assert_array_equal(q.codes, [[0, 5], [15, 15], [5, 0], [15, 10]])
    np.testing.assert_allclose(q.dequantize(), [[-1.0, 0.5], [2.0, 1.5], [0.3, -0.6], [0.9, -0.2]], atol=1e-6)
    assert q.codes.dtype == np.uint8 and q.group_size == 2


def test_symmetric_groups_and_per_channel_by_hand():
    w = np.array([[0.7, -0.1], [-0.36, 0.4], [0.1, 0.2], [0.04, -0.8]], np.float32)
    q = quantize_groups(w, bits=4, group_size=-1, symmetric=True)  # one group: the whole column
    np.testing.assert_allclose(q.scales, [[0.1, 0.8 / 7]], rtol=1e-6)
    np.testing.assert_array_equal(q.codes[:, 0], [7, -4, 1, 0])
    assert q.zero_points is None and q.group_size == 4
    q8 = quantize_groups(w, bits=8, group_size=2, symmetric=True)
    err = np.abs(q8.dequantize() - w).max(axis=0)
    assert (err <= np.array([0.7, 0.4]) / 127 / 2 + 1e-7).all()  # half a step of the larger group's


def test_clip_shrinks_each_groups_range_and_zero_groups_stay_zero():
    w = np.zeros((4, 2), np.float32)
    w[:, 1] = [4.0, -1.0, 0.5, 0.25]
    q = quantize_groups(w, bits=4, group_size=4, symmetric=True, clip=0.5)
    assert q.scales[0, 0] == 0 and not q.codes[:, 0].any() and not q.dequantize()[:, 0].any()
    assert q.scales[0, 1] == pytest.approx(2.0 / 7)
    assert q.codes[0, 1] == 7  # 4.0 clips to the end code


def test_int4_codes_pack_two_to_a_byte_low_nibble_first():
    rng = np.random.default_rng(0)
    q = quantize_groups(rng.standard_normal((64, 3)), bits=4, group_size=32)
    packed = pack_codes(q.codes.T, 4)  # per output row, as MatMulNBits stores B
    assert packed.shape == (3, 32)
    assert int(packed.view(np.uint8)[0, 0]) == int(q.codes[0, 0]) | int(q.codes[1, 0]) << 4
    np.testing.assert_array_equal(unpack_fields(packed, 4, 64), q.codes.T)


@pytest.mark.parametrize(("k", "group", "message"), [
    (96, 128, r"group_size=128 does not divide the 96 input channels; use one of \[32\] or -1"),
    (100, 64, r"does not divide the 100 input channels; use -1 \(per channel\)"),
    (128, 0, "group_size=0 is not valid"),
])
def test_a_group_size_that_does_not_divide_the_width_is_one_line(k, group, message):
    with pytest.raises(ConfigError, match=message):
        group_count(k, group)


def test_three_bits_is_refused_with_the_supported_widths():
    with pytest.raises(ConfigError, match=r"weight_bits=3 is not supported .* use one of \(4, 8\)"):
        quantize_groups(np.ones((32, 2)), bits=3, group_size=32)


@pytest.mark.parametrize("symmetric", [True, False])
def test_join_outputs_puts_weights_side_by_side_only_on_one_grid(symmetric):
    rng = np.random.default_rng(3)
    parts = [quantize_groups(rng.standard_normal((64, n)), 4, 32, symmetric) for n in (8, 4, 4)]
    joined = join_outputs(parts)
    assert joined.codes.shape == (64, 16) and joined.scales.shape == (2, 16)
    np.testing.assert_array_equal(joined.dequantize(), np.concatenate([q.dequantize() for q in parts], axis=1))
    assert join_outputs([parts[0], quantize_groups(rng.standard_normal((64, 4)), 8, 32, symmetric)]) is None
    assert join_outputs([parts[0], quantize_groups(rng.standard_normal((64, 4)), 4, 64, symmetric)]) is None
    assert join_outputs([parts[0], quantize_groups(rng.standard_normal((64, 4)), 4, 32, not symmetric)]) is None
