from __future__ import annotations

import numpy as np
import pytest

from qcore.errors import ConfigError, GraphError
from qcore.graph import open_graph
from qcore.inference import predict
from qcore.model_io import find_model_files, load_model
from qptq import quant_post_dynamic


def _params_size(files) -> int:
    return files.params_file.stat().st_size


@pytest.mark.parametrize("bits,ratio", [(8, 0.3), (16, 0.55)])  # tiny net: float biases weigh in
def test_weights_stored_as_integers_and_model_runs(tiny_model, tiny_input, tmp_path, bits, ratio):
    directory, kwargs = tiny_model
    source = find_model_files(directory, **kwargs)
    reference = load_model(directory, **kwargs).run({"x": tiny_input})[0]
    files = quant_post_dynamic(
        directory, tmp_path / "out", **kwargs, quantizable_op_type=["conv2d", "depthwise_conv2d", "mul"],
        weight_bits=bits,
    )
    assert _params_size(files) / _params_size(source) <= ratio
    graph = open_graph(load_model(tmp_path / "out"))
    stored = {n: graph.get_param(n).dtype for n in graph.param_names() if n.endswith(".quantized")}
    assert len(stored) == 3 and set(stored.values()) == {np.dtype("int8" if bits == 8 else "int16")}
    tolerance = 0.02 if bits == 8 else 1e-3
    scale = np.abs(reference).max()
    executed = graph.run({"x": tiny_input})[0]
    np.testing.assert_allclose(executed, reference, atol=tolerance * scale)
    deployed = predict(files, {"x": tiny_input})[0]
    np.testing.assert_allclose(deployed, executed, atol=1e-4 * scale)


def test_generate_test_model_holds_dequantized_float_weights(tiny_model, tiny_input, tmp_path):
    directory, kwargs = tiny_model
    quant_post_dynamic(directory, tmp_path / "out", **kwargs, generate_test_model=True)
    quantized = load_model(tmp_path / "out").run({"x": tiny_input})[0]
    test_graph = open_graph(load_model(tmp_path / "out" / "test_model"))
    assert not [t for t in test_graph.op_types() if "quant" in t or t.endswith("cast")]
    assert any(n.endswith(".fake_quantized") for n in test_graph.param_names())
    np.testing.assert_allclose(test_graph.run({"x": tiny_input})[0], quantized, atol=1e-5)


def test_default_quantizes_conv2d_and_mul_only(tiny_model, tmp_path):
    directory, kwargs = tiny_model
    files = quant_post_dynamic(directory, tmp_path / "out", **kwargs)
    # save_model_filename / save_params_filename None: named as the input is, the names scripts load
    expected = {"pir": ("model.json", "model.pdiparams"), "legacy_pdmodel": ("model.pdmodel", "model.pdiparams"),
                "legacy_combined": ("__model__", "__params__")}[directory.name]
    assert (files.model_file.name, files.params_file.name) == expected
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(expected)
    graph = open_graph(load_model(tmp_path / "out"))
    stored = {op.seed_type: graph.weight_operand(op) for op in graph.ops(["conv2d", "depthwise_conv2d", "mul"])}
    assert stored["depthwise_conv2d"] is not None  # the depthwise conv is not in the default list: float weight
    quantized = [n for n in graph.param_names() if n.endswith(".w_0.quantized")]
    assert len(quantized) == 2 and graph.get_param(quantized[0]).dtype == np.int8  # the conv and the fc


def test_bad_arguments(tiny_model, tmp_path):
    directory, kwargs = tiny_model
    with pytest.raises(ConfigError, match="use 8 or 16"):
        quant_post_dynamic(directory, tmp_path / "o", **kwargs, weight_bits=3)
    with pytest.raises(ConfigError, match="did you mean 'conv2d'"):
        quant_post_dynamic(directory, tmp_path / "o", **kwargs, quantizable_op_type=["conv2"])
    with pytest.raises(ConfigError, match="abs_max"):
        quant_post_dynamic(directory, tmp_path / "o", **kwargs, weight_quantize_type="max")
    assert not (tmp_path / "o").exists()


def test_all_zero_weights_stay_zero(tmp_path, tiny_input):
    from qdemo.testing import make_tiny_net, save_tiny_net

    net = make_tiny_net()
    net.fc.weight.set_value(np.zeros_like(net.fc.weight.numpy()))
    save_tiny_net(net, tmp_path / "m", "legacy_pdmodel")
    quant_post_dynamic(tmp_path / "m", tmp_path / "out")
    graph = open_graph(load_model(tmp_path / "out"))
    assert not np.abs(graph.get_param(f"{net.fc.weight.name}.quantized")).any()  # names follow Paddle's counters
    out = graph.run({"x": tiny_input})[0]
    assert np.isfinite(out).all()
    with pytest.raises(GraphError):
        graph.get_param("linear_0.w_0.missing")


@pytest.mark.parametrize("bits,ratio", [(8, 0.28), (16, 0.53)])  # batch-norm and bias stay float
def test_demo_model_size_ratio(demo_model, demo_data, tmp_path, bits, ratio):
    directory, float_top1 = demo_model
    _, x, y = demo_data
    files = quant_post_dynamic(
        directory, tmp_path / "out", quantizable_op_type=["conv2d", "depthwise_conv2d", "mul"], weight_bits=bits
    )
    assert _params_size(files) / _params_size(find_model_files(directory)) <= ratio
    top1 = float((predict(files, {"image": x})[0].argmax(1) == y).mean())
    assert abs(top1 - float_top1) <= (0.01 if bits == 8 else 0.002)
