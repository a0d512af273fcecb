"""``qcli export onnx MODEL OUT.onnx``: any model (float or quantized, PIR or legacy) as one ONNX QDQ file."""

from __future__ import annotations

import argparse
from pathlib import Path

from qcore.export import ACTIVATION_TYPES, export_onnx
from qcore.model_io import find_model_files


def add_arguments(p: argparse.ArgumentParser) -> None:
    formats = p.add_subparsers(dest="format", required=True)
    onnx = formats.add_parser("onnx", help="ONNX with the model's quantization as QuantizeLinear/DequantizeLinear")
    onnx.add_argument("model", type=Path, help="the model (directory, prefix or model file)")
    onnx.add_argument("output", type=Path, help="the .onnx file to write (atomically)")
    onnx.add_argument("--activation-type", choices=tuple(ACTIVATION_TYPES), default="uint8",
                      help="uint8: ONNX Runtime's int8 kernels (U8S8); int8: TensorRT's symmetric form")
    onnx.add_argument("--dynamic", action="store_true",
                      help="matmuls with int8 weights and float inputs quantize them at run time (ONNX Runtime)")
    onnx.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    files = find_model_files(args.model)
    path = export_onnx(files, args.output, activation_type=args.activation_type, dynamic=args.dynamic)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB) from {files.model_file}")
    return 0
