"""``qcli bench MODEL [MODEL2]``: latency and agreement of two models, usually a float model and its int8 version,
per backend.

Either model is a Paddle model (directory, prefix or model file) or an ONNX file (or a directory holding one
and no Paddle model). The output says what each model is (float or int8 QDQ, from the ops its file holds, not
from its position), what the outputs were compared on, and warns where the agreement on real inputs says the
two are not one model and its quantized version.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from qcore.deploy import BACKEND_NAMES
from qcore.errors import ConfigError, DataError, ModelFormatError
from qcore.inference import holds_quantization
from qcore.model_io import ModelFiles, find_model_files, model_files_in
from qcore.outputs import check_output_file, write_bytes
from qcore.verify import markdown_table, verify

from ..feeds import feed_specs
from ..options import load_npy, numbers

#: Arg-max agreement (%) on real inputs (``--data``) under which the two models are said not to be one model and
#: its quantized version: int8 versions of the demo CNN agree with it on 89-95 % of the first 64 test images
#: (oneDNN, OpenVINO), an untrained model of the same shape on 6 %.
SAME_MODEL_AGREEMENT = 80.0
#: Samples the outputs are compared on (the first of ``--data``, else random); latency runs on a batch of them.
COMPARE_SAMPLES = 64

Bench = ModelFiles | Path  # a Paddle model, or an .onnx file


def add_arguments(p: argparse.ArgumentParser) -> None:
    where = "a Paddle model (directory, prefix or model file), an .onnx file, or a directory holding one"
    p.add_argument("model", type=Path, help=f"model 1, usually the float model: {where}")
    p.add_argument("int8_model", type=Path, nargs="?", default=None,
                   help="model 2, usually its quantized version, in any of the same forms (default: model 1 again)")
    p.add_argument("--backends", default="onednn,openvino", help=f"comma-separated, from: {', '.join(BACKEND_NAMES)}")
    p.add_argument("--batch", default="1,8", type=numbers(int, "1,8"), help="comma-separated batch sizes")
    p.add_argument("--data", type=Path, default=None,
                   help=f".npy inputs: outputs are compared on the first {COMPARE_SAMPLES} (default: random "
                        "standard-normal samples, which say nothing about accuracy)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.json is not None:
        check_output_file(args.json, "--json")
    models = (bench_model(args.model), bench_model(args.int8_model) if args.int8_model else None)
    first, second = models[0], models[1] or models[0]
    _check_same_inputs(first, second)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    for name in backends:
        if name.lower() not in BACKEND_NAMES:
            raise ConfigError(f"unknown backend {name!r}; valid: {', '.join(BACKEND_NAMES)}")
    kinds = (_kind(first), _kind(second))
    labels = kinds if kinds[0] != kinds[1] else (f"{kinds[0]} 1", f"{kinds[1]} 2")
    feed, inputs = _feed(first, args.data, max(args.batch))
    compared = {"model 1": _describe(first, labels[0]),
                "model 2": _describe(second, labels[1]) + (" (model 1 again)" if models[1] is None else ""),
                "inputs": inputs}
    for key, text in compared.items():
        print(f"{key}: {text}")
    results: dict[str, Any] = {"compared": compared}
    for batch in args.batch:
        rows = verify(first, second, feed, backends, repeats=args.repeats, threads=args.threads, latency_batch=batch)
        results[f"batch {batch}"] = rows
        print(f"\nbatch {batch}: latency of {batch} rows, {args.threads} threads, median of {args.repeats} interleaved "
              f"runs; speed-up: model 1's time over model 2's\n")
        print(markdown_table(rows, labels))
    compared["warnings"] = _warnings(models, kinds, rows, args.data is not None, len(next(iter(feed.values()))))
    for line in compared["warnings"]:
        print(f"qcli bench: warning: {line}", file=sys.stderr)
    if args.json is not None:
        write_bytes(args.json, json.dumps(results, indent=1).encode())
    return 0


def bench_model(path: Path) -> Bench:
    """The model at ``path``: a Paddle model's files, or an ONNX file (``path``, or the one ``.onnx`` file of a
    directory that holds no Paddle model)."""
    if path.suffix == ".onnx" and not path.is_dir():
        if not path.is_file():
            raise ModelFormatError(f"model not found: {path}; check the path")
        return path
    if path.is_dir() and not model_files_in(path):
        onnx = sorted(path.glob("*.onnx"))
        if len(onnx) > 1:
            raise ModelFormatError(f"{path} holds several ONNX files ({', '.join(p.name for p in onnx)}) and no "
                                   "Paddle model; pass the .onnx file to compare")
        if onnx:
            return onnx[0]
    return find_model_files(path)


def _kind(model: Bench) -> str:
    """``"int8 QDQ"`` when the model's file holds quantization ops, else ``"float"``."""
    program = model.model_file if isinstance(model, ModelFiles) else model
    return "int8 QDQ" if holds_quantization(program.read_bytes()) else "float"


def _describe(model: Bench, label: str) -> str:
    if isinstance(model, ModelFiles):
        return f"{model.model_file} ({label}, {'PIR' if model.family == 'pir' else 'legacy'} Paddle model)"
    return f"{model} ({label}, ONNX)"


def _warnings(models: tuple[Bench, Bench | None], kinds: tuple[str, str], rows: Mapping[str, Mapping[str, Any]],
              real: bool, samples: int) -> list[str]:
    """What the table does not say by itself: two float models compared, or (on real inputs) an agreement under
    :data:`SAME_MODEL_AGREEMENT` on a backend."""
    lines = []
    if models[1] is not None and kinds == ("float", "float"):
        lines.append("neither model holds quantization ops: this compares two float models, not float and int8")
    if real:
        lines += [
            f"{backend}: model 2 agrees with model 1 on {row['agreement_with_float']:.1f} % of the {samples} "
            f"samples' arg-max, under {SAME_MODEL_AGREEMENT:.0f} %: they are not one model and its quantized "
            "version (or the quantization broke it)"
            for backend, row in rows.items()
            if "agreement_with_float" in row and row["agreement_with_float"] < SAME_MODEL_AGREEMENT
        ]
    return lines


def _check_same_inputs(first: Bench, second: Bench) -> None:
    """Refuse, before any work, two models whose inputs differ (names, dtypes, or fixed dimensions)."""
    a, b = feed_specs(first), feed_specs(second)
    same = a.keys() == b.keys() and all(
        a[n][1] == b[n][1] and len(a[n][0]) == len(b[n][0])
        and all(x == y or min(x, y) < 0 for x, y in zip(a[n][0], b[n][0]))
        for n in a)  # fmt: skip
    if not same:
        raise ConfigError(
            f"the two models take different inputs: {_inputs(a)} ({_path(first)}) vs {_inputs(b)} "
            f"({_path(second)}); compare a model with its own quantized version"
        )


def _path(model: Bench) -> Path:
    return model.model_file if isinstance(model, ModelFiles) else model


def _inputs(specs: Mapping[str, tuple[tuple[int, ...], str]]) -> str:
    return ", ".join(f"{name!r} {list(shape)} {dtype}" for name, (shape, dtype) in specs.items())


def _feed(model: Bench, data: Path | None, batch: int) -> tuple[dict[str, np.ndarray], str]:
    """The inputs the models are compared on (at least ``batch`` rows, :data:`COMPARE_SAMPLES` where there are
    that many), and what they are."""
    specs = feed_specs(model)
    if data is not None:
        x = load_npy(data, "--data")
        if len(specs) != 1 or len(x) < batch:
            raise DataError(f"--data {data} must hold at least {batch} samples for a one-input model")
        rows = max(min(len(x), COMPARE_SAMPLES), batch)
        return {next(iter(specs)): x[:rows]}, f"the first {rows} samples of --data {data}"
    rows = max(COMPARE_SAMPLES, batch)
    rng = np.random.default_rng(0)
    feed = {}
    for name, (shape, dtype) in specs.items():
        if any(d < 0 for d in shape[1:]):
            raise DataError(f"input {name!r} has free dimensions {shape}; pass --data with real inputs")
        feed[name] = rng.standard_normal((rows, *shape[1:])).astype(dtype)
    return feed, (f"{rows} random standard-normal samples (seed 0): agreement on them says nothing about accuracy "
                  "(a good int8 model may agree on a third of them); pass --data with real inputs for that")
