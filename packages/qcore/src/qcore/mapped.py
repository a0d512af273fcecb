"""Arrays memory-mapped from files (``np.load(..., mmap_mode="r")``): :func:`drop_pages` takes a read array's pages
out of the process once it is used, so that reading a model's worth of mapped arrays one after another does not
leave them all resident (and counted in the process's RSS)."""

from __future__ import annotations

import mmap

import numpy as np


def drop_pages(array: np.ndarray) -> None:
    """Unmap the pages ``array`` (or the memory map it is a view of) has touched; nothing for an array in memory.
    The file keeps the data: a later read maps the pages again (from the page cache)."""
    base = array
    while base is not None and not isinstance(base, np.memmap):
        base = base.base if isinstance(base, np.ndarray) else None
    mapped = getattr(base, "_mmap", None)  # numpy's handle on the mapping (np.memmap has no public one)
    if isinstance(mapped, mmap.mmap) and not mapped.closed:
        mapped.madvise(mmap.MADV_DONTNEED)
