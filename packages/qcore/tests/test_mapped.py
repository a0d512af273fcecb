"""Dropping a memory-mapped array's pages: the process's file-backed resident memory falls by the array's size,
the values read afterwards are the file's, and an array in memory is left alone."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from qcore.mapped import drop_pages

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")


def _rss_file_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("RssFile:"))


def test_a_read_memory_map_leaves_the_process_and_reads_back_the_same(tmp_path):
    values = np.arange(16 * 2**20, dtype=np.int32).reshape(4096, -1)  # 64 MiB
    np.save(tmp_path / "codes.npy", values)
    mapped = np.load(tmp_path / "codes.npy", mmap_mode="r")
    view = mapped.T[::2]  # a view of the map, as the writers take codes.T
    assert int(view.sum(dtype=np.int64)) == int(values.T[::2].sum(dtype=np.int64))  # every page touched
    before = _rss_file_mb()
    drop_pages(view)
    after = _rss_file_mb()
    assert before - after > 48, (before, after)
    assert np.array_equal(mapped, values)  # mapped again from the file


def test_arrays_in_memory_are_left_alone():
    values = np.ones((256, 256), np.float32)
    drop_pages(values)
    drop_pages(values.T)
    assert values.sum() == 256 * 256
