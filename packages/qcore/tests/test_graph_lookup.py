"""Graph.quantize_lookup: int8 table + dequantizing lookup, in both families and both runtimes."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from qcore.errors import GraphError
from qcore.graph import open_graph
from qcore.inference import predict
from qcore.model_io import load_model
from qcore.quant import LN2, log_dequantize, log_quantize
from qdemo.testing import EMBEDDING_INPUT_SPEC, TinyEmbeddingNet, save_tiny_net

LOOKUPS = ["lookup_table", "embedding_with_scaled_gradient"]
IDS = np.array([[0, 1, 2, 3, 63, 5], [7, 7, 0, 9, 10, 11]], np.int64)


@pytest.fixture(scope="module", params=["pir", "legacy_pdmodel", "pir-scaled", "legacy_pdmodel-scaled"])
def emb_model(request, tmp_path_factory):
    """The tiny embedding net; '-scaled' exports its lookup as embedding_with_scaled_gradient."""
    paddle.seed(0)
    fmt, _, scaled = request.param.partition("-")
    net = TinyEmbeddingNet(scale_grad_by_freq=bool(scaled))
    net.eval()
    directory = tmp_path_factory.mktemp("emb") / request.param
    save_tiny_net(net, directory, fmt, EMBEDDING_INPUT_SPEC)
    return directory


def _table_and_graph(directory):
    graph = open_graph(load_model(directory))
    (op,) = graph.ops(LOOKUPS)
    return graph, op, graph.get_param(graph.weight_operand(op).name)


def _reference(directory, table):
    """The float model run with ``table`` as its embedding table."""
    graph, op, _ = _table_and_graph(directory)
    graph.replace_weight(graph.weight_operand(op), table.astype(np.float32))
    return graph.run({"ids": IDS})[0]


@pytest.mark.parametrize("per_row", [False, True])
def test_linear_codes_run_as_the_dequantized_table(emb_model, per_row, tmp_path):
    graph, op, table = _table_and_graph(emb_model)
    scales = np.abs(table).max(axis=1) / 127 if per_row else np.array([np.abs(table).max() / 127])
    safe = np.where(scales > 0, scales, 1.0)  # the padding row is all zeros
    codes = np.rint(table / (safe[:, None] if per_row else safe[0])).astype(np.int8)
    expected = _reference(emb_model, codes * (scales[:, None] if per_row else scales[0]))
    graph.quantize_lookup(op, codes, scales)
    types = [t.split(".")[-1] for t in graph.op_types()]
    lookups = 2 if per_row else 1  # the per-row scales are looked up with the same ids
    assert sum(t in ("embedding", "lookup_table_v2", "embedding_with_scaled_gradient") for t in types) == lookups
    assert "cast" in types
    assert graph.weight_operand(graph.ops(LOOKUPS)[0]) is None  # the table is no longer float
    np.testing.assert_allclose(graph.run({"ids": IDS})[0], expected, rtol=1e-5, atol=1e-6)
    files = graph.save(tmp_path / "q")
    np.testing.assert_allclose(predict(files, {"ids": IDS})[0], expected, rtol=1e-5, atol=1e-6)
    saved = open_graph(load_model(files.directory))
    params = [saved.get_param(n) for n in saved.param_names() if n not in ("feed", "fetch")]
    assert [p.dtype for p in params if p.shape == table.shape] == [np.int8]


def test_log_codes(emb_model, tmp_path):
    graph, op, table = _table_and_graph(emb_model)
    codes, meta = log_quantize(table, 8, axis=0)
    expected = _reference(emb_model, log_dequantize(codes, meta))
    graph.quantize_lookup(op, codes, meta["absmax"], log_step=LN2)
    np.testing.assert_allclose(graph.run({"ids": IDS})[0], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(predict(graph.save(tmp_path / "q"), {"ids": IDS})[0], expected, rtol=1e-5, atol=1e-6)


def test_bad_codes_and_scales(emb_model):
    graph, op, table = _table_and_graph(emb_model)
    with pytest.raises(GraphError, match="int8"):
        graph.quantize_lookup(op, table, np.ones(1))
    with pytest.raises(GraphError, match="one scale or one per row"):
        graph.quantize_lookup(op, np.zeros(table.shape, np.int8), np.ones(3))


def test_lookup_that_is_the_model_output(tmp_path):
    """The rewritten lookup's output replaces the old one among the fetch targets (PIR)."""

    class Lookup(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.emb = paddle.nn.Embedding(10, 4)

        def forward(self, ids):
            return self.emb(ids)

    for fmt in ("pir", "legacy_pdmodel"):
        directory = tmp_path / fmt
        save_tiny_net(Lookup(), directory, fmt, [paddle.static.InputSpec([None], "int64", "ids")])
        graph, op, table = _table_and_graph(directory)
        graph.quantize_lookup(op, np.ones(table.shape, np.int8), np.array([0.5]))
        ids = np.array([1, 2], np.int64)
        np.testing.assert_array_equal(graph.run({"ids": ids})[0], np.full((2, 4), 0.5, np.float32))
        np.testing.assert_array_equal(predict(graph.save(tmp_path / f"q_{fmt}"), {"ids": ids})[0], np.full((2, 4), 0.5))


def test_whole_table_float_dequant_keeps_dequantize_linear_out(emb_model, tmp_path):
    """float_dequant: int8 storage read through cast -> multiply, which oneDNN's int8 passes leave alone."""
    graph, op, table = _table_and_graph(emb_model)
    q = graph.quantize_weight(graph.weight_operand(op), 8, 0, float_dequant=True)
    expected = _reference(emb_model, q.codes * (q.thresholds / 127)[:, None])
    types = [t.split(".")[-1] for t in graph.op_types()]
    assert "dequantize_linear" not in types and "cast" in types
    np.testing.assert_allclose(graph.run({"ids": IDS})[0], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(predict(graph.save(tmp_path / "q"), {"ids": IDS})[0], expected, rtol=1e-5, atol=1e-6)
