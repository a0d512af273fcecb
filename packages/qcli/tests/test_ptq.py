from __future__ import annotations

import json
import os

import numpy as np
import pytest
from PIL import Image

from qcli.calib_data import load_image
from qcli.main import main
from qcore.model_io import find_model_files
from qdemo import PIXEL_MEAN, PIXEL_STD, demo_model_dir, load_demo_data, load_demo_raw


@pytest.fixture(scope="module")
def demo_arrays(tmp_path_factory):
    folder = tmp_path_factory.mktemp("data")
    calib, _ = load_demo_data("calib")
    x, y = load_demo_data("test")
    np.save(folder / "calib.npy", calib[:60])
    np.save(folder / "x.npy", x[:400])
    np.save(folder / "y.npy", y[:400])
    return folder


def test_static_from_npy_writes_report_with_layers_sizes_and_accuracy(demo_arrays, tmp_path, capsys):
    out = tmp_path / "int8"
    code = main(["ptq", "static", str(demo_model_dir("legacy")), str(out), "--data", str(demo_arrays / "calib.npy"),
                 "--algo", "hist", "--eval-data", str(demo_arrays / "x.npy"),
                 "--eval-labels", str(demo_arrays / "y.npy")])
    assert code == 0
    report = json.loads((tmp_path / "int8.report.json").read_text())
    assert report["method"] == "static" and report["algo"] == "hist" and report["samples"] == 60
    ops = ["conv2d", "conv2d", "depthwise_conv2d", "conv2d", "conv2d", "mul", "elementwise_add"]  # + residual add
    assert [layer["op"] for layer in report["layers"]] == ops
    assert all(set(info["all_algos"]) >= {"kl", "abs_max", "mse"}
               for layer in report["layers"] for info in layer["inputs"].values())
    assert report["sizes"]["ratio"] < 0.3
    acc = report["accuracy"]
    assert acc["top1_int8_deployed"] >= acc["top1_float"] - 1.5
    assert acc["agreement_deployed"] > 95
    assert "report:" in capsys.readouterr().out


def test_dynamic_int16_report(tmp_path):
    out = tmp_path / "w16"
    assert main(["ptq", "dynamic", str(demo_model_dir("pir")), str(out), "--weight-bits", "16",
                 "--op-types", "conv2d", "depthwise_conv2d", "mul", "--report", str(tmp_path / "r.json")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["weight_bits"] == 16 and 0.45 < report["sizes"]["ratio"] < 0.55
    assert find_model_files(out).family == "pir"


def test_static_from_image_folder_and_python_function(tmp_path):
    images, _ = load_demo_raw("calib")
    folder = tmp_path / "images"
    folder.mkdir()
    for i, pixels in enumerate(images[:20]):
        Image.fromarray(pixels).save(folder / f"{i:03d}.png")
    sample = load_image(folder / "000.png", (1, 28, 28), (PIXEL_MEAN,), (PIXEL_STD,))
    np.testing.assert_allclose(sample, load_demo_data("calib")[0][0], atol=1e-5)  # same preprocessing

    args = ["--mean", str(PIXEL_MEAN), "--std", str(PIXEL_STD), "--batch-size", "5"]
    model = str(demo_model_dir("legacy"))
    assert main(["ptq", "static", model, str(tmp_path / "a"), "--data", str(folder), *args]) == 0
    script = tmp_path / "calib_fn.py"
    script.write_text("from qdemo import load_demo_data\n\n"
                      "def samples():\n    return iter(load_demo_data('calib')[0][:20])\n")
    assert main(["ptq", "static", str(demo_model_dir("legacy")), str(tmp_path / "b"), "--data",
                 f"{script}:samples", "--batch-size", "5"]) == 0
    thresholds = [json.loads((tmp_path / f"{n}.report.json").read_text())["layers"][1]["inputs"] for n in "ab"]
    a, b = (next(iter(t.values()))["threshold"] for t in thresholds)
    assert a == pytest.approx(b, rel=0.02)  # PNG round trip of uint8 pixels is lossless


def test_bad_calibration_sources(tmp_path, capsys):
    model, out = str(demo_model_dir("legacy")), str(tmp_path / "o")
    (tmp_path / "empty").mkdir()
    cases = [("nowhere.txt", "not a .npy file, a directory or module:function"),
             (str(tmp_path / "empty"), "holds no images"), ("qdemo:nope", "has no function 'nope'")]
    for data, message in cases:
        assert main(["ptq", "static", model, out, "--data", data]) == 5  # DataError
        err = capsys.readouterr().err
        assert err.startswith("qcli ptq: error: ") and message in err and err.count("\n") == 1, err


def test_static_for_openvino_is_verified_there(demo_arrays, tmp_path, capsys):
    out = tmp_path / "ov"
    assert main(["ptq", "static", str(demo_model_dir("legacy")), str(out), "--data", str(demo_arrays / "calib.npy"),
                 "--algo", "abs_max", "--backend", "openvino", "--eval-data", str(demo_arrays / "x.npy")]) == 0
    report = json.loads((tmp_path / "ov.report.json").read_text())
    assert report["deploy_backend"] == "openvino"
    assert not any("left_float" in layer for layer in report["layers"])
    row = report["verified"]["openvino"]
    assert list(report["verified"]) == ["openvino"]
    # the largest difference over 64 samples, relative to the output range: rounding ties, which move with the
    # scales (measured 2e-3 to 1.1e-2 when one threshold moves by 1e-4 relative)
    assert row["deployed_vs_simulated"] < 1.5e-2 and 0 < row["int8_vs_float"] < 0.2 and row["int8_ms"] > 0
    assert "| openvino |" in capsys.readouterr().out


def test_asymmetric_static_for_openvino_is_verified_there(demo_arrays, tmp_path, capsys):
    out = tmp_path / "ov_asym"
    assert main(["ptq", "static", str(demo_model_dir("legacy")), str(out), "--data", str(demo_arrays / "calib.npy"),
                 "--algo", "abs_max", "--backend", "openvino", "--asymmetric",
                 "--eval-data", str(demo_arrays / "x.npy")]) == 0
    report = json.loads((tmp_path / "ov_asym.report.json").read_text())
    offsets = [info["offset"] for layer in report["layers"] for info in layer.get("inputs", {}).values()
               if "offset" in info]
    assert offsets  # the demo's relu outputs
    row = report["verified"]["openvino"]
    assert row["deployed_vs_simulated"] < 5e-3 and 0 < row["int8_vs_float"] < 0.2
    assert main(["ptq", "static", str(demo_model_dir("legacy")), str(tmp_path / "no"), "--data",
                 str(demo_arrays / "calib.npy"), "--backend", "onednn", "--asymmetric"]) != 0
    assert "symmetric activation grids only" in capsys.readouterr().err


def test_default_output_is_verified_on_every_cpu_backend(demo_arrays, tmp_path):
    assert main(["ptq", "static", str(demo_model_dir("pir")), str(tmp_path / "int8"), "--data",
                 str(demo_arrays / "calib.npy"), "--algo", "abs_max"]) == 0
    verified = json.loads((tmp_path / "int8.report.json").read_text())["verified"]
    assert "does not convert PIR" in verified["openvino"]["unavailable"]
    for backend in ("onednn", "native"):
        assert verified[backend]["deployed_vs_simulated"] < 0.02, backend


def test_unknown_backend_is_one_line_with_the_choices(capsys):
    with pytest.raises(SystemExit):
        main(["ptq", "static", "m", "o", "--data", "d.npy", "--backend", "openvno"])
    assert "invalid choice: 'openvno'" in capsys.readouterr().err


def test_static_with_an_accuracy_budget(demo_arrays, tmp_path, capsys):
    args = ["ptq", "static", str(demo_model_dir("pir")), str(tmp_path / "int8"), "--data",
            str(demo_arrays / "calib.npy"), "--algo", "abs_max", "--weight-bits", "4", "--batch-size", "25"]
    assert main([*args, "--max-metric-drop", "1"]) == 3  # needs labelled data to score top-1
    assert "or --eval-data and --eval-labels" in capsys.readouterr().err
    assert main([*args, "--max-output-error", "0.05"]) == 0
    budget = json.loads((tmp_path / "int8.report.json").read_text())["budget"]
    assert budget["metric"] == "output_error" and budget["limit"] == 0.05
    fewer = [c["score"] for c in budget["candidates"] if c["float_layers"] < budget["float_layers"]]
    assert budget["met"] and all(score > 0.05 for score in fewer)


def test_budget_with_a_users_eval_function_writes_an_html_report(demo_arrays, tmp_path, capsys):
    metric = tmp_path / "metric.py"
    metric.write_text(
        "import numpy as np\n"
        "from qcore.inference import predict\n"
        f"X, Y = np.load({str(demo_arrays / 'x.npy')!r}), np.load({str(demo_arrays / 'y.npy')!r})\n"
        "def top1(files):\n"
        "    return float((predict(files, {'image': X}, backend='native')[0].argmax(1) == Y).mean())\n"
    )
    out, page = tmp_path / "int4", tmp_path / "report.html"
    assert main(["ptq", "static", str(demo_model_dir("legacy")), str(out), "--data", str(demo_arrays / "calib.npy"),
                 "--algo", "AUTO", "--weight-bits", "4", "--backend", "native", "--batch-size", "20",
                 "--max-drop", "0.01", "--eval", f"{metric}:top1", "--report-html", str(page)]) == 0
    report = json.loads((tmp_path / "int4.report.json").read_text())
    budget = report["budget"]
    assert report["algo"] == "auto" and budget["metric"] == "eval_function"
    assert budget["met"] == (budget["float_score"] - budget["candidates"][-1]["score"] <= 0.01)
    assert all(0.05 < c["measured"] < 20 for c in budget["candidates"]) and budget["float_measured"] > 0
    text = page.read_text()
    assert text.count("<img") == 2 and "Accuracy budget" in text and "algo=auto" in text
    assert "<h2>Verification</h2><p>On 60 calibration samples" in text and "<td>native</td>" in text
    assert f"HTML report: {page}" in capsys.readouterr().out


def test_html_report_verification_table_and_a_single_budget_candidate():
    from qcli.report_html import render

    row = {"float_ms": 1.5, "int8_ms": 0.5, "speedup": 3.0, "deployed_vs_simulated": 0.001, "int8_vs_float": 0.02,
           "agreement_with_float": 98.44}
    budget = {"metric": "output_error", "limit": 0.05, "float_score": 0.0, "met": True, "float_layers": 0,
              "evaluations": 1, "seconds": 0.2, "candidates": [{"float_layers": 0, "score": 0.0123}],
              "sensitivity": [{"op": "conv2d", "scope": "conv", "weight": "w", "output_error": 0.0123}]}
    report = {"model": "m/inference.pdmodel", "algo": "kl", "batches": 2, "seconds": 1.0, "layers": [],
              "verified_on": "64 calibration samples (--eval-data: held-out ones)", "budget": budget,
              "verified": {"onednn": row, "tensorrt": {"unavailable": "no CUDA device"}}}
    text = render(report)
    assert "<h2>Verification</h2><p>On 64 calibration samples (--eval-data: held-out ones).</p>" in text
    assert "<tr><td>onednn</td><td>1.50</td><td>0.50</td><td>3.00x</td><td>1.00e-03</td><td>2.00e-02</td>" \
           "<td>98.4</td></tr>" in text
    assert "<tr><td>tensorrt</td><td colspan='6'>no CUDA device</td></tr>" in text
    assert text.count("<img") == 1  # the sensitivity plot; one candidate is a sentence, not a plot
    assert "<p>One candidate was tried: 0 layers kept float, output_error 0.0123.</p>" in text
    unchecked = {k: v for k, v in report.items() if k != "verified"}
    failed = render({**unchecked, "verification_failed": "predictor crashed"})
    assert "<h2>Verification</h2><p>Verifying the written model failed: predictor crashed</p>" in failed
    unverified = render({**unchecked, "verified_on": "the model has 2 inputs"})
    assert "<h2>Verification</h2><p>Not verified: the model has 2 inputs</p>" in unverified


@pytest.mark.parametrize(("extra", "message"), [
    (["--algo", "kll"], "invalid choice: 'kll'"),
    (["--eval", "nowhere_module:fn", "--max-drop", "0.01"], "cannot import 'nowhere_module' for --eval"),
    (["--eval", "json:dumps"], "--eval is the metric of an accuracy budget: give --max-drop"),
    (["--max-drop", "0.01", "--eval-data", "{data}/calib.npy", "--eval-labels", "{data}/y.npy"],
     "--eval-labels has 400 labels for 60 --eval-data samples; they must match"),  # before calibration
])
def test_bad_budget_and_algo_options_are_one_line(demo_arrays, tmp_path, capsys, extra, message):
    try:
        code = main(["ptq", "static", str(demo_model_dir("legacy")), str(tmp_path / "o"), "--data",
                     str(demo_arrays / "calib.npy"), *(e.format(data=demo_arrays) for e in extra)])
    except SystemExit as exit:  # argparse's own refusal
        code = exit.code
    assert code != 0
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_verification_runs_on_the_users_calibration_samples(demo_arrays, tmp_path, capsys):
    assert main(["ptq", "static", str(demo_model_dir("legacy")), str(tmp_path / "int8"), "--data",
                 str(demo_arrays / "calib.npy"), "--algo", "abs_max", "--backend", "openvino"]) == 0
    report = json.loads((tmp_path / "int8.report.json").read_text())
    assert report["verified_on"] == "60 calibration samples (--eval-data: held-out ones)"
    # real images, not noise: the int8 model agrees with float on nearly all of them (random inputs gave 75 %)
    assert report["verified"]["openvino"]["agreement_with_float"] >= 95
    assert "verified on 60 calibration samples" in capsys.readouterr().out


@pytest.fixture
def token_model(tmp_path):
    """A PIR model with an integer input: ids (int64, [-1, 4]) -> embedding(1000, 8) -> mean -> fc(5)."""
    import paddle

    class Tokens(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.emb, self.fc = paddle.nn.Embedding(1000, 8), paddle.nn.Linear(8, 5)

        def forward(self, ids):
            return self.fc(self.emb(ids).mean(1))

    paddle.seed(0)
    net = Tokens()
    net.eval()
    paddle.jit.save(net, str(tmp_path / "tokens" / "inference"),
                    input_spec=[paddle.static.InputSpec([None, 4], "int64", "ids")])
    np.save(tmp_path / "ids.npy", np.random.default_rng(0).integers(0, 1000, (64, 4)))
    return tmp_path / "tokens", tmp_path / "ids.npy"


def test_a_model_with_integer_inputs_is_verified_on_its_token_ids(token_model, tmp_path):
    model, ids = token_model
    assert main(["ptq", "static", str(model), str(tmp_path / "int8"), "--data", str(ids), "--backend",
                 "native"]) == 0
    report = json.loads((tmp_path / "int8.report.json").read_text())
    assert report["verified_on"].startswith("64 calibration samples")
    assert report["verified"]["native"]["deployed_vs_simulated"] < 1e-5
    # weight-only: no calibration data and integer inputs: not verified, and it says why
    assert main(["ptq", "dynamic", str(model), str(tmp_path / "w8"), "--backend", "native"]) == 0
    report = json.loads((tmp_path / "w8.report.json").read_text())
    assert "verified" not in report and "pass --eval-data" in report["verified_on"]


@pytest.mark.parametrize("option,code,message", [
    (["--eval-data", "missing.npy"], 5, "--eval-data missing.npy: no such file"),
    (["--report-html", "."], 6, "--report-html . is a directory; give the path of a file to write"),
])
def test_bad_paths_are_refused_before_any_work(demo_arrays, tmp_path, capsys, monkeypatch, option, code, message):
    monkeypatch.chdir(tmp_path)
    assert main(["ptq", "static", str(demo_model_dir("legacy")), "out", "--data", str(demo_arrays / "calib.npy"),
                 *option]) == code
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_failed_verification_keeps_the_model_and_says_so(demo_arrays, tmp_path, capsys, monkeypatch):
    import qcli.commands.ptq as ptq_command

    def broken(*args, **kwargs):
        raise RuntimeError("predictor crashed\nmore lines")

    monkeypatch.setattr(ptq_command, "verify", broken)
    assert main(["ptq", "static", str(demo_model_dir("legacy")), str(tmp_path / "int8"), "--data",
                 str(demo_arrays / "calib.npy"), "--algo", "abs_max"]) == ptq_command.VERIFICATION_FAILED == 8
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("qcli")]  # past tqdm's lines
    assert err == [f"qcli ptq: the quantized model is written to {tmp_path / 'int8'}, but verifying it failed: "
                   "predictor crashed"]
    assert find_model_files(tmp_path / "int8").model_file.is_file()
    assert json.loads((tmp_path / "int8.report.json").read_text())["verification_failed"] == "predictor crashed"


def test_an_unwritable_openvino_cache_is_refused_before_any_work(demo_arrays, tmp_path, capsys, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the cache's parent directory should be
    monkeypatch.setenv("QCORE_OPENVINO_CACHE", str(blocker / "cache"))
    assert main(["ptq", "static", str(demo_model_dir("legacy")), str(tmp_path / "int8"), "--data",
                 str(demo_arrays / "calib.npy"), "--backend", "openvino"]) == 6
    err = capsys.readouterr().err
    assert f"OpenVINO's compiled-model cache {blocker / 'cache'} cannot be created" in err
    assert "$QCORE_OPENVINO_CACHE" in err and not (tmp_path / "int8").exists()


def _unwritable_home(tmp_path):
    """A home directory nothing can be created in: read-only, or (as root, who writes anywhere) under a file."""
    if os.geteuid() == 0:
        (tmp_path / "home_file").write_text("")
        return tmp_path / "home_file" / "home"
    home = tmp_path / "home"
    home.mkdir(mode=0o555)
    return home


@pytest.mark.parametrize("xdg", [False, True])
def test_an_unwritable_home_refuses_only_runs_for_openvino(demo_arrays, tmp_path, capsys, monkeypatch, xdg):
    """OpenVINO's compiled-model cache defaults to ~/.cache: a run not made for OpenVINO is still done, and
    verifying it there says why it cannot, in its row."""
    home = _unwritable_home(tmp_path)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("QCORE_OPENVINO_CACHE", raising=False)
    if xdg:
        monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    else:
        monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    base = ["ptq", "static", str(demo_model_dir("legacy")), str(tmp_path / "int8"), "--data",
            str(demo_arrays / "calib.npy"), "--algo", "abs_max"]
    assert main(base) == 0, capsys.readouterr().err
    verified = json.loads((tmp_path / "int8.report.json").read_text())["verified"]
    assert verified["onednn"]["agreement_with_float"] >= 90
    assert verified["openvino"]["unavailable"].startswith(
        f"OpenVINO's compiled-model cache {home / '.cache' / 'qcore' / 'openvino'} cannot be created")
    assert "--backend" not in capsys.readouterr().err
    assert main([*base[:3], str(tmp_path / "ov"), *base[4:], "--backend", "openvino"]) == 6
    assert "$QCORE_OPENVINO_CACHE" in capsys.readouterr().err and not (tmp_path / "ov").exists()


def test_a_backend_whose_runtime_is_missing_is_refused_before_calibration(demo_arrays, tmp_path, monkeypatch, capsys):
    import sys

    import qptq.static

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` fails, as when not installed
    monkeypatch.setattr(qptq.static, "calibrate_sharded", lambda *a, **k: pytest.fail("calibrated"))
    out = tmp_path / "ort"
    assert main(["ptq", "static", str(demo_model_dir("pir")), str(out), "--data", str(demo_arrays / "calib.npy"),
                 "--backend", "onnxruntime"]) == 3
    err = capsys.readouterr().err.strip()
    assert "deploy_backend='onnxruntime'" in err and "needs onnxruntime" in err and "\n" not in err
    assert not out.exists() and not (tmp_path / "ort.report.json").exists()


def test_dynamic_int4_groups_with_gptq_for_onnx_runtime(tmp_path, capsys):
    import paddle

    from qdemo.testing import save_tiny_net

    paddle.seed(0)
    net = paddle.nn.Sequential(paddle.nn.Linear(64, 128), paddle.nn.ReLU(), paddle.nn.Linear(128, 32))
    net.eval()
    save_tiny_net(net, tmp_path / "float", "pir", [paddle.static.InputSpec([None, 64], "float32", "x")])
    np.save(tmp_path / "calib.npy", np.random.default_rng(0).standard_normal((512, 64)).astype("float32"))
    out = tmp_path / "int4"
    code = main(["ptq", "dynamic", str(tmp_path / "float"), str(out), "--bits", "4", "--group-size", "32",
                 "--algo", "gptq", "--backend", "onnxruntime", "--data", str(tmp_path / "calib.npy")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "quantizing weights: 2 matmuls in" in captured.err and "calibrating: 64 batches in" in captured.err
    report = json.loads((tmp_path / "int4.report.json").read_text())
    assert report["weight_only"]["bits"] == 4 and report["weight_only"]["algo"] == "gptq"
    assert [(layer["bits"], layer["group_size"]) for layer in report["layers"]] == [(4, 32), (4, 32)]
    assert all(0 < layer["output_error"] < 0.2 for layer in report["layers"])
    # codes packed two a byte, one fp32 step and one 4-bit zero point per 32 weights
    groups = 2 * 128 + 4 * 32
    assert report["compressed_weight_bytes"] == (64 * 128 + 128 * 32) // 2 + groups * 4 + groups // 2
    row = report["verified"]["onnxruntime"]
    assert row["deployed_vs_simulated"] < 0.02 and (out / "inference.onnx").is_file()
    # the printout names the compressed file and its size against float, and labels the columns int4, not int8
    onnx_bytes = (out / "inference.onnx").stat().st_size
    assert report["compressed_file_bytes"] == onnx_bytes and report["grids"] == ["uint4"]
    assert f"compressed model: {out / 'inference.onnx'} ({onnx_bytes:,} bytes, " in captured.out
    assert onnx_bytes < 0.5 * report["sizes"]["float_params_bytes"]
    assert "| backend | float ms | int4 ms |" in captured.out and "int8 ms" not in captured.out
    # without --backend: no compressed file, and the printout says so and how to get one
    assert main(["ptq", "dynamic", str(tmp_path / "float"), str(tmp_path / "sim"), "--bits", "4", "--group-size",
                 "32"]) == 0
    printed = capsys.readouterr().out
    assert "no compressed file: the Paddle model holds the uint4 weights dequantized" in printed
    assert "--backend onnxruntime" in printed and not (tmp_path / "sim" / "inference.onnx").exists()


def test_dynamic_int4_with_the_tied_embedding_table_int8(tmp_path, capsys):
    import paddle

    from qdemo.testing import save_tiny_net

    class Tied(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.embed = paddle.nn.Embedding(512, 64)
            self.proj = paddle.nn.Linear(64, 64)

        def forward(self, ids):  # noqa: ANN001, ANN201
            h = self.embed(ids)
            return paddle.matmul(h + self.proj(h), self.embed.weight, transpose_y=True)

    paddle.seed(0)
    net = Tied()
    net.eval()
    save_tiny_net(net, tmp_path / "float", "pir", [paddle.static.InputSpec([None, None], "int64", "ids")])
    np.save(tmp_path / "ids.npy", np.random.default_rng(0).integers(0, 512, (16, 24)))
    out = tmp_path / "int4"
    code = main(["ptq", "dynamic", str(tmp_path / "float"), str(out), "--bits", "4", "--group-size", "32",
                 "--embedding-bits", "8", "--backend", "onnxruntime", "--data", str(tmp_path / "ids.npy")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = json.loads((tmp_path / "int4.report.json").read_text())
    assert report["weight_only"]["embedding_bits"] == 8
    assert sorted((layer["bits"], tuple(layer["shape"])) for layer in report["layers"]) == [(4, (64, 64)),
                                                                                           (8, (64, 512))]
    # int4 64x64 and int8 64x512 (the table's transpose): codes, an fp32 step and a zero point per 32 weights
    assert report["compressed_weight_bytes"] == 64 * 64 // 2 + 128 * 4 + 64 + 64 * 512 + 1024 * 4 + 1024
    ops = {n.op_type for n in __import__("onnx").load(str(out / "inference.onnx")).graph.node}
    assert {"GatherBlockQuantized", "MatMulNBits"} <= ops and "Gather" not in ops
    assert report["verified"]["onnxruntime"]["deployed_vs_simulated"] < 0.02


def test_dynamic_calibration_data_without_groups_is_one_line(tmp_path, capsys):
    assert main(["ptq", "dynamic", str(demo_model_dir("pir")), str(tmp_path / "o"), "--data", "x.npy"]) == 3
    assert "--data calibrates group-wise weights only" in capsys.readouterr().err


def test_an_onnx_model_is_named_before_any_work(tmp_path, capsys):
    """`qcli ptq dynamic m/inference.onnx out/` answered "Paddle could not load ... (list index out of range)":
    an ONNX file (by suffix, or by its first bytes under another name), a folder holding only one, or the prefix
    of one is one line naming it and what takes ONNX input, exit status 4, nothing written."""
    onnx = pytest.importorskip("onnx")
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "g",
                                   [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])])
    data = onnx.helper.make_model(graph).SerializeToString()
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "inference.onnx").write_bytes(data)
    (tmp_path / "renamed.bin").write_bytes(data)
    np.save(tmp_path / "calib.npy", np.zeros((4, 1, 4), np.float32))
    cases = {"m/inference.onnx": "m/inference.onnx is an ONNX model", "m": "no Paddle model in",
             "m/inference": "m/inference.onnx is an ONNX model", "renamed.bin": "renamed.bin is an ONNX model"}
    for model, named in cases.items():
        for method in ("dynamic", "static"):
            argv = ["ptq", method, str(tmp_path / model), str(tmp_path / "out")]
            assert main(argv + (["--data", str(tmp_path / "calib.npy")] if method == "static" else [])) == 4
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and named in err and "onnxruntime.quantization" in err, err
            assert "this toolkit quantizes Paddle inference models" in err and "Paddle could not load" not in err
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calib.npy", "m", "renamed.bin"]
