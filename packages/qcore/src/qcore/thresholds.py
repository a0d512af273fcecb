"""Threshold search over a histogram of ``|x|``.

A histogram is ``(counts, bin_width)``: bin ``j`` covers ``[j*w, (j+1)*w)`` from 0, or any object
with ``counts`` and ``bin_width`` attributes such as :class:`~qcore.observers.HistogramObserver`.
That observer also keeps the mean of per-batch abs maxes, so one calibration pass feeds every
algorithm (:func:`thresholds_all_algos`). This module reads histograms and never imports the
observers; ``HistogramObserver.threshold`` calls :func:`search_threshold`.
Candidate thresholds are bin edges ``i * w``. Where a bin's contents matter, values are taken
as uniform within the bin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .errors import ConfigError, DataError, did_you_mean
from .quant import qmax

Counts = NDArray[np.float64]


def _xlogx(v: NDArray[np.float64]) -> NDArray[np.float64]:
    return v * np.log(np.where(v > 0, v, 1.0))


def _abs_max(c: Counts, w: float, bits: int) -> float:
    """Upper edge of the last non-empty bin."""
    return float(np.flatnonzero(c)[-1] + 1) * w


def _percentile(c: Counts, w: float, bits: int, hist_percent: float = 0.99999) -> float:
    """Smallest bin edge with at least ``hist_percent`` of the values at or below it."""
    if not 0.0 < hist_percent <= 1.0:
        raise ConfigError(f"hist_percent={hist_percent!r} is out of range; use a fraction in (0, 1], e.g. 0.99999")
    cum = np.cumsum(c)
    return float(np.searchsorted(cum, hist_percent * cum[-1], side="left") + 1) * w


def _kl_divergence(c: Counts, bits: int) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """KL(P || Q) for every candidate bin count ``i`` in ``[2**(bits-1), len(c)]`` (TensorRT calibration).

    P is ``c[:i]`` with the outliers ``sum(c[i:])`` added to bin ``i-1``. Q merges ``c[:i]`` (without
    outliers) into ``n = 2**(bits-1)`` groups of ``i // n`` bins (the last group takes the remainder)
    and spreads each group's sum evenly over the bins where P is non-zero. With ``S_g`` the group
    sums, ``Z_g`` the non-zero counts, ``W_g`` the P mass per group, ``N = sum(c)``, ``T = sum(c[:i])``:
    ``KL = (sum P log P - sum_g W_g log(S_g / Z_g)) / N - log N + log T``, computed from prefix
    sums for all candidates at once. A candidate whose last group is empty while P is not gets inf.
    """
    nq = 2 ** (bits - 1)
    i = np.arange(nq, c.size + 1)
    csum = np.concatenate(([0.0], np.cumsum(c)))
    nzsum = np.concatenate(([0], np.cumsum(c > 0)))
    xlsum = np.concatenate(([0.0], np.cumsum(_xlogx(c))))
    total = csum[-1]
    tail = total - csum[i]
    merged = i // nq
    starts = np.arange(nq) * merged[:, None]
    stops = starts + merged[:, None]
    stops[:, -1] = i
    s = csum[stops] - csum[starts]
    z = (nzsum[stops] - nzsum[starts]).astype(np.float64)
    z[:, -1] += (c[i - 1] == 0) & (tail > 0)
    wsum = s.copy()
    wsum[:, -1] += tail
    with np.errstate(divide="ignore", invalid="ignore"):
        cross = np.where(wsum > 0, wsum * np.log(s / z), 0.0).sum(axis=1)
        p_log_p = xlsum[i - 1] + _xlogx(c[i - 1] + tail)
        kl = (p_log_p - cross) / total - np.log(total) + np.log(csum[i])
    return i, np.where(np.isnan(kl), np.inf, kl)


#: KL's threshold stands unless its expected squared quantization error on the histogram is more than this many
#: times the least error of any bin edge; then it is that edge (``mse``'s). PP-OCRv4 rec: 15 of 82 tensors over it,
#: KL at 0.50-0.63 of their abs max (docs/methods/ptq-static.md); 200 held-out lines deployed on ONNX Runtime:
#: exact 50.5 % with KL, 54.5 guarded (float 74.0).
KL_ERROR_GUARD = 2.0


def _kl_edge(c: Counts, w: float, bits: int) -> float:
    """Bin edge minimising the TensorRT KL divergence; the abs max when the bins are fewer than the levels.

    Like Paddle's own KL calibration, only thresholds between half the observed abs max and the
    abs max are candidates: after a ReLU the spike of zeros otherwise drives KL to clip most of
    the range (measured on the demo CNN: 1.6 instead of ~6 after ReLU, -15 points top-1), and
    edges above the abs max (empty bins of a histogram whose range grew) only waste levels
    (PP-OCRv4 rec: KL above the abs max on 3 layers, 26 vs 55 % exact match with ``mse``).
    """
    used = int(np.flatnonzero(c)[-1]) + 1
    if used <= 2 ** (bits - 1):
        return _abs_max(c, w, bits)
    i, kl = _kl_divergence(c[:used], bits)
    kl = np.where(i >= used // 2, kl, np.inf)
    return float(i[np.argmin(kl)]) * w


def _kl(c: Counts, w: float, bits: int) -> float:
    """:func:`_kl_edge`, guarded by the histogram's own quantization error (:data:`KL_ERROR_GUARD`)."""
    edge = _kl_edge(c, w, bits)
    errors, width = _squared_errors(c, w, bits)
    at_edge = errors[max(int(round(edge / width)), 1) - 1]
    return edge if at_edge <= KL_ERROR_GUARD * errors.min() else float(np.argmin(errors) + 1) * width


def _expected_error(c: Counts, w: float, bits: int, power: int) -> NDArray[np.float64]:
    """``E|x - fake_quantize(x, t)|**power`` (power 1 or 2) for every candidate ``t = i*w``, ``i = 1..len(c)``.

    Values are uniform within a bin, so each bin's mean is closed form. Inside the range it is the
    integral of ``|e(x)|**p``, ``e(x) = x - s*round(x/s)`` with ``s = t/qmax``, whose antiderivative
    is ``G(x) = (round(x/s) * s**(p+1) / 2**p + e*|e|**p) / (p+1)``; summation by parts turns
    ``sum_{j<i} c_j (G(j+1) - G(j))`` into one weighted sum of ``G`` at the bin edges, evaluated
    for blocks of candidates over the edges below them. Above ``t`` the error is ``x - t`` (clipped
    to the top code), summed for all candidates by suffix sums. Works in units of ``w``.
    """
    qm, n, block = qmax(bits), c.size, 128
    edge_weight = np.concatenate(([0.0], c[:-1])) - c  # weight of G(e) for e < i: c[e-1] - c[e]
    inside = np.empty(n)
    for first in range(0, n, block):
        i = np.arange(first + 1, min(first + block, n) + 1, dtype=np.float64)
        e = np.arange(i[-1])
        step = (i / qm)[:, None]
        k = np.rint(e * (qm / i)[:, None])
        g = e - k * step
        g = g * np.abs(g) if power == 1 else g * g * g
        g += k * (step ** (power + 1) / 2**power)
        g[:, first:] *= e[first:] < i[:, None]
        top = i ** (power + 1) / (2 * qm) ** power  # G(i): the top edge sits on code qmax
        inside[first : first + i.size] = g @ edge_weight[: e.size] + c[first : first + i.size] * top

    i = np.arange(1, n + 1)
    centre = np.arange(n) + 0.5

    def suffix(v: NDArray[np.float64]) -> NDArray[np.float64]:  # sum over bins >= i, per candidate i
        return np.concatenate((np.cumsum(v[::-1])[::-1], [0.0]))[i]

    s0, s1 = suffix(c), suffix(c * centre)
    clipped = s1 - i * s0 if power == 1 else suffix(c * centre**2) - 2 * i * s1 + (i * i + 1 / 12) * s0
    return (inside / (power + 1) + clipped) * w**power / c.sum()


#: ``mse`` / ``emd`` cost grows with the square of the bins: above this many used bins they read pairs of bins.
ERROR_SEARCH_BINS = 2048


def _coarse(c: Counts, w: float) -> tuple[Counts, float]:
    """``c`` up to its last non-empty bin, with pairs of bins summed until at most :data:`ERROR_SEARCH_BINS`."""
    c = c[: int(np.flatnonzero(c)[-1]) + 1]
    while c.size > ERROR_SEARCH_BINS:
        c, w = np.add.reduceat(c, np.arange(0, c.size, 2)), w * 2
    return c, w


def _squared_errors(c: Counts, w: float, bits: int) -> tuple[NDArray[np.float64], float]:
    """The expected squared error of every edge of the :func:`_coarse` histogram, and its bin width."""
    c, w = _coarse(c, w)
    return _expected_error(c, w, bits, 2), w


def _mse(c: Counts, w: float, bits: int) -> float:
    """Bin edge minimising the expected squared quantization error."""
    errors, w = _squared_errors(c, w, bits)
    return float(np.argmin(errors) + 1) * w


def _emd(c: Counts, w: float, bits: int) -> float:
    """Bin edge minimising the earth mover's (Wasserstein-1) distance between x and fake_quantize(x).

    In 1-D, for a monotone map f the optimal transport plan moves each x to f(x), so the distance
    is ``E|x - fake_quantize(x)|``.
    """
    c, w = _coarse(c, w)
    return float(np.argmin(_expected_error(c, w, bits, 1)) + 1) * w


def _avg(avg: float | None) -> float:
    """Mean of the per-batch abs max (``avg=`` or the histogram object's ``avg_abs_max``)."""
    if avg is None or not np.isfinite(avg) or avg < 0:
        raise ConfigError(
            "algo 'avg' needs the mean of per-batch abs max; pass avg=<float >= 0> or a HistogramObserver"
        )
    return float(avg)


_FROM_HISTOGRAM: dict[str, Callable[..., float]] = {
    "abs_max": _abs_max,
    "kl": _kl,
    "hist": _percentile,
    "mse": _mse,
    "emd": _emd,
}
# The PTQ ``algo`` vocabulary, defined here once: everything else that names algorithms reads it
# (qcore.constants.PTQ_ALGOS, qcli's --algo choices, qptq's config check, qptq.auto's candidates).
#: The threshold algorithms, in the order ``algo="auto"`` breaks ties in.
ALGOS = (*_FROM_HISTOGRAM, "avg")
#: Algorithms that score candidates on the layers themselves (``qptq.auto``), not on a histogram.
LAYERWISE_ALGOS = ("auto",)
#: Other names of an algorithm: ``direct`` is the seeds' older name of ``abs_max``.
ALIASES = {"direct": "abs_max"}
#: Every name PTQ's ``algo`` accepts (lower case; any case is accepted).
PTQ_ALGO_CHOICES = (*ALGOS, *LAYERWISE_ALGOS, *ALIASES)
_OPTIONS = {"hist": ("hist_percent",), "avg": ("avg",)}


def _histogram(hist: Any) -> tuple[Counts, float]:
    if isinstance(hist, tuple) and len(hist) == 2:
        counts, width = hist
    elif hasattr(hist, "counts") and hasattr(hist, "bin_width"):
        counts, width = hist.counts, hist.bin_width
    else:
        raise DataError(
            f"cannot read a histogram from {type(hist).__name__}; pass (counts, bin_width) or a HistogramObserver"
        )
    c = np.asarray(counts, dtype=np.float64)
    if c.ndim != 1 or not np.isfinite(c).all() or (c < 0).any() or not c.sum() > 0:
        raise DataError("histogram counts must be 1-D, finite, non-negative and not all zero; observe some data first")
    width = float(width)
    if not np.isfinite(width) or width < 0:
        raise DataError(f"bin_width={width!r} must be finite and >= 0; rebuild the histogram from finite data")
    return c, width


def canonical_algo(algo: str, extra: tuple[str, ...] = ()) -> str:
    """``algo`` as one of :data:`ALGOS` (or ``extra``): any case, aliases resolved; else one ConfigError line."""
    name = ALIASES.get(str(algo).lower(), str(algo).lower())
    if name not in ALGOS and name not in extra:
        choices = [*ALGOS, *extra, *ALIASES]
        raise ConfigError(f"unknown threshold algo {algo!r}{did_you_mean(name, choices)}; use one of {choices}")
    return name


def search_threshold(algo: str, hist: Any, bits: int = 8, **opts: Any) -> float:
    """Threshold chosen by ``algo`` (``abs_max``/``direct``, ``kl``, ``hist``, ``mse``, ``avg``, ``emd``; any case).

    Options: ``hist_percent`` for ``hist`` (default 0.99999); ``avg`` for ``avg`` (default: the
    ``avg_abs_max`` attribute of ``hist``). ``abs_max`` of a ``HistogramObserver`` is its exact
    ``max_abs``, which does not depend on the bin grid (so sharded calibration gives the
    single-process value); of a bare ``(counts, bin_width)`` it is the last non-empty bin's edge.
    """
    name = canonical_algo(algo)
    extra = sorted(set(opts) - set(_OPTIONS.get(name, ())))
    if extra:
        raise ConfigError(f"algo {name!r} has no option {extra}; its options are {list(_OPTIONS.get(name, ()))}")
    qmax(bits)  # validates bits for every algo
    if name == "avg":
        return _avg(opts["avg"] if "avg" in opts else getattr(hist, "avg_abs_max", None))
    c, w = _histogram(hist)
    if name == "abs_max" and hasattr(hist, "max_abs"):  # exact, whatever grid the data arrived on
        return float(hist.max_abs)
    return _FROM_HISTOGRAM[name](c, w, bits, **opts) if w > 0 else 0.0


def thresholds_all_algos(stats: Any, bits: int = 8, hist_percent: float = 0.99999) -> dict[str, float]:
    """``{algo: threshold}`` for every algorithm from one histogram's statistics (a ``HistogramObserver``)."""
    return {
        name: search_threshold(name, stats, bits, **({"hist_percent": hist_percent} if name == "hist" else {}))
        for name in ALGOS
    }
