"""``qcli embed``: quantize the embedding tables of a saved Paddle model, or a raw ``.npy`` table."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from qcore.errors import ConfigError

from ..options import json_config
from ..plugins import require

PER_ROW = {"off": False, "on": True, "auto": "auto"}
ASYMMETRIC = {"off": False, "on": True, "auto": "auto"}


def _bits(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a bit width; give 2..8 or auto") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "SOURCE is a saved model (directory, model file or path prefix; PIR or legacy) or a 2-D float .npy table. "
        "A model keeps its family and file layout; a .npy table is quantized in chunks (tables larger than memory "
        "work) into OUT (codes) + OUT's .scales.npy + .qembed.json."
    )
    p.add_argument("source", type=Path, help="model directory / file / prefix, or a .npy table")
    p.add_argument("out", type=Path, help="output model directory, or output .npy for a table")
    p.add_argument("--quantize-type", choices=["abs_max", "log"], default="abs_max")
    p.add_argument("--bits", type=_bits, default=8,
                   help="2..8, or auto (models: the smallest of 2, 4, 8 within --max-error); 4 bits and below are "
                        "stored packed (2 or 4 codes a byte)")
    p.add_argument("--max-error", type=float, default=None,
                   help="--bits auto's budget: relative RMS error of the table (default 0.02)")
    p.add_argument("--asymmetric", choices=list(ASYMMETRIC), default=None,
                   help="models, 4 bits and below, per-row: per-row offsets (default auto: where they cut the error)")
    p.add_argument("--per-row", choices=list(PER_ROW), default=None,
                   help="scale per row: off (seed default for models), on (default for .npy), "
                        "auto (models: chosen by measured error)")
    p.add_argument("--scale-dtype", choices=["float32", "float16"], default=None,
                   help="how per-row scales (and offsets) are stored: float16 takes 2 bytes each instead of 4 "
                        "(default float32; a single scale for the table stays float32)")
    p.add_argument("--fused-lookup", choices=list(ASYMMETRIC), default=None,
                   help="models: read tables with the compiled qembed_lookup op (the Linux x86-64 wheel ships it; "
                        "elsewhere python -m qembed.build_ext builds it); off: the op sequence (default auto: "
                        "the op where it loads)")
    p.add_argument("--threshold", type=float, default=None, help="clip the table to [-t, t] before quantizing")
    p.add_argument("--params-name", action="append", default=None, help="only this table (repeatable)")
    p.add_argument("--op-types", nargs="+", default=None,
                   help="quantize_op_types (default: lookup_table fused_embedding_seq_pool pyramid_hash)")
    p.add_argument("--config", type=Path, default=None, help="a JSON file with the full quant_embedding config")
    p.add_argument("--model-filename", default=None)
    p.add_argument("--params-filename", default=None)
    p.add_argument("--chunk-rows", type=int, default=65536, help=".npy tables: rows per chunk")
    p.set_defaults(run=run)


def _config(args: argparse.Namespace) -> dict[str, Any]:
    config: dict[str, Any] = json_config(args.config) if args.config else {}
    config.setdefault("quantize_type", args.quantize_type)
    config.setdefault("quantize_bits", args.bits)
    config.setdefault("per_row", PER_ROW[args.per_row or "off"])
    if args.threshold is not None:
        config.setdefault("threshold", args.threshold)
    if args.max_error is not None:
        config.setdefault("max_error", args.max_error)
    if args.asymmetric is not None:
        config.setdefault("asymmetric", ASYMMETRIC[args.asymmetric])
    if args.fused_lookup is not None:
        config.setdefault("fused_lookup", ASYMMETRIC[args.fused_lookup])
    if args.scale_dtype is not None:
        config.setdefault("scale_dtype", args.scale_dtype)
    if args.params_name:
        config.setdefault("params_name", args.params_name)
    if args.op_types:
        config.setdefault("quantize_op_types", args.op_types)
    return config


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.is_file())


def _run_model(qembed: Any, args: argparse.Namespace) -> int:
    files, reports = qembed.quant_embedding_model(
        args.source, args.out, _config(args), args.model_filename, args.params_filename
    )
    print(f"quantized model in {files.directory} ({files.family})\n")
    print("| table | op | shape | scheme | scales | lookup | err one scale | err per-row | MiB before | MiB after |")
    print("|---|---|---|---|---|---|---:|---:|---:|---:|")
    for r in reports:
        q = r.choice.table
        scheme = f"{q.quantize_type} int{q.bits}"
        if r.whole_table:
            scheme += " (whole table dequantized)"
        elif q.bits <= 4:
            scheme += f" packed{' + offsets' if q.offsets is not None else ''}"
        if r.choice.errors_by_bits:
            scheme += " (auto: " + ", ".join(f"int{b} {e:.4f}" for b, e in r.choice.errors_by_bits.items()) + ")"
        print(f"| {r.name} | {', '.join(r.op_types)} | {r.shape[0]}x{r.shape[1]} | {scheme} | "
              f"{_scales(r.choice.table) if r.choice.per_row else 'one'} | {r.lookup} | "
              f"{r.choice.whole_table_error:.4f} | "
              f"{r.choice.per_row_error:.4f} | {r.float_bytes / 2**20:.2f} | {r.quantized_bytes / 2**20:.2f} |")
    source = args.source if args.source.is_dir() else args.source.parent
    print(f"\nmodel on disk: {_size(source) / 2**20:.2f} MiB -> {_size(files.directory) / 2**20:.2f} MiB")
    from qembed.ext import INSTALL_HINT, OP_TYPE

    if any(OP_TYPE in r.lookup for r in reports):
        print(f"the model uses the compiled {OP_TYPE} op; every machine that serves it needs it: {INSTALL_HINT} "
              "(--fused-lookup off: the op sequence, for ONNX too)")
    return 0


def _scales(table: Any) -> str:
    """'per-row', or 'per-row float16' when they are stored in 2 bytes."""
    return "per-row" + (" float16" if table.scale_dtype == "float16" else "")


def _run_table(qembed: Any, args: argparse.Namespace) -> int:
    per_row = PER_ROW[args.per_row or "on"]
    if per_row == "auto":
        raise ConfigError("--per-row auto needs the table in memory; use on or off for a .npy table")
    if args.bits == "auto" or args.asymmetric is not None or args.max_error is not None:
        raise ConfigError("--bits auto, --asymmetric and --max-error are for models; give --bits 2..8 for a .npy "
                          "table")
    start = time.perf_counter()
    table = qembed.quantize_npy(args.source, args.out, args.quantize_type, args.bits, per_row, args.threshold,
                                args.chunk_rows, scale_dtype=args.scale_dtype or "float32")
    seconds = time.perf_counter() - start
    before, after = args.source.stat().st_size, args.out.stat().st_size + table.scales.nbytes
    print(f"{args.source} -> {args.out}: {len(table.codes)}x{table.dim} {table.quantize_type} int{table.bits}"
          f"{' packed 2 per byte' if table.packed else ''}, {_scales(table) if table.per_row else 'one'} scale(s)")
    print(f"{before / 2**20:.2f} MiB -> {after / 2**20:.2f} MiB ({after / before:.3f}x) in {seconds:.2f} s "
          f"({before / seconds / 1e9:.2f} GB/s)")
    return 0


def run(args: argparse.Namespace) -> int:
    qembed = require("embed")
    if args.source.suffix == ".npy":
        return _run_table(qembed, args)
    return _run_model(qembed, args)
