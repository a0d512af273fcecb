"""The decoder written directly as an OpenVINO model (:mod:`qptq.llm.openvino_graph`) computes the port's
simulation (prefill and cached decode; Llama and Gemma 3 past its window; quantized table or float; tied or
separate head) with its linears as compressed ``u4`` / ``u8`` constants; positions reach the rotary embedding only
through a table lookup; and ``openvino_genai.LLMPipeline`` on the stateful folder continues a prompt with the port's
greedy tokens."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")
ov = pytest.importorskip("openvino")

sys.path.insert(0, str(Path(__file__).parent))
from test_llm_ort_graph import GEMMA, LLAMA, quantized  # noqa: E402

from qptq.llm.common import generate  # noqa: E402
from qptq.llm.openvino_graph import decoder_model  # noqa: E402

#: The plugin's arithmetic as written: float32, no int8 activations, a float32 cache (its defaults quantize both).
EXACT = {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0", "KV_CACHE_PRECISION": "f32"}


def run_cached(compiled, cfg, ids: np.ndarray, prompt: int) -> np.ndarray:
    """Logits of every position: ``prompt`` tokens at once, then one at a time through the returned cache."""
    empty = np.zeros((1, cfg.num_kv_heads, 0, cfg.head_dim), np.float32)
    cache = {f"past_{k}_{i}": empty for i in range(cfg.num_layers) for k in ("key", "value")}
    logits, start, end = [], 0, prompt
    while start < ids.shape[1]:
        out = compiled({"input_ids": ids[:, start:end], "attention_mask": np.ones((1, end), np.int64),
                        "position_ids": np.arange(start, end)[None], "beam_idx": np.zeros(1, np.int32), **cache})
        logits.append(out["logits"])
        cache = {f"past_{k}_{i}": out[f"present_{k}_{i}"] for i in range(cfg.num_layers) for k in ("key", "value")}
        start, end = end, end + 1
    return np.concatenate(logits, axis=1)


@pytest.mark.parametrize("cfg", [LLAMA, GEMMA, dataclasses.replace(LLAMA, tie_embeddings=False)],
                         ids=["llama", "gemma3", "llama-untied"])
@pytest.mark.parametrize("embedding_bits", [8, None], ids=["table-int8", "table-float"])
def test_prefill_and_cached_decode_compute_the_simulation(cfg, embedding_bits):
    net, result = quantized(cfg, embedding_bits)
    compiled = ov.Core().compile_model(decoder_model(net, result), "CPU", EXACT)
    ids = np.random.default_rng(1).integers(0, cfg.vocab_size, (1, 12))
    with paddle.no_grad():
        ours = net(paddle.to_tensor(ids))[0].numpy()
    theirs = run_cached(compiled, cfg, ids, prompt=7)
    assert theirs.shape == ours.shape
    assert np.abs(theirs - ours).max() < 1e-4 * np.abs(ours).max()


def test_linears_are_compressed_constants_and_positions_only_index_tables():
    net, result = quantized(LLAMA)
    model = decoder_model(net, result)
    kinds = [str(op.get_output_element_type(0)) for op in model.get_ops() if op.get_type_name() == "Constant"]
    # per layer 7 linears (codes and zero points u4); the table's once (u8), read by the lookup and the tied head
    assert kinds.count("<Type: 'uint4_t'>") == 2 * 7 * LLAMA.num_layers
    assert kinds.count("<Type: 'uint8_t'>") == 2
    positions = model.input("position_ids").get_node()
    readers = {t.get_node().get_type_name() for t in positions.output(0).get_target_inputs()}
    assert readers == {"Gather"}  # no angle is computed in the model (it would run in bf16 on such CPUs)


def test_the_pipeline_on_the_stateful_folder_continues_as_the_port(tmp_path):
    ovg = pytest.importorskip("openvino_genai")
    pytest.importorskip("openvino_tokenizers")
    from qdemo.testing import save_tiny_llama_gguf
    from qptq.llm.genai_folders import save_openvino_genai, tokenizer_files
    from qptq.llm.gguf_weights import read_metadata
    from qptq.llm.llama import load_gguf
    from qptq.weight_only import WeightOnlyConfig, quantize_

    source = save_tiny_llama_gguf(tmp_path / "tiny.gguf")
    net, tokenizer = load_gguf(source)
    result = quantize_(net, WeightOnlyConfig(bits=4, group_size=32, embedding_bits=8))
    folder = save_openvino_genai(net, result, tokenizer_files(tokenizer, read_metadata(source)), tmp_path / "ov")
    prompt = [5, 17, 3, 60, 42, 99]
    ours = generate(net, prompt, 12)
    pipe = ovg.LLMPipeline(str(folder), "CPU", **EXACT)
    config = ovg.GenerationConfig()
    config.max_new_tokens, config.ignore_eos = 12, True
    out = pipe.generate(ov.Tensor(np.array([prompt], np.int64)), config)
    assert list(out.tokens[0]) == ours
