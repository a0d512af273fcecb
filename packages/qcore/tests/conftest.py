from __future__ import annotations

import numpy as np
import paddle
import pytest

from qdemo.testing import FORMATS, make_tiny_net, sample_input, save_tiny_net


@pytest.fixture(scope="session")
def tiny_net():
    return make_tiny_net()


@pytest.fixture(scope="session")
def tiny_input() -> np.ndarray:
    return sample_input()


@pytest.fixture(scope="session")
def tiny_reference(tiny_net, tiny_input) -> np.ndarray:
    return tiny_net(paddle.to_tensor(tiny_input)).numpy()


@pytest.fixture(scope="session", params=FORMATS)
def tiny_model(request, tiny_net, tmp_path_factory):
    """(directory, load kwargs, format) of the tiny net saved in each supported format."""
    directory = tmp_path_factory.mktemp("models") / request.param
    kwargs = save_tiny_net(tiny_net, directory, request.param)
    return directory, kwargs, request.param
