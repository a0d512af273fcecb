"""Activation smoothing (qptq.smooth) and the transformer residual rule, on a post-LayerNorm encoder block."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest

from qcore.deploy import Deployment
from qcore.graph import open_graph
from qcore.model_io import load_model
from qptq import quant_post_static
from qptq.smooth import ALPHAS, MIN_GAIN, Smoothing, apply_smoothing, choose_smoothing, smoothable

DIM, TOKENS = 16, 6


class Block(paddle.nn.Layer):
    """A post-LayerNorm transformer feed-forward block whose LayerNorm output has one outlier channel."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = paddle.nn.LayerNorm(DIM)
        self.up, self.down = paddle.nn.Linear(DIM, 4 * DIM), paddle.nn.Linear(4 * DIM, DIM)
        self.norm2 = paddle.nn.LayerNorm(DIM)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        h = self.norm(x)
        return self.norm2(h + self.down(paddle.nn.functional.relu(self.up(h))))


def _block(tmp_path, family: str):
    paddle.seed(0)
    net = Block()
    net.eval()
    gamma = np.ones(DIM, np.float32)
    gamma[3] = 40.0  # the outlier channel transformers' LayerNorms have
    net.norm.weight.set_value(gamma)
    spec = [paddle.static.InputSpec([None, None, DIM], "float32", "x")]  # any number of tokens
    if family == "pir":
        paddle.jit.save(net, str(tmp_path / family / "inference"), input_spec=spec)
    else:
        with paddle.pir_utils.DygraphOldIrGuard():
            paddle.jit.save(net, str(tmp_path / family / "inference"), input_spec=spec)
    x = np.random.default_rng(0).standard_normal((48, TOKENS, DIM)).astype("float32")
    return tmp_path / family, x


@pytest.mark.parametrize("family", ["pir", "legacy"])
def test_smoothing_keeps_the_float_model_exact(tmp_path, family):
    directory, x = _block(tmp_path, family)
    graph = open_graph(load_model(directory))
    before, ops_before = graph.run({"x": x})[0], len(graph.op_types())
    targets = Deployment("native").targets(graph, ["mul"]).ops
    groups = smoothable(graph, targets)
    assert len(groups) == 2  # the LayerNorm output (read by up) and the relu output (read by down)
    factors = np.random.default_rng(1).uniform(0.2, 5.0, size=DIM).astype(np.float32)
    name = next(n for n, readers in groups.items() if graph.get_param(readers[0].weight.name).shape[0] == DIM)
    assert apply_smoothing(graph, groups, [Smoothing(name, 0.5, {}, factors)]) == 1
    assert len(graph.op_types()) == ops_before + 1 + (family == "pir")  # the multiply (and in PIR its parameter)
    np.testing.assert_allclose(graph.run({"x": x})[0], before, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family", ["pir", "legacy"])
def test_smoothing_is_chosen_where_an_outlier_channel_makes_the_layer_error_large(tmp_path, family):
    directory, x = _block(tmp_path, family)
    graph = open_graph(load_model(directory))
    targets = Deployment("native").targets(graph, ["mul"]).ops
    groups = smoothable(graph, targets)
    names = list(groups)
    samples = dict(zip(names, ([a] for a in graph.run({"x": x}, [groups[n][0].activations[0].value for n in names]))))
    choices = {c.activation: c for c in choose_smoothing(graph, groups, samples, weight_bits=8, activation_bits=8,
                                                         grid=lambda t, lo, hi: (t, 0.0))}
    ln = next(n for n in names if graph.get_param(groups[n][0].weight.name).shape[0] == DIM)
    chosen = choices[ln]
    assert set(chosen.errors) == {"off", *map(str, ALPHAS)}
    assert chosen.alpha is not None and chosen.errors["off"] >= MIN_GAIN * chosen.errors[str(chosen.alpha)]
    # channel 3 carries the outlier: the factor divides it the most
    assert int(np.argmax(chosen.factors)) == 3


def test_auto_smooths_the_block_and_beats_hist(tmp_path):
    directory, x = _block(tmp_path, "pir")
    reference = load_model(directory).run({"x": x[32:]})[0]
    errors, reports = {}, {}
    for algo in ("hist", "auto"):
        reports[algo] = quant_post_static(None, directory, tmp_path / algo, batch_generator=lambda: iter(
            [{"x": x[i:i + 8]} for i in range(0, 32, 8)]), algo=algo, quantizable_op_type=["mul"],
            deploy_backend="openvino-runtime", activation_symmetric=False)
        out = load_model(tmp_path / algo).run({"x": x[32:]})[0]
        errors[algo] = float(np.abs(out - reference).mean())
    smoothed = [n for n, c in reports["auto"]["smoothing"].items() if c["alpha"] is not None]
    assert smoothed and "smoothing" not in reports["hist"]
    assert errors["auto"] < 0.5 * errors["hist"]


PADDLESLIM_SCRIPT = """
import json, sys
import numpy as np
import paddle
from qcore.model_io import load_model
from qptq import quant_post_static

paddle.enable_static()
model_dir, out, DIM = sys.argv[1], sys.argv[2], int(sys.argv[3])
exe = paddle.static.Executor(paddle.CPUPlace())
rng = np.random.default_rng(0)
lengths = [4, 7, 5, 9]  # every batch of 8 sentences has its own length


class Sentences(paddle.io.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        return rng.standard_normal((lengths[i // 8], DIM)).astype("float32"), np.int64(i % 3)


x = paddle.static.data("x", [None, None, DIM], "float32")
label = paddle.static.data("label", [None], "int64")
loader = paddle.io.DataLoader(Sentences(), places=paddle.CPUPlace(), feed_list=[x, label], batch_size=8,
                              return_list=False, shuffle=False)
test = np.random.default_rng(1).standard_normal((16, 6, DIM)).astype("float32")
paddle.disable_static()
reference = load_model(model_dir).run({"x": test})[0]
paddle.enable_static()
result = {}
for algo in ("hist", "auto"):
    report = quant_post_static(exe, model_dir, out + "/" + algo, data_loader=loader, algo=algo, batch_nums=4,
                               quantizable_op_type=["mul"], deploy_backend="native", activation_symmetric=False,
                               model_filename=None, params_filename=None)
    paddle.disable_static()
    error = float(np.abs(load_model(out + "/" + algo).run({"x": test})[0] - reference).mean())
    paddle.enable_static()
    smoothed = [n for n, c in report.get("smoothing", {}).items() if c["alpha"] is not None]
    result[algo] = {"error": error, "batches": report["batches"], "smoothed": len(smoothed)}
print("RESULT " + json.dumps(result))
"""


@pytest.mark.parametrize("family", ["pir", "legacy"])
def test_auto_runs_as_paddleslim_scripts_call_it(tmp_path, family):
    """After ``paddle.enable_static()``, with an executor and a static DataLoader (feed_list, return_list=False,
    a label the model does not take) whose batches differ in length; legacy mode as PaddleSlim-era scripts run."""
    directory, _ = _block(tmp_path, family)
    script = tmp_path / "slim_style.py"
    script.write_text(PADDLESLIM_SCRIPT)
    env = {**os.environ, "FLAGS_enable_pir_api": "1" if family == "pir" else "0"}
    run = subprocess.run([sys.executable, str(script), str(directory), str(tmp_path / "out"), str(DIM)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["hist"]["batches"] == 4 and result["auto"]["batches"] == 3  # auto held the 4th back (qptq.decide)
    assert result["auto"]["smoothed"] >= 1 and result["hist"]["smoothed"] == 0
    assert result["auto"]["error"] < result["hist"]["error"]


def test_joins_read_by_a_layer_norm_are_not_quantized_for_int8_runtimes(tmp_path):
    directory, _ = _block(tmp_path, "pir")
    graph = open_graph(load_model(directory))
    planned = Deployment("openvino-runtime").targets(graph, ["mul"]).ops
    assert [t.op.seed_type for t in planned] == ["mul", "mul"]  # the residual add feeds norm2: left float


def test_a_target_leaving_most_layers_float_says_so_in_one_line(tmp_path, caplog):
    paddle.seed(0)
    net = paddle.nn.Sequential(paddle.nn.Linear(DIM, 64), paddle.nn.ReLU(), paddle.nn.Linear(64, 64), paddle.nn.ReLU(),
                               paddle.nn.Linear(64, DIM))
    net.eval()
    with paddle.pir_utils.DygraphOldIrGuard():
        paddle.jit.save(net, str(tmp_path / "mlp" / "inference"),
                        input_spec=[paddle.static.InputSpec([None, None, DIM], "float32", "x")])
    x = np.random.default_rng(0).standard_normal((32, TOKENS, DIM)).astype("float32")
    batches = [{"x": x[i:i + 8]} for i in range(0, 32, 8)]
    report = quant_post_static(None, tmp_path / "mlp", tmp_path / "onednn", batch_generator=lambda: iter(batches),
                               algo="hist", quantizable_op_type=["mul"])
    reasons = [layer["left_float"] for layer in report["layers"] if "left_float" in layer]
    assert len(reasons) == 2  # oneDNN's fc rules: a [K, N] weight's scales, a square weight's axis
    line = f"2 of 3 weighted layers stay float for onednn (mostly: {reasons[0]}); " \
           "deploy_backend='openvino' runs 2 of them int8"
    assert report["float_layers"] == line and line in caplog.text
    report = quant_post_static(None, tmp_path / "mlp", tmp_path / "openvino", batch_generator=lambda: iter(batches),
                               algo="hist", quantizable_op_type=["mul"], deploy_backend="openvino")
    assert "float_layers" not in report


def test_auto_takes_the_asymmetric_grid_per_activation_where_it_divides_the_error(tmp_path):
    from qcore.quant import asymmetric_range
    from qptq.auto import ASYMMETRIC_GAIN, choose_thresholds

    directory, _ = _block(tmp_path, "pir")
    graph = open_graph(load_model(directory))
    targets = Deployment("native").targets(graph, ["mul"]).ops
    down = next(t for t in targets if graph.get_param(t.weight.name).shape[0] == 4 * DIM)
    name = down.activations[0].name
    rng = np.random.default_rng(0)
    for lo, expected in ((-0.1, "asymmetric"), (-1.0, None)):  # mostly positive: asymmetric; symmetric: as it is
        x = rng.uniform(lo, 1.0, (8, TOKENS, 4 * DIM)).astype(np.float32)
        candidates = {name: {"abs_max": 1.0}}
        choices = choose_thresholds(graph, [down], candidates, {name: [x]}, 8, grid=lambda n, t: (t, 0.0),
                                    alternative=lambda n, t, lo=lo: asymmetric_range(t, lo, 1.0, 8))
        choice = choices[name]
        assert choice.grid == expected
        if expected:
            assert choice.alternative_errors["abs_max"] * ASYMMETRIC_GAIN <= choice.errors["abs_max"]
        else:
            assert choice.alternative_errors is None  # the asymmetric grid is the symmetric one: not scored
