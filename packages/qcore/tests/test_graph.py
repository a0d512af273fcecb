from __future__ import annotations

import numpy as np
import paddle
import pytest

from qcore.deploy import get_target
from qcore.errors import GraphError
from qcore.graph import backend_names, open_graph
from qcore.inference import predict
from qcore.model_io import load_model
from qcore.quant import fake_quantize
from qdemo.testing import save_tiny_net

QUANTIZABLE = ["conv2d", "depthwise_conv2d", "mul"]


def _graph(tiny_model):
    directory, kwargs, _ = tiny_model
    return open_graph(load_model(directory, **kwargs))


def test_ops_by_seed_name(tiny_model):
    g = _graph(tiny_model)
    assert [op.seed_type for op in g.ops(QUANTIZABLE)] == ["conv2d", "depthwise_conv2d", "mul"]
    convs = g.ops(["conv2d"])
    assert len(convs) == 1 and g.weight_operand(convs[0]).name == "conv2d_0.w_0"
    assert g.weight_channel_axis(convs[0]) == 0
    fc = g.ops(["mul"])[0]
    assert g.weight_operand(fc).name == "linear_0.w_0" and g.weight_channel_axis(fc) == 1
    assert [o.is_param for o in g.activation_operands(fc)] == [False]
    assert g.ops(["pool2d"]) == []
    with pytest.raises(GraphError, match="did you mean 'conv2d'"):
        g.ops(["conv2"])


def test_skip_pattern_matches_scope_or_weight_name(tiny_model):
    g = _graph(tiny_model)
    assert [op.seed_type for op in g.ops(QUANTIZABLE, skip_patterns=["linear_0"])] == ["conv2d", "depthwise_conv2d"]


def test_backend_name_table():
    assert backend_names("mul", "pir") == ("pd_op.matmul",)
    assert "matmul_v2" in backend_names("mul", "legacy")
    assert backend_names("lookup_table", "legacy") == ("lookup_table", "lookup_table_v2")
    assert backend_names("elementwise_add", "pir") == ("pd_op.add",)


def test_params_get_set(tiny_model, tiny_net):
    g = _graph(tiny_model)
    np.testing.assert_array_equal(g.get_param("conv2d_0.w_0"), tiny_net.conv.weight.numpy())
    with pytest.raises(GraphError, match="not found"):
        g.get_param("nope")


def test_bias_operand_follows_conv_and_fc(tiny_model, tiny_net):
    g = _graph(tiny_model)
    fc = g.ops(["mul"])[0]
    np.testing.assert_array_equal(g.get_param(g.bias_operand(fc).name), tiny_net.fc.bias.numpy())
    assert g.bias_operand(g.ops(["depthwise_conv2d"])[0]) is None  # bias_attr=False
    conv = g.ops(["conv2d"])[0]
    assert g.bias_operand(conv) is not None  # before folding: the conv's own bias
    g.fold_conv_bn()
    folded = g.get_param(g.bias_operand(conv).name).reshape(-1)
    bn = tiny_net.bn
    expected = (tiny_net.conv.bias.numpy() - bn._mean.numpy()) / np.sqrt(bn._variance.numpy() + bn._epsilon)
    np.testing.assert_allclose(folded, expected * bn.weight.numpy() + bn.bias.numpy(), rtol=1e-5, atol=1e-6)


def test_fold_conv_bn_keeps_outputs(tiny_model, tiny_input, tiny_reference):
    g = _graph(tiny_model)
    assert g.fold_conv_bn() == 1
    assert not [t for t in g.op_types() if "batch_norm" in t]
    np.testing.assert_allclose(g.run({"x": tiny_input})[0], tiny_reference, atol=1e-4)
    if g.family == "legacy":  # the bias as oneDNN's conv_bias pass takes it: 1-D parameter, axis=1, no reshape2
        conv = g.ops(["conv2d"])[0]
        out = conv.raw.output("Output")
        add = next(op.raw for op in g.ops() if op.type == "elementwise_add" and op.raw.input("X") == out)
        assert add.attr("axis") == 1 and add.input("Y") == [g.bias_operand(conv).name]
        assert g.get_param(add.input("Y")[0]).ndim == 1 and "reshape2" not in g.op_types()


def test_weight_codes_and_scales_match_hand_computation(tiny_model, tiny_net):
    g = _graph(tiny_model)
    conv = g.ops(["conv2d"])[0]
    w = tiny_net.conv.weight.numpy()
    stored = g.quantize_weight(g.weight_operand(conv), bits=8, axis=0)
    thr = np.abs(w).reshape(8, -1).max(axis=1)
    np.testing.assert_allclose(stored.thresholds, thr, rtol=1e-6)
    np.testing.assert_array_equal(stored.codes, np.rint(w / (thr / 127).reshape(8, 1, 1, 1)).astype(np.int8))
    assert stored.codes.dtype == np.int8 and np.abs(stored.codes).max() == 127


def _quantize_all(g, x):
    """Calibrate by abs max on ``x``, then insert activation QDQ and int8 weights."""
    targets = [(op, g.activation_operands(op), g.weight_operand(op)) for op in g.ops(QUANTIZABLE)]
    acts = [a for _, ops, _ in targets for a in ops]
    values = g.run({"x": x}, [a.value for a in acts])
    thresholds = {a.name: float(np.abs(v).max()) for a, v in zip(acts, values)}
    for op, act_operands, weight in targets:
        g.quantize_weight(weight, 8, g.weight_channel_axis(op))
        for a in act_operands:
            g.insert_act_qdq(a, thresholds[a.name], 8)
    return thresholds


def test_rewritten_model_runs_in_executor_and_inference(tiny_model, tiny_input, tiny_reference, tmp_path):
    """Acceptance: fold, quantize, save, reload, run in the executor and paddle.inference."""
    g = _graph(tiny_model)
    float_files = g.save(tmp_path / "float")
    g.fold_conv_bn()
    _quantize_all(g, tiny_input)
    types = g.op_types()
    if g.family == "legacy":
        assert types.count("quantize_linear") == 3 and types.count("dequantize_linear") == 6
    else:
        assert types.count("pd_op.fake_quantize_dequantize_moving_average_abs_max") == 3
        assert types.count("pd_op.cast") == 3 and "pd_op.dequantize_linear" not in types
    simulated = g.run({"x": tiny_input})[0]
    scale = np.abs(tiny_reference).max()
    assert 0 < np.abs(simulated - tiny_reference).max() < 0.05 * scale
    files = g.save(tmp_path / "int8")
    reloaded = open_graph(load_model(tmp_path / "int8"))
    np.testing.assert_allclose(reloaded.run({"x": tiny_input})[0], simulated, atol=1e-5)
    ratio = files.params_file.stat().st_size / float_files.params_file.stat().st_size
    assert ratio < 0.3, ratio  # int8-stored weights in both families
    problem = get_target("onednn").host_problem()
    if problem:  # no VNNI: oneDNN's int8 kernels run it unlike the simulation, and the user is told so
        with pytest.warns(UserWarning, match="this CPU has no VNNI"):
            predict(files, {"x": tiny_input})
        return
    deployed = predict(files, {"x": tiny_input})[0]  # oneDNN + int8 switch on
    assert np.abs(deployed - tiny_reference).max() < 0.05 * scale
    assert (deployed.argmax(1) == tiny_reference.argmax(1)).mean() >= 0.75


def test_shared_activation_gets_one_qdq_pair(tiny_model, tiny_input):
    g = _graph(tiny_model)
    fc = g.ops(["mul"])[0]
    act = g.activation_operands(fc)[0]
    g.insert_act_qdq(act, 1.0, 8)
    g.insert_act_qdq(act, 1.0, 8)
    qdq_ops = [t for t in g.op_types() if "quantize" in t]
    assert len(qdq_ops) == (2 if g.family == "legacy" else 1)


def test_clone_is_independent(tiny_model, tiny_input, tiny_reference):
    g = _graph(tiny_model)
    before = g.clone()
    _quantize_all(g, tiny_input)
    np.testing.assert_allclose(before.run({"x": tiny_input})[0], tiny_reference, atol=1e-5)
    assert not [t for t in before.op_types() if "quant" in t]


def test_activation_qdq_matches_numpy_fake_quant(tiny_model, tiny_input):
    g = _graph(tiny_model)
    fc = g.ops(["mul"])[0]
    act = g.activation_operands(fc)[0]
    (raw,) = g.run({"x": tiny_input}, [act.value])
    thr = float(np.abs(raw).max()) * 0.5  # clip half the range so clipping is exercised
    g.insert_act_qdq(act, thr, 8)
    (after,) = g.run({"x": tiny_input}, [g.ops(["mul"])[0].raw.operand_source(0)] if g.family == "pir" else [
        g.ops(["mul"])[0].raw.input("X")[0]])
    # relu output is >= 0, so Paddle's [-qmax-1, qmax] and our symmetric range agree here
    np.testing.assert_allclose(after, fake_quantize(np.minimum(raw, thr), thr, 8), atol=1e-6)


def test_bad_thresholds_and_bits(tiny_model):
    g = _graph(tiny_model)
    act = g.activation_operands(g.ops(["mul"])[0])[0]
    with pytest.raises(GraphError, match="positive finite"):
        g.insert_act_qdq(act, 0.0, 8)
    with pytest.raises(GraphError, match="positive finite"):
        g.insert_act_qdq(act, float("nan"), 8)
    with pytest.raises(Exception, match="bits"):
        g.insert_act_qdq(act, 1.0, 1)
    with pytest.raises(GraphError, match="not a parameter"):
        g.quantize_weight(act, 8)


@pytest.mark.parametrize("fmt", ["pir", "legacy_pdmodel"])
def test_calibration_runs_a_transposed_conv_in_either_ir(tmp_path, fmt):
    """Paddle 3.3.1's executor builds a PIR conv2d_transpose's oneDNN kernel with is_test false, which it refuses
    ("ConvTransposeOneDNN works only for inference"); such programs run on Paddle's own kernels."""
    paddle.seed(0)
    net = paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 3, padding=1), paddle.nn.Conv2DTranspose(4, 2, 2, stride=2))
    net.eval()
    save_tiny_net(net, tmp_path / fmt, fmt, [paddle.static.InputSpec([None, 3, 6, 6], "float32", "x")])
    graph = open_graph(load_model(tmp_path / fmt))
    x = np.random.default_rng(0).standard_normal((2, 3, 6, 6)).astype("float32")
    flag = paddle.get_flags(["FLAGS_use_mkldnn"])["FLAGS_use_mkldnn"]
    with graph.calibration_run():
        on_onednn = paddle.get_flags(["FLAGS_use_mkldnn"])["FLAGS_use_mkldnn"]
        (got,) = graph.run({"x": x})
    assert on_onednn == (fmt != "pir" and paddle.base.core.is_compiled_with_mkldnn())
    assert paddle.get_flags(["FLAGS_use_mkldnn"])["FLAGS_use_mkldnn"] == flag
    np.testing.assert_allclose(got, net(paddle.to_tensor(x)).numpy(), rtol=1e-5, atol=1e-5)
