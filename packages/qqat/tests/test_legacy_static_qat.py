"""Static QAT on legacy programs, called as PaddleSlim-era scripts do (issue 31 item 4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import paddle
import pytest

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
        with pytest.raises(ConfigError, match="hooks work on PIR programs only"):
            quant_aware(main.clone(), paddle.CPUPlace(), None, weight_quantize_func=lambda w: w)
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
