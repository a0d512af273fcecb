from __future__ import annotations

from pathlib import Path

import numpy as np
import paddle
import pytest

from qcore.errors import ConfigError
from qcore.observers import MovingAverageAbsMaxObserver, RangeAbsMaxObserver
from qcore.quant import fake_quantize
from qqat import __version__, fake_quantize_ste, pact_clip
from qqat.quanters import FakeQuanter


def _t(values, grad: bool = False) -> paddle.Tensor:
    x = paddle.to_tensor(np.asarray(values, dtype=np.float32))
    x.stop_gradient = not grad
    return x


def test_version() -> None:
    assert __version__ == (Path(__file__).resolve().parents[3] / "VERSION").read_text(encoding="utf-8").strip()


def test_forward_hand_example() -> None:
    out = fake_quantize_ste(_t([-1.0, 0.5, 0.25]), 1.0, bits=8).numpy()
    np.testing.assert_allclose(out, [-1.0, 64 / 127, 32 / 127], rtol=0, atol=1e-7)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_forward_matches_qcore(bits: int) -> None:
    rng = np.random.default_rng(bits)
    x = rng.normal(0.0, 1.5, size=64).astype(np.float32)
    threshold = 2.0
    clipped = np.clip(x, -threshold, threshold)
    expected = fake_quantize(clipped, threshold, bits)
    out = fake_quantize_ste(_t(x), threshold, bits=bits).numpy()
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-6)
    # a tensor threshold gives the same result
    out_t = fake_quantize_ste(_t(x), _t(threshold), bits=bits).numpy()
    np.testing.assert_allclose(out_t, expected, rtol=0, atol=1e-6)


def test_zero_threshold_gives_zeros() -> None:
    out = fake_quantize_ste(_t([0.0, 0.0]), 0.0).numpy()
    np.testing.assert_array_equal(out, [0.0, 0.0])


def test_ste_gradient_is_in_range_mask() -> None:
    values = [-3.0, -1.5, -0.7, 0.0, 0.3, 1.2, 2.5]
    x = _t(values, grad=True)
    fake_quantize_ste(x, 1.0).sum().backward()
    expected = (np.abs(np.asarray(values)) <= 1.0).astype(np.float32)
    np.testing.assert_array_equal(x.grad.numpy(), expected)


def test_pact_forward_and_alpha_gradient() -> None:
    values = np.array([-3.0, -2.0, -0.5, 0.0, 0.4, 1.5, 2.0, 4.0], dtype=np.float32)
    alpha = _t([1.0], grad=True)
    x = _t(values, grad=True)
    out = pact_clip(x, alpha)
    np.testing.assert_allclose(out.numpy(), np.clip(values, -1.0, 1.0))
    out.sum().backward()
    expected_alpha = int((values > 1.0).sum()) - int((values < -1.0).sum())
    np.testing.assert_allclose(alpha.grad.numpy(), [float(expected_alpha)])
    np.testing.assert_array_equal(x.grad.numpy(), (np.abs(values) <= 1.0).astype(np.float32))


def test_pact_alpha_learns_larger_clip() -> None:
    values = np.array([-3.0, -2.0, -0.5, 0.3, 2.5, 3.5], dtype=np.float32)
    x = _t(values)
    alpha = paddle.create_parameter([1], "float32", default_initializer=paddle.nn.initializer.Constant(1.0))
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=[alpha])
    start = float(alpha.numpy()[0])
    for _ in range(5):
        # clipping loses the tails, so this reconstruction loss prefers a larger alpha
        loss = ((pact_clip(x, alpha) - x) ** 2).mean()
        loss.backward()
        opt.step()
        opt.clear_grad()
    assert float(alpha.numpy()[0]) - start > 1e-3


@pytest.mark.parametrize("bits", [0, 1, 17, 8.0, True])
def test_bad_bits_raise_config_error(bits) -> None:
    with pytest.raises(ConfigError):
        fake_quantize_ste(_t([0.1]), 1.0, bits=bits)


@pytest.mark.parametrize(("kind", "observer"), [
    ("moving_average_abs_max", MovingAverageAbsMaxObserver(moving_rate=0.8)),
    ("range_abs_max", RangeAbsMaxObserver(window_size=3)),
])
def test_training_quanters_keep_the_threshold_qcores_observers_compute(kind, observer) -> None:
    """QAT's stateful quanters and qcore's observers are one model of the statistic: same batches, same threshold."""
    quanter = FakeQuanter(kind, 8, moving_rate=0.8, window_size=3)
    quanter.train()
    rng = np.random.default_rng(4)
    for scale in (1.0, 5.0, 0.5, 2.0, 0.25):
        batch = (rng.standard_normal((4, 3, 5, 5)) * scale).astype("float32")
        quanter(paddle.to_tensor(batch))
        observer.update(batch)
        assert float(quanter.export_threshold()[0]) == pytest.approx(observer.threshold(), rel=1e-6)
