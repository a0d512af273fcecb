from __future__ import annotations

import numpy as np

from qcore.onednn import deployed_fc_weight, fc_int8_error


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
    import paddle

    from qcore.graph import open_graph
    from qcore.model_io import load_model
    from qcore.onednn import int8_weight_problem

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
