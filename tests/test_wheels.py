"""What a recommender team gets from the built wheels: ``paddle-quant-embed`` and the ``paddle-quant-core`` it pins,
in a venv holding nothing else of ours. ``nox -s wheels`` builds every package and installs only those two wheels
(their other dependencies from the index) before it runs this file."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
from pathlib import Path

import numpy as np

VERSION = (Path(__file__).resolve().parents[1] / "VERSION").read_text(encoding="utf-8").strip()
IMPORT_NAMES = ("qcore", "qptq", "qqat", "qembed", "qcli", "qdemo")


def test_the_venv_holds_the_embedding_and_core_wheels_and_nothing_else_of_ours():
    ours = {d.metadata["Name"]: d.version for d in importlib.metadata.distributions()
            if d.metadata["Name"].startswith("paddle-quant-")}
    assert ours == {"paddle-quant-core": VERSION, "paddle-quant-embed": VERSION}
    found = {name: importlib.util.find_spec(name) for name in IMPORT_NAMES}
    assert sorted(name for name, spec in found.items() if spec is not None) == ["qcore", "qembed"]
    for name in ("qcore", "qembed"):  # imported from the installed wheel, not from the repository's sources
        assert Path(sys.prefix).resolve() in Path(found[name].origin).resolve().parents, found[name].origin


def test_a_numpy_table_quantizes_to_int8_codes_within_half_a_step():
    from qembed import quantize_table

    table = np.random.default_rng(0).normal(size=(1000, 16)).astype(np.float32)
    quantized = quantize_table(table, bits=8, per_row=True)
    assert quantized.codes.dtype == np.int8 and quantized.codes.shape == (1000, 16)
    steps = np.abs(table).max(axis=1, keepdims=True) / 127
    assert (np.abs(quantized.dequantize() - table) <= steps / 2 + 1e-6).all()
    assert quantized.stored_bytes < table.nbytes / 3


def test_quant_embedding_rewrites_a_program_whose_lookups_stay_within_half_a_step():
    import paddle

    from qembed import quant_embedding

    paddle.enable_static()
    with paddle.pir_utils.OldIrGuard():
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            word = paddle.static.data("word", [None, 1], "int64")
            attr = paddle.ParamAttr(name="emb", initializer=paddle.nn.initializer.Uniform(-0.5, 0.5))
            emb = paddle.static.nn.embedding(word, size=[100, 8], param_attr=attr)
        exe = paddle.static.Executor(paddle.CPUPlace())
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            exe.run(startup)
            table = np.array(scope.find_var("emb").get_tensor())
            ids = np.array([[3], [97], [3]], "int64")
            config = {"quantize_op_types": ["lookup_table"], "lookup_table": {"quantize_type": "abs_max"}}
            quant_embedding(main, paddle.CPUPlace(), config, scope=scope)
            (out,) = exe.run(main, feed={"word": ids}, fetch_list=[emb.name])
    assert "emb" not in {v.name for v in main.list_vars()}
    assert np.asarray(scope.find_var("emb.quantized").get_tensor()).dtype == np.int8
    step = np.abs(table).max() / 127
    np.testing.assert_allclose(out.reshape(3, 8), table[ids[:, 0]], atol=step / 2 + 1e-6)
    assert 0 < np.abs(out.reshape(3, 8) - table[ids[:, 0]]).max()  # really int8 codes, not the float rows
