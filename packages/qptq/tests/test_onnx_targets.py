"""Quantizing for the ONNX runtimes: the saved inference.onnx, its QDQ, and what ONNX Runtime and the
OpenVINO runtime compute with it (deployed vs simulated), from PIR and legacy models."""

from __future__ import annotations

import collections
import hashlib

import numpy as np
import onnx
import paddle
import pytest
from onnx import numpy_helper

from qcore.deploy import get_target, host
from qcore.deploy.onnx_runtimes import ONNX_FILE
from qcore.errors import ConfigError, ExportError
from qcore.export import export_onnx, onnx_bytes
from qcore.inference import create_predictor, run_predictor
from qcore.model_io import load_model
from qptq import quant_post_dynamic, quant_post_static

F = paddle.nn.functional


class EveryKind(paddle.nn.Layer):
    """conv + batch norm + relu, depthwise conv + hardswish, transposed conv, a residual add, an average pool, an fc."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = paddle.nn.Conv2D(3, 8, 3, padding=1)
        self.bn = paddle.nn.BatchNorm2D(8)
        self.depthwise = paddle.nn.Conv2D(8, 8, 3, padding=1, groups=8)
        self.up = paddle.nn.Conv2DTranspose(8, 8, 2, stride=2)
        self.down = paddle.nn.Conv2D(8, 8, 2, stride=2)
        self.pool = paddle.nn.AvgPool2D(2)
        self.fc = paddle.nn.Linear(8, 16)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        y = F.relu(self.bn(self.conv(x)))
        z = F.hardswish(self.depthwise(y))
        y = y + self.down(F.relu(self.up(z)))
        return self.fc(paddle.flatten(self.pool(y), 2).transpose([0, 2, 1]))  # [N, 16, 16]


OP_TYPES = ["conv2d", "depthwise_conv2d", "conv2d_transpose", "mul", "pool2d"]
RUNTIMES = ("onnxruntime", "openvino-runtime")


def _relative_l2(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.linalg.norm(got - expected) / np.linalg.norm(expected))


@pytest.fixture(scope="module", params=["pir", "legacy"])
def float_model(request, tmp_path_factory):
    """EveryKind with trained-looking batch-norm statistics, saved in one IR; and 16 inputs."""
    directory = tmp_path_factory.mktemp(request.param)
    paddle.seed(0)
    net = EveryKind()
    rng = np.random.default_rng(0)
    net.bn._mean.set_value(rng.normal(0, 0.3, 8).astype("float32"))
    net.bn._variance.set_value(rng.uniform(0.5, 2.0, 8).astype("float32"))
    net.eval()
    spec = [paddle.static.InputSpec([None, 3, 8, 8], "float32", "x")]
    if request.param == "pir":
        paddle.jit.save(net, str(directory / "float" / "inference"), input_spec=spec)
    else:
        with paddle.pir_utils.DygraphOldIrGuard():
            paddle.jit.save(net, str(directory / "float" / "inference"), input_spec=spec)
    return directory, rng.standard_normal((16, 3, 8, 8)).astype("float32"), net


@pytest.fixture(scope="module")
def for_onnxruntime(float_model):
    directory, x, _ = float_model
    out = directory / "ort"
    report = quant_post_static(None, directory / "float", out, sample_generator=lambda: iter(x), batch_size=8,
                               algo="abs_max", quantizable_op_type=OP_TYPES, optimize_model=True,
                               deploy_backend="onnxruntime", save_model_filename=None, save_params_filename=None)
    return out, x, report


def test_the_quantized_model_is_saved_with_its_onnx_export(for_onnxruntime, float_model):
    out, _, _ = for_onnxruntime
    model = onnx.load(str(out / ONNX_FILE))
    onnx.checker.check_model(model)
    kinds = collections.Counter(n.op_type for n in model.graph.node)
    # every conv kind, the fc and the pool read QDQ'd inputs; one pair per reader: as many Q as DQ on activations
    assert kinds["Conv"] == 3 and kinds["ConvTranspose"] == 1 and kinds["MatMul"] == 1
    assert kinds["BatchNormalization"] == 0  # folded into the conv's int8 weight steps
    weights = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0].endswith(".int8")]
    # conv, depthwise, down, fc; the transposed conv stays float for ONNX Runtime (no int8 kernel: its float_ops)
    assert len(weights) == 4
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in weights:
        assert inits[node.input[0]].dtype == np.int8 and np.abs(inits[node.input[0]]).max() <= 127
    quantizes = [n for n in model.graph.node if n.op_type == "QuantizeLinear"]
    assert len({n.input[0] for n in quantizes}) == len(quantizes)  # one QuantizeLinear per tensor
    for node in quantizes:
        assert inits[node.input[2]].dtype == np.uint8  # U8S8: ONNX Runtime's int8 kernels
    # every DequantizeLinear feeds one op (ONNX Runtime fuses only such); the conv outputs are quantized too
    readers = collections.Counter(name for n in model.graph.node for name in n.input)
    for node in (n for n in model.graph.node if n.op_type == "DequantizeLinear"):
        assert readers[node.output[0]] == 1
    producers = {o: n for n in model.graph.node for o in n.output}

    def writer(name: str) -> str:  # through paddle2onnx's Identity after an add
        node = producers.get(name)
        return "input" if node is None else writer(node.input[0]) if node.op_type == "Identity" else node.op_type

    # ONNX Runtime fuses a conv only when its output is quantized: before the hardswish (a float op) the conv's
    # output is; before a relu only the relu's output (it drops the relu then)
    assert {writer(n.input[0]) for n in quantizes} >= {"Conv", "Relu", "input"}
    relu_inputs = {n.input[0] for n in model.graph.node if n.op_type == "Relu"}
    assert not relu_inputs & {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    # the pool, asked for by type, gets its output quantized too: ONNX Runtime runs it int8 then
    kinds = _ort_optimized_kinds(out / ONNX_FILE, out.parent)
    assert kinds["QLinearAveragePool"] == 1 and kinds["AveragePool"] == 0


def test_weight_scales_are_the_paddle_models_steps_with_batch_norm_folded(for_onnxruntime, float_model):
    out, _, _ = for_onnxruntime
    _, _, net = float_model
    model = onnx.load(str(out / ONNX_FILE))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    conv = next(n for n in model.graph.node if n.op_type == "Conv" and n.input[0].startswith("p2o.pd_op.cast.0."))
    dq = next(n for n in model.graph.node if n.output[0] == conv.input[1])
    codes, steps = inits[dq.input[0]], inits[dq.input[1]]
    assert dq.attribute[0].name == "axis" and dq.attribute[0].i == 0
    # by hand: the float conv weight times the batch-norm factor, quantized per output channel by abs max
    weight = net.conv.weight.numpy()
    factor = net.bn.weight.numpy() / np.sqrt(net.bn._variance.numpy() + 1e-5)
    # 7-bit codes on a CPU whose int8 pairs saturate (qcore.deploy.host), where this target runs int8 convs
    max_code = get_target("onnxruntime").weight_max_code(8, "legacy") or 127
    assert max_code == (64 if host.overflow_fix_default() else 127)
    expected_steps = np.abs(weight).max(axis=(1, 2, 3)) / max_code * factor
    np.testing.assert_allclose(steps, expected_steps, rtol=1e-5)
    np.testing.assert_array_equal(codes, np.round(weight / (expected_steps / factor).reshape(-1, 1, 1, 1)))


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_deployed_equals_simulated_on_both_runtimes(for_onnxruntime, runtime):
    out, x, _ = for_onnxruntime
    simulated = load_model(out).run({"x": x})[0]
    deployed = run_predictor(create_predictor(out / ONNX_FILE, backend=runtime), {"x": x})[0]
    assert deployed.shape == simulated.shape
    # int8 kernels round accumulators and int32 biases their own way: within 1 % (relative L2) of the simulation
    assert _relative_l2(deployed, simulated) < 1e-2
    float_out = load_model(out.parent / "float").run({"x": x})[0]
    assert _relative_l2(deployed, float_out) < 0.1  # and it is still the float model's function


def _plain_executor(out, x: np.ndarray) -> np.ndarray:
    """The saved Paddle program loaded the plain Paddle way (load_inference_model + an executor), in its IR."""
    guard = paddle.pir_utils.OldIrGuard() if (out / "inference.pdmodel").exists() else paddle.pir_utils.IrGuard()
    with guard:
        paddle.enable_static()
        exe = paddle.static.Executor(paddle.CPUPlace())
        with paddle.static.scope_guard(paddle.static.Scope()):
            program, feeds, fetches = paddle.static.load_inference_model(str(out / "inference"), exe)
            y = exe.run(program, feed={feeds[0]: x}, fetch_list=fetches)[0]
    paddle.disable_static()
    return y


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_plain_paddle_computes_the_simulation_of_a_model_saved_for_a_runtime(float_model, tmp_path, runtime):
    """The ONNX runtimes get asymmetric (onnxruntime) or unsigned (openvino-runtime) grids: zero points Paddle's
    kernels ignore. The saved program keeps the shifts standing for them, so a user loading it without qcore
    gets the model qcore simulated, not another one (0 % of PP-OCR rec lines matched before)."""
    directory, x, _ = float_model
    out = tmp_path / runtime
    report = quant_post_static(None, directory / "float", out, sample_generator=lambda: iter(x), batch_size=8,
                               algo="abs_max", quantizable_op_type=OP_TYPES, deploy_backend=runtime,
                               save_model_filename=None, save_params_filename=None)
    offsets = [i for layer in report["layers"] for i in layer.get("inputs", {}).values() if i.get("offset")]
    assert offsets  # zero points are in play
    simulated = load_model(out).run({"x": x})[0]
    np.testing.assert_array_equal(_plain_executor(out, x), simulated)
    if runtime == "openvino-runtime" and (out / "inference.pdmodel").exists():
        import openvino as ov  # OpenVINO reading the saved program itself, without qcore: the same model

        core = ov.Core()
        compiled = core.compile_model(core.read_model(str(out / "inference.pdmodel")), "CPU",
                                      {"INFERENCE_PRECISION_HINT": "f32"})
        assert _relative_l2(compiled(x)[0], simulated) < 1e-2


def test_the_openvino_runtime_reads_legacy_programs_itself_and_pir_through_onnx(float_model, tmp_path, monkeypatch):
    directory, x, _ = float_model
    monkeypatch.setenv("QCORE_OPENVINO_PRECISION", "f32")  # the float layers in bf16 (this CPU's default) add ~1 %
    out = tmp_path / "ov"
    report = quant_post_static(None, directory / "float", out, sample_generator=lambda: iter(x), batch_size=8,
                      algo="abs_max", quantizable_op_type=OP_TYPES, optimize_model=True,
                      deploy_backend="openvino-runtime", save_model_filename=None, save_params_filename=None)
    legacy = load_model(directory / "float").family == "legacy"
    assert (out / ONNX_FILE).exists() != legacy  # legacy: OpenVINO's Paddle frontend reads inference.pdmodel
    (transposed,) = [layer for layer in report["layers"] if layer["op"] == "conv2d_transpose"]
    assert "left_float" not in transposed  # int8 from the Paddle frontend and through the export alike
    predictor = create_predictor(out, backend="openvino-runtime")
    assert predictor.onnx_file.suffix == (".pdmodel" if legacy else ".onnx")
    simulated = load_model(out).run({"x": x})[0]
    assert _relative_l2(run_predictor(predictor, {"x": x})[0], simulated) < 1e-2


def test_the_export_is_byte_identical_and_leaves_the_model_alone(for_onnxruntime, tmp_path):
    out, _, _ = for_onnxruntime
    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.iterdir()}
    first = export_onnx(out, tmp_path / "a.onnx").read_bytes()
    assert export_onnx(out, tmp_path / "b.onnx").read_bytes() == first == (out / ONNX_FILE).read_bytes()
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in out.iterdir()} == before


def test_float_export_runs_as_paddle(float_model):
    directory, x, _ = float_model
    expected = load_model(directory / "float").run({"x": x})[0]
    for runtime in RUNTIMES:
        got = run_predictor(create_predictor(directory / "float", backend=runtime), {"x": x})[0]
        assert _relative_l2(got, expected) < (1e-5 if runtime == "onnxruntime" else 5e-3)  # OpenVINO may run bf16


def test_bad_export_requests_are_refused_in_one_line(for_onnxruntime, tmp_path):
    out, _, _ = for_onnxruntime
    with pytest.raises(ConfigError, match="suffix"):
        export_onnx(out, tmp_path / "model.bin")
    with pytest.raises(ExportError, match="choose one of uint8, int8"):
        onnx_bytes(out, activation_type="fp8")
    # asymmetric relu grids have no int8 (TensorRT) form with zero point 0
    with pytest.raises(ExportError, match="activation_type='uint8'"):
        onnx_bytes(out, activation_type="int8")
    assert not (tmp_path / "model.bin").exists()


def test_dynamic_int8_matmuls_for_onnxruntime(float_model, tmp_path):
    directory, x, _ = float_model
    files = quant_post_dynamic(str(directory / "float"), str(tmp_path / "dyn"), deploy_backend="onnxruntime",
                               quantizable_op_type=["conv2d", "mul"])
    model = onnx.load(str(tmp_path / "dyn" / ONNX_FILE))
    kinds = collections.Counter(n.op_type for n in model.graph.node)
    # the fc quantizes its input at run time; convs (conv, down) stay weight-only
    assert kinds["DynamicQuantizeLinear"] == kinds["MatMulInteger"] == 1 and kinds["MatMul"] == 0
    assert kinds["DequantizeLinear"] == 2
    simulated = load_model(files).run({"x": x})[0]  # weight-only: the input of the fc stays float here
    deployed = run_predictor(create_predictor(tmp_path / "dyn" / ONNX_FILE, backend="onnxruntime"), {"x": x})[0]
    assert 0 < _relative_l2(deployed, simulated) < 2e-2  # the run-time 8-bit input of the fc


def test_weight_only_matmuls_run_with_int8_inputs_in_groups_on_the_openvino_runtime(tmp_path, monkeypatch):
    import openvino as ov

    from qcore.deploy.openvino_runtime import DYNAMIC_GROUP_ENV, TARGET, dynamic_group, matmul_widths
    from qdemo.testing import save_tiny_net

    assert (dynamic_group([768, 3072]), dynamic_group([384, 1536]), dynamic_group([96]), dynamic_group([100])) == (
        256, 128, 32, 32)
    paddle.seed(0)
    net = paddle.nn.Sequential(paddle.nn.Linear(512, 192), paddle.nn.GELU(), paddle.nn.Linear(192, 32))
    net.eval()
    save_tiny_net(net, tmp_path / "float", "pir", [paddle.static.InputSpec([None, 512], "float32", "x")])
    quant_post_dynamic(str(tmp_path / "float"), str(tmp_path / "dyn"), deploy_backend="openvino-runtime",
                       quantizable_op_type=["mul"], save_model_filename=None, save_params_filename=None)
    onnx_file = tmp_path / "dyn" / ONNX_FILE
    kinds = collections.Counter(n.op_type for n in onnx.load(str(onnx_file)).graph.node)
    assert kinds["DequantizeLinear"] == kinds["MatMul"] == 2 and kinds["DynamicQuantizeLinear"] == 0
    widths = matmul_widths(ov.Core().read_model(str(onnx_file)))
    assert sorted(widths) == [192, 512]
    vnni = host.has_vnni()
    for flags, group in (({"avx2", "avx512_vnni"}, "64"), ({"avx2", "avx_vnni"}, "64"), ({"avx2", "fma"}, "0")):
        monkeypatch.setattr(host, "cpu_flags", lambda cpuinfo=None, flags=frozenset(flags): flags)
        assert TARGET.compile_config(2, widths=widths)["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == group
    monkeypatch.undo()
    x = np.random.default_rng(0).standard_normal((16, 512)).astype("float32")
    simulated = load_model(tmp_path / "dyn").run({"x": x})[0]  # int8 weights, float inputs
    monkeypatch.setenv("QCORE_OPENVINO_PRECISION", "f32")
    errors = {}
    for group in ("0", None):  # None: the predictor's choice for this model's widths (64)
        if group is None:
            monkeypatch.delenv(DYNAMIC_GROUP_ENV, raising=False)
        else:
            monkeypatch.setenv(DYNAMIC_GROUP_ENV, group)
        predictor = create_predictor(onnx_file, backend="openvino-runtime")
        errors[group] = _relative_l2(run_predictor(predictor, {"x": x})[0], simulated)
    # off: the float inputs of the simulation; on (VNNI only): both inputs quantized to int8 at run time, in
    # groups of 64; an AVX2-only CPU keeps the float inputs whatever the group (OpenVINO needs VNNI for it)
    assert errors["0"] < 1e-4
    assert 1e-3 < errors[None] < 2e-2 if vnni else errors[None] < 1e-4
    monkeypatch.setenv(DYNAMIC_GROUP_ENV, "all")
    with pytest.raises(ConfigError, match="QCORE_OPENVINO_DQ_GROUP='all' is not valid"):
        TARGET.compile_config(2)


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino-runtime"])
@pytest.mark.parametrize("family", ["pir", "legacy"])
def test_lookup_tables_are_stored_per_row_in_int8_for_the_onnx_runtimes(tmp_path, runtime, family):
    from qdemo.testing import EMBEDDING_INPUT_SPEC, TinyEmbeddingNet, save_tiny_net

    paddle.seed(0)
    net = TinyEmbeddingNet(vocab=500, dim=32)
    net.eval()
    kwargs = save_tiny_net(net, tmp_path / "float", "pir" if family == "pir" else "legacy_pdmodel",
                           EMBEDDING_INPUT_SPEC)
    ids = np.random.default_rng(0).integers(0, 500, (32, 6)).astype("int64")
    report = quant_post_static(None, tmp_path / "float", tmp_path / "q", **kwargs, deploy_backend=runtime,
                               batch_generator=lambda: iter([{"ids": ids[i:i + 8]} for i in range(0, 32, 8)]),
                               quantizable_op_type=["lookup_table", "mul"], save_model_filename=None,
                               save_params_filename=None)
    lookup = next(layer for layer in report["layers"] if layer["op"] == "lookup_table")
    assert "left_float" not in lookup and len(lookup["weight"]["thresholds"]) == 500  # one scale per row
    table = net.emb.weight.numpy()
    row_max = np.abs(table).max(1)  # row 0 is the padding row, all zeros: threshold 1 (its codes are 0 anyway)
    np.testing.assert_allclose(lookup["weight"]["thresholds"], np.where(row_max > 0, row_max, 1.0), rtol=1e-5)
    # what both runtimes read: the export (legacy models with quantized lookups too), the table one
    # GatherBlockQuantized on the codes shifted to uint8 (qcore.export.lookups)
    model = onnx.load(str(tmp_path / "q" / ONNX_FILE))
    (gather,) = [n for n in model.graph.node if n.op_type == "GatherBlockQuantized"]
    data = next(numpy_helper.to_array(i) for i in model.graph.initializer if i.name == gather.input[0])
    codes = data.reshape(500, -1)[:, :32].astype(np.int16) - 128  # the table, stored as 8-bit codes
    np.testing.assert_array_equal(codes, np.round(table / (np.where(row_max > 0, row_max, 1.0)[:, None] / 127)))
    simulated = load_model(tmp_path / "q").run({"ids": ids})[0]
    deployed = run_predictor(create_predictor(tmp_path / "q", backend=runtime), {"ids": ids})[0]
    assert _relative_l2(deployed, simulated) < 0.01  # as every ONNX target: within 1 % of the simulation
    float_out = load_model(tmp_path / "float").run({"ids": ids})[0]
    assert _relative_l2(simulated, float_out) < 0.02


class ResidualTail(paddle.nn.Layer):
    """Two residual blocks whose last sum goes through a relu to a global average pool, a flatten and an fc (a
    ResNet's tail), and a conv whose output is read only through a relu by a pool (the demo CNN's)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = paddle.nn.Conv2D(3, 16, 3, padding=1)
        self.bn = paddle.nn.BatchNorm2D(16)
        self.pool = paddle.nn.MaxPool2D(2)
        self.blocks = paddle.nn.LayerList([paddle.nn.Conv2D(16, 16, 3, padding=1) for _ in range(4)])
        self.last = paddle.nn.Conv2D(16, 16, 3, padding=1)
        self.fc = paddle.nn.Linear(16, 10)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        y = self.pool(F.relu(self.bn(self.stem(x))))
        for i in (0, 2):
            y = F.relu(y + self.blocks[i + 1](F.relu(self.blocks[i](y))))
        y = F.adaptive_avg_pool2d(F.relu(self.last(y)), 1) + F.adaptive_avg_pool2d(y, 1)
        return self.fc(paddle.flatten(y, 1))


def _ort_optimized_kinds(onnx_file, tmp_path) -> collections.Counter:
    """The node types of the graph ONNX Runtime runs for ``onnx_file`` (every optimization on), counted."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(onnx_file), options, providers=["CPUExecutionProvider"])
    return collections.Counter(n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node)


@pytest.mark.parametrize("family", ["pir", "legacy"])
def test_onnx_runtime_fuses_every_conv_join_and_pool_of_a_residual_net(tmp_path, family):
    from qdemo.testing import save_tiny_net

    paddle.seed(0)
    net = ResidualTail()
    net.eval()
    kwargs = save_tiny_net(net, tmp_path / "float", "pir" if family == "pir" else "legacy_pdmodel",
                           [paddle.static.InputSpec([None, 3, 16, 16], "float32", "x")])
    x = np.random.default_rng(0).standard_normal((16, 3, 16, 16)).astype("float32")
    quant_post_static(None, tmp_path / "float", tmp_path / "q", **kwargs, sample_generator=lambda: iter(x),
                      batch_size=8, algo="abs_max", quantizable_op_type=["conv2d", "mul"], optimize_model=True,
                      deploy_backend="onnxruntime", save_model_filename=None, save_params_filename=None)
    kinds = _ort_optimized_kinds(tmp_path / "q" / ONNX_FILE, tmp_path)
    # every conv runs as QLinearConv, every join (the two residual adds, the pools' sum) as QLinearAdd, both
    # global pools as QLinearGlobalAveragePool, the max pool on uint8 codes; nothing float in between
    assert kinds["QLinearConv"] == 6 and kinds["QLinearAdd"] == 3 and kinds["QLinearGlobalAveragePool"] == 2
    assert not {"Conv", "FusedConv", "Relu", "GlobalAveragePool", "MaxPool"} & set(kinds)
    # float only: the input before its one QuantizeLinear, the fc's output and bias add; the flatten moves codes
    # (its Shape reads them, its input and output share a grid) and no dequantize is left
    assert kinds["Add"] == 1 and kinds["QuantizeLinear"] == 1 and kinds["DequantizeLinear"] == 0
    simulated = load_model(tmp_path / "q").run({"x": x})[0]
    deployed = run_predictor(create_predictor(tmp_path / "q" / ONNX_FILE, backend="onnxruntime"), {"x": x})[0]
    assert _relative_l2(deployed, simulated) < 1e-2


def test_a_model_whose_float_export_fails_is_refused_before_calibration(tmp_path, monkeypatch):
    import qptq.static
    from qdemo.testing import save_fft_net

    save_fft_net(tmp_path / "fft")  # paddle2onnx 2.1 writes rfft as a graph of another output shape
    monkeypatch.setattr(qptq.static, "calibrate_sharded", lambda *a, **k: pytest.fail("calibrated"))
    x = np.random.default_rng(0).standard_normal((4, 3, 28, 28)).astype("float32")
    with pytest.raises(ExportError, match=r"deploy_backend='onnxruntime' runs the model's ONNX export, and the "
                                          r"float model does not export \(checked before calibration\): .+ output "
                                          r"'.+' has shape \(2, 3, 28, 28\) where Paddle's is \(2, 4, 28, 15\)"):
        quant_post_static(None, tmp_path / "fft", tmp_path / "q", sample_generator=lambda: iter(x),
                          deploy_backend="onnxruntime")
    assert not (tmp_path / "q").exists()
