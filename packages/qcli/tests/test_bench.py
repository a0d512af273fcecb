from __future__ import annotations

import json

from qcli.main import main
from qdemo import demo_model_dir


def test_bench_prints_and_writes_a_row_per_backend_and_batch(tmp_path, capsys):
    out = tmp_path / "int8"
    assert main(["ptq", "dynamic", str(demo_model_dir("legacy")), str(out)]) == 0
    capsys.readouterr()
    assert main(["bench", str(demo_model_dir("legacy")), str(out), "--backends", "onednn,openvino,tensorrt",
                 "--batch", "1,4", "--repeats", "3", "--json", str(tmp_path / "b.json")]) == 0
    results = json.loads((tmp_path / "b.json").read_text())
    assert list(results) == ["batch 1", "batch 4"]
    for rows in results.values():
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
