"""Quantizing for a deployment backend, and running the output on each backend (qcore.deploy)."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from qcore.deploy import get_target, host, openvino, openvino_runtime
from qcore.deploy.openvino import OpenVinoTarget
from qcore.deploy.scratch import as_pdmodel
from qcore.errors import ConfigError
from qcore.graph import open_graph
from qcore.inference import create_predictor, predict, run_predictor
from qcore.model_io import find_model_files, load_model, save_model
from qptq import quant_post_static

F = paddle.nn.functional


class EveryKind(paddle.nn.Layer):
    """conv, depthwise conv, transposed conv, a residual add and an fc (Paddle 3.3.1 cannot export an
    activation x activation matmul to a legacy program from Python; PP-OCRv4 rec's run in the benchmarks)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = paddle.nn.Conv2D(3, 8, 3, padding=1)
        self.depthwise = paddle.nn.Conv2D(8, 8, 3, padding=1, groups=8)
        self.up = paddle.nn.Conv2DTranspose(8, 8, 2, stride=2)
        self.down = paddle.nn.Conv2D(8, 8, 2, stride=2)
        self.fc = paddle.nn.Linear(8, 16)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        y = F.relu(self.conv(x))
        y = y + self.down(F.relu(self.up(F.relu(self.depthwise(y)))))
        return self.fc(paddle.flatten(y, 2).transpose([0, 2, 1]))  # [N, 64, 16]


OP_TYPES = ["conv2d", "depthwise_conv2d", "conv2d_transpose", "mul"]


def _save_float(layer: type[paddle.nn.Layer], directory) -> tuple[object, np.ndarray]:
    """``layer`` (seeded, eval mode) saved as a legacy model in ``directory/float``, and 16 inputs for it."""
    paddle.seed(0)
    net = layer()
    net.eval()
    with paddle.pir_utils.DygraphOldIrGuard():
        paddle.jit.save(net, str(directory / "float" / "inference"),
                        input_spec=[paddle.static.InputSpec([None, 3, 8, 8], "float32", "x")])
    return directory, np.random.default_rng(0).standard_normal((16, 3, 8, 8)).astype("float32")


@pytest.fixture(scope="module")
def every_kind(tmp_path_factory):
    return _save_float(EveryKind, tmp_path_factory.mktemp("every_kind"))


def _quantize(directory, name, x, algo="abs_max", **options):
    return quant_post_static(None, directory / "float", directory / name, sample_generator=lambda: iter(x),
                             batch_size=8, algo=algo, quantizable_op_type=OP_TYPES, save_model_filename=None,
                             save_params_filename=None, **options)


def _error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_openvino_output_quantizes_every_kind_and_deploys_as_simulated(every_kind):
    directory, x = every_kind
    report = _quantize(directory, "openvino", x, deploy_backend="openvino")
    assert report["deploy_backend"] == "openvino"
    kinds = [layer["op"] for layer in report["layers"] if "left_float" not in layer]
    assert sorted(kinds) == sorted(["conv2d", "conv2d", "depthwise_conv2d", "conv2d_transpose", "mul"])
    files = find_model_files(directory / "openvino")
    simulated = load_model(files.directory).run({"x": x})[0]
    float_out = load_model(directory / "float").run({"x": x})[0]
    deployed = predict(files, {"x": x}, backend="openvino")[0]
    assert _error(deployed, simulated) < 0.01  # OpenVINO runs the FakeQuantize we simulate
    assert 0.001 < _error(simulated, float_out) < 0.1  # really quantized, still close to float
    # oneDNN runs it without failing (the transposed conv's weight is cast -> multiply, run float there),
    # but less accurately: its fc weight scales are the bug the default's float fc avoids
    with pytest.warns(UserWarning, match="quantized for 'openvino'"):
        on_onednn = _error(predict(files, {"x": x}, backend="onednn")[0], simulated)
    assert np.isfinite(on_onednn)
    if get_target("onednn").host_problem() is None:  # without VNNI oneDNN's int8 kernels drift further
        assert on_onednn < 0.5


def test_the_default_names_the_onednn_rule_for_each_float_layer(every_kind):
    directory, x = every_kind
    report = _quantize(directory, "default", x)
    assert report["deploy_backend"] is None
    reasons = {layer["op"]: layer["left_float"] for layer in report["layers"] if "left_float" in layer}
    assert reasons["conv2d_transpose"].startswith("onednn: Paddle Inference 3.3.1 has no int8 conv2d_transpose")
    files = find_model_files(directory / "default")
    simulated = load_model(files.directory).run({"x": x})[0]
    for backend in ("onednn", "openvino", "native"):  # correct on every backend
        assert _error(predict(files, {"x": x}, backend=backend)[0], simulated) < 0.02, backend


def test_native_backend_runs_exactly_the_simulation(every_kind):
    directory, x = every_kind
    report = _quantize(directory, "native", x, deploy_backend="native")
    assert not any("left_float" in layer for layer in report["layers"])
    files = find_model_files(directory / "native")
    np.testing.assert_allclose(predict(files, {"x": x}, backend="native")[0],
                               load_model(files.directory).run({"x": x})[0], rtol=1e-4, atol=1e-5)


def test_tensorrt_output_is_written_but_refuses_to_run_without_a_gpu(every_kind):
    directory, x = every_kind
    report = _quantize(directory, "trt", x, deploy_backend="tensorrt")
    adds = [layer for layer in report["layers"] if layer["op"] == "elementwise_add"]
    assert len(adds) == 1 and len(adds[0]["inputs"]) == 2  # TensorRT's int8 add: both inputs quantized
    with pytest.raises(ConfigError, match="tensorrt.*no CUDA"):
        create_predictor(directory / "trt", backend="tensorrt")


@pytest.mark.parametrize("layout", ["pdmodel", "combined", "separate"])
def test_every_legacy_format_runs_on_every_cpu_backend(every_kind, tmp_path, layout):
    directory, x = every_kind
    names = {"pdmodel": (None, None), "combined": ("__model__", "__params__"), "separate": ("__model__", None)}[layout]
    quant_post_static(None, directory / "float", tmp_path / layout, sample_generator=lambda: iter(x), batch_size=8,
                      algo="abs_max", save_model_filename=names[0], save_params_filename=names[1],
                      deploy_backend="openvino")
    simulated = load_model(tmp_path / layout).run({"x": x})[0]
    for backend in ("openvino", "native"):
        predictor = create_predictor(tmp_path / layout, backend=backend, threads=1)
        assert _error(run_predictor(predictor, {"x": x})[0], simulated) < 0.02, backend
    with pytest.warns(UserWarning, match="quantized for 'openvino'"):
        assert np.isfinite(predict(tmp_path / layout, {"x": x}, backend="onednn")[0]).all()


def test_pir_models_refuse_openvino_instead_of_falling_back(tmp_path):
    from qdemo import demo_model_dir

    with pytest.raises(ConfigError, match="does not convert PIR"):
        create_predictor(demo_model_dir("pir"), backend="openvino")
    with pytest.raises(ConfigError, match="deploy_backend='openvino'.*PIR"):
        quant_post_static(None, demo_model_dir("pir"), tmp_path / "out", sample_generator=lambda: iter([]),
                          deploy_backend="openvino")


def test_paddleslim_26_keywords(every_kind, tmp_path):
    directory, x = every_kind
    report = quant_post_static(None, directory / "float", tmp_path / "slim", sample_generator=lambda: iter(x),
                               batch_size=8, algo="abs_max", onnx_format=True, round_type="round",
                               deploy_backend="mkldnn", skip_tensor_list=["conv2d_1.w_0"],
                               save_model_filename=None, save_params_filename=None)
    assert report["deploy_backend"] == "onednn"
    weights = [layer["weight"]["name"] for layer in report["layers"] if "weight" in layer]
    assert "conv2d_1.w_0" not in weights and "conv2d_0.w_0" in weights
    for bad, message in [({"onnx_format": False}, "only the QDQ format"),
                         ({"round_type": "floor"}, "round_type"), ({"algo": "kll"}, "did you mean 'kl'"),
                         ({"deploy_backend": "openvno"}, "did you mean 'openvino'")]:
        with pytest.raises(ConfigError, match=message):
            quant_post_static(None, directory / "float", tmp_path / "bad", sample_generator=lambda: iter(x), **bad)


@pytest.mark.parametrize(("fix", "backend"), [("1", "openvino"), ("0", "openvino"), ("0", OpenVinoTarget(True))])
def test_the_overflow_fix_is_reported_and_bounds_every_stored_weight_code(every_kind, monkeypatch, fix, backend):
    """$QCORE_OVERFLOW_FIX forces what this CPU would choose (qcore.deploy.host), a target object overrides both;
    OpenVINO runs either as simulated on a CPU with VNNI, and only the fixed one on a CPU without."""
    monkeypatch.setenv("QCORE_OVERFLOW_FIX", fix)
    if not isinstance(backend, str):
        fix = "1"
    directory, x = every_kind
    report = _quantize(directory, f"fix{fix}", x, deploy_backend=backend)
    assert report["weight_max_code"] == (64 if fix == "1" else None)
    graph = open_graph(load_model(directory / f"fix{fix}"))
    codes = [graph.get_param(n) for n in graph.param_names() if n.endswith(".quantized")]
    assert len(codes) == 5  # conv, depthwise, transposed conv, down conv, fc
    assert max(int(np.abs(c).max()) for c in codes) == (64 if fix == "1" else 127)
    if fix == "1" or not host.int8_pairs_saturate():
        files = find_model_files(directory / f"fix{fix}")
        simulated = load_model(files.directory).run({"x": x})[0]
        assert _error(predict(files, {"x": x}, backend="openvino")[0], simulated) < 0.01


def test_a_bad_overflow_fix_setting_is_refused_before_calibration(every_kind, tmp_path, monkeypatch):
    monkeypatch.setenv("QCORE_OVERFLOW_FIX", "yes")
    directory, x = every_kind
    read = []

    def samples():
        read.append(1)
        yield from ((row,) for row in x)

    with pytest.raises(ConfigError, match="QCORE_OVERFLOW_FIX='yes': set it to 1"):
        quant_post_static(None, directory / "float", tmp_path / "out", sample_generator=samples)
    assert not read and not (tmp_path / "out").exists()  # no sample read, nothing written


def test_auto_and_adaround_outputs_deploy_as_simulated_on_every_cpu_backend(every_kind, monkeypatch):
    directory, x = every_kind
    # the net is far below OpenVINO's whole-model cost rule, which would keep it float: this test is about int8
    monkeypatch.setattr(OpenVinoTarget, "min_int8_work", None)
    float_out = load_model(directory / "float").run({"x": x})[0]
    for backend in ("openvino", None):
        name = f"layerwise_{backend}"
        report = _quantize(directory, name, x, deploy_backend=backend, round_type="adaround", algo="auto")
        assert all("adaround" in layer["weight"] for layer in report["layers"] if "weight" in layer)
        files = find_model_files(directory / name)
        simulated = load_model(files.directory).run({"x": x})[0]
        assert 0.001 < _error(simulated, float_out) < 0.1
        runs = ["openvino"] if backend else ["openvino", "native"] + (
            ["onednn"] if get_target("onednn").host_problem() is None else [])
        for run in runs:
            assert _error(predict(files, {"x": x}, backend=run)[0], simulated) < 0.01, run


def _plain_paddle(model_file, params_file, x):
    """A saved legacy program loaded the plain Paddle way (load_inference_model + an executor, no qcore): each
    activation quantize_linear's input -> its stored zero point, the marked shift ops, and its outputs for x."""
    with paddle.pir_utils.OldIrGuard():
        paddle.enable_static()
        exe = paddle.static.Executor(paddle.CPUPlace())
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            program, feeds, fetches = paddle.static.load_inference_model(
                str(model_file.parent), exe, model_filename=model_file.name, params_filename=params_file.name)
            block = program.global_block()
            zero_points = {op.input("X")[0]: int(np.array(scope.find_var(op.input("ZeroPoint")[0]).get_tensor())[0])
                           for op in block.ops if op.type == "quantize_linear"}
            shifts = [op for op in block.ops if op.has_attr("qcore_zero_point_shift")]
            out = exe.run(program, feed={feeds[0]: x}, fetch_list=fetches)[0]
    paddle.disable_static()
    return zero_points, shifts, out


def test_asymmetric_activations_deploy_as_zero_points_on_openvino(every_kind, monkeypatch, tmp_path):
    """abs_max on relu outputs: the grid is [0, max] (offset = threshold = max / 2, zero point -127); the
    saved program carries the shifts (plain Paddle computes the simulation) and the zero points, the copy
    OpenVINO reads has the zero points only, and OpenVINO runs it as simulated."""
    directory, x = every_kind
    report = _quantize(directory, "asym", x, deploy_backend="openvino", activation_symmetric=False)
    symmetric = _quantize(directory, "sym", x, deploy_backend="openvino")
    inputs = {name: info for layer in report["layers"] for name, info in layer.get("inputs", {}).items()}
    plain = {name: info for layer in symmetric["layers"] for name, info in layer.get("inputs", {}).items()}
    shifted = [name for name, info in inputs.items() if info.get("offset")]
    relu_outputs = [name for name in inputs if name.startswith("relu")]
    assert len(relu_outputs) == 3 and set(relu_outputs) <= set(shifted)
    for name in relu_outputs:
        assert inputs[name]["offset"] == pytest.approx(inputs[name]["threshold"])
        assert inputs[name]["threshold"] == pytest.approx(plain[name]["threshold"] / 2)
    # x reaches [-3.90, 3.07]: 255 levels over that span, 10.7 % finer than over [-3.90, 3.90]
    assert inputs["x"]["threshold"] == pytest.approx((3.8994217 + 3.0660367) / 2, rel=1e-6)
    files = find_model_files(directory / "asym")
    loaded = load_model(files)
    shifts = [op for op in loaded.program.global_block().ops if op.has_attr("qcore_zero_point_shift")]
    assert len(shifts) == 2 * len(shifted)
    simulated = loaded.run({"x": x})[0]
    stored, saved_shifts, plain_out = _plain_paddle(files.model_file, files.params_file, x)
    assert len(saved_shifts) == 2 * len(shifted) and not any(stored.values())  # shifts, and zero points of 0
    np.testing.assert_array_equal(plain_out, simulated)  # what qcore simulated, without qcore
    # Paddle Inference's OpenVINO engine on the saved files, configured by hand: the same model
    config = paddle.inference.Config(str(files.model_file), str(files.params_file))
    OpenVinoTarget().configure(config, 1)
    assert _error(run_predictor(paddle.inference.create_predictor(config), {"x": x})[0], simulated) < 0.01
    runtime = as_pdmodel(files)  # what qcore's predictors give OpenVINO: zero points in place of the shifts
    folded, runtime_shifts, _ = _plain_paddle(runtime.model_file, runtime.params_file, x)
    assert not runtime_shifts
    assert {name for name, z in folded.items() if z} == set(shifted)
    for name in shifted:
        assert folded[name] == -round(inputs[name]["offset"] / (inputs[name]["threshold"] / 127))
    assert all(folded[name] == -127 for name in relu_outputs)
    # a model saved folded (before the shifts were saved) gets them back on load: the same simulation
    old = tmp_path / "folded"
    old.mkdir()
    (old / "inference.pdmodel").write_bytes(runtime.model_file.read_bytes())
    (old / "inference.pdiparams").write_bytes(files.params_file.read_bytes())
    np.testing.assert_array_equal(load_model(old).run({"x": x})[0], simulated)
    float_out = load_model(directory / "float").run({"x": x})[0]
    assert _error(predict(files, {"x": x}, backend="openvino")[0], simulated) < 0.01
    # the finer activation grids pay off where the weights keep their 8 bits: compared with the overflow fix off
    # (on a CPU without VNNI the fix's 7-bit weights dominate both models' error, 0.01786 vs 0.01780)
    monkeypatch.setenv("QCORE_OVERFLOW_FIX", "0")
    errors = {}
    for grid, symmetric in (("asym8", False), ("sym8", True)):
        _quantize(directory, grid, x, deploy_backend="openvino", activation_symmetric=symmetric)
        errors[grid] = _error(load_model(find_model_files(directory / grid)).run({"x": x})[0], float_out)
    assert errors["asym8"] < errors["sym8"]


def test_a_loaded_asymmetric_model_saves_back_to_the_same_bytes(every_kind, tmp_path):
    directory, x = every_kind
    _quantize(directory, "asym_resave", x, deploy_backend="openvino", activation_symmetric=False)
    files = find_model_files(directory / "asym_resave")
    again = save_model(load_model(files), tmp_path / "again", files.model_file.name, files.params_file.name)
    assert again.model_file.read_bytes() == files.model_file.read_bytes()
    assert again.params_file.read_bytes() == files.params_file.read_bytes()


def test_asymmetric_activations_save_as_shifts_for_the_native_backend(every_kind):
    directory, x = every_kind
    _quantize(directory, "asym_native", x, deploy_backend="native", activation_symmetric=False)
    files = find_model_files(directory / "asym_native")
    program = load_model(files).program.global_block().ops
    shifts = [op for op in program if op.type == "elementwise_add" and op.input("Y")[0].endswith("@bias")]
    assert shifts and not any(op.has_attr("qcore_zero_point_shift") for op in shifts)
    np.testing.assert_allclose(predict(files, {"x": x}, backend="native")[0],
                               load_model(files).run({"x": x})[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("backend", [None, "onednn", "tensorrt"])
def test_backends_without_asymmetric_grids_refuse_them(every_kind, tmp_path, backend):
    directory, x = every_kind
    with pytest.raises(ConfigError, match="activation_symmetric=False: .* symmetric activation grids only"):
        _quantize(directory, "refused", x, deploy_backend=backend, activation_symmetric=False)
    assert not (directory / "refused").exists()
    with pytest.raises(ConfigError, match="activation_symmetric='no' is not valid"):
        _quantize(directory, "refused", x, deploy_backend="openvino", activation_symmetric="no")


class Excited(paddle.nn.Layer):
    """A conv whose output a squeeze-excite branch scales: ``y + y * hardsigmoid(se(y))`` (PP-OCRv4 det's RSE)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = paddle.nn.Conv2D(3, 8, 3, padding=1)
        self.proj = paddle.nn.Conv2D(8, 8, 1, bias_attr=False)
        self.squeeze = paddle.nn.Conv2D(8, 2, 1)
        self.excite = paddle.nn.Conv2D(2, 8, 1)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        y = self.proj(F.relu(self.conv(x)))
        s = F.hardsigmoid(self.excite(F.relu(self.squeeze(F.adaptive_avg_pool2d(y, 1)))))
        return y + y * s


def _excited_report(report: dict) -> tuple[list[str], set[str]]:
    """The float reasons of an ``Excited`` report's convs, and the op types that only read a quantized input."""
    reasons = [layer.get("left_float", "") for layer in report["layers"] if layer["op"] == "conv2d"]
    return reasons, {layer["op"].split(".")[-1] for layer in report["layers"] if "runs_float" in layer}


def test_openvino_runs_a_squeeze_excited_conv_int8_as_simulated(tmp_path, monkeypatch):
    """Every reader of the excited conv's output (pool, product, join) reads its one QDQ copy, as NNCF places it;
    with the product reading the float output instead, OpenVINO computes the block wrongly."""
    _, x = _save_float(Excited, tmp_path)

    def deployed_error(name: str) -> tuple[dict, float]:
        report = _quantize(tmp_path, name, x, deploy_backend="openvino")
        files = find_model_files(tmp_path / name)
        return report, _error(predict(files, {"x": x}, backend="openvino")[0], load_model(files).run({"x": x})[0])

    report, error = deployed_error("shared")
    reasons, readers = _excited_report(report)
    assert reasons == [""] * 4 and readers == {"elementwise_mul"}
    assert error < 1e-4  # measured 1.6e-7 (Paddle 3.3.1's OpenVINO 2025.0)
    monkeypatch.setattr(openvino, "excited_readers", lambda *args: [])  # the placement before: the product read y
    report, error = deployed_error("apart")
    assert _excited_report(report) == ([""] * 4, set())
    assert error > 0.01  # measured 0.037


def _int8_convs(model_file) -> int:
    """Convolutions the OpenVINO runtime's CPU plugin runs on 8-bit inputs in ``model_file``."""
    import openvino as ov

    compiled = ov.Core().compile_model(str(model_file), "CPU", {"INFERENCE_NUM_THREADS": 1})
    info = [op.get_rt_info() for op in compiled.get_runtime_model().get_ops()]
    return sum(i["layerType"].astype(str) == "Convolution" and i["runtimePrecision"].astype(str) in ("u8", "i8")
               for i in info)


@pytest.mark.parametrize("family", ["legacy", "pir"])
def test_the_openvino_runtime_runs_a_squeeze_excited_conv_int8_as_simulated(tmp_path, monkeypatch, family):
    """PP-OCRv4 det's RSE block on the openvino package (2026.4), both IRs (PIR through the ONNX export): all 4
    convs int8 and the output as simulated; with the product reading the float output, 68 % off."""
    paddle.seed(0)
    net = Excited()
    net.eval()
    spec = [paddle.static.InputSpec([None, 3, 8, 8], "float32", "x")]
    if family == "legacy":
        with paddle.pir_utils.DygraphOldIrGuard():
            paddle.jit.save(net, str(tmp_path / "float" / "inference"), input_spec=spec)
    else:
        paddle.jit.save(net, str(tmp_path / "float" / "inference"), input_spec=spec)
    x = np.random.default_rng(0).standard_normal((16, 3, 8, 8)).astype("float32")

    def deployed(name: str) -> tuple[dict, float, int]:
        report = _quantize(tmp_path, name, x, deploy_backend="openvino-runtime")
        files = find_model_files(tmp_path / name)
        predictor = create_predictor(files, backend="openvino-runtime")
        error = _error(run_predictor(predictor, {"x": x})[0], load_model(files).run({"x": x})[0])
        return report, error, _int8_convs(predictor.onnx_file)

    report, error, int8 = deployed("shared")
    reasons, readers = _excited_report(report)
    assert reasons == [""] * 4 and readers == {"elementwise_mul" if family == "legacy" else "multiply"}
    assert int8 == 4
    assert error < 1e-2  # measured 2.5e-3 (the hardsigmoid and the float-output convs run bf16 on AVX-512 BF16)
    monkeypatch.setattr(openvino_runtime, "excited_readers", lambda *args: [])
    _, error, _ = deployed("apart")
    assert error > 0.1  # measured 0.68


@pytest.mark.parametrize("family", ["legacy_pdmodel", "pir"])
@pytest.mark.parametrize("round_type", ["round", "adaround"])
def test_a_quantized_lookup_table_runs_on_every_cpu_backend(tmp_path, family, round_type):
    """The table is stored per row and dequantized after the lookup; dequantized whole before it, Paddle
    Inference's oneDNN int8 passes refused the legacy model ("no kernels ... reduce_mean")."""
    from qdemo.testing import EMBEDDING_INPUT_SPEC, TinyEmbeddingNet, save_tiny_net

    paddle.seed(0)
    net = TinyEmbeddingNet(vocab=500, dim=32)
    net.eval()
    kwargs = save_tiny_net(net, tmp_path / "float", family, EMBEDDING_INPUT_SPEC)
    ids = np.random.default_rng(0).integers(0, 500, (32, 6)).astype("int64")
    report = quant_post_static(None, tmp_path / "float", tmp_path / "q", **kwargs, round_type=round_type,
                               batch_generator=lambda: iter([{"ids": ids[i:i + 8]} for i in range(0, 32, 8)]),
                               quantizable_op_type=["lookup_table"], save_model_filename=None,
                               save_params_filename=None)
    (lookup,) = report["layers"]
    assert "left_float" not in lookup and len(lookup["weight"]["thresholds"]) == 500  # one scale per row
    files = find_model_files(tmp_path / "q")
    graph = open_graph(load_model(files.directory))
    (codes,) = [graph.get_param(n) for n in graph.param_names() if n.endswith(".quantized")]
    assert codes.dtype == np.int8 and codes.shape == (500, 32)
    simulated = load_model(files.directory).run({"ids": ids})[0]
    float_out = load_model(tmp_path / "float").run({"ids": ids})[0]
    assert np.abs(simulated - float_out).max() < 0.01 * np.abs(float_out).max()
    backends = ["native", "onednn"] + (["openvino"] if family != "pir" else [])
    for backend in backends:
        deployed = predict(files, {"ids": ids}, backend=backend)[0]
        np.testing.assert_allclose(deployed, simulated, atol=1e-6, err_msg=backend)


@pytest.mark.parametrize("backend", ["openvino", "openvino-runtime"])
def test_auto_keeps_a_model_too_small_to_gain_float_on_openvino(every_kind, backend):
    """OpenVINO's whole-model cost rule (qcore.deploy.openvino.SMALL_MODEL): a net doing under 50 M multiply-adds
    per sample is saved float under algo="auto", and the report says why."""
    directory, x = every_kind
    name = f"small_{backend}"
    report = _quantize(directory, name, x, deploy_backend=backend, algo="auto")
    auto = report["auto"]
    assert auto["model"] == "float" and auto["macs_per_sample"] < 50_000_000
    assert auto["why"].startswith(f"{backend}: int8 cannot be faster than float")
    simulated = load_model(find_model_files(directory / name).directory).run({"x": x})[0]
    np.testing.assert_allclose(simulated, load_model(directory / "float").run({"x": x})[0], rtol=1e-4, atol=1e-5)
