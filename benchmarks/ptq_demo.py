"""Benchmark PTQ on the bundled demo CNN: accuracy, size, calibration time and latency, in one run.

Writes ``benchmarks/results/ptq_demo.md``. Ratios (int8 vs float) come from the same run, so
they hold on a noisy machine even when absolute times do not. Run with ``nox -s bench``.
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import paddle

from qcore.inference import create_predictor, run_predictor
from qcore.model_io import ModelFiles, find_model_files, load_model
from qdemo import demo_model_dir, load_demo_data
from qptq import quant_post_dynamic, quant_post_static

ALGOS = ("KL", "abs_max", "hist", "mse", "avg", "emd")
RESULTS = Path(__file__).parent / "results"


def top1(files: ModelFiles, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(executor top-1, paddle.inference top-1 with oneDNN + int8) in percent."""
    model = load_model(files)
    simulated = model.run({"image": x})[0]
    deployed = run_predictor(create_predictor(files), {"image": x})[0]
    return float((simulated.argmax(1) == y).mean() * 100), float((deployed.argmax(1) == y).mean() * 100)


def latency_ms(files: ModelFiles, batch: np.ndarray, repeats: int) -> float:
    predictor = create_predictor(files)
    run_predictor(predictor, {"image": batch})
    start = time.perf_counter()
    for _ in range(repeats):
        run_predictor(predictor, {"image": batch})
    return (time.perf_counter() - start) / repeats * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calib", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    calib, _ = load_demo_data("calib")
    x, y = load_demo_data("test")
    work = Path(tempfile.mkdtemp(prefix="qbench-"))
    lines = [
        "# PTQ on the bundled demo CNN",
        "",
        f"Paddle {paddle.__version__}, {platform.processor() or platform.machine()}, 2 threads, oneDNN + int8 switch; "
        f"{len(x)} test images, {args.calib} calibration images. Re-run: `nox -s bench`.",
        "",
        "| family | model | top-1 executor (%) | top-1 paddle.inference (%) | params vs float | calibration (s) "
        "| latency b=8 (ms) | latency vs float |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for family in ("legacy", "pir"):
        source = find_model_files(demo_model_dir(family))
        base_size = source.params_file.stat().st_size
        base_latency = latency_ms(source, x[:8], args.repeats)
        sim, dep = top1(source, x, y)
        lines.append(f"| {family} | float | {sim:.2f} | {dep:.2f} | 1.00 | - | {base_latency:.2f} | 1.00 |")
        runs = []
        for algo in ALGOS:
            out = work / f"{family}-{algo}"
            start = time.perf_counter()
            quant_post_static(
                None, source.directory, out, sample_generator=lambda: ((i,) for i in calib[: args.calib]),
                batch_size=20, algo=algo, optimize_model=True, save_model_filename=None, save_params_filename=None,
            )
            runs.append((f"static {algo}", find_model_files(out), time.perf_counter() - start))
        for bits in (8, 16):
            out = work / f"{family}-dynamic{bits}"
            start = time.perf_counter()
            files = quant_post_dynamic(
                source.directory, out, quantizable_op_type=["conv2d", "depthwise_conv2d", "mul"], weight_bits=bits
            )
            runs.append((f"dynamic int{bits}", files, time.perf_counter() - start))
        for name, files, seconds in runs:
            sim, dep = top1(files, x, y)
            ms = latency_ms(files, x[:8], args.repeats)
            ratio = files.params_file.stat().st_size / base_size
            lines.append(
                f"| {family} | {name} | {sim:.2f} | {dep:.2f} | {ratio:.2f} | {seconds:.2f} | {ms:.2f} "
                f"| {ms / base_latency:.2f} |"
            )
    lines += [
        "",
        "The demo CNN is tiny (53k parameters), so latency here is dominated by per-op overhead and does not",
        "show the int8 speed-up of ResNet-size networks: see `ptq_latency.md` for those.",
    ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "ptq_demo.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
