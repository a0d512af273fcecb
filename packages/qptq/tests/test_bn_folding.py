"""Batch norms are folded into their convs before quantizing, for every target and both IRs, whatever
``optimize_model`` says: the weight scales are the folded weight's, ONNX Runtime runs conv + BN + relu stacks
as chained int8 convs, and what it runs is what the Paddle model simulates."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import paddle
import pytest
from onnx import numpy_helper

from qcore.deploy import get_target
from qcore.deploy.onnx_runtimes import ONNX_FILE
from qcore.graph import open_graph
from qcore.inference import create_predictor, predict, run_predictor
from qcore.model_io import find_model_files, load_model
from qdemo.testing import save_tiny_net
from qptq import quant_post_static

F = paddle.nn.functional
EPSILON = 1e-5  # BatchNorm2D's default


class ConvBnStack(paddle.nn.Layer):
    """Three conv + batch norm + relu units (the first conv with a bias, the others without, as in a ResNet),
    then a global average pool."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = paddle.nn.LayerList([
            paddle.nn.Conv2D(3, 8, 3, padding=1),
            paddle.nn.Conv2D(8, 8, 3, padding=1, bias_attr=False),
            paddle.nn.Conv2D(8, 16, 3, padding=1, bias_attr=False),
        ])
        self.bns = paddle.nn.LayerList([paddle.nn.BatchNorm2D(c) for c in (8, 8, 16)])

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        for conv, bn in zip(self.convs, self.bns):
            x = F.relu(bn(conv(x)))
        return paddle.flatten(F.adaptive_avg_pool2d(x, 1), 1)


def _folded(net: ConvBnStack) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each conv's weight and bias with its batch norm folded in, by hand: w * gamma / sqrt(var + eps) per output
    channel, (b - mean) * gamma / sqrt(var + eps) + beta."""
    folded = []
    for conv, bn in zip(net.convs, net.bns):
        factor = bn.weight.numpy().astype(np.float64) / np.sqrt(bn._variance.numpy().astype(np.float64) + EPSILON)
        bias = conv.bias.numpy() if conv.bias is not None else 0.0
        folded.append((conv.weight.numpy() * factor.reshape(-1, 1, 1, 1),
                       (bias - bn._mean.numpy()) * factor + bn.bias.numpy()))
    return folded


@pytest.fixture(scope="module", params=["pir", "legacy"])
def stack(request, tmp_path_factory):
    """ConvBnStack with trained-looking batch-norm statistics (some scales negative), saved in one IR by
    paddle.jit.save; 16 inputs."""
    directory = tmp_path_factory.mktemp(request.param)
    paddle.seed(0)
    net = ConvBnStack()
    rng = np.random.default_rng(0)
    for bn in net.bns:
        channels = bn._mean.shape[0]
        bn.weight.set_value((rng.uniform(0.3, 3.0, channels) * rng.choice([1, 1, 1, -1], channels)).astype("float32"))
        bn.bias.set_value(rng.normal(0, 0.5, channels).astype("float32"))
        bn._mean.set_value(rng.normal(0, 0.3, channels).astype("float32"))
        bn._variance.set_value(rng.uniform(0.2, 4.0, channels).astype("float32"))
    net.eval()
    save_tiny_net(net, directory / "float", "pir" if request.param == "pir" else "legacy_pdmodel",
                  [paddle.static.InputSpec([None, 3, 8, 8], "float32", "x")])  # paddle.jit.save
    assert load_model(directory / "float").family == request.param
    return directory, net, rng.standard_normal((16, 3, 8, 8)).astype("float32"), request.param


def _quantize(directory, out, x, **options):
    # no optimize_model: PaddleSlim's default (False) must fold too
    return quant_post_static(None, directory / "float", out, sample_generator=lambda: iter(x), batch_size=8,
                             algo="abs_max", save_model_filename=None, save_params_filename=None, **options)


@pytest.fixture(scope="module")
def for_onnxruntime(stack):
    directory, _, x, _ = stack
    _quantize(directory, directory / "ort", x, deploy_backend="onnxruntime")
    return directory / "ort"


def _relative_l2(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.linalg.norm(got - expected) / np.linalg.norm(expected))


def _ort_optimized(onnx_file, level: str, tmp_path) -> onnx.GraphProto:
    """The graph ONNX Runtime runs for ``onnx_file`` at optimization ``level``, as it writes it out."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.optimized_model_filepath = str(tmp_path / f"optimized_{level}.onnx")
    ort.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])
    return onnx.load(options.optimized_model_filepath).graph


@pytest.mark.parametrize("level", ["ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL"])
def test_onnx_runtime_chains_the_int8_convs_with_no_batch_norm_between(for_onnxruntime, level, tmp_path):
    graph = _ort_optimized(for_onnxruntime / ONNX_FILE, level, tmp_path)
    kinds = collections.Counter(n.op_type for n in graph.node)
    assert kinds["BatchNormalization"] == 0
    assert kinds["QLinearConv"] == 3 and not {"Conv", "FusedConv", "NchwcConv"} & set(kinds)  # every conv int8
    producers = {o: n for n in graph.node for o in n.output}

    def writer(name: str) -> str:  # the op writing ``name``, through the layout transposes ORT puts around convs
        node = producers.get(name)
        if node is None:
            return "input"
        return writer(node.input[0]) if node.op_type in ("Transpose", "Identity") else node.op_type

    convs = [n for n in graph.node if n.op_type == "QLinearConv"]
    # the first conv reads the quantized model input, each other one the uint8 output of the conv before it:
    # no DequantizeLinear (and no float op) between them
    assert sorted(writer(n.input[0]) for n in convs) == ["QLinearConv", "QLinearConv", "QuantizeLinear"]
    assert writer(next(n for n in convs if writer(n.input[0]) == "QuantizeLinear").input[0]) == "QuantizeLinear"
    dequantized = {writer(n.input[0]) for n in graph.node if n.op_type == "DequantizeLinear"}
    assert "QLinearConv" not in dequantized  # the last conv's output goes on in int8 to the pool
    assert kinds["QLinearGlobalAveragePool"] == 1 and kinds["QuantizeLinear"] == 1


def test_the_export_holds_the_folded_weights_and_biases_and_nothing_unread(for_onnxruntime, stack):
    _, net, _, family = stack
    model = onnx.load(str(for_onnxruntime / ONNX_FILE))
    assert not [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    read = {name for n in model.graph.node for name in n.input} | {o.name for o in model.graph.output}
    assert [i.name for i in model.graph.initializer if i.name not in read] == []  # no *.bn_folded_bias left over
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    assert len(convs) == 3
    max_code = get_target("onnxruntime").weight_max_code(8, family) or 127
    for conv, (weight, bias) in zip(convs, _folded(net)):
        dq = producers[conv.input[1]]
        assert dq.op_type == "DequantizeLinear" and dq.attribute[0].name == "axis" and dq.attribute[0].i == 0
        codes, steps = inits[dq.input[0]], inits[dq.input[1]]
        # per output channel, from the folded weight (a negative gamma flips the codes, not the step)
        expected_steps = np.abs(weight).max(axis=(1, 2, 3)) / max_code
        np.testing.assert_allclose(steps, expected_steps, rtol=1e-5)
        np.testing.assert_array_equal(codes, np.round(weight / expected_steps.reshape(-1, 1, 1, 1)))
        assert np.abs(codes).max() == max_code  # each channel's largest folded weight is on the last code
        np.testing.assert_allclose(inits[conv.input[2]], bias, rtol=1e-5, atol=1e-6)


def test_paddle_simulates_the_weights_onnx_runtime_runs(for_onnxruntime):
    # the quantized Paddle model's int8 weights and steps are the export's, bit for bit
    stored = sorted(open_graph(load_model(for_onnxruntime)).clone().unquantize().weights, key=lambda w: w.name)
    model = onnx.load(str(for_onnxruntime / ONNX_FILE))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    dqs = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and inits.get(n.input[0]) is not None
           and inits[n.input[0]].dtype == np.int8]
    assert len(stored) == len(dqs) == 3
    exported = sorted(((inits[n.input[0]], inits[n.input[1]]) for n in dqs), key=lambda cs: cs[0].shape)
    for weight, (codes, steps) in zip(sorted(stored, key=lambda w: w.codes.shape), exported):
        np.testing.assert_array_equal(weight.codes, codes)
        np.testing.assert_array_equal(weight.steps.astype(np.float32), steps)


def test_deployed_equals_simulated(for_onnxruntime, stack):
    directory, _, x, _ = stack
    simulated = load_model(for_onnxruntime).run({"x": x})[0]
    deployed = run_predictor(create_predictor(for_onnxruntime / ONNX_FILE, backend="onnxruntime"), {"x": x})[0]
    assert deployed.shape == simulated.shape == (16, 16)
    # int8 kernels round accumulators and int32 biases their own way: within 1 % (relative L2) of the simulation
    assert _relative_l2(deployed, simulated) < 1e-2
    assert _relative_l2(deployed, load_model(directory / "float").run({"x": x})[0]) < 0.1  # still the float net


@pytest.mark.parametrize("backend", [None, "native", "onednn", "openvino"])
def test_every_target_quantizes_the_folded_convs(stack, backend, tmp_path):
    directory, net, x, family = stack
    if backend in ("onednn", "openvino") and family == "pir":
        pytest.skip(f"{backend} runs legacy programs")
    _quantize(directory, tmp_path / "q", x, deploy_backend=backend, optimize_model=False)
    graph = open_graph(load_model(tmp_path / "q"))
    assert not [t for t in graph.op_types() if "batch_norm" in t]
    stored = sorted(graph.clone().unquantize().weights, key=lambda w: w.codes.shape)
    assert len(stored) == 3
    max_code = get_target(backend).weight_max_code(8, family) or 127
    for weight, (folded, _) in zip(stored, sorted(_folded(net), key=lambda wb: wb[0].shape)):
        steps = np.abs(folded).max(axis=(1, 2, 3)) / max_code
        np.testing.assert_allclose(weight.steps.reshape(-1), steps, rtol=1e-5)
        np.testing.assert_array_equal(weight.codes, np.round(folded / steps.reshape(-1, 1, 1, 1)))
    runtime = get_target(backend)  # None: oneDNN's rules, run on oneDNN
    if runtime.host_problem() is None:
        files = find_model_files(tmp_path / "q")
        deployed = predict(files, {"x": x}, backend=runtime.name)[0]
        assert _relative_l2(deployed, load_model(files.directory).run({"x": x})[0]) < 1e-2
