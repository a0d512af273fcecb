"""Progress of a long pass: tqdm's bar on a terminal; elsewhere (a log file, a pipe) one line when it ends, and, when
the number of steps is known, a line per step with the time left."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

try:
    from tqdm import tqdm
except ImportError:  # pragma: no cover - tqdm is a declared dependency
    tqdm = None

T = TypeVar("T")


class Progress:
    """Count steps of one pass named ``desc`` (``unit`` each; ``total`` when known, for the bar's time left);
    :meth:`close` ends it."""

    def __init__(self, desc: str, unit: str, total: int | None = None) -> None:
        self.desc, self.unit, self.count, self.start, self.total = desc, unit, 0, time.perf_counter(), total
        self.bar: Any = (tqdm(desc=desc, unit=unit, total=total) if tqdm is not None and sys.stderr.isatty()
                         else None)

    def step(self, *_: Any) -> None:
        self.count += 1
        if self.bar is not None:
            self.bar.update(1)
        elif self.total:
            spent = time.perf_counter() - self.start
            left = spent / self.count * (self.total - self.count)
            print(f"{self.desc}: {self.count}/{self.total} {self.unit}s, {spent:.0f} s, about {left:.0f} s left",
                  file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        else:
            print(f"{self.desc}: {self.count} {self.unit}{'es' if self.unit.endswith('h') else 's'} in "
                  f"{time.perf_counter() - self.start:.1f} s", file=sys.stderr, flush=True)


def progress(items: Iterable[T], desc: str, unit: str) -> Iterator[T]:
    """``items``, counted by a :class:`Progress`."""
    shown = Progress(desc, unit)
    try:
        for item in items:
            shown.step()
            yield item
    finally:
        shown.close()
