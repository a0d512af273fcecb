"""``qcli demo``: quantize the bundled Fashion-MNIST CNN and print a before/after table."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from qcore.inference import create_predictor, run_predictor
from qcore.model_io import ModelFiles, find_model_files

from ..evaluation import deployed_outputs, executor_outputs, top1
from ..plugins import require


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="quantize the bundled demo model and compare it with the float one")
    p.add_argument("--family", choices=["legacy", "pir"], default="legacy", help="IR family of the demo model")
    p.add_argument("--algo", default="KL", help="activation threshold algorithm (KL, abs_max, hist, mse, avg, emd)")
    p.add_argument("--calib-samples", type=int, default=200, help="calibration images (from the calib split)")
    p.add_argument("--out", type=Path, default=None, help="where to keep the quantized model (default: a temp dir)")
    p.set_defaults(run=run)


def _evaluate(files: ModelFiles, x: np.ndarray, y: np.ndarray, backend: str = "onednn") -> dict[str, float]:
    predictor = create_predictor(files, backend=backend)  # 2 threads
    batch = x[:8]
    run_predictor(predictor, {"image": batch})
    start = time.perf_counter()
    for _ in range(20):
        run_predictor(predictor, {"image": batch})
    latency = (time.perf_counter() - start) / 20 * 1000
    return {
        "executor": top1(executor_outputs(files, "image", x), y),
        "inference": top1(deployed_outputs(files, "image", x, backend), y),
        "latency": latency,
        "params": files.params_bytes / 1024,
    }


def run(args: argparse.Namespace) -> int:
    qptq = require("demo")
    from qdemo import demo_model_dir, load_demo_data

    calib, _ = load_demo_data("calib")
    x, y = load_demo_data("test")
    source = find_model_files(demo_model_dir(args.family))
    out = args.out or Path(tempfile.mkdtemp(prefix="qcli-demo-")) / "int8"
    report = qptq.quant_post_static(
        None, source.directory, out, sample_generator=lambda: ((img,) for img in calib[: args.calib_samples]),
        batch_size=20, algo=args.algo, optimize_model=True, save_model_filename=None, save_params_filename=None,
        progress=True,
    )
    rows = {"float": _evaluate(source, x, y), f"int8 ({report['algo']})": _evaluate(find_model_files(out), x, y)}
    print(f"\nFashion-MNIST demo CNN, {args.family} family, {len(x)} test images, "
          f"{report['samples']} calibration images, quantized model in {out}\n")
    print("| model | top-1 executor (%) | top-1 paddle.inference (%) | latency b=8 (ms) | params file (KiB) |")
    print("|---|---:|---:|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['executor']:.2f} | {r['inference']:.2f} | {r['latency']:.2f} | {r['params']:.0f} |")
    return 0
