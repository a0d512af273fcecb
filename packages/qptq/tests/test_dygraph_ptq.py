"""PTQ of a paddle.nn.Layer (qptq.PTQ): Paddle 3's dygraph flow, static PTQ's thresholds (issue 31 item 6)."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from qcore.errors import ConfigError, DataError, QuantError
from qcore.inference import predict
from qcore.model_io import export_layer, find_model_files, load_model
from qdemo import load_demo_data
from qdemo.net import load_demo_net
from qptq import PTQ, quant_post_static

SIZES = (20, 20, 17, 23, 20)  # batches of different sizes, as a DataLoader's last batch is


def _batches():
    calib, _ = load_demo_data("calib")
    ends = np.cumsum(SIZES)
    return [calib[end - size : end] for size, end in zip(SIZES, ends)]


def _thresholds(report):
    return {n: i["threshold"] for layer in report["layers"] for n, i in layer.get("inputs", {}).items()}


@pytest.mark.parametrize(("family", "algo"), [("pir", "KL"), ("legacy", "hist")])
def test_dygraph_ptq_chooses_static_ptqs_thresholds_and_keeps_accuracy(tmp_path, family, algo):
    net = load_demo_net(family)
    net.train()  # a model that was training: the export runs it in eval mode, and gives it back training
    ptq = PTQ({"algo": algo}, weight_bits=8)
    observed = ptq.quantize(net)
    observed.eval()
    with paddle.no_grad():
        for batch in _batches():
            observed(paddle.to_tensor(batch))
    net.train()
    report = ptq.save_quantized_model(observed, tmp_path / "int8" / "model", family=family)
    assert net.training  # exported in eval mode, given back training
    files = find_model_files(tmp_path / "int8")
    assert files.family == family and files.model_file.name == ("model.json" if family == "pir" else "model.pdmodel")
    assert report["samples"] == sum(SIZES) and report["batches"] == len(SIZES)
    # the same thresholds as quant_post_static on the exported float model with the same batches
    export_layer(net, tmp_path / "float" / "inference", [paddle.static.InputSpec([None, 1, 28, 28], "float32",
                                                                                  "x")], family)
    expected = quant_post_static(None, tmp_path / "float", tmp_path / "static", algo=algo,
                                 batch_generator=lambda: ((b,) for b in _batches()))
    assert _thresholds(report) == _thresholds(expected) and len(_thresholds(report)) >= 4
    x, y = load_demo_data("test")
    net.eval()
    float_top1 = (net(paddle.to_tensor(x[:600])).numpy().argmax(1) == y[:600]).mean()
    top1 = (predict(files, {"x": x[:600]})[0].argmax(1) == y[:600]).mean()  # deployed, oneDNN int8
    assert top1 >= float_top1 - 0.015, (top1, float_top1)
    assert all(not isinstance(sub, type(observed)) for sub in net.sublayers())  # the layer is not wrapped


def test_an_input_spec_is_taken_from_the_batches_and_variable_dims_stay_free(tmp_path):
    net = load_demo_net("pir")
    ptq = PTQ(algo="abs_max")
    observed = ptq.quantize(net)
    observed(paddle.to_tensor(_batches()[0]))
    observed(paddle.to_tensor(_batches()[2]))
    ptq.save_quantized_model(observed, tmp_path / "m")
    assert load_model(tmp_path).feed_specs() == {"x": ((-1, 1, 28, 28), "float32")}


def test_bad_use_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown PTQ option 'algoo' \(did you mean 'algo'\?\)"):
        PTQ(algoo="KL")
    with pytest.raises(ConfigError, match=r"unknown PTQ option 'batch_size' \(PTQ supplies it\)"):
        PTQ({"batch_size": 8})
    ptq = PTQ()
    with pytest.raises(QuantError, match="expects a paddle.nn.Layer, got str"):
        ptq.quantize("net")
    observed = ptq.quantize(load_demo_net("pir"))
    with pytest.raises(DataError, match="no calibration batch was run"):
        ptq.save_quantized_model(observed, tmp_path / "m")
    with pytest.raises(QuantError, match="records positional inputs only"):
        observed(x=paddle.to_tensor(_batches()[0]))
    observed(paddle.to_tensor(_batches()[0]))
    with pytest.raises(ConfigError, match="family='onnx' is not valid"):
        ptq.save_quantized_model(observed, tmp_path / "m", family="onnx")
    with pytest.raises(QuantError, match="takes the model PTQ.quantize returned"):
        ptq.save_quantized_model(load_demo_net("pir"), tmp_path / "m")
    assert not list(tmp_path.iterdir())
