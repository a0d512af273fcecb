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


@pytest.fixture
def llama_cpp_deviation():
    """``(GGUF file, ids [1, T], simulated logits, float logits [1, T, vocab]) -> (llama.cpp's largest logit
    difference from the simulation, the simulation's from float, their top-1 agreement)``; skips without
    llama-cpp-python (benchmarks/requirements-llm.txt builds it)."""
    pytest.importorskip("llama_cpp")
    from qptq.llm.route import llama_cpp_logits

    def deviation(path, ids, sim_logits, float_logits):
        theirs, ours = llama_cpp_logits(path, ids), sim_logits[0]
        return (float(np.abs(theirs - ours).max()), float(np.abs(ours - float_logits[0]).max()),
                float(np.mean(theirs.argmax(-1) == ours.argmax(-1))))

    return deviation


@pytest.fixture
def assert_gguf_is_simulation():
    """``(GGUF file, simulated model, ids [1, T], its simulated and float logits)``: asserts the file read back is
    the model, parameter by parameter and in its logits, bit for bit (and that the model is not float's)."""
    paddle = pytest.importorskip("paddle")
    from qptq.llm.llama import load_gguf

    def check(path, model, ids, sim_logits, float_logits):
        reread, _ = load_gguf(path)
        state = model.state_dict()
        for name, value in reread.state_dict().items():
            np.testing.assert_array_equal(value.numpy(), state[name].numpy(), err_msg=name)
        with paddle.no_grad():
            np.testing.assert_array_equal(reread(paddle.to_tensor(ids))[0].numpy(), sim_logits)
        assert np.abs(sim_logits - float_logits).max() > 1e-3  # quantized: the comparison above is not float's

    return check
