"""Accuracy budget: layers go back to float, most sensitive first, until the model is within budget."""

from __future__ import annotations

import math

import numpy as np
import paddle
import pytest

from qcore.errors import ConfigError, QuantError
from qcore.inference import predict
from qcore.model_io import ModelFiles, find_model_files, load_model
from qdemo.testing import sample_input, save_tiny_net
from qptq import quant_post_static
from qptq.budget import Budget, output_error, smallest_within

OPTIONS = {"algo": "abs_max", "batch_size": 25, "weight_bits": 4, "deploy_backend": "native",
           "save_model_filename": None, "save_params_filename": None}  # 4-bit: errors worth a budget


def _error_on(files: ModelFiles, x: np.ndarray, reference: np.ndarray) -> float:
    return output_error([load_model(files.directory).run({"image": x})[0]], [reference])


def test_label_free_budget_keeps_the_most_sensitive_layers_float(demo_model, demo_data, tmp_path):
    directory, _ = demo_model
    calib, _, _ = demo_data
    reference = load_model(directory).run({"image": calib[:100]})[0]
    plain = quant_post_static(None, directory, tmp_path / "plain", sample_generator=lambda: iter(calib), **OPTIONS)
    assert "budget" not in plain
    everything = _error_on(find_model_files(tmp_path / "plain"), calib[:100], reference)
    limit = everything / 2
    report = quant_post_static(None, directory, tmp_path / "budget", sample_generator=lambda: iter(calib),
                               max_output_error=limit, **OPTIONS)
    budget = report["budget"]
    assert budget["met"] and budget["metric"] == "output_error" and budget["limit"] == limit
    assert 1 <= budget["float_layers"] < len(budget["sensitivity"])
    assert budget["evaluations"] <= math.ceil(math.log2(len(budget["sensitivity"]))) + 2
    errors = [layer["output_error"] for layer in budget["sensitivity"]]
    assert errors == sorted(errors, reverse=True) and errors[0] > 0
    kept = [layer for layer in report["layers"] if "accuracy budget" in layer.get("left_float", "")]
    assert len(kept) == budget["float_layers"]
    assert any("sensitivity rank 1 of" in layer["left_float"] for layer in kept)
    assert _error_on(find_model_files(tmp_path / "budget"), calib[:100], reference) <= limit * 1.05
    scores = {c["float_layers"]: c["score"] for c in budget["candidates"]}
    k = budget["float_layers"]
    assert scores[k] <= limit and all(scores[j] > limit for j in scores if j < k)  # the fewest that meet it


def test_metric_budget_calls_the_users_function_on_saved_candidates(demo_model, demo_data, tmp_path):
    directory, float_top1 = demo_model
    calib, x, y = demo_data
    seen = []

    def top1(files: ModelFiles) -> float:
        seen.append(files)
        return float((predict(files, {"image": x}, backend="native")[0].argmax(1) == y).mean())

    report = quant_post_static(None, directory, tmp_path / "out", sample_generator=lambda: iter(calib),
                               eval_function=top1, max_metric_drop=0.01, **OPTIONS)
    budget = report["budget"]
    assert budget["float_score"] == pytest.approx(float_top1)
    assert all(isinstance(f, ModelFiles) for f in seen) and len(seen) == budget["evaluations"] + 1
    final = top1(find_model_files(tmp_path / "out"))
    assert budget["met"] == (float_top1 - final <= 0.01)
    assert budget["met"], budget["candidates"]


def test_an_unreachable_budget_saves_the_best_candidate_and_says_so(demo_model, demo_data, tmp_path, caplog):
    directory, _ = demo_model
    calib, _, _ = demo_data
    report = quant_post_static(None, directory, tmp_path / "out", sample_generator=lambda: iter(calib),
                               max_output_error=0.0, max_float_layers=1, **OPTIONS)
    budget = report["budget"]
    assert not budget["met"] and budget["float_layers"] in (0, 1)
    assert "accuracy budget not met" in caplog.text
    assert find_model_files(tmp_path / "out").model_file.is_file()


@pytest.mark.parametrize(("options", "message"), [
    ({"eval_function": len}, "eval_function and max_metric_drop go together"),
    ({"max_metric_drop": 0.01}, "eval_function and max_metric_drop go together"),
    ({"eval_function": len, "max_metric_drop": 0.01, "max_output_error": 0.1}, "not both"),
    ({"eval_function": 3, "max_metric_drop": 0.01}, "is not callable"),
    ({"max_output_error": -1}, "max_output_error=-1 is not valid"),
    ({"eval_function": len, "max_metric_drop": 1.5}, r"max_metric_drop=1.5 is not valid; .* \(a fraction"),
    ({"max_output_error": 0.1, "max_float_layers": -2}, "max_float_layers=-2 is not valid"),
    ({"max_output_error": 0.1, "max_evaluations": 1}, "max_evaluations=1 is not valid"),
])
def test_inconsistent_budget_options_are_one_line(options, message):
    with pytest.raises(ConfigError, match=message):
        Budget.from_options(**{"eval_function": None, "max_metric_drop": None, "max_output_error": None,
                               "max_float_layers": None, "max_evaluations": 10, **options})


@pytest.mark.parametrize("needed", [0, 1, 7, 40, 64])
def test_bisection_finds_the_fewest_float_layers_in_log_evaluations(needed):
    budget = Budget(max_output_error=0.5, max_evaluations=20)
    search = smallest_within(budget, lambda k, _search: 1.0 if k < needed else 0.1, 0.0, 64)
    assert search.met and search.chosen == needed
    assert len(search.tried) <= math.ceil(math.log2(64)) + 2


def test_output_error_is_relative_l2():
    reference = [np.array([3.0, 4.0])]
    assert output_error([np.array([3.0, 4.0])], reference) == 0
    assert output_error([np.array([3.0, 4.5])], reference) == pytest.approx(0.1)


@pytest.mark.parametrize(("result", "message"), [
    (ValueError("no labels"), "eval_function failed on the float model .*ValueError: no labels"),
    (float("nan"), "eval_function returned nan for the float model"),
    ("0.9", "eval_function returned '0.9' for the float model"),
])
def test_a_failing_eval_function_stops_with_one_line(demo_model, demo_data, tmp_path, result, message):
    directory, _ = demo_model
    calib, _, _ = demo_data

    def broken(files: ModelFiles) -> float:
        if isinstance(result, Exception):
            raise result
        return result

    with pytest.raises(QuantError, match=message):
        quant_post_static(None, directory, tmp_path / "out", sample_generator=lambda: iter(calib),
                          eval_function=broken, max_metric_drop=0.01, **OPTIONS)
    assert not (tmp_path / "out").exists()


class _PlantedNet(paddle.nn.Layer):
    """conv -> relu -> conv -> relu -> fc, where the second conv's input has one channel 1000x the others
    (the first conv's channel 0 scaled up, the second conv's weights reading it scaled down: the float
    function is unchanged). A per-tensor activation threshold then wipes out the other channels, so
    quantizing the second conv alone hurts the output most: the planted fragile layer."""

    def __init__(self) -> None:
        super().__init__()
        paddle.seed(5)
        self.first = paddle.nn.Conv2D(1, 8, 3, padding=1)
        self.fragile = paddle.nn.Conv2D(8, 8, 3, padding=1)
        self.fc = paddle.nn.Linear(8 * 8 * 8, 10)
        w, b = self.first.weight.numpy(), self.first.bias.numpy()
        w[0] *= 1000
        b[0] = abs(b[0]) * 1000
        self.first.weight.set_value(w)
        self.first.bias.set_value(b)
        w2 = self.fragile.weight.numpy()
        w2[:, 0] /= 1000
        self.fragile.weight.set_value(w2)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        y = paddle.nn.functional.relu(self.first(x))
        y = paddle.nn.functional.relu(self.fragile(y))
        return self.fc(paddle.flatten(y, 1))


@pytest.mark.parametrize("fmt", ["pir", "legacy_pdmodel"])
def test_sensitivity_ranks_a_planted_fragile_layer_first_and_keeps_it_float(tmp_path, fmt):
    net = _PlantedNet()
    net.eval()
    save_tiny_net(net, tmp_path / "float", fmt)
    x = sample_input(32)
    report = quant_post_static(None, tmp_path / "float", tmp_path / "int8", sample_generator=lambda: iter(x),
                               batch_size=8, algo="abs_max", max_output_error=0.02,
                               save_model_filename=None, save_params_filename=None)
    budget = report["budget"]
    ranked = [entry["weight"] for entry in budget["sensitivity"]]
    assert ranked[0] == net.fragile.weight.name, ranked
    assert budget["sensitivity"][0]["output_error"] > 10 * budget["sensitivity"][1]["output_error"]
    assert budget["met"] and budget["float_layers"] == 1
    kept = [layer for layer in report["layers"] if "accuracy budget" in layer.get("left_float", "")]
    assert len(kept) == 1 and "sensitivity rank 1 of 3" in kept[0]["left_float"]
