"""``qcli demo``: quantize the bundled Fashion-MNIST CNN and print a before/after table."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from qcore.deploy import BACKEND_NAMES
from qcore.model_io import ModelFiles, find_model_files
from qcore.thresholds import PTQ_ALGO_CHOICES
from qcore.verify import evaluate

from ..plugins import require


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--family", choices=["legacy", "pir"], default="legacy", help="IR family of the demo model")
    p.add_argument("--algo", default="kl", type=str.lower, choices=PTQ_ALGO_CHOICES,
                   help="activation threshold algorithm (default kl)")
    p.add_argument("--calib-samples", type=int, default=200, help="calibration images (from the calib split)")
    p.add_argument("--backend", default=None, choices=BACKEND_NAMES,
                   help="quantize for this runtime (deploy_backend) and score both models there (default: onednn)")
    p.add_argument("--out", type=Path, default=None, help="where to keep the quantized model (default: a temp dir)")
    p.set_defaults(run=run)


def print_comparison(
    models: Mapping[str, ModelFiles], x: np.ndarray, y: np.ndarray, backend: str | None = None
) -> None:
    """The before/after table of the demo models (label -> files) on the test split, deployed on ``backend``."""
    from qdemo import INPUT_NAME

    scores = evaluate(models, INPUT_NAME, x, y, backend=backend)  # 2 threads, latency runs interleaved
    print("| model | top-1 executor (%) | top-1 paddle.inference (%) | latency b=8 (ms) | params file (KiB) |")
    print("|---|---:|---:|---:|---:|")
    for name, r in scores.items():
        print(f"| {name} | {r['executor_top1']:.2f} | {r['deployed_top1']:.2f} | {r['latency_ms']:.2f} "
              f"| {models[name].params_bytes / 1024:.0f} |")


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
        progress=True, deploy_backend=args.backend,
    )
    print(f"\nFashion-MNIST demo CNN, {args.family} family, {len(x)} test images, "
          f"{report['samples']} calibration images, paddle.inference on {args.backend or 'onednn'}, "
          f"quantized model in {out}\n")
    print_comparison({"float": source, f"int8 ({report['algo']})": find_model_files(out)}, x, y, args.backend)
    return 0
