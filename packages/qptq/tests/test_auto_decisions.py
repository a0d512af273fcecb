"""``algo="auto"``'s float decisions (:mod:`qptq.decide`): measured on the calibration data, scored on held-out
batches, with the runtimes' cost rules as data that name no model."""

from __future__ import annotations

import inspect
import math
import re

import numpy as np
import paddle
import pytest

from qcore.deploy import TARGETS
from qcore.optable import OP_TABLE
from qdemo.testing import save_tiny_net
from qptq import decide, quant_post_static

SHAPE = (3, 16, 16)


class OutlierNet(paddle.nn.Layer):
    """Three convs; the first writes one channel 300x the others and the second reads that channel through tiny
    weights, so its output is made of the small channels that one per-tensor 8-bit scale flattens."""

    def __init__(self) -> None:
        super().__init__()
        self.first = paddle.nn.Conv2D(3, 8, 3, padding=1)
        self.middle = paddle.nn.Conv2D(8, 8, 3, padding=1)
        self.last = paddle.nn.Conv2D(8, 4, 3, padding=1)
        with paddle.no_grad():
            w, b = self.first.weight.numpy(), self.first.bias.numpy()
            w[0] *= 300
            b[0] = 300
            self.first.weight.set_value(w)
            self.first.bias.set_value(b)
            m = self.middle.weight.numpy()
            m[:, 0] /= 300
            self.middle.weight.set_value(m)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        relu = paddle.nn.functional.relu
        return self.last(relu(self.middle(relu(self.first(x)))))


@pytest.fixture(scope="module")
def outlier_model(tmp_path_factory):
    paddle.seed(5)
    net = OutlierNet()
    net.eval()
    directory = tmp_path_factory.mktemp("outlier") / "pir"
    save_tiny_net(net, directory, "pir", [paddle.static.InputSpec([None, *SHAPE], "float32", "x")])
    return directory


def _batches(n: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.uniform(0, 1, (4, *SHAPE)).astype("float32")} for _ in range(n)]


def test_the_layer_reading_an_outlier_channel_stays_float_and_the_estimate_is_held_out(outlier_model, tmp_path):
    report = quant_post_static(None, str(outlier_model), str(tmp_path / "int8"), batch_generator=lambda: iter(
        _batches(12)), algo="auto")
    auto = report["auto"]
    errors = auto["layer_errors"]
    middle = next(name for name in errors if name.startswith("1 "))
    others = [name for name in errors if name != middle]
    assert errors[middle]["input_spread"] > 100  # the first conv's outlier channel, as measured
    assert errors[middle]["channels"] > 10 * max(errors[n]["channels"] for n in others)
    assert list(auto["float_layers"]) == [middle]
    assert auto["float_layers"][middle].startswith("accuracy: int8 channel error")
    assert [layer.get("left_float", "") for layer in report["layers"]][1].startswith("accuracy")
    # 12 batches: every 4th (3) held back from calibration and scored; the choice meets the budget there
    held = auto["held_out"]
    assert (held["batches"], held["of"], held["unseen"]) == (3, 12, True)
    assert auto["budget"]["met"] and held["mean"] + 2 * held["standard_error"] <= auto["budget"]["max"]
    assert math.isfinite(held["standard_error"]) and held["standard_error"] > 0
    first, chosen = auto["candidates"][0], auto["candidates"][-1]
    assert first["float_for_accuracy"] == 0 and chosen["float_for_accuracy"] == 1
    assert chosen["mean"] < first["mean"] / 3  # keeping it float is what brings the held-out error down


def test_kl_stays_the_default_and_decides_nothing(outlier_model, tmp_path):
    assert inspect.signature(quant_post_static).parameters["algo"].default == "KL"
    report = quant_post_static(None, str(outlier_model), str(tmp_path / "int8"),
                               batch_generator=lambda: iter(_batches(4)))
    assert "auto" not in report and not any("left_float" in layer for layer in report["layers"])


def test_too_few_batches_to_hold_any_back_is_said(outlier_model, tmp_path):
    report = quant_post_static(None, str(outlier_model), str(tmp_path / "int8"),
                               batch_generator=lambda: iter(_batches(3)), algo="auto")
    held = report["auto"]["held_out"]
    assert (held["batches"], held["unseen"]) == (0, False)


def test_a_model_too_small_to_gain_from_int8_stays_float_on_onnxruntime(outlier_model, tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("paddle2onnx")
    report = quant_post_static(None, str(outlier_model), str(tmp_path / "int8"), deploy_backend="onnxruntime",
                               batch_generator=lambda: iter(_batches(4)), algo="auto")
    auto = report["auto"]
    assert auto["model"] == "float" and "int8 cannot be faster than float" in auto["why"]
    assert auto["macs_per_sample"] < TARGETS["onnxruntime"].min_int8_work.macs
    assert all("left_float" in layer for layer in report["layers"] if layer["op"] == "conv2d")


def test_cost_rules_keep_small_depthwise_convs_float():
    ort = TARGETS["onnxruntime"]
    rule = next(r for r in ort.slow_int8 if r.op_type == "depthwise_conv2d")
    small = decide.LayerError(0.0, 0.0, 1.0, rule.max_outputs - 1, 10**9)
    large = decide.LayerError(0.0, 0.0, 1.0, rule.max_outputs, 10**9)

    class Op:
        seed_type, scope_name = "depthwise_conv2d", "x"

    class Target:
        op, weight = Op(), object()

    targets = [Target(), Target()]
    from qcore.deploy import Deployment

    whole, slow = decide.speed_float(Deployment("onnxruntime"), targets, {0: small, 1: large})
    assert whole is None and list(slow) == [0] and "slower in int8" in slow[0]


def test_the_rule_tables_name_no_model():
    """Cost rules are keyed by seed op type and sizes; neither they nor qptq.decide name a model or a role."""
    names = re.compile(r"ocr|det\b|\brec\b|\bcls\b(?![,(])|resnet|mobilenet|lcnet|bert|llama", re.I)
    for target in TARGETS.values():
        for rule in target.slow_int8:
            assert rule.op_type in OP_TABLE and not names.search(rule.reason)
        if target.min_int8_work is not None:
            assert not names.search(target.min_int8_work.reason)
    assert not names.search(inspect.getsource(decide))


def test_without_a_candidate_in_budget_the_fewest_float_layers_near_the_best_win():
    def estimate(mean: float, se: float) -> decide.Estimate:
        return decide.Estimate(mean, se, [mean])

    scored = [({}, estimate(0.31, 0.016)), ({1: "a"}, estimate(0.22, 0.013)),
              ({1: "a", 2: "b"}, estimate(0.081, 0.013)), ({1: "a", 2: "b", 3: "c"}, estimate(0.070, 0.015))]
    keep, chosen = decide.fewest_near_best(scored)
    assert keep == {1: "a", 2: "b"} and chosen.mean == 0.081  # 0.081 <= 0.070 + 2 x 0.015; 0.22 is not


def test_distribution_outputs_are_scored_by_their_top_class():
    """Softmax-like outputs (never negative, summing to 1 over the last axis) score the share of positions whose
    top class changed; any other output its relative L2 error; a batch scores its worst output."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 50, 7))
    probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    assert decide.is_distribution(probs)
    assert not decide.is_distribution(logits) and not decide.is_distribution(probs[..., :1])
    assert not decide.is_distribution(probs * 0.9)  # sums to 0.9: not a distribution
    flipped = probs.copy()
    top = probs.argmax(-1)
    flipped[0, :10] = np.roll(probs[0, :10], 1, axis=-1)  # 10 of 100 positions get another top class
    changed = int(np.sum(flipped.argmax(-1) != top))
    assert changed == 10
    assert decide.decision_error([flipped], [probs]) == pytest.approx(changed / 100)
    assert decide.decision_error([probs * 1.01], [probs]) == 0.0  # same top class everywhere: no change
    features = rng.normal(size=(4, 8))
    noisy = features + 0.1 * rng.normal(size=features.shape)
    l2 = np.linalg.norm(noisy - features) / np.linalg.norm(features)
    assert decide.decision_error([noisy], [features]) == pytest.approx(l2)
    assert decide.decision_error([noisy, flipped], [features, probs]) == pytest.approx(max(l2, 0.1))


def test_the_summary_counts_the_reasons_and_says_where_the_estimate_comes_from():
    from qptq.decide import ACCURACY, summary

    section = {"held_out": {"mean": 0.0123, "standard_error": 0.0011, "batches": 4, "of": 4, "unseen": False},
               "budget": {"metric": "relative L2 error", "max": 0.05, "met": False},
               "float_layers": {"1 conv2d a": f"{ACCURACY}int8 channel error 3",
                                "2 depthwise_conv2d b": "onnxruntime: x",
                                "4 conv2d c": f"{ACCURACY}int8 channel error 2"}}
    assert summary(section) == ("int8, 3 layers float", "1 for speed, 2 for accuracy; relative L2 error 0.0123 +- "
                                "0.0011 on calibration batches (none held out) (budget 0.05, missed)")
    assert summary({**section, "float_layers": {}})[0] == "int8"
    assert summary({"model": "float", "why": "too small"}) == ("float", "too small")
