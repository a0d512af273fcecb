"""Every batch form PaddleSlim-era callers hand the quantizers (qptq.data)."""

from __future__ import annotations

import logging

import numpy as np
import paddle
import pytest

from qcore.errors import DataError
from qptq import quant_post_static
from qptq.data import feed_batches, to_feed


def test_a_list_of_one_dict_per_place_is_one_batch():
    a, b = np.ones((2, 3), np.float32), np.zeros((3, 3), np.float32)
    one_place = to_feed([{"x": a, "label": np.arange(2)}], ["x"])
    assert list(one_place) == ["x"] and one_place["x"] is not a and np.array_equal(one_place["x"], a)
    two_places = to_feed([{"x": a}, {"x": b}], ["x"])  # joined along the batch axis
    assert two_places["x"].shape == (5, 3) and np.array_equal(two_places["x"][2:], b)
    tensor = to_feed([{"x": paddle.to_tensor(a)}], ["x"])  # paddle tensors become arrays
    assert isinstance(tensor["x"], np.ndarray) and np.array_equal(tensor["x"], a)
    with pytest.raises(DataError, match=r"missing \['x'\]"):
        to_feed([{"image": a}], ["x"])


def test_a_data_loader_given_with_a_sample_generator_wins_as_in_paddleslim():
    loader = [{"x": np.full((2, 3), 7.0, np.float32)}, {"x": np.full((2, 3), 8.0, np.float32)}]
    batches = list(feed_batches(["x"], sample_generator=lambda: iter(np.zeros((4, 3), np.float32)),
                                data_loader=loader))
    assert [float(b["x"][0, 0]) for b in batches] == [7.0, 8.0]
    with pytest.raises(DataError, match="exactly one"):
        list(feed_batches(["x"], batch_generator=lambda: iter(loader), data_loader=loader))


def test_quant_post_static_takes_both_and_says_which_it_used(tiny_model, tiny_input, tmp_path, caplog):
    directory, kwargs = tiny_model
    loader = [{"x": tiny_input[i:i + 2]} for i in range(0, len(tiny_input), 2)]
    with caplog.at_level(logging.INFO, logger="qptq.config"):
        report = quant_post_static(None, directory, tmp_path / "out", sample_generator=lambda: iter([]),
                                   data_loader=loader, batch_nums=2, **kwargs)
    assert report["batches"] == 2 and report["samples"] == 4
    assert "calibrating on the data_loader" in caplog.text


def test_samples_of_different_shapes_in_one_batch_are_one_line_naming_both():
    samples = [np.zeros((3, 4), np.float32), np.ones((3, 4), np.float32), np.ones((3, 5), np.float32)]
    with pytest.raises(DataError) as error:
        list(feed_batches(["x"], sample_generator=lambda: iter(samples), batch_size=4))
    message = str(error.value)
    assert "sample 2, feed 'x': shape (3, 5) differs from (3, 4) of sample 0" in message and "\n" not in message
    assert "batch_generator" in message and "batch_size=1" in message
    assert len(list(feed_batches(["x"], sample_generator=lambda: iter(samples), batch_size=1))) == 3
