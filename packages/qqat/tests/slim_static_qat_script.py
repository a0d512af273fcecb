"""A PaddleSlim-era static QAT script, unchanged but for the import (run by test_legacy_static_qat.py in a
subprocess with FLAGS_enable_pir_api=0). ``python slim_static_qat_script.py OUT ORDER``: ORDER "before" calls
minimize before quant_aware (PaddleSlim's demo), "after" calls it after (its docs' example); writes OUT/result.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import paddle

from qdemo import load_demo_data
from qqat import convert, quant_aware

out, order = Path(sys.argv[1]), sys.argv[2]
paddle.enable_static()
place = paddle.CPUPlace()
exe = paddle.static.Executor(place)
train_program, startup = paddle.static.Program(), paddle.static.Program()
with paddle.static.program_guard(train_program, startup):
    image = paddle.static.data(name="image", shape=[None, 1, 28, 28], dtype="float32")
    label = paddle.static.data(name="label", shape=[None, 1], dtype="int64")
    conv = paddle.static.nn.conv2d(image, 16, 3, act="relu")
    conv2 = paddle.static.nn.conv2d(paddle.nn.functional.max_pool2d(conv, 2), 32, 3, act="relu")
    feat = paddle.static.nn.fc(conv2, 10)
    avg_cost = paddle.mean(paddle.nn.functional.cross_entropy(feat, label))
    eval_program = train_program.clone(for_test=True)
    opt = paddle.optimizer.Adam(0.002)
    if order == "before":
        opt.minimize(avg_cost)
paddle.seed(0)
exe.run(startup)
config = {"weight_quantize_type": "channel_wise_abs_max", "activation_quantize_type": "moving_average_abs_max"}
quant_train = quant_aware(train_program, place, config, for_test=False)
if order == "after":
    with paddle.static.program_guard(train_program, startup):
        opt.minimize(avg_cost)
    exe.run(startup)
quant_eval, scales = quant_aware(eval_program, place, config, for_test=True, return_scale_dict=True)
x, y = load_demo_data("calib")
losses = []
for step in range(150):
    i = (step * 64) % (len(x) - 64)
    losses.append(float(exe.run(quant_train, feed={"image": x[i:i + 64], "label": y[i:i + 64, None].astype("int64")},
                                fetch_list=[avg_cost])[0]))
tx, ty = load_demo_data("test")
feed = {"image": tx[:1000], "label": ty[:1000, None].astype("int64")}
qat_top1 = float((exe.run(quant_eval, feed=feed, fetch_list=[feat])[0].argmax(1) == ty[:1000]).mean())
conv_grads = [op for op in quant_train.global_block().ops if op.type == "conv2d_grad"]
inference = convert(quant_eval, place, config)
paddle.static.save_inference_model(str(out / "model" / "inference"), [image], [feat], exe, program=inference)

from qcore.inference import predict  # noqa: E402
from qcore.model_io import find_model_files  # noqa: E402

deployed = predict(find_model_files(out / "model"), {"image": tx[:1000]})[0]  # oneDNN int8
(out / "result.json").write_text(json.dumps({
    "first_loss": float(np.mean(losses[:10])), "last_loss": float(np.mean(losses[-10:])),
    "initial_scales": scales, "qat_top1": qat_top1,
    "deployed_top1": float((deployed.argmax(1) == ty[:1000]).mean()),
    "train_ops": [op.type for op in quant_train.global_block().ops],
    "conv_grad_inputs": [sorted(op.input_arg_names) for op in conv_grads],
    "inference_ops": [op.type for op in inference.global_block().ops],
}))
