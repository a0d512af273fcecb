"""Producer / reader queries (:class:`qcore.graph.Dataflow`) and the op edits of :class:`qcore.graph.Graph`,
on the tiny net (conv + bias -> batch_norm -> relu -> depthwise conv -> relu -> flatten -> fc) in every format."""

from __future__ import annotations

import numpy as np
import pytest

from qcore.errors import GraphError
from qcore.graph import Dataflow, open_graph
from qcore.model_io import load_model


def _graph(tiny_model):
    directory, kwargs, _ = tiny_model
    return open_graph(load_model(directory, **kwargs))


def _short(op_type: str) -> str:
    return op_type.split(".")[-1]


def _relus(graph):
    return [op for op in graph.ops() if _short(op.type) == "relu"]


def test_producer_and_readers_name_tensors_as_operands_do(tiny_model):
    g = _graph(tiny_model)
    flow = Dataflow(g)
    dw, fc = g.ops(["depthwise_conv2d"])[0], g.ops(["mul"])[0]
    first_relu, second_relu = _relus(g)
    (dw_input,) = g.activation_operands(dw)
    assert flow.producer(dw_input.name).key == first_relu.key
    assert [op.key for op in flow.readers(dw_input.name)] == [dw.key]
    dw_output = g.output_names(dw)[0]
    assert [op.key for op in flow.readers(dw_output)] == [second_relu.key]
    assert flow.input(second_relu, "X" if g.family == "legacy" else "x") == dw_output
    # parameters and feeds have no producer op among the computing ones
    weight = g.weight_operand(fc)
    assert weight.name in flow.params and flow.reads_param(fc) and not flow.reads_param(second_relu)
    assert [op.key for op in flow.readers(weight.name)] == [fc.key]
    assert flow.producer("x") is None or _short(flow.producer("x").type) in ("feed", "data")


def test_reaches_follows_the_data_not_the_program_order(tiny_model):
    g = _graph(tiny_model)
    flow = Dataflow(g)
    dw, fc = g.ops(["depthwise_conv2d"])[0], g.ops(["mul"])[0]
    dw_input, fc_input = g.activation_operands(dw)[0].name, g.activation_operands(fc)[0].name
    assert flow.reaches("x", fc_input) and flow.reaches(dw_input, fc_input)
    assert not flow.reaches(fc_input, dw_input)
    assert not flow.reaches(g.weight_operand(fc).name, dw_input)


def test_shape_and_attr(tiny_model):
    g = _graph(tiny_model)
    dw = g.ops(["depthwise_conv2d"])[0]
    assert g.shape(g.activation_operands(dw)[0].name) == [-1, 8, 8, 8]
    assert g.attr(dw, "groups") == 8 and g.attr(g.ops(["conv2d"])[0], "groups") == 1
    assert g.attr(dw, "no_such_attribute", "absent") == "absent"


def test_set_attr_and_test_mode(tiny_model):
    g = _graph(tiny_model)
    bn = g.ops(["batch_norm"])[0]
    conv = g.ops(["conv2d"])[0]
    g.set_attr(conv, "qcore_note", "seen")
    assert g.attr(conv, "qcore_note") == "seen"
    assert g.attr(bn, "is_test") is True
    g.set_attr(bn, "is_test", False)
    assert g.attr(bn, "is_test") is False
    with g.test_mode():
        assert g.attr(bn, "is_test") is True
    assert g.attr(bn, "is_test") is False  # its own value is back


def test_rename_input_rewires_one_reader(tiny_model, tiny_input):
    g = _graph(tiny_model)
    first_relu, second_relu = _relus(g)
    (old,) = g.operands(second_relu)
    g.rename_input(second_relu, old.value, g.output(first_relu))
    flow = Dataflow(g)
    relu_output = g.output_names(first_relu)[0]
    assert flow.input(second_relu, "X" if g.family == "legacy" else "x") == relu_output
    assert second_relu.key in [op.key for op in flow.readers(relu_output)]
    assert flow.readers(old.name) == []  # the depthwise conv's output is read by nothing now
    assert g.run({"x": tiny_input})[0].shape == (len(tiny_input), 10)


def test_bypass_removes_an_op_and_its_readers_read_its_input(tiny_model, tiny_input):
    g = _graph(tiny_model)
    dw = g.ops(["depthwise_conv2d"])[0]
    _, second_relu = _relus(g)
    count = len(g.ops())
    g.bypass(second_relu, "X" if g.family == "legacy" else "x")
    flow = Dataflow(g)
    assert len(flow.ops) == count - 1 and len(_relus(g)) == 1
    dw_output = g.output_names(dw)[0]
    assert [_short(op.type) for op in flow.readers(dw_output)] == ["flatten" if g.family == "pir"
                                                                    else "flatten_contiguous_range"]
    assert np.isfinite(g.run({"x": tiny_input})[0]).all()


def test_retype_changes_a_legacy_op_and_is_refused_in_pir(tiny_model):
    g = _graph(tiny_model)
    relu = _relus(g)[0]
    if g.family == "pir":
        with pytest.raises(GraphError, match="fixed"):
            g.retype(relu, "pd_op.leaky_relu")
        return
    g.retype(relu, "leaky_relu")
    g.set_attr(relu, "alpha", 0.0)
    assert g.op_types().count("relu") == 1 and g.op_types().count("leaky_relu") == 1
    assert g.attr(g.ops(["leaky_relu"])[0], "alpha") == 0.0


def test_training_fake_quant_goes_just_before_its_op(tiny_model):
    g = _graph(tiny_model)
    fc = g.ops(["mul"])[0]
    (act,) = g.activation_operands(fc)
    weight = g.weight_operand(fc)
    with g._editing():
        out = g.fake_quant_activation(fc, act.value, "fc@act", 8, 0.9, test=True, initial=0.5)
        w_out = g.fake_quant_weight(fc, weight.value, 8, 1)
        g.rename_input(fc, act.value, out)
        g.rename_input(fc, weight.value, w_out)
    types = [_short(t) for t in g.op_types()]
    at = types.index("matmul" if g.family == "pir" else "matmul_v2")
    assert types[at - 1] == "fake_channel_wise_quantize_dequantize_abs_max"
    assert "fake_quantize_dequantize_moving_average_abs_max" in types[:at - 1]
    flow = Dataflow(g)
    fc = next(op for op in g.ops() if _short(op.type) in ("matmul", "matmul_v2"))  # its weight is no parameter now
    assert {_short(flow.producer(name).type) for name in g.input_names(fc)} == {
        "fake_quantize_dequantize_moving_average_abs_max", "fake_channel_wise_quantize_dequantize_abs_max"}
    if g.family == "legacy":  # its state is in the scope already; PIR's comes from running ``startup``
        assert g.get_param("fc@act@scale").tolist() == [0.5]
        assert g.attr(flow.producer(g.input_names(fc, "X")[0]), "is_test") is True
