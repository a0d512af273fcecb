from __future__ import annotations

import numpy as np
import paddle
import pytest

from qcore.demo import load_demo_data
from qcore.demo_net import load_demo_net
from qqat import QAT

IMAGE_SPEC = [paddle.static.InputSpec([None, 1, 28, 28], "float32", "image")]


def train_steps(model: paddle.nn.Layer, steps: int, lr: float = 1e-4, batch: int = 64, seed: int = 0) -> None:
    """``steps`` Adam steps on random batches of the demo train split."""
    x, y = load_demo_data("train")
    rng = np.random.default_rng(seed)
    opt = paddle.optimizer.Adam(learning_rate=lr, parameters=model.parameters())
    model.train()
    for _ in range(steps):
        idx = rng.integers(0, len(x), batch)
        loss = paddle.nn.functional.cross_entropy(model(paddle.to_tensor(x[idx])), paddle.to_tensor(y[idx]))
        loss.backward()
        opt.step()
        opt.clear_grad()
    model.eval()


def logits(model: paddle.nn.Layer, x: np.ndarray) -> np.ndarray:
    model.eval()
    with paddle.no_grad():
        return np.concatenate([model(paddle.to_tensor(x[i : i + 500])).numpy() for i in range(0, len(x), 500)])


@pytest.fixture(scope="session")
def demo_test() -> tuple[np.ndarray, np.ndarray]:
    return load_demo_data("test")


@pytest.fixture(scope="session")
def trained_qat(demo_test):
    """The demo CNN after 300 QAT steps (batch 64) from the float weights, and its QAT object."""
    paddle.seed(0)
    net = load_demo_net("pir")
    qat = QAT()
    qat.quantize(net)
    train_steps(net, 300)
    return qat, net
