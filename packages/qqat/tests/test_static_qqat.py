from __future__ import annotations

import numpy as np
import paddle
import pytest

from qcore.errors import ConfigError, GraphError, QuantError
from qcore.inference import predict
from qcore.model_io import find_model_files
from qcore.paddle_env import static_mode
from qdemo import load_demo_data
from qqat import convert, int8_values, quant_aware

CONFIG = {"weight_quantize_type": "channel_wise_abs_max"}
ACT_OP = "pd_op.fake_quantize_dequantize_moving_average_abs_max"
WEIGHT_OP = "pd_op.fake_channel_wise_quantize_dequantize_abs_max"


class Net:
    """A small conv net as a PIR training program and its test clone (not yet quantized)."""

    def __init__(self, conv_name: str = "conv_a") -> None:
        self.main, self.startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(self.main, self.startup):
            self.image = paddle.static.data("image", [None, 1, 28, 28], "float32")
            self.label = paddle.static.data("label", [None], "int64")
            conv = paddle.nn.Conv2D(1, 8, 3, padding=1, weight_attr=paddle.ParamAttr(name=f"{conv_name}.w_0"))
            h = paddle.nn.functional.max_pool2d(paddle.nn.functional.relu(conv(self.image)), 2)
            h = paddle.nn.functional.relu(paddle.nn.Conv2D(8, 8, 3, padding=1, groups=8)(h))
            self.logits = paddle.nn.Linear(8 * 14 * 14, 10)(paddle.flatten(h, 1))
            self.loss = paddle.nn.functional.cross_entropy(self.logits, self.label)
        mapping = paddle.pir.IrMapping()  # PIR's clone() has no for_test: clone the forward program
        self.test = self.main.clone(mapping)
        self.test_logits, self.test_image = mapping.look_up(self.logits), mapping.look_up(self.image)
        self.scope = paddle.static.Scope()
        self.exe = paddle.static.Executor(paddle.CPUPlace())

    def minimize(self, lr: float = 1e-3) -> None:
        with paddle.static.program_guard(self.main, self.startup):
            paddle.optimizer.Adam(lr).minimize(self.loss)
        with paddle.static.scope_guard(self.scope):
            self.exe.run(self.startup)

    def train(self, steps: int, seed: int = 0) -> float:
        x, y = load_demo_data("train")
        rng = np.random.default_rng(seed)
        with paddle.static.scope_guard(self.scope):
            for _ in range(steps):
                idx = rng.integers(0, len(x), 64)
                (loss,) = self.exe.run(self.main, feed={"image": x[idx], "label": y[idx]}, fetch_list=[self.loss])
        return float(loss)

    def run(self, program, fetch, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        with paddle.static.scope_guard(self.scope):
            return self.exe.run(program, feed={"image": x, "label": y}, fetch_list=[fetch])[0]

    def param(self, name: str) -> np.ndarray:
        return np.array(self.scope.find_var(name).get_tensor())


@pytest.fixture(autouse=True)
def _static():
    with static_mode("pir"):
        yield


def _types(program) -> list[str]:
    return [op.name() for op in program.global_block().ops]


def test_train_program_gets_fake_quant_with_gradients_and_moving_average_state():
    net = Net()
    quant_aware(net.main, paddle.CPUPlace(), CONFIG, scope=net.scope)
    types = _types(net.main)
    assert types.count(ACT_OP + "_") == 3 and types.count(WEIGHT_OP) == 3
    net.minimize()
    types = _types(net.main)
    assert types.count(WEIGHT_OP + "_grad") == 3  # the STE backward is in the program
    assert types.count(ACT_OP + "_grad") == 2  # the image needs no gradient
    w0 = net.param("conv_a.w_0").copy()
    x, y = load_demo_data("train")
    maxes = []
    with paddle.static.scope_guard(net.scope):
        for i in range(3):
            batch = x[i * 64 : (i + 1) * 64]
            net.exe.run(net.main, feed={"image": batch, "label": y[i * 64 : (i + 1) * 64]})
            maxes.append(float(np.abs(batch).max()))
    accum = state = 0.0
    for m in maxes:
        accum, state = 0.9 * accum + m, 0.9 * state + 1
    assert net.param("conv_a.w_0@act0@scale")[0] == pytest.approx(accum / state, rel=1e-5)
    assert net.param("conv_a.w_0@act0@state")[0] == pytest.approx(state, rel=1e-6)
    assert np.abs(net.param("conv_a.w_0") - w0).max() > 1e-4  # gradients reached the float weights


def test_abs_max_activations_keep_the_last_batch_scale():
    net = Net()
    quant_aware(net.main, paddle.CPUPlace(), {"activation_quantize_type": "abs_max"}, scope=net.scope)
    assert _types(net.main).count("pd_op.fake_quantize_dequantize_abs_max") == 3
    net.minimize()
    x, y = load_demo_data("train")
    with paddle.static.scope_guard(net.scope):
        for i in range(2):
            net.exe.run(net.main, feed={"image": x[i * 64 : (i + 1) * 64], "label": y[i * 64 : (i + 1) * 64]})
    assert net.param("conv_a.w_0@act0@scale")[0] == pytest.approx(float(np.abs(x[64:128]).max()), rel=1e-6)


def test_test_program_convert_and_int8_agree_and_deploy(tmp_path, caplog):
    net = Net()
    quant_aware(net.main, paddle.CPUPlace(), CONFIG, scope=net.scope)
    quant_aware(net.test, paddle.CPUPlace(), CONFIG, scope=net.scope, for_test=True)
    test_acts = [op for op in net.test.global_block().ops if op.name() == ACT_OP]
    assert len(test_acts) == 3 and all(op.attrs()["is_test"] for op in test_acts)
    net.minimize()
    net.train(150)
    x, y = load_demo_data("test")
    x, y = x[:1000], y[:1000]
    simulated = net.run(net.test, net.test_logits, x, y)
    assert (simulated.argmax(1) == y).mean() > 0.7  # it learned
    program, int8_program = convert(net.test, paddle.CPUPlace(), CONFIG, scope=net.scope, save_int8=True,
                                    deploy_backend="openvino")
    assert "openvino runs PIR programs with float kernels" in caplog.text
    assert program is net.test and WEIGHT_OP not in _types(program) and _types(program).count(ACT_OP) == 3
    frozen = net.run(program, net.test_logits, x, y)
    np.testing.assert_allclose(frozen, simulated, atol=2e-2)  # a rare activation sits on a rounding tie
    # the frozen float weights sit on the int8 grid of their per-channel scale
    w = net.param("conv_a.w_0.quant_dequant")
    steps = w / (np.abs(w).reshape(8, -1).max(1) / 127).reshape(8, 1, 1, 1)
    np.testing.assert_allclose(steps, np.round(steps), atol=1e-3)
    (logits8,) = int8_values(int8_program, [net.test_logits])
    np.testing.assert_allclose(net.run(int8_program, logits8, x, y), simulated, atol=2e-2)
    image = net.test_image
    with paddle.static.scope_guard(net.scope):
        paddle.static.save_inference_model(str(tmp_path / "f" / "m"), [image], [net.test_logits], net.exe,
                                           program=program)
        paddle.static.save_inference_model(str(tmp_path / "i" / "m"), int8_values(int8_program, [image]),
                                           [logits8], net.exe, program=int8_program)
    sizes = {}
    for kind in ("f", "i"):
        files = find_model_files(tmp_path / kind)
        deployed = predict(files, {"image": x})[0]
        np.testing.assert_allclose(deployed, simulated, atol=2e-2)  # a rare activation sits on a rounding tie
        sizes[kind] = files.params_file.stat().st_size
    assert sizes["i"] < 0.3 * sizes["f"]


def test_hooks_replace_and_precede_the_built_in_quantizers():
    net = Net()
    calls = {"w": 0}

    def act_preprocess(x):  # PACT with a named (so shareable) learnable bound
        alpha = paddle.static.create_parameter(
            [1], "float32", name=f"pact_{calls['w']}.alpha", default_initializer=paddle.nn.initializer.Constant(3.0)
        )
        return x - paddle.nn.functional.relu(x - alpha) + paddle.nn.functional.relu(-x - alpha)

    def weight_quantize(w):  # 4-bit per-tensor fake quant written with ordinary ops
        calls["w"] += 1
        scale = paddle.max(paddle.abs(w)) / 7
        return w + (paddle.round(w / scale) * scale - w).detach()

    quant_aware(net.main, paddle.CPUPlace(), CONFIG, scope=net.scope, weight_quantize_func=weight_quantize,
                act_preprocess_func=act_preprocess)
    assert calls["w"] == 3 and WEIGHT_OP not in _types(net.main)
    assert net.param("pact_0.alpha")[0] == 3.0  # initialised right away in the scope
    net.minimize(lr=0.05)
    net.train(20)
    # the image (pact_0) never exceeds 3; the first conv's output does, so its bound is trained
    assert net.param("pact_0.alpha")[0] == 3.0
    assert abs(net.param("pact_1.alpha")[0] - 3.0) > 0.05


def test_act_quantize_and_weight_preprocess_hooks():
    net = Net()
    seen = []

    def act_quantize(x):  # replaces the built-in activation op
        seen.append("act")
        return paddle.round(x * 8) / 8

    def weight_preprocess(w):  # runs before the built-in weight op
        seen.append("weight")
        return paddle.clip(w, -0.2, 0.2)

    quant_aware(net.main, paddle.CPUPlace(), CONFIG, scope=net.scope, act_quantize_func=act_quantize,
                weight_preprocess_func=weight_preprocess)
    types = _types(net.main)
    assert seen.count("act") == 3 and seen.count("weight") == 3
    assert ACT_OP + "_" not in types and types.count(WEIGHT_OP) == 3
    clip = next(op for op in net.main.global_block().ops if op.name() == WEIGHT_OP).operand_source(0)
    assert clip.get_defining_op().name() == "pd_op.clip"


def test_skip_pattern_full_quantize_and_tensorrt_op_sets():
    net = Net(conv_name="skip_quant_conv")
    quant_aware(net.main, paddle.CPUPlace(), CONFIG, scope=net.scope)
    assert _types(net.main).count(WEIGHT_OP) == 2  # the first conv's weight name matches 'skip_quant'
    full = Net()
    quant_aware(full.main, paddle.CPUPlace(), {"is_full_quantize": True}, scope=full.scope)
    pool = next(op for op in full.main.global_block().ops if op.name() == "pd_op.pool2d")
    assert pool.operand_source(0).get_defining_op().name() == ACT_OP + "_"
    trt = Net()
    quant_aware(trt.main, paddle.CPUPlace(), {"for_tensorrt": True}, scope=trt.scope)
    # inputs of conv, depthwise, fc (3) and pool2d (1), and the float inputs of the three bias adds
    # (5: a conv bias reaches its add through a reshape, so it is an activation there)
    assert _types(trt.main).count(WEIGHT_OP) == 3 and _types(trt.main).count(ACT_OP + "_") == 9


def test_bad_programs_and_configs():
    net = Net()
    with pytest.raises(ConfigError, match="did you mean 'weight_quantize_type'"):
        quant_aware(net.main, paddle.CPUPlace(), {"weight_quantize_typ": "abs_max"})
    with pytest.raises(ConfigError, match="not accepted here"):
        quant_aware(net.main, paddle.CPUPlace(), {"quantizable_layer_type": ["Conv2D"]})
    with pytest.raises(ConfigError, match="activation_bits=0"):
        convert(net.main, paddle.CPUPlace(), {"activation_bits": 0})
    with pytest.raises(QuantError, match="quant_aware.*for_test=True"):
        convert(net.main, paddle.CPUPlace(), CONFIG)  # nothing inserted yet
    quant_aware(net.main, paddle.CPUPlace(), CONFIG, scope=net.scope)
    with pytest.raises(QuantError, match="takes the test program"):
        convert(net.main, paddle.CPUPlace(), CONFIG, scope=net.scope)
    with pytest.raises(ConfigError, match="unknown deploy backend 'openvno'"):
        convert(net.main, paddle.CPUPlace(), CONFIG, scope=net.scope, deploy_backend="openvno")
    with pytest.raises(GraphError, match="save_int8"):
        int8_values(net.test, [])
    with pytest.raises(QuantError, match=r"takes a paddle.static.Program \(legacy\) or paddle.pir.Program; got dict"):
        quant_aware({}, paddle.CPUPlace(), CONFIG)  # legacy programs: test_legacy_static_qat.py
