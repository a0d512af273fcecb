"""quantize_(model, WeightOnlyConfig(embedding_bits=...)) on a tiny decoder with a tied embedding / LM head: the
table's group codes, the simulation, and the ONNX export (GatherBlockQuantized + MatMulNBits for ONNX Runtime,
GatherBlockQuantized + block DequantizeLinear for the OpenVINO runtime) computing it with the codes stored once."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from qcore.errors import ConfigError
from qptq.weight_only.config import WeightOnlyConfig
from qptq.weight_only.layer import quantize_

onnx = pytest.importorskip("onnx")
VOCAB, HIDDEN = 48, 64


class TinyDecoder(paddle.nn.Layer):
    """An embedding, one projection with a residual, and the LM head tied to the table (SmolLM2's form)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = paddle.nn.Embedding(VOCAB, HIDDEN)
        self.proj = paddle.nn.Linear(HIDDEN, HIDDEN, bias_attr=False)

    def forward(self, ids: paddle.Tensor) -> paddle.Tensor:
        h = self.embed_tokens(ids)
        h = h + self.proj(paddle.nn.functional.silu(h))
        return paddle.matmul(h, self.embed_tokens.weight, transpose_y=True)


def _model() -> TinyDecoder:
    paddle.seed(0)
    model = TinyDecoder()
    model.eval()
    return model


def test_the_table_gets_round_to_nearest_groups_along_hidden_and_the_tied_head_reads_them():
    model = _model()
    table = model.embed_tokens.weight.numpy().copy()
    result = quantize_(model, WeightOnlyConfig(group_size=32, embedding_bits=4))
    q = result.codes[model.embed_tokens.weight.name]
    assert q.codes.shape == (HIDDEN, VOCAB) and q.bits == 4 and q.group_size == 32
    for row, group in [(0, 0), (5, 1), (47, 1)]:  # by hand: the group's range holds 0, 15 steps, zero point
        x = table[row, 32 * group: 32 * group + 32].astype(np.float64)
        lo, hi = min(x.min(), 0.0), max(x.max(), 0.0)
        step = (hi - lo) / 15
        zero = np.rint(-lo / step)
        np.testing.assert_allclose(q.scales[group, row], step, rtol=1e-6)
        assert q.zero_points[group, row] == zero
        expected = np.clip(np.rint(x / step) + zero, 0, 15)
        np.testing.assert_array_equal(q.codes[32 * group: 32 * group + 32, row], expected)
    np.testing.assert_allclose(model.embed_tokens.weight.numpy(), q.dequantize().T, rtol=0, atol=1e-6)
    report = {layer.weight: layer for layer in result.layers}
    assert (report[model.embed_tokens.weight.name].bits, report[model.embed_tokens.weight.name].shape) == (4, (64, 48))
    # codes 64 x 48 / 2 bytes, a fp32 step and half a byte of zero point per group (2 groups x 48), plus the linear's
    assert result.size_bytes() == (64 * 48 // 2 + 2 * 48 * 4 + 48) + (64 * 64 // 2 + 2 * 64 * 4 + 64)



@pytest.mark.parametrize("grid", ["int", "gguf"])
def test_a_table_coded_a_block_of_rows_at_a_time_has_the_codes_of_the_whole(monkeypatch, grid):
    from qptq.weight_only import plan
    from qptq.weight_only.plan import WeightOnlyResult, quantize_tables, table_rows

    table = np.random.default_rng(3).standard_normal((VOCAB, HIDDEN)).astype(np.float32)
    config = WeightOnlyConfig(group_size=32, embedding_bits=4, grid=grid, symmetric=grid == "gguf")
    whole, blocks = WeightOnlyResult(), WeightOnlyResult()
    assert quantize_tables({"t": table}, {"t": "t.w"}, config, whole) == ["t"]
    monkeypatch.setattr(plan, "TABLE_ROWS", 7)  # 48 rows: six blocks of 7 and one of 6
    quantize_tables({"t": table}, {"t": "t.w"}, config, blocks)
    a, b = whole.codes["t.w"], blocks.codes["t.w"]
    for field in ("codes", "scales", "zero_points", "offsets"):
        x, y = getattr(a, field), getattr(b, field)
        assert (x is None and y is None) or np.array_equal(x, y), field
    ids = np.array([5, 0, 47, 5])
    np.testing.assert_array_equal(table_rows(b, ids), table_rows(a)[ids])  # rows of ids: those of the whole table
    np.testing.assert_array_equal(table_rows(a), a.dequantize().T)  # dequantized 7 rows at a time: the same


def test_bad_embedding_bits_is_one_line():
    with pytest.raises(ConfigError, match=r"^embedding_bits=3 is not supported; use one of \(4, 8\), or None"):
        WeightOnlyConfig(embedding_bits=3)
    model = _model()
    before = model.embed_tokens.weight.numpy().copy()
    with pytest.raises(ConfigError, match="group_size=48 does not divide the 64 input channels"):
        quantize_(model, WeightOnlyConfig(group_size=48, embedding_bits=8))
    np.testing.assert_array_equal(model.embed_tokens.weight.numpy(), before)


def _compressed(compiled) -> dict[str, list]:
    """The OpenVINO runtime model's constants of the table's size, by element type."""
    found: dict[str, list] = {}
    for op in compiled.get_runtime_model().get_ops():
        shape = op.get_output_partial_shape(0) if op.get_output_size() else None
        if shape is None or not shape.is_static or int(np.prod([d.get_length() for d in shape])) != VOCAB * HIDDEN:
            continue
        if op.get_type_name() == "Constant" or str(op.get_rt_info()["layerType"].astype(str)) == "Const":
            found.setdefault(op.get_output_element_type(0).get_type_name(), []).append(shape)
    return found


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino-runtime"])
def test_the_tied_export_computes_the_simulation_on_both_runtimes_with_the_codes_once(tmp_path, runtime, bits):
    import onnxruntime as ort

    from qcore.export.nbits import FLOAT_ACTIVATIONS, replace_matmuls
    from qcore.export.paddle2onnx_float import float_onnx
    from qcore.model_io import find_model_files

    model = _model()
    result = quantize_(model, WeightOnlyConfig(group_size=32, embedding_bits=bits))
    table = model.embed_tokens.weight.name
    paddle.jit.save(model, str(tmp_path / "sim" / "inference"),
                    input_spec=[paddle.static.InputSpec([None, None], "int64", "ids")])
    ids = np.array([[0, 5, 47, 5], [9, 1, 2, 3]], np.int64)
    simulated = model(paddle.to_tensor(ids)).numpy()
    exported = float_onnx(find_model_files(tmp_path / "sim"), opset=21 if runtime == "openvino-runtime" else 13)
    assert replace_matmuls(exported, result.codes, None, FLOAT_ACTIVATIONS, runtime) == 2
    kinds = [n.op_type for n in exported.graph.node]
    assert "Gather" not in kinds and kinds.count("GatherBlockQuantized") == 1
    assert kinds.count("MatMulNBits") == (2 if runtime == "onnxruntime" else 1)
    sizes = {i.name: len(i.raw_data) for i in exported.graph.initializer if i.name.startswith(table)}
    blocks = HIDDEN // 32
    codes, steps, zeros = VOCAB * HIDDEN * bits // 8, VOCAB * blocks * 4, VOCAB * blocks * bits // 8
    if runtime == "onnxruntime":  # B once; steps and zero points also as [V, blocks, 1] for the lookup
        expected = codes + 2 * steps + zeros + VOCAB * blocks + 8  # + the lookup's row width (int64)
    else:
        expected = codes + steps + zeros
    assert sum(sizes.values()) == expected, sizes
    path = tmp_path / "tied.onnx"
    onnx.save(exported, str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    deployed = session.run(None, {"ids": ids})[0]
    assert np.linalg.norm(deployed - simulated) / np.linalg.norm(simulated) < 1e-4
    ov = pytest.importorskip("openvino")
    # f32, and no dynamic int8 quantization of the activations of compressed matmuls (the CPU plugin's default)
    compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                          "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0})
    deployed = compiled({"ids": ids})[compiled.outputs[0]]
    assert np.linalg.norm(deployed - simulated) / np.linalg.norm(simulated) < 1e-4
    if runtime == "openvino-runtime":  # the lookup and the head read u4 / u8 constants, never an f32 table
        kept = _compressed(compiled)
        assert "f32" not in kept and set(kept) == {"u4" if bits == 4 else "u8"}, kept


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino-runtime"])
def test_quant_post_dynamic_quantizes_a_saved_decoders_tied_table_for_each_runtime(tmp_path, backend):
    import onnxruntime as ort

    from qcore.deploy.onnx_runtimes import ONNX_FILE
    from qcore.model_io import load_model
    from qptq import quant_post_dynamic

    spec = [paddle.static.InputSpec([None, None], "int64", "ids")]
    paddle.jit.save(_model(), str(tmp_path / "float" / "inference"), input_spec=spec)
    files = quant_post_dynamic(str(tmp_path / "float"), str(tmp_path / "int4"), deploy_backend=backend,
                               weight_only=WeightOnlyConfig(group_size=32, embedding_bits=4))
    ids = np.array([[3, 1, 4, 1, 5]], np.int64)
    simulated = load_model(files).run({"ids": ids})[0]
    layer = _model()  # the layer API gives the same codes: one rule for both holders
    quantize_(layer, WeightOnlyConfig(group_size=32, embedding_bits=4))
    np.testing.assert_allclose(layer(paddle.to_tensor(ids)).numpy(), simulated, rtol=1e-5, atol=1e-5)
    model = onnx.load(str(tmp_path / "int4" / ONNX_FILE))
    kinds = [n.op_type for n in model.graph.node]
    assert "Gather" not in kinds and "GatherBlockQuantized" in kinds
    assert ("DequantizeLinear" in kinds) == (backend == "openvino-runtime")
    deployed = ort.InferenceSession(str(tmp_path / "int4" / ONNX_FILE),
                                    providers=["CPUExecutionProvider"]).run(None, {"ids": ids})[0]
    assert np.linalg.norm(deployed - simulated) / np.linalg.norm(simulated) < 2e-2  # int8 activations
