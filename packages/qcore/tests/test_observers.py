"""qcore.observers: plain-Python references, merge == concatenation, state round trip, errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from qcore.errors import ConfigError, DataError
from qcore.observers import (
    OBSERVERS,
    AbsMaxObserver,
    ChannelWiseAbsMaxObserver,
    HistogramObserver,
    MinMaxObserver,
    MovingAverageAbsMaxObserver,
    Observer,
    RangeAbsMaxObserver,
    make_observer,
)
from qcore.thresholds import thresholds_all_algos

RNG = np.random.default_rng(7)


def _laplace_with_outliers(shape):
    x = RNG.laplace(size=shape)
    x.flat[RNG.choice(x.size, 3, replace=False)] = [40.0, -55.0, 30.0]
    return x


BATCHES = {
    "normal": [RNG.standard_normal((3, 40)) * (1 + k % 3) for k in range(8)],
    "student_t2": [RNG.standard_t(2, (3, 40)) for _ in range(8)],
    "laplace_outliers": [_laplace_with_outliers((3, 40)) for _ in range(8)],
}


def _flat(batches):
    return [float(v) for b in batches for v in np.ravel(b)]


def _observe(obs, batches):
    for b in batches:
        obs.update(b)
    return obs


def _json_round_trip(obs):
    text = json.dumps(obs.state(), default=lambda a: a.tolist())
    return Observer.from_state(json.loads(text))


def ref_histogram(values, bins, upper):
    counts = [0] * bins
    for v in values:
        counts[min(int(math.floor(abs(v) / (upper / bins))), bins - 1)] += 1
    return counts


@pytest.mark.parametrize("name", BATCHES)
def test_abs_max_and_min_max_match_loops(name):
    batches = BATCHES[name]
    flat = _flat(batches)
    assert _observe(AbsMaxObserver(), batches).threshold() == max(abs(v) for v in flat)
    mm = _observe(MinMaxObserver(), batches)
    assert (mm.min, mm.max) == (min(flat), max(flat))
    assert mm.threshold() == max(abs(min(flat)), abs(max(flat)))
    assert mm.count == len(flat)


@pytest.mark.parametrize("name", BATCHES)
def test_channel_wise_matches_loops(name):
    batches = BATCHES[name]
    ref = [max(abs(float(b[c, j])) for b in batches for j in range(b.shape[1])) for c in range(3)]
    np.testing.assert_array_equal(_observe(ChannelWiseAbsMaxObserver(axis=0), batches).threshold(), ref)
    ref1 = [max(abs(float(b[r, c])) for b in batches for r in range(3)) for c in range(40)]
    np.testing.assert_array_equal(_observe(ChannelWiseAbsMaxObserver(axis=-1), batches).threshold(), ref1)


def test_moving_average_hand_computed_and_loop():
    obs = _observe(MovingAverageAbsMaxObserver(), [[1.0, -0.5], [-2.0]])
    assert obs.threshold() == pytest.approx((0.9 * 1 + 2) / (0.9 * 1 + 1))  # 2.9 / 1.9
    batches = BATCHES["student_t2"]
    accum = state = 0.0
    for b in batches:
        accum = 0.5 * accum + max(abs(float(v)) for v in np.ravel(b))
        state = 0.5 * state + 1
    assert _observe(MovingAverageAbsMaxObserver(0.5), batches).threshold() == pytest.approx(accum / state)


def test_moving_average_merge_adds_decayed_sums():
    a = _observe(MovingAverageAbsMaxObserver(), [[1.0], [3.0]])  # accum 3.9, weight 1.9
    b = _observe(MovingAverageAbsMaxObserver(), [[2.0]])  # accum 2, weight 1
    assert a.merge(b) is a
    assert (a.accum, a.weight) == pytest.approx((5.9, 2.9))
    assert a.threshold() == pytest.approx(5.9 / 2.9)


def test_range_abs_max_window_and_merge():
    obs = _observe(RangeAbsMaxObserver(window_size=3), [[5.0], [-1.0], [2.0], [3.0]])
    assert obs.threshold() == 3.0  # 5 fell out of the window
    a = _observe(RangeAbsMaxObserver(window_size=3), [[1.0], [4.0]])
    b = _observe(RangeAbsMaxObserver(window_size=3), [[2.0], [3.0], [1.0]])
    a.merge(b)
    assert a.window.tolist() == [2.0, 3.0, 4.0]  # aligned at the newest batch
    assert a.threshold() == 4.0
    batches = BATCHES["laplace_outliers"]
    ref = max(max(abs(float(v)) for v in np.ravel(b)) for b in batches[-5:])
    assert _observe(RangeAbsMaxObserver(window_size=5), batches).threshold() == ref


@pytest.mark.parametrize("name", BATCHES)
def test_histogram_single_batch_matches_loop(name):
    x = np.concatenate([b.ravel() for b in BATCHES[name]])
    obs = _observe(HistogramObserver(bins=64), [x])
    top = max(abs(v) for v in x)
    assert obs.upper / 2 <= top < obs.upper and math.log2(obs.upper).is_integer()  # the power of two above it
    assert obs.counts.tolist() == ref_histogram(x, 64, obs.upper)


def test_histogram_growth_sums_adjacent_bins():
    first = RNG.uniform(-1, 1, 500)
    first[0] = 0.99
    second = RNG.uniform(-3, 3, 500)
    obs = _observe(HistogramObserver(bins=8), [first])
    assert obs.upper == 1.0
    old = obs.counts.tolist()
    obs.update(second)
    assert obs.upper == 4.0  # 1 -> 2 -> 4 covers 3
    summed = [sum(old[4 * j : 4 * j + 4]) if j < 2 else 0 for j in range(8)]
    new = ref_histogram(second, 8, 4.0)
    assert obs.counts.tolist() == [s + n for s, n in zip(summed, new)]
    assert obs.count == 1000


@pytest.mark.parametrize("name", BATCHES)
def test_histogram_growth_equals_direct_binning(name):
    batches = sorted(BATCHES[name], key=lambda b: np.abs(b).max())  # force several growths
    obs = _observe(HistogramObserver(bins=256), batches)
    assert obs.counts.tolist() == ref_histogram(_flat(batches), 256, obs.upper)
    assert obs.threshold("abs_max") == obs.max_abs


def _streams(name):
    batches = BATCHES[name]
    big = max(range(len(batches)), key=lambda k: np.abs(batches[k]).max())
    order = [big] + [k for k in range(len(batches)) if k != big]
    # both streams start with a batch holding the global abs max
    peak = batches[big]
    a = [peak] + [batches[k] for k in order[1:4]]
    b = [peak] + [batches[k] for k in order[4:]]
    return a, b


@pytest.mark.parametrize("name", BATCHES)
@pytest.mark.parametrize("kind", ["abs_max", "min_max", "channel_wise_abs_max", "hist"])
def test_merge_equals_concatenation(name, kind):
    a_batches, b_batches = _streams(name)
    a = _observe(make_observer(kind), a_batches)
    b = _observe(make_observer(kind), b_batches)
    whole = _observe(make_observer(kind), a_batches + b_batches)
    merged = a.merge(b)
    for key, value in whole.state().items():
        np.testing.assert_array_equal(merged.state()[key], value, err_msg=key)
    assert b.count == sum(x.size for x in b_batches)  # other is left alone


@pytest.mark.parametrize("name", BATCHES)
def test_histogram_merge_with_growing_range(name):
    batches = BATCHES[name]
    a = _observe(HistogramObserver(bins=512), [b * 0.3 for b in batches[:4]])
    b = _observe(HistogramObserver(bins=512), batches[4:])
    whole = _observe(HistogramObserver(bins=512), [b * 0.3 for b in batches[:4]] + batches[4:])
    a.merge(b)
    for key, value in whole.state().items():  # the grid is fixed: merging is exact whatever the ranges
        np.testing.assert_array_equal(a.state()[key], value, err_msg=key)
    assert thresholds_all_algos(a) == thresholds_all_algos(whole)


def test_merge_into_empty_and_with_empty():
    data = BATCHES["normal"][:2]
    a = _observe(HistogramObserver(bins=32), data)
    empty = HistogramObserver(bins=32)
    assert empty.merge(a).state()["counts"].tolist() == a.counts.tolist()
    before = a.counts.tolist()
    a.merge(HistogramObserver(bins=32))
    assert a.counts.tolist() == before


def test_all_zero_batches_then_data():
    obs = _observe(HistogramObserver(bins=4), [np.zeros(5), [0.0, 2.0, 1.0]])
    assert obs.upper == 4.0  # strictly above 2: the abs max is never clipped into the last bin
    assert obs.counts.tolist() == [6, 1, 1, 0]


@pytest.mark.parametrize("kind", sorted(OBSERVERS))
def test_state_round_trip_through_json(kind):
    batches = BATCHES["student_t2"]
    obs = _observe(make_observer(kind), batches[:5])
    back = _json_round_trip(obs)
    assert type(back) is type(obs)
    for k in (obs, back):
        _observe(k, batches[5:])
    np.testing.assert_array_equal(back.threshold(), obs.threshold())
    for key, value in obs.state().items():
        np.testing.assert_array_equal(back.state()[key], value, err_msg=key)


def test_state_errors():
    state = AbsMaxObserver().state()
    with pytest.raises(DataError, match="not a MinMaxObserver state"):
        MinMaxObserver.from_state(state)
    with pytest.raises(DataError, match="did you mean 'abs_max'"):
        Observer.from_state({**state, "kind": "abs_maks"})
    del state["count"]
    with pytest.raises(DataError, match="missing"):
        Observer.from_state(state)
    hist = HistogramObserver(bins=4).state()
    with pytest.raises(DataError, match="3 counts for bins=4"):
        Observer.from_state({**hist, "counts": [1, 2, 3]})


def test_a_state_off_the_power_of_two_grid_is_refused():
    state = _observe(HistogramObserver(bins=16), [np.array([0.5, 3.0])]).state()
    with pytest.raises(DataError, match=r"upper=3.0, not a power of two; recalibrate"):
        Observer.from_state({**state, "upper": 3.0})


def test_the_mean_batch_abs_max_is_exact_in_any_order():
    maxes = [1e16, 1.0, 1.0, 0.3]  # a float sum of these depends on the order
    assert sum(maxes) != sum(reversed(maxes))
    forward = _observe(HistogramObserver(bins=16), [[m] for m in maxes])
    backward = _observe(HistogramObserver(bins=16), [[m] for m in reversed(maxes)])
    assert forward.avg_abs_max == backward.avg_abs_max == math.fsum(maxes) / len(maxes)


def test_make_observer():
    assert isinstance(make_observer("HIST", bins=16), HistogramObserver)
    assert make_observer("range_abs_max", window_size=4).window_size == 4
    with pytest.raises(ConfigError, match="did you mean 'abs_max'"):
        make_observer("abs_maxx")
    with pytest.raises(ConfigError, match="no option"):
        make_observer("abs_max", axis=0)


@pytest.mark.parametrize("kind", sorted(OBSERVERS))
def test_bad_data(kind):
    obs = make_observer(kind)
    with pytest.raises(DataError, match="no data"):
        obs.threshold()
    with pytest.raises(DataError, match="empty"):
        obs.update(np.zeros((0, 3)))
    with pytest.raises(DataError, match="NaN/Inf"):
        obs.update([[1.0, np.nan]])
    with pytest.raises(DataError, match="NaN/Inf"):
        obs.update([[np.inf, 1.0]])
    assert obs.count == 0


def test_bad_settings_and_merges():
    with pytest.raises(ConfigError, match="moving_rate"):
        MovingAverageAbsMaxObserver(0.0)
    with pytest.raises(ConfigError, match="window_size"):
        RangeAbsMaxObserver(0)
    with pytest.raises(ConfigError, match="bins"):
        HistogramObserver(0)
    with pytest.raises(ConfigError, match="bins=100 is invalid; use a power of two"):
        HistogramObserver(100)
    with pytest.raises(ConfigError, match="same kind"):
        AbsMaxObserver().merge(MinMaxObserver())
    with pytest.raises(ConfigError, match="same kind"):
        HistogramObserver(8).merge(HistogramObserver(16))
    cw = _observe(ChannelWiseAbsMaxObserver(0), [np.ones((3, 2))])
    with pytest.raises(DataError, match="channels"):
        cw.update(np.ones((4, 2)))


def test_histogram_keeps_signed_min_and_max_through_merge_and_state():
    batches = [np.array([-0.2, 3.0, 1.0]), np.array([0.5, -0.375, 7.5]), np.array([2.0])]
    whole = _observe(HistogramObserver(bins=16), batches)
    assert (whole.min, whole.max) == (-0.375, 7.5)
    a, b = _observe(HistogramObserver(bins=16), batches[:1]), _observe(HistogramObserver(bins=16), batches[1:])
    merged = a.merge(b)
    assert (merged.min, merged.max) == (-0.375, 7.5)
    restored = Observer.from_state(json.loads(json.dumps(merged.state(), default=np.ndarray.tolist)))
    assert (restored.min, restored.max) == (-0.375, 7.5)
    positive = _observe(HistogramObserver(bins=16), [np.array([0.25, 4.0])])
    assert (positive.min, positive.max) == (0.25, 4.0)  # the first batch sets both, not 0
