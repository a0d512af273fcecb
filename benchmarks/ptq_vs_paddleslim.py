"""Static PTQ on the bundled demo CNN (legacy), ours vs PaddleSlim 2.6, per algo, in one run.

Each quantization runs in a fresh process (peak RSS is per process): ours in this Python,
PaddleSlim in the venv given by ``--paddleslim-python`` (paddlepaddle 2.6.2 + paddleslim 2.6.0,
see ``paddleslim_ptq.py``). Both outputs are then scored here with Paddle 3: top-1 in the
executor (simulated) and in paddle.inference (oneDNN + int8 switch), agreement with float, and
params size. A second table checks that our peak RSS stays flat when batch_nums grows 10x.
Writes ``benchmarks/results/ptq_vs_paddleslim.md``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import paddle
from peak_rss import peak_rss_mb

from qcore.deploy.host import describe_cpu
from qcore.model_io import ModelFiles, find_model_files
from qcore.scoring import agreement, top1
from qcore.verify import deployed_outputs, executor_outputs
from qdemo import INPUT_NAME, demo_model_dir, load_demo_data

RESULTS = Path(__file__).parent / "results"
ALGOS = ("KL", "abs_max", "hist", "mse", "avg", "emd")
HERE = Path(__file__).resolve()



def worker(calib_path: str, model_dir: str, out_dir: str, algo: str, batch_size: str, batch_nums: str) -> None:
    """Our quantization in this process; prints seconds and peak RSS like paddleslim_ptq.py."""
    from qptq import quant_post_static

    calib = np.load(calib_path, mmap_mode="r")
    start = time.perf_counter()
    quant_post_static(None, model_dir, out_dir, sample_generator=lambda: iter(calib), batch_size=int(batch_size),
                      batch_nums=int(batch_nums) or None, algo=algo, optimize_model=True,
                      save_model_filename=None, save_params_filename=None)
    seconds = time.perf_counter() - start
    print(f"seconds={seconds:.3f} rss_mb={peak_rss_mb():.1f}")


def run(cmd: list[str]) -> dict[str, float]:
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return {k: float(v) for k, v in (item.split("=") for item in out.split())}


def scores(files: ModelFiles, x: np.ndarray, y: np.ndarray, reference: np.ndarray) -> dict[str, float]:
    deployed = deployed_outputs(files, INPUT_NAME, x)
    return {
        "sim": top1(executor_outputs(files, INPUT_NAME, x), y),
        "dep": top1(deployed, y),
        "agree": agreement(deployed, reference),
        "bytes": files.params_bytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--paddleslim-python", default=None)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--worker", nargs=6, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    work = Path(tempfile.mkdtemp(prefix="qslim-"))
    calib, _ = load_demo_data("calib")
    np.save(work / "calib.npy", calib[: args.samples])
    np.save(work / "calib_all.npy", calib)
    x, y = load_demo_data("test")
    source = find_model_files(demo_model_dir("legacy"))
    reference = deployed_outputs(source, INPUT_NAME, x)
    float_scores = scores(source, x, y, reference)
    ours_cmd = [sys.executable, str(HERE), "--worker", str(work / "calib.npy"), str(source.directory)]
    rows = []
    for algo in ALGOS:
        out = work / f"ours_{algo}"
        ours = run([*ours_cmd, str(out), algo, "10", "0"]) | scores(find_model_files(out), x, y, reference)
        cells = [f"{ours['seconds']:.2f}", f"{ours['rss_mb']:.0f}", f"{ours['sim']:.2f}", f"{ours['dep']:.2f}",
                 f"{ours['agree']:.2f}", f"{ours['bytes'] / float_scores['bytes']:.3f}"]
        if args.paddleslim_python:
            out = work / f"slim_{algo}"
            slim = run([args.paddleslim_python, str(HERE.parent / "paddleslim_ptq.py"), str(work / "calib.npy"),
                        str(source.directory), str(out), algo, "10"])
            slim |= scores(find_model_files(out), x, y, reference)
            cells += [f"{slim['seconds']:.2f}", f"{slim['rss_mb']:.0f}", f"{slim['sim']:.2f}", f"{slim['dep']:.2f}",
                      f"{slim['agree']:.2f}", f"{slim['bytes'] / float_scores['bytes']:.3f}",
                      f"{ours['seconds'] / slim['seconds']:.3f}x"]
        rows.append(f"| {algo} | " + " | ".join(cells) + " |")
        print(rows[-1], flush=True)
    rss_rows = []
    for nums in (10, 100):
        out = work / f"ours_rss_{nums}"
        r = run([sys.executable, str(HERE), "--worker", str(work / "calib_all.npy"), str(source.directory), str(out),
                 "KL", "10", str(nums)])
        rss_rows.append(f"| {nums} | {nums * 10} | {r['seconds']:.2f} | {r['rss_mb']:.0f} |")
    slim_head = (" PaddleSlim s | PaddleSlim RSS MB | PaddleSlim sim top-1 | PaddleSlim deployed top-1 "
                 "| PaddleSlim agreement | PaddleSlim size | time ours/PaddleSlim |")
    lines = [
        "# Static PTQ on the demo CNN: ours vs PaddleSlim 2.6",
        "",
        f"Paddle {paddle.__version__} for ours and for scoring both outputs; PaddleSlim 2.6.0 on paddlepaddle 2.6.2 "
        f"in its own venv. {describe_cpu()}. {args.samples} calibration images "
        f"(batch 10), conv+bn folding on, per-channel int8 weights; {len(x)} test images. Float top-1: "
        f"{float_scores['sim']:.2f} executor / {float_scores['dep']:.2f} paddle.inference. Times include loading, "
        "calibration and saving; RSS is the peak of a fresh process. Agreement = same class as the float model "
        "in paddle.inference. Size = params bytes vs float. "
        "Re-run: `python benchmarks/ptq_vs_paddleslim.py --paddleslim-python VENV/bin/python`.",
        "",
        "| algo | ours s | ours RSS MB | ours sim top-1 | ours deployed top-1 | ours agreement | ours size |"
        + (slim_head if args.paddleslim_python else ""),
        "|---|" + "---:|" * (13 if args.paddleslim_python else 6),
        *rows,
        "",
        "## Our peak RSS as batch_nums grows 10x (KL, batch 10)",
        "",
        "| batch_nums | samples | seconds | peak RSS MB |",
        "|---:|---:|---:|---:|",
        *rss_rows,
    ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "ptq_vs_paddleslim.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
