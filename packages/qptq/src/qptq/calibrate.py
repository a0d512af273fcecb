"""One calibration pass: run the float model over the data, keep only mergeable statistics.

Every activation the quantized ops read gets a :class:`~qcore.observers.HistogramObserver`
(its histogram also tracks the per-batch abs max), so memory does not grow with the number of
batches and every threshold algorithm can be scored from the same pass.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from qcore.deploy import OpTarget
from qcore.errors import DataError
from qcore.graph import Graph, Operand
from qcore.observers import HistogramObserver

from .progress import progress as shown


@dataclass
class ChannelMean:
    """Running per-channel mean of an activation along ``axis`` (1 for NCHW convs, -1 for fc)."""

    axis: int
    total: np.ndarray = field(default_factory=lambda: np.zeros(0))
    count: int = 0

    def update(self, x: np.ndarray) -> None:
        rows = np.moveaxis(np.asarray(x, np.float64), self.axis, -1)
        rows = rows.reshape(-1, rows.shape[-1])
        self.total = rows.sum(0) if self.count == 0 else self.total + rows.sum(0)
        self.count += rows.shape[0]

    def merge(self, other: ChannelMean) -> ChannelMean:
        self.total = other.total.copy() if self.count == 0 else self.total + other.total
        self.count += other.count
        return self

    @property
    def mean(self) -> np.ndarray:
        return self.total / max(self.count, 1)


@dataclass
class Calibration:
    """Observers by activation name, plus how many batches and samples they saw."""

    observers: dict[str, HistogramObserver] = field(default_factory=dict)
    channel_means: dict[str, ChannelMean] = field(default_factory=dict)
    activation_samples: dict[str, list[np.ndarray]] = field(default_factory=dict)  # first rows of each
    batches: int = 0
    samples: int = 0
    samples_kept: int = 0


#: Rows (tokens) of kept matmul inputs the layer-wise choices score on: enough for the error, bounded in time.
SCORED_ROWS = 1024


def first_rows(x: np.ndarray, rows: int) -> np.ndarray:
    """The first samples of a matmul input ``x`` (``[samples, ..., channels]``) holding at most ``rows`` rows
    (at least one sample)."""
    per_sample = int(np.prod(x.shape[1:-1])) if x.ndim > 2 else 1
    return x[: max(1, rows // max(per_sample, 1))]


def stacked_by_shape(kept: list[np.ndarray]) -> list[np.ndarray]:
    """Kept samples stacked per sample shape, most samples first (calibration batches may differ in sequence
    length or image width; a layer replays each stack on its own)."""
    groups: dict[tuple[int, ...], list[np.ndarray]] = {}
    for array in kept:
        groups.setdefault(tuple(array.shape[1:]), []).append(array)
    stacks = [np.ascontiguousarray(np.concatenate(g), dtype=np.float32) for g in groups.values()]
    return sorted(stacks, key=len, reverse=True)


def calibrate(
    graph: Graph,
    targets: list[OpTarget],
    batches: Iterable[dict[str, np.ndarray]],
    *,
    progress: bool = False,
    channel_means: dict[str, ChannelMean] | None = None,
    keep_samples: int = 0,
) -> Calibration:
    """Run ``graph`` over ``batches`` and observe every target activation.

    ``channel_means`` (by activation name) are updated in the same pass (for bias correction).
    ``keep_samples``: also keep the first that many samples (rows of axis 0) of each activation,
    for the layer-wise methods (``algo="auto"``, AdaRound); memory grows with it, not with batches.
    """
    unique: dict[str, Operand] = {}
    for target in targets:
        for operand in target.activations:
            unique.setdefault(operand.name, operand)
    names = list(unique)
    result = Calibration({n: HistogramObserver() for n in names}, dict(channel_means or {}))
    result.activation_samples = {n: [] for n in names} if keep_samples > 0 else {}
    fetch = [unique[n].value for n in names]
    iterator = shown(batches, "calibrating", "batch") if progress else batches
    with graph.calibration_run():
        _observe(graph, iterator, names, fetch, result, keep_samples)
    return result


def run_batches(graph: Graph, batches: Iterable[dict[str, np.ndarray]]) -> list[np.ndarray]:
    """Every output of ``graph`` on every batch, run as calibration runs it (:meth:`Graph.calibration_run`)."""
    with graph.calibration_run():
        return [out for feed in batches for out in _run(graph, feed, graph.model.fetch_targets)]


def _observe(graph: Graph, batches: Iterable[dict[str, np.ndarray]], names: list[str], fetch: list,
             result: Calibration, keep_samples: int) -> None:
    for feed in batches:
        values = _run(graph, feed, fetch)
        for name, value in zip(names, values):
            try:
                result.observers[name].update(value)
            except DataError as exc:
                raise DataError(f"activation {name!r} at batch {result.batches}: {exc}") from None
            if name in result.channel_means:
                result.channel_means[name].update(value)
            kept = result.activation_samples.get(name)
            if kept is not None and value.ndim and result.samples_kept < keep_samples:
                kept.append(value[: keep_samples - result.samples_kept].copy())
        result.batches += 1
        result.samples += len(next(iter(feed.values())))
        result.samples_kept = min(keep_samples, result.samples)


def _run(graph: Graph, feed: dict[str, np.ndarray], fetch: list) -> list[np.ndarray]:
    try:
        return graph.run(feed, fetch) if fetch else []
    except Exception as exc:  # Paddle reports shape/dtype problems as bare runtime errors
        shapes = {k: (tuple(v.shape), str(v.dtype)) for k, v in feed.items()}
        first = next((line for line in str(exc).splitlines() if "Error" in line), str(exc)[:200]).strip()
        raise DataError(
            f"the model could not run on a calibration batch with feeds {shapes} ({first}); "
            "check the batch shapes and dtypes against the model's inputs"
        ) from exc
