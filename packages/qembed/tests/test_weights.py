"""``quant_embedding``'s ``weights`` key: the tables and the model's other weights (fc, matmul, gru) in one call."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from qcore.errors import ConfigError
from qcore.graph import open_graph
from qcore.inference import create_predictor, run_predictor
from qcore.model_io import load_model
from qcore.paddle_env import static_mode
from qembed import quant_embedding, quant_embedding_model
from qembed.table import quantize_table

ROWS, DIM, HIDDEN = 50, 8, 4
LENGTHS = [3, 5, 1]  # three id sequences (LoD)


def per_column_int8(w: np.ndarray) -> np.ndarray:
    """The weight as weight-only int8 stores it: one abs-max scale per output column, codes rounded."""
    scale = np.abs(w).max(axis=0) / 127
    return (np.clip(np.rint(w / scale), -127, 127) * scale).astype(np.float32)


@pytest.fixture(scope="module")
def gru_model(tmp_path_factory):
    """A legacy LAC-shaped program saved to disk: ids (LoD) -> lookup_table_v2 -> mul -> gru -> mul."""
    rng = np.random.default_rng(3)
    params = {
        "emb": rng.normal(0, 1, (ROWS, DIM)).astype("float32"),
        "fc_w": rng.normal(0, 0.5, (DIM, 3 * HIDDEN)).astype("float32"),
        "gru_w": rng.normal(0, 0.5, (HIDDEN, 3 * HIDDEN)).astype("float32"),
        "gru_b": rng.normal(0, 0.1, (1, 3 * HIDDEN)).astype("float32"),
        "out_w": rng.normal(0, 0.5, (HIDDEN, 5)).astype("float32"),
    }
    directory = tmp_path_factory.mktemp("gru") / "model"
    paddle.enable_static()
    with paddle.pir_utils.OldIrGuard():
        main, startup, scope = paddle.static.Program(), paddle.static.Program(), paddle.static.Scope()
        with paddle.static.program_guard(main, startup), paddle.static.scope_guard(scope):
            block = main.global_block()
            ids = paddle.static.data("ids", [None, 1], "int64", lod_level=1)
            made = {n: paddle.static.create_parameter(list(v.shape), "float32", name=n) for n, v in params.items()}
            rows = paddle.nn.functional.embedding(ids, made["emb"])
            gates = block.create_var(name="gates", dtype="float32", shape=[-1, 3 * HIDDEN], lod_level=1)
            block.append_op(type="mul", inputs={"X": [rows], "Y": [made["fc_w"]]}, outputs={"Out": [gates]},
                            attrs={"x_num_col_dims": 1, "y_num_col_dims": 1})
            outs = {k: block.create_var(name=f"gru_{k}", dtype="float32", lod_level=1)
                    for k in ("BatchGate", "BatchResetHiddenPrev", "BatchHidden", "Hidden")}
            block.append_op(type="gru", inputs={"Input": [gates], "H0": [], "Weight": [made["gru_w"]],
                                                "Bias": [made["gru_b"]]},
                            outputs={k: [v] for k, v in outs.items()},
                            attrs={"activation": "tanh", "gate_activation": "sigmoid", "is_reverse": False,
                                   "origin_mode": False})
            out = block.create_var(name="scores", dtype="float32", shape=[-1, 5], lod_level=1)
            block.append_op(type="mul", inputs={"X": [outs["Hidden"]], "Y": [made["out_w"]]},
                            outputs={"Out": [out]}, attrs={"x_num_col_dims": 1, "y_num_col_dims": 1})
            exe = paddle.static.Executor(paddle.CPUPlace())
            exe.run(startup)
            for name, value in params.items():
                scope.var(name).get_tensor().set(value, paddle.CPUPlace())
            paddle.static.save_inference_model(str(directory / "inference"), [ids], [out], exe, program=main)
        # The save prunes the gru's unread outputs, without which its kernel crashes: put them back.
        saved = paddle.static.Program.parse_from_string((directory / "inference.pdmodel").read_bytes())
        (gru,) = [op for op in saved.global_block().ops if op.type == "gru"]
        for slot, var in outs.items():
            saved.global_block().create_var(name=var.name, dtype="float32", lod_level=1)
            gru.desc.set_output(slot, [var.name])
        (directory / "inference.pdmodel").write_bytes(saved.desc.serialize_to_string())
    paddle.disable_static()
    return directory.parent / "model", params


def feed_ids() -> np.ndarray:
    return np.random.default_rng(4).integers(0, ROWS, (sum(LENGTHS), 1)).astype("int64")


def run_executor(model, ids: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    with static_mode(model.family, model.scope):
        tensor = paddle.base.core.DenseTensor()
        tensor.set(ids, paddle.CPUPlace())
        tensor.set_recursive_sequence_lengths([LENGTHS])
        return np.array(model.executor.run(model.program, feed={model.feed_names[0]: tensor},
                                           fetch_list=model.fetch_targets, return_numpy=False)[0])


def run_inference(directory, ids: np.ndarray, onednn: bool) -> np.ndarray:  # type: ignore[no-untyped-def]
    predictor = create_predictor(directory, onednn=onednn)
    handle = predictor.get_input_handle(predictor.get_input_names()[0])
    handle.reshape(list(ids.shape))
    handle.copy_from_cpu(ids)
    handle.set_lod([[0, *np.cumsum(LENGTHS).tolist()]])
    predictor.run()
    return predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()


def simulated(model_dir, params: dict, ids: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    """The float program run with the table and every weight replaced by their int8 values (numpy formulas)."""
    graph = open_graph(load_model(model_dir))
    table = quantize_table(params["emb"], "abs_max", bits=8, per_row=True)
    values = {"emb": table.rows(np.arange(ROWS)), **{n: per_column_int8(params[n]) for n in ("fc_w", "gru_w", "out_w")}}
    for op in graph.ops(["lookup_table", "mul", "gru"]):
        operand = graph.weight_operand(op)
        graph.replace_weight(operand, values[operand.name])
    return run_executor(graph.model, ids)


def test_sequence_ids_keep_the_op_sequence_where_the_fused_op_would_drop_their_lengths(built, gru_model, tmp_path,
                                                                                       monkeypatch):
    """The gru reads the rows' LoD: "auto" (the default) keeps the op sequence for such a table, True is refused
    before any table is quantized."""
    from qcore.errors import ConfigError
    from qembed import program
    from qembed.program import OP_SEQUENCE

    model_dir, _ = gru_model
    files, (report,) = quant_embedding_model(model_dir, tmp_path / "q", {"per_row": True})
    assert report.lookup == OP_SEQUENCE and b"qembed_lookup" not in files.model_file.read_bytes()
    assert run_executor(load_model(files), feed_ids()).shape == (sum(LENGTHS), 5)

    def no_work(*args, **kwargs):
        raise AssertionError("a table was quantized before the refusal")

    monkeypatch.setattr(program, "choose_table_quantization", no_work)
    with pytest.raises(ConfigError, match="'emb' is looked up with sequence \\(LoD\\) ids.*fused_lookup='auto'"):
        quant_embedding_model(model_dir, tmp_path / "t", {"per_row": True, "fused_lookup": True})
    assert not (tmp_path / "t").exists()


def test_one_call_stores_tables_and_weights_int8(gru_model, tmp_path):
    model_dir, params = gru_model
    ids = feed_ids()
    config = {"per_row": True, "weights": {"weight_bits": 8}}
    files, reports = quant_embedding_model(model_dir, tmp_path / "q", config)
    assert [r.name for r in reports] == ["emb"]
    quantized = load_model(files.directory)
    graph = open_graph(quantized)
    names = set(graph.param_names())
    assert not names & {"emb", "fc_w", "gru_w", "out_w"}  # no float copy is written
    for name in ("fc_w", "gru_w", "out_w"):  # int8 codes, one scale per output column
        codes = graph.get_param(f"{name}.quantized")
        assert codes.dtype == np.int8 and codes.shape == params[name].shape
        scale = np.abs(params[name]).max(axis=0) / 127
        np.testing.assert_array_equal(codes, np.rint(params[name] / scale).astype(np.int8))
    out = run_executor(quantized, ids)
    float_out = run_executor(load_model(model_dir), ids)
    np.testing.assert_allclose(out, simulated(model_dir, params, ids), rtol=0, atol=1e-5)
    assert 1e-4 < np.abs(out - float_out).max() < 0.05  # really quantized, and close to float
    for onednn in (False, True):  # deployed: Paddle Inference runs the gru's cast -> multiply
        np.testing.assert_allclose(run_inference(files.directory, ids, onednn), out, rtol=0, atol=1e-5)
    param_bytes = sum(p.stat().st_size for p in files.directory.glob("*.pdiparams"))
    tables_only, _ = quant_embedding_model(model_dir, tmp_path / "t", {"per_row": True})
    float_weights = sum(params[n].nbytes for n in ("fc_w", "gru_w", "out_w"))
    saved = float_weights - param_bytes + sum(p.stat().st_size for p in tables_only.directory.glob("*.pdiparams"))
    assert saved > 0.6 * float_weights  # int8 codes + per-column scales instead of float32


def test_weights_left_float_by_default_and_by_op_type(gru_model, tmp_path):
    model_dir, params = gru_model
    graph = open_graph(load_model(quant_embedding_model(model_dir, tmp_path / "t", {})[0].directory))
    assert {"fc_w", "gru_w", "out_w"} <= set(graph.param_names())
    only_gru = {"weights": {"quantizable_op_type": ["gru"]}}
    graph = open_graph(load_model(quant_embedding_model(model_dir, tmp_path / "g", only_gru)[0].directory))
    names = set(graph.param_names())
    assert {"fc_w", "out_w", "gru_w.quantized"} <= names and "gru_w" not in names


def test_program_api_drops_the_float_weights_from_program_and_scope(gru_model):
    model_dir, _ = gru_model
    model = load_model(model_dir)
    quant_embedding(model.program, paddle.CPUPlace(), {"weights": True}, model.scope)
    for name in ("emb", "fc_w", "gru_w", "out_w"):
        assert model.scope.find_var(name) is None
    assert run_executor(model, feed_ids()).shape == (sum(LENGTHS), 5)


class PirNet(paddle.nn.Layer):
    """Two tables, summed bags, two Linear layers (a PIR model: matmul weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = paddle.nn.Embedding(40, 8, padding_idx=0)
        self.b = paddle.nn.Embedding(30, 8)
        self.fc1 = paddle.nn.Linear(16, 12)
        self.fc2 = paddle.nn.Linear(12, 1)

    def forward(self, a, b):  # type: ignore[no-untyped-def]
        x = paddle.concat([paddle.sum(self.a(a), axis=1), self.b(b)], axis=1)
        return self.fc2(paddle.nn.functional.relu(self.fc1(x)))


def test_pir_model_matmul_weights_one_call(tmp_path):
    paddle.disable_static()
    paddle.seed(5)
    net = PirNet()
    net.eval()
    spec = [paddle.static.InputSpec([None, 4], "int64", "a"), paddle.static.InputSpec([None], "int64", "b")]
    paddle.jit.save(net, str(tmp_path / "f" / "inference"), input_spec=spec)
    weights = {"fc1": net.fc1.weight.numpy(), "fc2": net.fc2.weight.numpy()}
    rng = np.random.default_rng(6)
    feed = {"a": rng.integers(0, 40, (16, 4)), "b": rng.integers(0, 30, (16,))}
    files, reports = quant_embedding_model(tmp_path / "f", tmp_path / "q", {"weights": {"weight_bits": 8}})
    assert len(reports) == 2
    graph = open_graph(load_model(files.directory))
    codes = {n: graph.get_param(n) for n in graph.param_names() if n.endswith(".quantized")}
    assert sorted(c.shape for c in codes.values()) == [(12, 1), (16, 12), (30, 8), (40, 8)]  # weights, tables
    for w in weights.values():
        (c,) = [c for c in codes.values() if c.shape == w.shape]
        np.testing.assert_array_equal(c, np.rint(w / (np.abs(w).max(axis=0) / 127)).astype(np.int8))
    out = run_predictor(create_predictor(files), feed)[0]
    np.testing.assert_allclose(out, graph.run(feed)[0], rtol=0, atol=1e-5)
    float_out = run_predictor(create_predictor(tmp_path / "f"), feed)[0]
    assert 0 < np.abs(out - float_out).max() < 0.02


@pytest.mark.parametrize("weights, message", [
    ({"bits": 8}, "unknown key 'bits' in config['weights']"),
    ({"weight_bits": 4}, "weights.weight_bits=4 is not valid; valid choices: 8, 16"),
    ({"quantizable_op_type": ["lstm"]}, "'lstm' is not valid"),
    ("int8", "weights='int8' is not valid"),
])
def test_bad_weights_key_refused_before_any_work(gru_model, tmp_path, weights, message):
    model_dir, _ = gru_model
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        quant_embedding_model(model_dir, tmp_path / "q", {"weights": weights})
    assert not (tmp_path / "q").exists()
