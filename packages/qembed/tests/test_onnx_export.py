"""qembed models through the ONNX export: each quantized lookup becomes one GatherBlockQuantized whose table stays
1 byte (8-bit codes) or half a byte (4- and 2-bit codes) a value, and both ONNX runtimes return the numpy rows."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from qembed import quant_embedding_model

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

ROWS, DIM = 300, 32
SEQUENCE = {"fused_lookup": False}  # paddle2onnx reads no custom op: models for the ONNX runtimes keep the op sequence
# config, bits a value in the export, offsets
SCHEMES = {
    "int8 per-row": ({"quantize_bits": 8, "per_row": True}, 8),
    "int8 one scale": ({"quantize_bits": 8, "per_row": False}, 8),
    "int4 per-row": ({"quantize_bits": 4, "per_row": True, "asymmetric": False}, 4),
    "int4 per-row + offsets": ({"quantize_bits": 4, "per_row": True, "asymmetric": True}, 4),
    "int2 per-row + offsets": ({"quantize_bits": 2, "per_row": True, "asymmetric": True}, 4),
}
SCHEMES |= {f"{name} fp16": ({**SCHEMES[name][0], "scale_dtype": "float16"}, SCHEMES[name][1]) for name in (
    "int8 per-row", "int4 per-row", "int4 per-row + offsets", "int2 per-row + offsets")}


@pytest.fixture(autouse=True)
def _dygraph_after():
    """The static programs switch Paddle to static mode; later tests build dygraph layers."""
    yield
    paddle.disable_static()


def _saved(static_program, tmp_path, family):
    table = np.random.default_rng(3).normal(0, 0.1, (ROWS, DIM)).astype(np.float32)
    p = static_program(family, table=table)
    with p.guard, paddle.static.scope_guard(p.scope):
        paddle.static.save_inference_model(str(tmp_path / "float" / "inference"), [p.feed], [p.out], p.exe,
                                           program=p.main)
    return tmp_path / "float"


def _run(path, runtime, ids):
    if runtime == "onnxruntime":
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"word": ids})[0]
    ov = pytest.importorskip("openvino")
    compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return compiled({"word": ids})[compiled.outputs[0]]


def _table_constants(path) -> list[str]:
    """Element types of the OpenVINO runtime model's constants of the table's size (u8 / u4: kept compressed)."""
    ov = pytest.importorskip("openvino")
    compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    found = []
    for op in compiled.get_runtime_model().get_ops():
        shape = op.get_output_partial_shape(0) if op.get_output_size() else None
        if shape is not None and shape.is_static and np.prod([d.get_length() for d in shape]) == ROWS * DIM:
            found.append(op.get_output_element_type(0).get_type_name())
    return found


PIR_SCHEMES = ("int8 per-row", "int4 per-row + offsets", "int4 per-row + offsets fp16")


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino-runtime"])
@pytest.mark.parametrize(("family", "scheme"), [("legacy", s) for s in SCHEMES] + [("pir", s) for s in PIR_SCHEMES])
def test_exported_tables_stay_quantized_and_return_the_numpy_rows(static_program, tmp_path, family, scheme, runtime):
    from qcore.export import export_onnx

    config, bits = SCHEMES[scheme]
    files, (report,) = quant_embedding_model(_saved(static_program, tmp_path, family), tmp_path / "q",
                                             {**config, **SEQUENCE})
    path = export_onnx(files, tmp_path / "q.onnx", runtime=runtime)
    model = onnx.load(str(path))
    kinds = [n.op_type for n in model.graph.node]
    q = report.choice.table
    half = "fp16" in scheme
    assert (q.offsets is not None) == ("offsets" in scheme) and q.per_row == ("per-row" in scheme)
    assert q.scale_dtype == ("float16" if half else "float32")
    # float16 scales: stored float16 and cast in the ONNX Runtime form, float32 in the OpenVINO form (its frontend
    # takes constant scales only); float16 offsets: looked up, then cast
    casts = half * ((runtime == "onnxruntime") + (q.offsets is not None))
    assert kinds.count("GatherBlockQuantized") == 1 and kinds.count("Cast") == casts, kinds
    assert kinds.count("Gather") == (q.offsets is not None)  # the offsets' lookup
    sizes = {i.name.rsplit(".", 1)[-1]: len(i.raw_data) for i in model.graph.initializer}
    scale_bytes = 2 * ROWS if half and runtime == "onnxruntime" else 4 * ROWS
    assert sizes["float16" if half and runtime == "onnxruntime" else "scales"] == scale_bytes
    if q.offsets is not None:
        assert sizes["offsets"] == (2 if half else 4) * ROWS
    assert sizes["B" if runtime == "onnxruntime" else "codes"] == ROWS * DIM * bits // 8
    assert max(sizes.values()) == ROWS * DIM * bits // 8  # no float copy of the table
    ids = np.random.default_rng(4).integers(0, ROWS, (40, 1)).astype(np.int64)
    deployed = _run(path, runtime, ids)
    np.testing.assert_array_equal(deployed, q.rows(ids) * 2)  # the program doubles the rows
    if runtime == "openvino-runtime":  # the CPU plugin keeps the codes compressed (the ONNX Runtime form: f32)
        assert _table_constants(path) == ["u8" if bits == 8 else "u4"]


def _padded_net():
    """Embedding (row 0 padding, not zero in the table) -> mean -> fc, built in dygraph mode."""
    from qdemo.testing import TinyEmbeddingNet

    paddle.disable_static()
    paddle.seed(0)
    net = TinyEmbeddingNet(ROWS, DIM)
    net.emb.weight.set_value(np.random.default_rng(5).normal(0, 0.1, (ROWS, DIM)).astype(np.float32))
    net.eval()
    return net


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino-runtime"])
def test_padding_rows_of_a_one_scale_table_export_as_zeros(tmp_path, runtime):
    """A legacy lookup with padding_idx and one scale: paddle2onnx aborts on it as it is; the export writes the
    padding row with scale 0."""
    from qcore.export import export_onnx
    from qcore.graph import open_graph
    from qcore.model_io import load_model
    from qdemo.testing import EMBEDDING_INPUT_SPEC, save_tiny_net

    emb_net = _padded_net()
    save_tiny_net(emb_net, tmp_path / "float", "legacy_pdmodel", EMBEDDING_INPUT_SPEC)
    files, (report,) = quant_embedding_model(tmp_path / "float", tmp_path / "q", {"per_row": False, **SEQUENCE})
    assert not report.choice.per_row
    path = export_onnx(files, tmp_path / "q.onnx", runtime=runtime)
    ids = np.array([[0, 0, 0, 0, 0, 0], [0, 5, 0, 7, 9, 0], [1, 2, 3, 4, 5, 6]], np.int64)
    simulated = open_graph(load_model(files)).run({"ids": ids})[0]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rows = report.choice.table.rows(ids) * (ids != 0)[..., None]
    expected = rows.mean(axis=1) @ emb_net.fc.weight.numpy() + emb_net.fc.bias.numpy()
    deployed = session.run(None, {"ids": ids})[0]
    np.testing.assert_allclose(deployed, simulated, rtol=0, atol=1e-6)
    np.testing.assert_allclose(deployed, expected, rtol=0, atol=1e-6)


def test_the_openvino_runtime_predictor_of_a_legacy_table_model_runs_its_export(tmp_path, monkeypatch):
    """OpenVINO 2026.4 reads legacy programs itself, but its Paddle frontend refuses a one-scale int8 table with a
    padding row ("Argument 1 and 2 element types must match"): models with quantized lookups go through the export."""
    pytest.importorskip("openvino")
    from qcore.graph import open_graph
    from qcore.inference import create_predictor
    from qcore.model_io import load_model
    from qdemo.testing import EMBEDDING_INPUT_SPEC, save_tiny_net

    monkeypatch.setenv("QCORE_OPENVINO_PRECISION", "f32")
    save_tiny_net(_padded_net(), tmp_path / "float", "legacy_pdmodel", EMBEDDING_INPUT_SPEC)
    files, _ = quant_embedding_model(tmp_path / "float", tmp_path / "q", {"per_row": False, **SEQUENCE})
    predictor = create_predictor(files, backend="openvino-runtime")
    assert predictor.onnx_file.suffix == ".onnx"
    kinds = [n.op_type for n in onnx.load(str(predictor.onnx_file)).graph.node]
    assert kinds.count("GatherBlockQuantized") == 1
    ids = np.array([[0, 0, 0, 0, 0, 0], [0, 5, 0, 7, 9, 0], [1, 2, 3, 4, 5, 6]], np.int64)
    simulated = open_graph(load_model(files)).run({"ids": ids})[0]
    np.testing.assert_allclose(predictor.run({"ids": ids})[0], simulated, rtol=0, atol=1e-6)


def test_a_pir_one_scale_table_with_padding_is_one_line(tmp_path):
    from qcore.errors import ExportError
    from qcore.export import export_onnx
    from qdemo.testing import EMBEDDING_INPUT_SPEC, save_tiny_net

    save_tiny_net(_padded_net(), tmp_path / "float", "pir", EMBEDDING_INPUT_SPEC)
    files, _ = quant_embedding_model(tmp_path / "float", tmp_path / "q", {"per_row": False, **SEQUENCE})
    with pytest.raises(ExportError, match="padding_idx 0.*per_row=True"):
        export_onnx(files, tmp_path / "q.onnx")
    assert not (tmp_path / "q.onnx").exists()


def test_log_tables_keep_their_op_sequence(static_program, tmp_path):
    from qcore.export import export_onnx

    files, (report,) = quant_embedding_model(_saved(static_program, tmp_path, "pir"), tmp_path / "q",
                                             {"quantize_type": "log", "per_row": True, **SEQUENCE})
    path = export_onnx(files, tmp_path / "q.onnx")
    kinds = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert "GatherBlockQuantized" not in kinds and "Exp" in kinds
    ids = np.arange(ROWS, dtype=np.int64).reshape(-1, 1)
    deployed = _run(path, "onnxruntime", ids)
    np.testing.assert_allclose(deployed, report.choice.table.rows(ids) * 2, rtol=1e-6, atol=1e-7)
