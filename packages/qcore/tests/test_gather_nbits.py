"""Quantized tables as ONNX lookups (qcore.export.gather_nbits) without a head, as qembed's tables will use them:
the rows ONNX Runtime and the OpenVINO runtime look up equal the dequantized codes, in each runtime's form."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from qcore.errors import ConfigError  # noqa: E402
from qcore.export.gather_nbits import gather_nbits  # noqa: E402
from qcore.export.nbits import MS_DOMAIN  # noqa: E402
from qcore.groupwise import quantize_groups  # noqa: E402


def _lookup_model(q, runtime):
    nodes, inits = gather_nbits(q, "ids", "rows", "table", runtime)
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [None, None])],
                              [helper.make_tensor_value_info("rows", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS_DOMAIN, 1)])


@pytest.mark.parametrize(("bits", "symmetric", "group"), [(4, False, 32), (4, True, 16), (8, False, 64),
                                                          (8, True, 32), (4, False, -1)])
@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino-runtime"])
def test_both_runtimes_look_up_the_dequantized_rows(tmp_path, runtime, bits, symmetric, group):
    rng = np.random.default_rng(bits + group)
    table = rng.standard_normal((30, 64)).astype(np.float32)  # [vocab, hidden]
    table[7] = 0.0  # a padding row reads exactly 0
    q = quantize_groups(table.T, bits, group, symmetric)
    ids = np.array([[0, 7, 29], [3, 3, 12]], np.int64)
    expected = q.dequantize().T[ids]
    assert np.all(expected[0, 1] == 0.0)
    path = tmp_path / "lookup.onnx"
    onnx.save(_lookup_model(q, runtime), str(path))
    rows = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})[0]
    np.testing.assert_array_equal(rows, expected)
    ov = pytest.importorskip("openvino")
    compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    np.testing.assert_allclose(compiled({"ids": ids})[compiled.outputs[0]], expected, rtol=1e-6, atol=1e-6)


def test_per_row_steps_of_a_width_that_is_no_power_of_two():
    q = quantize_groups(np.random.default_rng(0).standard_normal((48, 10)), 4, -1)  # a 48-wide table, per row
    model = _lookup_model(q, "onnxruntime")  # one 64-code block per row, the padding sliced off
    ids = np.array([[9, 0]], np.int64)
    rows = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})
    np.testing.assert_array_equal(rows[0], q.dequantize().T[ids])
    with pytest.raises(ConfigError, match="group_size=48 of a 48-wide table cannot be a GatherBlockQuantized block"):
        gather_nbits(q, "ids", "rows", "table", "openvino-runtime")
    with pytest.raises(ConfigError, match="runtime='tensorrt' has no quantized-table form"):
        gather_nbits(q, "ids", "rows", "table", "tensorrt")
