from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from qcore.demo import demo_model_dir, load_demo_data
from qcore.inference import predict
from qcore.model_io import find_model_files, load_model


def test_data_splits_are_real_balanced_and_normalised():
    sizes = {"train": 6000, "calib": 1000, "test": 2000}
    for split, n in sizes.items():
        x, y = load_demo_data(split)
        assert x.shape == (n, 1, 28, 28) and x.dtype == np.float32
        assert np.bincount(y, minlength=10).tolist() == [n // 10] * 10
    x, _ = load_demo_data("test")
    assert abs(float(x.mean())) < 0.1 and 0.8 < float(x.std()) < 1.2  # normalised pixels
    assert len(np.unique(x[:50].round(3))) > 100  # real images, not a constant fill


@pytest.mark.parametrize("family", ["pir", "legacy"])
def test_bundled_model_reaches_its_recorded_accuracy(family):
    info = json.loads((Path(demo_model_dir(family)).parent / "model_info.json").read_text())
    x, y = load_demo_data("test")
    model = load_model(demo_model_dir(family))
    assert model.family == family
    logits = model.run({"image": x})[0]
    top1 = float((logits.argmax(1) == y).mean() * 100)
    assert abs(top1 - info["float_test_top1"]) <= 0.5
    deployed = predict(find_model_files(demo_model_dir(family)), {"image": x[:200]}, int8=False)[0]
    np.testing.assert_allclose(deployed, logits[:200], atol=1e-3)


def test_unknown_split_is_a_clear_error():
    with pytest.raises(Exception, match="did you mean 'test'"):
        load_demo_data("tst")
