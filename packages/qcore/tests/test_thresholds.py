"""qcore.thresholds against plain-Python references on normal and heavy-tailed histograms."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from scipy.stats import wasserstein_distance

from qcore.errors import ConfigError, DataError
from qcore.observers import HistogramObserver
from qcore.thresholds import (
    ALGOS,
    KL_ERROR_GUARD,
    _expected_error,
    _kl_divergence,
    _kl_edge,
    search_threshold,
    thresholds_all_algos,
)

RNG = np.random.default_rng(99)
_laplace = RNG.laplace(size=50_000)
_laplace[:20] = RNG.uniform(20, 60, 20)
SAMPLES = {
    "normal": RNG.standard_normal(50_000),
    "student_t2": RNG.standard_t(2, 50_000),
    "laplace_outliers": _laplace,
}


def _hist(name, bins):
    x = np.abs(SAMPLES[name])
    counts, edges = np.histogram(x, bins=bins, range=(0.0, x.max()))
    return counts, float(edges[1])


def ref_kl_curve(counts, bits):
    """TensorRT calibration, bin by bin; inf when Q is 0 where P is not."""
    nq = 2 ** (bits - 1)
    counts = [float(v) for v in counts]
    out = []
    for i in range(nq, len(counts) + 1):
        p = counts[:i]
        p[i - 1] += sum(counts[i:])
        merged = i // nq
        q = [0.0] * i
        for g in range(nq):
            start = g * merged
            stop = i if g == nq - 1 else start + merged
            mass = sum(counts[start:stop])
            nonzero = [j for j in range(start, stop) if p[j] > 0]
            for j in nonzero:
                q[j] = mass / len(nonzero)
        psum, qsum = sum(p), sum(q)
        kl = 0.0
        for pj, qj in zip(p, q):
            if pj > 0:
                if qj == 0:
                    kl = math.inf
                    break
                kl += pj / psum * math.log((pj / psum) / (qj / qsum))
        out.append(kl)
    return out


def ref_error_curve(counts, width, bits, power):
    """Exact mean |x - fake_quantize(x)|**power with values uniform in each bin, piece by piece.

    Each bin is cut where the quantized level changes (half steps) or the error changes sign (the
    levels); on each piece the level l is fixed, so the integral of |x - l|**p is elementary.
    """
    qm = 2 ** (bits - 1) - 1
    out = []
    for i in range(1, len(counts) + 1):
        t = i * width
        s = t / qm
        total = 0.0
        for j, c in enumerate(counts):
            if not c:
                continue
            lo, hi = j * width, (j + 1) * width
            cuts = [k * s / 2 for k in range(math.ceil(2 * lo / s), math.floor(2 * hi / s) + 1)]
            bounds = sorted({lo, hi, *[x for x in cuts if lo < x < hi]})
            for u, v in zip(bounds, bounds[1:]):
                level = min(round((u + v) / 2 / s), qm) * s
                a, b = sorted((abs(u - level), abs(v - level)))
                total += c * (b ** (power + 1) - a ** (power + 1)) / (power + 1) / width
        out.append(total / sum(counts))
    return np.array(out)


@pytest.mark.parametrize("name", SAMPLES)
@pytest.mark.parametrize("bits", [8, 4])
def test_kl_matches_reference(name, bits):
    counts, width = _hist(name, 384)
    i, kl = _kl_divergence(counts.astype(np.float64), bits)
    ref = np.array(ref_kl_curve(counts, bits))
    assert i.tolist() == list(range(2 ** (bits - 1), 385))
    np.testing.assert_array_equal(np.isinf(kl), np.isinf(ref))
    np.testing.assert_allclose(kl[np.isfinite(ref)], ref[np.isfinite(ref)], rtol=1e-7, atol=1e-12)
    chosen = round(_kl_edge(counts.astype(np.float64), width, bits) / width)
    # only thresholds from half the observed range (as in Paddle's KL calibration) up to the abs max
    used = int(np.flatnonzero(counts)[-1]) + 1
    allowed = ref[max(used // 2, 2 ** (bits - 1)) - 2 ** (bits - 1) : used - 2 ** (bits - 1) + 1]
    assert used // 2 <= chosen <= used
    assert ref[chosen - 2 ** (bits - 1)] <= allowed.min() * (1 + 1e-9)  # exact ties exist, e.g. over empty bins


def test_kl_guard_takes_the_least_error_edge_where_kl_costs_more_than_twice_it():
    # 2 bits: codes -1, 0, 1 (step t); bins of width 1, values uniform within a bin; one value in [1, 2),
    # two in [2, 3), four in [3, 4)
    counts = np.array([0.0, 1, 2, 4])
    np.testing.assert_allclose(ref_kl_curve(counts, 2), [0.0, 0.28303, 0.04854], atol=1e-5)  # KL: clip at 2
    assert _kl_edge(counts, 1.0, 2) == 2.0
    # E(x - q(x))**2 * 7 by hand, bin by bin ([1,2), [2,3) twice, [3,4) four times):
    # t=2: 1/3 (to 2) + 2 * 1/3 (clipped to 2) + 4 * 7/3 (clipped to 2: int_1^2 u^2) = 31/3
    # t=3: 19/12 (to 0 below 1.5, to 3 above) + 2 * 1/3 (to 3) + 4 * 1/3 (clipped to 3) = 43/12
    # t=4: 7/3 (to 0) + 2 * 7/3 (to 4) + 4 * 1/3 (to 4) = 25/3
    errors = _expected_error(counts, 1.0, 2, 2)
    np.testing.assert_allclose(errors[1:] * 7, [31 / 3, 43 / 12, 25 / 3])
    assert errors[1] > KL_ERROR_GUARD * errors[2]  # 124 / 43 = 2.9 times the least error
    assert search_threshold("kl", (counts, 1.0), 2) == 3.0 == search_threshold("mse", (counts, 1.0), 2)


def test_kl_stands_within_twice_the_least_error():
    counts = np.array([0.0, 1, 2, 1])  # as above with one value in [3, 4)
    kl = ref_kl_curve(counts, 2)
    assert kl[0] == 0.0 < min(kl[1:])  # KL clips at 2
    # t=2: (1/3 + 2 * 1/3 + 7/3) / 4 = 10/12; t=3: (19/12 + 2 * 1/3 + 1/3) / 4 = 31/48: 1.29 times the least
    errors = _expected_error(counts, 1.0, 2, 2)
    np.testing.assert_allclose(errors[1:3], [10 / 12, 31 / 48])
    assert errors[2] == errors.min()
    assert search_threshold("kl", (counts, 1.0), 2) == 2.0
    assert search_threshold("mse", (counts, 1.0), 2) == 3.0


def test_kl_never_goes_past_the_abs_max():
    # a histogram whose range grew: 300 of 2048 bins hold data, the rest are empty
    counts = np.zeros(2048)
    counts[:300] = np.random.default_rng(0).exponential(1.0, 300)[::-1].cumsum()[::-1]
    i, kl = _kl_divergence(counts, 8)
    assert i[np.argmin(np.where(i >= 150, kl, np.inf))] > 300  # unrestricted, KL would pick an empty edge
    assert 150 <= search_threshold("kl", (counts, 0.01), 8) / 0.01 <= 300
    few = np.zeros(2048)
    few[:100] = 1.0  # fewer used bins than int8 levels: the abs max
    assert search_threshold("kl", (few, 0.01), 8) == pytest.approx(1.0)


def test_kl_empty_last_group_is_rejected():
    counts = np.zeros(16)
    counts[:4] = [50, 30, 10, 5]
    counts[15] = 1  # one far outlier: every clip short of it empties Q where P holds the outliers
    i, kl = _kl_divergence(counts, 3)
    ref = ref_kl_curve(counts, 3)
    assert [math.isinf(v) for v in kl] == [math.isinf(v) for v in ref]
    assert np.isinf(kl).any() and np.isfinite(kl).any()
    np.testing.assert_allclose(kl[np.isfinite(kl)], [v for v in ref if math.isfinite(v)], rtol=1e-9)


def test_kl_is_fast_on_2048_bins():
    counts, width = _hist("student_t2", 2048)
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        search_threshold("kl", (counts, width), 8)
        best = min(best, time.perf_counter() - start)
    assert best < 0.15  # about 10 ms when the machine is idle; a per-candidate Python loop takes seconds


@pytest.mark.parametrize("name", SAMPLES)
@pytest.mark.parametrize("algo,power", [("mse", 2), ("emd", 1)])
def test_error_curves_match_reference(name, algo, power):
    counts, width = _hist(name, 96)
    for bits in (8, 3):
        curve = _expected_error(counts.astype(np.float64), width, bits, power)
        ref = ref_error_curve(counts, width, bits, power)
        np.testing.assert_allclose(curve, ref, rtol=1e-9)
        chosen = round(search_threshold(algo, (counts, width), bits) / width)
        assert ref[chosen - 1] <= ref.min() * (1 + 1e-9)


@pytest.mark.parametrize("name", SAMPLES)
def test_emd_is_mean_abs_error(name):
    """In 1-D the earth mover's distance between x and a monotone image f(x) is E|x - f(x)|."""
    x = SAMPLES[name][:5000]
    for t in (0.5, 2.0, float(np.abs(x).max())):
        fq = np.clip(np.round(x / (t / 7)), -7, 7) * (t / 7)
        assert wasserstein_distance(x, fq) == pytest.approx(np.mean(np.abs(x - fq)), rel=1e-9)


def test_mse_matches_real_data_error():
    x = np.abs(SAMPLES["laplace_outliers"])
    counts, width = _hist("laplace_outliers", 1024)
    curve = _expected_error(counts.astype(np.float64), width, 8, 2)
    for i in (20, 200, 1024):
        t = i * width
        fq = np.clip(np.round(x / (t / 127)), -127, 127) * (t / 127)
        assert curve[i - 1] == pytest.approx(np.mean((x - fq) ** 2), rel=0.02)


def test_abs_max_and_percentile_hand_computed():
    assert search_threshold("abs_max", ([0, 3, 0, 2, 0, 0], 0.5)) == 2.0
    assert search_threshold("DIRECT", ([0, 3, 0, 2, 0, 0], 0.5)) == 2.0
    flat = ([1, 1, 1, 1], 1.0)
    assert search_threshold("hist", flat, hist_percent=0.5) == 2.0
    assert search_threshold("hist", flat, hist_percent=0.51) == 3.0
    assert search_threshold("hist", flat, hist_percent=1.0) == 4.0


@pytest.mark.parametrize("name", SAMPLES)
@pytest.mark.parametrize("pct", [0.9, 0.999, 0.99999])
def test_percentile_matches_loop(name, pct):
    counts, width = _hist(name, 2048)
    total, running = int(counts.sum()), 0
    edge = 0
    while running < pct * total:
        running += int(counts[edge])
        edge += 1
    assert search_threshold("hist", (counts, width), hist_percent=pct) == pytest.approx(edge * width)


def test_avg_from_option_or_observer():
    obs = HistogramObserver(bins=64)
    for b in ([1.0, -0.5], [0.2, -3.0]):
        obs.update(b)
    assert search_threshold("avg", obs) == pytest.approx(2.0)
    assert search_threshold("avg", ([1, 2], 1.0), avg=1.5) == 1.5
    with pytest.raises(ConfigError, match="avg="):
        search_threshold("avg", ([1, 2], 1.0))


@pytest.mark.parametrize("name", SAMPLES)
def test_all_algos_from_one_pass(name):
    stats = HistogramObserver(bins=2048)
    for chunk in np.array_split(SAMPLES[name], 10):
        stats.update(chunk)
    found = thresholds_all_algos(stats, 8)
    assert list(found) == list(ALGOS)
    for algo, t in found.items():
        assert t == search_threshold(algo, stats, 8)
        assert 0 < t <= stats.upper
    assert found["abs_max"] == np.abs(SAMPLES[name]).max()  # exact, not a bin edge
    assert found["hist"] <= found["abs_max"] + stats.bin_width
    assert found["kl"] == stats.threshold("kl", 8)
    assert found["avg"] == pytest.approx(np.mean([np.abs(c).max() for c in np.array_split(SAMPLES[name], 10)]))
    assert found["kl"] >= found["abs_max"] / 2 - stats.bin_width  # KL never clips below half the range
    if name != "normal":  # heavy tails: the error-driven searches clip the outliers
        assert found["emd"] < found["abs_max"] / 2


def test_all_zero_data_gives_zero_thresholds():
    stats = HistogramObserver(bins=16)
    stats.update(np.zeros(10))
    assert set(thresholds_all_algos(stats).values()) == {0.0}


def test_errors():
    hist = ([1, 2, 3], 1.0)
    with pytest.raises(ConfigError, match="did you mean 'kl'"):
        search_threshold("kll", hist)
    assert search_threshold("KL", hist, 2) == search_threshold("kl", hist, 2)
    assert search_threshold("kl", hist, 8) == 3.0  # fewer bins than levels: nothing to clip
    for bits in (1, 17):
        with pytest.raises(ConfigError, match="bits"):
            search_threshold("mse", hist, bits)
    with pytest.raises(ConfigError, match="no option"):
        search_threshold("kl", hist, hist_percent=0.9)
    with pytest.raises(ConfigError, match="hist_percent"):
        search_threshold("hist", hist, hist_percent=0.0)
    with pytest.raises(DataError, match="not all zero"):
        search_threshold("kl", ([0, 0], 1.0))
    with pytest.raises(DataError, match="finite"):
        search_threshold("kl", ([1, np.nan], 1.0))
    with pytest.raises(DataError, match="not all zero"):
        search_threshold("mse", HistogramObserver())
    with pytest.raises(DataError, match="histogram"):
        search_threshold("mse", [1, 2, 3])


def test_no_threshold_depends_on_the_order_data_arrives():
    """The bin grid is fixed (powers of two), so the histogram and every threshold read from it are the same."""
    data = np.random.default_rng(3).standard_normal(8000).astype(np.float32) * np.repeat(np.arange(1, 9), 1000)
    chunks = np.array_split(data, 8)
    forward, backward = HistogramObserver(), HistogramObserver()
    for chunk in chunks:
        forward.update(chunk)
    for chunk in reversed(chunks):
        backward.update(chunk)
    np.testing.assert_array_equal(forward.counts, backward.counts)
    assert forward.upper == backward.upper == 32.0  # the power of two above the abs max, whatever came first
    assert thresholds_all_algos(forward) == thresholds_all_algos(backward)
    assert search_threshold("abs_max", forward) == float(np.abs(data).max())


def test_mse_and_emd_read_pairs_of_bins_above_2048_used_bins():
    counts, width = _hist("student_t2", 4096)
    pairs = counts.reshape(-1, 2).sum(axis=1)
    for algo in ("mse", "emd"):
        assert search_threshold(algo, (counts, width)) == search_threshold(algo, (pairs, 2 * width))
    small, small_width = _hist("student_t2", 2048)
    assert search_threshold("mse", (np.concatenate([small, np.zeros(2048)]), small_width)) == \
        search_threshold("mse", (small, small_width))  # empty bins above the data are not searched
