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
