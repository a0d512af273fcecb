"""``qcli bench MODEL [INT8_MODEL]``: latency and agreement of a model, float vs int8, per backend."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from qcore.deploy import BACKEND_NAMES
from qcore.errors import ConfigError, DataError
from qcore.model_io import ModelFiles, find_model_files
from qcore.outputs import check_output_file, write_bytes
from qcore.verify import markdown_table, verify

from ..feeds import feed_specs
from ..options import load_npy, numbers


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=Path, help="the float model (directory, prefix or model file)")
    p.add_argument("int8_model", type=Path, nargs="?", default=None,
                   help="its quantized version (default: the float model against itself)")
    p.add_argument("--backends", default="onednn,openvino", help=f"comma-separated, from: {', '.join(BACKEND_NAMES)}")
    p.add_argument("--batch", default="1,8", type=numbers(int, "1,8"), help="comma-separated batch sizes")
    p.add_argument("--data", type=Path, default=None,
                   help=".npy inputs (default: standard normal of the model's shape)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.json is not None:
        check_output_file(args.json, "--json")
    source = find_model_files(args.model)
    int8 = find_model_files(args.int8_model) if args.int8_model else source
    _check_same_inputs(source, int8)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    for name in backends:
        if name.lower() not in BACKEND_NAMES:
            raise ConfigError(f"unknown backend {name!r}; valid: {', '.join(BACKEND_NAMES)}")
    results = {}
    for batch in args.batch:
        feed = _feed(source, args.data, batch)
        results[f"batch {batch}"] = verify(source, int8, feed, backends, repeats=args.repeats, threads=args.threads)
        print(f"\n{int8.model_file} vs {source.model_file}, batch {batch}, {args.threads} threads, "
              f"median of {args.repeats} interleaved runs\n")
        print(markdown_table(results[f"batch {batch}"]))
    if args.json is not None:
        write_bytes(args.json, json.dumps(results, indent=1).encode())
    return 0


def _check_same_inputs(float_files: ModelFiles, int8_files: ModelFiles) -> None:
    """Refuse, before any work, two models whose inputs differ (names, dtypes, or fixed dimensions)."""
    a, b = feed_specs(float_files), feed_specs(int8_files)
    same = a.keys() == b.keys() and all(
        a[n][1] == b[n][1] and len(a[n][0]) == len(b[n][0])
        and all(x == y or min(x, y) < 0 for x, y in zip(a[n][0], b[n][0]))
        for n in a)  # fmt: skip
    if not same:
        raise ConfigError(
            f"the two models take different inputs: {_inputs(a)} ({float_files.model_file}) vs {_inputs(b)} "
            f"({int8_files.model_file}); compare a model with its own quantized version"
        )


def _inputs(specs: Mapping[str, tuple[tuple[int, ...], str]]) -> str:
    return ", ".join(f"{name!r} {list(shape)} {dtype}" for name, (shape, dtype) in specs.items())


def _feed(files: ModelFiles, data: Path | None, batch: int) -> dict[str, np.ndarray]:
    specs = feed_specs(files)
    if data is not None:
        x = load_npy(data, "--data")
        if len(specs) != 1 or len(x) < batch:
            raise DataError(f"--data {data} must hold at least {batch} samples for a one-input model")
        return {next(iter(specs)): x[:batch]}
    rng = np.random.default_rng(0)
    feed = {}
    for name, (shape, dtype) in specs.items():
        if any(d < 0 for d in shape[1:]):
            raise DataError(f"input {name!r} has free dimensions {shape}; pass --data with real inputs")
        feed[name] = rng.standard_normal((batch, *shape[1:])).astype(dtype)
    return feed
