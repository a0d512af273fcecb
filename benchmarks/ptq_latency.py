"""Latency of float vs int8 in paddle.inference on ResNet/MobileNet-size networks (random weights).

For each network: export the float model (legacy .pdmodel and PIR .json), quantize it with
``qptq.quant_post_static`` (16 random calibration images), optionally with PaddleSlim 2.6 in its
own venv (``--paddleslim-python``), and time every model in one process with oneDNN + the int8
switch, 2 threads, batch 1 and 8. Writes ``benchmarks/results/ptq_latency.md``.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import paddle

from qcore.deploy.host import describe_cpu
from qcore.inference import create_predictor, run_predictor
from qcore.model_io import ModelFiles, find_model_files
from qcore.scoring import interleaved_latency, relative_error
from qcore.verify import deployed_outputs
from qptq import quant_post_static

RESULTS = Path(__file__).parent / "results"
NETS = {
    "ResNet18": paddle.vision.models.resnet18,
    "ResNet50": paddle.vision.models.resnet50,
    "MobileNetV2": paddle.vision.models.mobilenet_v2,
}
SLIM_SCRIPT = Path(__file__).parent / "paddleslim_ptq.py"
BACKENDS = ("onednn", "openvino")


def export(name: str, work: Path) -> dict[str, Path]:
    paddle.seed(0)
    net = NETS[name]()
    net.eval()
    spec = [paddle.static.InputSpec([None, 3, 224, 224], "float32", "image")]
    with paddle.pir_utils.OldIrGuard():
        paddle.jit.save(net, str(work / name / "legacy" / "inference"), input_spec=spec)
    paddle.jit.save(net, str(work / name / "pir" / "inference"), input_spec=spec)
    return {"legacy": work / name / "legacy", "pir": work / name / "pir"}


def interleaved_ms(models: dict[str, ModelFiles], batch: int, repeats: int, backend: str) -> dict[str, float | str]:
    """Median latency of each model on ``backend``, its runs interleaved so load drifts hit all alike."""
    x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype("float32")
    predictors, result = {}, {}
    for label, files in models.items():
        try:  # report what each backend does with each output
            predictors[label] = create_predictor(files, backend=backend)
            run_predictor(predictors[label], {"image": x})
        except Exception as exc:
            predictors.pop(label, None)
            result[label] = f"fails: {str(exc).splitlines()[0][:60]}"
    result.update(interleaved_latency(predictors, {"image": x}, repeats))
    return result


def output_errors(models: dict[str, ModelFiles], reference: ModelFiles, backend: str) -> dict[str, str]:
    """Each deployed model's largest output difference from the float model, relative to its range."""
    x = np.random.default_rng(2).standard_normal((8, 3, 224, 224)).astype("float32")
    expected = deployed_outputs(reference, "image", x, "onednn")
    errors = {}
    for label, files in models.items():
        try:
            got = deployed_outputs(files, "image", x, backend)
            errors[label] = f"{relative_error(got, expected) * 100:.1f} %"
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
        models = {"float (legacy)": find_model_files(dirs["legacy"]), "float (PIR)": find_model_files(dirs["pir"])}
        for family, backend in (("legacy", None), ("legacy", "openvino"), ("pir", None)):
            out = work / name / f"int8_{family}_{backend}"
            quant_post_static(None, dirs[family], out, sample_generator=lambda: iter(calib), batch_size=8,
                              algo="abs_max", optimize_model=True, deploy_backend=backend, save_model_filename=None,
                              save_params_filename=None)
            models[f"ours int8 ({family}, deploy_backend={backend or 'None'})"] = find_model_files(out)
        if args.paddleslim_python:
            out = work / name / "paddleslim"
            subprocess.run([args.paddleslim_python, str(SLIM_SCRIPT), str(work / "calib.npy"), str(dirs["legacy"]),
                            str(out), "abs_max", "8"], check=True, capture_output=True)
            models["PaddleSlim 2.6 int8"] = find_model_files(out)
        timings = {(backend, batch): interleaved_ms(models, batch, args.repeats, backend)
                   for backend in BACKENDS for batch in (1, 8)}
        fastest = {batch: min(t[label] for (_, b), t in timings.items() if b == batch
                              for label in models if label.startswith("float") and isinstance(t[label], float))
                   for batch in (1, 8)}  # the faster float backend for this net and batch
        for backend in BACKENDS:
            errors = output_errors(models, models["float (legacy)"], backend)
            for label in models:
                cells = []
                for batch in (1, 8):
                    t = timings[backend, batch][label]
                    cells += [f"{t:.1f}", f"{t / fastest[batch]:.2f}x"] if isinstance(t, float) else [t, "-"]
                rows.append(f"| {name} | {backend} | {label} | " + " | ".join(cells) + f" | {errors[label]} |")
        print("\n".join(rows[-len(BACKENDS) * len(models):]), flush=True)
    lines = [
        "# Inference latency, float vs int8 (paddle.inference, CPU)",
        "",
        f"Paddle {paddle.__version__}, {describe_cpu()}, 2 threads, random weights, "
        f"median of {args.repeats} runs after 2 warm-ups, the models' runs interleaved per backend (oneDNN: "
        "paddle.inference with oneDNN + int8 switch; OpenVINO: the engine bundled in the same wheel). Ratio = "
        "model / the faster float backend for that net and batch (lower is faster; 0.33x = 3x faster). Re-run: "
        "`python benchmarks/ptq_latency.py [--paddleslim-python VENV/bin/python]`.",
        "",
        "Output error = largest |deployed - float (oneDNN)| over the float output's range, on one random batch of 8: "
        "how far the int8 model Paddle Inference runs is from the float model (the executor's simulation "
        "of ours is within 1-2 % on these nets; above that, the deployment computes something else).",
        "",
        "| net | backend | model | b=1 (ms) | b=1 ratio | b=8 (ms) | b=8 ratio | output error vs float |",
        "|---|---|---|---:|---:|---:|---:|---:|",
        *rows,
    ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "ptq_latency.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
