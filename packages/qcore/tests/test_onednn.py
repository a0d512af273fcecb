from __future__ import annotations

import numpy as np
import paddle
import pytest

from qcore.deploy.onednn import clipping_avg_pools, deployed_fc_weight, deployed_thresholds, fc_int8_error
from qcore.graph import open_graph
from qcore.model_io import load_model
from qdemo.testing import TinyResNet


def test_run_scales_clip_columns_whose_max_exceeds_their_run():
    # K=2, N=3: runs (flat pairs) are [w00, w01], [w02, w10], [w11, w12]
    w = np.array([[1.0, 0.5, 0.1], [0.2, 0.05, 0.01]], dtype=np.float32)
    got = deployed_fc_weight(w)
    # column 2 gets run 2's max 0.05: 0.1 is clipped to 0.05, 0.01 survives on a 0.05/127 grid
    np.testing.assert_allclose(got[:, 2], [0.05, np.round(0.01 / 0.05 * 127) * 0.05 / 127], rtol=1e-6)
    np.testing.assert_allclose(got[:, 0], np.round(w[:, 0] / 1.0 * 127) / 127, rtol=1e-6)  # run 0 max = 1.0


def test_errors_flag_square_per_channel_and_pass_uniform_columns():
    rng = np.random.default_rng(0)
    square = rng.standard_normal((4, 4)).astype(np.float32)
    assert fc_int8_error(square, square)[1] == float("inf")
    runs = np.linalg.norm(deployed_fc_weight(square) - square) / np.linalg.norm(square)
    assert fc_int8_error(square, square, per_channel=False)[1] == np.float32(runs)  # one scale: only the runs
    uniform = rng.uniform(-1, 1, (64, 16)).astype(np.float32)  # every run and column has max ~1
    ours, deployed = fc_int8_error(uniform, uniform)
    assert ours == 0 and deployed < 0.01


def test_int8_weight_problem_on_graphs(tmp_path):
    from qcore.deploy.onednn import int8_weight_problem

    class Net(paddle.nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.square = paddle.nn.Linear(8, 8)
            self.wide = paddle.nn.Linear(8, 3)
            self.up = paddle.nn.Conv2DTranspose(1, 2, 2)

        def forward(self, x):
            return self.wide(self.square(x)), self.up(paddle.reshape(x, [-1, 1, 2, 4]))

    net = Net()
    # columns 100x apart in scale: fixed, so the verdict does not depend on the random init
    wide_weight = np.random.default_rng(0).standard_normal((8, 3)) * np.array([1.0, 0.1, 0.01])
    net.wide.weight.set_value(wide_weight.astype("float32"))
    spec = [paddle.static.InputSpec([None, 8], "float32", "x")]
    with paddle.pir_utils.DygraphOldIrGuard():
        paddle.jit.save(net, str(tmp_path / "legacy" / "m"), input_spec=spec)
    paddle.jit.save(net, str(tmp_path / "pir" / "m"), input_spec=spec)
    legacy = open_graph(load_model(tmp_path / "legacy"))
    square, wide = legacy.ops(["mul"])
    assert "wrong axis" in int8_weight_problem(legacy, square)
    problem = int8_weight_problem(legacy, wide)
    assert "K-element runs" in problem
    deployed = float(problem.split("with ")[1].split("%")[0]) / 100
    assert int8_weight_problem(legacy, wide, tolerance=deployed) is None
    assert "conv2d_transpose" in int8_weight_problem(legacy, legacy.ops(["conv2d_transpose"])[0])
    pir = open_graph(load_model(tmp_path / "pir"))
    assert all(int8_weight_problem(pir, op) is None for op in pir.ops(["mul", "conv2d_transpose"]))


class PoolChain(paddle.nn.Layer):
    """conv -> hardswish -> global avg pool -> conv, and a max-pool + concat branch."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = paddle.nn.Conv2D(3, 4, 3, padding=1)
        self.squeeze = paddle.nn.Conv2D(4, 4, 1)
        self.head = paddle.nn.Conv2D(8, 2, 1)

    def forward(self, x):
        features = paddle.nn.functional.hardswish(self.conv(x))
        gate = self.squeeze(paddle.nn.functional.adaptive_avg_pool2d(features, 1))
        pooled = paddle.nn.functional.max_pool2d(features, 2)
        return gate, self.head(paddle.concat([pooled, pooled * 2.0], axis=1))


@pytest.fixture(scope="module")
def pool_graphs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pools")
    spec = [paddle.static.InputSpec([None, 3, 8, 8], "float32", "x")]
    with paddle.pir_utils.DygraphOldIrGuard():
        paddle.jit.save(PoolChain(), str(root / "legacy" / "m"), input_spec=spec)
    paddle.jit.save(PoolChain(), str(root / "pir" / "m"), input_spec=spec)
    return open_graph(load_model(root / "legacy")), open_graph(load_model(root / "pir"))


def _io(graph, seed_type):
    """(input var, output var) of every op of ``seed_type`` in a legacy graph."""
    ops = [op for op in graph.ops() if op.type == seed_type]
    return [(op.raw.input_arg_names[0], op.raw.output_arg_names[0]) for op in ops]


def test_scales_propagate_like_the_onednn_pass(pool_graphs):
    legacy, _ = pool_graphs
    (avg_in, avg_out), (max_in, max_out) = _io(legacy, "pool2d")
    assert avg_in == max_in  # both pools read the hardswish output
    concat = next(op for op in legacy.ops() if op.type == "concat")
    concat_out, concat_ins = concat.raw.output("Out")[0], concat.raw.input("X")
    # only the squeeze conv's input is QDQ'd: the avg pool's input inherits its (narrow) scale
    # backwards, and so does the max pool's output, forwards from that input
    got = deployed_thresholds(legacy, {avg_out: 0.5})
    assert got[avg_in] == 0.5 and got[max_out] == 0.5
    # an input with its own scale overwrites the outputs; a concat output overwrites its inputs
    got = deployed_thresholds(legacy, {avg_in: 6.0, avg_out: 0.5, concat_out: 9.0, concat_ins[1]: 3.0})
    assert got[avg_out] == 6.0 and got[max_out] == 9.0 and got[concat_ins[1]] == 9.0


def test_avg_pools_quantized_only_on_the_output_side_are_found(pool_graphs):
    legacy, pir = pool_graphs
    (avg_in, avg_out), (_, max_out) = _io(legacy, "pool2d")
    found = clipping_avg_pools(legacy, [avg_out])
    assert [(p.input, p.output, p.is_global) for p in found] == [(avg_in, avg_out, True)]
    assert clipping_avg_pools(legacy, [avg_out, avg_in]) == []  # input has its own scale
    assert clipping_avg_pools(legacy, [max_out]) == []  # a max pool never clips what it keeps
    names = {"anything": 1.0}
    assert deployed_thresholds(pir, names) == names and clipping_avg_pools(pir, ["anything"]) == []


def test_int8_problem_names_the_readers_of_a_clipping_pool(pool_graphs):
    from qcore.deploy.onednn import POOL_READER_REASON, int8_problem

    legacy, _ = pool_graphs
    (_, avg_out), _ = _io(legacy, "pool2d")
    conv, squeeze, head = legacy.ops(["conv2d"])
    pool_outputs = {p.output for p in clipping_avg_pools(legacy, [avg_out])}
    assert int8_problem(legacy, squeeze, float_inputs=pool_outputs) == POOL_READER_REASON
    assert int8_problem(legacy, conv, float_inputs=pool_outputs) is None
    assert int8_problem(legacy, head, float_inputs=pool_outputs) is None
    assert int8_problem(legacy, squeeze) is None  # nothing to keep float


class PoolHead(paddle.nn.Layer):
    """PP-OCR cls's head: hardswish -> max pool -> global avg pool -> reshape -> fc."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = paddle.nn.Conv2D(3, 4, 3, padding=1)
        self.fc = paddle.nn.Linear(4, 2)
        self.fc.weight.set_value(np.full((4, 2), 0.5, "float32"))  # equal columns: no fc weight problem

    def forward(self, x):
        pooled = paddle.nn.functional.max_pool2d(paddle.nn.functional.hardswish(self.conv(x)), 2)
        return self.fc(paddle.reshape(paddle.nn.functional.adaptive_avg_pool2d(pooled, 1), [-1, 4]))


def test_a_pool_scaled_through_a_reshape_keeps_the_fc_behind_it_float(tmp_path):
    from qcore.deploy.onednn import POOL_READER_REASON, int8_problem

    spec = [paddle.static.InputSpec([None, 3, 8, 8], "float32", "x")]
    with paddle.pir_utils.DygraphOldIrGuard():
        paddle.jit.save(PoolHead(), str(tmp_path / "m"), input_spec=spec)
    graph = open_graph(load_model(tmp_path))
    (fc,) = graph.ops(["mul"])
    (fc_input,) = [a.name for a in graph.activation_operands(fc)]
    (pool,) = clipping_avg_pools(graph, [fc_input])  # the max pool shares the avg pool's scale: not a second find
    assert pool.is_global and pool.scale_from == fc_input != pool.output
    assert int8_problem(graph, fc, float_inputs={pool.scale_from}) == POOL_READER_REASON


def test_residual_fusions_name_the_conv_onednn_computes_each_add_in(tmp_path):
    from qcore.deploy.residual import residual_fusions
    from qdemo.testing import TinyResNet, save_tiny_net

    paddle.seed(0)
    save_tiny_net(TinyResNet(), tmp_path / "legacy", "legacy_pdmodel")
    save_tiny_net(TinyResNet(), tmp_path / "pir", "pir")
    graph = open_graph(load_model(tmp_path / "legacy"))
    convs = graph.ops(["conv2d"])
    weights = {graph.weight_operand(c).name: c for c in convs}
    stem, id0, id1, pr0, pr1, short = (weights[f"conv2d_{i}.w_0"] for i in (0, 1, 2, 3, 4, 5))

    def reading(op_type, var, slot="Out"):  # the output of the op_type op that reads var
        return next(o.raw.output(slot)[0] for o in graph.ops() if o.type == op_type and var in o.raw.input_arg_names)

    def normed(conv):  # the batch norm's output after a conv
        return reading("batch_norm", conv.raw.output("Output")[0], "Y")

    identity, projection = residual_fusions(graph)
    # identity block: the second conv takes the block input (the stem's relu output) as residual
    assert identity.conv == id1 and identity.residual == reading("relu", normed(stem))
    assert identity.output == reading("relu", identity.add.raw.output("Out")[0])  # the relu is fused too
    # projection block: the main branch's second conv is fused, the shortcut conv's output is the residual
    assert projection.conv == pr1 and projection.residual == normed(short)
    assert residual_fusions(open_graph(load_model(tmp_path / "pir"))) == []


class _IdentityBlock(paddle.nn.Layer):
    """relu(x + conv-bn(relu(conv-bn(x)))): reads the block before it as its residual."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.units = paddle.nn.LayerList([
            paddle.nn.Sequential(paddle.nn.Conv2D(channels, channels, 3, padding=1, bias_attr=False),
                                 paddle.nn.BatchNorm2D(channels))
            for _ in range(2)
        ])

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return paddle.nn.functional.relu(x + self.units[1](paddle.nn.functional.relu(self.units[0](x))))


def test_residual_signs_are_aligned_down_the_chain_without_changing_values(tmp_path):
    from qcore.deploy.onednn import (
        RESIDUAL_CONV_REASON,
        TARGET,
        OneDnnRules,
        align_residual_signs,
        float_residual_convs,
        unsigned_activations,
    )
    from qcore.deploy.residual import residual_fusions
    from qdemo.testing import TinyResNet, save_tiny_net

    paddle.seed(0)
    save_tiny_net(paddle.nn.Sequential(TinyResNet(), _IdentityBlock(16)), tmp_path / "legacy", "legacy_pdmodel")
    save_tiny_net(TinyResNet(), tmp_path / "pir", "pir")
    graph = open_graph(load_model(tmp_path / "legacy"))
    x = np.random.default_rng(0).standard_normal((2, 1, 8, 8)).astype("float32")
    before = graph.run({"x": x})[0]
    identity, projection, after_projection = residual_fusions(graph)
    every_input = [a.name for op in graph.ops(["conv2d"]) for a in graph.activation_operands(op)]
    every_input += [f.residual for f in (identity, projection, after_projection)]
    unscaled_output = after_projection.conv.raw  # writes the model's output: no scale for it
    assert [c.raw for c in float_residual_convs(graph, every_input)] == [projection.conv.raw, unscaled_output]

    rewritten = align_residual_signs(graph)
    # the projection block's relu (signed shortcut), then the next block's (its residual is now signed)
    assert rewritten == [projection.output, after_projection.output]
    assert graph.op_types().count("leaky_relu") == 2 and graph.op_types().count("relu") == 5
    assert all(op.raw.attr("alpha") == 0.0 for op in graph.ops() if op.type == "leaky_relu")
    unsigned = unsigned_activations(graph)
    assert identity.output in unsigned and identity.residual in unsigned  # u8 on both sides: left alone
    assert [c.raw for c in float_residual_convs(graph, every_input)] == [unscaled_output]
    np.testing.assert_array_equal(graph.run({"x": x})[0], before)
    assert align_residual_signs(graph) == []  # nothing left to do

    fresh = open_graph(load_model(tmp_path / "legacy"))
    _, projection, after_projection = residual_fusions(fresh)
    rules = OneDnnRules(TARGET, fresh, every_input)  # the same, bundled
    assert rules.rewrites == {} and fresh.op_types() == open_graph(load_model(tmp_path / "legacy")).op_types()
    rules.prepare()  # building the rules changes nothing; preparing them is the explicit step that edits
    assert rules.rewrites["relus_written_as_leaky"] == rewritten and rules.unsigned == unsigned
    assert rules.problem(projection.conv, 8, True) is None
    assert rules.problem(after_projection.conv, 8, True) == "onednn: " + RESIDUAL_CONV_REASON
    assert align_residual_signs(open_graph(load_model(tmp_path / "pir"))) == []


def test_only_relus_are_written_as_leaky(tmp_path):
    from qcore.deploy.onednn import write_relu_as_leaky
    from qcore.errors import GraphError
    from qdemo.testing import TinyResNet, save_tiny_net

    save_tiny_net(TinyResNet(), tmp_path / "legacy", "legacy_pdmodel")
    graph = open_graph(load_model(tmp_path / "legacy"))
    with pytest.raises(GraphError, match="not a relu"):
        write_relu_as_leaky(graph, graph.ops(["conv2d"])[0])


class _PooledHead(paddle.nn.Layer):
    """Global average pool of a TinyResNet, then an fc through flatten (no shared scale) or reshape2 (shared)."""

    def __init__(self, reshape: bool) -> None:
        super().__init__()
        self.body, self.fc, self.reshape = TinyResNet(), paddle.nn.Linear(16, 4), reshape

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        pooled = paddle.nn.functional.adaptive_avg_pool2d(self.body(x), 1)
        return self.fc(paddle.reshape(pooled, [-1, 16]) if self.reshape else paddle.flatten(pooled, 1))


def test_the_pool_reading_the_last_residual_conv_can_give_it_an_output_scale(tmp_path):
    from qcore.deploy.onednn import keep_float_in_onednn, pooled_residual_outputs
    from qcore.deploy.residual import residual_fusions
    from qcore.errors import GraphError
    from qdemo.testing import save_tiny_net

    paddle.seed(0)
    for reshape in (False, True):
        save_tiny_net(_PooledHead(reshape), tmp_path / f"legacy{reshape}", "legacy_pdmodel")
    save_tiny_net(_PooledHead(False), tmp_path / "pir", "pir")
    flat, shaped = (open_graph(load_model(tmp_path / f"legacy{r}")) for r in (False, True))

    def quantized_inputs(graph):  # what qptq quantizes: conv and fc inputs, residuals
        names = [a.name for op in graph.ops(["conv2d", "mul", "matmul_v2"]) for a in graph.activation_operands(op)]
        return names + [f.residual for f in residual_fusions(graph)]

    (found,) = pooled_residual_outputs(flat, quantized_inputs(flat))
    assert found.fusion == residual_fusions(flat)[-1] and [p.type for p in found.pools] == ["pool2d"]
    assert found.pools[0].raw.input("X") == [found.fusion.output]
    # through reshape2 the fc input's scale reaches the pool output: quantizing the pool input would change it
    assert pooled_residual_outputs(shaped, quantized_inputs(shaped)) == []
    assert pooled_residual_outputs(open_graph(load_model(tmp_path / "pir")), []) == []

    keep_float_in_onednn(flat, found.pools[0])
    assert found.pools[0].raw.attr("skip_quant") == 1
    pir = open_graph(load_model(tmp_path / "pir"))
    with pytest.raises(GraphError, match="legacy programs only"):
        keep_float_in_onednn(pir, pir.ops()[0])
