"""GPTQ: its blocked, Cholesky-based updates equal the plain one-channel-at-a-time reference; it beats round to
nearest on the layer output; its bad input is one line."""

from __future__ import annotations

import numpy as np
import pytest

from qcore.errors import ConfigError, DataError
from qcore.groupwise import decode, encode, factor_steps, grid_of, group_grid, quantize_groups
from qptq.weight_only.gptq import gptq
from qptq.weight_only.hessian import HessianAccumulator


def _reference(weight, hessian, bits, group_size, symmetric, damp, act_order, clip=1.0, family="int"):
    """Optimal brain quantization as first written: after each channel, update the rest with the inverse
    Hessian and remove the channel from it (no Cholesky, no blocks)."""
    grid = grid_of(bits, symmetric, family, group_size)
    w, h = weight.astype(np.float64).copy(), hessian.astype(np.float64).copy()
    k, n = w.shape
    size = grid.step_channels(k if group_size == -1 else group_size)
    unit = grid.block if grid.sub is not None else size  # a K-quant block's steps are fixed together
    order = np.argsort(-np.diag(h), kind="stable") if act_order else np.arange(k)
    static = group_grid(w.reshape(k // size, size, n), grid, clip)
    w, h = w[order], h[np.ix_(order, order)]
    h[np.diag_indices(k)] += damp * np.mean(np.diag(h))
    hinv = np.linalg.inv(h)
    codes = np.zeros((k, n))
    grids = {}
    for i in range(k):
        g = order[i] // size
        if act_order:
            grids[g] = (static[0][g], None if static[1] is None else static[1][g])
        elif order[i] % unit == 0:
            step, zero = group_grid(w[i:i + unit].reshape(unit // size, size, n), grid)
            for j in range(unit // size):
                grids[g + j] = (step[j], None if zero is None else zero[j])
        step, zero = grids[g]
        codes[i] = encode(w[i], step, zero, grid)
        error = (w[i] - decode(codes[i], step, zero, grid)) / hinv[i, i]
        w[i + 1:] -= np.outer(hinv[i + 1:, i], error)
        hinv -= np.outer(hinv[:, i], hinv[i, :]) / hinv[i, i]
    out = np.zeros_like(codes)
    out[order] = codes
    return out


def _layer(rng, k=32, n=6, rows=200):
    mix = rng.standard_normal((k, k)) * 0.3 + np.eye(k)  # correlated inputs of unequal size
    x = rng.standard_normal((rows, k)) @ mix * rng.uniform(0.2, 3.0, k)
    return x, rng.standard_normal((k, n))


@pytest.mark.parametrize(("act_order", "symmetric", "group_size"), [(False, False, 8), (True, False, 8),
                                                                    (False, True, -1), (True, True, 16)])
def test_blocked_gptq_equals_the_one_channel_at_a_time_reference(act_order, symmetric, group_size):
    rng = np.random.default_rng(0)
    x, w = _layer(rng)
    acc = HessianAccumulator(32)
    for batch in np.array_split(x, 7):
        acc.update(batch)
    assert acc.hessian().dtype == np.float32  # summed in float64, handed out in float32
    np.testing.assert_allclose(acc.hessian(), 2 * x.T @ x / len(x), rtol=1e-6)
    got = gptq(w, acc.hessian(), bits=4, group_size=group_size, symmetric=symmetric, block_size=4,
               act_order=act_order)
    want = _reference(w, acc.hessian(), 4, group_size, symmetric, 0.01, act_order)
    np.testing.assert_array_equal(got.codes, want)


@pytest.mark.parametrize(("bits", "symmetric", "act_order"), [(4, True, True), (4, False, True), (5, True, False),
                                                             (5, False, True), (8, True, False)])
def test_gptq_on_gguf_blocks_equals_the_reference_and_keeps_float16_steps(bits, symmetric, act_order):
    rng = np.random.default_rng(4)
    x, w = _layer(rng, k=64, n=6, rows=300)
    h = 2 * x.T @ x / len(x)
    got = gptq(w, h, bits, 32, symmetric, block_size=16, act_order=act_order, family="gguf")
    np.testing.assert_array_equal(got.codes, _reference(w, h, bits, 32, symmetric, 0.01, act_order, family="gguf"))
    grid = grid_of(bits, symmetric, "gguf")
    assert got.grid == grid and got.codes.min() >= grid.lowest and got.codes.max() <= grid.highest
    for stored in (got.scales, got.offsets):
        if stored is not None:  # every step and offset is a float16 value, as the file stores it
            np.testing.assert_array_equal(stored.astype(np.float16).astype(np.float32), stored)
    assert (got.offsets is None) == symmetric and got.zero_points is None
    with pytest.raises(ConfigError, match=r"Q4_0 blocks hold 32 input channels; use group_size=32 \(got 16\)"):
        gptq(w, h, 4, 16, True, family="gguf")


@pytest.mark.parametrize(("bits", "act_order"), [(4, True), (4, False), (5, True), (6, True), (6, False)])
def test_gptq_on_k_quant_blocks_equals_the_reference_and_its_steps_are_the_files(bits, act_order):
    rng = np.random.default_rng(5)
    x, w = _layer(rng, k=512, n=4, rows=700)
    h = 2 * x.T @ x / len(x)
    grid = grid_of(bits, False, "gguf", 256)
    clip = np.where(rng.random((512 // grid.sub, 4)) < 0.5, 0.8, 1.0) if act_order else 1.0
    got = gptq(w, h, bits, 256, block_size=96, act_order=act_order, clip=clip, family="gguf")
    np.testing.assert_array_equal(got.codes, _reference(w, h, bits, 256, False, 0.01, act_order, clip, family="gguf"))
    assert got.grid == grid and got.group_size == grid.sub and got.scales.shape == (512 // grid.sub, 4)
    assert got.codes.min() >= grid.lowest and got.codes.max() <= grid.highest
    # steps (and offsets) are a float16 step per block of 256 times integer codes, the largest on the end code
    end = grid.sub_codes[1] if grid.sub_codes[0] == 0 else grid.sub_codes[0]
    for stored in (got.scales, None if got.offsets is None else -got.offsets):
        if stored is not None:
            _, codes = factor_steps(stored.T.reshape(4, 2, -1), grid)
            assert (codes == end).any(axis=-1).all()

    def error(q):
        return np.linalg.norm(x @ (q.dequantize() - w))

    assert error(got) < error(quantize_groups(w, bits, 256, clip=clip, family="gguf"))  # RTN on the same grids


def test_clipped_grids_fixed_up_front_are_the_reference_with_those_grids_and_searched_clips_help():
    from qptq.weight_only.clip_search import search_clip

    rng = np.random.default_rng(3)
    x, w = _layer(rng, k=64, n=16, rows=512)
    h = 2 * x.T @ x / len(x)
    clip = search_clip(w, h, 4, 16)
    assert clip.shape == (4, 16) and (clip < 1).any()
    got = gptq(w, h, 4, 16, block_size=8, clip=clip)
    np.testing.assert_array_equal(got.codes, _reference(w, h, 4, 16, False, 0.01, True, clip))
    np.testing.assert_allclose(got.scales, group_grid(w.reshape(4, 16, 16), grid_of(4, False), clip)[0], rtol=1e-6)

    def error(codes):
        return np.linalg.norm(x @ (codes.dequantize() - w)) / np.linalg.norm(x @ w)

    assert error(got) < error(gptq(w, h, 4, 16)), "searched clips lowered GPTQ's output error on this layer"
    with pytest.raises(ConfigError, match="clip applies to the grids act order fixes up front"):
        gptq(w, h, 4, 16, act_order=False, clip=clip)


def test_gptq_lowers_the_layer_output_error_of_round_to_nearest():
    rng = np.random.default_rng(1)
    x, w = _layer(rng, k=64, n=16, rows=512)
    acc = HessianAccumulator(64)
    acc.update(x)
    reference = x @ w

    def error(codes):
        return np.linalg.norm(x @ codes.dequantize() - reference) / np.linalg.norm(reference)

    rtn = error(quantize_groups(w, 4, 32))
    ordered = error(gptq(w, acc.hessian(), 4, 32))
    plain = error(gptq(w, acc.hessian(), 4, 32, act_order=False))
    assert ordered < 0.8 * rtn and plain < 0.9 * rtn, (rtn, plain, ordered)


def test_an_input_that_is_always_zero_gets_a_zero_weight():
    rng = np.random.default_rng(2)
    x, w = _layer(rng, k=16, n=4)
    x[:, 3] = 0
    q = gptq(w, 2 * x.T @ x / len(x), 4, 8)
    assert not q.dequantize()[3].any()


def test_bad_gptq_input_is_one_line():
    with pytest.raises(ConfigError, match=r"the Hessian has shape \(8, 8\); a \[16, 4\] weight needs \[16, 16\]"):
        gptq(np.ones((16, 4)), np.eye(8), 4, 8)
    with pytest.raises(DataError, match="no calibration rows reached this matmul"):
        HessianAccumulator(4).hessian()
    with pytest.raises(DataError, match="input has 3 channels; this matmul reads 4"):
        HessianAccumulator(4).update(np.ones((2, 3)))


@pytest.mark.parametrize(("bits", "family", "group_size"), [(4, "int", 32), (4, "gguf", 32), (4, "gguf", 256)])
def test_output_columns_quantized_apart_with_one_factor_equal_the_whole_weight(bits, family, group_size):
    """What lets ranks share out a weight's columns (:func:`qptq.weight_only.plan.column_split`): each column's
    codes depend on it and the factor alone, and the column errors concatenate to the whole weight's."""
    from qcore.groupwise import join_outputs
    from qptq.weight_only.gptq import factor_hessian
    from qptq.weight_only.hessian import column_errors

    rng = np.random.default_rng(3)
    x, w = _layer(rng, k=512, n=600, rows=1500)
    h = (2 * x.T @ x / len(x)).astype(np.float32)
    whole = gptq(w, h, bits, group_size, True, family=family)
    factor = factor_hessian(h)
    cuts = [0, 256, 512, 600]  # at multiples of plan.COLUMN_SHARE, as ranks share out columns
    parts = [gptq(w[:, lo:hi], h, bits, group_size, True, family=family, factor=factor)
             for lo, hi in zip(cuts, cuts[1:])]
    joined = join_outputs(parts)
    for field in ("codes", "scales", "zero_points", "offsets"):
        a, b = getattr(whole, field), getattr(joined, field)
        assert (a is None and b is None) or a.tobytes() == b.tobytes(), field
    d = whole.dequantize() - w.astype(np.float32)
    (full,) = column_errors([d], h)
    apart = np.concatenate([column_errors([d[:, lo:hi]], h)[0] for lo, hi in zip(cuts, cuts[1:])])
    assert full.tobytes() == apart.tobytes()
    assert np.sum(full) == pytest.approx(np.trace(d.T.astype(np.float64) @ h @ d), rel=1e-4)
