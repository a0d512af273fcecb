"""PTQ of a transformer encoder layer: the attention-matmul rule of each target, and the accuracy budget with
``algo="auto"`` (smoothing) plus ``max_output_error``."""

from __future__ import annotations

import math

import numpy as np
import paddle
import pytest

from qcore.model_io import load_model
from qptq import PostTrainingQuantization, quant_post_static
from qptq.budget import output_error

DIM, HEADS, TOKENS = 32, 4, 12
BUDGET_BATCHES = 4  # qptq.static.BUDGET_BATCHES: the calibration batches the label-free budget scores on


class Encoder(paddle.nn.Layer):
    """One post-LayerNorm encoder layer (self-attention with a padding mask, GELU feed-forward), as BERT's."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (paddle.nn.Linear(DIM, DIM) for _ in range(4))
        self.up, self.down = paddle.nn.Linear(DIM, 4 * DIM), paddle.nn.Linear(4 * DIM, DIM)
        self.norm1, self.norm2 = paddle.nn.LayerNorm(DIM), paddle.nn.LayerNorm(DIM)

    def forward(self, x: paddle.Tensor, mask: paddle.Tensor) -> paddle.Tensor:
        def heads(t: paddle.Tensor) -> paddle.Tensor:
            return t.reshape([0, 0, HEADS, DIM // HEADS]).transpose([0, 2, 1, 3])

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        bias = (1.0 - mask.unsqueeze([1, 2])) * -10000.0
        scores = paddle.matmul(q, k, transpose_y=True) / math.sqrt(DIM // HEADS) + bias
        context = paddle.matmul(paddle.nn.functional.softmax(scores), v).transpose([0, 2, 1, 3]).reshape([0, 0, DIM])
        h = self.norm1(x + self.o(context))
        return self.norm2(h + self.down(paddle.nn.functional.gelu(self.up(h))))


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    paddle.seed(0)
    net = Encoder()
    net.eval()
    gamma = np.ones(DIM, np.float32)
    gamma[[3, 17]] = 30.0  # the outlier channels transformer LayerNorms have
    net.norm1.weight.set_value(gamma)
    directory = tmp_path_factory.mktemp("encoder") / "pir"
    spec = [paddle.static.InputSpec([None, None, DIM], "float32", "x"),
            paddle.static.InputSpec([None, None], "float32", "mask")]
    paddle.jit.save(net, str(directory / "inference"), input_spec=spec)
    rng = np.random.default_rng(0)
    batches = []
    for tokens in (TOKENS, TOKENS - 4, TOKENS, TOKENS - 2):  # padded sequences of different lengths per batch
        mask = np.ones((8, tokens), np.float32)
        mask[::2, tokens // 2:] = 0.0
        batches.append({"x": rng.standard_normal((8, tokens, DIM)).astype(np.float32), "mask": mask})
    return directory, batches


def _quantize(directory, batches, out, **budget):
    return quant_post_static(None, directory, out, batch_generator=lambda: iter(batches), algo="auto",
                             quantizable_op_type=["mul"], deploy_backend="native", save_model_filename=None,
                             save_params_filename=None, **budget)


def _error(directory, out, batches) -> float:
    float_model, quantized = load_model(directory), load_model(out)
    reference = [float_model.run(b)[0] for b in batches]
    return output_error([quantized.run(b)[0] for b in batches], reference)


def test_the_budget_keeps_the_most_sensitive_encoder_layers_float_until_the_output_error_is_within_it(
        encoder, tmp_path):
    directory, batches = encoder
    scored = batches[:BUDGET_BATCHES]
    _quantize(directory, batches, tmp_path / "int8")
    all_int8 = _error(directory, tmp_path / "int8", scored)
    limit = all_int8 / 3  # a budget all-int8 misses
    report = _quantize(directory, batches, tmp_path / "budget", max_output_error=limit)
    budget = report["budget"]
    assert budget["met"] and budget["metric"] == "output_error" and budget["limit"] == limit
    assert 0 < budget["float_layers"] < 6  # some of q, k, v, o, up, down stay float, not all
    assert len(budget["sensitivity"]) == 6  # every weighted layer ranked
    float_layers = [layer for layer in report["layers"] if "left_float" in layer]
    assert len(float_layers) == budget["float_layers"]
    assert all(layer["left_float"].startswith("accuracy budget: sensitivity rank") for layer in float_layers)
    assert report["smoothing"]  # auto smoothed the LayerNorm output before the budget ranked the layers
    within = _error(directory, tmp_path / "budget", scored)
    assert within <= limit < all_int8
    chosen = next(c for c in budget["candidates"] if c["float_layers"] == budget["float_layers"])
    assert chosen["score"] == pytest.approx(within, rel=1e-3)  # the saved model is the candidate measured


@pytest.mark.parametrize(("backend", "attention_float"), [("openvino-runtime", True), ("onnxruntime", False)])
def test_attention_matmuls_follow_the_targets_rule_when_matmul_is_asked_for(encoder, backend, attention_float):
    directory, batches = encoder
    ptq = PostTrainingQuantization(model_dir=directory, batch_generator=lambda: iter(batches), algo="hist",
                                   quantizable_op_type=["mul", "matmul"], deploy_backend=backend)
    ptq.quantize()
    linear = [layer for layer in ptq.report["layers"] if "weight" in layer]
    attention = [layer for layer in ptq.report["layers"] if "weight" not in layer]
    assert len(linear) == 6 and len(attention) == 2  # q, k, v, o, up, down; Q K^T and scores V
    if attention_float:  # OpenVINO's fused attention runs faster without QDQ inside it
        assert all(layer["left_float"].startswith(f"{backend}: its CPU plugin runs attention") for layer in attention)
    else:  # ONNX Runtime runs both operands int8
        assert all("left_float" not in layer and len(layer["inputs"]) == 2 for layer in attention)


def _simulated_error(directory, batches, **options) -> float:
    ptq = PostTrainingQuantization(model_dir=directory, batch_generator=lambda: iter(batches), algo="hist",
                                   **options)
    ptq.quantize()
    float_model = load_model(directory)
    return output_error([ptq.graph.run(b)[0] for b in batches], [float_model.run(b)[0] for b in batches])


@pytest.mark.parametrize("backend", ["openvino-runtime", None])
def test_is_full_quantize_keeps_joins_read_by_a_normalization_float(encoder, backend):
    directory, batches = encoder
    ptq = PostTrainingQuantization(model_dir=directory, batch_generator=lambda: iter(batches), algo="hist",
                                   is_full_quantize=True, deploy_backend=backend)
    ptq.quantize()
    joins = [layer for layer in ptq.report["layers"] if layer["op"] == "elementwise_add"
             and layer.get("left_float", "").startswith("a residual join read by a normalization")]
    assert len(joins) == 3  # scores + mask (softmax), x + attention and h + FFN (LayerNorm)
    linear_only = _simulated_error(directory, batches, deploy_backend=backend, quantizable_op_type=["mul"])
    full = _simulated_error(directory, batches, deploy_backend=backend, is_full_quantize=True)
    assert full < 1.5 * linear_only  # the bias adds, pools and other ops it adds cost little more
