"""The merge behind sharded calibration, in one process: the merged statistics are the single process's.

A :class:`~qcore.observers.HistogramObserver`'s bins sit on one power-of-two grid, so each rank
observing its own shard from an empty observer (no shared start, no agreed range) merges into
exactly the histogram one process builds over the same batches, in whatever order it reads them.
"""

from __future__ import annotations

import numpy as np
import pytest

from qcore.observers import HistogramObserver
from qcore.thresholds import thresholds_all_algos
from qptq.calibrate import Calibration, ChannelMean
from qptq.sharded import _merged, _portable


def batches(seed: int, n: int = 12, scale: float = 1.0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)  # per-batch scales spread over 8x: the range doubles several times
    return [(rng.standard_normal(500) * rng.uniform(0.5, 4.0) * scale).astype(np.float32) for _ in range(n)]


def observe(obs: HistogramObserver, data: list[np.ndarray]) -> HistogramObserver:
    for batch in data:
        obs.update(batch)
    return obs


def as_calibration(obs: HistogramObserver, data: list[np.ndarray]) -> Calibration:
    mean = ChannelMean(1)
    for batch in data:
        mean.update(batch[:, None])
    return Calibration({"x": obs}, {"x": mean}, batches=len(data), samples=sum(len(b) for b in data))


def shards_of_different_ranges(seed: int, ranks: int) -> list[list[np.ndarray]]:
    """Each rank's data on its own scale (ratios 3.7**r, not powers of two), small batches first on rank 0."""
    shards = [batches(seed * 10 + r, 4, scale=3.7**r) for r in range(ranks)]
    shards[0].sort(key=lambda b: float(np.abs(b).max()))  # rank 0's first batch: its smallest range
    return shards


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("order", ["rank order", "reversed", "interleaved"])
def test_ranks_merge_to_the_single_process_histogram_in_any_order(seed, ranks, order):
    shards = shards_of_different_ranges(seed, ranks)
    union = {"rank order": [b for s in shards for b in s], "reversed": [b for s in shards[::-1] for b in s],
             "interleaved": [b for step in zip(*shards) for b in step]}[order]
    single = observe(HistogramObserver(), union)
    parts = [_portable(as_calibration(observe(HistogramObserver(), shard), shard)) for shard in shards]
    merged = _merged(parts, keep_samples=0)
    obs = merged.observers["x"]
    assert obs.state().keys() == single.state().keys()
    for key, value in single.state().items():  # counts, range, max, min, the avg sum: all exact
        np.testing.assert_array_equal(obs.state()[key], value, err_msg=key)
    assert thresholds_all_algos(obs) == thresholds_all_algos(single)  # kl, hist, mse, emd, avg: bit for bit
    assert merged.batches == len(union) and merged.samples == 500 * len(union)
    expected_mean = np.concatenate(union).astype(np.float64).mean()
    assert merged.channel_means["x"].mean[0] == pytest.approx(expected_mean, rel=1e-12)


def test_an_empty_rank_contributes_nothing():
    data = batches(1, 6)
    single = observe(HistogramObserver(), data)
    full = _portable(as_calibration(observe(HistogramObserver(), data), data))
    empty = _portable(Calibration({"x": HistogramObserver()}, {"x": ChannelMean(1)}))
    for parts in ([full, empty], [empty, full]):
        merged = _merged(parts, keep_samples=0)
        np.testing.assert_array_equal(merged.observers["x"].counts, single.counts)
        assert merged.observers["x"].upper == single.upper and merged.batches == 6


def test_kept_samples_come_from_the_lowest_ranks_first():
    a, b = np.arange(6.0).reshape(6, 1), np.arange(10.0, 14.0).reshape(4, 1)
    parts = [_portable(Calibration({}, {}, {"x": [a[:3], a[3:]]}, samples=6)),
             _portable(Calibration({}, {}, {"x": [b]}, samples=4))]
    kept = np.concatenate(_merged(parts, keep_samples=8).activation_samples["x"])
    np.testing.assert_array_equal(kept[:, 0], [0, 1, 2, 3, 4, 5, 10, 11])
    sent = _portable(Calibration({}, {}, {"x": [a[:3], a[3:]]}, samples=6), rows=4)["samples_of"]["x"]
    np.testing.assert_array_equal(np.concatenate(sent)[:, 0], [0, 1, 2, 3])  # a rank sends only the rows needed
    assert _portable(Calibration({}, {}, {"x": [a]}, samples=6), rows=0)["samples_of"] == {"x": []}
