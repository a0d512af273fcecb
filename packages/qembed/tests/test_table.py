from __future__ import annotations

import resource
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from qcore.errors import ConfigError, DataError
from qembed import quantize_npy, quantize_table


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
    big = np.abs(table) >= np.abs(table).max(axis=1, keepdims=True) * 2.0**-100
    assert (np.abs(back - table)[big] <= np.abs(table)[big] / 3 + 1e-12).all()
    assert (np.sign(back) == np.sign(table))[table != 0].all()


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


def test_npy_chunked_matches_in_memory(table, tmp_path):
    np.save(tmp_path / "t.npy", table)
    scales = quantize_npy(tmp_path / "t.npy", tmp_path / "q.npy", chunk_rows=128)
    whole = quantize_table(table, per_row=True)
    np.testing.assert_array_equal(np.load(tmp_path / "q.npy"), whole.codes)
    np.testing.assert_allclose(scales, whole.scales)
    np.testing.assert_allclose(np.load(tmp_path / "q.scales.npy"), whole.scales)


def test_npy_table_larger_than_rss_budget_stays_bounded(tmp_path):
    """A 256 MiB fp32 table is quantized in 16 MiB chunks; peak RSS grows far less than the table."""
    rows, dim = 1 << 20, 64
    path = tmp_path / "big.npy"
    big = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, dim))
    for start in range(0, rows, 1 << 16):
        big[start : start + (1 << 16)] = np.random.default_rng(start).normal(size=(1 << 16, dim))
    big.flush()
    del big
    script = textwrap.dedent(f"""
        import resource, numpy, qembed
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        qembed.quantize_npy({str(path)!r}, {str(tmp_path / 'q.npy')!r}, chunk_rows=65536)
        print(before, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    """)
    before, after = map(int, subprocess.check_output([sys.executable, "-c", script]).split())
    table_kib = rows * dim * 4 // 1024
    assert after - before < table_kib / 2, (before, after, table_kib)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss > 0
