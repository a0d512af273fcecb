"""Benchmark PTQ on the bundled demo CNN: accuracy, size, calibration time and latency, in one run.

Writes ``benchmarks/results/ptq_demo.md``. Ratios (int8 vs float) come from the same run, so
they hold on a noisy machine even when absolute times do not. Run with ``nox -s bench``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import paddle

from qcore.deploy.host import describe_cpu
from qcore.model_io import ModelFiles, find_model_files
from qcore.verify import evaluate
from qdemo import INPUT_NAME, demo_model_dir, load_demo_data
from qptq import quant_post_dynamic, quant_post_static

ALGOS = ("KL", "abs_max", "hist", "mse", "avg", "emd")
RESULTS = Path(__file__).parent / "results"


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
        f"Paddle {paddle.__version__}, {describe_cpu()}, 2 threads, oneDNN + int8 switch; "
        f"{len(x)} test images, {args.calib} calibration images; latency: median of {args.repeats} runs, the runs of "
        "a family's models interleaved. Re-run: `nox -s bench`.",
        "",
        "| family | model | top-1 executor (%) | top-1 paddle.inference (%) | params vs float | calibration (s) "
        "| latency b=8 (ms) | latency vs float |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for family in ("legacy", "pir"):
        source = find_model_files(demo_model_dir(family))
        runs: list[tuple[str, ModelFiles, float | None]] = [("float", source, None)]
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
        scores = evaluate({name: files for name, files, _ in runs}, INPUT_NAME, x, y, repeats=args.repeats)
        for name, files, seconds in runs:
            s, ms = scores[name], scores[name]["latency_ms"]
            lines.append(
                f"| {family} | {name} | {s['executor_top1']:.2f} | {s['deployed_top1']:.2f} "
                f"| {files.params_bytes / source.params_bytes:.2f} | {'-' if seconds is None else f'{seconds:.2f}'} "
                f"| {ms:.2f} | {ms / scores['float']['latency_ms']:.2f} |"
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
