"""Static QAT on legacy programs, called as PaddleSlim-era scripts do (issue 31 item 4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest
from paddle.nn.initializer import Constant

from qcore.errors import ConfigError, QuantError
from qqat import convert, quant_aware

SCRIPT = Path(__file__).with_name("slim_static_qat_script.py")


@pytest.mark.parametrize("order", ["before", "after"])
def test_a_paddleslim_static_qat_script_trains_converts_and_deploys(tmp_path, order):
    env = {**os.environ, "FLAGS_enable_pir_api": "0"}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), order], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads((tmp_path / "result.json").read_text())
    assert r["last_loss"] < 0.5 * r["first_loss"]  # it trains through the fake quant ops
    assert r["initial_scales"] and set(r["initial_scales"].values()) == {0.0}  # learned from 0
    ops = r["train_ops"]
    assert ops.count("fake_quantize_dequantize_moving_average_abs_max") == 3  # conv, conv, fc inputs
    assert ops.count("fake_channel_wise_quantize_dequantize_abs_max") == 3  # their weights
    # the gradient ops read the quantized tensors (before: renamed; after: built on them by minimize)
    assert all(any(n.endswith(".quant_dequant") for n in inputs) for inputs in r["conv_grad_inputs"])
    assert len(r["conv_grad_inputs"]) == 2
    assert r["qat_top1"] > 0.7
    assert abs(r["deployed_top1"] - r["qat_top1"]) <= 0.015  # oneDNN int8 runs what QAT trained
    inference = r["inference_ops"]
    assert "fake_quantize_dequantize_moving_average_abs_max" not in inference
    assert inference.count("quantize_linear") >= 2 and inference.count("conv2d") == 2


def _legacy_program():
    paddle.enable_static()
    with paddle.pir_utils.OldIrGuard():
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            image = paddle.static.data(name="image", shape=[None, 1, 8, 8], dtype="float32")
            out = paddle.static.nn.conv2d(image, 4, 3)
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
    return main, out


def test_scale_dict_starts_the_scales_and_bad_keywords_are_one_line():
    main, _ = _legacy_program()
    scope = paddle.static.Scope()
    with paddle.pir_utils.OldIrGuard(), paddle.static.scope_guard(scope):
        test = main.clone(for_test=True)
        _, scales = quant_aware(test, paddle.CPUPlace(), None, scope=scope, for_test=True,
                                scale_dict={"image": 2.5}, return_scale_dict=True)
        assert scales == {"image": 2.5}
        with pytest.raises(ConfigError, match="calib_config .* is not supported; pass scale_dict"):
            quant_aware(main.clone(), paddle.CPUPlace(), None, calib_config={"batch_nums": 4})
        with pytest.raises(ConfigError, match="model_type='transformer' is not supported"):
            quant_aware(main.clone(), paddle.CPUPlace(), None, model_type="transformer")
        train = main.clone()
        quant_aware(train, paddle.CPUPlace(), None, scope=scope)
        with pytest.raises(QuantError, match="convert takes the test program"):
            convert(train, paddle.CPUPlace(), None, scope=scope)
        fresh, fresh_scope = main.clone(for_test=True), paddle.static.Scope()
        quant_aware(fresh, paddle.CPUPlace(), None, scope=fresh_scope, for_test=True)
        with pytest.raises(QuantError, match="an activation scale is still 0: train the program"):
            convert(fresh, paddle.CPUPlace(), None, scope=fresh_scope)
    paddle.disable_static()


def _pact(x):
    """PaddleSlim's user-defined PACT: clip to [-alpha, alpha] with a trained alpha (a LayerHelper parameter)."""
    helper = paddle.base.layer_helper.LayerHelper("pact")
    alpha = helper.create_parameter(attr=paddle.ParamAttr(name=x.name + "_pact", initializer=Constant(3.0)),
                                    shape=[1], dtype="float32")
    return x - F.relu(x - alpha) + F.relu(-alpha - x)


def _weight_4bit(w):
    """A custom weight quantizer written as legacy-era scripts do: Paddle's per-tensor fake quant at 4 bits."""
    helper = paddle.base.layer_helper.LayerHelper("weight_4bit")
    out, step = (helper.create_variable_for_type_inference("float32") for _ in range(2))
    helper.append_op(type="fake_quantize_dequantize_abs_max", inputs={"X": w},
                     outputs={"Out": out, "OutScale": step}, attrs={"bit_length": 4})
    return out


@pytest.mark.parametrize("minimize_first", [True, False])
def test_user_defined_hooks_train_a_legacy_program_and_convert(minimize_first):
    """PaddleSlim's user-defined quantization script (legacy static mode): a PACT act_preprocess_func and a
    custom weight_quantize_func are built into the training program, compute what they define, train (alpha
    and the weights move) and the test program converts. PaddleSlim's order minimizes first (optimizer_func
    trains alpha); minimizing last trains it with the program's optimizer."""
    from qdemo import load_demo_data

    x, y = load_demo_data("calib")
    tx, ty = load_demo_data("test")
    paddle.enable_static()
    scope = paddle.static.Scope()
    with paddle.pir_utils.OldIrGuard(), paddle.static.scope_guard(scope):
        paddle.seed(0)
        train, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(train, startup):
            image = paddle.static.data(name="image", shape=[None, 1, 28, 28], dtype="float32")
            label = paddle.static.data(name="label", shape=[None, 1], dtype="int64")
            conv = paddle.static.nn.conv2d(image, 8, 3, act="relu")
            logits = paddle.static.nn.fc(F.max_pool2d(conv, 2), 10)
            loss = paddle.mean(F.cross_entropy(logits, label))
            test = train.clone(for_test=True)
            opt = paddle.optimizer.Adam(0.003)
            if minimize_first:
                opt.minimize(loss)
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        config = {"quantize_op_types": ["conv2d", "mul"]}
        quant_aware(train, paddle.CPUPlace(), config, scope=scope, act_preprocess_func=_pact,
                    weight_quantize_func=_weight_4bit, optimizer_func=lambda: paddle.optimizer.Adam(0.01),
                    executor=exe)
        if not minimize_first:
            with paddle.static.program_guard(train, startup):
                opt.minimize(loss)
            exe.run(startup)
        quant_aware(test, paddle.CPUPlace(), config, scope=scope, for_test=True)
        block = train.global_block()
        types = [op.type for op in block.ops]
        assert types.count("fake_quantize_dequantize_abs_max") == 2  # the weight function, per weight
        assert "fake_channel_wise_quantize_dequantize_abs_max" not in types  # it replaces the built-in one
        assert types.count("fake_quantize_dequantize_moving_average_abs_max") == 2  # after PACT, per input
        conv_op, fc_op = (next(op for op in block.ops if op.type == t) for t in ("conv2d", "mul"))
        filt, fc_in = conv_op.input("Filter")[0], fc_op.input("X")[0]
        pact_out = next(op for op in block.ops if op.type == "fake_quantize_dequantize_moving_average_abs_max"
                        and op.output("Out")[0] == fc_in).input("X")[0]
        fc_source = next(n for n in block.vars if n.endswith("_pact") and n != "image_pact")[: -len("_pact")]
        batch = {"image": x[:64], "label": y[:64, None].astype("int64")}
        weight = next(op for op in block.ops if filt in op.output_arg_names).input("X")[0]
        w0 = np.array(scope.find_var(weight).get_tensor())
        quantized, clipped, source = exe.run(train, feed=batch, fetch_list=[filt, pact_out, fc_source])
        step = np.abs(w0).max() / 7
        np.testing.assert_allclose(quantized, np.round(w0 / step) * step, atol=1e-6)  # the weight function ran
        assert len(np.unique(quantized)) <= 15
        np.testing.assert_allclose(clipped, np.clip(source, -3.0, 3.0), atol=1e-6)  # PACT ran, alpha = 3
        assert source.max() > 3.0  # so the clip did something
        losses = []
        for i in range(80):
            j = (i * 64) % (len(x) - 64)
            feed = {"image": x[j:j + 64], "label": y[j:j + 64, None].astype("int64")}
            losses.append(float(exe.run(train, feed=feed, fetch_list=[loss])[0]))
        assert np.mean(losses[-10:]) < 0.6 * np.mean(losses[:10])
        alphas = {n: float(np.array(scope.find_var(n).get_tensor())[0]) for n in block.vars if n.endswith("_pact")}
        # alpha learns where PACT clips (the fc input) and keeps 3 on the images, which never reach it
        assert np.abs(x).max() < 3.0 and alphas.pop("image_pact") == 3.0
        assert len(alphas) == 1 and abs(alphas.popitem()[1] - 3.0) > 0.02
        assert not np.allclose(np.array(scope.find_var(weight).get_tensor()), w0)  # trained through the function
        feed = {"image": tx[:500], "label": ty[:500, None].astype("int64")}
        qat_top1 = float((exe.run(test, feed=feed, fetch_list=[logits.name])[0].argmax(1) == ty[:500]).mean())
        inference = convert(test, paddle.CPUPlace(), config, scope=scope)
        out = exe.run(inference, feed=feed, fetch_list=[logits.name])[0]
        assert "quantize_linear" in [op.type for op in inference.global_block().ops]
    paddle.disable_static()
    assert qat_top1 > 0.6 and abs(float((out.argmax(1) == ty[:500]).mean()) - qat_top1) <= 0.02
