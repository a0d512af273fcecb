from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from qcore.errors import ConfigError, DataError
from qcore.quant import log_error_bound, qmax, quantize
from qembed import choose_table_quantization, quantize_npy, quantize_table
from qembed.table import dequantize_npy, load_quantized_npy, pack_int4, unpack_int4


@pytest.fixture(scope="module")
def table() -> np.ndarray:
    rng = np.random.default_rng(0)
    t = rng.normal(0, 0.05, (1000, 16)).astype(np.float32)
    t[:10] *= 20  # a few hot rows with large norms, as real tables have
    return t


def test_abs_max_whole_table_hand_computed():
    q = quantize_table(np.array([[-1.0, 0.5], [0.25, 0.0]], np.float32))
    np.testing.assert_array_equal(q.codes, [[-127, 64], [32, 0]])
    np.testing.assert_allclose(q.scales, [1 / 127])
    np.testing.assert_allclose(q.rows([1, 0]), [[32 / 127, 0.0], [-1.0, 64 / 127]], rtol=1e-6)


@pytest.mark.parametrize("bits", [8, 4])
def test_abs_max_error_bound_and_per_row_beats_whole_table(table, bits):
    whole = quantize_table(table, bits=bits)
    per_row = quantize_table(table, bits=bits, per_row=True)
    ids = np.arange(len(table))
    for q in (whole, per_row):
        step = q.scales if q.scales.size == 1 else q.scales[:, None]
        assert (np.abs(q.rows(ids) - table) <= step / 2 + 1e-7).all()
    assert per_row.scales.shape == (len(table),)
    err_whole = np.abs(whole.rows(ids) - table).mean()
    err_row = np.abs(per_row.rows(ids) - table).mean()
    assert err_row < err_whole / 3  # hot rows no longer set the step of every row


def test_log_round_trip_relative_error(table):
    q = quantize_table(table, "log", bits=8, per_row=True)
    back = q.rows(np.arange(len(table)))
    smallest = math.exp(-q.log_step * (qmax(8) - 1))  # the smallest level, as a fraction of the row's abs max
    in_grid = np.abs(table) >= np.abs(table).max(axis=1, keepdims=True) * smallest
    assert in_grid.mean() > 0.9  # the fitted grid lets the smallest few percent fall to 0 or its last level
    assert (np.abs(back - table)[in_grid] <= np.abs(table)[in_grid] * (log_error_bound(q.log_step) + 1e-6)).all()
    assert (np.sign(back) == np.sign(table))[back != 0].all()
    assert np.linalg.norm(back - table) / np.linalg.norm(table) < 0.02


def test_threshold_clips_before_quantizing(table):
    q = quantize_table(table, threshold=0.1)
    assert q.scales[0] == pytest.approx(0.1 / 127)
    assert np.abs(q.rows(np.arange(len(table)))).max() == pytest.approx(0.1, rel=1e-6)


def test_lookup_shapes_and_bad_ids(table):
    q = quantize_table(table, per_row=True)
    assert q.rows([[1, 2, 3], [4, 5, 6]]).shape == (2, 3, 16)
    with pytest.raises(DataError, match="ids must be in"):
        q.rows([1000])


def test_bad_input():
    with pytest.raises(ConfigError, match="did you mean 'abs_max'"):
        quantize_table(np.ones((2, 2)), "abs_maxx")
    with pytest.raises(ConfigError, match="quantize_bits"):
        quantize_table(np.ones((2, 2)), bits=1)
    with pytest.raises(ConfigError, match="quantize_bits"):
        quantize_table(np.ones((2, 2)), "log", bits=9)
    with pytest.raises(DataError, match="2-D"):
        quantize_table(np.ones(3))
    with pytest.raises(DataError, match="NaN|finite"):
        quantize_table(np.array([[np.nan, 1.0]]))


def test_float32_codes_match_qcore_quantize(table):
    """The fast float32 path follows qcore.quant's convention; only exact ties may differ by one."""
    for per_row in (False, True):
        q = quantize_table(table, per_row=per_row)
        reference = quantize(table, q.scales if per_row else q.scales[0], 8, 0 if per_row else None)
        diff = np.abs(q.codes.astype(int) - reference)
        assert diff.max() <= 1 and (diff == 0).mean() > 0.9999


def test_sixteen_bit_codes(table):
    q = quantize_table(table, bits=16, per_row=True)
    assert q.codes.dtype == np.int16 and np.abs(q.codes).max() == 32767
    assert np.abs(q.dequantize() - table).max() <= q.scales.max() / 2 * 1.001


@pytest.mark.parametrize("dim", [16, 15])
def test_int4_packing_round_trip(table, dim):
    q = quantize_table(table[:, :dim], bits=4, per_row=True)
    assert np.abs(q.codes).max() == 7
    packed = q.packed_int4()
    assert packed.codes.dtype == np.uint8 and packed.codes.shape == (len(table), (dim + 1) // 2)
    np.testing.assert_array_equal(unpack_int4(pack_int4(q.codes), dim), q.codes)
    np.testing.assert_array_equal(packed.rows([5, 3, 999]), q.rows([5, 3, 999]))
    with pytest.raises(DataError, match="4 bits"):
        quantize_table(table, bits=8).packed_int4()


def test_auto_granularity_is_measured(table):
    skewed = choose_table_quantization(table)  # hot rows: per-row scales win clearly
    assert skewed.per_row and skewed.per_row_error < 0.3 * skewed.whole_table_error
    even = np.random.default_rng(2).uniform(-1, 1, (50, 8)).astype(np.float32)
    even[:, 0] = 1.0
    flat = choose_table_quantization(even)  # every row has the same abs max: nothing to gain
    assert not flat.per_row and flat.per_row_error == pytest.approx(flat.whole_table_error)
    assert flat.table.scales.shape == (1,)


@pytest.mark.parametrize("quantize_type,bits,per_row", [
    ("abs_max", 8, True), ("abs_max", 8, False), ("abs_max", 4, True), ("log", 8, True), ("log", 6, False),
])
def test_npy_chunked_matches_in_memory(table, tmp_path, quantize_type, bits, per_row):
    np.save(tmp_path / "t.npy", table)
    on_disk = quantize_npy(tmp_path / "t.npy", tmp_path / "q.npy", quantize_type, bits, per_row, chunk_rows=128)
    whole = quantize_table(table, quantize_type, bits, per_row)
    ids = np.array([[0, 999], [17, 5]])
    np.testing.assert_array_equal(on_disk.rows(ids), whole.rows(ids))
    np.testing.assert_allclose(on_disk.scales, whole.scales)
    assert isinstance(on_disk.codes, np.memmap)
    assert on_disk.packed == (bits <= 4)
    np.testing.assert_array_equal(load_quantized_npy(tmp_path / "q.npy").dequantize(), whole.dequantize())
    dequantize_npy(tmp_path / "q.npy", tmp_path / "back.npy", chunk_rows=100)
    np.testing.assert_array_equal(np.load(tmp_path / "back.npy"), whole.dequantize())


def test_npy_bad_input(tmp_path):
    bad = np.ones((10, 4), np.float32)
    bad[7, 1] = np.nan
    np.save(tmp_path / "bad.npy", bad)
    with pytest.raises(DataError, match="1 NaN/Inf"):
        quantize_npy(tmp_path / "bad.npy", tmp_path / "q.npy", chunk_rows=3)
    np.save(tmp_path / "one.npy", np.ones(3, np.float32))
    with pytest.raises(DataError, match="2-D"):
        quantize_npy(tmp_path / "one.npy", tmp_path / "q.npy")
    with pytest.raises(DataError, match="not written by qembed"):
        load_quantized_npy(tmp_path / "one.npy")


def test_npy_table_four_times_the_memory_budget_stays_bounded(tmp_path):
    """A 256 MiB fp32 table with a 64 MiB budget: peak RSS grows by less than the budget."""
    rows, dim = 1 << 20, 64
    path = tmp_path / "big.npy"
    big = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, dim))
    for start in range(0, rows, 1 << 16):
        big[start : start + (1 << 16)] = np.random.default_rng(start).normal(size=(1 << 16, dim))
    big.flush()
    del big
    script = textwrap.dedent(f"""
        import numpy, qembed
        def hwm():  # peak RSS (KiB) of this process image; ru_maxrss would carry pytest's over exec
            return int(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM")))
        before = hwm()
        q = qembed.quantize_npy({str(path)!r}, {str(tmp_path / 'q.npy')!r}, chunk_rows=16384)
        print(before, hwm())
    """)
    before, after = map(int, subprocess.check_output([sys.executable, "-c", script]).split())
    budget_kib = rows * dim * 4 // 1024 // 4
    assert 0 < after - before < budget_kib, (before, after, budget_kib)  # > 0: the measure is live
    assert (tmp_path / "q.npy").stat().st_size < rows * dim * 1.01


# ---- scale_dtype="float16": per-row scales and offsets stored in 2 bytes -----------------------------------
@pytest.mark.parametrize("quantize_type,bits", [("abs_max", 8), ("abs_max", 6), ("log", 8)])
def test_float16_scales_are_rounded_up_and_the_codes_use_them(table, quantize_type, bits):
    full = quantize_table(table, quantize_type, bits, per_row=True)
    half = quantize_table(table, quantize_type, bits, per_row=True, scale_dtype="float16")
    assert half.scales.dtype == np.float16 and half.scale_dtype == "float16" and full.scale_dtype == "float32"
    widened = half.scales.astype(np.float32)
    assert (widened >= full.scales).all() and (widened <= full.scales * (1 + 2.0**-10)).all()
    assert (widened > full.scales).any()  # rounding happened, so the codes below are not the float32 ones
    if quantize_type == "abs_max":  # codes computed against the float16 scale: no code leaves +-qmax
        np.testing.assert_array_equal(half.codes, np.rint(table / widened[:, None]))
        assert np.abs(half.codes).max() <= qmax(bits)
        np.testing.assert_array_equal(half.rows([3, 0]), half.codes[[3, 0]] * widened[[3, 0], None])
    assert half.stored_bytes == full.stored_bytes - 2 * len(table)
    assert relative_error_of(table, half) < 1.01 * relative_error_of(table, full)


def relative_error_of(table, q) -> float:
    return float(np.linalg.norm(q.dequantize() - table) / np.linalg.norm(table))


@pytest.mark.parametrize("bits,asymmetric", [(4, False), (4, True), (2, True)])
def test_float16_few_bit_rows_with_offsets(table, bits, asymmetric):
    full = choose_table_quantization(table, "abs_max", bits, True, None, asymmetric).table
    half = choose_table_quantization(table, "abs_max", bits, True, None, asymmetric, scale_dtype="float16").table
    assert half.scales.dtype == np.float16 and (half.offsets is None or half.offsets.dtype == np.float16)
    assert (half.offsets is None) == (not asymmetric)
    ids = np.array([[5, 0], [999, 17]])
    codes = half.codes[ids].astype(np.float32)
    expected = codes * half.scales[ids].astype(np.float32)[..., None]
    if asymmetric:
        expected += half.offsets[ids].astype(np.float32)[..., None]
    np.testing.assert_array_equal(half.rows(ids), expected)
    assert half.stored_bytes == full.stored_bytes - (4 if asymmetric else 2) * len(table)
    assert relative_error_of(table, half) < 1.02 * relative_error_of(table, full)


def test_float16_whole_table_scale_stays_float32(table):
    q = quantize_table(table, bits=8, per_row=False, scale_dtype="float16")
    np.testing.assert_array_equal(q.codes, quantize_table(table, bits=8).codes)
    assert q.scales.dtype == np.float32 and q.stored_bytes == table.size + 4


def test_float16_scale_limits(table):
    tiny = table.copy()
    tiny[4] *= 1e-6  # its scale is below float16's smallest normal (6.1e-5): a subnormal, rounded up
    q = quantize_table(tiny, bits=8, per_row=True, scale_dtype="float16")
    assert 0 < q.scales[4] < np.finfo(np.float16).tiny and np.abs(q.codes[4]).max() <= 127
    np.testing.assert_allclose(q.rows([4])[0], tiny[4], atol=float(q.scales[4]) / 2 + 1e-12)
    huge = table.copy()
    huge[7, 3] = 127 * 70000.0  # scale 70000 > 65504
    with pytest.raises(DataError, match=r"per-row scale of 70000, beyond float16's 65504; use scale_dtype='float32'"):
        quantize_table(huge, bits=8, per_row=True, scale_dtype="float16")
    with pytest.raises(ConfigError, match="scale_dtype='bf16' is not valid"):
        quantize_table(table, per_row=True, scale_dtype="bf16")


@pytest.mark.parametrize("bits,per_row", [(8, True), (4, True), (8, False)])
def test_npy_float16_scales(table, tmp_path, bits, per_row):
    np.save(tmp_path / "t.npy", table)
    q = quantize_npy(tmp_path / "t.npy", tmp_path / "q.npy", bits=bits, per_row=per_row, chunk_rows=100,
                     scale_dtype="float16")
    whole = quantize_table(table, bits=bits, per_row=per_row, scale_dtype="float16")
    meta = json.loads((tmp_path / "q.qembed.json").read_text())
    scales = np.load(tmp_path / "q.scales.npy")
    if per_row:  # the json says so; a whole-table scale is one float32, as without the option
        assert meta["scale_dtype"] == "float16" and scales.dtype == np.float16
        assert (tmp_path / "q.scales.npy").stat().st_size == 128 + 2 * len(table)
    else:
        assert "scale_dtype" not in meta and scales.dtype == np.float32
    np.testing.assert_array_equal(q.scales, whole.scales)
    np.testing.assert_array_equal(load_quantized_npy(tmp_path / "q.npy").dequantize(), whole.dequantize())
    if per_row:  # a scales file that does not match its json is refused
        np.save(tmp_path / "q.scales.npy", scales.astype(np.float32))
        with pytest.raises(DataError, match="needs float16"):
            load_quantized_npy(tmp_path / "q.npy")


def test_npy_files_without_scale_dtype_still_load(table, tmp_path):
    """Tables written before the option: their json has no scale_dtype, their scales are float32."""
    np.save(tmp_path / "t.npy", table)
    quantize_npy(tmp_path / "t.npy", tmp_path / "q.npy", bits=8, per_row=True)
    meta = json.loads((tmp_path / "q.qembed.json").read_text())
    assert "scale_dtype" not in meta
    np.testing.assert_array_equal(load_quantized_npy(tmp_path / "q.npy").dequantize(),
                                  quantize_table(table, bits=8, per_row=True).dequantize())
    (tmp_path / "q.qembed.json").write_text(json.dumps({**meta, "scale_dtype": "int8"}))
    with pytest.raises(DataError, match="scale_dtype='int8' is not valid"):
        load_quantized_npy(tmp_path / "q.npy")
