"""Group-wise weights as ONNX Runtime's MatMulNBits: what ONNX Runtime computes equals the dequantized weight's
product (float activations), and stays within the int8-activation error at the fast accuracy level."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from qcore.errors import ConfigError  # noqa: E402
from qcore.export.nbits import FLOAT_ACTIVATIONS, INT8_ACTIVATIONS, MS_DOMAIN, matmul_nbits  # noqa: E402
from qcore.groupwise import quantize_groups  # noqa: E402


def _run(q, x, level):
    k, n = q.codes.shape
    node, inits = matmul_nbits(q, "x", "y", "fc", accuracy_level=level)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS_DOMAIN, 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize(("bits", "symmetric", "group"), [(4, False, 32), (4, True, 64), (8, False, 128),
                                                          (8, True, 32), (4, False, 16)])
def test_onnx_runtime_computes_the_dequantized_weights_product(bits, symmetric, group):
    rng = np.random.default_rng(bits + group)
    w = rng.standard_normal((256, 48)).astype(np.float32)
    x = rng.standard_normal((5, 256)).astype(np.float32)
    q = quantize_groups(w, bits, group, symmetric)
    simulated = x @ q.dequantize()
    np.testing.assert_allclose(_run(q, x, FLOAT_ACTIVATIONS), simulated, rtol=1e-4, atol=1e-4)
    fast = _run(q, x, INT8_ACTIVATIONS)  # activations int8 per block: ~1 % of the output
    assert np.linalg.norm(fast - simulated) / np.linalg.norm(simulated) < 2e-2


@pytest.mark.parametrize("symmetric", [False, True])
def test_one_group_per_output_of_any_width_pads_a_power_of_two_block(symmetric):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((576, 24)).astype(np.float32)  # SmolLM2's width: per channel, a 1024 block
    x = rng.standard_normal((3, 576)).astype(np.float32)
    q = quantize_groups(w, 8, -1, symmetric)
    np.testing.assert_allclose(_run(q, x, FLOAT_ACTIVATIONS), x @ q.dequantize(), rtol=1e-4, atol=1e-4)


def test_a_group_that_is_no_block_is_one_line():
    q = quantize_groups(np.ones((96, 4)), 4, 48)
    with pytest.raises(ConfigError, match="group_size=48 cannot be a MatMulNBits block; use a power of two >= 16"):
        matmul_nbits(q, "x", "y", "fc")
