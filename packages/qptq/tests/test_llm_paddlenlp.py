"""PaddleNLP checkpoints (:mod:`qptq.llm.paddlenlp`) with no model code: tiny random Llama, Mistral and Qwen2
checkpoints in PaddleNLP's layout (bf16 ``model_state.pdparams``, sharded bf16 safetensors, fp16 / f32) load into the
port with the logits of a plain numpy decoder of the architecture; quantized (RTN int4 g32) through
:func:`qptq.llm.route.quantize_llm`, the ONNX Runtime GenAI graph and the OpenVINO GenAI folder's model compute the
simulation at exact settings; what cannot be read or written is one line before any work."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

sys.path.insert(0, str(Path(__file__).parent))
from test_llm_ort_graph import run_cached as run_ort  # noqa: E402

from qcore.errors import ConfigError, DataError  # noqa: E402
from qdemo.testing import PADDLENLP_FAMILIES, save_tiny_paddlenlp_checkpoint  # noqa: E402
from qptq.llm.paddlenlp import load_checkpoint  # noqa: E402
from qptq.llm.route import quantize_llm  # noqa: E402
from qptq.weight_only import WeightOnlyConfig, quantize_  # noqa: E402

FAMILIES = sorted(PADDLENLP_FAMILIES)
#: Mistral's window: longer than the sequences run here, so the context is capped at it (see the module).
WINDOW = 64
#: OpenVINO's arithmetic as written: float32, no int8 activations, a float32 cache.
EXACT = {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0", "KV_CACHE_PRECISION": "f32"}
RTN = WeightOnlyConfig(bits=4, group_size=32)


def stored_state(directory: Path) -> dict[str, np.ndarray]:
    """Every tensor of a checkpoint as saved, in float64, read without the module under test."""
    if (directory / "model_state.pdparams").is_file():
        return {k: v.astype("float32").numpy().astype(np.float64)
                for k, v in paddle.load(str(directory / "model_state.pdparams")).items()}
    from safetensors import safe_open

    state = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), framework="paddle") as f:
            state.update({k: f.get_tensor(k).astype("float32").numpy().astype(np.float64) for k in f.keys()})
    return state


def reference_logits(directory: Path, ids: np.ndarray) -> np.ndarray:
    """``[T, vocab]`` logits of ``ids`` ``[T]`` by a plain numpy decoder written from the architecture's definition
    (RMSNorm, rotary halves, grouped-query causal attention, SwiGLU; Qwen2's q/k/v biases) on the stored tensors."""
    cfg = json.loads((directory / "config.json").read_text())
    state = stored_state(directory)
    _, _, prefix, _, tied, _ = PADDLENLP_FAMILIES[cfg["model_type"]]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, eps, length = cfg["hidden_size"] // heads, cfg["rms_norm_eps"], len(ids)

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    angles = np.arange(length)[:, None] * cfg["rope_theta"] ** (-np.arange(0, hd, 2) / hd)[None]
    cos, sin = np.cos(np.concatenate([angles, angles], 1)), np.sin(np.concatenate([angles, angles], 1))

    def rope(x):  # [n, T, hd]: channel i rotated against i + hd / 2
        return x * cos + np.concatenate([-x[..., hd // 2:], x[..., : hd // 2]], -1) * sin

    def proj(x, name, n):
        y = x @ state[f"{name}.weight"] + state.get(f"{name}.bias", 0.0)
        return y.reshape(length, n, hd).transpose(1, 0, 2)

    h = state[f"{prefix}.embed_tokens.weight"][ids]
    future = np.triu(np.ones((length, length), bool), 1)
    for i in range(cfg["num_hidden_layers"]):
        p = f"{prefix}.layers.{i}"
        x = rms(h, state[f"{p}.input_layernorm.weight"])
        q, k, v = (proj(x, f"{p}.self_attn.{n}_proj", c) for n, c in (("q", heads), ("k", kv_heads), ("v", kv_heads)))
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, heads // kv_heads, 0), np.repeat(v, heads // kv_heads, 0)
        scores = np.where(future, -np.inf, q @ k.transpose(0, 2, 1) / np.sqrt(hd))
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        out = (weights / weights.sum(-1, keepdims=True)) @ v
        h = h + out.transpose(1, 0, 2).reshape(length, heads * hd) @ state[f"{p}.self_attn.o_proj.weight"]
        x = rms(h, state[f"{p}.post_attention_layernorm.weight"])
        gate, up = x @ state[f"{p}.mlp.gate_proj.weight"], x @ state[f"{p}.mlp.up_proj.weight"]
        h = h + (gate / (1 + np.exp(-gate)) * up) @ state[f"{p}.mlp.down_proj.weight"]
    h = rms(h, state[f"{prefix}.norm.weight"])
    return h @ (state[f"{prefix}.embed_tokens.weight"].T if tied else state["lm_head.weight"])


def checkpoint(tmp_path: Path, family: str, storage: str) -> Path:
    dtype, weights, shards = {"pdparams-bf16": ("bfloat16", "pdparams", 1),
                              "safetensors-bf16-3-shards": ("bfloat16", "safetensors", 3),
                              "safetensors-fp16": ("float16", "safetensors", 1),
                              "pdparams-f32": ("float32", "pdparams", 1)}[storage]
    return save_tiny_paddlenlp_checkpoint(tmp_path / f"{family}-{storage}", family, dtype, weights, shards,
                                          sliding_window=WINDOW)


IDS = np.random.default_rng(3).integers(3, 320, 12)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("storage", ["pdparams-bf16", "safetensors-bf16-3-shards", "safetensors-fp16",
                                     "pdparams-f32"])
def test_a_checkpoint_loads_into_the_port_with_the_architectures_logits(tmp_path, family, storage):
    directory = checkpoint(tmp_path, family, storage)
    model, tokenizer, files = load_checkpoint(directory)
    with paddle.no_grad():
        ours = model(paddle.to_tensor(IDS[None]))[0].numpy()[0]
    reference = reference_logits(directory, IDS)
    assert ours.shape == reference.shape == (12, 320)
    assert np.abs(ours - reference).max() < 1e-5 * np.abs(reference).max()
    assert model.cfg.qkv_bias == (family == "qwen2") and model.cfg.tie_embeddings == (family == "qwen2")
    assert model.cfg.context_length == (WINDOW if family == "mistral" else 256)
    assert (files.bos_token_id, files.eos_token_id) == (1, 2) and files.config["eos_token"] == "</s>"
    assert tokenizer.decode(tokenizer.encode("the cat sat").ids) == "the cat sat"


def run_stateful(compiled, ids: np.ndarray, prompt: int) -> np.ndarray:
    """Logits of every position from a stateful IR (as LLMPipeline feeds it): ``prompt`` tokens, then one a step."""
    request = compiled.create_infer_request()
    request.reset_state()
    logits, start, end = [], 0, prompt
    while start < ids.shape[1]:
        out = request.infer({"input_ids": ids[:, start:end], "attention_mask": np.ones((1, end), np.int64),
                             "position_ids": np.arange(start, end)[None], "beam_idx": np.zeros(1, np.int32)})
        logits.append(np.asarray(out["logits"]))
        start, end = end, end + 1
    return np.concatenate(logits, axis=1)


@pytest.mark.parametrize("family", FAMILIES)
def test_quantized_checkpoint_folders_compute_the_simulation(tmp_path, family):
    ov = pytest.importorskip("openvino")
    pytest.importorskip("openvino_tokenizers")
    ort = pytest.importorskip("onnxruntime")
    from qptq.llm.ort_graph import decoder_graph

    directory = checkpoint(tmp_path, family, "safetensors-bf16-3-shards")
    genai = quantize_llm(directory, tmp_path / "genai", RTN, format="onnxruntime-genai")
    openvino = quantize_llm(directory, tmp_path / "ov", RTN, format="openvino-genai")
    # the simulation: RTN is deterministic, so a fresh load quantized alike is what the route wrote
    model, _, _ = load_checkpoint(directory)
    result = quantize_(model, RTN)
    assert [layer.name for layer in result.layers] == [layer.name for layer in genai.result.layers]
    ids = IDS[None]
    with paddle.no_grad():
        ours = model(paddle.to_tensor(ids))[0].numpy()

    session = ort.InferenceSession(decoder_graph(model, result, 0).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    theirs = run_ort(session, model.cfg, ids, prompt=7)
    assert np.abs(theirs - ours).max() < 1e-4 * np.abs(ours).max()
    compiled = ov.Core().compile_model(str(openvino.output / "openvino_model.xml"), "CPU", EXACT)
    theirs = run_stateful(compiled, ids, prompt=7)
    assert np.abs(theirs - ours).max() < 1e-4 * np.abs(ours).max()

    config = json.loads((genai.output / "genai_config.json").read_text())["model"]
    assert config["context_length"] == (WINDOW if family == "mistral" else 256)
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)
    assert genai.architecture == openvino.architecture == family
    for report in (genai, openvino):  # the route's own check: the runtime's default arithmetic, the same tokens
        (check,) = report.verified.values()
        assert check["top1_agreement"] >= 0.9


def test_qwen2_biases_reach_both_graphs(tmp_path):
    pytest.importorskip("openvino")
    from onnx import numpy_helper

    from qptq.llm.openvino_graph import decoder_model
    from qptq.llm.ort_graph import decoder_graph

    model, _, _ = load_checkpoint(checkpoint(tmp_path, "qwen2", "pdparams-bf16"))
    result = quantize_(model, RTN)
    state = {name: value.numpy() for name, value in model.state_dict().items()}
    biases = [state[f"layers.{i}.attn.{n}_proj.bias"] for i in range(model.cfg.num_layers) for n in "qkv"]
    # ONNX: q, k and v joined in one MatMulNBits, then one Add of [q | k | v] a layer
    graph = decoder_graph(model, result, 0).graph
    inits = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    added = [inits[n.input[1]] for n in graph.node if n.op_type == "Add" and n.input[1] in inits]
    assert len(added) == model.cfg.num_layers
    for i, bias in enumerate(added):
        np.testing.assert_array_equal(bias, np.concatenate(biases[3 * i: 3 * i + 3]))
    # OpenVINO: an Add of each projection's bias after its MatMul
    added = [op.input_value(1).get_node().get_data() for op in decoder_model(model, result).get_ops()
             if op.get_type_name() == "Add" and op.input_value(0).get_node().get_type_name() == "MatMul"]
    assert len(added) == len(biases)
    for bias, expected in zip(sorted(added, key=lambda b: b.tobytes()), sorted(biases, key=lambda b: b.tobytes())):
        np.testing.assert_array_equal(bias, expected)


def edit_config(directory: Path, **changes) -> None:
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def rename_in_index(directory: Path, old: str, new: str) -> None:
    path = directory / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    index["weight_map"] = {k.replace(old, new, 1): v for k, v in index["weight_map"].items()}
    path.write_text(json.dumps(index))


@pytest.mark.parametrize(("spoil", "error", "message"), [
    (lambda d: (d / "tokenizer.json").unlink(), ConfigError, "has no tokenizer.json"),
    (lambda d: (d / "config.json").unlink(), ConfigError, "has no config.json"),
    (lambda d: edit_config(d, architectures=["GPTNeoXForCausalLM"]), ConfigError, "describes ['GPTNeoXForCausalLM']"),
    (lambda d: edit_config(d, rope_scaling={"rope_type": "llama3", "factor": 8.0}), ConfigError,
     "only unscaled rotary positions are ported"),
    (lambda d: edit_config(d, fuse_attention_qkv=True), ConfigError,
     "save the checkpoint with fuse_attention_qkv=false"),
    (lambda d: (d / "model-00002-of-00003.safetensors").unlink(), ConfigError,
     "lists shards that are not in"),
    (lambda d: edit_config(d, num_hidden_layers=3), DataError, "has no llama.layers.2."),
    (lambda d: rename_in_index(d, "llama.", "model."), DataError, "is in Hugging Face's layout"),
])
def test_what_cannot_be_read_is_one_line_before_any_work(tmp_path, spoil, error, message):
    directory = checkpoint(tmp_path, "llama", "safetensors-bf16-3-shards")
    spoil(directory)
    with pytest.raises(error) as raised:
        quantize_llm(directory, tmp_path / "out", RTN, format="onnxruntime-genai")
    assert message in str(raised.value) and "\n" not in str(raised.value)
    assert not (tmp_path / "out").exists()


def test_gguf_output_from_a_checkpoint_is_refused_naming_the_formats_that_work(tmp_path):
    directory = checkpoint(tmp_path, "qwen2", "pdparams-bf16")
    with pytest.raises(ConfigError, match="write format='onnxruntime-genai' or 'openvino-genai'"):
        quantize_llm(directory, tmp_path / "out.gguf", WeightOnlyConfig(bits=4, group_size=32, grid="gguf"),
                     format="gguf")
    assert not (tmp_path / "out.gguf").exists()
