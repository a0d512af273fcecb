"""Sequential GPTQ (``WeightOnlyConfig(sequential=True)``): a decoder layer's Hessians come from the outputs of the
layers before it, already quantized. Checked against an independent reference: the Hessian collected by hand on
the quantized model's own forward, fed to GPTQ."""

from __future__ import annotations

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")
pytest.importorskip("gguf")

from qcore.errors import ConfigError  # noqa: E402
from qdemo.testing import save_tiny_llama_gguf  # noqa: E402
from qptq.llm.llama import load_gguf  # noqa: E402
from qptq.weight_only import WeightOnlyConfig, quantize_  # noqa: E402
from qptq.weight_only.gptq import gptq  # noqa: E402
from qptq.weight_only.hessian import HessianAccumulator  # noqa: E402

CONFIG = dict(bits=4, group_size=32, algo="gptq")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return save_tiny_llama_gguf(tmp_path_factory.mktemp("seq") / "tiny.gguf", layers=3)


def _calibration():
    rng = np.random.default_rng(5)
    return [rng.integers(3, 320, (1, 48)) for _ in range(6)]


def _inputs_of(model, name, batches):
    """The input Hessian of sublayer ``name`` on ``model``'s own forward over ``batches``."""
    layer = dict(model.named_sublayers())[name]
    acc = HessianAccumulator(int(layer.weight.shape[0]))
    handle = layer.register_forward_pre_hook(lambda _, inputs: acc.update(inputs[0].numpy()))
    with paddle.no_grad():
        for b in batches:
            model(paddle.to_tensor(b))
    handle.remove()
    return acc.hessian()


def test_each_layer_is_calibrated_on_its_quantized_predecessors(source):
    float_model, _ = load_gguf(source)
    weights = {n: p.numpy() for n, p in float_model.named_parameters()}
    sequential, _ = load_gguf(source)
    result = quantize_(sequential, WeightOnlyConfig(**CONFIG, sequential=True), _calibration())
    plain, _ = load_gguf(source)
    one_pass = quantize_(plain, WeightOnlyConfig(**CONFIG), _calibration())
    seq_names = {n: p.name for n, p in sequential.named_parameters()}
    plain_names = {n: p.name for n, p in plain.named_parameters()}
    for layer in ("layers.0.attn.q_proj", "layers.1.attn.k_proj", "layers.2.attn.v_proj"):
        # reference: GPTQ on the float weight with the Hessian of the quantized model's own inputs to the layer
        # (a q/k/v projection's input depends on the layers before it only)
        hessian = _inputs_of(sequential, layer, _calibration())
        want = gptq(weights[f"{layer}.weight"], hessian, 4, 32)
        np.testing.assert_array_equal(result.codes[seq_names[f"{layer}.weight"]].codes, want.codes, err_msg=layer)
    # inside a layer, every linear is calibrated with that layer still float: put layer 2 back to float and the
    # gate projection's inputs on the quantized layers 0-1 give its Hessian
    for n, p in sequential.named_parameters():
        if n.startswith("layers.2."):
            p.set_value(paddle.to_tensor(weights[n]))
    gate = "layers.2.mlp.gate_proj"
    want = gptq(weights[f"{gate}.weight"], _inputs_of(sequential, gate, _calibration()), 4, 32)
    np.testing.assert_array_equal(result.codes[seq_names[f"{gate}.weight"]].codes, want.codes)
    # the first layer reads float inputs either way; later layers read quantized ones only in sequential order
    first, later = "layers.0.mlp.up_proj.weight", "layers.2.mlp.up_proj.weight"
    np.testing.assert_array_equal(result.codes[seq_names[first]].codes, one_pass.codes[plain_names[first]].codes)
    assert (result.codes[seq_names[later]].codes != one_pass.codes[plain_names[later]].codes).any()
    assert len(result.layers) == len(one_pass.layers) == 21


def test_sequential_needs_a_layer_list():
    net = paddle.nn.Sequential(paddle.nn.Linear(32, 32))
    with pytest.raises(ConfigError, match="the model has no paddle.nn.LayerList of layers"):
        quantize_(net, WeightOnlyConfig(bits=4, group_size=32, algo="gptq", sequential=True),
                  [np.ones((2, 32), np.float32)])
