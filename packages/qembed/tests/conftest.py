from __future__ import annotations

import numpy as np
import paddle
import pytest
from qembed_programs import build_static_program, saved_param_files

from qdemo.testing import EMBEDDING_INPUT_SPEC, FORMATS, TinyEmbeddingNet, save_tiny_net
from qembed import ext

VOCAB, DIM = 2000, 32


@pytest.fixture(scope="session")
def emb_net() -> TinyEmbeddingNet:
    """A table that dominates the model, with a few hot rows of large norm as real tables have."""
    paddle.seed(0)
    net = TinyEmbeddingNet(VOCAB, DIM)
    table = np.random.default_rng(0).normal(0, 0.05, (VOCAB, DIM)).astype(np.float32)
    table[1:20] *= 10
    table[0] = 0  # padding row
    net.emb.weight.set_value(table)
    net.eval()
    return net


@pytest.fixture(scope="session")
def ids() -> np.ndarray:
    rng = np.random.default_rng(1)
    batch = rng.integers(0, VOCAB, (32, 6)).astype(np.int64)
    batch[:4, :3] = np.arange(1, 13).reshape(4, 3)  # hot rows
    batch[4] = 0  # all padding
    return batch


@pytest.fixture(scope="session", params=FORMATS)
def emb_model(request, emb_net, tmp_path_factory):
    """(directory, load kwargs, format) of the embedding net in every on-disk format."""
    directory = tmp_path_factory.mktemp("emb") / request.param
    return directory, save_tiny_net(emb_net, directory, request.param, EMBEDDING_INPUT_SPEC), request.param


@pytest.fixture
def static_program():
    """:func:`qembed_programs.build_static_program`, for tests."""
    return build_static_program


@pytest.fixture
def save_params():
    """:func:`qembed_programs.saved_param_files`, for tests."""
    return saved_param_files


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The op registered in this process: the shipped library where this install has one for this Paddle, else
    this machine's build in a fresh cache directory."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ext.DIR_ENV, str(tmp_path_factory.mktemp("ext")))
        if ext.loaded() is None and ext.shipped() is None:
            if ext.compiler() is None:
                pytest.skip("no C++ compiler and no shipped library: the fused lookup is not available here (the "
                            "fallback tests still run)")
            ext.build()
        assert ext.load()
        yield ext.loaded()
