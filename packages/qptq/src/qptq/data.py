"""Turning the seeds' data sources into feed dicts, one batch at a time.

Accepted: ``sample_generator`` (a callable returning an iterator of samples, batched here by
``batch_size``), ``batch_generator`` (a callable returning an iterator of batches), or
``data_loader`` (any iterable of batches, e.g. a ``paddle.io.DataLoader``). A sample or batch
is a dict ``{feed_name: array}``, a tuple/list ordered like the model's feeds (extra items
such as labels are ignored), or a single array for a one-input model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice
from typing import Any

import numpy as np

from qcore.errors import DataError


def _as_array(value: Any) -> np.ndarray:
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def to_feed(item: Any, feed_names: Sequence[str]) -> dict[str, np.ndarray]:
    """One batch (or sample) as ``{feed_name: array}``."""
    if isinstance(item, dict):
        missing = [n for n in feed_names if n not in item]
        if missing:
            raise DataError(
                f"calibration batch has keys {sorted(item)} but the model feeds {list(feed_names)}; "
                f"missing {missing}: rename the keys to the model's feed names"
            )
        return {n: _as_array(item[n]) for n in feed_names}
    items = list(item) if isinstance(item, (tuple, list)) else [item]
    if len(items) < len(feed_names):
        raise DataError(
            f"calibration batch has {len(items)} item(s) but the model feeds {list(feed_names)}; "
            "yield one array per feed, in this order"
        )
    return {n: _as_array(v) for n, v in zip(feed_names, items)}


def _batched(samples: Iterable[Any], feed_names: Sequence[str], batch_size: int) -> Iterator[dict[str, np.ndarray]]:
    it = iter(samples)
    while True:
        chunk = [to_feed(s, feed_names) for s in islice(it, batch_size)]
        if not chunk:
            return
        yield {n: np.stack([c[n] for c in chunk]) for n in feed_names}


def feed_batches(
    feed_names: Sequence[str],
    *,
    sample_generator: Callable[[], Iterable[Any]] | None = None,
    batch_generator: Callable[[], Iterable[Any]] | None = None,
    data_loader: Iterable[Any] | None = None,
    batch_size: int = 16,
    batch_nums: int | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """Feed dicts from exactly one of the three sources, at most ``batch_nums`` of them."""
    given = [s for s in (sample_generator, batch_generator, data_loader) if s is not None]
    if len(given) != 1:
        raise DataError(
            "pass exactly one of sample_generator, batch_generator or data_loader "
            f"(got {len(given)})"
        )
    if batch_size < 1:
        raise DataError(f"batch_size must be >= 1, got {batch_size}")
    if sample_generator is not None:
        batches: Iterable[dict[str, np.ndarray]] = _batched(_call(sample_generator), feed_names, batch_size)
    else:
        source = _call(batch_generator) if batch_generator is not None else data_loader
        batches = (to_feed(b, feed_names) for b in source)  # type: ignore[union-attr]
    count = 0
    for batch in islice(batches, batch_nums):
        count += 1
        yield batch
    if count == 0:
        raise DataError("calibration data is empty: the generator/loader yielded no batch; check the reader")


def _call(source: Any) -> Iterable[Any]:
    return source() if callable(source) else source
