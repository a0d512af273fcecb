"""Weight-only GPTQ on a saved model called as PaddleSlim-era scripts call quant_post_dynamic: after
``paddle.enable_static()``, calibration from a static ``DataLoader(feed_list=..., return_list=False)`` whose
batches differ in length, in PIR mode and in legacy mode (``FLAGS_enable_pir_api=0``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest

DIM = 64

SCRIPT = """
import json, sys
import numpy as np
import paddle
from qcore.model_io import load_model
from qptq import quant_post_dynamic

paddle.enable_static()
model_dir, out, DIM = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(0)
lengths = [4, 7, 5, 9]  # every batch of 8 sequences has its own length
gain = np.ones(DIM, np.float32)
gain[[3, 17]] = 12.0  # outlier channels, as decoder hidden states have


class Sequences(paddle.io.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        return (rng.standard_normal((lengths[i // 8], DIM)) * gain).astype("float32"), np.int64(i % 3)


x = paddle.static.data("x", [None, None, DIM], "float32")
label = paddle.static.data("label", [None], "int64")  # the model does not read it
loader = paddle.io.DataLoader(Sequences(), places=paddle.CPUPlace(), feed_list=[x, label], batch_size=8,
                              return_list=False, shuffle=False)
test = (np.random.default_rng(1).standard_normal((16, 6, DIM)) * gain).astype("float32")
paddle.disable_static()
reference = load_model(model_dir).run({"x": test})[0]
paddle.enable_static()
result = {}
for algo in ("rtn", "gptq"):
    quant_post_dynamic(model_dir, out + "/" + algo, weight_bits=4, group_size=32, algo=algo,
                       data_loader=loader if algo == "gptq" else None, batch_nums=4)
    paddle.disable_static()
    result[algo] = float(np.square(load_model(out + "/" + algo).run({"x": test})[0] - reference).mean())
    paddle.enable_static()
print("RESULT " + json.dumps(result))
"""


class Mlp(paddle.nn.Layer):
    def __init__(self) -> None:
        super().__init__()
        self.up = paddle.nn.Linear(DIM, 2 * DIM)
        self.down = paddle.nn.Linear(2 * DIM, DIM, bias_attr=False)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.down(paddle.nn.functional.silu(self.up(x)))


@pytest.mark.parametrize("family", ["pir", "legacy"])
def test_gptq_from_a_static_data_loader_beats_round_to_nearest(tmp_path, family):
    paddle.seed(0)
    net = Mlp()
    net.eval()
    spec = [paddle.static.InputSpec([None, None, DIM], "float32", "x")]
    if family == "pir":
        paddle.jit.save(net, str(tmp_path / "float" / "inference"), input_spec=spec)
    else:
        with paddle.pir_utils.DygraphOldIrGuard():
            paddle.jit.save(net, str(tmp_path / "float" / "inference"), input_spec=spec)
    script = tmp_path / "slim_style.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "FLAGS_enable_pir_api": "1" if family == "pir" else "0"}
    run = subprocess.run([sys.executable, str(script), str(tmp_path / "float"), str(tmp_path / "out"), str(DIM)],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    error = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert 0 < error["gptq"] < 0.9 * error["rtn"]  # calibrated on the loader's batches, the error drops
    assert np.isfinite(error["rtn"])
