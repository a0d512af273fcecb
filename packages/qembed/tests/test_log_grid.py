"""The log grid: codes, its error bound, the fitted spacing, and log tables on disk."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from qcore.errors import ConfigError, DataError
from qcore.quant import LN2, fit_log_step, log_dequantize, log_error_bound, log_levels, log_quantize, qmax
from qembed import quantize_npy, quantize_table
from qembed.table import load_quantized_npy

RNG = np.random.default_rng(7)
# values spread over 24 octaves, so every level of a fine grid is hit many times
SPREAD = (RNG.standard_normal((400, 64)) * 2.0 ** RNG.uniform(-24, 0, (400, 64))).astype(np.float32)
STEPS = [LN2, LN2 / 3, LN2 / 8, LN2 / 16, LN2 / 32]


def nearest_level(ratio: np.ndarray, bits: int, step: float) -> np.ndarray:
    """Plain reference: the nearest of 0 and the levels to each |ratio| (ties to the larger)."""
    levels = np.concatenate([[0.0], log_levels(bits, step)])
    dist = np.abs(np.abs(ratio)[..., None] - levels)
    best = np.where(dist <= dist.min(-1, keepdims=True), levels, -1.0).max(-1)
    return np.copysign(best, ratio)


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("bits", [8, 5])
def test_relative_error_within_the_half_step_bound(step, bits):
    """Down to the smallest level, every value is off by at most tanh(step/2) (+ the 2**-8 key slack)."""
    codes, meta = log_quantize(SPREAD, bits, axis=0, step=step)
    assert codes.dtype == np.int8 and np.abs(codes).max() <= qmax(bits)
    back = log_dequantize(codes, meta)
    ratio = np.abs(SPREAD) / meta["absmax"][:, None]
    in_grid = ratio >= log_levels(bits, step)[-1]
    rel = np.abs(back - SPREAD)[in_grid] / np.abs(SPREAD)[in_grid]
    assert rel.max() <= log_error_bound(step) + 1e-6
    assert rel.max() > 0.9 * math.tanh(step / 2)  # the bound is nearly reached: not vacuous
    assert (np.sign(back) == np.sign(SPREAD))[back != 0].all()


@pytest.mark.parametrize("step", STEPS)
def test_codes_are_the_nearest_level_but_near_a_midpoint(step):
    """The table lookup picks the nearest level; only values within 2**-8 of a midpoint may differ."""
    codes, meta = log_quantize(SPREAD, 8, step=step)
    ratio = SPREAD.astype(np.float64) / meta["absmax"]
    back = log_dequantize(codes, meta) / meta["absmax"]
    expected = nearest_level(ratio, 8, step)
    levels = np.concatenate([[0.0], log_levels(8, step)[::-1]])
    midpoints = (levels[1:] + levels[:-1]) / 2
    near_midpoint = (np.abs(np.abs(ratio)[..., None] - midpoints) <= 2.0**-8 * np.abs(ratio)[..., None]).any(-1)
    np.testing.assert_allclose(back[~near_midpoint], expected[~near_midpoint], rtol=1e-6)
    assert (~near_midpoint).mean() > 0.5


def test_one_level_per_octave_splits_exactly_at_three_quarters():
    """step = ln 2 is the power-of-two grid: the decision points are exact in float32."""
    x = np.array([[1.0, 0.75, np.nextafter(np.float32(0.75), 0), 0.375, 0.25, 2.0**-126 * 0.75]], np.float32)
    codes, _ = log_quantize(x, 8)
    np.testing.assert_array_equal(codes, [[1, 1, 2, 2, 3, 127]])


def test_fitted_spacing_beats_the_power_of_two_grid_and_a_fixed_fine_grid():
    table = np.random.default_rng(0).normal(0, 0.05, (600, 50)).astype(np.float32)  # small: fitted on all rows
    step = fit_log_step(table, 8, axis=0)
    assert step in [LN2 / 2.0 ** (i / 4) for i in range(-8, 21)]

    def err(s: float) -> float:
        codes, meta = log_quantize(table, 8, axis=0, step=s)
        return float(np.linalg.norm(log_dequantize(codes, meta) - table) / np.linalg.norm(table))

    assert err(step) <= 1.001 * min(err(LN2), err(LN2 / 8), err(LN2 / 32))
    assert err(step) < err(LN2) / 5
    q = quantize_table(table, "log", 8, per_row=True)
    assert q.log_step == step and err(step) == pytest.approx(
        np.linalg.norm(q.dequantize() - table) / np.linalg.norm(table), rel=1e-5)


def test_log_table_on_disk_keeps_its_grid(tmp_path):
    table = np.random.default_rng(3).normal(0, 1, (300, 12)).astype(np.float32)
    np.save(tmp_path / "t.npy", table)
    on_disk = quantize_npy(tmp_path / "t.npy", tmp_path / "q.npy", "log", 8, per_row=False, chunk_rows=64)
    meta = json.loads((tmp_path / "q.qembed.json").read_text())
    whole = quantize_table(table, "log", 8)
    assert meta["log_step"] == on_disk.log_step == whole.log_step != LN2
    np.testing.assert_array_equal(on_disk.dequantize(), whole.dequantize())


@pytest.mark.parametrize("change,message", [
    ({"log_step": None}, "log_step=None is not valid"),
    ({"log_step": 0}, "log_step=0 is not valid"),
    ({"log_step": "0.1"}, "log_step='0.1' is not valid"),
])
def test_bad_log_meta_is_a_data_error(tmp_path, change, message):
    np.save(tmp_path / "t.npy", SPREAD)
    quantize_npy(tmp_path / "t.npy", tmp_path / "q.npy", "log")
    meta_file = tmp_path / "q.qembed.json"
    meta_file.write_text(json.dumps({**json.loads(meta_file.read_text()), **change}))
    with pytest.raises(DataError, match=message):
        load_quantized_npy(tmp_path / "q.npy")
    meta = json.loads(meta_file.read_text())
    del meta["log_step"]
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(DataError, match="keys quantize_type, bits, dim, packed, log_step"):
        load_quantized_npy(tmp_path / "q.npy")


def test_bad_log_step():
    for step in (0, -1.0, math.inf, math.nan, True, "0.1"):
        with pytest.raises(ConfigError, match="log step"):
            quantize_table(SPREAD, "log", log_step=step)
    with pytest.raises(ConfigError, match="log step"):
        log_quantize(SPREAD, step=0.0)
