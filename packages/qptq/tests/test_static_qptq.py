from __future__ import annotations

import json

import numpy as np
import paddle
import pytest

from qcore.deploy.onnx_runtimes import ONNX_FILE
from qcore.deploy.onnxruntime import TRANSPOSED_CONV_FLOAT
from qcore.errors import ConfigError, DataError, GraphError, OutputError
from qcore.graph import open_graph
from qcore.inference import predict
from qcore.model_io import find_model_files, load_model, save_model
from qdemo import demo_model_dir
from qdemo.testing import save_tiny_net
from qptq import PostTrainingQuantization, quant_post, quant_post_dynamic, quant_post_static


def _samples(calib):
    return lambda: ((img,) for img in calib)


@pytest.mark.parametrize("algo", ["KL", "abs_max", "hist", "mse", "avg", "emd"])
def test_every_algo_keeps_demo_accuracy_simulated_and_deployed(demo_model, demo_data, tmp_path, algo):
    directory, float_top1 = demo_model
    calib, x, y = demo_data
    report = quant_post_static(
        None, directory, tmp_path / "int8", sample_generator=_samples(calib), batch_size=20, algo=algo,
        optimize_model=True,
    )
    assert report["samples"] == 100 and report["batches"] == 5
    files = find_model_files(tmp_path / "int8")
    simulated = load_model(tmp_path / "int8").run({"image": x})[0]
    deployed = predict(files, {"image": x})[0]
    sim_top1 = (simulated.argmax(1) == y).mean()
    dep_top1 = (deployed.argmax(1) == y).mean()
    assert sim_top1 >= float_top1 - 0.015, (algo, sim_top1, float_top1)
    assert abs(dep_top1 - sim_top1) <= 0.01, (algo, dep_top1, sim_top1)


def test_output_graph_contents_and_report(demo_model, demo_data, tmp_path):
    directory, _ = demo_model
    calib, _, _ = demo_data
    ptq = PostTrainingQuantization(
        sample_generator=_samples(calib), model_dir=directory, batch_size=25, batch_nums=2, algo="abs_max"
    )
    ptq.quantize()
    files = ptq.save_quantized_model(tmp_path / "int8")
    types = open_graph(load_model(tmp_path / "int8")).op_types()
    ops = [layer["op"] for layer in ptq.report["layers"]]
    # 4 conv2d + 1 depthwise_conv2d + 1 mul, then the residual add (relu + conv branch)
    assert ops == ["conv2d", "conv2d", "depthwise_conv2d", "conv2d", "conv2d", "mul", "elementwise_add"]
    activations = {name for layer in ptq.report["layers"] for name in layer["inputs"]}
    add_inputs = list(ptq.report["layers"][-1]["inputs"])
    if files.family == "legacy":
        # oneDNN computes the add in the pointwise conv: only its residual input (the relu output the
        # depthwise conv reads too, so no new QDQ pair) is quantized, never the conv's own output
        assert len(add_inputs) == 1 and add_inputs[0] in ptq.report["layers"][2]["inputs"]
        assert len(activations) == 6
        assert files.model_file.name == "model.pdmodel"  # the input is inference.pdmodel: Paddle 2.6's names
        assert types.count("quantize_linear") == 6 and types.count("dequantize_linear") == 6 + 6
    else:  # both inputs (TensorRT's int8 add); the relu input is shared with a conv: one QDQ pair
        assert len(add_inputs) == 2 and len(activations) == 7
        assert files.model_file.name == "inference.json"  # __model__ cannot name a PIR model
        assert types.count("pd_op.fake_quantize_dequantize_moving_average_abs_max") == 7
    without = PostTrainingQuantization(sample_generator=_samples(calib), model_dir=directory, batch_size=25,
                                       batch_nums=2, algo="abs_max", residual_add=False)
    without.quantize()
    assert len(without.report["layers"]) == 6
    first = ptq.report["layers"][0]["inputs"]["image"]
    assert set(first["all_algos"]) == {"abs_max", "kl", "hist", "mse", "avg", "emd"}
    images = calib[:50]
    assert first["threshold"] == pytest.approx(np.abs(images).max(), rel=2e-3)  # abs_max within a bin
    assert ptq.report["samples"] == 50


def test_seed_defaults_and_alias(demo_model, demo_data, tmp_path):
    directory, _ = demo_model
    calib, _, _ = demo_data
    assert quant_post is quant_post_static
    quant_post(None, directory, tmp_path / "q", sample_generator=_samples(calib[:20]), algo="direct")
    written = sorted(p.name for p in (tmp_path / "q").iterdir())
    family = load_model(directory).family  # the legacy demo is inference.pdmodel: PaddleSlim 2.6's names out
    assert written == (["model.pdiparams", "model.pdmodel"] if family == "legacy"
                       else ["inference.json", "inference.pdiparams"])


@pytest.mark.parametrize("saved_as, loaded_as", [
    (("model_fp32.pdmodel", "model_fp32.pdiparams"), ("model.pdmodel", "model.pdiparams")),  # PaddleSlim 2.6
    (("__model__", "__params__"), ("__model__", "__params__")),  # the seeds
])
def test_default_save_names_follow_the_input_naming_in_paddleslim_scripts(demo_data, tmp_path, saved_as, loaded_as):
    """A legacy static-mode script quantizes with every API's default save names and loads the names its
    PaddleSlim version writes: PaddleSlim 2.6's for a ``*.pdmodel`` input, the seeds' for ``__model__``."""
    calib, x, _ = demo_data
    float_dir = tmp_path / "fp32"
    save_model(load_model(demo_model_dir("legacy")), float_dir, *saved_as)
    reference = load_model(float_dir).run({"image": x[:64]})[0]
    with paddle.pir_utils.OldIrGuard():
        paddle.enable_static()
        exe = paddle.static.Executor(paddle.CPUPlace())
        kwargs = {"model_filename": saved_as[0], "params_filename": saved_as[1]}
        quant_post_static(exe, str(float_dir), str(tmp_path / "static"), sample_generator=_samples(calib[:40]),
                          batch_size=20, algo="abs_max", **kwargs)
        quant_post_dynamic(str(float_dir), str(tmp_path / "dynamic"), **kwargs)
        ptq = PostTrainingQuantization(exe, _samples(calib[:40]), str(float_dir), batch_size=20, algo="abs_max",
                                       **kwargs)
        ptq.quantize()
        ptq.save_quantized_model(str(tmp_path / "class"))
        outputs = {}
        for name in ("static", "dynamic", "class"):
            assert sorted(p.name for p in (tmp_path / name).iterdir()) == sorted(loaded_as), name
            program, feeds, fetches = paddle.static.load_inference_model(
                str(tmp_path / name), exe, model_filename=loaded_as[0], params_filename=loaded_as[1])
            outputs[name] = exe.run(program, feed={feeds[0]: x[:64]}, fetch_list=fetches)[0]
    paddle.disable_static()
    scale = np.abs(reference).max()
    for name, out in outputs.items():
        assert 0 < np.abs(out - reference).max() < 0.1 * scale, name  # quantized, close to the float model


def test_batch_generator_and_data_loader_give_the_same_thresholds(tiny_model, tiny_input, tmp_path):
    directory, kwargs = tiny_model
    batches = [tiny_input[:4], tiny_input[4:]]
    from_batches = PostTrainingQuantization(
        batch_generator=lambda: ((b,) for b in batches), model_dir=directory, **kwargs, algo="abs_max"
    )
    from_loader = PostTrainingQuantization(
        data_loader=[{"x": b} for b in batches], model_dir=directory, **kwargs, algo="abs_max"
    )
    from_samples = PostTrainingQuantization(
        sample_generator=lambda: iter(tiny_input), model_dir=directory, **kwargs, algo="abs_max", batch_size=3
    )
    for ptq in (from_batches, from_loader, from_samples):
        ptq.quantize()
    thresholds = [
        [i["threshold"] for layer in p.report["layers"] for i in layer["inputs"].values()]
        for p in (from_batches, from_loader, from_samples)
    ]
    assert thresholds[0] == thresholds[1] == thresholds[2]
    assert from_samples.report["batches"] == 3


def test_cache_file_holds_observer_state_until_saved(tiny_model, tiny_input, tmp_path):
    directory, kwargs = tiny_model
    ptq = PostTrainingQuantization(
        sample_generator=lambda: iter(tiny_input), model_dir=directory, **kwargs, is_use_cache_file=True,
        cache_dir=tmp_path / "cache",
    )
    ptq.quantize()
    state = json.loads((tmp_path / "cache" / "observers.json").read_text())
    assert "x" in state and sum(state["x"]["counts"]) == tiny_input.size
    ptq.save_quantized_model(tmp_path / "out")
    assert not (tmp_path / "cache" / "observers.json").exists()


def test_skip_pattern_and_op_types(tiny_model, tiny_input):
    directory, kwargs = tiny_model
    ptq = PostTrainingQuantization(
        sample_generator=lambda: iter(tiny_input), model_dir=directory, **kwargs,
        quantizable_op_type=["conv2d", "depthwise_conv2d", "mul"], skip_patterns=["linear_0"],
    )
    ptq.quantize()
    assert [layer["op"] for layer in ptq.report["layers"]] == ["conv2d", "depthwise_conv2d"]


def test_bad_inputs_fail_with_clear_errors(tiny_model, tiny_input, tmp_path):
    directory, kwargs = tiny_model

    def run(**options):
        defaults = {"sample_generator": lambda: iter(tiny_input)}
        defaults.update(options)
        PostTrainingQuantization(model_dir=directory, **kwargs, **defaults).quantize()

    with pytest.raises(DataError, match="calibration data is empty"):
        run(sample_generator=lambda: iter([]))
    with pytest.raises(DataError, match="missing"):
        run(sample_generator=None, data_loader=[{"image": tiny_input}])
    with pytest.raises(DataError, match=r"batch 0, feed 'x': shape \(4, 3, 5, 5\) does not fit .*\(-1, 1, 8, 8\)"):
        run(sample_generator=lambda: iter(np.zeros((4, 3, 5, 5), np.float32)))
    changing = [tiny_input[:2], tiny_input[:2, :, :6, :6]]  # the second batch's spatial size differs
    with pytest.raises(DataError, match=r"batch 1, feed 'x': shape \(2, 1, 6, 6\)"):
        run(sample_generator=None, batch_generator=lambda: iter(changing))
    with pytest.raises(DataError, match="calibration data is constant .*0 in all 1 batches"):
        run(sample_generator=lambda: iter(np.zeros((4, 1, 8, 8), np.float32)))
    with pytest.raises(ConfigError, match=r"is a single str; give a list of names, e.g. \['conv2d'\]"):
        run(quantizable_op_type="conv2d")
    with pytest.raises(ConfigError, match="batch_nums=0 is not valid"):
        run(batch_nums=0)
    with pytest.raises(ConfigError, match="batch_size=2.5 is not valid"):
        run(batch_size=2.5)
    with pytest.raises(ConfigError, match="hist_percent='0.9' is not valid"):
        run(hist_percent="0.9")
    nan_input = tiny_input.copy()
    nan_input[0, 0, 0, 0] = np.nan
    with pytest.raises(DataError, match="activation 'x'.*NaN"):
        run(sample_generator=lambda: iter(nan_input))
    with pytest.raises(ConfigError, match="did you mean 'kl'"):
        run(algo="kl2")
    with pytest.raises(ConfigError, match="activation_bits"):
        run(activation_bits=1)
    with pytest.raises(DataError, match="exactly one"):
        run(batch_generator=lambda: iter([tiny_input]))
    with pytest.raises(GraphError, match="unknown op type"):
        run(quantizable_op_type=["convv2d"])
    with pytest.raises(RuntimeError, match="call quantize"):
        PostTrainingQuantization(
            sample_generator=lambda: iter(tiny_input), model_dir=directory, **kwargs
        ).save_quantized_model(tmp_path / "o")


def test_bad_outputs_and_widths_are_refused_before_calibration(tiny_model, tiny_input, tmp_path):
    directory, kwargs = tiny_model
    read = []

    def samples():
        read.append(1)
        return iter(tiny_input)

    a_file = tmp_path / "a_file"
    a_file.write_text("keep")
    with pytest.raises(OutputError, match="is an existing file"):
        quant_post_static(None, directory, a_file, sample_generator=samples, **kwargs)
    with pytest.raises(OutputError, match="plain file name"):
        quant_post_static(None, directory, tmp_path / "o", sample_generator=samples, **kwargs,
                          save_model_filename="m.json" if "pir" in str(directory) else "m.pdmodel",
                          save_params_filename="../evil.pdiparams")
    legacy = "pir" not in str(directory)
    if legacy:
        with pytest.raises(ConfigError, match="onednn runs legacy models with 8-bit weights and 8-bit activations"):
            quant_post_static(None, directory, tmp_path / "o", sample_generator=samples, weight_bits=4, **kwargs)
    assert not read and a_file.read_text() == "keep" and not (tmp_path / "evil.pdiparams").exists()
    report = quant_post_static(None, directory, tmp_path / "o4", sample_generator=samples, weight_bits=4,
                               deploy_backend="native", **kwargs)  # the explicit simulation-only opt-in
    assert report["deploy_backend"] == "native" and read


def test_a_native_4bit_model_runs_as_simulated_on_a_plain_config_and_is_flagged_on_onednn_int8(demo_data, tmp_path):
    """docs/safety.md: simulation-only models run as simulated on Paddle's float kernels; oneDNN's int8 passes
    read their QDQ pairs as 8-bit and compute garbage, which qcore's predictor says before running."""
    from paddle import inference

    calib, x, y = demo_data
    quant_post_static(None, demo_model_dir("legacy"), tmp_path / "w4", sample_generator=_samples(calib),
                      batch_size=20, weight_bits=4, deploy_backend="native")
    files = find_model_files(tmp_path / "w4")
    simulated = load_model(files.directory).run({"image": x})[0]

    def plain(int8: bool) -> np.ndarray:
        config = inference.Config(str(files.model_file), str(files.params_file))
        if int8:
            config.enable_mkldnn()
            config.enable_mkldnn_int8()
        predictor = inference.create_predictor(config)
        predictor.get_input_handle("image").copy_from_cpu(x)
        predictor.run()
        return predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()

    plain_float = plain(False)  # float kernels; a rounding tie may land one code away on a few rows
    assert np.linalg.norm(plain_float - simulated) / np.linalg.norm(simulated) < 5e-3
    assert (plain_float.argmax(1) == simulated.argmax(1)).mean() >= 0.99
    assert (plain(True).argmax(1) == y).mean() < (simulated.argmax(1) == y).mean() - 0.3  # far off: not for int8
    with pytest.warns(UserWarning, match="it was quantized for 'native'"):
        predict(files, {"image": x[:4]}, backend="onednn")


class _Upsampler(paddle.nn.Layer):
    """conv -> relu -> transposed conv -> relu -> conv."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = paddle.nn.Conv2D(3, 8, 3, padding=1)
        self.up = paddle.nn.Conv2DTranspose(8, 4, 2, stride=2)
        self.head = paddle.nn.Conv2D(4, 4, 3, padding=1)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        relu = paddle.nn.functional.relu
        return self.head(relu(self.up(relu(self.conv(x)))))


@pytest.mark.parametrize("backend", [None, "onnxruntime"])
def test_a_pir_transposed_conv_is_calibrated(tmp_path, backend):
    """Paddle 3.3.1's executor refuses a PIR conv2d_transpose on oneDNN's kernel; calibration runs it on Paddle's."""
    paddle.seed(0)
    net = _Upsampler()
    net.eval()
    save_tiny_net(net, tmp_path / "float", "pir", [paddle.static.InputSpec([None, 3, 8, 8], "float32", "x")])
    x = np.random.default_rng(0).standard_normal((16, 3, 8, 8)).astype("float32")
    report = quant_post_static(None, tmp_path / "float", tmp_path / "q", sample_generator=lambda: iter(x),
                               batch_size=8, algo="abs_max", quantizable_op_type=["conv2d", "conv2d_transpose"],
                               deploy_backend=backend, save_model_filename=None, save_params_filename=None)
    up = next(layer for layer in report["layers"] if layer["op"] == "conv2d_transpose")
    expected = net(paddle.to_tensor(x)).numpy()
    if backend is None:
        (read,) = up["inputs"].values()  # abs_max: the largest input the transposed conv read
        up_input = paddle.nn.functional.relu(net.conv(paddle.to_tensor(x))).numpy()
        assert read["threshold"] == pytest.approx(float(np.abs(up_input).max()), rel=1e-5)
        got = load_model(tmp_path / "q").run({"x": x})[0]
    else:
        assert up["left_float"] == f"onnxruntime: {TRANSPOSED_CONV_FLOAT}"  # no int8 ConvTranspose kernel there
        import onnxruntime as ort

        session = ort.InferenceSession(str(tmp_path / "q" / ONNX_FILE), providers=["CPUExecutionProvider"])
        got = session.run(None, {"x": x})[0]
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 0.05  # 0.019 and 0.012 measured
