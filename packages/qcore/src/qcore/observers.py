"""Mergeable calibration statistics.

Every observer sees batches through :meth:`Observer.update`, combines with another observer of
the same kind and settings through :meth:`Observer.merge` (e.g. statistics gathered by several
workers), and round-trips through :meth:`Observer.state` / :meth:`Observer.from_state`, a flat
dict of numpy arrays and python scalars (``json.dumps(state, default=np.ndarray.tolist)`` works).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .errors import ConfigError, DataError, did_you_mean
from .quant import abs_max, as_finite
from .thresholds import search_threshold

Conv = Callable[[Any], Any]  # converts a statistic to its state() value and back


def _floats(v: Any) -> NDArray[np.float64]:
    return np.array(v, dtype=np.float64)


def _ints(v: Any) -> NDArray[np.int64]:
    return np.array(v, dtype=np.int64)


class Observer(ABC):
    """Base class: settings in ``_config_keys`` (constructor arguments), statistics in ``_stat_keys``."""

    kind: ClassVar[str]
    _config_keys: ClassVar[tuple[str, ...]] = ()
    _stat_keys: ClassVar[dict[str, Conv]] = {"count": int}
    _registry: ClassVar[dict[str, type[Observer]]] = {}

    count: int

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        Observer._registry[cls.kind] = cls

    @abstractmethod
    def update(self, array: ArrayLike) -> None:
        """Add one batch."""

    @abstractmethod
    def _merge(self, other: Any) -> None:
        """Combine ``other`` (same type and settings, both non-empty) into ``self``."""

    @abstractmethod
    def threshold(self) -> float | NDArray[np.float64]:
        """The clipping threshold the statistics imply."""

    def merge(self, other: Observer) -> Observer:
        """Combine ``other`` into ``self`` and return ``self``; ``other`` is not changed."""
        if type(other) is not type(self) or other._config() != self._config():
            raise ConfigError(
                f"cannot merge {type(other).__name__}{other._config()} into {type(self).__name__}{self._config()}; "
                "merge observers of the same kind and settings"
            )
        if self.count == 0:
            self._load(other.state())
        elif other.count:
            self._merge(other)
        return self

    def _config(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self._config_keys}

    def state(self) -> dict[str, Any]:
        """Settings and statistics as a flat dict of numpy arrays and python scalars."""
        stats = {k: conv(getattr(self, k)) for k, conv in self._stat_keys.items()}
        return {"kind": self.kind, **self._config(), **stats}

    def _load(self, state: dict[str, Any]) -> None:
        for k, conv in self._stat_keys.items():
            setattr(self, k, conv(state[k]))

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Observer:
        """Rebuild an observer from :meth:`state` (on the base class, the ``kind`` key picks the subclass)."""
        kind = state.get("kind")
        sub = Observer._registry.get(str(kind))
        if sub is None or not issubclass(sub, cls):
            raise DataError(
                f"state kind {kind!r} is not a {cls.__name__} state{did_you_mean(str(kind), Observer._registry)}; "
                f"pass a dict made by {cls.__name__}.state()"
            )
        missing = [k for k in (*sub._config_keys, *sub._stat_keys) if k not in state]
        if missing:
            raise DataError(f"{sub.__name__} state is missing {missing}; pass a dict made by {sub.__name__}.state()")
        obs = sub(**{k: state[k] for k in sub._config_keys})
        obs._load(state)
        return obs

    def _require_data(self) -> None:
        if self.count == 0:
            raise DataError(f"{type(self).__name__} has seen no data; call update() before threshold()")


class AbsMaxObserver(Observer):
    """Running max of ``|x|``; threshold = that max."""

    kind = "abs_max"
    _stat_keys: ClassVar[dict[str, Conv]] = {"abs_max": float, "count": int}

    def __init__(self) -> None:
        self.abs_max = 0.0
        self.count = 0

    def update(self, array: ArrayLike) -> None:
        a = as_finite(array)
        self.abs_max = max(self.abs_max, float(np.abs(a).max()))
        self.count += a.size

    def _merge(self, other: AbsMaxObserver) -> None:
        self.abs_max = max(self.abs_max, other.abs_max)
        self.count += other.count

    def threshold(self) -> float:
        self._require_data()
        return self.abs_max


class ChannelWiseAbsMaxObserver(Observer):
    """Running max of ``|x|`` per channel along ``axis``; threshold is a 1-D array."""

    kind = "channel_wise_abs_max"
    _config_keys = ("axis",)
    _stat_keys: ClassVar[dict[str, Conv]] = {"abs_max": _floats, "count": int}

    def __init__(self, axis: int = 0) -> None:
        self.axis = int(axis)
        self.abs_max = np.zeros(0)
        self.count = 0

    def _combine(self, m: NDArray[np.float64]) -> None:
        if self.count and m.shape != self.abs_max.shape:
            raise DataError(
                f"batch has {m.size} channels on axis {self.axis} but earlier batches had {self.abs_max.size}; "
                "keep the channel count fixed"
            )
        self.abs_max = np.maximum(self.abs_max, m) if self.count else m

    def update(self, array: ArrayLike) -> None:
        a = as_finite(array)
        self._combine(np.asarray(abs_max(a, self.axis)))
        self.count += a.size

    def _merge(self, other: ChannelWiseAbsMaxObserver) -> None:
        self._combine(other.abs_max)
        self.count += other.count

    def threshold(self) -> NDArray[np.float64]:
        self._require_data()
        return self.abs_max.copy()


class MinMaxObserver(Observer):
    """Running min and max of ``x``; threshold = ``max(|min|, |max|)``."""

    kind = "min_max"
    _stat_keys: ClassVar[dict[str, Conv]] = {"min": float, "max": float, "count": int}

    def __init__(self) -> None:
        self.min = 0.0
        self.max = 0.0
        self.count = 0

    def _combine(self, lo: float, hi: float) -> None:
        self.min, self.max = (min(self.min, lo), max(self.max, hi)) if self.count else (lo, hi)

    def update(self, array: ArrayLike) -> None:
        a = as_finite(array)
        self._combine(float(a.min()), float(a.max()))
        self.count += a.size

    def _merge(self, other: MinMaxObserver) -> None:
        self._combine(other.min, other.max)
        self.count += other.count

    def threshold(self) -> float:
        self._require_data()
        return max(abs(self.min), abs(self.max))


def moving_average_update(accum: Any, weight: Any, batch_abs_max: Any, rate: float) -> tuple[Any, Any]:
    """One batch of Paddle's moving-average abs max: the new ``(accum, weight)``; threshold ``accum / weight``.

    The one definition of the rule: numbers, numpy arrays and paddle tensors alike (QAT's
    ``moving_average_abs_max`` quanters run it on their buffers).
    """
    return rate * accum + batch_abs_max, rate * weight + 1.0


class MovingAverageAbsMaxObserver(Observer):
    """Paddle's moving-average abs max: per batch ``accum = rate*accum + absmax``, ``weight = rate*weight + 1``.

    ``weight`` is Paddle's ``state``; threshold = ``accum / weight`` (both start at 0, so after the
    first batch the threshold is that batch's abs max). Merging two streams treats them as running
    side by side: their decayed sums add (``accum = a.accum + b.accum``, ``weight = a.weight + b.weight``),
    so the merged threshold is the weight-averaged threshold of the two.
    """

    kind = "moving_average_abs_max"
    _config_keys = ("moving_rate",)
    _stat_keys: ClassVar[dict[str, Conv]] = {"accum": float, "weight": float, "count": int}

    def __init__(self, moving_rate: float = 0.9) -> None:
        if not 0.0 < moving_rate <= 1.0:
            raise ConfigError(f"moving_rate={moving_rate!r} is out of range; use a value in (0, 1], e.g. 0.9")
        self.moving_rate = float(moving_rate)
        self.accum = 0.0
        self.weight = 0.0
        self.count = 0

    def update(self, array: ArrayLike) -> None:
        a = as_finite(array)
        self.accum, self.weight = moving_average_update(self.accum, self.weight, float(np.abs(a).max()),
                                                        self.moving_rate)
        self.count += a.size

    def _merge(self, other: MovingAverageAbsMaxObserver) -> None:
        self.accum += other.accum
        self.weight += other.weight
        self.count += other.count

    def threshold(self) -> float:
        self._require_data()
        return self.accum / self.weight


class RangeAbsMaxObserver(Observer):
    """Max of the per-batch abs max over the last ``window_size`` batches.

    Merging aligns the two windows at their newest batch and keeps the element-wise max (streams
    running side by side), so the merged threshold is the max of the two thresholds.
    """

    kind = "range_abs_max"
    _config_keys = ("window_size",)
    _stat_keys: ClassVar[dict[str, Conv]] = {"window": _floats, "count": int}

    def __init__(self, window_size: int = 10000) -> None:
        if isinstance(window_size, bool) or not isinstance(window_size, (int, np.integer)) or window_size < 1:
            raise ConfigError(f"window_size={window_size!r} is invalid; use a positive integer, e.g. 10000")
        self.window_size = int(window_size)
        self.window = np.zeros(0)
        self.count = 0

    def update(self, array: ArrayLike) -> None:
        a = as_finite(array)
        self.window = np.append(self.window, np.abs(a).max())[-self.window_size :]
        self.count += a.size

    def _merge(self, other: RangeAbsMaxObserver) -> None:
        n = max(self.window.size, other.window.size)
        self.window = np.maximum(
            np.pad(self.window, (n - self.window.size, 0)),
            np.pad(other.window, (n - other.window.size, 0)),
        )
        self.count += other.count

    def threshold(self) -> float:
        self._require_data()
        return float(self.window.max())


class HistogramObserver(Observer):
    """One-pass histogram of ``|x|`` over ``[0, upper)`` in ``bins`` equal bins, plus batch abs-max stats.

    ``upper`` is always the smallest power of two above the abs max seen (0 before any non-zero
    value), and ``bins`` a power of two, so every bin edge sits on one fixed grid: a value's bin is
    ``floor(|x| * bins / upper)`` computed without rounding, and when the range doubles ``k`` times
    bin ``i`` moves to ``i >> k``, which is where direct binning would put it. The counts are
    therefore a function of the values alone, whatever the batch order, and merging observers that
    saw parts of the data (:meth:`merge`, sharded calibration) gives exactly the histogram of one
    observer over all of it. It also keeps the exact ``max_abs``, the per-batch abs maxes' sum
    (exact, for ``avg_abs_max``) and the signed ``min`` / ``max`` (for asymmetric grids,
    :func:`qcore.quant.asymmetric_range`), so one calibration pass can score every algorithm of
    :mod:`qcore.thresholds`.
    """

    kind = "hist"
    _config_keys = ("bins",)
    _stat_keys: ClassVar[dict[str, Conv]] = {
        "counts": _ints,
        "upper": float,
        "max_abs": float,
        "min": float,
        "max": float,
        "batch_abs_max_total": int,  # in units of 2**-1074, the smallest float64: an exact sum
        "batches": int,
        "count": int,
    }

    def __init__(self, bins: int = 4096) -> None:
        if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or bins < 1 or bins & (bins - 1):
            raise ConfigError(f"bins={bins!r} is invalid; use a power of two (the grid doubles exactly), e.g. 4096")
        self.bins = int(bins)
        self.counts = np.zeros(self.bins, dtype=np.int64)
        self.upper = 0.0
        self.max_abs = 0.0
        self.min = 0.0
        self.max = 0.0
        self.batch_abs_max_total = 0
        self.batches = 0
        self.count = 0

    @property
    def bin_width(self) -> float:
        return self.upper / self.bins

    @property
    def avg_abs_max(self) -> float:
        """Mean of the per-batch abs max (the statistic of the ``avg`` algorithm), correctly rounded."""
        self._require_data()
        return self.batch_abs_max_total / (self.batches << _SUBNORMAL_BITS)

    def _load(self, state: dict[str, Any]) -> None:
        super()._load(state)
        if self.counts.shape != (self.bins,):
            raise DataError(f"state has {self.counts.size} counts for bins={self.bins}; pass an unmodified state")
        if self.upper != 0.0 and math.frexp(self.upper)[0] != 0.5:
            raise DataError(f"state has upper={self.upper!r}, not a power of two; recalibrate (the state is "
                            "from an older qcore, whose histogram grid started at the first batch's abs max)")

    def _rebinned(self, upper: float) -> NDArray[np.int64]:
        """The counts on the grid of ``upper`` (this range times ``2**k``): bin ``i`` goes to ``i >> k``."""
        if self.upper == 0.0:  # everything seen so far is 0 and sits in bin 0 whatever the range
            return self.counts.copy()
        step = min(round(upper / self.upper), self.bins)
        counts = np.zeros_like(self.counts)
        counts[: self.bins // step] = self.counts.reshape(-1, step).sum(axis=1)
        return counts

    def update(self, array: ArrayLike) -> None:
        a = np.asarray(array)
        if a.dtype != np.float32 or a.size == 0:  # float32 activations skip the float64 copy
            a = as_finite(a)
        lo, hi = float(a.min()), float(a.max())
        if not (math.isfinite(lo) and math.isfinite(hi)):  # NaN propagates through min and max
            as_finite(array)  # raises the DataError that counts them
        m = max(-lo, hi)  # the abs max, without another pass over the batch
        a = np.abs(a).ravel()
        self.min, self.max = (min(self.min, lo), max(self.max, hi)) if self.count else (lo, hi)
        if m >= self.upper and m > 0.0:
            upper = _power_of_two_above(m)
            self.counts, self.upper = self._rebinned(upper), upper
        if self.upper > 0.0:  # bins and upper are powers of two: the scaling is exact, |x| < upper
            self.counts += np.bincount((a * np.float64(self.bins / self.upper)).astype(np.int64),
                                       minlength=self.bins)
        else:
            self.counts[0] += a.size
        self.max_abs = max(self.max_abs, m)
        self.batch_abs_max_total += _exact(m)
        self.batches += 1
        self.count += a.size

    def _merge(self, other: HistogramObserver) -> None:
        """Bring both histograms to the larger range (both powers of two) and add the counts: exact."""
        upper = max(self.upper, other.upper)
        self.counts = self._rebinned(upper) + other._rebinned(upper)
        self.upper = upper
        self.max_abs = max(self.max_abs, other.max_abs)
        self.min, self.max = min(self.min, other.min), max(self.max, other.max)
        self.batch_abs_max_total += other.batch_abs_max_total
        self.batches += other.batches
        self.count += other.count

    def threshold(self, algo: str = "kl", bits: int = 8, **opts: Any) -> float:
        """Threshold chosen by ``algo`` (see :func:`qcore.thresholds.search_threshold`)."""
        self._require_data()
        return search_threshold(algo, self, bits, **opts)


#: Every finite float64 is an integer multiple of ``2**-_SUBNORMAL_BITS``.
_SUBNORMAL_BITS = 1074


def _exact(value: float) -> int:
    """``value`` (a finite float) in units of ``2**-1074``, exactly: sums of these do not depend on the order."""
    numerator, denominator = float(value).as_integer_ratio()  # denominator: a power of two <= 2**1074
    return numerator << (_SUBNORMAL_BITS - denominator.bit_length() + 1)


def _power_of_two_above(value: float) -> float:
    """The smallest power of two strictly above ``value`` (> 0)."""
    return math.ldexp(1.0, math.frexp(value)[1])


OBSERVERS: dict[str, type[Observer]] = {
    "abs_max": AbsMaxObserver,
    "channel_wise_abs_max": ChannelWiseAbsMaxObserver,
    "min_max": MinMaxObserver,
    "moving_average_abs_max": MovingAverageAbsMaxObserver,
    "range_abs_max": RangeAbsMaxObserver,
    "hist": HistogramObserver,
}


def make_observer(name: str, **kwargs: Any) -> Observer:
    """Build an observer by name (one of :data:`OBSERVERS`, case-insensitive) with its settings."""
    cls = OBSERVERS.get(str(name).lower())
    if cls is None:
        raise ConfigError(
            f"unknown observer {name!r}{did_you_mean(str(name).lower(), OBSERVERS)}; use one of {sorted(OBSERVERS)}"
        )
    extra = sorted(set(kwargs) - set(cls._config_keys))
    if extra:
        raise ConfigError(f"observer {name!r} has no option {extra}; its options are {list(cls._config_keys)}")
    return cls(**kwargs)
