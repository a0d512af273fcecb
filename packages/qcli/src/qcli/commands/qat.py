"""``qcli qat``: quantization-aware fine-tuning of the bundled demo CNN, deployed and compared.

QAT needs the network as Python layers and a training loop, so the command line can only
train the model it ships: the Fashion-MNIST demo CNN. It shows the whole path (float ->
QAT -> int8 file -> paddle.inference); your own models use ``qqat.QAT`` from Python.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from qcore.deploy import BACKEND_NAMES
from qcore.model_io import find_model_files
from qcore.scoring import top1

from ..options import json_config
from ..plugins import require
from .demo import print_comparison


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=300, help="Adam steps of batch 64 on the demo train split")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--pact", action="store_true", help="PACT on activations (activation_preprocess_type='PACT')")
    p.add_argument("--config", type=Path, default=None, help="a JSON file with a dygraph QAT config dict")
    p.add_argument("--family", choices=["legacy", "pir"], default="legacy", help="IR family of the saved model")
    p.add_argument("--backend", default=None, choices=BACKEND_NAMES,
                   help="export for this runtime (deploy_backend) and score the int8 model there")
    p.add_argument("--out", type=Path, default=None, help="where to keep the int8 model (default: a temp dir)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    require("qat")
    from qdemo import demo_model_dir, load_demo_data
    from qdemo.qat import DEMO_INPUT_SPEC, finetune_demo, predict_dygraph

    config = json_config(args.config) if args.config else {}
    if args.pact:
        config["activation_preprocess_type"] = "PACT"
    x, y = load_demo_data("test")
    qat, net, seconds = finetune_demo(config, args.steps, lr=args.lr)
    simulated = top1(predict_dygraph(net, x), y)
    out = args.out or Path(tempfile.mkdtemp(prefix="qcli-qat-")) / "int8"
    files = qat.save_quantized_model(net, out / "inference", DEMO_INPUT_SPEC, family=args.family,
                                     deploy_backend=args.backend)
    print(f"\nFashion-MNIST demo CNN, {args.steps} QAT steps in {seconds:.0f} s, QAT model top-1 {simulated:.2f} %, "
          f"{args.family} family, {len(x)} test images, paddle.inference on {args.backend or 'onednn'}, "
          f"int8 model in {files.directory}\n")
    int8 = "int8 (QAT + PACT)" if args.pact else "int8 (QAT)"
    print_comparison({"float": find_model_files(demo_model_dir(args.family)), int8: files}, x, y, args.backend)
    return 0 if np.isfinite(simulated) else 1
