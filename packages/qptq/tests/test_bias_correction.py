from __future__ import annotations

import numpy as np
import paddle
import pytest

from qcore.model_io import load_model
from qcore.quant import fake_quantize
from qptq import PostTrainingQuantization
from qptq.bias_correction import output_shift
from qptq.calibrate import ChannelMean


def _rounded(w: np.ndarray, bits: int = 4) -> np.ndarray:
    thr = np.abs(w).reshape(w.shape[0], -1).max(1)
    return fake_quantize(w, thr, bits, axis=0)


@pytest.mark.parametrize("groups", [1, 4])
def test_conv_shift_equals_measured_output_change(groups):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 8 // groups, 3, 3)).astype("float32")
    wq = _rounded(w)
    channel = rng.standard_normal((16, 8, 1, 1)).astype("float32") + 2.0  # spatially constant per channel
    x = np.broadcast_to(channel, (16, 8, 6, 6)).copy()

    def conv(weight):
        return paddle.nn.functional.conv2d(paddle.to_tensor(x), paddle.to_tensor(weight), groups=groups).numpy()

    measured = (conv(wq) - conv(w)).mean(axis=(0, 2, 3))
    mean = ChannelMean(axis=1)
    mean.update(x)
    np.testing.assert_allclose(output_shift(w, wq, mean.mean, conv=True), measured, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("transposed", [False, True])
def test_matmul_shift(transposed):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((12, 5)).astype("float32")
    wq = _rounded(w)
    x = rng.standard_normal((64, 3, 12)) + 1.0
    measured = (x @ wq - x @ w).reshape(-1, 5).mean(0)
    mean = ChannelMean(axis=-1)
    mean.update(x[:20])
    mean.merge(_mean_of(x[20:]))  # two workers' statistics combine
    np.testing.assert_allclose(mean.mean, x.reshape(-1, 12).mean(0))
    got = output_shift(w.T, wq.T, mean.mean, conv=False, transposed=True) if transposed else output_shift(
        w, wq, mean.mean, conv=False)
    np.testing.assert_allclose(got, measured, rtol=1e-6)


def _mean_of(x: np.ndarray) -> ChannelMean:
    m = ChannelMean(axis=-1)
    m.update(x)
    return m


def test_bias_correction_removes_mean_logit_shift_on_the_demo(demo_model, demo_data):
    """4-bit weights shift the demo's logits; correcting the biases shrinks the shift."""
    directory, _ = demo_model
    calib, x, y = demo_data
    reference = load_model(directory).run({"image": x})[0]
    shifts, reports = {}, {}
    for corrected in (False, True):
        ptq = PostTrainingQuantization(
            model_dir=directory, sample_generator=lambda: iter(calib), batch_size=20, algo="abs_max",
            weight_bits=4, activation_bits=16, optimize_model=True, bias_correction=corrected,
            deploy_backend="native",  # a simulation-only model: no int8 runtime runs these widths
        )
        ptq.quantize()
        logits = ptq.graph.run({"image": x})[0]
        shifts[corrected] = np.abs((logits - reference).mean(0)).mean()
        weights = [layer["weight"] for layer in ptq.report["layers"] if "weight" in layer]
        reports[corrected] = [w.get("bias_shift_max") for w in weights]
    assert all(v is None for v in reports[False])
    assert sum(v is not None and v > 0 for v in reports[True]) >= 3  # conv, depthwise, fc corrected
    assert shifts[True] < 0.8 * shifts[False], shifts  # measured 0.60 -> 0.42 (legacy)
