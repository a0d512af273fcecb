"""A deployment target added in one module reaches every method through ``qcore.deploy.Deployment``.

``ToyTarget`` lives only here: it runs convs in int8, keeps every fc float with its own reason, wants
unsigned grids for never-negative tensors and saves a companion file listing what it quantized. Static
PTQ, weight-only PTQ and the QAT export quantize the test nets for it with no change anywhere else.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import paddle
import pytest

from qcore.deploy import DeployTarget
from qcore.errors import ConfigError
from qcore.graph import open_graph
from qcore.model_io import load_model
from qdemo.testing import TinyConvNet, make_tiny_net, sample_input, save_tiny_net

FC_REASON = "the toy runtime has no int8 fc"


class ToyTarget(DeployTarget):
    name = "toy"
    runtime = "a toy runtime (tests only)"
    int8_ops = frozenset({"conv2d", "depthwise_conv2d"})
    float_ops: ClassVar[dict[str, str]] = {"mul": FC_REASON, "matmul_v2": FC_REASON}
    int8_families = ("legacy", "pir")
    residual_adds = "none"
    asymmetric_activations = True
    activation_zero_points = True
    default_grids = "asymmetric"
    zero_on_grid = True

    def configure(self, config: Any, threads: int) -> None:
        config.disable_onednn()
        config.set_cpu_math_library_num_threads(threads)

    def companion_files(self, model: Any) -> dict[str, bytes]:
        quantized = [t for t in open_graph(model).op_types() if "quantize_linear" in t]
        return {"toy.txt": f"{len(quantized)} QDQ ops\n".encode()}

    def accepts(self, model_file: Any) -> str | None:
        return "the toy runtime opens no .pdmodel" if str(model_file).endswith(".pdmodel") else None


def _weights(files: Any) -> dict[str, str]:
    """Each parameter's dtype in a saved model."""
    graph = open_graph(load_model(files.directory))
    return {name: str(graph.get_param(name).dtype) for name in graph.param_names()}


@pytest.fixture
def tiny_pir(tmp_path: Path) -> Path:
    save_tiny_net(make_tiny_net(), tmp_path / "float", "pir")
    return tmp_path / "float"


def test_static_ptq_quantizes_for_a_target_added_in_one_module(tiny_pir, tmp_path):
    from qptq import quant_post_static

    x = sample_input(16)
    report = quant_post_static(None, str(tiny_pir), str(tmp_path / "out"), batch_size=8, algo="abs_max",
                               sample_generator=lambda: iter([[a] for a in x]), deploy_backend=ToyTarget())
    assert report["deploy_backend"] == "toy"
    layers = {layer["op"]: layer for layer in report["layers"]}
    assert layers["mul"]["left_float"] == f"toy: {FC_REASON}"
    assert "weight" in layers["conv2d"] and "weight" in layers["depthwise_conv2d"]
    # the depthwise conv reads a relu output: its 256 codes span [0, max], zero on code -128 (offset = 128 steps)
    dw_input = next(iter(layers["depthwise_conv2d"]["inputs"].values()))
    assert dw_input["offset"] == pytest.approx(dw_input["threshold"] * 128 / 127)
    files = load_model(tmp_path / "out").source
    quantized = [t for t in open_graph(load_model(files.directory)).op_types() if "quantize_linear" in t]
    assert (files.directory / "toy.txt").read_text() == f"{len(quantized)} QDQ ops\n"
    dtypes = _weights(files)
    assert sorted(d for d in dtypes.values() if d == "int8") == ["int8", "int8"]  # the two convs, not the fc
    float_out = load_model(tiny_pir).run({"x": x})[0]
    assert np.abs(load_model(tmp_path / "out").run({"x": x})[0] - float_out).max() < 0.05 * np.abs(float_out).max()


def test_a_target_refuses_what_it_cannot_open_before_any_work(tmp_path):
    from qptq import quant_post_static

    save_tiny_net(make_tiny_net(), tmp_path / "legacy", "legacy_pdmodel")
    with pytest.raises(ConfigError, match="deploy_backend='toy': the toy runtime opens no .pdmodel"):
        quant_post_static(None, str(tmp_path / "legacy"), str(tmp_path / "out"),
                          sample_generator=lambda: iter([]), deploy_backend=ToyTarget())
    assert not (tmp_path / "out").exists()


def test_weight_only_ptq_goes_through_the_same_door(tiny_pir, tmp_path):
    from qptq import quant_post_dynamic

    files = quant_post_dynamic(str(tiny_pir), str(tmp_path / "out"), quantizable_op_type=["conv2d", "mul"],
                               deploy_backend=ToyTarget())
    assert (files.directory / "toy.txt").exists()
    assert sorted(_weights(files).values()).count("int8") == 1  # the conv; the fc stays float for the toy runtime


def test_the_qat_export_goes_through_the_same_door(tmp_path):
    from qqat import QAT

    paddle.seed(0)
    net = TinyConvNet()
    qat = QAT()
    qat.quantize(net)
    net.train()
    for _ in range(2):
        net(paddle.to_tensor(sample_input(8)))
    spec = [paddle.static.InputSpec([None, 1, 8, 8], "float32", "x")]
    files = qat.save_quantized_model(net, tmp_path / "out" / "model", spec, deploy_backend=ToyTarget())
    assert qat.left_float == {net.fc.layer.weight.name: f"toy: {FC_REASON}"}
    assert (files.directory / "toy.txt").exists()
    with pytest.raises(ConfigError, match="the toy runtime opens no .pdmodel"):
        qat.save_quantized_model(net, tmp_path / "legacy" / "model", spec, family="legacy", deploy_backend=ToyTarget())
