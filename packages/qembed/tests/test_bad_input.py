"""Issue 14's bad inputs, through the program API (both IRs) and the table API.

Each is refused with one line naming the problem and the fix, and changes nothing: the program and
the scope stay as they were, no file or directory is written. All-zero rows (a padding row) and an
odd dimension at 4 bits are valid and are checked to work.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from qcore.errors import ConfigError, DataError, GraphError, QuantError
from qembed import quant_embedding, quant_embedding_model, quantize_npy, quantize_table
from qembed.table import choose_table_quantization

FAMILIES = ("legacy", "pir")
TABLE = np.random.default_rng(0).uniform(-0.5, 0.5, (100, 8)).astype(np.float32)
WORD = np.array([[3], [0], [99]], np.int64)


@pytest.fixture(autouse=True)
def _dynamic_afterwards():
    yield
    paddle.disable_static()


def _with(**cells: float) -> np.ndarray:
    """TABLE with some cells set: {'r_c': value}."""
    table = TABLE.copy()
    for key, value in cells.items():
        row, col = map(int, key[1:].split("_"))
        table[row, col] = value
    return table


BAD_TABLES = {  # name -> (table, what the message says)
    "NaN": (_with(r5_3=np.nan), r"table 'emb': .*1 NaN/Inf value\(s\); clean the table first"),
    "Inf": (_with(r0_0=np.inf, r9_1=-np.inf), r"table 'emb': .*2 NaN/Inf value\(s\); clean the table first"),
    "all zeros": (np.zeros_like(TABLE), r"table 'emb': .*all zeros.*load its trained values first"),
    "float16": (TABLE.astype(np.float16), r"table 'emb' is float16; .*cast the model to float32 first"),
    "float64": (TABLE.astype(np.float64), r"table 'emb' is float64; .*cast the model to float32 first"),
}
BAD_CONFIGS = {  # name -> (config, error, what the message says)
    "threshold 0": ({"threshold": 0}, ConfigError, "threshold=0 is not valid; valid choices: None or a finite"),
    "threshold < 0": ({"threshold": -0.5}, ConfigError, "threshold=-0.5 is not valid"),
    "threshold NaN": ({"threshold": float("nan")}, ConfigError, "threshold=nan is not valid"),
    "not a table": ({"params_name": "fc_w"}, GraphError,
                    "'fc_w' .*is not the table of any .* op; give params_name one of the tables found: emb$"),
}


def _state(p):
    """The program's text and every scope variable's value: what a refused call must leave alone."""
    program = p.main.desc.serialize_to_string() if hasattr(p.main, "desc") else str(p.main)
    names = [n for n in ("emb", "emb2", "fc_w", "emb.quantized", "emb@scale") if p.scope.find_var(n) is not None]
    return program, {n: np.array(p.scope.find_var(n).get_tensor()).tobytes() for n in names}


def _refused(p, config, error, message):
    before = _state(p)
    with p.guard, paddle.static.scope_guard(p.scope), pytest.raises(error, match=message) as info:
        quant_embedding(p.main, paddle.CPUPlace(), config, p.scope)
    assert "\n" not in str(info.value)
    assert _state(p) == before


@pytest.mark.parametrize("case", sorted(BAD_TABLES))
@pytest.mark.parametrize("family", FAMILIES)
def test_bad_table_in_a_program_changes_nothing(family, case, static_program):
    table, message = BAD_TABLES[case]
    _refused(static_program(family, table=table), {"per_row": True}, DataError, message)


@pytest.mark.parametrize("family", FAMILIES)
def test_non_2d_table_in_the_scope(family, static_program):
    p = static_program(family)
    p.scope.find_var("emb").get_tensor().set(TABLE.reshape(100, 4, 2), paddle.CPUPlace())
    _refused(p, None, DataError, r"table 'emb' has shape \(100, 4, 2\); .*non-empty 2-D array .*check that")


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
@pytest.mark.parametrize("family", FAMILIES)
def test_bad_config_changes_nothing(family, case, static_program):
    config, error, message = BAD_CONFIGS[case]
    _refused(static_program(family, with_fc=True), config, error, message)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_bad_second_table_leaves_the_first_alone(family, static_program):
    """Every table is checked before the first rewrite: no half-quantized program."""
    _refused(static_program(family, table2=_with(r7_7=np.nan)), None, DataError, "table 'emb2': .*NaN")


@pytest.mark.parametrize("family", FAMILIES)
def test_saved_model_with_a_nan_table_writes_nothing(family, static_program, save_params, tmp_path):
    save_params("save_inference_model", static_program(family, table=_with(r1_1=np.nan)), tmp_path / "m")
    with pytest.raises(DataError, match="table 'emb': .*NaN"):
        quant_embedding_model(tmp_path / "m", tmp_path / "q")
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize("config", [{"quantize_type": "log", "per_row": True}, {"quantize_bits": 4, "per_row": True},
                                    {"quantize_bits": 4}])
@pytest.mark.parametrize("family", FAMILIES)
def test_zero_rows_and_an_odd_dim_at_4_bits_are_valid(family, config, static_program):
    """A padding row (all zeros) gets scale 0 and looks up as zeros; dim 7 at 4 bits needs no packing in Paddle."""
    table = np.random.default_rng(1).normal(0, 0.1, (100, 7)).astype(np.float32)
    table[[0, 50]] = 0
    p = static_program(family, table=table)
    with p.guard, paddle.static.scope_guard(p.scope):
        quant_embedding(p.main, paddle.CPUPlace(), config, p.scope)
        got = p.exe.run(p.main, feed={"word": WORD}, fetch_list=[p.out])[0]
    q = choose_table_quantization(table, config.get("quantize_type", "abs_max"), config.get("quantize_bits", 8),
                                  config.get("per_row", False)).table
    np.testing.assert_allclose(got, 2 * q.rows(WORD), rtol=1e-5, atol=1e-7)
    assert not got[1].any() and np.isfinite(got).all()  # id 0: the zero row
    if config.get("per_row"):
        assert q.scales[0] == q.scales[50] == 0


# ---- the table API ------------------------------------------------------------------------------
@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("quantize_type", ["abs_max", "log"])
def test_all_zero_table_is_refused_and_npy_writes_nothing(quantize_type, per_row, tmp_path):
    zeros = np.zeros((300, 5), np.float32)
    with pytest.raises(DataError, match="embedding table is all zeros, so there is nothing to quantize"):
        quantize_table(zeros, quantize_type, per_row=per_row)
    np.save(tmp_path / "z.npy", zeros)
    with pytest.raises(DataError, match=r"z.npy is all zeros.*padding row, are fine\)$") as info:
        quantize_npy(tmp_path / "z.npy", tmp_path / "out" / "q.npy", quantize_type, per_row=per_row, chunk_rows=64)
    assert "\n" not in str(info.value)
    _nothing_written(tmp_path / "out")


def _nothing_written(out):
    """No file under ``out``. A per-row run finds the problem in its last chunk, after qcore.outputs
    created (and locked) the output directory, so that directory may be there, empty."""
    assert not out.exists() or not list(out.rglob("*")), list(out.rglob("*"))


@pytest.mark.parametrize("threshold", [0, -1.0, float("nan"), "0.5"])
def test_threshold_not_above_zero_is_refused_by_the_table_api(threshold, tmp_path):
    np.save(tmp_path / "t.npy", TABLE)
    for call in (lambda: quantize_table(TABLE, threshold=threshold),
                 lambda: quantize_npy(tmp_path / "t.npy", tmp_path / "out" / "q.npy", threshold=threshold)):
        with pytest.raises(QuantError, match="threshold.*(pass a positive clipping value, or None|not valid)"):
            call()
    assert not (tmp_path / "out").exists()


def test_wide_tables_beyond_float32_are_refused(tmp_path):
    """float16/float64 tables are quantized in float32 (exactly for float16); a float64 value float32
    cannot hold would become Inf, so it is refused by name instead."""
    np.testing.assert_array_equal(quantize_table(TABLE.astype(np.float16)).codes,
                                  quantize_table(TABLE.astype(np.float16).astype(np.float32)).codes)
    huge = TABLE.astype(np.float64)
    huge[42, 0] = 1e39
    with pytest.raises(DataError, match="embedding table holds values up to 1e\\+39, beyond float32's range"):
        quantize_table(huge)
    np.save(tmp_path / "huge.npy", huge)
    with pytest.raises(DataError, match="huge.npy holds values up to 1e\\+39, beyond float32's range; rescale"):
        quantize_npy(tmp_path / "huge.npy", tmp_path / "out" / "q.npy", chunk_rows=16)
    _nothing_written(tmp_path / "out")


def test_odd_dim_at_4_bits_packs_and_reads_back(tmp_path):
    table = np.random.default_rng(2).normal(0, 0.1, (50, 7)).astype(np.float32)
    np.save(tmp_path / "t.npy", table)
    on_disk = quantize_npy(tmp_path / "t.npy", tmp_path / "q.npy", bits=4, chunk_rows=8)
    assert on_disk.packed and on_disk.codes.shape == (50, 4) and on_disk.dim == 7
    np.testing.assert_array_equal(on_disk.dequantize(), quantize_table(table, bits=4, per_row=True).dequantize())
