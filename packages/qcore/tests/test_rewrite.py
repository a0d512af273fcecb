from __future__ import annotations

import numpy as np

from qcore.graph import open_graph, quantize_op
from qcore.model_io import load_model


def test_quantize_op_matches_manual_rewrite(tiny_model, tiny_input):
    directory, kwargs, _ = tiny_model
    manual = open_graph(load_model(directory, **kwargs))
    shared = open_graph(load_model(directory, **kwargs))
    fc_manual, fc_shared = manual.ops(["mul"])[0], shared.ops(["mul"])[0]
    act = manual.activation_operands(fc_manual)[0]
    manual.quantize_weight(manual.weight_operand(fc_manual), 8, 1)
    manual.insert_act_qdq(act, 0.7, 8)
    done = quantize_op(shared, fc_shared, {act.name: 0.7})
    assert done.activations == {act.name: 0.7} and done.left_float == []
    assert done.weight is not None and done.weight.axis == 1 and done.weight.thresholds.shape == (10,)
    assert shared.op_types() == manual.op_types()
    np.testing.assert_array_equal(shared.run({"x": tiny_input})[0], manual.run({"x": tiny_input})[0])


def test_quantize_op_per_tensor_given_thresholds_and_zero_activation(tiny_model):
    directory, kwargs, _ = tiny_model
    g = open_graph(load_model(directory, **kwargs))
    conv = g.ops(["conv2d"])[0]
    done = quantize_op(g, conv, 0.0, weight_bits=4, per_channel=False, weight_thresholds=0.05)
    assert done.activations == {} and len(done.left_float) == 1  # threshold 0: left in float
    assert done.weight.axis is None and done.weight.thresholds.tolist() == [0.05]
    assert np.abs(done.weight.codes).max() == 7  # 4 bits, clipped at the given threshold


def test_apply_rules_names_the_rule_and_keeps_dependants_float(tiny_model, tiny_input):
    from qcore.deploy import ModelRules, OpTarget, find_targets, get_target
    from qcore.deploy.apply import FOR_FLOAT_CONV_REASON, Planned, apply_rules

    directory, kwargs, _ = tiny_model
    graph = open_graph(load_model(directory, **kwargs))
    conv, fc = find_targets(graph, ["conv2d", "mul"])

    class KeepConvFloat(ModelRules):
        def problem(self, op, bits, per_channel):
            return "test: convs stay float" if op.raw is conv.op.raw else None

    follower = OpTarget(fc.op, None, fc.activations, for_conv=conv.op)  # quantized only for the conv
    planned = [Planned(conv, [1.0]), Planned(fc, [0.7]), Planned(follower, {fc.activations[0].name: 0.7})]
    applied = apply_rules(graph, KeepConvFloat(get_target("native"), graph), planned)
    assert [a.left_float for a in applied] == ["test: convs stay float", None, FOR_FLOAT_CONV_REASON]
    assert applied[1].done.weight is not None and list(applied[1].done.activations.values()) == [0.7]
    assert graph.op_types().count("quantize_linear") + graph.op_types().count(
        "pd_op.fake_quantize_dequantize_moving_average_abs_max") == 1  # only the fc's input
    assert np.isfinite(graph.run({"x": tiny_input})[0]).all()
