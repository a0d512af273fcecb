"""Run PaddleSlim 2.6's quant_post_static in its own venv (paddlepaddle 2.6.2, numpy<2, six, requests,
setuptools<70, pip): ``python paddleslim_ptq.py CALIB.npy MODEL_DIR OUT_DIR ALGO BATCH_SIZE``.

Prints one line ``seconds=<calibration+save time> rss_mb=<peak RSS>``. The feed is the model's
first input. Used by ptq_latency.py and ptq_vs_paddleslim.py; not imported by them.
"""

import sys
import time
import zlib  # noqa: F401  -- imported before paddle, avoids a segfault in paddle 2.6

import numpy as np
import paddle
from peak_rss import peak_rss_mb

paddle.enable_static()
from paddleslim.quant import quant_post_static  # noqa: E402


def main() -> None:
    calib_path, model_dir, out_dir, algo, batch_size = sys.argv[1:6]
    calib = np.load(calib_path)
    exe = paddle.static.Executor(paddle.CPUPlace())
    program, feeds, _ = paddle.static.load_inference_model(model_dir + "/inference", exe)
    var = program.global_block().var(feeds[0])
    data = paddle.static.data(feeds[0], [None, *var.shape[1:]], "float32")

    class Samples(paddle.io.Dataset):
        def __len__(self):
            return len(calib)

        def __getitem__(self, i):
            return calib[i]

    loader = paddle.io.DataLoader(Samples(), batch_size=int(batch_size), return_list=False, feed_list=[data])
    start = time.perf_counter()
    quant_post_static(exe, model_dir, out_dir, data_loader=loader, model_filename="inference.pdmodel",
                      params_filename="inference.pdiparams", batch_size=int(batch_size), algo=algo,
                      optimize_model=True, save_model_filename="inference.pdmodel",
                      save_params_filename="inference.pdiparams", onnx_format=True)
    seconds = time.perf_counter() - start
    print(f"seconds={seconds:.3f} rss_mb={peak_rss_mb():.1f}")


if __name__ == "__main__":
    main()
