"""Turning the seeds' data sources into feed dicts, one batch at a time.

Accepted: ``sample_generator`` (a callable returning an iterator of samples, batched here by
``batch_size``), ``batch_generator`` (a callable returning an iterator of batches), or
``data_loader`` (any iterable of batches, e.g. a ``paddle.io.DataLoader``); as in PaddleSlim, a
``data_loader`` given with a ``sample_generator`` is the one used. A sample or batch is a dict
``{feed_name: array}``, a list of such dicts (a static-mode ``DataLoader(feed_list=...,
return_list=False)`` yields one per place: they are joined along the batch axis), a tuple/list
ordered like the model's feeds (extra items such as labels are ignored), or a single array for a
one-input model. Arrays may be numpy arrays, ``paddle.Tensor`` or static-mode ``DenseTensor``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any

import numpy as np

from qcore.config import validate_positive_int
from qcore.errors import DataError

FeedSpec = tuple[tuple[int, ...], str]  # (shape with -1 for free dims, dtype name): Model.feed_specs()


def _as_array(value: Any) -> np.ndarray:
    return value.numpy() if hasattr(value, "numpy") else np.array(value)


def to_feed(item: Any, feed_names: Sequence[str]) -> dict[str, np.ndarray]:
    """One batch (or sample) as ``{feed_name: array}``."""
    if isinstance(item, (list, tuple)) and item and all(isinstance(part, dict) for part in item):
        places = [to_feed(part, feed_names) for part in item]  # one dict per place
        return places[0] if len(places) == 1 else {n: np.concatenate([p[n] for p in places]) for n in feed_names}
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
    first = 0  # index of the chunk's first sample
    while True:
        chunk = [to_feed(s, feed_names) for s in islice(it, batch_size)]
        if not chunk:
            return
        yield {n: _stacked([c[n] for c in chunk], n, first) for n in feed_names}
        first += len(chunk)


def _stacked(arrays: Sequence[np.ndarray], name: str, first: int) -> np.ndarray:
    """One batch of ``name`` from samples ``first``, ``first + 1``, ...; refused when their shapes differ."""
    for i, array in enumerate(arrays):
        if array.shape != arrays[0].shape:
            raise DataError(
                f"sample {first + i}, feed {name!r}: shape {tuple(array.shape)} differs from "
                f"{tuple(arrays[0].shape)} of sample {first} in the same batch; for samples of different shapes "
                "use a batch_generator or data_loader yielding batches of equal shapes, or batch_size=1"
            )
    return np.stack(arrays)


def check_batch_arguments(sources: Sequence[Any], batch_size: Any, batch_nums: Any) -> None:
    """Refuse, before any work, a call without exactly one data source (a ``data_loader`` may come with a
    ``sample_generator``: it wins) or with bad batch numbers. ``sources``: sample generator, batch generator,
    data loader."""
    sample_generator, batch_generator, data_loader = sources
    given = [s for s in (batch_generator, data_loader if data_loader is not None else sample_generator)
             if s is not None]
    if len(given) != 1:
        raise DataError(
            f"pass exactly one of sample_generator, batch_generator or data_loader (got {len(given)})"
        )
    validate_positive_int("batch_size", batch_size)
    if batch_nums is not None:
        validate_positive_int("batch_nums", batch_nums)


def check_feed(feed: dict[str, np.ndarray], specs: Mapping[str, FeedSpec], batch: int) -> None:
    """Refuse a batch whose arrays do not fit the model's declared inputs (rank, fixed dims, dtype kind)."""
    for name, array in feed.items():
        shape, dtype = specs[name]
        where = f"calibration batch {batch}, feed {name!r}"
        if array.dtype.kind not in "biuf":
            raise DataError(f"{where}: dtype {array.dtype} is not numeric; the model expects {dtype}")
        fits = len(array.shape) == len(shape) and all(d < 0 or d == a for d, a in zip(shape, array.shape))
        if not fits:
            raise DataError(
                f"{where}: shape {tuple(array.shape)} does not fit the model's input {shape} (-1 = any); "
                "resize the samples or check the sample/batch generator"
            )


def feed_batches(
    feed_names: Sequence[str],
    *,
    sample_generator: Callable[[], Iterable[Any]] | None = None,
    batch_generator: Callable[[], Iterable[Any]] | None = None,
    data_loader: Iterable[Any] | None = None,
    batch_size: int = 16,
    batch_nums: int | None = None,
    specs: Mapping[str, FeedSpec] | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """Feed dicts from exactly one of the three sources, at most ``batch_nums`` of them.

    With the model's feed ``specs`` every batch is checked against them (:func:`check_feed`), and
    data whose float feeds never vary (all zeros, one constant) is refused at the end.
    """
    check_batch_arguments((sample_generator, batch_generator, data_loader), batch_size, batch_nums)
    if sample_generator is not None and data_loader is None:
        batches: Iterable[dict[str, np.ndarray]] = _batched(_call(sample_generator), feed_names, batch_size)
    else:
        source = _call(batch_generator) if batch_generator is not None else data_loader
        batches = (to_feed(b, feed_names) for b in source)  # type: ignore[union-attr]
    count = 0
    ranges: dict[str, tuple[float, float]] = {}
    for batch in islice(batches, batch_nums):
        if specs is not None:
            check_feed(batch, specs, count)
        for name, array in batch.items():
            if array.dtype.kind == "f" and array.size:
                lo, hi = ranges.get(name, (np.inf, -np.inf))
                ranges[name] = (min(lo, float(array.min())), max(hi, float(array.max())))
        count += 1
        yield batch
    if count == 0:
        raise DataError("calibration data is empty: the generator/loader yielded no batch; check the reader")
    if ranges and all(lo == hi for lo, hi in ranges.values()):
        value = next(iter(ranges.values()))[0]
        raise DataError(
            f"calibration data is constant (every float input is {value:g} in all {count} batches): thresholds "
            "from it would be meaningless; feed real samples"
        )


def _call(source: Any) -> Iterable[Any]:
    return source() if callable(source) else source
