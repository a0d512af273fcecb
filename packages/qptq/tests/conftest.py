from __future__ import annotations

import numpy as np
import pytest

from qcore.model_io import load_model
from qdemo import demo_model_dir, load_demo_data
from qdemo.testing import make_tiny_net, sample_input, save_tiny_net


@pytest.fixture(scope="session")
def demo_data():
    calib, _ = load_demo_data("calib")
    x, y = load_demo_data("test")
    return calib[:100], x[:600], y[:600]


@pytest.fixture(scope="session", params=["legacy", "pir"])
def demo_model(request, demo_data):
    """(model dir, float top-1 on the test slice) of the bundled demo CNN in each family."""
    directory = demo_model_dir(request.param)
    _, x, y = demo_data
    logits = load_model(directory).run({"image": x})[0]
    return directory, float((logits.argmax(1) == y).mean())


@pytest.fixture(scope="session", params=["pir", "legacy_pdmodel", "legacy_combined"])
def tiny_model(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny") / request.param
    kwargs = save_tiny_net(make_tiny_net(), directory, request.param)
    return directory, kwargs


@pytest.fixture(scope="session")
def tiny_input() -> np.ndarray:
    return sample_input(8)
