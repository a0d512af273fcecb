"""Packed int4 / int3 / int2 tables inside Paddle models (issue 25): what is stored, what runs, the choices."""

from __future__ import annotations

import numpy as np
import paddle
import pytest
from qembed_programs import float_run

from qcore.errors import ConfigError, DataError, GraphError
from qcore.graph import open_graph
from qcore.inference import predict
from qcore.model_io import load_model
from qcore.packing import pack_codes, packed_width
from qembed import quant_embedding, quant_embedding_model
from qembed.table import AUTO_BITS, choose_table_quantization, pack_int4, searched_rows

VOCAB, DIM = 2000, 32  # TinyEmbeddingNet's table in conftest.py


@pytest.fixture(autouse=True)
def _dynamic_afterwards():
    yield
    paddle.disable_static()


@pytest.mark.parametrize("config", [
    {"quantize_bits": 4, "per_row": True, "asymmetric": False},
    {"quantize_bits": 2, "per_row": True, "asymmetric": True},
    {"quantize_bits": 3, "per_row": True},
    {"quantize_bits": 4},  # one scale for the table
    {"quantize_type": "log", "quantize_bits": 4, "per_row": True},  # log codes decode through the byte table too
], ids=["int4", "int2-asymmetric", "int3", "int4-one-scale", "log4"])
def test_packed_tables_are_stored_packed_and_run_as_their_numpy_rows(emb_model, ids, tmp_path, config):
    files, (report,) = quant_embedding_model(emb_model[0], tmp_path / "q", config, **emb_model[1])
    q = report.choice.table
    bits = config["quantize_bits"]
    graph = open_graph(load_model(files))
    (packed,) = [name for name in graph.param_names() if name.endswith(".packed")]
    assert not [name for name in graph.param_names() if name.endswith(".quantized")]
    stored = graph.get_param(packed)
    assert stored.dtype == np.int8 and stored.shape == (VOCAB, packed_width(DIM, bits))  # DIM / 2 or DIM / 4
    np.testing.assert_array_equal(stored, pack_codes(q.codes, bits))
    assert report.quantized_bytes == stored.size + 4 * (q.scales.size + (0 if q.offsets is None else q.offsets.size))
    expected = float_run(emb_model, ids, q.dequantize())  # the float model on the dequantized table
    np.testing.assert_allclose(load_model(files).run({"ids": ids})[0], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(predict(files, {"ids": ids})[0], expected, rtol=1e-5, atol=1e-6)  # oneDNN int8 on
    assert (q.offsets is not None) == report.choice.asymmetric == config.get("asymmetric", report.choice.asymmetric)


@pytest.mark.parametrize("dim", [5, 7, 9])
@pytest.mark.parametrize("bits,asymmetric", [(4, False), (2, True), (3, True)])
@pytest.mark.parametrize("family", ["legacy", "pir"])
def test_odd_dims_in_both_irs(family, bits, asymmetric, dim, static_program):
    """The last byte of a row holds fewer codes than it could: the lookup slices the padding off."""
    table = np.random.default_rng(dim).normal(0, 0.1, (100, dim)).astype(np.float32)
    p = static_program(family, table=table)
    config = {"quantize_bits": bits, "per_row": True, "asymmetric": asymmetric}
    word = np.array([[0], [99], [7], [7], [42]], np.int64)
    with p.guard, paddle.static.scope_guard(p.scope):
        quant_embedding(p.main, paddle.CPUPlace(), config, p.scope)
        got = p.exe.run(p.main, feed={"word": word}, fetch_list=[p.out])[0]
    q = choose_table_quantization(table, "abs_max", bits, True, None, asymmetric).table
    assert got.shape == (5, 1, dim) if family == "pir" else got.shape[-1] == dim
    np.testing.assert_allclose(got.reshape(5, dim), 2 * q.rows(word[:, 0]), rtol=1e-5, atol=1e-7)


def test_searched_rows_beat_plain_abs_max_rows_and_affine_rows_use_every_code():
    rng = np.random.default_rng(0)
    table = rng.standard_t(4, (3000, 64)).astype(np.float32) * 0.05  # heavy tails: clipping pays
    table[:, :8] += 0.1  # rows not centred on zero: offsets pay
    plain = np.linalg.norm(_abs_max_rows(table, 4) - table)
    symmetric = searched_rows(table, 4, affine=False)
    affine = searched_rows(table, 4, affine=True)
    sym_err = np.linalg.norm(symmetric.dequantize() - table)
    aff_err = np.linalg.norm(affine.dequantize() - table)
    assert sym_err < 0.96 * plain  # the per-row range search clips outliers (measured: 6 % less error)
    assert aff_err < sym_err
    assert symmetric.codes.min() >= -7 and symmetric.codes.max() <= 7
    assert affine.codes.min() == 0 and affine.codes.max() == 15  # all 16 levels in use
    assert affine.offsets is not None and symmetric.offsets is None


def _abs_max_rows(table, bits):
    qm = 2 ** (bits - 1) - 1
    scale = np.abs(table).max(axis=1, keepdims=True) / qm
    return np.clip(np.rint(table / scale), -qm, qm) * scale


def test_bits_auto_keeps_the_smallest_width_within_the_error_budget():
    rng = np.random.default_rng(3)
    # rows on a 4-level grid each: exact at 2 bits with per-row offsets
    steps = rng.uniform(0.01, 0.1, (500, 1)).astype(np.float32)
    levels = rng.integers(0, 4, (500, 16))
    levels[:, :4] = np.arange(4)  # every row reaches its lowest and highest level
    exact2 = (levels * steps + rng.uniform(-1, 0, (500, 1))).astype(np.float32)
    choice = choose_table_quantization(exact2, bits="auto", per_row="auto")
    assert choice.table.bits == 2 and choice.asymmetric and list(choice.errors_by_bits) == [2]
    assert choice.errors_by_bits[2] < 1e-6
    normal = rng.normal(0, 0.05, (500, 64)).astype(np.float32)
    tight = choose_table_quantization(normal, bits="auto", per_row=True)  # default budget 0.02: int8
    assert tight.table.bits == 8 and list(tight.errors_by_bits) == list(AUTO_BITS)
    assert tight.errors_by_bits[2] > tight.errors_by_bits[4] > 0.02 >= tight.errors_by_bits[8]
    loose = choose_table_quantization(normal, bits="auto", per_row=True, max_error=0.15)
    assert loose.table.bits == 4 and loose.error == loose.errors_by_bits[4] <= 0.15


def test_bits_auto_through_the_model_api_reports_the_choice(emb_model, tmp_path):
    _, (report,) = quant_embedding_model(emb_model[0], tmp_path / "q", {"quantize_bits": "auto", "per_row": True,
                                                                         "max_error": 0.12}, **emb_model[1])
    q = report.choice.table
    assert q.bits == 4 and set(report.choice.errors_by_bits) == {2, 4}
    assert report.choice.errors_by_bits[2] > 0.12 >= report.choice.errors_by_bits[4]
    assert report.quantized_bytes == VOCAB * DIM // 2 + 4 * VOCAB * (1 if q.offsets is None else 2)  # packed


@pytest.mark.parametrize("bad,message", [
    ({"quantize_bits": "Auto"}, "quantize_bits='Auto' is not valid; valid choices: an int from 2 to 8, or 'auto'"),
    ({"quantize_bits": 1}, "quantize_bits=1 is not valid"),
    ({"max_error": 0}, "max_error=0 is not valid; valid choices: a fraction in (0, 1)"),
    ({"max_error": 1.5}, "max_error=1.5 is not valid"),
    ({"max_error": "0.1"}, "max_error='0.1' is not valid"),
    ({"asymmetric": "yes"}, "asymmetric='yes' is not valid"),
])
def test_bad_packed_config_is_one_line(emb_model, tmp_path, bad, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        quant_embedding_model(emb_model[0], tmp_path / "q", bad, **emb_model[1])
    assert not (tmp_path / "q").exists()


def test_offsets_need_per_row_scales_and_few_bits(static_program):
    p = static_program("pir")
    graph = open_graph(_in_memory(p))
    (op,) = graph.ops(["lookup_table"])
    codes = np.zeros((100, 8), np.int8)
    with pytest.raises(GraphError, match="offsets for 'emb' go with per-row scales and codes of <= 4 bits"):
        graph.quantize_lookup(op, codes, np.ones(100, np.float32), bits=8, offsets=np.zeros(100, np.float32))


def _in_memory(p):
    from qcore.model_io import Model

    return Model(p.main, [], [], p.scope, "pir")


def test_affine_rows_are_not_packed_into_the_numpy_nibble_format():
    q = searched_rows(np.random.default_rng(0).normal(0, 1, (10, 6)).astype(np.float32), 4, affine=True)
    with pytest.raises(DataError, match="affine rows .offsets. are packed inside Paddle models only"):
        q.packed_int4()
    np.testing.assert_array_equal(pack_int4(np.array([[-1, 2]], np.int8)), [[0x2F]])
