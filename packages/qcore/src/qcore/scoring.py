"""Scoring outputs and timing predictors: pure measurement, no predictor is built here.

:func:`top1`, :func:`agreement` and :func:`relative_error` compare arrays; :func:`interleaved_latency`
times predictors already built (by :func:`qcore.inference.create_predictor`), their runs interleaved.
:mod:`qcore.verify`, ``qcli`` and the benchmarks score with these; none writes its own.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np

from .inference import Predictor, run_predictor


def top1(logits: np.ndarray, labels: np.ndarray) -> float:
    """Percent of rows whose arg-max (over the last axis) equals the label."""
    return float((logits.argmax(-1) == labels.reshape(-1)).mean() * 100)


def agreement(a: np.ndarray, b: np.ndarray) -> float:
    """Percent of rows on which two outputs pick the same arg-max (over the last axis)."""
    return float((a.argmax(-1) == b.argmax(-1)).mean() * 100)


def relative_error(got: np.ndarray, expected: np.ndarray) -> float:
    """Largest ``|got - expected|`` over the range of ``expected``."""
    return float(np.abs(got - expected).max() / max(float(np.abs(expected).max()), 1e-12))


def interleaved_latency(
    predictors: Mapping[str, Predictor], feed: Mapping[str, np.ndarray], repeats: int = 10, warmup: int = 2
) -> dict[str, float]:
    """Median milliseconds per run of each predictor, their runs interleaved (so load drifts hit all alike)."""
    for predictor in predictors.values():
        for _ in range(warmup):
            run_predictor(predictor, feed)
    times: dict[str, list[float]] = {label: [] for label in predictors}
    for _ in range(repeats):
        for label, predictor in predictors.items():
            start = time.perf_counter()
            run_predictor(predictor, feed)
            times[label].append(time.perf_counter() - start)
    return {label: float(np.median(t)) * 1000 for label, t in times.items()}
