"""Activation smoothing of conv inputs (qptq.smooth): NCHW convs with one group and depthwise convs, in both IRs."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from qcore.deploy import Deployment
from qcore.graph import open_graph
from qcore.model_io import load_model
from qptq.smooth import ALPHAS, MIN_GAIN, Smoothing, apply_smoothing, choose_smoothing, smoothable

OUTLIER = 5  # the channel of the first conv's output that runs 30x wider than the others


class Net(paddle.nn.Layer):
    """conv -> hard-swish (one wide channel) -> conv -> hard-swish -> depthwise conv -> grouped conv."""

    def __init__(self) -> None:
        super().__init__()
        self.first = paddle.nn.Conv2D(4, 8, 3, padding=1)
        self.second = paddle.nn.Conv2D(8, 8, 3, padding=1)
        self.depthwise = paddle.nn.Conv2D(8, 8, 3, padding=1, groups=8)
        self.grouped = paddle.nn.Conv2D(8, 8, 1, groups=2)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        act = paddle.nn.functional.hardswish
        return self.grouped(self.depthwise(act(self.second(act(self.first(x))))))


def _net(tmp_path, family: str):
    paddle.seed(0)
    net = Net()
    net.eval()
    weight = net.first.weight.numpy()
    weight[OUTLIER] *= 30.0
    net.first.weight.set_value(weight)
    spec = [paddle.static.InputSpec([None, 4, None, None], "float32", "x")]
    if family == "pir":
        paddle.jit.save(net, str(tmp_path / family / "inference"), input_spec=spec)
    else:
        with paddle.pir_utils.DygraphOldIrGuard():
            paddle.jit.save(net, str(tmp_path / family / "inference"), input_spec=spec)
    x = np.random.default_rng(0).standard_normal((8, 4, 12, 12)).astype("float32")
    return open_graph(load_model(tmp_path / family)), x


def _groups(graph):
    targets = Deployment("native").targets(graph, ["conv2d", "depthwise_conv2d"]).ops
    return smoothable(graph, targets)


@pytest.mark.parametrize("family", ["pir", "legacy"])
def test_conv_and_depthwise_inputs_are_smoothable_and_grouped_convs_are_not(tmp_path, family):
    graph, _ = _net(tmp_path, family)
    readers = {name: [list(graph.get_param(t.weight.name).shape) for t in group] for name, group in _groups(graph).items()}
    # the second conv's input (one group) and the depthwise conv's: weights [8, 8, 3, 3] and [8, 1, 3, 3];
    # the model input (the first conv) too; the grouped conv's input [8, 4, 1, 1] is left out
    assert sorted(shape for shapes in readers.values() for shape in shapes) == [[8, 1, 3, 3], [8, 4, 3, 3],
                                                                               [8, 8, 3, 3]]


@pytest.mark.parametrize("family", ["pir", "legacy"])
def test_smoothing_conv_inputs_keeps_the_float_model_exact(tmp_path, family):
    graph, x = _net(tmp_path, family)
    before, ops_before = graph.run({"x": x})[0], len(graph.op_types())
    groups = _groups(graph)
    rng = np.random.default_rng(1)
    choices = [Smoothing(name, 0.5, {}, rng.uniform(0.2, 5.0, size=8 if name != "x" else 4).astype(np.float32))
               for name in groups]
    assert apply_smoothing(graph, groups, choices) == 3
    assert len(graph.op_types()) == ops_before + 3 * (1 + (family == "pir"))  # a multiply (and a parameter) each
    np.testing.assert_allclose(graph.run({"x": x})[0], before, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ["pir", "legacy"])
def test_smoothing_is_chosen_for_the_conv_input_with_a_wide_channel(tmp_path, family):
    graph, x = _net(tmp_path, family)
    groups = _groups(graph)
    wide = next(name for name, group in groups.items() if graph.get_param(group[0].weight.name).shape == (8, 8, 3, 3))
    sample = graph.run({"x": x}, [groups[wide][0].activations[0].value])[0]
    assert np.abs(sample[:, OUTLIER]).max() > 10 * np.abs(np.delete(sample, OUTLIER, axis=1)).max()
    [chosen] = choose_smoothing(graph, {wide: groups[wide]}, {wide: [sample]}, weight_bits=8, activation_bits=8,
                                grid=lambda t, lo, hi: (t, 0.0))
    assert set(chosen.errors) == {"off", *map(str, ALPHAS)}
    assert chosen.alpha is not None and chosen.errors["off"] >= MIN_GAIN * chosen.errors[str(chosen.alpha)]
    assert int(np.argmax(chosen.factors)) == OUTLIER  # the wide channel is divided the most
