"""quant_embedding / quant_embedding_model on saved models of every format and in-memory programs."""

from __future__ import annotations

import numpy as np
import paddle
import pytest
from qembed_programs import SAVE_ROUTES, StaticProgram, float_run

from qcore.errors import ConfigError, GraphError
from qcore.graph import open_graph
from qcore.inference import predict
from qcore.model_io import find_model_files, load_model
from qembed import quant_embedding, quant_embedding_model, quantize_table

VOCAB, DIM = 2000, 32  # TinyEmbeddingNet's table in conftest.py


def _params_bytes(files):
    if files.params_file is not None:
        return files.params_file.stat().st_size
    return sum(p.stat().st_size for p in files.directory.iterdir() if p != files.model_file)


# measured output errors (relative L2 vs the float model): 0.031, 0.008 (0.157 on the old power-of-two grid),
# int4: 0.100 unpacked with abs-max rows, 0.097 packed with searched rows (a random table: little to clip)
@pytest.mark.parametrize("config,max_err,ratio", [
    ({"quantize_op_types": ["lookup_table"], "lookup_table": {"quantize_type": "abs_max"}}, 0.05, (0.24, 0.3)),
    ({"lookup_table": {"quantize_type": "log", "per_row": True}}, 0.02, (0.24, 0.3)),
    # two codes a byte, + scale and offset per row (the refined affine grid passes asymmetric="auto"'s rule here)
    ({"quantize_bits": 4, "per_row": True}, 0.1, (0.12, 0.2)),
])
def test_saved_model_runs_quantized_in_executor_and_inference(emb_model, ids, tmp_path, config, max_err, ratio):
    directory, kwargs, fmt = emb_model
    files, (report,) = quant_embedding_model(directory, tmp_path / "q", config, **kwargs)
    assert report.shape == (VOCAB, DIM) and report.op_types == ("lookup_table",)
    assert files.family == find_model_files(directory, **kwargs).family
    assert (files.params_file is None) == (fmt == "legacy_separate")  # the input's file layout is kept
    # the program computes exactly the float model on the dequantized table ...
    expected = float_run(emb_model, ids, report.choice.table.rows(np.arange(VOCAB)))
    quantized = load_model(files)
    np.testing.assert_allclose(quantized.run({"ids": ids})[0], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(predict(files, {"ids": ids})[0], expected, rtol=1e-5, atol=1e-6)
    # ... which is close to the float model
    reference = float_run(emb_model, ids)
    err = np.linalg.norm(expected - reference) / np.linalg.norm(reference)
    assert err < max_err, err
    # and the file holds int8 codes (about 1/4 of the float parameters), or packed int4 ones (about 1/8)
    measured = _params_bytes(files) / _params_bytes(find_model_files(directory, **kwargs))
    assert ratio[0] < measured < ratio[1], measured


def test_abs_max_codes_and_scale_are_hand_computed(emb_model, emb_net, tmp_path):
    directory, kwargs, _ = emb_model
    table = emb_net.emb.weight.numpy()
    _, (report,) = quant_embedding_model(directory, tmp_path / "q", {"params_name": "embedding_0.w_0"}, **kwargs)
    scale = np.abs(table).max() / 127
    np.testing.assert_allclose(report.choice.table.scales, [scale], rtol=1e-6)
    np.testing.assert_array_equal(report.choice.table.codes, np.rint(table / scale).astype(np.int8))
    assert not report.choice.per_row  # the seeds' default: one scale for the table


def test_threshold_clips_and_auto_picks_per_row(emb_model, tmp_path):
    directory, kwargs, _ = emb_model
    _, (clipped,) = quant_embedding_model(directory, tmp_path / "q", {"threshold": 0.1}, **kwargs)
    assert clipped.choice.table.scales[0] == pytest.approx(0.1 / 127, rel=1e-6)
    assert np.abs(clipped.choice.table.rows(np.arange(VOCAB))).max() == pytest.approx(0.1, rel=1e-6)
    _, (auto,) = quant_embedding_model(directory, tmp_path / "q", {"lookup_table": {"per_row": "auto"}}, **kwargs)
    # the hot rows set a coarse step for every row with one scale; per-row scales fix that
    assert auto.choice.per_row and auto.choice.per_row_error < 0.5 * auto.choice.whole_table_error
    assert auto.quantized_bytes == VOCAB * DIM + VOCAB * 4


@pytest.mark.parametrize("family,op_type", [("pir", "embedding"), ("legacy", "lookup_table_v2"),
                                            ("legacy", "lookup_table")])
def test_seed_api_on_an_in_memory_program(family, op_type, static_program):
    p = static_program(family, op_type)
    main, scope, out, exe, guard = p.main, p.scope, p.out, p.exe, p.guard
    word = np.array([[3], [99], [3]], np.int64)
    table = np.array(scope.find_var("emb").get_tensor())
    with guard, paddle.static.scope_guard(scope):
        before = exe.run(main, feed={"word": word}, fetch_list=[out])[0]
        returned = quant_embedding(main, paddle.CPUPlace(), {"params_name": "emb", "quantize_type": "abs_max"}, scope)
        after = exe.run(main, feed={"word": word}, fetch_list=[out])[0]
    assert returned is main
    step = 2.0 * np.abs(table).max() / 127
    assert np.abs(after - before).max() <= step / 2 + 1e-6
    assert not np.array_equal(after, before)
    assert np.array(scope.find_var("emb.quantized").get_tensor()).dtype == np.int8
    assert scope.find_var("emb") is None  # the float table left the scope ...
    persistables = [v.name for v in main.list_vars() if v.persistable] if family == "legacy" else []
    assert "emb" not in persistables  # ... and the program, so save_persistables writes only int8
    paddle.disable_static()


def test_shared_table_is_stored_once(tmp_path, ids):
    class TwoTowers(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.emb = paddle.nn.Embedding(VOCAB, DIM)

        def forward(self, a, b):
            return (self.emb(a) * self.emb(b)).sum(-1)

    paddle.seed(0)
    spec = [paddle.static.InputSpec([None, 6], "int64", n) for n in ("a", "b")]
    paddle.jit.save(TwoTowers(), str(tmp_path / "m" / "inference"), input_spec=spec)
    files, (report,) = quant_embedding_model(tmp_path / "m", tmp_path / "q")
    graph = open_graph(load_model(files.directory))
    assert [n for n in graph.param_names() if graph.get_param(n).shape == (VOCAB, DIM)] == [report.name + ".quantized"]
    np.testing.assert_allclose(
        predict(files, {"a": ids, "b": ids[::-1]})[0], graph.run({"a": ids, "b": ids[::-1]})[0], rtol=1e-5, atol=1e-6
    )


def test_bad_input(emb_model, tmp_path):
    directory, kwargs, _ = emb_model
    with pytest.raises(ConfigError, match="did you mean 'lookup_table'"):
        quant_embedding_model(directory, tmp_path / "q", {"quantize_op_types": ["lookup_tabel"]}, **kwargs)
    with pytest.raises(GraphError, match="'embedding_0_w_0' .*did you mean 'embedding_0.w_0'"):
        quant_embedding_model(directory, tmp_path / "q", {"params_name": "embedding_0_w_0"}, **kwargs)
    for bits in (1, 9, 16):
        with pytest.raises(ConfigError, match="quantize_bits=.*from 2 to 8"):
            quant_embedding_model(directory, tmp_path / "q", {"quantize_bits": bits}, **kwargs)
    with pytest.raises(ConfigError, match="did you mean 'threshold'"):
        quant_embedding_model(directory, tmp_path / "q", {"lookup_table": {"treshold": 1.0}}, **kwargs)
    with pytest.raises(ConfigError, match="threshold"):
        quant_embedding_model(directory, tmp_path / "q", {"threshold": -1}, **kwargs)
    with pytest.raises(ConfigError, match="dtype"):
        quant_embedding_model(directory, tmp_path / "q", {"dtype": "int4"}, **kwargs)
    with pytest.raises(GraphError, match="fused_embedding_seq_pool cannot occur: Paddle 3 no longer registers it"):
        quant_embedding_model(directory, tmp_path / "q", {"quantize_op_types": "fused_embedding_seq_pool"}, **kwargs)
    with pytest.raises(GraphError, match="no pyramid_hash op"):
        quant_embedding_model(directory, tmp_path / "q", {"quantize_op_types": ["pyramid_hash"]}, **kwargs)
    with pytest.raises(GraphError, match="paddle.static.Program"):
        quant_embedding("not a program", None)
    assert not (tmp_path / "q").exists()


def test_pyramid_hash_table_is_stored_int8_and_dequantized_whole(save_params, tmp_path):
    """Paddle 3.3.1's CPU pyramid_hash kernel rejects an int8 W: the table is dequantized in front of it."""
    paddle.enable_static()
    guard = paddle.pir_utils.OldIrGuard()
    with guard:
        main, startup, scope = paddle.static.Program(), paddle.static.Program(), paddle.static.Scope()
        with paddle.static.program_guard(main, startup), paddle.static.scope_guard(scope):
            x = paddle.static.data("x", [None, 1], "int32", lod_level=1)
            out = paddle.incubate.layers.search_pyramid_hash(
                x, num_emb=8, space_len=1000, pyramid_layer=3, rand_len=8, drop_out_percent=0.0,
                is_training=False, use_filter=False, white_list_len=1, black_list_len=1, seed=1, lr=0.0,
                param_attr=paddle.ParamAttr(name="ph_w"),
            )
            exe = paddle.static.Executor(paddle.CPUPlace())
            exe.run(startup)
            table = np.random.default_rng(0).normal(size=(1008, 1)).astype(np.float32)
            scope.var("ph_w").get_tensor().set(table, paddle.CPUPlace())
            with pytest.raises(GraphError, match="pyramid_hash, whose CPU kernel rejects int8.*'abs_max'"):
                quant_embedding(main.clone(), None, {"quantize_type": "log"}, scope)
            quant_embedding(main, None, {"quantize_op_types": ["pyramid_hash"]}, scope)
            (op,) = [op for op in main.global_block().ops if op.type == "pyramid_hash"]
            block = main.global_block()
            (mul,) = [o for o in block.ops if op.input("W")[0] in o.output_arg_names]
            (cast,) = [o for o in block.ops if mul.input("X")[0] in o.output_arg_names]
            assert (mul.type, cast.type) == ("elementwise_mul", "cast")  # not dequantize_linear: see qcore
            assert np.array(scope.find_var(cast.input("X")[0]).get_tensor()).dtype == np.int8
            ids = paddle.base.core.DenseTensor()
            ids.set(np.array([[11], [22], [33], [44]], np.int32), paddle.CPUPlace())
            ids.set_recursive_sequence_lengths([[3, 1]])
            result = np.array(exe.run(main, feed={"x": ids}, fetch_list=[out], return_numpy=False)[0])
            assert result.shape[1] == 8
    for route in SAVE_ROUTES["legacy"]:  # the files keep the int8 table and its one scale
        files = save_params(route, StaticProgram(main, scope, x, out, exe, guard), tmp_path / route)
        assert 1008 + 4 <= sum(files.values()) <= 1008 + 4 + 512 < table.nbytes, files
    paddle.disable_static()


@pytest.mark.parametrize("family", ["pir", "legacy"])
def test_c_embedding_vocabulary_shard(family, tmp_path, save_params):
    """c_embedding (a model-parallel shard: ids outside [start, start + rows) give zeros) rejects int8
    tables on CPU, so its table is dequantized whole; the program runs in the executor and in inference."""
    guard = paddle.pir_utils.OldIrGuard() if family == "legacy" else paddle.pir_utils.IrGuard()
    table = np.random.default_rng(0).normal(0, 0.1, (50, 8)).astype(np.float32)
    ids = np.array([[100, 149], [150, 120]], np.int64)  # the shard holds ids 100..149
    paddle.enable_static()
    with guard:
        main, startup, scope = paddle.static.Program(), paddle.static.Program(), paddle.static.Scope()
        with paddle.static.program_guard(main, startup), paddle.static.scope_guard(scope):
            x = paddle.static.data("ids", [None, 2], "int64")
            w = paddle.static.create_parameter([50, 8], "float32", name="shard")
            if family == "pir":
                looked_up = paddle._C_ops.c_embedding(w, x, 100, 200)
            else:
                looked_up = main.global_block().create_var(name="looked_up", dtype="float32", shape=[-1, 2, 8])
                main.global_block().append_op(
                    type="c_embedding", inputs={"W": [w], "Ids": [x]}, outputs={"Out": [looked_up]},
                    attrs={"start_index": 100, "vocab_size": 200},
                )
            y = looked_up
            exe = paddle.static.Executor(paddle.CPUPlace())
            exe.run(startup)
            scope.var("shard").get_tensor().set(table, paddle.CPUPlace())
            quant_embedding(main, None, {"per_row": True}, scope)
            got = exe.run(main, feed={"ids": ids}, fetch_list=[y])[0]
            paddle.static.save_inference_model(str(tmp_path / "m" / "inference"), [x], [y], exe, program=main)
    for route in SAVE_ROUTES[family]:  # the files keep the int8 table and its scales, not the float table
        files = save_params(route, StaticProgram(main, scope, x, y, exe, guard), tmp_path / route)
        assert 50 * 8 + 50 * 4 <= sum(files.values()) <= 50 * 8 + 50 * 4 + 512 < table.nbytes, files
    paddle.disable_static()
    dequantized = quantize_table(table, per_row=True).dequantize()
    expected = np.stack([dequantized[[0, 49]], np.stack([np.zeros(8), dequantized[20]])])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(predict(find_model_files(tmp_path / "m"), {"ids": ids})[0], expected, rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("fmt", ["pir", "legacy_combined"])
def test_scale_grad_by_freq_embedding_counts_as_lookup_table(fmt, ids, tmp_path):
    """nn.Embedding(scale_grad_by_freq=True) exports embedding_with_scaled_gradient; 'lookup_table' covers it."""
    from qdemo.testing import EMBEDDING_INPUT_SPEC, TinyEmbeddingNet, save_tiny_net

    paddle.seed(0)
    net = TinyEmbeddingNet(VOCAB, DIM, scale_grad_by_freq=True)
    net.eval()
    kwargs = save_tiny_net(net, tmp_path / "m", fmt, EMBEDDING_INPUT_SPEC)
    files, (report,) = quant_embedding_model(tmp_path / "m", tmp_path / "q", {"quantize_op_types": ["lookup_table"]},
                                             **kwargs)
    assert report.op_types == ("embedding_with_scaled_gradient",) and not report.whole_table
    reference = net(paddle.to_tensor(ids)).numpy()
    deployed = predict(files, {"ids": ids})[0]
    assert np.linalg.norm(deployed - reference) / np.linalg.norm(reference) < 0.02
