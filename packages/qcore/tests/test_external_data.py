"""Initializers written to the external data file as a graph is built: the graph keeps references only, ONNX's
own loader and ONNX Runtime read back the exact arrays, offsets are page-aligned, small tensors stay inline."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from qcore.export.external_data import ALIGN, THRESHOLD, ExternalData  # noqa: E402


def _offsets(model):
    return {t.name: {e.key: e.value for e in t.external_data} for t in model.graph.initializer
            if t.data_location == TensorProto.EXTERNAL}


def test_tensors_reach_the_file_as_made_and_read_back_exactly(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((60, 48)).astype(np.float32)  # 11 KiB: external, the next tensor page-aligned after it
    b = rng.standard_normal(48).astype(np.float16)  # 96 bytes: inline
    codes = rng.integers(0, 256, (48, 40), dtype=np.uint8)  # made elsewhere as a TensorProto
    with ExternalData(tmp_path / "m.onnx.data") as weights:
        inits = [weights.array(w.T.T, "w"), weights.array(b, "b"),  # w.T.T: a view, written as it is
                 weights.tensor(numpy_helper.from_array(codes, "codes"))]
    assert (tmp_path / "m.onnx.data").stat().st_size == 3 * ALIGN + codes.nbytes  # written before the graph
    assert [t.HasField("raw_data") for t in inits] == [False, True, False]
    nodes = [helper.make_node("Cast", ["b"], ["b32"], to=TensorProto.FLOAT),
             helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b32"], ["y"]),
             helper.make_node("Identity", ["codes"], ["c"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 60])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 48]),
                               helper.make_tensor_value_info("c", TensorProto.UINT8, [48, 40])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(tmp_path / "m.onnx"))
    assert (tmp_path / "m.onnx").stat().st_size < THRESHOLD  # the graph holds no weight bytes
    refs = _offsets(onnx.load(str(tmp_path / "m.onnx"), load_external_data=False))
    assert refs == {"w": {"location": "m.onnx.data", "offset": "0", "length": str(w.nbytes)},
                    "codes": {"location": "m.onnx.data", "offset": str(3 * ALIGN), "length": str(codes.nbytes)}}
    back = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(tmp_path / "m.onnx")).graph.initializer}
    assert np.array_equal(back["w"], w) and np.array_equal(back["b"], b) and np.array_equal(back["codes"], codes)
    x = rng.standard_normal((2, 60)).astype(np.float32)
    y, c = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(y, x @ w + b.astype(np.float32), rtol=1e-5, atol=1e-5)
    assert np.array_equal(c, codes)
