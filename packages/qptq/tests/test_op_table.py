"""Supporting a new op is one entry in ``qcore.optable.OP_TABLE``: its kind does the rest."""

from __future__ import annotations

import numpy as np

from qcore.model_io import load_model
from qcore.optable import LAYOUT, OP_TABLE, OpSpec
from qptq import quant_post_static


def test_one_table_entry_makes_an_op_quantizable(tiny_model, tiny_input, tmp_path, monkeypatch):
    """TinyConvNet's flatten is in no table; one entry of kind ``layout`` quantizes its input."""
    directory, kwargs = tiny_model
    monkeypatch.setitem(OP_TABLE, "flatten", OpSpec(LAYOUT, ("flatten_contiguous_range",), ("pd_op.flatten",)))
    report = quant_post_static(None, directory, tmp_path / "int8", sample_generator=lambda: iter(tiny_input),
                               batch_size=4, algo="abs_max", quantizable_op_type=["conv2d", "flatten"], **kwargs)
    layers = {layer["op"]: layer for layer in report["layers"]}
    assert set(layers) == {"conv2d", "flatten"}
    (flatten_input,) = layers["flatten"]["inputs"].values()  # the depthwise conv's relu output
    assert flatten_input["threshold"] > 0 and "weight" not in layers["flatten"]
    float_out = load_model(directory, **kwargs).run({"x": tiny_input})[0]
    quantized = load_model(tmp_path / "int8").run({"x": tiny_input})[0]
    assert 0 < np.abs(quantized - float_out).max() < 0.05 * np.abs(float_out).max()
