from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from qcli.main import main
from qcore.model_io import find_model_files
from qdemo import INPUT_NAME, demo_model_dir, load_demo_data


def test_bench_prints_and_writes_a_row_per_backend_and_batch(tmp_path, capsys):
    out = tmp_path / "int8"
    assert main(["ptq", "dynamic", str(demo_model_dir("legacy")), str(out)]) == 0
    capsys.readouterr()
    assert main(["bench", str(demo_model_dir("legacy")), str(out), "--backends", "onednn,openvino,tensorrt",
                 "--batch", "1,4", "--repeats", "3", "--json", str(tmp_path / "b.json")]) == 0
    results = json.loads((tmp_path / "b.json").read_text())
    assert list(results) == ["compared", "batch 1", "batch 4"]
    assert results["compared"]["model 2"] == f"{find_model_files(out).model_file} (int8 QDQ, legacy Paddle model)"
    for rows in (results["batch 1"], results["batch 4"]):
        assert "no CUDA" in rows["tensorrt"]["unavailable"]
        for backend in ("onednn", "openvino"):
            row = rows[backend]
            assert row["float_ms"] > 0 and row["int8_ms"] > 0 and row["agreement_with_float"] >= 75
            assert row["int8_vs_float"] < 0.1  # weight-only int8
    assert capsys.readouterr().out.count("| openvino |") == 2


def test_bench_refuses_an_unknown_backend(capsys):
    assert main(["bench", str(demo_model_dir("legacy")), "--backends", "onnx"]) == 3
    assert "qcli bench: error: unknown backend 'onnx'; valid: onednn" in capsys.readouterr().err


def test_bench_refuses_two_models_with_different_inputs(tmp_path, capsys):
    from qdemo.testing import make_tiny_net, save_tiny_net

    save_tiny_net(make_tiny_net(), tmp_path / "tiny", "pir")  # input 'x' (1, 8, 8); the demo's: 'image'
    assert main(["bench", str(demo_model_dir("legacy")), str(tmp_path / "tiny"), "--repeats", "1"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("qcli bench: error: the two models take different inputs") and err.count("\n") == 1, err
    assert "'image'" in err and "'x'" in err and "compare a model with its own quantized version" in err


@pytest.fixture(scope="module")
def demo_ort(tmp_path_factory):
    """The PIR demo model quantized for ONNX Runtime (with its inference.onnx), and real inputs."""
    folder = tmp_path_factory.mktemp("ort")
    np.save(folder / "calib.npy", load_demo_data("calib")[0][:100])
    np.save(folder / "x.npy", load_demo_data("test")[0][:64])
    assert main(["ptq", "static", str(demo_model_dir("pir")), str(folder / "model_ort"), "--data",
                 str(folder / "calib.npy"), "--backend", "onnxruntime", "--algo", "kl"]) == 0  # auto: float
    return folder


def _table(out: str) -> dict[str, list[str]]:
    return {m.group(1): [c.strip() for c in m.group(2).split("|")]
            for m in re.finditer(r"^\| ([a-z-]+) \|(.*)\|$", out, re.M) if m.group(1) != "backend"}


def test_bench_takes_onnx_files_and_directories_alike(demo_ort, tmp_path, capsys):
    """The documented `qcli bench MODEL model_ort/inference.onnx`, a stand-alone export, a directory holding one."""
    float_dir, onnx_file = demo_model_dir("pir"), demo_ort / "model_ort" / "inference.onnx"
    assert main(["export", "onnx", str(demo_ort / "model_ort"), str(tmp_path / "alone.onnx")]) == 0
    (tmp_path / "only_onnx").mkdir()
    shutil.copy(onnx_file, tmp_path / "only_onnx" / "inference.onnx")
    capsys.readouterr()
    for second in (onnx_file, tmp_path / "alone.onnx", tmp_path / "only_onnx"):
        assert main(["bench", str(float_dir), str(second), "--backends", "onnxruntime,onednn", "--batch", "8",
                     "--repeats", "2", "--data", str(demo_ort / "x.npy"), "--json", str(tmp_path / "b.json")]) == 0
        captured = capsys.readouterr()
        assert "model 2: " in captured.out and "(int8 QDQ, ONNX)" in captured.out, captured.out
        assert "(float, PIR Paddle model)" in captured.out and captured.err == "", captured.err
        rows = json.loads((tmp_path / "b.json").read_text())["batch 8"]
        onnxruntime = rows["onnxruntime"]
        assert onnxruntime["agreement_with_float"] >= 85 and onnxruntime["deployed_vs_simulated"] is None
        assert rows["onednn"]["unavailable"].endswith("is an ONNX file, which runs on onnxruntime and openvino-runtime "
                                                      "only")
        assert _table(captured.out)["onnxruntime"][3] == "n/a"  # no simulation of an ONNX file


def test_bench_says_what_it_compared_and_warns_when_the_models_differ(demo_ort, tmp_path, capsys):
    import paddle

    from qdemo.net import DemoNet

    paddle.seed(1)
    other = DemoNet()
    other.eval()  # untrained: the demo's inputs and shape, not its weights
    paddle.jit.save(other, str(tmp_path / "other" / "inference"),
                    input_spec=[paddle.static.InputSpec([None, 1, 28, 28], "float32", INPUT_NAME)])
    x = str(demo_ort / "x.npy")
    bench = ["--backends", "onednn", "--batch", "8", "--repeats", "2"]
    assert main(["bench", str(demo_model_dir("pir")), str(tmp_path / "other"), *bench, "--data", x]) == 0
    captured = capsys.readouterr()
    assert "(float 1, PIR Paddle model)" in captured.out and "(float 2, PIR Paddle model)" in captured.out
    assert f"inputs: the first 64 samples of --data {x}" in captured.out
    assert "| backend | float 1 ms | float 2 ms |" in captured.out
    warnings = captured.err.splitlines()
    assert warnings[0] == ("qcli bench: warning: neither model holds quantization ops: this compares two float "
                           "models, not float and int8")
    agreement = float(_table(captured.out)["onednn"][-1])
    assert agreement < 30 and warnings[1] == (
        f"qcli bench: warning: onednn: model 2 agrees with model 1 on {agreement:.1f} % of the 64 samples' arg-max, "
        "under 80 %: they are not one model and its quantized version (or the quantization broke it)")
    # the same int8 model on random inputs: said to be random, no verdict from them
    assert main(["bench", str(demo_model_dir("pir")), str(demo_ort / "model_ort"), *bench]) == 0
    captured = capsys.readouterr()
    assert "inputs: 64 random standard-normal samples (seed 0): agreement on them says nothing about accuracy" \
        in captured.out and captured.err == ""
    assert "(int8 QDQ, PIR Paddle model)" in captured.out
