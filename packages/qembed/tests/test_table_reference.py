"""The fast paths of the table API (rounding by adding 1.5 * 2**23, reduceat row maxima, one-pass dequantization)
give byte for byte what the plain numpy formulas give: codes ``clip(rint(x / step), -qmax, qmax)`` in float32,
``step`` the row's (or table's) abs max / qmax, and rows ``codes.astype(float32) * scale (+ offset)``."""

from __future__ import annotations

import numpy as np
import pytest

from qembed import quantize_npy, quantize_table
from qembed.table import QuantizedTable, load_quantized_npy, searched_rows, unpack_int4


def _table(rows: int, dim: int, bits: int = 8) -> np.ndarray:
    t = np.random.default_rng(7).normal(0, 0.1, (rows, dim)).astype(np.float32)
    t[1] = 0  # an all-zero row: step 1, codes 0
    qm = 2 ** (bits - 1) - 1  # row 2: abs max qm / 64, so its step is 1 / 64 and (k + 0.5) / 64 are exact ties
    t[2] = np.clip((np.arange(dim) - dim // 2 + 0.5) / 64, -qm / 64, qm / 64)
    t[2, 0] = -qm / 64
    t[3, :2] = [-0.0, 1e-40]  # negative zero and a denormal
    return t


def _reference(table: np.ndarray, bits: int, per_row: bool, threshold: float | None) -> tuple[np.ndarray, np.ndarray]:
    qm = 2 ** (bits - 1) - 1
    top = np.abs(table).max(axis=1) if per_row else np.abs(table).max(keepdims=True)
    if threshold:
        top = np.minimum(top, np.float32(threshold))
    scales = (top / np.float32(qm)).astype(np.float32)
    step = np.where(scales > 0, scales, np.float32(1))
    codes = np.rint(table / (step[:, None] if per_row else step[0]))
    if threshold:
        codes = np.clip(codes, -qm, qm)
    return codes.astype(np.int8), scales


CASES = [(8, True, None), (8, False, None), (4, True, None), (2, False, None), (8, True, 0.02), (8, False, 1e-30),
         (4, True, 0.05), (3, True, None)]


@pytest.mark.parametrize(("bits", "per_row", "threshold"), CASES)
@pytest.mark.parametrize("dim", [64, 7])
def test_quantize_table_equals_the_numpy_formula(bits, per_row, threshold, dim):
    table = _table(500, dim, bits)
    q = quantize_table(table, "abs_max", bits, per_row, threshold)
    codes, scales = _reference(table, bits, per_row, threshold)
    assert q.codes.tobytes() == codes.tobytes() and q.scales.tobytes() == scales.tobytes()
    if per_row and not threshold:  # row 2's ties went to the even code
        assert scales[2] == 1 / 64 and ((table[2] * 64) % 1 == 0.5).sum() >= 3
        assert (q.codes[2][(table[2] * 64) % 1 == 0.5] % 2 == 0).all()


@pytest.mark.parametrize(("bits", "per_row"), [(8, True), (4, True), (8, False)])
def test_quantize_npy_files_equal_the_numpy_formula_chunk_by_chunk(tmp_path, bits, per_row):
    table = _table(3000, 48)
    np.save(tmp_path / "t.npy", table)
    q = quantize_npy(tmp_path / "t.npy", tmp_path / "q.npy", "abs_max", bits, per_row, chunk_rows=700)
    codes, scales = _reference(table, bits, per_row, None)
    stored = unpack_int4(np.load(tmp_path / "q.npy"), 48) if bits == 4 else np.load(tmp_path / "q.npy")
    assert stored.tobytes() == codes.tobytes()
    assert np.load(tmp_path / "q.scales.npy").tobytes() == scales.tobytes()
    assert q.rows(np.arange(3000)).tobytes() == (codes.astype(np.float32) * (scales[:, None] if per_row else scales[0])
                                                 ).tobytes()


@pytest.mark.parametrize("kind", ["int8 per-row", "int4 packed", "one scale", "offsets"])
def test_rows_of_a_memory_mapped_table_equal_the_numpy_formula(tmp_path, kind):
    table = _table(1000, 33)
    if kind == "offsets":
        q = searched_rows(table, 4, affine=True)
    else:
        np.save(tmp_path / "t.npy", table)
        quantize_npy(tmp_path / "t.npy", tmp_path / "q.npy", bits=4 if kind == "int4 packed" else 8,
                     per_row=kind != "one scale")
        q = load_quantized_npy(tmp_path / "q.npy")
        assert isinstance(q.codes, np.memmap)
    ids = np.random.default_rng(8).integers(0, 1000, (64, 5))
    codes = unpack_int4(np.asarray(q.codes), 33) if q.packed else np.asarray(q.codes)
    expected = codes[ids].astype(np.float32) * (q.scales[ids][..., None] if q.per_row else q.scales[0])
    if q.offsets is not None:
        expected += q.offsets[ids][..., None]
    assert isinstance(q, QuantizedTable) and q.rows(ids).tobytes() == expected.tobytes()
    assert q.rows(np.zeros((0,), np.int64)).shape == (0, 33)
