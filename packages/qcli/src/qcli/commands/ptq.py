"""``qcli ptq dynamic|static``: post-training quantization of a saved model, with a JSON report."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from qcore.config import ROUND_TYPES
from qcore.deploy import BACKEND_NAMES, get_target
from qcore.deploy.onnx_runtimes import ONNX_FILE
from qcore.errors import ConfigError, DataError, OutputError
from qcore.inference import create_predictor
from qcore.model_io import ModelFiles, find_model_files
from qcore.outputs import check_output_file, write_bytes
from qcore.scoring import agreement, interleaved_latency, top1
from qcore.thresholds import PTQ_ALGO_CHOICES
from qcore.verify import deployed_outputs, executor_outputs, markdown_table, slow_int8_warnings, verify

from ..calib_data import load_function, sample_source
from ..feeds import feed_specs, first_feed
from ..options import load_npy, numbers
from ..plugins import require
from ..report_html import render


def add_arguments(p: argparse.ArgumentParser) -> None:
    methods = p.add_subparsers(dest="method", required=True)

    dynamic = methods.add_parser("dynamic", help="weight-only: int8/int16 per channel (no calibration data), or "
                                                 "int4/int8 per group of input channels for LLM matmuls")
    _common(dynamic)
    dynamic.add_argument("--weight-bits", "--bits", type=int, default=None, choices=[4, 5, 6, 8, 16],
                         help="default 8 (4 with --bits-for q4_k_m); 4: int4 groups of matmul weights (LLMs; "
                              "--backend onnxruntime or openvino-runtime for the compressed ONNX file)")
    dynamic.add_argument("--op-types", nargs="+", default=None,
                         help="seed op types to quantize (default conv2d mul; groups: mul matmul matmul_v2)")
    dynamic.add_argument("--test-model", action="store_true", help="also write OUT/test_model (fake-quantized float)")
    groups = dynamic.add_argument_group("group-wise weights (LLMs): any of these, or --bits 4, selects them")
    groups.add_argument("--group-size", type=int, default=None, help="input channels per step (default 128; -1 per "
                                                                      "output channel)")
    groups.add_argument("--algo", default=None, choices=["rtn", "gptq"], help="round to nearest (default) or GPTQ")
    groups.add_argument("--awq", action="store_true", help="AWQ-style activation-aware scales first")
    groups.add_argument("--clip-search", action="store_true",
                        help="per-group range search by output error (with gptq: of its fixed grids)")
    groups.add_argument("--symmetric", action="store_true", help="no zero points")
    groups.add_argument("--sequential", action="store_true",
                        help="calibrate a decoder's layers one after another on the quantized layers' outputs "
                             "(GPTQ's order; Python layers and LLM checkpoints)")
    groups.add_argument("--ratio", type=float, default=1.0, help="share of weights at 4 bits, the rest int8")
    groups.add_argument("--bits-for", action="append", default=[], metavar="PATTERN=BITS",
                        help="your own per-tensor rule, repeatable: linears whose name matches the regular "
                             "expression get BITS (e.g. 'v_proj|down_proj=8'); the first match decides. GGUF: "
                             "or q4_k_m, llama.cpp's Q4_K_M mix (Q6_K for half the v / down projections, the "
                             "table and an untied head; defaults --group-size 256 --embedding-bits 6 "
                             "--group-size-fallback adjust)")
    groups.add_argument("--embedding-bits", type=int, default=None, choices=[4, 6, 8],
                        help="also the embedding tables (and an LM head tied to one): int4 or int8 groups "
                             "(GGUF: the block type of those bits, 6 = Q6_K)")
    groups.add_argument("--group-size-fallback", default=None, choices=["error", "adjust", "ignore"],
                        help="a width the group does not divide: refuse (default), adjust the group (GGUF "
                             "K-quants: llama.cpp's fallback type, Q4_K -> Q5_0, Q6_K -> Q8_0), or leave it float")
    groups.add_argument("--data", default=None,
                        help="calibration inputs for gptq / awq / clip search: a .npy array (N, ...) of the model's "
                             "input, or module:function / file.py:function returning an iterable of samples")
    groups.add_argument("--batch-size", type=int, default=8)
    groups.add_argument("--batch-nums", type=int, default=None, help="stop after this many batches")
    llm = dynamic.add_argument_group("LLM checkpoints (MODEL a .gguf file, or a PaddleNLP checkpoint directory of "
                                     "Llama, Mistral or Qwen2: config.json, model_state.pdparams or safetensors, "
                                     "tokenizer.json): --bits 4|5|8 and --symmetric pick the GGUF block type "
                                     "(Q4_0 = --bits 4 --symmetric, Q4_1 = --bits 4, Q8_0 = --bits 8), "
                                     "--group-size 256 the K-quants (Q4_K = --bits 4, Q5_K = 5, Q6_K = 6)")
    llm.add_argument("--format", default=None, choices=["gguf", "openvino-genai", "onnxruntime-genai"],
                     help="what to write: gguf (the default for a .gguf MODEL, which it needs; OUT is the .gguf "
                          "file llama.cpp runs), or OUT a folder that openvino_genai.LLMPipeline or "
                          "onnxruntime_genai runs (int4/int8 groups, --group-size default 128); --data takes a .txt "
                          "of text or a .npy of token ids")
    dynamic.set_defaults(run=run_dynamic)

    static = methods.add_parser("static", help="int8 weights and activations, calibrated on sample data")
    _common(static)
    static.add_argument(
        "--data", required=True,
        help="calibration samples: a .npy array (N, ...), a folder of images or .npy files, or module:function / "
        "file.py:function returning an iterable of samples",
    )
    static.add_argument("--algo", default="auto", type=str.lower, choices=PTQ_ALGO_CHOICES,
                        help="activation threshold algorithm (default auto: per activation the threshold with the "
                             "least layer output error, and per model which layers stay float, from the "
                             "calibration data and the backend's cost rules, scored on held-back batches; the "
                             "report's 'auto' section says why); kl: PaddleSlim's default, every layer int8")
    static.add_argument("--round-type", default="round", choices=ROUND_TYPES,
                        help="weight rounding: round (to nearest) or adaround (learned per layer)")
    static.add_argument("--asymmetric", action="store_true",
                        help="activations on asymmetric grids over the range each one reaches (zero points; "
                             "--backend openvino or native)")
    static.add_argument("--batch-size", type=int, default=10)
    static.add_argument("--batch-nums", type=int, default=None, help="stop after this many batches")
    static.add_argument(
        "--op-types", nargs="+", default=None, help="seed op types to quantize (default: conv2d depthwise_conv2d mul)",
    )
    static.add_argument("--full", action="store_true", help="is_full_quantize: every op type the seeds list")
    static.add_argument("--weight-bits", type=int, default=8)
    static.add_argument("--activation-bits", type=int, default=8)
    static.add_argument("--weight-quantize-type", default="channel_wise_abs_max")
    static.add_argument("--hist-percent", type=float, default=0.99999)
    static.add_argument("--no-fold-bn", action="store_true",
                        help="optimize_model=False: legacy conv biases kept as Paddle wrote them (batch norms are "
                             "folded into the convs anyway)")
    static.add_argument("--bias-correction", action="store_true", help="correct the mean shift int8 weights cause")
    static.add_argument("--skip-pattern", nargs="+", default=["skip_quant"], help="name scopes left in float")
    static.add_argument("--max-output-error", type=float, default=None,
                        help="accuracy budget without labels: keep layers float until the outputs are within this "
                             "relative error of float on calibration batches")
    static.add_argument("--max-metric-drop", "--max-drop", type=float, default=None,
                        help="accuracy budget: keep layers float until the metric (--eval, else top-1 on "
                             "--eval-data/--eval-labels deployed on --backend) is at most this far below float, "
                             "as a fraction (0.01 = one point)")
    static.add_argument("--eval", default=None, metavar="MODULE:FUNCTION",
                        help="your metric for --max-drop: fn(model_files) -> float, higher is better "
                             "(module:function or file.py:function)")
    static.add_argument("--report-html", type=Path, default=None,
                        help="also write an HTML page: the verification per backend and, with a budget, plots "
                             "(layer sensitivity, metric and latency per candidate on --backend)")
    static.add_argument("--input-shape", default=None, type=numbers(int, "3,224,224"),
                        help="C,H,W images are resized to (default: the model's)")
    static.add_argument("--mean", default="0", type=numbers(float, "0.485,0.456,0.406"),
                        help="per-channel mean of [0,1] pixels, e.g. 0.485,0.456,0.406")
    static.add_argument("--std", default="1", type=numbers(float, "0.229,0.224,0.225"),
                        help="per-channel std the pixels are divided by")
    static.set_defaults(run=run_static)


CPU_BACKENDS = ("onednn", "openvino", "native")
#: Samples a run is verified on (``--eval-data``, else calibration samples).
VERIFY_SAMPLES = 64
#: Exit status when the model was written but its verification failed (the model stays).
VERIFICATION_FAILED = 8


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", type=Path, help="model directory, path prefix or model file (PIR .json or legacy)")
    p.add_argument("out", type=Path, help="directory for the quantized model (other files there are kept)")
    p.add_argument("--model-filename", default=None)
    p.add_argument("--params-filename", default=None)
    p.add_argument("--report", type=Path, default=None, help="write a JSON report here (default OUT.report.json)")
    p.add_argument("--eval-data", type=Path, default=None, help=".npy inputs to score float vs int8 on")
    p.add_argument("--eval-labels", type=Path, default=None, help=".npy integer labels for --eval-data (top-1)")
    p.add_argument("--backend", default=None, choices=BACKEND_NAMES,
                   help="quantize for this runtime (deploy_backend) and verify there (default: oneDNN's rules, "
                        "correct on every backend, verified on each CPU backend)")


def _grouped(args: argparse.Namespace) -> bool:
    return args.weight_bits == 4 or args.group_size is not None or args.algo is not None or args.awq \
        or args.clip_search or args.embedding_bits is not None or bool(args.bits_for)


def _bits_for(rules: list[str]) -> dict[str, int]:
    """``--bits-for PATTERN=BITS`` options as ``WeightOnlyConfig.bits_by_name`` (one line for a malformed one)."""
    parsed = {}
    for rule in rules:
        pattern, _, bits = rule.rpartition("=")
        if not pattern or not bits.isdigit():
            raise ConfigError(f"--bits-for {rule!r} is not PATTERN=BITS; write e.g. --bits-for 'v_proj|down_proj=8'")
        parsed[pattern] = int(bits)
    return parsed


def _llm_rules(args: argparse.Namespace, fmt: str) -> tuple[dict[str, int], bool]:
    """``--bits-for`` of an LLM run as ``bits_by_name``: the user's rules first, then those of a named mix
    (:data:`qptq.llm.mixes.MIXES`, for the source's layer count); and whether a mix was named."""
    from qptq.llm.mixes import MIXES, decoder_layers

    mixes = [rule for rule in args.bits_for if rule.lower() in MIXES]
    rules = _bits_for([rule for rule in args.bits_for if rule.lower() not in MIXES])
    if mixes and fmt != "gguf":
        raise ConfigError(f"--bits-for {mixes[0]} mixes GGUF block types; use it with --format gguf")
    for mix in mixes:
        for pattern, bits in MIXES[mix.lower()](decoder_layers(args.model)).items():
            rules.setdefault(pattern, bits)
    return rules, bool(mixes)


def run_dynamic(args: argparse.Namespace) -> int:
    qptq = require("ptq")
    if args.format is not None or args.model.suffix == ".gguf" or (args.model / "config.json").is_file():
        return _run_llm(args)
    args.weight_bits = 8 if args.weight_bits is None else args.weight_bits
    _check_paths(args)
    source = find_model_files(args.model, args.model_filename, args.params_filename)
    if _grouped(args):
        return _run_weight_only(args, source)
    if args.data is not None:
        raise ConfigError("--data calibrates group-wise weights only; add --bits 4 or --group-size, or drop --data")
    start = time.perf_counter()
    op_types = args.op_types or ["conv2d", "mul"]
    files = qptq.quant_post_dynamic(
        args.model, args.out, args.model_filename, args.params_filename,
        quantizable_op_type=op_types, weight_bits=args.weight_bits, generate_test_model=args.test_model,
        deploy_backend=args.backend,
    )
    report = {"method": "dynamic", "weight_bits": args.weight_bits, "op_types": op_types}
    return _finish(args, source, files, report, time.perf_counter() - start)


def _run_weight_only(args: argparse.Namespace, source: ModelFiles) -> int:
    """Group-wise weight-only codes for the matmuls (:func:`qptq.weight_only.saved.quant_post_weight_only`)."""
    from qptq.weight_only import WeightOnlyConfig
    from qptq.weight_only.saved import quant_post_weight_only

    config = WeightOnlyConfig(
        bits=args.weight_bits, group_size=128 if args.group_size is None else args.group_size,
        symmetric=args.symmetric, algo=args.algo or "rtn", awq=args.awq, clip_search=args.clip_search,
        ratio=args.ratio, group_size_fallback=args.group_size_fallback or "error",
        embedding_bits=args.embedding_bits, sequential=args.sequential, bits_by_name=_bits_for(args.bits_for),
    )
    samples = None if args.data is None else sample_source(args.data, lambda: _sample_shape(source, None))
    start = time.perf_counter()
    options: dict[str, Any] = {} if args.op_types is None else {"quantizable_op_type": args.op_types}
    files, result = quant_post_weight_only(
        args.model, args.out, config, model_filename=args.model_filename, params_filename=args.params_filename,
        deploy_backend=args.backend, sample_generator=samples, batch_size=args.batch_size,
        batch_nums=args.batch_nums, progress=True, **options,
    )
    grids = sorted({layer.grid for layer in result.layers})
    report = {
        "method": "dynamic", "weight_only": dataclasses.asdict(config),
        "label": "/".join(sorted({f"int{layer.bits}" for layer in result.layers})),
        "layers": [dataclasses.asdict(layer) for layer in result.layers],
        "compressed_weight_bytes": result.size_bytes(),
        "float_weight_bytes": sum(4 * layer.shape[0] * layer.shape[1] for layer in result.layers),
        "grids": grids,
    }
    onnx_file = files.directory / ONNX_FILE
    if onnx_file.is_file():
        data = onnx_file.with_name(onnx_file.name + ".data")
        report["compressed_file"] = str(onnx_file)
        report["compressed_file_bytes"] = onnx_file.stat().st_size + (data.stat().st_size if data.is_file() else 0)
    return _finish(args, source, files, report, time.perf_counter() - start, samples)


def _run_llm(args: argparse.Namespace) -> int:
    """An LLM checkpoint (GGUF, or a PaddleNLP checkpoint directory) to a quantized file for an LLM runtime
    (:func:`qptq.llm.route.quantize_llm`)."""
    from qptq.llm.route import LLM_FORMATS, MIN_AGREEMENT, quantize_llm
    from qptq.weight_only import WeightOnlyConfig

    if args.format is None and args.model.is_dir():
        raise ConfigError(f"{args.model} is a checkpoint directory: say what to write with --format "
                          "onnxruntime-genai or --format openvino-genai")
    fmt = args.format or "gguf"
    if args.model.suffix != ".gguf" and not args.model.is_dir():
        raise ConfigError(f"--format {fmt} reads a GGUF checkpoint or a PaddleNLP checkpoint directory; "
                          f"{args.model} is neither")
    if args.backend is not None:
        raise ConfigError(f"--backend names a Paddle or ONNX runtime; --format {fmt} names the LLM runtime: "
                          "drop --backend")
    grid = LLM_FORMATS[fmt][1]
    if args.weight_bits == 16:
        raise ConfigError("--bits 16 has no weight-only LLM grid; use 4 or 8 (5 or 6 for GGUF)")
    report_path = _report_path(args)
    rules, mix = _llm_rules(args, fmt)
    config = WeightOnlyConfig(
        bits=args.weight_bits or (4 if mix else 8),
        group_size=args.group_size or (256 if mix else 32 if grid == "gguf" else 128),
        symmetric=args.symmetric, algo=args.algo or "rtn", clip_search=args.clip_search, awq=args.awq,
        ratio=args.ratio, group_size_fallback=args.group_size_fallback or ("adjust" if mix else "error"),
        embedding_bits=args.embedding_bits if args.embedding_bits is not None or not mix else 6,
        grid=grid, sequential=args.sequential, bits_by_name=rules)
    start = time.perf_counter()
    if int(os.environ.get("PADDLE_TRAINERS_NUM", "1")) > 1:  # under paddle.distributed.launch: share the windows
        import paddle.distributed as dist

        dist.init_parallel_env()
        if dist.get_rank() != 0:  # the same codes on every rank; rank 0 writes, checks and reports
            quantize_llm(args.model, args.out, config, args.data, format=fmt)
            return 0
    done = quantize_llm(args.model, args.out, config, args.data, format=fmt, show_progress=True)
    seconds = time.perf_counter() - start
    formats = done.formats()
    report = {"method": "dynamic", "format": done.format, "model": str(args.model), "output": str(done.output),
              "architecture": done.architecture, "seconds": round(seconds, 3),
              "weight_only": dataclasses.asdict(config),
              "sizes": {"float32_params_bytes": done.float_bytes, "file_bytes": done.file_bytes,
                        "ratio": round(done.file_bytes / done.float_bytes, 4)},
              "weights_per_type": formats, "layers": [dataclasses.asdict(layer) for layer in done.result.layers],
              "verified": done.verified}
    status = 0
    for where, check in done.verified.items():
        if isinstance(check, dict) and check["top1_agreement"] < MIN_AGREEMENT:
            report["verification_failed"] = f"{where} agrees with the simulation on {check['top1_agreement']:.0%}"
            status = VERIFICATION_FAILED
    write_bytes(report_path, json.dumps(report, indent=1).encode())
    main_type = max(formats, key=formats.__getitem__)
    others = [f"{layer.name} {layer.grid}" for layer in done.result.layers if layer.grid != main_type]
    runtime = {"gguf": "GGUF for llama.cpp", "openvino-genai": "an OpenVINO GenAI folder",
               "onnxruntime-genai": "an ONNX Runtime GenAI folder"}[fmt]
    print(f"quantized model: {done.output} ({runtime}, {done.architecture}; {seconds:.0f} s): "
          f"{done.file_bytes / 1e6:.1f} MB, {report['sizes']['ratio']:.2f}x the float32 parameters' "
          f"{done.float_bytes / 1e6:.1f} MB; report: {report_path}")
    print(f"  {len(done.result.layers) - len(others)} tensors {main_type}" + (f"; {', '.join(others)}" if others
                                                                             else ""))
    for where, what in done.verified.items():
        text = (f"logits within {what['max_abs_diff_over_std']:.3f} std of the simulation's, top token agrees on "
                f"{what['top1_agreement']:.0%} of positions" if isinstance(what, dict) else what)
        print(f"  verified, {where}: {text}")
    if status:
        print(f"qcli {args.command}: the file is written, but {report['verification_failed']}", file=sys.stderr)
    return status


def run_static(args: argparse.Namespace) -> int:
    qptq = require("ptq")
    _check_paths(args)
    source = find_model_files(args.model, args.model_filename, args.params_filename)
    image_shape = functools.partial(_sample_shape, source, args.input_shape)
    samples = sample_source(args.data, image_shape, args.mean, args.std)
    start = time.perf_counter()
    options: dict[str, Any] = {} if args.op_types is None else {"quantizable_op_type": args.op_types}
    options.update(_budget_options(args, source))
    if args.report_html is not None and options:
        options["measure_candidate"] = _latency_ratio(source, args.backend or "onednn")
    ptq_report = qptq.quant_post_static(
        None, args.model, args.out, sample_generator=samples, model_filename=args.model_filename,
        params_filename=args.params_filename, save_model_filename=None, save_params_filename=None,
        batch_size=args.batch_size, batch_nums=args.batch_nums, algo=args.algo, is_full_quantize=args.full,
        weight_bits=args.weight_bits, activation_bits=args.activation_bits,
        weight_quantize_type=args.weight_quantize_type, optimize_model=not args.no_fold_bn,
        hist_percent=args.hist_percent, skip_patterns=args.skip_pattern, bias_correction=args.bias_correction,
        progress=True, deploy_backend=args.backend, round_type=args.round_type,
        activation_symmetric=False if args.asymmetric else None, **options,
    )
    report = {"method": "static", **ptq_report}
    return _finish(args, source, find_model_files(args.out), report, time.perf_counter() - start, samples)


def _check_paths(args: argparse.Namespace) -> None:
    """Refuse, before any work, evaluation files that do not exist and report paths that cannot be written."""
    _report_path(args)
    for option, path in (("--eval-data", args.eval_data), ("--eval-labels", getattr(args, "eval_labels", None))):
        if path is not None and not Path(path).is_file():
            raise DataError(f"{option} {path}: no such file; give a .npy array of samples")
    problem = get_target(args.backend).files_problem() if args.backend else None
    if problem is not None:  # a run verified on every backend reports this in the backend's row instead
        raise OutputError(f"--backend {args.backend}: {problem}")
    html = getattr(args, "report_html", None)
    if html is not None:
        check_output_file(html, "--report-html")


def _verified_backends(args: argparse.Namespace) -> list[str]:
    """The runtimes a run is verified on: ``--backend``, else every CPU backend."""
    return [args.backend] if args.backend else list(CPU_BACKENDS)


def _report_path(args: argparse.Namespace) -> Path:
    """Where the JSON report goes; refused before any work when it cannot be written (:func:`check_output_file`)."""
    if args.report is None:  # next to OUT, whose parent the save creates
        return args.out.with_name(args.out.name + ".report.json")
    return check_output_file(args.report, "--report")


def _finish(args: argparse.Namespace, source: ModelFiles, out: ModelFiles, report: dict, seconds: float,
            samples: Callable[[], Any] | None = None) -> int:
    report = {
        **report,
        "model": str(source.model_file),
        "output": str(out.model_file),
        "seconds": round(seconds, 3),
        "sizes": {
            "float_params_bytes": source.params_bytes,
            "quantized_params_bytes": out.params_bytes,
            "ratio": round(out.params_bytes / source.params_bytes, 4),
        },
    }
    status = 0
    try:
        if args.eval_data is not None:
            report["accuracy"] = _accuracy(source, out, args.eval_data, args.eval_labels, args.backend)
        feed, report["verified_on"] = _verification_feed(args, source, samples)
        if feed is not None:
            report["verified"] = verify(source, out, feed, _verified_backends(args))
    except Exception as exc:  # the model is written and stays: say so in one line, with the documented status
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        report["verification_failed"] = first
        print(f"qcli {args.command}: the quantized model is written to {out.directory}, but verifying it failed: "
              f"{first}", file=sys.stderr)
        status = VERIFICATION_FAILED
    path = _report_path(args)
    write_bytes(path, json.dumps(report, indent=1).encode())
    if getattr(args, "report_html", None) is not None:
        write_bytes(args.report_html, render(report).encode())
        print(f"HTML report: {args.report_html}")
    sizes = report["sizes"]
    print(f"quantized model: {out.model_file} ({report['seconds']} s); params {sizes['float_params_bytes']:,} -> "
          f"{sizes['quantized_params_bytes']:,} bytes ({sizes['ratio']:.2f}x); report: {path}")
    if "grids" in report:  # weight-only groups: the Paddle model holds the simulation, the ONNX file the codes
        _print_weight_only(report, sizes["float_params_bytes"])
    if "auto" in report:
        print(f"algo auto: {auto_summary(report['auto'])}")
    for name, value in report.get("accuracy", {}).items():
        print(f"  {name}: {value:.2f}")
    if "verified" in report:
        print(f"verified on {report['verified_on']}:")
        print(markdown_table(report["verified"], ("float", report.get("label", "int8"))))
        for line in slow_int8_warnings(report["verified"]):
            print(f"warning: {line}", file=sys.stderr)
    elif "verification_failed" not in report:
        print(f"not verified: {report['verified_on']}")
    return status


def auto_summary(auto: dict[str, Any]) -> str:
    """``algo="auto"``'s decision in one line (:func:`qptq.decide.summary`)."""
    from qptq.decide import summary

    what, why = summary(auto)
    return f"the model stays float: {why}" if what == "float" else f"{what}; {why}"


def _print_weight_only(report: dict, float_bytes: int) -> None:
    """Where the compressed weights are: the ONNX file and its size against the float parameters, or why none."""
    kinds = ", ".join(report["grids"])
    if "compressed_file" in report:
        size = report["compressed_file_bytes"]
        print(f"compressed model: {report['compressed_file']} ({size:,} bytes, {size / float_bytes:.2f}x the float "
              f"parameters; matmul weights {kinds} in groups)")
    else:
        print(f"no compressed file: the Paddle model holds the {kinds} weights dequantized, at float size (Paddle has "
              "no int4 or group-wise matmul on CPU); add --backend onnxruntime or --backend openvino-runtime to "
              f"also write {ONNX_FILE} with the codes")


def _verification_feed(args: argparse.Namespace, source: ModelFiles,
                       samples: Callable[[], Any] | None) -> tuple[dict[str, np.ndarray] | None, str]:
    """The samples the model is verified on, and what they are: the first :data:`VERIFY_SAMPLES` of
    ``--eval-data``, else of the calibration data (same shape as the first), else standard-normal samples
    for a float input of fixed shape; None (with the reason) where none of these fits."""
    specs = feed_specs(source)
    if len(specs) != 1:
        return None, f"the model has {len(specs)} inputs; qcli verifies one-input models (use qcore.verify)"
    name, (shape, dtype) = next(iter(specs.items()))
    if args.eval_data is not None:
        x = load_npy(args.eval_data, "--eval-data")[:VERIFY_SAMPLES]
        return {name: x}, f"{len(x)} samples of --eval-data"
    if samples is not None:
        from qptq.data import to_feed

        kept: list[np.ndarray] = []
        for item in samples():
            array = np.asarray(to_feed(item, [name])[name])
            if kept and array.shape != kept[0].shape:
                continue
            kept.append(array)
            if len(kept) == VERIFY_SAMPLES:
                break
        return {name: np.stack(kept).astype(dtype)}, f"{len(kept)} calibration samples (--eval-data: held-out ones)"
    if np.dtype(dtype).kind != "f" or any(d < 0 for d in shape[1:]):
        return None, "no --eval-data, and random samples do not fit the model's input; pass --eval-data"
    feed = _random_feed(source, VERIFY_SAMPLES)
    return feed, f"{VERIFY_SAMPLES} standard-normal samples (pass --eval-data to verify on real ones)"


def _budget_options(args: argparse.Namespace, source: ModelFiles) -> dict[str, Any]:
    """``max_output_error``, or ``eval_function`` (deployed top-1 on the eval set) + ``max_metric_drop``."""
    if args.max_metric_drop is None:
        if args.eval is not None:
            raise ConfigError("--eval is the metric of an accuracy budget: give --max-drop too (e.g. 0.01)")
        return {} if args.max_output_error is None else {"max_output_error": args.max_output_error}
    if args.eval is not None:
        return {"max_metric_drop": args.max_metric_drop,
                "eval_function": load_function(args.eval, "--eval", "module:function taking the model files")}
    if args.eval_data is None or args.eval_labels is None:
        raise ConfigError("--max-drop needs a metric: --eval module:function, or --eval-data and --eval-labels "
                          "(top-1)")
    x, y = load_npy(args.eval_data, "--eval-data"), load_npy(args.eval_labels, "--eval-labels")
    _check_labels(x, y)  # before calibration, not after the sensitivity runs
    feed = first_feed(source)
    return {"max_metric_drop": args.max_metric_drop,
            "eval_function": lambda files: top1(deployed_outputs(files, feed, x, args.backend), y) / 100}


def _latency_ratio(source: ModelFiles, backend: str) -> Callable[[ModelFiles], float]:
    """``fn(files)``: the median latency of ``files`` over the float model's on ``backend``, runs interleaved,
    on one random sample of the model's input (1.0 for the float model itself)."""
    feed = _random_feed(source, batch=1)
    if feed is None:
        raise ConfigError("--report-html measures latency on random inputs: the model needs one input of fixed "
                          "sample shape; leave out --report-html for this model")
    reference = create_predictor(source, backend=backend)

    def ratio(files: ModelFiles) -> float:
        ms = interleaved_latency({"float": reference, "candidate": create_predictor(files, backend=backend)}, feed)
        return round(ms["candidate"] / ms["float"], 4)

    return ratio


def _random_feed(files: ModelFiles, batch: int = 8) -> dict[str, np.ndarray] | None:
    """``batch`` standard-normal samples for a one-input model of fixed sample shape, else None."""
    specs = feed_specs(files)
    if len(specs) != 1:
        return None
    name, (shape, dtype) = next(iter(specs.items()))
    if any(d < 0 for d in shape[1:]):
        return None
    return {name: np.random.default_rng(0).standard_normal((batch, *shape[1:])).astype(dtype)}


def _accuracy(source: ModelFiles, out: ModelFiles, data: Path, labels: Path | None,
              backend: str | None) -> dict[str, float]:
    x = load_npy(data, "--eval-data")
    feed = first_feed(source)
    float_out, int8_out = deployed_outputs(source, feed, x, backend), deployed_outputs(out, feed, x, backend)
    result = {
        "agreement_deployed": agreement(float_out, int8_out),
        "agreement_simulated": agreement(float_out, executor_outputs(out, feed, x)),
    }
    if labels is not None:
        y = load_npy(labels, "--eval-labels")
        _check_labels(x, y)
        result |= {"top1_float": top1(float_out, y), "top1_int8_deployed": top1(int8_out, y)}
    return result


def _check_labels(x: np.ndarray, y: np.ndarray) -> None:
    if len(y) != len(x):
        raise DataError(f"--eval-labels has {len(y)} labels for {len(x)} --eval-data samples; they must match")


def _sample_shape(source: ModelFiles, override: tuple[int, ...] | None) -> tuple[int, ...]:
    if override:
        return override
    shape, _ = next(iter(feed_specs(source).values()))
    return shape[1:]
