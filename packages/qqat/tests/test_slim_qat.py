"""SlimQAT / SlimQuantConfig (Paddle's QuantConfig flow) and PaddleSlim's quanter factories in qqat.quanters."""

from __future__ import annotations

import collections
import math
from pathlib import Path

import numpy as np
import paddle
import pytest
from paddle.quantization import QAT, QuantConfig
from paddle.quantization.observers import AbsmaxObserver
from paddle.quantization.quanters import FakeQuanterWithAbsMaxObserver
from paddle.quantization.quanters.abs_max import FakeQuanterWithAbsMaxObserverLayer

from qcore.errors import ConfigError, QuantError
from qcore.inference import predict
from qcore.model_io import export_layer, find_model_files, load_model
from qqat import SlimQAT, SlimQuantConfig
from qqat.quanters import ActLSQplusQuanter, PACTQuanter, WeightLSQplusQuanter

WEIGHTED = (paddle.nn.Conv2D, paddle.nn.Linear)


def _qdq_counts(directory: Path) -> collections.Counter:
    model = load_model(directory)
    ops = model.program.global_block().ops
    return collections.Counter(op.type for op in ops if op.type.endswith("quantize_linear"))


def _save(model: paddle.nn.Layer, directory: Path, shape: list[int | None]) -> None:
    """paddle.jit.save in the legacy family (Paddle 3.3.1's PIR save of LinearQuanter layers runs wrongly)."""
    export_layer(model, directory / "model", [paddle.static.InputSpec(shape, "float32", "x")], "legacy")


def _train(model: paddle.nn.Layer, x: paddle.Tensor, y: paddle.Tensor, steps: int, lr: float = 0.01) -> list[float]:
    opt = paddle.optimizer.SGD(lr, parameters=model.parameters())
    model.train()
    losses = []
    for _ in range(steps):
        loss = paddle.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.clear_grad()
        losses.append(float(loss))
    return losses


def _paddles_qat_reference(x: paddle.Tensor, tmp: Path) -> collections.Counter:
    """Paddle's own QAT + convert on the same model, saved the same way.

    Paddle 3.3.1's convert fails on its FakeQuanterWithAbsMaxObserver (see
    test_paddles_convert_fails_on_its_fake_quanter), so the reference quantizes with its AbsmaxObserver,
    whose convert works: one weight and one activation quanter per Conv2D / Linear, as in the SlimQAT run.
    """
    paddle.seed(0)
    net = paddle.vision.models.resnet18(num_classes=10)
    config = QuantConfig(activation=None, weight=None)
    config.add_type_config(list(WEIGHTED), activation=AbsmaxObserver(), weight=AbsmaxObserver())
    qat = QAT(config)
    model = qat.quantize(net, inplace=True)
    model.eval()
    model(x)
    _save(qat.convert(model, inplace=True), tmp / "paddle", [None, 3, 32, 32])
    return _qdq_counts(tmp / "paddle")


def test_slim_qat_with_paddles_quanter_on_resnet18(tmp_path: Path) -> None:
    paddle.seed(0)
    net = paddle.vision.models.resnet18(num_classes=10)
    weighted = sum(isinstance(layer, WEIGHTED) for layer in net.sublayers())
    quanter = FakeQuanterWithAbsMaxObserver(moving_rate=0.9)
    config = SlimQuantConfig(activation=None, weight=None)
    config.add_type_config(paddle.nn.Conv2D, activation=quanter, weight=quanter)
    config.add_type_config(paddle.nn.Linear, activation=quanter, weight=quanter)
    x = paddle.to_tensor(np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype("float32"))
    y = paddle.to_tensor([[1], [3]])

    qat = SlimQAT(config)
    model = qat.quantize(net, inplace=True, inputs=x)
    quanted = [layer for layer in model.sublayers() if type(layer).__name__ in ("QuantedConv2D", "QuantedLinear")]
    assert len(quanted) == weighted == 21
    assert all(isinstance(q.weight_quanter, FakeQuanterWithAbsMaxObserverLayer)
               and isinstance(q.activation_quanter, FakeQuanterWithAbsMaxObserverLayer) for q in quanted)

    before = {name: p.numpy().copy() for name, p in model.named_parameters() if p.trainable}
    losses = _train(model, x, y, steps=2)
    assert all(math.isfinite(v) for v in losses)
    changed = [n for n, p in model.named_parameters() if n in before and not np.array_equal(before[n], p.numpy())]
    assert len(changed) == len(before)  # every trainable parameter moved
    assert model.conv1.activation_quanter.scales().item() != pytest.approx(0.001)  # the observer ran

    model.eval()
    simulated = model(x).numpy()
    converted = qat.convert(model, inplace=True)
    assert type(converted.conv1.activation_quanter._quanter).__name__ == "LinearQuanter"
    assert type(converted.conv1.weight_quanter._dequanter).__name__ == "LinearDequanter"
    assert converted.conv1.weight_quanter._quanter is None
    codes = converted.conv1.weight.numpy()
    assert np.array_equal(codes, np.round(codes)) and np.abs(codes).max() <= 128  # stored as integer codes
    out = converted(x).numpy()
    # Paddle's training op saturates negatives at code -127, quantize_linear at -128: the only difference
    assert np.abs(out - simulated).max() < 0.05 * np.abs(simulated).max()

    _save(converted, tmp_path / "slim", [None, 3, 32, 32])
    ours = _qdq_counts(tmp_path / "slim")
    assert ours == {"quantize_linear": weighted, "dequantize_linear": 2 * weighted}  # activations; + weights
    assert ours == _paddles_qat_reference(x, tmp_path)

    loaded = load_model(tmp_path / "slim").run({"x": x.numpy()})[0]
    np.testing.assert_allclose(loaded, out, atol=1e-4 * np.abs(out).max())
    deployed = predict(find_model_files(tmp_path / "slim"), {"x": x.numpy()}, backend="native")[0]
    np.testing.assert_allclose(deployed, out, atol=1e-4 * np.abs(out).max())


def test_paddles_convert_fails_on_its_fake_quanter() -> None:
    """Why SlimQAT.convert wraps quanters without zero points: Paddle 3.3.1's own convert cannot take them.

    When this starts failing, Paddle fixed LinearQuanter.from_quanter and the wrapper can go.
    """
    quanter = FakeQuanterWithAbsMaxObserver()
    config = QuantConfig(activation=None, weight=None)
    config.add_type_config(paddle.nn.Linear, activation=quanter, weight=quanter)
    qat = QAT(config)
    model = qat.quantize(paddle.nn.Sequential(paddle.nn.Linear(4, 2)), inplace=True)
    model(paddle.ones([1, 4]))
    with pytest.raises(TypeError, match="NoneType"):
        qat.convert(model, inplace=True)


def _small_net() -> paddle.nn.Layer:
    paddle.seed(1)
    return paddle.nn.Sequential(
        paddle.nn.Conv2D(3, 8, 3, padding=1), paddle.nn.BatchNorm2D(8), paddle.nn.ReLU(),
        paddle.nn.Conv2D(8, 8, 3, stride=2, padding=1), paddle.nn.ReLU(),
        paddle.nn.Flatten(), paddle.nn.Linear(8 * 8 * 8, 10),
    )  # fmt: skip


@pytest.mark.parametrize("activation, weight, trained", [
    (PACTQuanter(FakeQuanterWithAbsMaxObserver(moving_rate=0.9), init_value=1.0, learning_rate=10.0),
     WeightLSQplusQuanter(per_channel=True, batch_init=2), 6),  # 3 alphas, 3 weight steps
    (ActLSQplusQuanter(batch_init=2), FakeQuanterWithAbsMaxObserver(), 3),  # 3 activation steps
], ids=["pact-act+lsq-weight", "lsq-act+paddle-weight"])  # fmt: skip
def test_our_quanters_train_and_export(tmp_path: Path, activation, weight, trained: int) -> None:
    rng = np.random.default_rng(0)
    x = paddle.to_tensor(rng.standard_normal((8, 3, 16, 16)).astype("float32") * 2)
    y = paddle.to_tensor(rng.integers(0, 10, (8, 1)))
    config = SlimQuantConfig(activation=None, weight=None)
    config.add_type_config([paddle.nn.Conv2D, paddle.nn.Linear], activation=activation, weight=weight)
    qat = SlimQAT(config)
    model = qat.quantize(_small_net(), inputs=x)
    learned = {name: p.numpy().copy() for name, p in model.named_parameters() if name.endswith(("alpha", "step"))}
    assert len(learned) == trained

    losses = _train(model, x, y, steps=12, lr=0.05)
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    moved = [n for n, p in model.named_parameters() if n in learned and not np.array_equal(learned[n], p.numpy())]
    assert moved == list(learned)  # every alpha / step was trained

    model.eval()
    simulated = model(x).numpy()
    converted = qat.convert(model)
    out = converted(x).numpy()
    assert np.abs(out - simulated).max() < 0.05 * np.abs(simulated).max()
    _save(converted, tmp_path, [None, 3, 16, 16])
    assert _qdq_counts(tmp_path) == {"quantize_linear": 3, "dequantize_linear": 6}
    loaded = load_model(tmp_path).run({"x": x.numpy()})[0]
    np.testing.assert_allclose(loaded, out, atol=1e-4 * np.abs(out).max())


def test_pact_clips_at_the_quantized_alpha_and_learns_alpha() -> None:
    layer = PACTQuanter(FakeQuanterWithAbsMaxObserver(), init_value=2.0)._instance(paddle.nn.Linear(2, 2))
    layer.scales().set_value(np.array([3.0], np.float32))  # the inner quanter's threshold
    layer.eval()
    x = paddle.to_tensor([-5.0, -2.5, -1.0, 0.3, 1.7, 2.5, 5.0], stop_gradient=False)
    out = layer(x)
    step = 3.0 / 127
    quantized_alpha = round(2.0 / step) * step  # 85 codes: 2.00787..., not alpha itself
    expected = np.round(np.clip(x.numpy(), -2.0, 2.0) / step) * step
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6)
    np.testing.assert_allclose(out.numpy()[[0, 1]], -quantized_alpha, rtol=1e-6)
    np.testing.assert_allclose(out.numpy()[[5, 6]], quantized_alpha, rtol=1e-6)
    weights = paddle.to_tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])
    (out * weights).sum().backward()
    assert layer.alpha.grad.item() == pytest.approx((6 + 7) - (1 + 2))  # +1 clipped above, -1 clipped below
    np.testing.assert_allclose(x.grad.numpy(), [0, 0, 3, 4, 5, 0, 0])

    as_in_paddleslim = PACTQuanter(quanter=FakeQuanterWithAbsMaxObserverLayer)._instance(paddle.nn.Linear(2, 2))
    assert isinstance(as_in_paddleslim.quanter, FakeQuanterWithAbsMaxObserverLayer)  # a layer class works too


def test_weight_lsq_forward_start_and_scale_gradient() -> None:
    paddle.seed(3)
    conv = paddle.nn.Conv2D(4, 3, 3)
    quanter = WeightLSQplusQuanter(per_channel=True)._instance(conv)
    quanter.train()
    w = conv.weight
    out = quanter(w)
    w_np = w.numpy().reshape(3, -1).astype(np.float64)
    mean, std = w_np.mean(1), w_np.std(1, ddof=1)
    step = np.maximum(np.abs(mean - 3 * std), np.abs(mean + 3 * std)) / 127  # LSQ+'s start, per output channel
    np.testing.assert_allclose(quanter.step.numpy(), step, rtol=1e-5)
    s = step.reshape(3, 1, 1, 1)
    codes = np.clip(np.round(w.numpy() / s), -128, 127)
    np.testing.assert_allclose(out.numpy(), codes * s, rtol=1e-5, atol=1e-7)  # round(clip(w / s)) * s by hand
    np.testing.assert_allclose(quanter.scales().numpy(), step * 127, rtol=1e-5)  # quantize_linear's Scale
    assert quanter.quant_axis() == 0

    upstream = np.random.default_rng(1).standard_normal(w.shape).astype(np.float32)
    (out * paddle.to_tensor(upstream)).sum().backward()
    v = w.numpy() / s
    inside = (np.round(v) >= -128) & (np.round(v) <= 127)
    g = 1 / math.sqrt(w_np.shape[1] * 127)
    d_step = np.where(inside, np.round(v) - v, np.clip(np.round(v), -128, 127)) * upstream * g
    np.testing.assert_allclose(quanter.step.grad.numpy(), d_step.reshape(3, -1).sum(1), rtol=1e-4, atol=1e-7)
    assert np.all(np.abs(quanter.step.grad.numpy()) > 0)


def test_act_lsq_forward_gradient_and_offset() -> None:
    x_np = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)
    symmetric = ActLSQplusQuanter(batch_init=1)._instance(paddle.nn.Linear(6, 2))  # the first batch sets the step
    symmetric.train()
    x = paddle.to_tensor(x_np, stop_gradient=False)
    out = symmetric(x)
    s = np.abs(x_np).max() / 127
    assert symmetric.step.item() == pytest.approx(s, rel=1e-6)
    np.testing.assert_allclose(out.numpy(), np.clip(np.round(x_np / s), -128, 127) * s, rtol=1e-5, atol=1e-7)
    symmetric.step.set_value(np.array([s / 2], np.float32))  # now the largest values clip
    out = symmetric(x)
    v = x_np / (s / 2)
    np.testing.assert_allclose(out.numpy(), np.clip(np.round(v), -128, 127) * s / 2, rtol=1e-5, atol=1e-7)
    out.sum().backward()
    expected = np.where(np.abs(np.round(v)) <= 127, np.round(v) - v, np.clip(np.round(v), -128, 127)).sum()
    assert symmetric.step.grad.item() == pytest.approx(expected / math.sqrt(6 * 127), rel=1e-4)
    assert symmetric.step.grad.item() != 0

    asymmetric = ActLSQplusQuanter(symmetric=False)._instance(paddle.nn.Linear(6, 2))
    asymmetric.train()
    relu = np.maximum(x_np, 0)
    out = asymmetric(paddle.to_tensor(relu))
    step = relu.max() / 255  # min..max over the 255 steps of the 8-bit grid
    beta = 0 + step * 128
    assert asymmetric.step.item() == pytest.approx(step, rel=1e-5)
    assert asymmetric.offset.item() == pytest.approx(beta, rel=1e-5)
    expected = np.clip(np.round((relu - beta) / step), -128, 127) * step + beta
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_quantize_names_the_quanters_the_inputs_never_reach(caplog: pytest.LogCaptureFixture) -> None:
    class TwoHeads(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.used, self.unused = paddle.nn.Linear(4, 2), paddle.nn.Linear(4, 2)

        def forward(self, x: paddle.Tensor) -> paddle.Tensor:
            return self.used(x)

    quanter = FakeQuanterWithAbsMaxObserver()
    config = SlimQuantConfig(activation=None, weight=None)
    config.add_type_config(paddle.nn.Linear, activation=quanter, weight=quanter)
    model = TwoHeads()
    model.eval()
    with caplog.at_level("WARNING", logger="qqat.slim_qat"):
        quantized = SlimQAT(config).quantize(model, inputs=[paddle.ones([1, 4])])
    assert "never reaches 2 quanter(s): unused.weight_quanter, unused.activation_quanter" in caplog.text
    assert not quantized.training and quantized is not model and type(model.used).__name__ == "Linear"


def test_bad_input_is_one_line() -> None:
    quanter = FakeQuanterWithAbsMaxObserver()
    config = SlimQuantConfig(activation=None, weight=None)
    failures = {
        "layer type": lambda: config.add_type_config("Conv2D", activation=quanter, weight=quanter),
        "layer instance as type": lambda: config.add_type_config(paddle.nn.Linear(2, 2), weight=quanter),
        "quanter layer": lambda: config.add_type_config(paddle.nn.Conv2D, weight=FakeQuanterWithAbsMaxObserverLayer),
        "factory class": lambda: SlimQuantConfig(activation=FakeQuanterWithAbsMaxObserver, weight=None),
        "not a quanter": lambda: config.add_type_config(paddle.nn.Conv2D, activation="abs_max"),
        "name": lambda: config.add_name_config(3, activation=quanter),
        "layer": lambda: config.add_layer_config("fc", activation=quanter),
        "constraints": lambda: config.add_constraints(object()),
        "dict config": lambda: SlimQAT({"weight_bits": 8}),
        "act per channel": lambda: ActLSQplusQuanter(per_channel=True),
        "act unsigned": lambda: ActLSQplusQuanter(sign=False),
        "weight offset": lambda: WeightLSQplusQuanter(symmetric=False),
        "bits": lambda: WeightLSQplusQuanter(quant_bits=1),
        "pact inner": lambda: PACTQuanter(quanter="abs_max"),
    }
    for what, call in failures.items():
        with pytest.raises(ConfigError) as info:
            call()
        assert "\n" not in str(info.value) and len(str(info.value)) < 300, what

    named = SlimQuantConfig(activation=None, weight=None)
    named.add_name_config("linear_999", activation=quanter, weight=quanter)
    with pytest.raises(ConfigError, match="linear_999"):
        SlimQAT(named).quantize(paddle.nn.Sequential(paddle.nn.Linear(2, 2)))

    offset = SlimQuantConfig(activation=None, weight=None)
    offset.add_type_config(paddle.nn.Linear, activation=ActLSQplusQuanter(symmetric=False), weight=quanter)
    qat = SlimQAT(offset)
    model = qat.quantize(paddle.nn.Sequential(paddle.nn.Linear(2, 2)))
    model(paddle.ones([1, 2]))
    with pytest.raises(ConfigError, match=r"cannot convert 0\.activation_quanter: .*symmetric=True"):
        qat.convert(model)

    with pytest.raises(QuantError, match="quantize expects a paddle.nn.Layer"):
        SlimQAT(config).quantize("model")


@pytest.mark.parametrize("backend", [None, "openvino"])
def test_save_quantized_model_runs_on_onednn_and_the_targets_like_any_qdq_model(tmp_path: Path, backend) -> None:
    """paddle.jit.save keeps Paddle's float32 weight codes, which oneDNN int8 runs wrongly (9.75 % top-1 on the
    demo); SlimQAT.save_quantized_model stores them as int8 and saves through the deployment target's door."""
    from qdemo import load_demo_data
    from qdemo.net import load_demo_net

    paddle.disable_static()
    config = SlimQuantConfig(activation=FakeQuanterWithAbsMaxObserver(moving_rate=0.9),
                             weight=FakeQuanterWithAbsMaxObserver(moving_rate=0.9))
    qat = SlimQAT(config)
    net = load_demo_net("legacy")
    quantized = qat.quantize(net, inplace=False)
    calib, _ = load_demo_data("calib")
    quantized.train()
    with paddle.no_grad():  # observers only: the scales settle on real data, no weight changes
        for i in range(0, 200, 20):
            quantized(paddle.to_tensor(calib[i : i + 20]))
    converted = qat.convert(quantized, inplace=False)
    converted.eval()
    spec = [paddle.static.InputSpec([None, 1, 28, 28], "float32", "x")]
    files = qat.save_quantized_model(converted, tmp_path / "int8" / "model", spec, deploy_backend=backend)
    x, y = load_demo_data("test")
    x, y = x[:500], y[:500]
    float_top1 = (net(paddle.to_tensor(x)).numpy().argmax(1) == y).mean()
    native = predict(files, {"x": x}, backend="native")[0]
    deployed = predict(files, {"x": x}, backend=backend or "onednn")[0]
    assert (native.argmax(1) == y).mean() >= float_top1 - 0.02
    assert (deployed.argmax(1) == native.argmax(1)).mean() >= 0.97  # oneDNN / OpenVINO run what was trained
    graph_types = {op.type for op in load_model(files).program.global_block().ops}
    assert "dequantize_linear" in graph_types
    from qcore.graph import open_graph

    graph = open_graph(load_model(files))
    ops = load_model(files).program.global_block().ops
    stored = {op.input("X")[0] for op in ops if op.type == "dequantize_linear"} & set(graph.param_names())
    codes = [n for n in stored if graph.get_param(n).dtype == np.int8]
    assert len(codes) == 6  # the demo net's 5 convs (one depthwise) and its fc, stored as int8 codes
