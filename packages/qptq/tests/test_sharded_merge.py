"""The merge behind sharded calibration, in one process: why ranks share the first batch's range.

A :class:`~qcore.observers.HistogramObserver` starts its range at the first batch's abs max and
doubles it. Ranks that start from a range shared with the first batch of the union
(:func:`qptq.sharded._seeded`) merge into exactly the histogram one process builds over the
union; ranks that start from their own first batches do not.
"""

from __future__ import annotations

import numpy as np
import pytest

from qcore.observers import HistogramObserver
from qcore.thresholds import thresholds_all_algos
from qptq.calibrate import Calibration, ChannelMean
from qptq.sharded import _merged, _portable, _seeded


def batches(seed: int, n: int = 12) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)  # per-batch scales spread over 8x: the range doubles several times
    return [(rng.standard_normal(500) * rng.uniform(0.5, 4.0)).astype(np.float32) for _ in range(n)]


def observe(obs: HistogramObserver, data: list[np.ndarray]) -> HistogramObserver:
    for batch in data:
        obs.update(batch)
    return obs


def as_calibration(obs: HistogramObserver, data: list[np.ndarray]) -> Calibration:
    mean = ChannelMean(1)
    for batch in data:
        mean.update(batch[:, None])
    return Calibration({"x": obs}, {"x": mean}, batches=len(data), samples=sum(len(b) for b in data))


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("ranks", [2, 3])
def test_shared_start_merges_to_the_single_process_histogram(seed, ranks):
    data = batches(seed, 4 * ranks)
    shards = [data[r::ranks] for r in range(ranks)]  # round-robin: rank 0 holds the union's first batch
    union = [b for step in zip(*shards) for b in step]
    single = observe(HistogramObserver(), union)
    start = {"x": observe(HistogramObserver(), [shards[0][0]]).upper}
    parts = [_portable(as_calibration(observe(_seeded(start)["x"], shard), shard)) for shard in shards]
    merged = _merged(parts, keep_samples=0)
    obs = merged.observers["x"]
    np.testing.assert_array_equal(obs.counts, single.counts)
    assert (obs.upper, obs.max_abs, obs.count, obs.batches) == (single.upper, single.max_abs, single.count,
                                                                single.batches)
    ours, theirs = thresholds_all_algos(obs), thresholds_all_algos(single)
    assert {k: v for k, v in ours.items() if k != "avg"} == {k: v for k, v in theirs.items() if k != "avg"}
    assert ours["avg"] == pytest.approx(theirs["avg"], rel=1e-12)
    assert merged.batches == len(union) and merged.samples == 500 * len(union)
    expected_mean = np.concatenate(union).astype(np.float64).mean()
    assert merged.channel_means["x"].mean[0] == pytest.approx(expected_mean, rel=1e-9)


def test_own_starts_do_not_merge_exactly():
    """What the shared start avoids: each rank's range from its own first batch moves counts by a bin."""
    data = batches(0, 8)
    shards = [data[0::2], data[1::2]]
    union = [b for step in zip(*shards) for b in step]
    single = observe(HistogramObserver(), union)
    own = [observe(HistogramObserver(), shard) for shard in shards]
    merged = HistogramObserver().merge(own[0]).merge(own[1])
    assert own[0].upper / own[1].upper not in {2.0**k for k in range(-8, 9)}
    assert not np.array_equal(merged.counts, single.counts)


def test_an_empty_rank_contributes_nothing():
    data = batches(1, 6)
    single = observe(HistogramObserver(), data)
    start = {"x": observe(HistogramObserver(), data[:1]).upper}
    full = _portable(as_calibration(observe(_seeded(start)["x"], data), data))
    empty = _portable(Calibration({"x": _seeded(start)["x"]}, {"x": ChannelMean(1)}))
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
