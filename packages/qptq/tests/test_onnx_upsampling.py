"""Upsampling through the ONNX export (issue 41): interpolations by scale factor (PP-OCRv4 det's FPN) and by size,
and transposed convs (its head), from PIR and legacy programs; float exact, int8 on both runtimes as simulated."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import paddle
import pytest

from qcore.deploy import get_target
from qcore.deploy.onnxruntime import TRANSPOSED_CONV_FLOAT
from qcore.errors import ExportError
from qcore.export import export_onnx
from qcore.export import paddle2onnx_float as p2o
from qcore.inference import create_predictor, run_predictor
from qcore.model_io import export_layer, load_model
from qptq import quant_post_static

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("paddle2onnx")
from onnx import numpy_helper  # noqa: E402

F = paddle.nn.functional


class Upsampling(paddle.nn.Layer):
    """A stride-2 conv, then back up three ways: nearest by scale factor 2 (det's FPN), bilinear to a size,
    and a transposed conv with a batch norm (det's head); nearest by size on the way out."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = paddle.nn.Conv2D(3, 8, 3, padding=1)
        self.down = paddle.nn.Conv2D(8, 8, 3, stride=2, padding=1)
        self.up = paddle.nn.Conv2DTranspose(8, 6, 2, stride=2)
        self.bn = paddle.nn.BatchNorm2D(6)
        self.lateral = paddle.nn.Conv2D(8, 6, 1)
        self.head = paddle.nn.Conv2D(6, 4, 3, padding=1)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        y = F.relu(self.conv(x))
        d = F.relu(self.down(y))
        u = F.relu(self.bn(self.up(d)))
        n = F.interpolate(self.lateral(d), scale_factor=2, mode="nearest")
        b = F.interpolate(self.lateral(d), size=[8, 8], mode="bilinear")
        return F.interpolate(self.head(u + n + b), size=[16, 16], mode="nearest")


@pytest.fixture(scope="module", params=["pir", "legacy"])
def float_model(request, tmp_path_factory):
    """Upsampling with trained-looking batch-norm statistics saved in one IR: its directory, 16 inputs, the net."""
    directory = tmp_path_factory.mktemp(request.param) / "float"
    paddle.seed(0)
    net = Upsampling()
    rng = np.random.default_rng(0)
    net.bn._mean.set_value(rng.normal(0, 0.3, 6).astype("float32"))
    net.bn._variance.set_value(rng.uniform(0.5, 2.0, 6).astype("float32"))
    net.eval()
    export_layer(net, directory / "inference", [paddle.static.InputSpec([None, 3, 8, 8], "float32", "x")],
                 request.param)
    return directory, rng.standard_normal((16, 3, 8, 8)).astype("float32"), net


def _relative_l2(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.linalg.norm(got - expected) / np.linalg.norm(expected))


def _digests(directory) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


def test_paddle2onnx_alone_fails_on_scale_factor_interpolation(float_model, monkeypatch):
    # the problem: Paddle 3 holds the scale as doubles, paddle2onnx 2.1 reads floats and aborts
    directory, _, _ = float_model
    monkeypatch.setattr(p2o, "float_interp_scales", lambda program: 0)
    with pytest.raises(ExportError, match=r"at pd_op\.(nearest|bilinear)_interp .+the 0th elementwise MUST be "
                                          r"ir::FloatAttribute"):
        export_onnx(directory, directory.parent / "refused.onnx")
    assert not (directory.parent / "refused.onnx").exists()


def test_scales_are_written_as_floats_on_a_copy(float_model, tmp_path):
    directory, _, _ = float_model
    before = _digests(directory)
    files = load_model(directory).source
    program_file, _ = p2o.pir_program(files, tmp_path)
    program = json.loads(program_file.read_text())
    scales = []

    def find(node: object) -> None:  # every interpolation's scale attribute, as the JSON tags its elements
        if isinstance(node, dict):
            if str(node.get("#", "")).endswith("_interp"):
                scales.extend(a["AT"]["D"] for a in node["A"] if a["N"] == "scale")
            for value in node.values():
                find(value)
        elif isinstance(node, list):
            for value in node:
                find(value)

    find(program)
    # the scale-factor interpolation holds [2.0, 2.0], now float32; the size ones hold no scale
    assert [[(e["#"], e["D"]) for e in s] for s in scales if s] == [[("0.a_f32", 2.0), ("0.a_f32", 2.0)]]
    assert len(scales) == 3 and p2o.float_interp_scales(program) == 0  # nothing left to rewrite
    assert _digests(directory) == before  # the model itself is only read


def test_the_float_export_computes_what_paddle_computes(float_model, tmp_path):
    directory, x, _ = float_model
    before = _digests(directory)
    path = export_onnx(directory, tmp_path / "float.onnx")
    model = onnx.load(str(path))
    resizes = sorted(next(a.s for a in n.attribute if a.name == "mode") for n in model.graph.node
                     if n.op_type == "Resize")
    assert resizes == [b"linear", b"nearest", b"nearest"]
    expected = load_model(directory).run({"x": x})[0]
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {"x": x})[0]
    assert got.shape == expected.shape == (16, 4, 16, 16)
    assert _relative_l2(got, expected) < 1e-6
    assert _digests(directory) == before


@pytest.fixture(scope="module")
def for_openvino(float_model):
    """Quantized for the OpenVINO runtime, transposed conv included, and exported: (model dir, ONNX file)."""
    directory, x, _ = float_model
    out = directory.parent / "openvino"
    report = quant_post_static(None, directory, out, sample_generator=lambda: iter(x), batch_size=8,
                               algo="abs_max", quantizable_op_type=["conv2d", "conv2d_transpose"],
                               optimize_model=True, deploy_backend="openvino-runtime", save_model_filename=None,
                               save_params_filename=None)
    (transposed,) = [layer for layer in report["layers"] if layer["op"] == "conv2d_transpose"]
    assert "left_float" not in transposed
    # PIR models reach the runtime through the export (saved with them); legacy ones through their .pdmodel,
    # and their export (written here) is what ONNX Runtime and TensorRT users take
    return out, export_onnx(out, directory.parent / "openvino.onnx")


def test_the_transposed_conv_is_int8_with_a_scale_per_output_channel(for_openvino, float_model):
    _, onnx_file = for_openvino
    model = onnx.load(str(onnx_file))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    (conv,) = [n for n in model.graph.node if n.op_type == "ConvTranspose"]
    data, weight = producers[conv.input[0]], producers[conv.input[1]]
    assert data.op_type == weight.op_type == "DequantizeLinear"  # nothing between the QDQ and the conv
    codes, steps = inits[weight.input[0]], inits[weight.input[1]]
    assert codes.dtype == np.int8 and codes.shape == (8, 6, 2, 2)  # [C_in, C_out, kh, kw]
    assert [(a.name, a.i) for a in weight.attribute] == [("axis", 1)] and steps.shape == (6,)
    # the bias went into the conv, the batch norm into its weight steps: its output is the conv's own
    assert len(conv.input) == 3 and not any(n.op_type == "BatchNormalization" for n in model.graph.node)
    # by hand: the float weight times the batch norm's factor per output channel, whose largest code is the
    # target's largest (7-bit codes where int8 pairs saturate: qcore.deploy.host)
    directory, _, net = float_model
    factor = net.bn.weight.numpy() / np.sqrt(net.bn._variance.numpy() + 1e-5)
    folded = net.up.weight.numpy() * factor.reshape(1, -1, 1, 1)
    max_code = get_target("openvino-runtime").weight_max_code(8, load_model(directory).family) or 127
    np.testing.assert_array_equal(np.abs(codes).max(axis=(0, 2, 3)), np.full(6, max_code))
    np.testing.assert_allclose(steps, np.abs(folded).max(axis=(0, 2, 3)) / max_code, rtol=1e-5)
    assert np.abs(codes * steps.reshape(1, -1, 1, 1) - folded).max() <= steps.max() / 2 * (1 + 1e-5)


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino-runtime"])
def test_the_int8_export_runs_as_simulated_on_both_runtimes(for_openvino, float_model, runtime, monkeypatch):
    if runtime == "openvino-runtime":
        pytest.importorskip("openvino")
        monkeypatch.setenv("QCORE_OPENVINO_PRECISION", "f32")  # the float layers in bf16 add ~1 % here
    out, onnx_file = for_openvino
    directory, x, _ = float_model
    simulated = load_model(out).run({"x": x})[0]
    deployed = run_predictor(create_predictor(onnx_file, backend=runtime), {"x": x})[0]
    assert deployed.shape == simulated.shape == (16, 4, 16, 16)
    assert _relative_l2(deployed, simulated) < 1e-2  # the ONNX targets' deployed-vs-simulated tolerance
    assert _relative_l2(deployed, load_model(directory).run({"x": x})[0]) < 0.1  # still the float function


def test_onnx_runtime_keeps_the_transposed_conv_float_and_says_why(float_model, tmp_path):
    directory, x, _ = float_model
    report = quant_post_static(None, directory, tmp_path / "ort", sample_generator=lambda: iter(x), batch_size=8,
                               algo="abs_max", quantizable_op_type=["conv2d", "conv2d_transpose"],
                               optimize_model=True, deploy_backend="onnxruntime", save_model_filename=None,
                               save_params_filename=None)
    (transposed,) = [layer for layer in report["layers"] if layer["op"] == "conv2d_transpose"]
    assert TRANSPOSED_CONV_FLOAT in transposed["left_float"]
    model = onnx.load(str(tmp_path / "ort" / "inference.onnx"))
    (conv,) = [n for n in model.graph.node if n.op_type == "ConvTranspose"]
    assert conv.input[1] in {i.name for i in model.graph.initializer}  # a float weight
    simulated = load_model(tmp_path / "ort").run({"x": x})[0]
    deployed = run_predictor(create_predictor(tmp_path / "ort", backend="onnxruntime"), {"x": x})[0]
    assert _relative_l2(deployed, simulated) < 1e-2
