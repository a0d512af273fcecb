"""Benchmark QAT and PACT on the bundled demo CNN against float and PTQ, in one run.

Starts from the 86.0 % float weights, fine-tunes with ``qqat.QAT`` (Adam 1e-4, batch 64) for
each step budget, saves the deployable int8 model in both families and measures top-1 in the
executor and in ``paddle.inference`` (oneDNN + int8), size and latency. PTQ (qptq, KL and
abs_max, 200 calibration images) on the same model is measured in the same run. Writes
``benchmarks/results/qat_demo.md``. Run: ``python benchmarks/qat_demo.py``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import paddle

from qcore.deploy.host import describe_cpu
from qcore.model_io import ModelFiles, find_model_files
from qcore.scoring import top1
from qcore.verify import evaluate, executor_outputs
from qdemo import INPUT_NAME, demo_model_dir, load_demo_data
from qdemo.qat import DEMO_INPUT_SPEC, finetune_demo, predict_dygraph
from qptq import quant_post_static

RESULTS = Path(__file__).parent / "results"
METHODS = {"QAT": {}, "QAT + PACT": {"activation_preprocess_type": "PACT"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, nargs="+", default=[300, 940], help="QAT step budgets (94 = 1 epoch)")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    x, y = load_demo_data("test")
    calib, _ = load_demo_data("calib")
    work = Path(tempfile.mkdtemp(prefix="qat-bench-"))
    source = find_model_files(demo_model_dir("legacy"))
    lines = [
        "# QAT on the bundled demo CNN",
        "",
        f"Paddle {paddle.__version__}, {describe_cpu()}, 2 threads; {len(x)} test images. "
        "QAT: Adam lr 1e-4, batch 64 on the 6000-image train split (94 steps = 1 epoch), from the float weights. "
        "Deployed = the saved legacy `.pdmodel` in `paddle.inference` with oneDNN + int8; PIR = the saved `.json` "
        f"in the executor; latency: median of {args.repeats} runs, every model's runs interleaved. "
        "Re-run: `python benchmarks/qat_demo.py`.",
        "",
        "| model | steps | train (s) | top-1 QAT model (%) | top-1 PIR executor (%) | top-1 deployed int8 (%) "
        "| params vs float | latency b=8 vs float |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    models: dict[str, ModelFiles] = {"float": source}  # the legacy models, scored in one interleaved run
    cells = {"float": ["float", "-", "-"]}  # model, steps, train (s), top-1 QAT model, top-1 PIR executor
    for algo in ("KL", "abs_max"):
        out = work / f"ptq-{algo}"
        quant_post_static(
            None, source.directory, out, sample_generator=lambda: ((i,) for i in calib[:200]), batch_size=20,
            algo=algo, optimize_model=True, save_model_filename=None, save_params_filename=None,
        )
        models[f"PTQ {algo}"], cells[f"PTQ {algo}"] = find_model_files(out), [f"PTQ {algo}", "-", "-", "-", "-"]
    for name, config in METHODS.items():
        for steps in args.steps:
            qat, net, seconds = finetune_demo(config, steps)
            label = f"{name} {steps}"
            models[label] = qat.save_quantized_model(net, work / f"{name}-{steps}-legacy" / "m", DEMO_INPUT_SPEC,
                                                     family="legacy")
            pir = qat.save_quantized_model(net, work / f"{name}-{steps}-pir" / "m", DEMO_INPUT_SPEC)
            cells[label] = [name, str(steps), f"{seconds:.0f}", f"{top1(predict_dygraph(net, x), y):.2f}",
                            f"{top1(executor_outputs(pir, INPUT_NAME, x), y):.2f}"]
            print(" | ".join(cells[label]), flush=True)
    scores = evaluate(models, INPUT_NAME, x, y, repeats=args.repeats)
    cells["float"] += [f"{scores['float']['executor_top1']:.2f}"] * 2
    for label, files in models.items():
        deployed = f"{scores[label]['deployed_top1']:.2f}" + (" (float)" if label == "float" else "")
        speed = scores[label]["latency_ms"] / scores["float"]["latency_ms"]
        lines.append("| " + " | ".join([*cells[label], deployed, f"{files.params_bytes / source.params_bytes:.2f}",
                                        f"{speed:.2f}"]) + " |")
    lines += [
        "",
        "The demo CNN is tiny (53k parameters): latency is dominated by per-op overhead, so the int8 model is",
        "not faster here; the size column is the stored-weight saving. One test-set run of 2000 images: a",
        "difference of 0.05 points is one image.",
    ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "qat_demo.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
