"""qcore.export's pieces on hand-built graphs: Graph.unquantize (both IRs), the repairs of paddle2onnx output,
the conv-bias fold and the QDQ writer's zero points; and the whole export of a hand-quantized model."""

from __future__ import annotations

import tempfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qcore.errors import ExportError
from qcore.export import export_onnx
from qcore.export.fusable import biases_into_convs
from qcore.export.qdq import _zero_point
from qcore.export.repair import constants_to_initializers, numbered_dim_names, scalars_in_shape_concats
from qcore.graph import open_graph
from qcore.graph.base import ActivationGrid
from qcore.model_io import load_model
from qdemo.testing import make_tiny_net, sample_input, save_fft_net, save_tiny_net


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def test_rank0_concat_pieces_are_made_1d_and_the_model_loads():
    # x [N, 6] reshaped to [N, 2, 3]: the target shape concatenates shape(x)[0] (1-D) with a scalar 2 and [3]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "one"], ["batch"]),
        helper.make_node("Concat", ["batch", "two", "three"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
             (("zero", [0]), ("one", [1]), ("two", 2), ("three", [3]))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(Exception, match="same rank"):
        _run(model, {"x": np.zeros((2, 6), np.float32)})
    assert scalars_in_shape_concats(model) == 1
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    np.testing.assert_array_equal(_run(model, {"x": x})[0], x.reshape(2, 2, 3))
    assert scalars_in_shape_concats(model) == 0  # nothing left to repair


def test_symbolic_dimensions_are_renumbered_by_first_appearance_keeping_which_are_equal():
    # paddle2onnx numbers them differently from run to run (the same model gave other bytes)
    def dims(*names: int | str) -> list:  # k: DynamicDimension.k; a string: itself; the last dimension is 8
        return [f"DynamicDimension.{n}" if isinstance(n, int) else n for n in names] + [8]

    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, dims(3, 1)),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, dims(3, "batch"))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, dims(3, 1))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    assert numbered_dim_names(model) == 1  # .3 -> .0; .1 stays .1
    values = [*model.graph.input, *model.graph.output]
    shapes = [[d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in values]
    assert shapes == [dims(0, 1), dims(0, "batch"), dims(0, 1)]
    assert numbered_dim_names(model) == 0  # already numbered


def test_constant_weights_become_initializers_and_biases_go_into_convs():
    w = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = np.arange(4, dtype=np.float32)
    nodes = [
        helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(w)),
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["b", "shape"], ["b4"]),
        helper.make_node("Add", ["c", "b4"], ["y"]),
    ]
    inits = [numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.array([1, 4, 1, 1], np.int64), "shape")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 5])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = np.random.default_rng(1).standard_normal((1, 3, 5, 5)).astype(np.float32)
    before = _run(model, {"x": x})[0]
    assert constants_to_initializers(model) == 1 and "w" in {i.name for i in model.graph.initializer}
    assert biases_into_convs(model) == 1
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    assert len(conv.input) == 3 and conv.output[0] == "y" and not any(n.op_type == "Add" for n in model.graph.node)
    np.testing.assert_allclose(_run(model, {"x": x})[0], before, rtol=1e-6, atol=1e-6)


def test_zero_points_by_hand():
    signed = ActivationGrid(0.1, 0, -128, 127)
    assert _zero_point(signed, "uint8", "t") == 128 and _zero_point(signed, "int8", "t") == 0
    unsigned = ActivationGrid(0.1, 0, 0, 255)  # oneDNN's unsigned relu outputs
    assert _zero_point(unsigned, "uint8", "t") == 0
    relu = ActivationGrid(0.1, -127, -128, 127)  # the 255-code asymmetric grid over [0, t]
    assert _zero_point(relu, "uint8", "t") == 1 and _zero_point(relu, "uint8", "t", never_negative=True) == 0
    with pytest.raises(ExportError, match="8-bit activations only"):
        _zero_point(ActivationGrid(0.1, 0, -8, 7), "uint8", "t")
    with pytest.raises(ExportError, match="activation_type='uint8'"):
        _zero_point(unsigned, "int8", "t")
    with pytest.raises(ExportError, match="does not hold zero"):
        _zero_point(ActivationGrid(0.1, -140, -128, 127), "uint8", "t")


@pytest.mark.parametrize("fmt", ["pir", "legacy_pdmodel", "legacy_combined", "legacy_separate"])
def test_unquantize_gives_back_the_grids_and_codes_and_the_export_runs_as_simulated(fmt, tmp_path):
    save_tiny_net(make_tiny_net(), tmp_path / "float", fmt)
    model = load_model(tmp_path / "float")
    graph = open_graph(model)
    conv = graph.ops(["conv2d"])[0]
    graph.insert_act_qdq(graph.activation_operands(conv)[0], 2.54)  # step 0.02
    stored = graph.quantize_weight(graph.weight_operand(conv), 8, axis=0)
    x = sample_input(4)
    simulated = model.run({"x": x})[0]

    copy = graph.clone()
    taken = copy.unquantize()
    assert list(taken.markers.values()) == [ActivationGrid(pytest.approx(0.02), 0, -128, 127)]
    (weight,) = taken.weights
    np.testing.assert_array_equal(weight.codes, stored.codes)
    np.testing.assert_allclose(weight.steps, stored.thresholds / 127, rtol=1e-6)
    assert weight.axis == 0
    # the float form computes the same model without the rounding: within a few activation steps of it
    assert np.abs(copy.model.run({"x": x})[0] - simulated).max() < 0.1
    assert "quantize_linear" not in " ".join(copy.op_types())

    path = export_onnx(model, tmp_path / "model.onnx")
    exported = onnx.load(str(path))
    assert sum(n.op_type == "QuantizeLinear" for n in exported.graph.node) == 1
    inits = {i.name: numpy_helper.to_array(i) for i in exported.graph.initializer}
    np.testing.assert_array_equal(next(v for k, v in inits.items() if k.endswith(".int8")), stored.codes)
    deployed = _run(exported, {"x": x})[0]
    assert np.linalg.norm(deployed - simulated) / np.linalg.norm(simulated) < 1e-5
    assert graph.op_types() == open_graph(model).op_types()  # the model itself is untouched


def test_exports_write_nothing_outside_the_output_and_the_temporary_directory(tmp_path, monkeypatch):
    save_tiny_net(make_tiny_net(), tmp_path / "float", "pir")
    save_fft_net(tmp_path / "crash", "real")
    work, temp, out = tmp_path / "cwd", tmp_path / "temp", tmp_path / "out"
    for directory in (work, temp, out):
        directory.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    export_onnx(tmp_path / "float", out / "tiny.onnx")
    with pytest.raises(ExportError, match="paddle2onnx could not convert"):
        export_onnx(tmp_path / "crash", out / "crash.onnx")  # the child aborts
    assert list(work.iterdir()) == []
    assert list(temp.iterdir()) == []  # its temporaries are gone, on success and on failure
    assert [p.name for p in out.iterdir()] == ["tiny.onnx"]


def test_an_export_that_computes_another_function_is_refused_naming_the_output(tmp_path):
    save_fft_net(tmp_path / "fft", "abs")  # paddle2onnx 2.1: a graph of output shape (2, 3, 28, 28) for (2, 4, 28, 15)
    with pytest.raises(ExportError, match=r"output '.+' has shape \(2, 3, 28, 28\) where Paddle's is "
                                          r"\(2, 4, 28, 15\) \(inputs x \(2, 3, 28, 28\) float32\)") as error:
        export_onnx(tmp_path / "fft", tmp_path / "fft.onnx")
    assert "\n" not in str(error.value)
    assert not (tmp_path / "fft.onnx").exists()


def _scaled(what, factor):
    """A stand-in for a converter or writer bug: the weights' float initializers named ``*what`` multiplied by
    ``factor``."""
    def edit(proto) -> None:
        for init in proto.graph.initializer:
            if init.name.endswith(what) and not init.name.startswith("p2o.") and init.data_type == TensorProto.FLOAT:
                init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * factor, init.name))
    return edit


def test_values_off_the_paddle_model_are_refused_float_tightly_qdq_against_the_simulation(tmp_path, monkeypatch):
    import qcore.export as export

    save_tiny_net(make_tiny_net(), tmp_path / "float", "pir")
    fixed_repair, fixed_write = export.repair, export.write_qdq
    # a weight 0.1 % off: a float graph must compute its program to 1e-4 (relative L2)
    monkeypatch.setattr(export, "repair", lambda proto: (fixed_repair(proto), _scaled(".w_0", 1.001)(proto)))
    with pytest.raises(ExportError, match=r"paddle2onnx's graph of .+ does not compute the Paddle model: output "
                                          r"'.+' differs by [0-9.e-]+ .+at most 0.0001 allowed"):
        export_onnx(tmp_path / "float", tmp_path / "float.onnx")
    monkeypatch.setattr(export, "repair", fixed_repair)
    export_onnx(tmp_path / "float", tmp_path / "float.onnx")

    model = load_model(tmp_path / "float")
    graph = open_graph(model)
    conv = graph.ops(["conv2d"])[0]
    graph.insert_act_qdq(graph.activation_operands(conv)[0], 2.54)
    graph.quantize_weight(graph.weight_operand(conv), 8, axis=0)
    export_onnx(model, tmp_path / "q.onnx")  # the QDQ file computes the simulation
    # weight steps of the wrong sign: the QDQ file is another function than the simulation
    monkeypatch.setattr(export, "write_qdq", lambda proto, *a: (fixed_write(proto, *a), _scaled(".scale", -1)(proto)))
    with pytest.raises(ExportError, match=r"the QDQ export of .+ does not compute the Paddle model: output '.+' "
                                          r"differs by [0-9.]+ .+at most 0.5 allowed"):
        export_onnx(model, tmp_path / "bad.onnx")
    assert not (tmp_path / "bad.onnx").exists()


def test_paddle2onnx_failures_name_the_op_it_was_converting():
    from qcore.export.paddle2onnx_float import _failed_op

    log = """[Paddle2ONNX] Start export pd_op.add, op_id: 1921
[Paddle2ONNX] Finish export pd_op.add, op_id: 1921
[Paddle2ONNX] Start export pd_op.nearest_interp, op_id: 1922
[ERROR]\tFailed to convert PaddlePaddle model: (Unimplemented) the 0th elementwise MUST be ir::FloatAttribute"""
    assert _failed_op(log) == "pd_op.nearest_interp (op 1922)"  # PP-OCRv4 det's verbose log (measured)
    assert _failed_op(log.split("\n[Paddle2ONNX] Start export pd_op.nearest")[0]) is None  # every op finished


def test_paddle2onnx_installs_and_folds_nothing(tmp_path, monkeypatch, capfd):
    # paddle2onnx 2.1 runs Polygraphy's constant folding on any file it saves, whatever enable_optimize says,
    # and lets Polygraphy pip-install onnx-graphsurgeon first: the export takes its bytes instead
    from qcore.export.paddle2onnx_float import PADDLE2ONNX_LOGS_ENV

    save_tiny_net(make_tiny_net(), tmp_path / "float", "pir")
    monkeypatch.setenv(PADDLE2ONNX_LOGS_ENV, "1")  # the child's log goes to stderr
    export_onnx(tmp_path / "float", tmp_path / "tiny.onnx")
    log = capfd.readouterr().err
    assert "Start export pd_op.conv2d" in log  # the log is there
    assert "Polygraphy" not in log and "pip install" not in log
