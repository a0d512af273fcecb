"""``.npy`` tables: crafted inputs are refused with DataError (never a crash), and a run never
replaces its input or a previous good output with a broken one."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qcore.errors import DataError, OutputError, QuantError
from qcore.outputs import STAGING_PREFIX
from qembed import quantize_npy, quantize_table
from qembed.table import QuantizedTable, dequantize_npy, load_quantized_npy

TABLE = np.random.default_rng(0).normal(0, 0.1, (100, 8)).astype(np.float32)
GOOD_HEADER = {"descr": "<f4", "fortran_order": False, "shape": (100, 8)}


def _raw_npy(path: Path, header: dict | str, data: bytes = TABLE.tobytes(), version: tuple[int, int] = (1, 0),
             magic: bytes = b"\x93NUMPY") -> Path:
    """Write a ``.npy`` file byte by byte, so any header can be crafted."""
    text = (header if isinstance(header, str) else repr(header)) + "\n"
    length = struct.pack("<H" if version == (1, 0) else "<I", len(text))
    path.write_bytes(magic + bytes(version) + length + text.encode() + data)
    return path


def _save(path: Path, array: np.ndarray, **kwargs: bool) -> Path:
    with open(path, "wb") as f:  # np.save(path) would append .npy to other names
        np.save(f, array, **kwargs)
    return path


def _state(directory: Path) -> dict[str, str]:
    """Name -> sha256 of every entry (directories, e.g. staging litter, hash as 'dir')."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(directory.iterdir())}


def _litter(directory: Path) -> list[Path]:
    return list(directory.glob(STAGING_PREFIX + "*"))


def _object_table(path: Path) -> Path:
    return _save(path, np.array([[1.5, "x"], [None, 3]], dtype=object), allow_pickle=True)


def _resized(path: Path, delta: int) -> Path:
    data = _save(path, TABLE).read_bytes()
    path.write_bytes(data[:delta] if delta < 0 else data + b"\0" * delta)
    return path


CRAFTED = {
    "object": (_object_table, "holds object values"),
    "complex": (lambda p: _save(p, TABLE.astype(np.complex64)), "holds complex64 values"),
    "structured": (lambda p: _save(p, np.zeros(4, [("a", "<f4"), ("b", "<i4")])), r"holds \[\('a'"),
    "strings": (lambda p: _save(p, np.array([["a", "b"]])), "holds <U1 values"),
    "bool": (lambda p: _save(p, TABLE > 0), "holds bool values"),
    "truncated": (lambda p: _resized(p, -3), "truncated or has trailing bytes"),
    "trailing bytes": (lambda p: _resized(p, 4), "truncated or has trailing bytes"),
    "huge shape": (lambda p: _raw_npy(p, {**GOOD_HEADER, "shape": (2**40, 2**40)}), "truncated"),
    "negative shape": (lambda p: _raw_npy(p, {**GOOD_HEADER, "shape": (-100, -8)}), r"shape \(-100, -8\)"),
    "bool in shape": (lambda p: _raw_npy(p, {**GOOD_HEADER, "shape": (True, 8)}), "shape"),
    "bad magic": (lambda p: _raw_npy(p, GOOD_HEADER, magic=b"\x93PICKLE"), "not a valid .npy file.*magic"),
    "version 9.0": (lambda p: _raw_npy(p, GOOD_HEADER, version=(9, 0)), "version 9.0"),
    "header not a dict": (lambda p: _raw_npy(p, "[1, 2]"), "not a valid .npy file"),
    "header garbage": (lambda p: _raw_npy(p, "__import__('os')"), "not a valid .npy file"),
    "bad descr": (lambda p: _raw_npy(p, {**GOOD_HEADER, "descr": "xyz"}), "not a valid .npy file"),
    "empty file": (lambda p: (p.write_bytes(b""), p)[1], "not a valid .npy file"),
    "fortran order": (lambda p: _save(p, np.asfortranarray(TABLE)), "Fortran-ordered"),
    "1-D": (lambda p: _save(p, TABLE.ravel()), "2-D"),
    "no rows": (lambda p: _save(p, TABLE[:0]), "non-empty 2-D"),
}


@pytest.mark.parametrize("case", sorted(CRAFTED))
def test_crafted_npy_is_refused_with_one_line(tmp_path, case):
    make, message = CRAFTED[case]
    src = make(tmp_path / "t.npy")
    with pytest.raises(DataError, match=message) as err:
        quantize_npy(src, tmp_path / "out" / "q.npy")
    assert "\n" not in str(err.value) and str(src) in str(err.value)
    assert not (tmp_path / "out").exists()


def test_missing_table_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="cannot read .*missing.npy"):
        quantize_npy(tmp_path / "missing.npy", tmp_path / "q.npy")


def test_object_table_fails_cleanly_in_a_fresh_process(tmp_path):
    """Reading an object array's bytes as pointers used to segfault: the process must exit normally."""
    src = _object_table(tmp_path / "obj.npy")
    script = textwrap.dedent(f"""
        import sys
        from qcore.errors import DataError
        from qembed import quantize_npy
        try:
            quantize_npy({str(src)!r}, {str(tmp_path / "q.npy")!r})
        except DataError as exc:
            print(exc)
            sys.exit(3)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode}"
    assert proc.returncode == 3 and "object" in proc.stdout, proc.stderr


def test_numeric_dtypes_and_header_versions_are_accepted(tmp_path):
    expected = quantize_table(TABLE, per_row=True).dequantize()
    sources = {
        "big-endian": _save(tmp_path / "be.npy", TABLE.astype(">f4")),
        "float64": _save(tmp_path / "f8.npy", TABLE.astype(np.float64)),
        "version 3.0": _raw_npy(tmp_path / "v3.npy", GOOD_HEADER, version=(3, 0)),
    }
    for name, src in sources.items():
        out = quantize_npy(src, tmp_path / f"q_{src.stem}.npy")
        np.testing.assert_array_equal(out.dequantize(), expected, err_msg=name)
    ints = np.arange(24, dtype=np.int16).reshape(6, 4) - 12
    out = quantize_npy(_save(tmp_path / "i2.npy", ints), tmp_path / "q_i2.npy")
    np.testing.assert_array_equal(out.dequantize(), quantize_table(ints, per_row=True).dequantize())


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_corrupted_bytes_never_crash(tmp_path, data):
    """Any byte of a valid file overwritten: the table is quantized or refused with a QuantError."""
    raw = bytearray(_save(tmp_path / "t.npy", TABLE[:4]).read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, 200))] = data.draw(st.integers(0, 255))
    (tmp_path / "bad.npy").write_bytes(raw)
    try:
        quantize_npy(tmp_path / "bad.npy", tmp_path / "q.npy")
    except QuantError as exc:
        assert "\n" not in str(exc)


# ---- outputs ------------------------------------------------------------------------------
@pytest.mark.parametrize("src_name, dst_name", [
    ("t.npy", "t.npy"), ("q.scales.npy", "q.npy"), ("q.qembed.json", "q.npy"),
])
def test_outputs_never_replace_the_input(tmp_path, src_name, dst_name):
    src = _save(tmp_path / src_name, TABLE)
    before = _state(tmp_path)
    with pytest.raises(OutputError, match=f"would overwrite the input .*{src_name}; choose another output name"):
        quantize_npy(src, tmp_path / dst_name)
    assert _state(tmp_path) == before


def test_the_input_by_another_path_or_hard_link_is_refused(tmp_path):
    src = _save(tmp_path / "t.npy", TABLE)
    (tmp_path / "sub").mkdir()
    os.link(src, tmp_path / "link.npy")
    before = _state(tmp_path)
    for dst in (tmp_path / "sub" / ".." / "t.npy", tmp_path / "link.npy"):
        with pytest.raises(OutputError, match="would overwrite the input"):
            quantize_npy(src, dst)
    with pytest.raises(OutputError, match="is a directory"):
        quantize_npy(src, tmp_path / "sub")
    assert _state(tmp_path) == before


def test_dequantize_never_replaces_its_inputs(tmp_path):
    quantize_npy(_save(tmp_path / "t.npy", TABLE), tmp_path / "q.npy")
    before = _state(tmp_path)
    for dst in ("q.npy", "q.scales.npy", "q.qembed.json"):
        with pytest.raises(OutputError, match="would overwrite the input"):
            dequantize_npy(tmp_path / "q.npy", tmp_path / dst)
    assert _state(tmp_path) == before


@pytest.mark.parametrize("per_row", [True, False])
def test_nan_in_the_last_chunk_leaves_the_previous_output_as_it_was(tmp_path, per_row):
    quantize_npy(_save(tmp_path / "good.npy", TABLE), tmp_path / "q.npy", per_row=per_row, chunk_rows=16)
    bad = -TABLE
    bad[-1, -1] = np.nan
    _save(tmp_path / "bad.npy", bad)
    before = _state(tmp_path)
    with pytest.raises(DataError, match="1 NaN/Inf"):
        quantize_npy(tmp_path / "bad.npy", tmp_path / "q.npy", per_row=per_row, chunk_rows=16)
    assert _state(tmp_path) == before  # byte-identical, and no staging litter
    expected = quantize_table(TABLE, per_row=per_row).dequantize()
    np.testing.assert_array_equal(load_quantized_npy(tmp_path / "q.npy").dequantize(), expected)


def test_a_failed_dequantize_leaves_the_previous_file(tmp_path, monkeypatch):
    quantize_npy(_save(tmp_path / "t.npy", TABLE), tmp_path / "q.npy")
    dequantize_npy(tmp_path / "q.npy", tmp_path / "back.npy", chunk_rows=10)
    before = _state(tmp_path)
    real_rows = QuantizedTable.rows
    calls: list[int] = []

    def rows_then_fail(self: QuantizedTable, ids: np.ndarray) -> np.ndarray:
        calls.append(1)
        if len(calls) > 3:
            raise DataError("simulated failure mid-way")
        return real_rows(self, ids)

    monkeypatch.setattr(QuantizedTable, "rows", rows_then_fail)
    with pytest.raises(DataError, match="simulated"):
        dequantize_npy(tmp_path / "q.npy", tmp_path / "back.npy", chunk_rows=10)
    assert _state(tmp_path) == before


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_outputs_follow_the_umask_and_leave_no_litter(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        quantize_npy(_save(tmp_path / "t.npy", TABLE), tmp_path / "out" / "q.npy", bits=4)
        dequantize_npy(tmp_path / "out" / "q.npy", tmp_path / "out" / "back.npy")
    finally:
        os.umask(old)
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["back.npy", "q.npy", "q.qembed.json", "q.scales.npy"]
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert set(modes.values()) == {mode}, modes
    assert not _litter(out)


# ---- reading a quantized table back -----------------------------------------------------
def _meta(**change: object) -> dict[str, object]:
    return {**{"quantize_type": "abs_max", "bits": 8, "dim": 8, "packed": False}, **change}


BAD_META = {
    "not json": ("{", "cannot read"),
    "a list": ([], "JSON object with the keys"),
    "missing key": ({"quantize_type": "abs_max", "bits": 8, "dim": 8}, "JSON object with the keys"),
    "extra key": (_meta(scale=1.0), "JSON object with the keys"),
    "unknown type": (_meta(quantize_type="lin"), "quantize_type='lin' is not valid"),
    "bits as str": (_meta(bits="8"), "bits='8' is not valid"),
    "bits 9": (_meta(bits=9), "bits=9 is not valid"),
    "bits as bool": (_meta(bits=True), "bits=True"),
    "dim 0": (_meta(dim=0), "dim=0"),
    "dim mismatch": (_meta(dim=9), r"int8 codes of shape \(rows, 9\)"),
    "packed as str": (_meta(packed="no"), "packed='no'"),
    "packed 8 bits": (_meta(packed=True), r"packed=True .*bits <= 4"),
}


@pytest.mark.parametrize("case", sorted(BAD_META))
def test_bad_meta_is_a_data_error(tmp_path, case):
    quantize_npy(_save(tmp_path / "t.npy", TABLE), tmp_path / "q.npy")
    meta, message = BAD_META[case]
    (tmp_path / "q.qembed.json").write_text(meta if isinstance(meta, str) else json.dumps(meta))
    with pytest.raises(DataError, match=message) as err:
        load_quantized_npy(tmp_path / "q.npy")
    assert "\n" not in str(err.value) and "re-create the table with qembed.quantize_npy" in str(err.value)


BAD_FILES = {
    "object codes": ("q.npy", _object_table, "holds object values"),
    "float codes": ("q.npy", lambda p: _save(p, TABLE), "holds float32 codes"),
    "fewer scales": ("q.scales.npy", lambda p: _save(p, np.ones(99, np.float32)), r"shape \(99,\)"),
    "float64 scales": ("q.scales.npy", lambda p: _save(p, np.ones(100)), "float64 scales"),
    "object scales": ("q.scales.npy", _object_table, "holds object values"),
    "nan scale": ("q.scales.npy", lambda p: _save(p, np.full(100, np.nan, np.float32)), "non-finite"),
    "no scales": ("q.scales.npy", lambda p: p.unlink(), "cannot read"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_codes_and_scales_are_checked_against_the_meta(tmp_path, case):
    quantize_npy(_save(tmp_path / "t.npy", TABLE), tmp_path / "q.npy")
    name, spoil, message = BAD_FILES[case]
    spoil(tmp_path / name)
    with pytest.raises(DataError, match=message):
        load_quantized_npy(tmp_path / "q.npy")
