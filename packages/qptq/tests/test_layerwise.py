"""Layer-wise methods: eager replay of ops, ``algo="auto"``, AdaRound, and the sensitivity ranking."""

from __future__ import annotations

import os

import numpy as np
import paddle
import pytest

from qcore.graph import open_graph
from qcore.graph.replay import ARRAY_HANDLERS, LayerReplay, replayable
from qcore.inference import predict
from qcore.model_io import load_model
from qcore.paddle_env import cpu_threads
from qcore.quant import asymmetric_range, fake_quantize, qmax
from qdemo.testing import save_tiny_net
from qptq import quant_post_static
from qptq.adaround import AdaRoundSettings, adaround
from qptq.static import LAYERWISE_SAMPLES

SHAPE = (3, 12, 12)


class EveryReplayable(paddle.nn.Layer):
    """Strided/padded/grouped convs, a transposed conv, a plain and (PIR only: Paddle 3.3's legacy
    export of a bare ``paddle.matmul`` on a parameter fails) a transposed matmul."""

    def __init__(self, transposed_matmul: bool) -> None:
        super().__init__()
        self.conv = paddle.nn.Conv2D(3, 8, 3, stride=2, padding=[1, 0], dilation=1)
        self.dw = paddle.nn.Conv2D(8, 8, 3, padding=2, dilation=2, groups=8)
        self.grouped = paddle.nn.Conv2D(8, 8, 1, groups=2)
        self.up = paddle.nn.Conv2DTranspose(8, 4, 3, stride=2, padding=1, output_padding=1)
        self.fc = paddle.nn.Linear(4 * 12 * 10, 16)
        self.proj = self.create_parameter([5, 16]) if transposed_matmul else None

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        y = paddle.nn.functional.relu(self.conv(x))
        y = self.grouped(paddle.nn.functional.relu(self.dw(y)))
        y = self.fc(paddle.flatten(self.up(y), 1))
        return y if self.proj is None else paddle.matmul(y, self.proj, transpose_y=True)


@pytest.mark.parametrize("fmt", ["pir", "legacy_pdmodel"])
def test_eager_replay_gives_each_ops_own_output(tmp_path, fmt):
    paddle.seed(3)
    net = EveryReplayable(transposed_matmul=fmt == "pir")
    net.eval()
    spec = [paddle.static.InputSpec([None, *SHAPE], "float32", "x")]
    save_tiny_net(net, tmp_path / fmt, fmt, spec)
    graph = open_graph(load_model(tmp_path / fmt))
    ops = [op for op in graph.ops() if replayable(graph, op)]
    assert {op.seed_type for op in ops} >= {"conv2d", "depthwise_conv2d", "conv2d_transpose", "mul"}
    assert len(ops) == (6 if fmt == "pir" else 5)
    x = np.random.default_rng(0).standard_normal((4, *SHAPE)).astype("float32")
    inputs = [graph.activation_operands(op)[0].value for op in ops]
    fetched = graph.run({"x": x}, inputs + [graph.output(op) for op in ops])
    for op, xi, yi in zip(ops, fetched[: len(ops)], fetched[len(ops):]):
        w = paddle.to_tensor(graph.get_param(graph.weight_operand(op).name))
        replay = LayerReplay(graph, op)
        y = replay(paddle.to_tensor(xi), w).numpy()
        np.testing.assert_allclose(y, yi, rtol=1e-4, atol=1e-5 * float(np.abs(yi).max()), err_msg=repr(op))
        y_array = replay.array(xi, w.numpy())  # numpy's BLAS for the matmul kinds, Paddle's kernels otherwise
        assert isinstance(y_array, np.ndarray) and y_array.dtype == np.float32
        np.testing.assert_allclose(y_array, yi, rtol=1e-4, atol=1e-5 * float(np.abs(yi).max()), err_msg=repr(op))
    assert sum(op.type in ARRAY_HANDLERS for op in ops) == (2 if fmt == "pir" else 1)


def test_cpu_threads_uses_every_core_for_the_body_and_restores_paddles_default(monkeypatch):
    calls = []
    monkeypatch.setattr(paddle.base.core, "set_num_threads", calls.append)
    default = paddle.get_flags(["FLAGS_paddle_num_threads"])["FLAGS_paddle_num_threads"]
    with pytest.raises(RuntimeError), cpu_threads():
        assert calls == [len(os.sched_getaffinity(0))]
        raise RuntimeError("the body failed")
    assert calls == [len(os.sched_getaffinity(0)), default]


@pytest.mark.parametrize("asymmetric", [False, True])
def test_auto_picks_each_activations_candidate_with_the_least_layer_output_error(demo_model, demo_data, tmp_path,
                                                                                asymmetric):
    directory, _ = demo_model
    calib, _, _ = demo_data
    grid = {"deploy_backend": "native", "activation_symmetric": False} if asymmetric else {}
    report = quant_post_static(None, directory, tmp_path / "auto", sample_generator=lambda: iter(calib),
                               batch_size=25, algo="auto", save_model_filename=None, save_params_filename=None,
                               **grid)
    assert report["algo"] == "auto"
    fc = next(layer for layer in report["layers"] if layer["op"] == "mul")
    (name, info), = fc["inputs"].items()
    # by hand: the fc's input on the first LAYERWISE_SAMPLES calibration samples, each algo's threshold
    graph = open_graph(load_model(directory))
    op = next(op for op in graph.ops(["mul"]))
    x = graph.run({"image": calib[:LAYERWISE_SAMPLES]}, [graph.activation_operands(op)[0].value])[0]
    w = graph.get_param(graph.weight_operand(op).name).astype(np.float64)
    x2 = x.reshape(len(x), -1).astype(np.float64)
    reference = x2 @ w
    seen = graph.run({"image": calib}, [graph.activation_operands(op)[0].value])[0]  # the whole calibration set

    def on_grid(t: float) -> np.ndarray:  # the grid the activation deploys with
        half, offset = asymmetric_range(t, float(seen.min()), float(seen.max()), 8) if asymmetric else (t, 0.0)
        return fake_quantize(x2 - offset, half, 8) + offset

    errors = {algo: float(np.sum((on_grid(t) @ w - reference) ** 2) / np.sum(reference**2))
              for algo, t in info["all_algos"].items() if algo != "auto" and t > 0}
    reported = info["auto"]["layer_output_error"]
    assert set(reported) == set(errors)
    # auto scores in float32 on the BLAS of the machine: outputs carry ~eps * sqrt(fan-in) = 2e-6 relative noise,
    # ~1e-3 of these errors' own size (a 2.7e-3 relative output error); AVX2 and AVX-512 kernels round apart
    for algo, error in errors.items():
        assert reported[algo] == pytest.approx(error, rel=1e-2)
    best = min(errors.values())
    assert reported[info["auto"]["algo"]] == pytest.approx(best, rel=1e-2)
    assert info["all_algos"]["auto"] == info["all_algos"][info["auto"]["algo"]]
    if asymmetric:  # a relu output: [0, t] on the 255 levels
        assert seen.min() == 0.0
        assert info["offset"] == pytest.approx(info["threshold"]) and info["threshold"] == pytest.approx(
            info["all_algos"]["auto"] / 2, rel=1e-6)
    else:
        assert info["threshold"] == pytest.approx(info["all_algos"]["auto"], rel=1e-6)
    every = [i for layer in report["layers"] for i in layer["inputs"].values()]
    assert all("auto" in i for i in every)


def test_adaround_beats_round_to_nearest_on_the_layer_it_learns():
    rng = np.random.default_rng(0)
    x = np.maximum(rng.standard_normal((64, 32)), 0).astype("float32")  # relu'd inputs, as after a conv
    weight = rng.standard_normal((32, 24)).astype("float32")
    settings = AdaRoundSettings(iters=300)
    result = adaround(paddle.matmul, x, weight, bits=4, axis=1, settings=settings)
    assert result.used and result.loss_adaround < 0.85 * result.loss_nearest
    scale = result.thresholds / qmax(4)
    codes = result.weight / scale
    np.testing.assert_allclose(codes, np.round(codes), atol=1e-3)  # exactly representable codes
    assert np.abs(np.round(codes)).max() <= qmax(4)
    assert 0 < result.flipped < 0.5
    nearest = np.round(weight / scale)
    assert np.abs(np.round(codes) - nearest).max() == 1  # each weight rounds down or up, never further
    again = adaround(paddle.matmul, x, weight, bits=4, axis=1, settings=settings)
    assert again.weight.tobytes() == result.weight.tobytes()  # same inputs, same bytes


def test_adaround_stores_its_rounding_and_improves_4_bit_top1(demo_data, tmp_path):
    calib, x, y = demo_data
    from qdemo import demo_model_dir

    directory = demo_model_dir("legacy")
    options = {"sample_generator": lambda: iter(calib), "batch_size": 25, "algo": "mse", "weight_bits": 4,
               "deploy_backend": "native", "save_model_filename": None, "save_params_filename": None}
    quant_post_static(None, directory, tmp_path / "nearest", **options)
    report = quant_post_static(None, directory, tmp_path / "ada", round_type="adaround", **options)
    rounded = [layer["weight"]["adaround"] for layer in report["layers"] if "weight" in layer]
    assert len(rounded) == 6 and all(r["loss_adaround"] <= r["loss_nearest"] for r in rounded)
    assert sum(r["used"] for r in rounded) >= 5
    top1 = {name: float((predict(tmp_path / name, {"image": x}, backend="native")[0].argmax(1) == y).mean())
            for name in ("nearest", "ada")}
    assert top1["ada"] > top1["nearest"]


def test_central_windows_keep_whole_samples_while_they_fit_then_one_central_window():
    from qptq.auto import MIN_WINDOW, central_windows

    rng = np.random.default_rng(0)
    small = rng.standard_normal((3, 2, 8, 8)).astype(np.float32)
    assert central_windows([small], 3 * 64)[0] is small  # within the budget: as it is
    two = central_windows([small], 2 * 64 + 10)  # two whole samples fit, not a third
    assert len(two) == 1 and np.array_equal(two[0], small[:2])
    page = rng.standard_normal((1, 2, 200, 400)).astype(np.float32)
    window, = central_windows([page], 64 * 64)
    h, w = window.shape[2:]
    assert h * w <= 64 * 64 and h >= MIN_WINDOW and w >= MIN_WINDOW and w > h  # the page's aspect, roughly
    top, left = (200 - h) // 2, (400 - w) // 2
    assert np.array_equal(window, page[:, :, top : top + h, left : left + w])
    tiny_budget, = central_windows([page], 10)  # never below MIN_WINDOW a side
    assert tiny_budget.shape[2:] == (MIN_WINDOW, MIN_WINDOW)
    # several shapes (pages of their own sizes): the first ones up to the budget, the rest not scored
    kept = central_windows([small, page, page], 3 * 64 + 40 * 40)
    assert [k.shape for k in kept] == [small.shape, (1, 2, MIN_WINDOW, 40 * 40 // MIN_WINDOW)]


def test_auto_scores_a_conv_activation_on_a_bounded_window(tmp_path, monkeypatch):
    """A large image's conv input is scored on at most scored_positions() positions, and the threshold auto takes
    is the one with the least error on that window."""
    from qcore.deploy import Deployment
    from qptq import auto

    net = paddle.nn.Sequential(paddle.nn.Conv2D(3, 8, 3, padding=1), paddle.nn.ReLU(), paddle.nn.Conv2D(8, 8, 3))
    save_tiny_net(net, tmp_path / "pir", "pir", [paddle.static.InputSpec([None, 3, None, None], "float32", "x")])
    graph = open_graph(load_model(tmp_path / "pir"))
    targets = Deployment("native").targets(graph, ["conv2d"]).ops
    second = targets[-1]
    name = second.activations[0].name
    x = np.abs(np.random.default_rng(1).standard_normal((2, 8, 300, 500))).astype(np.float32)
    seen = []
    run = auto.ReplayedLayer.run
    monkeypatch.setattr(auto.ReplayedLayer, "run", lambda self, a, w=None: seen.append(a.shape) or run(self, a, w))
    candidates = {name: {"abs_max": float(x.max()), "avg": float(x.max()) / 4}}
    choice = auto.choose_thresholds(graph, [second], candidates, {name: [x]}, 8)[name]
    budget = auto.scored_positions([auto.ReplayedLayer(graph, second)], 8)
    assert budget < 2 * 300 * 500 and all(s[0] * s[2] * s[3] <= budget for s in seen)
    window = auto.central_windows([x], budget)[0]
    layer = auto.ReplayedLayer(graph, second)
    reference = layer.run(window)
    errors = {a: auto.squared_relative_error(layer.run(auto.fake_quantize_grid(window, t, 0.0, 8)), reference)
              for a, t in candidates[name].items() if a != "auto"}
    assert choice.errors == pytest.approx(errors, rel=1e-5)
    assert choice.algo == min(errors, key=errors.get) and candidates[name]["auto"] == candidates[name][choice.algo]


def test_auto_scores_a_reader_whose_weight_stays_float(tmp_path):
    """A transposed conv outside quantizable_op_type reading a quantized conv's output gets an input QDQ on ONNX
    Runtime but keeps its float weight: auto replays it with that weight (it failed on PP-OCRv4 det)."""
    from qcore.deploy import Deployment
    from qptq import auto

    net = paddle.nn.Sequential(paddle.nn.Conv2D(3, 8, 3, padding=1), paddle.nn.ReLU(),
                               paddle.nn.Conv2DTranspose(8, 4, 2, stride=2))
    save_tiny_net(net, tmp_path / "legacy", "legacy_pdmodel",
                  [paddle.static.InputSpec([None, 3, 16, 16], "float32", "x")])
    graph = open_graph(load_model(tmp_path / "legacy"))
    up = next(t for t in Deployment("onnxruntime").targets(graph, ["conv2d"]).ops
              if t.op.seed_type == "conv2d_transpose")
    assert up.weight is None and up.activations
    name = up.activations[0].name
    x = np.abs(np.random.default_rng(2).standard_normal((2, 8, 16, 16))).astype(np.float32)
    candidates = {name: {"abs_max": float(x.max()), "avg": float(x.max()) / 4}}
    choice = auto.choose_thresholds(graph, [up], candidates, {name: [x]}, 8)[name]
    layer = auto.ReplayedLayer(graph, up)
    assert np.array_equal(layer.weight, graph.get_param(graph.weight_operand(up.op).name))
    reference = layer.run(x)
    errors = {a: auto.squared_relative_error(layer.run(auto.fake_quantize_grid(x, t, 0.0, 8)), reference)
              for a, t in candidates[name].items() if a != "auto"}
    assert choice.errors == pytest.approx(errors, rel=1e-5) and choice.algo == min(errors, key=errors.get)
