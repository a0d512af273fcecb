"""Top-1 accuracy of a saved model, as the executor simulates it and as Paddle Inference runs it."""

from __future__ import annotations

import numpy as np

from qcore.inference import create_predictor, run_predictor
from qcore.model_io import ModelFiles, load_model


def executor_outputs(files: ModelFiles, feed_name: str, x: np.ndarray, batch: int = 250) -> np.ndarray:
    """First output of the model over ``x``, run in ``paddle.static.Executor``."""
    model = load_model(files)
    return np.concatenate([model.run({feed_name: x[i : i + batch]})[0] for i in range(0, len(x), batch)])


def deployed_outputs(
    files: ModelFiles, feed_name: str, x: np.ndarray, backend: str | None = None, batch: int = 250
) -> np.ndarray:
    """First output of the model over ``x``, run in ``paddle.inference`` on ``backend`` (default oneDNN int8)."""
    predictor = create_predictor(files, backend=backend or "onednn")
    return np.concatenate([run_predictor(predictor, {feed_name: x[i : i + batch]})[0] for i in range(0, len(x), batch)])


def top1(logits: np.ndarray, labels: np.ndarray) -> float:
    """Percent of rows whose arg-max equals the label."""
    return float((logits.argmax(-1) == labels.reshape(-1)).mean() * 100)


def agreement(a: np.ndarray, b: np.ndarray) -> float:
    """Percent of rows on which two models pick the same class."""
    return float((a.argmax(-1) == b.argmax(-1)).mean() * 100)
