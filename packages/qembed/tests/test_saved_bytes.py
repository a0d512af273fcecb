"""Every way of saving a quantized program writes the int8 table and its scales, never the float table.

The float table leaves the program and the scope (issue 14 part 1): before that, save_persistables /
save_vars wrote both tables (1.23x the float model on Baidu LAC). Each route is checked on the bytes
it writes, in both IRs, against the same route on the float program.
"""

from __future__ import annotations

import numpy as np
import paddle
import pytest
from qembed_programs import SAVE_ROUTES

from qcore.model_io import load_model
from qembed import quant_embedding, quant_embedding_model

VOCAB, DIM = 5000, 64
FLOAT_BYTES = VOCAB * DIM * 4
CODES_BYTES = VOCAB * DIM
OVERHEAD_BYTES = 1024  # headers (tensor desc, LoD; pickle framing for paddle.static.save) of up to four tensors
INT8 = ["emb.quantized", "emb@scale"]
SCHEMES = {  # name -> (config, bytes of the stored tensors: codes + scales (+ offsets, byte values), their files)
    "abs_max per-row": ({"quantize_type": "abs_max", "per_row": True}, CODES_BYTES + 4 * VOCAB, INT8),
    "log one scale": ({"quantize_type": "log"}, CODES_BYTES + 4, INT8),
    # packed: two 4-bit codes a byte, four 2-bit codes a byte; a [256, k] float table turns bytes into values
    "int4 per-row": ({"quantize_bits": 4, "per_row": True, "asymmetric": False},
                     CODES_BYTES // 2 + 4 * VOCAB + 256 * 2 * 4, ["emb.packed", "emb@byte_values", "emb@scale"]),
    "int2 per-row asymmetric": ({"quantize_bits": 2, "per_row": True, "asymmetric": True},
                                CODES_BYTES // 4 + 8 * VOCAB + 256 * 4 * 4,
                                ["emb.packed", "emb@byte_values", "emb@offset", "emb@scale"]),
    # scale_dtype float16: 2 bytes a scale (and offset) instead of 4
    "abs_max per-row fp16": ({"per_row": True, "scale_dtype": "float16"}, CODES_BYTES + 2 * VOCAB, INT8),
    "int2 per-row asymmetric fp16": ({"quantize_bits": 2, "per_row": True, "asymmetric": True,
                                      "scale_dtype": "float16"}, CODES_BYTES // 4 + 4 * VOCAB + 256 * 4 * 4,
                                     ["emb.packed", "emb@byte_values", "emb@offset", "emb@scale"]),
}
CASES = [(family, route) for family, routes in SAVE_ROUTES.items() for route in routes]


@pytest.fixture(autouse=True)
def _dynamic_afterwards():
    yield
    paddle.disable_static()


def _table() -> np.ndarray:
    table = np.random.default_rng(0).normal(0, 0.05, (VOCAB, DIM)).astype(np.float32)
    table[:10] *= 8  # a few hot rows
    return table


def _check_quantized_bytes(files: dict[str, int], expected: int) -> None:
    total = sum(files.values())
    assert expected <= total <= expected + OVERHEAD_BYTES, (files, expected)
    assert total < 0.3 * FLOAT_BYTES


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
@pytest.mark.parametrize("family,route", CASES)
def test_every_save_route_writes_only_the_int8_table(family, route, scheme, static_program, save_params, tmp_path):
    config, expected_bytes, names = SCHEMES[scheme]
    table = _table()
    float_files = save_params(route, static_program(family, table=table), tmp_path / "float")
    assert sum(float_files.values()) >= FLOAT_BYTES  # the same route on the float program writes the table
    p = static_program(family, table=table)
    with p.guard, paddle.static.scope_guard(p.scope):  # the op sequence's tensors (fused log tables add 1 KiB)
        quant_embedding(p.main, paddle.CPUPlace(), {**config, "fused_lookup": False}, p.scope)
    files = save_params(route, p, tmp_path / "q")
    _check_quantized_bytes(files, expected_bytes)
    if route in ("save_persistables", "save_vars"):  # one file per variable, named after it
        assert sorted(files) == names
    if route == "save_inference_model":  # what was written runs, and computes what the program computes
        word = np.array([[3], [4999], [0], [3]], np.int64)
        with p.guard, paddle.static.scope_guard(p.scope):
            expected = p.exe.run(p.main, feed={"word": word}, fetch_list=[p.out])[0]
        reloaded = load_model(tmp_path / "q")
        np.testing.assert_allclose(reloaded.run({"word": word})[0], expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("family", sorted(SAVE_ROUTES))
def test_quant_embedding_model_writes_only_the_int8_table(family, static_program, save_params, tmp_path):
    table = _table()
    float_files = save_params("save_inference_model", static_program(family, table=table), tmp_path / "float")
    assert sum(float_files.values()) >= FLOAT_BYTES
    files, (report,) = quant_embedding_model(tmp_path / "float", tmp_path / "q", {"per_row": True})
    assert files.family == family
    assert report.quantized_bytes == CODES_BYTES + 4 * VOCAB
    written = {f.name: f.stat().st_size for f in files.directory.iterdir() if f != files.model_file}
    _check_quantized_bytes(written, CODES_BYTES + 4 * VOCAB)
