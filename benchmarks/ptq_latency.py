"""Latency of float vs int8 in paddle.inference on ResNet/MobileNet-size networks (random weights).

For each network: export the float model (legacy .pdmodel and PIR .json), quantize it with
``qptq.quant_post_static`` (16 random calibration images), optionally with PaddleSlim 2.6 in its
own venv (``--paddleslim-python``), and time every model in one process with oneDNN + the int8
switch, 2 threads, batch 1 and 8. Writes ``benchmarks/results/ptq_latency.md``.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import paddle

from qcore.inference import create_predictor, run_predictor
from qcore.model_io import ModelFiles, find_model_files
from qptq import quant_post_static

RESULTS = Path(__file__).parent / "results"
NETS = {
    "ResNet18": paddle.vision.models.resnet18,
    "ResNet50": paddle.vision.models.resnet50,
    "MobileNetV2": paddle.vision.models.mobilenet_v2,
}
SLIM_SCRIPT = Path(__file__).parent / "paddleslim_ptq.py"


def export(name: str, work: Path) -> dict[str, Path]:
    paddle.seed(0)
    net = NETS[name]()
    net.eval()
    spec = [paddle.static.InputSpec([None, 3, 224, 224], "float32", "image")]
    with paddle.pir_utils.OldIrGuard():
        paddle.jit.save(net, str(work / name / "legacy" / "inference"), input_spec=spec)
    paddle.jit.save(net, str(work / name / "pir" / "inference"), input_spec=spec)
    return {"legacy": work / name / "legacy", "pir": work / name / "pir"}


def interleaved_ms(models: dict[str, ModelFiles], batch: int, repeats: int) -> dict[str, float | str]:
    """Median latency of each model, its runs interleaved with the others' so load drifts hit all alike."""
    x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype("float32")
    predictors, result = {}, {}
    for label, files in models.items():
        try:  # report what Paddle Inference does with each output
            predictors[label] = create_predictor(files)
            for _ in range(2):
                run_predictor(predictors[label], {"image": x})
        except Exception as exc:
            predictors.pop(label, None)
            result[label] = f"fails: {str(exc).splitlines()[0][:60]}"
    times: dict[str, list[float]] = {label: [] for label in predictors}
    for _ in range(repeats):
        for label, predictor in predictors.items():
            start = time.perf_counter()
            run_predictor(predictor, {"image": x})
            times[label].append(time.perf_counter() - start)
    result.update({label: float(np.median(t)) * 1000 for label, t in times.items()})
    return result


def output_errors(models: dict[str, ModelFiles], reference: ModelFiles) -> dict[str, str]:
    """Each deployed model's largest output difference from the float model, relative to its range."""
    x = np.random.default_rng(2).standard_normal((8, 3, 224, 224)).astype("float32")
    expected = run_predictor(create_predictor(reference), {"image": x})[0]
    errors = {}
    for label, files in models.items():
        try:
            got = run_predictor(create_predictor(files), {"image": x})[0]
            errors[label] = f"{np.abs(got - expected).max() / np.abs(expected).max() * 100:.1f} %"
        except Exception:  # already reported in the latency cells
            errors[label] = "-"
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nets", nargs="+", default=list(NETS))
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--paddleslim-python", default=None, help="python of a venv with paddleslim 2.6")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="qlatency-"))
    calib = np.random.default_rng(1).standard_normal((16, 3, 224, 224)).astype("float32")
    np.save(work / "calib.npy", calib)
    rows = []
    for name in args.nets:
        dirs = export(name, work)
        models = {"float (legacy)": find_model_files(dirs["legacy"])}
        for family in ("legacy", "pir"):
            out = work / name / f"int8_{family}"
            quant_post_static(None, dirs[family], out, sample_generator=lambda: iter(calib), batch_size=8,
                              algo="abs_max", optimize_model=True, save_model_filename=None, save_params_filename=None)
            models[f"ours int8 ({family})"] = find_model_files(out)
        if args.paddleslim_python:
            out = work / name / "paddleslim"
            subprocess.run([args.paddleslim_python, str(SLIM_SCRIPT), str(work / "calib.npy"), str(dirs["legacy"]),
                            str(out), "abs_max", "8"], check=True, capture_output=True)
            models["PaddleSlim 2.6 int8"] = find_model_files(out)
        timings = {(label, batch): t for batch in (1, 8)
                   for label, t in interleaved_ms(models, batch, args.repeats).items()}
        errors = output_errors(models, models["float (legacy)"])
        for label in models:
            cells = []
            for batch in (1, 8):
                t, base = timings[label, batch], timings["float (legacy)", batch]
                cells += [f"{t:.1f}", f"{base / t:.2f}x"] if isinstance(t, float) else [t, "-"]
            rows.append(f"| {name} | {label} | " + " | ".join(cells) + f" | {errors[label]} |")
        print("\n".join(rows[-len(models):]), flush=True)
    lines = [
        "# Inference latency, float vs int8 (paddle.inference, CPU)",
        "",
        f"Paddle {paddle.__version__}, {platform.processor() or platform.machine()}, 2 threads, oneDNN + int8 "
        f"switch, random weights, median of {args.repeats} runs after 2 warm-ups, the models' runs interleaved; "
        "speed-up = float / model in the same run. Re-run: "
        "`python benchmarks/ptq_latency.py [--paddleslim-python VENV/bin/python]`.",
        "",
        "Output error = largest |deployed - float| over the float output's range, on one random batch of 8: "
        "how far the int8 model Paddle Inference runs is from the float model (the executor's simulation "
        "of ours is within 1-2 % on these nets; above that, the deployment computes something else).",
        "",
        "| net | model | b=1 (ms) | b=1 speed-up | b=8 (ms) | b=8 speed-up | output error vs float |",
        "|---|---|---:|---:|---:|---:|---:|",
        *rows,
    ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "ptq_latency.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
