"""quantize_(layer, WeightOnlyConfig(...)) on a small decoder-like block: the algorithms' layer errors, shared
AWQ scales, and the MatMulNBits export computing the simulation on ONNX Runtime and the OpenVINO runtime."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from qcore.errors import ConfigError, DataError
from qptq.weight_only.config import WeightOnlyConfig
from qptq.weight_only.layer import quantize_

onnx = pytest.importorskip("onnx")
F = paddle.nn.functional


class Block(paddle.nn.Layer):
    """q / k / v reading one normalised input, an output projection, a GELU MLP: the linears of a decoder layer."""

    def __init__(self, dim: int = 64, hidden: int = 128) -> None:
        super().__init__()
        self.norm = paddle.nn.LayerNorm(dim)
        self.q, self.k, self.v = (paddle.nn.Linear(dim, dim, bias_attr=False) for _ in range(3))
        self.o = paddle.nn.Linear(dim, dim)
        self.up = paddle.nn.Linear(dim, hidden)
        self.down = paddle.nn.Linear(hidden, dim, bias_attr=False)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        h = self.norm(x) * self.gain
        x = x + self.o(self.q(h) * F.sigmoid(self.k(h)) + self.v(h))
        return x + self.down(F.gelu(self.up(x)))


def _model() -> Block:
    paddle.seed(0)
    block = Block()
    gain = np.ones(64, np.float32)
    gain[[2, 9, 30]] = 20.0  # channels with large activations, as LLM hidden states have
    block.gain = paddle.to_tensor(gain)
    block.eval()
    return block


def _batches(seed: int, count: int = 6) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((2, t, 64)).astype("float32") for t in rng.integers(5, 17, count)]  # shapes differ


def _error(model, float_out, x) -> float:
    out = model(paddle.to_tensor(x)).numpy()
    return float(np.linalg.norm(out - float_out) / np.linalg.norm(float_out))


def test_each_algorithm_keeps_the_block_and_gptq_and_awq_beat_round_to_nearest():
    x = np.concatenate([b.reshape(-1, 64) for b in _batches(9)])[None]
    float_out = _model()(paddle.to_tensor(x)).numpy()
    errors = {}
    for name, config in {"rtn": WeightOnlyConfig(group_size=32), "gptq": WeightOnlyConfig(group_size=32, algo="gptq"),
                         "awq": WeightOnlyConfig(group_size=32, awq=True, clip_search=True),
                         "int8": WeightOnlyConfig(bits=8, group_size=32)}.items():
        model = _model()
        result = quantize_(model, config, _batches(1) if config.calibrated else None)
        assert len(result.codes) == 6 and {layer.bits for layer in result.layers} == {config.bits}
        errors[name] = _error(model, float_out, x)
        if name == "awq":  # q, k and v read one tensor: one set of scales, the outlier channels scaled most
            scales = result.input_scales
            shared = {scales[model.q.weight.name].tobytes(), scales[model.k.weight.name].tobytes()}
            assert len(shared) == 1 and result.input_scales[model.q.weight.name][[2, 9, 30]].min() > 1
    assert errors["int8"] < 0.01 < errors["rtn"] < 0.2
    # the block's output keeps its residual path float, which dilutes each layer's gain (per layer: test_gptq.py)
    assert errors["gptq"] < 0.9 * errors["rtn"] and errors["awq"] < 0.85 * errors["rtn"], errors


@pytest.mark.parametrize("config", [WeightOnlyConfig(group_size=32, algo="gptq"),
                                    WeightOnlyConfig(group_size=64, awq=True, symmetric=True),
                                    WeightOnlyConfig(bits=8, group_size=-1)], ids=["gptq", "awq-sym", "int8"])
def test_the_matmul_nbits_export_computes_the_simulation_on_both_runtimes(tmp_path, config):
    import onnxruntime as ort

    from qcore.export.nbits import FLOAT_ACTIVATIONS, INT8_ACTIVATIONS, replace_matmuls
    from qcore.export.paddle2onnx_float import float_onnx
    from qcore.model_io import find_model_files

    model = _model()
    result = quantize_(model, config, _batches(1))
    spec = [paddle.static.InputSpec([None, None, 64], "float32", "x")]
    paddle.jit.save(model, str(tmp_path / "sim" / "inference"), input_spec=spec)
    x = _batches(5, 1)[0]
    simulated = model(paddle.to_tensor(x)).numpy()
    outputs = {}
    for level in (FLOAT_ACTIVATIONS, INT8_ACTIVATIONS):
        exported = float_onnx(find_model_files(tmp_path / "sim"))
        assert replace_matmuls(exported, result.codes, result.input_scales, level) == 6
        kinds = [n.op_type for n in exported.graph.node]
        assert kinds.count("MatMulNBits") == 6 and "MatMul" not in kinds
        path = tmp_path / f"level{level}.onnx"
        onnx.save(exported, str(path))
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        outputs[level] = session.run(None, {"x": x})[0]
    relative = {k: float(np.linalg.norm(v - simulated) / np.linalg.norm(simulated)) for k, v in outputs.items()}
    # int8 activations per block: the 20x channels set their blocks' steps, ~2 % of the output
    assert relative[FLOAT_ACTIVATIONS] < 1e-5 and relative[INT8_ACTIVATIONS] < 5e-2, relative
    ov = pytest.importorskip("openvino")
    compiled = ov.Core().compile_model(str(tmp_path / f"level{FLOAT_ACTIVATIONS}.onnx"), "CPU",
                                       {"INFERENCE_PRECISION_HINT": "f32"})
    deployed = compiled({"x": x})[compiled.outputs[0]]
    assert np.linalg.norm(deployed - simulated) / np.linalg.norm(simulated) < 2e-2


def test_bad_weight_only_input_is_one_line_before_any_work():
    with pytest.raises(ConfigError, match=r"weight_bits=3 is not supported"):
        WeightOnlyConfig(bits=3)
    with pytest.raises(ConfigError, match=r"group_size=48 does not divide the 64 input channels; use one of \[32, 64"):
        quantize_(_model(), WeightOnlyConfig(group_size=48))
    with pytest.raises(ConfigError, match="needs calibration batches"):
        quantize_(_model(), WeightOnlyConfig(group_size=32, algo="gptq"))
    with pytest.raises(ConfigError, match="no paddle.nn.Linear"):
        quantize_(paddle.nn.Sequential(paddle.nn.ReLU()), WeightOnlyConfig())
    model = _model()
    before = model.q.weight.numpy().copy()
    with pytest.raises(DataError, match="reached no linear layer"):
        quantize_(model, WeightOnlyConfig(group_size=32, algo="gptq"), [], run=lambda m, b: None)
    np.testing.assert_array_equal(model.q.weight.numpy(), before)  # nothing changed


def test_mixed_precision_keeps_the_costliest_linears_in_int8_within_the_ratio():
    from qptq.weight_only.plan import WeightPlan, promoted

    x = np.concatenate([b.reshape(-1, 64) for b in _batches(9)])[None]
    float_out = _model()(paddle.to_tensor(x)).numpy()
    plain = _model()
    quantize_(plain, WeightOnlyConfig(group_size=32), _batches(1))
    mixed = _model()
    result = quantize_(mixed, WeightOnlyConfig(group_size=32, ratio=0.7), _batches(1))
    sizes = {layer.name: layer.shape[0] * layer.shape[1] for layer in result.layers}
    eight = {layer.name for layer in result.layers if layer.bits == 8}
    total = sum(sizes.values())
    assert eight and sum(sizes[n] for n in sizes if n not in eight) <= 0.7 * total
    assert _error(mixed, float_out, x) < _error(plain, float_out, x)
    # the choice by hand: int4 output error per weight, largest first, until the int4 share is within 70 %
    rng = np.random.default_rng(3)
    plans = {n: WeightPlan(rng.standard_normal((32, 32)) * scale, None, None, None) for n, scale in
             (("a", 1.0), ("b", 5.0), ("c", 2.0), ("d", 0.5))}
    for plan in plans.values():
        plan.quantize(WeightOnlyConfig(group_size=32), 4)
    assert promoted(plans, WeightOnlyConfig(group_size=32, ratio=0.5)) == ["b", "c"]
    assert promoted(plans, WeightOnlyConfig(group_size=32, ratio=0.75)) == ["b"]
    assert promoted(plans, WeightOnlyConfig(group_size=32)) == []
    with pytest.raises(ConfigError, match=r"ratio=0 is not valid; use the share of weights at 4 bits, in \(0, 1\]"):
        WeightOnlyConfig(ratio=0)


def test_a_group_size_that_does_not_divide_a_width_follows_the_fallback():
    from qptq.weight_only.config import layer_group

    assert layer_group(576, WeightOnlyConfig(group_size=128, group_size_fallback="adjust")) == (4, 64, False)  # SmolLM2
    assert layer_group(1536, WeightOnlyConfig(group_size=128, group_size_fallback="adjust")) == (4, 128, False)
    assert layer_group(100, WeightOnlyConfig(group_size=128, group_size_fallback="adjust")) == (8, -1, False)
    assert layer_group(576, WeightOnlyConfig(group_size=128, group_size_fallback="ignore")) is None
    with pytest.raises(ConfigError, match="group_size=128 does not divide the 576 input channels; use one of"):
        layer_group(576, WeightOnlyConfig(group_size=128))
    model = _model()  # 64-wide and 128-wide linears; group 128 adjusts to 64 on the 64-wide ones
    result = quantize_(model, WeightOnlyConfig(group_size=128, group_size_fallback="adjust"))
    assert {layer.name: layer.group_size for layer in result.layers} == {
        "q": 64, "k": 64, "v": 64, "o": 64, "up": 64, "down": 128}
    ignored = quantize_(_model(), WeightOnlyConfig(group_size=128, group_size_fallback="ignore"))
    assert [layer.name for layer in ignored.layers] == ["down"]


def _mlp() -> paddle.nn.Layer:
    paddle.seed(1)
    net = paddle.nn.Sequential(paddle.nn.Linear(64, 128), paddle.nn.ReLU(), paddle.nn.Linear(128, 64))
    net.eval()
    return net


@pytest.mark.parametrize("family", ["pir", "legacy_pdmodel"])
def test_quant_post_dynamic_int4_on_a_saved_model_writes_the_simulation_and_matmul_nbits(tmp_path, family):
    import onnxruntime as ort

    from qcore.deploy.onnx_runtimes import ONNX_FILE
    from qcore.model_io import load_model
    from qdemo.testing import save_tiny_net
    from qptq import quant_post_dynamic

    spec = [paddle.static.InputSpec([None, 64], "float32", "x")]
    save_tiny_net(_mlp(), tmp_path / "float", family, spec)
    before = {p.name: p.read_bytes() for p in (tmp_path / "float").iterdir()}
    rng = np.random.default_rng(0)
    # batches differ in shape; GPTQ needs more rows than inputs (a Hessian from fewer overfits them)
    batches = [rng.standard_normal((n, 64)).astype("float32") for n in (96, 80, 128, 112)]
    x = rng.standard_normal((6, 64)).astype("float32")
    float_out = load_model(tmp_path / "float").run({"x": x})[0]
    errors = {}
    for algo in ("rtn", "gptq"):
        out = tmp_path / algo
        files = quant_post_dynamic(str(tmp_path / "float"), str(out), weight_bits=4, group_size=32, algo=algo,
                                   deploy_backend="onnxruntime", batch_generator=lambda: iter(batches))
        simulated = load_model(files).run({"x": x})[0]
        errors[algo] = float(np.linalg.norm(simulated - float_out) / np.linalg.norm(float_out))
        model = onnx.load(str(out / ONNX_FILE))
        nbits = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
        assert len(nbits) == 2 and not [n for n in model.graph.node if n.op_type == "MatMul"]
        assert {a.name: a.i for a in nbits[0].attribute}["accuracy_level"] == 4
        deployed = ort.InferenceSession(str(out / ONNX_FILE), providers=["CPUExecutionProvider"]).run(
            None, {"x": x})[0]
        assert np.linalg.norm(deployed - simulated) / np.linalg.norm(simulated) < 2e-2
    # the layer API on the same float net gives the same round-to-nearest codes: one rule for both holders
    layer = _mlp()
    quantize_(layer, WeightOnlyConfig(group_size=32))
    np.testing.assert_allclose(layer(paddle.to_tensor(x)).numpy(), load_model(tmp_path / "rtn").run({"x": x})[0],
                               rtol=1e-5, atol=1e-5)
    assert errors["gptq"] < errors["rtn"] < 0.1, errors
    assert {p.name: p.read_bytes() for p in (tmp_path / "float").iterdir()} == before  # the input is untouched


def test_quant_post_dynamic_int4_refuses_what_it_cannot_deploy_before_any_work(tmp_path):
    from qdemo.testing import save_tiny_net
    from qptq import quant_post_dynamic

    save_tiny_net(_mlp(), tmp_path / "float", "pir", [paddle.static.InputSpec([None, 64], "float32", "x")])
    with pytest.raises(ConfigError, match="deploy_backend='onednn' has no int4 or group-wise matmul kernel"):
        quant_post_dynamic(str(tmp_path / "float"), str(tmp_path / "a"), weight_bits=4, deploy_backend="onednn")
    with pytest.raises(ConfigError, match="group_size=48 does not divide the 64 input channels"):
        quant_post_dynamic(str(tmp_path / "float"), str(tmp_path / "b"), weight_bits=4, group_size=48)
    with pytest.raises(ConfigError, match="needs calibration data"):
        quant_post_dynamic(str(tmp_path / "float"), str(tmp_path / "c"), weight_bits=4, group_size=32, algo="gptq")
    assert not any((tmp_path / d).exists() for d in "abc")
