from __future__ import annotations

import numpy as np
import pytest

from qdemo import load_demo_data
from qdemo.qat import finetune_demo


@pytest.fixture(scope="session")
def demo_test() -> tuple[np.ndarray, np.ndarray]:
    return load_demo_data("test")


@pytest.fixture(scope="session")
def trained_qat():
    """The demo CNN after 300 QAT steps (Adam 1e-4, batch 64) from the float weights."""
    qat, net, _ = finetune_demo(steps=300)
    return qat, net
