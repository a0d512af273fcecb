"""Quantization-aware fine-tuning of the bundled demo CNN (used by ``qcli qat``, tests, benchmarks).

:func:`finetune_demo` starts from the 86.0 % float weights (:func:`qdemo.net.load_demo_net`),
wraps the network with :class:`~qqat.QAT` and trains it with Adam on the demo train split.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import paddle

from qqat import QAT

from . import INPUT_NAME, INPUT_SHAPE, load_demo_data
from .net import load_demo_net

DEMO_INPUT_SPEC = [paddle.static.InputSpec([None, *INPUT_SHAPE], "float32", INPUT_NAME)]


def finetune_demo(
    config: Mapping[str, Any] | None = None,
    steps: int = 300,
    *,
    lr: float = 1e-4,
    batch_size: int = 64,
    seed: int = 0,
) -> tuple[QAT, paddle.nn.Layer, float]:
    """QAT-train the demo CNN for ``steps`` Adam steps; returns (QAT, model in eval mode, seconds)."""
    paddle.seed(seed)
    net = load_demo_net("pir")
    qat = QAT(config)
    qat.quantize(net)
    x, y = load_demo_data("train")
    rng = np.random.default_rng(seed)
    opt = paddle.optimizer.Adam(learning_rate=lr, parameters=net.parameters())
    net.train()
    start = time.perf_counter()
    for _ in range(steps):
        idx = rng.integers(0, len(x), batch_size)
        loss = paddle.nn.functional.cross_entropy(net(paddle.to_tensor(x[idx])), paddle.to_tensor(y[idx]))
        loss.backward()
        opt.step()
        opt.clear_grad()
    net.eval()
    return qat, net, time.perf_counter() - start


def predict_dygraph(model: paddle.nn.Layer, x: np.ndarray, batch_size: int = 500) -> np.ndarray:
    """Logits of ``model`` (eval mode, no grad) over ``x`` in batches."""
    model.eval()
    with paddle.no_grad():
        parts = [model(paddle.to_tensor(x[i : i + batch_size])).numpy() for i in range(0, len(x), batch_size)]
    return np.concatenate(parts)
