"""PaddleSlim 2.6's advanced names: GPTQ(layer) + fasterquant() and AutoClip(model) + auto_clip(), as its scripts
call them, checked against this package's algorithms on the same recorded inputs."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from qcore.errors import ConfigError, DataError
from qcore.groupwise import quantize_groups
from qptq.advanced import GPTQ, AutoClip
from qptq.weight_only.clip_search import search_clip
from qptq.weight_only.gptq import gptq


class Mlp(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.up = paddle.nn.Linear(64, 128)
        self.down = paddle.nn.Linear(128, 64, bias_attr=False)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.down(paddle.nn.functional.relu(self.up(x)))


def _model() -> Mlp:
    paddle.seed(0)
    model = Mlp()
    model.eval()
    return model


def _batches() -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    scale = np.ones(64, np.float32)
    scale[[3, 17]] = 15.0  # outlier channels, as LLM hidden states have
    return [rng.standard_normal((2, t, 64)).astype("float32") * scale for t in (7, 12, 5, 9)]


def _hessian(x: np.ndarray) -> np.ndarray:
    rows = x.reshape(-1, x.shape[-1]).astype(np.float64)
    return 2 * rows.T @ rows / rows.shape[0]


def _out_error(weight: np.ndarray, reference: np.ndarray, x: np.ndarray) -> float:
    rows = x.reshape(-1, x.shape[-1])
    return float(np.sum((rows @ (weight - reference)) ** 2))


@pytest.mark.parametrize("in_place", [True, False])
def test_gptq_writes_the_codes_gptq_chooses_for_the_recorded_inputs(in_place):
    model = _model()
    float_w = model.up.weight.numpy().copy()
    wrapped = GPTQ(model.up)
    if in_place:  # PaddleNLP's loop puts the wrapper into the model; PaddleSlim's docs keep the object aside
        model.up = wrapped
    batches = _batches()
    with paddle.no_grad():
        for x in batches:
            model(paddle.to_tensor(x))
    assert wrapped.nsamples == sum(x.shape[0] * x.shape[1] for x in batches)  # every row once
    wrapped.fasterquant(groupsize=32, percdamp=0.05)

    x = np.concatenate([b.reshape(-1, 64) for b in batches])
    expected = gptq(float_w, _hessian(x), 4, 32, symmetric=True, damp=0.05, act_order=True).dequantize()
    np.testing.assert_allclose(wrapped.layer.weight.numpy(), expected, rtol=0, atol=1e-6)
    assert np.unique(wrapped.codes.codes).size <= 15  # symmetric 4-bit: codes in [-7, 7]
    rtn = quantize_groups(float_w, 4, 32, symmetric=True).dequantize()
    assert _out_error(expected, float_w, x) < 0.8 * _out_error(rtn, float_w, x)

    with paddle.no_grad():  # recording stopped: the quantized layer still computes, and nothing is added
        model(paddle.to_tensor(batches[0]))
    assert wrapped.nsamples == x.shape[0]


def test_gptq_refuses_what_it_cannot_do_in_one_line():
    model = _model()
    with pytest.raises(ConfigError, match="paddle.nn.Linear"):
        GPTQ(model)
    with pytest.raises(ConfigError, match="abs_max_channel_wise"):
        GPTQ(model.up, weight_quant_method="avg")
    with pytest.raises(DataError, match="run the model on data"):
        GPTQ(model.up).fasterquant()
    wrapped = GPTQ(model.up)
    with paddle.no_grad():
        model(paddle.to_tensor(_batches()[0]))
    with pytest.raises(ConfigError, match="does not divide"):
        wrapped.fasterquant(groupsize=48)


def test_auto_clip_clips_each_group_to_the_searched_share_of_its_range():
    model = _model()
    float_w = {n: layer.weight.numpy().copy() for n, layer in (("up", model.up), ("down", model.down))}
    clip = AutoClip(model, weight_bits=4, n_grid=10, max_shrink=0.5)
    batches = _batches()
    inputs = {"up": [], "down": []}
    with paddle.no_grad():
        for x in batches:
            model(paddle.to_tensor(x))
            inputs["up"].append(x.reshape(-1, 64))
            up = x.reshape(-1, 64) @ float_w["up"] + model.up.bias.numpy()
            inputs["down"].append(np.maximum(up, 0))
    clip.auto_clip(group_size=32)

    assert clip.ratios == (1.0, 0.9, 0.8, 0.7, 0.6)
    for name, layer in (("up", model.up), ("down", model.down)):
        x = np.concatenate(inputs[name])
        w = float_w[name]
        ratio = search_clip(w, _hessian(x), 4, 32, True, clip.ratios)
        np.testing.assert_array_equal(clip.ratio[name], ratio)
        groups = w.reshape(w.shape[0] // 32, 32, -1)
        bound = np.abs(groups).max(axis=1) * ratio
        got = layer.weight.numpy().reshape(groups.shape)
        np.testing.assert_allclose(np.abs(got).max(axis=1), bound, rtol=1e-6)
        assert np.any(ratio < 1)  # outlier inputs make some clip pay
        clipped_rtn = quantize_groups(layer.weight.numpy(), 4, 32, symmetric=True).dequantize()
        plain_rtn = quantize_groups(w, 4, 32, symmetric=True).dequantize()
        assert _out_error(clipped_rtn, w, x) < _out_error(plain_rtn, w, x)


def test_auto_clip_refuses_other_losses_and_unreached_models():
    with pytest.raises(ConfigError, match="loss_function"):
        AutoClip(_model(), loss_function=lambda a, b: 0.0)
    with pytest.raises(DataError, match="no calibration inputs"):
        AutoClip(_model()).auto_clip()
