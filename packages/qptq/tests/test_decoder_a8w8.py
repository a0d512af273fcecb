"""A8W8 static PTQ of a decoder's prefill program (issue 40, item 5), called as a PaddleSlim user calls it
(``paddle.enable_static()``, an executor, int64 token windows): a tiny Llama-style decoder built here with what
SmolLM2's port has (RMSNorm reading the residual stream, rotary positions, attention matmuls between two
activations with ``transpose_y``, SwiGLU, the LM head tied to the embedding table through ``transpose_y``)."""

from __future__ import annotations

import math

import numpy as np
import paddle
import pytest

from qcore.deploy.onnx_runtimes import ONNX_FILE
from qcore.deploy.openvino_runtime import PRECISION_ENV
from qcore.inference import create_predictor, run_predictor
from qcore.model_io import load_model
from qptq import quant_post_static

F = paddle.nn.functional
VOCAB, DIM, HEADS, HIDDEN, LAYERS, TOKENS = 96, 32, 4, 64, 2, 16
RUNTIMES = ("onnxruntime", "openvino-runtime")


class RMSNorm(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.weight = self.create_parameter([DIM], default_initializer=paddle.nn.initializer.Constant(1.0))

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return x * paddle.rsqrt(paddle.mean(x * x, axis=-1, keepdim=True) + 1e-5) * self.weight


class Layer(paddle.nn.Layer):
    """Pre-norm attention (rotary, causal) and a SwiGLU feed-forward, each added to the residual stream."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(), RMSNorm()
        self.q, self.k, self.v, self.o = (paddle.nn.Linear(DIM, DIM, bias_attr=False) for _ in range(4))
        self.gate, self.up = (paddle.nn.Linear(DIM, HIDDEN, bias_attr=False) for _ in range(2))
        self.down = paddle.nn.Linear(HIDDEN, DIM, bias_attr=False)

    def forward(self, h, cos, sin, mask):  # noqa: ANN001, ANN201
        batch, length = h.shape[0], h.shape[1]

        def heads(t: paddle.Tensor) -> paddle.Tensor:
            t = t.reshape([batch, length, HEADS, DIM // HEADS]).transpose([0, 2, 1, 3])
            first, second = paddle.chunk(t, 2, axis=-1)
            return t * cos + paddle.concat([-second, first], axis=-1) * sin

        x = self.norm1(h)
        q, k = heads(self.q(x)), heads(self.k(x))
        v = self.v(x).reshape([batch, length, HEADS, DIM // HEADS]).transpose([0, 2, 1, 3])
        scores = paddle.matmul(q, k, transpose_y=True) * (1.0 / math.sqrt(DIM // HEADS)) + mask
        out = paddle.matmul(F.softmax(scores, axis=-1), v).transpose([0, 2, 1, 3]).reshape([batch, length, DIM])
        h = h + self.o(out)
        x = self.norm2(h)
        return h + self.down(F.silu(self.gate(x)) * self.up(x))


class Decoder(paddle.nn.Layer):
    """``input_ids [B, T]`` int64 -> logits ``[B, T, VOCAB]``; the LM head is the embedding table."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = paddle.nn.Embedding(VOCAB, DIM)
        self.layers = paddle.nn.LayerList([Layer() for _ in range(LAYERS)])
        self.norm = RMSNorm()

    def forward(self, input_ids: paddle.Tensor) -> paddle.Tensor:
        length = input_ids.shape[1]
        pos = paddle.arange(0, length, dtype="float32")
        inv = paddle.to_tensor(1.0 / 10000.0 ** (np.arange(0, DIM // HEADS, 2, dtype=np.float32) / (DIM // HEADS)))
        freqs = pos.unsqueeze(1) * inv.unsqueeze(0)
        angles = paddle.concat([freqs, freqs], axis=-1)
        mask = paddle.cast(pos.unsqueeze(0) > pos.unsqueeze(1), "float32") * -1e30
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, paddle.cos(angles), paddle.sin(angles), mask)
        return paddle.matmul(self.norm(h), self.embed.weight, transpose_y=True)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    """The saved PIR prefill program, token windows for calibration and for evaluation (disjoint)."""
    paddle.seed(0)
    net = Decoder()
    net.eval()
    for layer in net.layers:  # the few large residual channels real decoders have
        gamma = np.ones(DIM, np.float32)
        gamma[[2, 19]] = 12.0
        layer.norm1.weight.set_value(gamma)
    gamma = np.ones(DIM, np.float32)
    gamma[[5, 23]] = 12.0
    net.norm.weight.set_value(gamma)  # and the LM head's input: smoothing it would pay, but the table is tied
    directory = tmp_path_factory.mktemp("decoder") / "prefill"
    paddle.jit.save(net, str(directory / "inference"),
                    input_spec=[paddle.static.InputSpec([None, None], "int64", "input_ids")])
    rng = np.random.default_rng(0)
    windows = rng.integers(0, VOCAB, (12, TOKENS)).astype(np.int64)
    return directory, windows[:8], windows[8:]


def _quantize(directory, calibration, out, backend: str, algo: str = "KL") -> dict:
    paddle.enable_static()
    try:
        executor = paddle.static.Executor(paddle.CPUPlace())
        return quant_post_static(executor, str(directory), str(out), batch_size=2, algo=algo,
                                 sample_generator=lambda: iter([[w] for w in calibration]),
                                 deploy_backend=backend, quantizable_op_type=["matmul"])
    finally:
        paddle.disable_static()


def _relative_l2(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.linalg.norm(got - expected) / np.linalg.norm(expected))


@pytest.fixture(scope="module", params=RUNTIMES)
def quantized(request, decoder, tmp_path_factory):
    directory, calibration, _ = decoder
    out = tmp_path_factory.mktemp(request.param) / "a8w8"
    return request.param, out, _quantize(directory, calibration, out, request.param, algo="abs_max")


def test_a_decoder_prefill_quantizes_for_the_onnx_runtimes_and_deploys_as_simulated(decoder, quantized, monkeypatch):
    directory, _, evaluation = decoder
    backend, out, _ = quantized
    monkeypatch.setenv(PRECISION_ENV, "f32")  # the OpenVINO runtime's float ops run bf16 by default on BF16 CPUs
    feed = {"input_ids": evaluation}
    reference = load_model(directory).run(feed)[0]
    simulated = load_model(out).run(feed)[0]
    assert simulated.shape == (len(evaluation), TOKENS, VOCAB)
    assert 0.0 < _relative_l2(simulated, reference) < 0.12  # random weights, 32 wide: int8 costs a few %
    deployed = run_predictor(create_predictor(out / ONNX_FILE, backend=backend), feed)[0]
    assert _relative_l2(deployed, simulated) < 1e-2


def test_the_residual_stream_stays_float_and_attention_follows_the_targets_rule(quantized):
    backend, _, report = quantized
    layers = report["layers"]
    weighted = [layer for layer in layers if "weight" in layer]
    assert len(weighted) == 7 * LAYERS + 1  # q k v o gate up down per layer, and the tied LM head
    assert weighted[-1]["weight"]["name"] == "embedding_0.w_0"
    # the residual sums an RMSNorm reads (x * x) stay float, and so do their readers: the quantized joins are the
    # rotary sums of q and k (read by Q K^T), not the residual adds
    joins = [layer for layer in layers if layer["op"] == "elementwise_add" and "left_float" not in layer]
    assert len(joins) == 2 * LAYERS
    assert all(name.startswith("multiply_") for layer in joins for name in layer["inputs"])
    assert not any(layer.get("runs_float") for layer in layers)
    attention = [layer for layer in layers if layer["op"] == "mul" and "weight" not in layer]
    assert len(attention) == 2 * LAYERS  # Q K^T and scores V
    if backend == "openvino-runtime":  # its CPU plugin fuses attention: both stay float
        assert all(layer["left_float"].startswith(backend) for layer in attention)
    else:
        assert all("left_float" not in layer and len(layer["inputs"]) == 2 for layer in attention)


def test_smoothing_leaves_the_tied_lm_head_alone_and_keeps_the_decoder(decoder, tmp_path):
    """algo="auto" smooths the matmul inputs; the LM head's weight is the embedding table, whose rows scaled for
    the head would scale every token's embedding too (here 0.43 off the float logits; SmolLM2's perplexity
    went from 12 to 1700)."""
    directory, calibration, evaluation = decoder
    report = _quantize(directory, calibration, tmp_path / "auto", "onnxruntime", algo="auto")
    feed = {"input_ids": evaluation}
    reference = load_model(directory).run(feed)[0]
    error = _relative_l2(load_model(tmp_path / "auto").run(feed)[0], reference)
    assert 0.0 < error < 0.12
    smoothed = [name for name, choice in report["smoothing"].items() if choice["alpha"] is not None]
    assert len(report["smoothing"]) == 4 * LAYERS  # the inputs of q/k/v, o, gate/up and down; not the LM head's
    assert smoothed
