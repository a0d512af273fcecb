"""The decoder graph written with ONNX Runtime's contrib ops (:mod:`qptq.llm.ort_graph`) computes the port's
simulation: prefill and cached decode, Llama and Gemma 3 (sliding window shorter than the text, two rotary bases,
q/k norms), quantized table or float, tied or separate head; its ops are the fused ones; and ONNX Runtime
GenAI's generator, with the cache one shared buffer, continues a prompt with exactly the port's greedy tokens."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")
ort = pytest.importorskip("onnxruntime")

from qcore.export.nbits_layout import FLOAT_ACTIVATIONS  # noqa: E402
from qcore.export.ortgenai import DecoderShape, write_genai_folder  # noqa: E402
from qptq.llm.common import generate  # noqa: E402
from qptq.llm.config import DecoderConfig, Gemma3Config  # noqa: E402
from qptq.llm.gemma3 import Gemma3  # noqa: E402
from qptq.llm.llama import Llama  # noqa: E402
from qptq.llm.ort_graph import decoder_graph  # noqa: E402
from qptq.weight_only import WeightOnlyConfig, quantize_  # noqa: E402

LLAMA = DecoderConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=16, context_length=128)
# layers 0 and 1 local (window 4, shorter than the 12 tokens run), layer 2 global
GEMMA = Gemma3Config(vocab_size=96, hidden_size=64, intermediate_size=96, num_layers=3, num_heads=4, num_kv_heads=2,
                     head_dim=16, rope_theta=1e6, rms_eps=1e-6, context_length=128, sliding_window=4,
                     global_every=3, local_rope_theta=1e4)


def random_model(cfg: DecoderConfig, seed: int = 0) -> paddle.nn.Layer:
    net = (Gemma3 if isinstance(cfg, Gemma3Config) else Llama)(cfg)
    rng = np.random.default_rng(seed)
    for p in net.parameters():  # norms away from 1 so they matter
        p.set_value(rng.normal(0.0, 0.3 if p.ndim == 2 else 1.0, p.shape).astype("float32"))
    net.eval()
    return net


def quantized(cfg: DecoderConfig, embedding_bits: int | None = 8, skip: tuple[str, ...] = ()):
    net = random_model(cfg)
    return net, quantize_(net, WeightOnlyConfig(bits=4, group_size=32, embedding_bits=embedding_bits, skip=skip))


def run_cached(session, cfg: DecoderConfig, ids: np.ndarray, prompt: int) -> np.ndarray:
    """Logits of every position: ``prompt`` tokens at once, then one at a time through the returned cache."""
    names = [o.name for o in session.get_outputs()]
    empty = np.zeros((1, cfg.num_kv_heads, 0, cfg.head_dim), np.float32)
    past = {f"past_key_values.{i}.{k}": empty for i in range(cfg.num_layers) for k in ("key", "value")}
    logits, end = [], prompt
    chunk = ids[:, :prompt]
    while True:
        out = session.run(None, {"input_ids": chunk, "attention_mask": np.ones((1, end), np.int64), **past})
        logits.append(out[0])
        if end == ids.shape[1]:
            return np.concatenate(logits, axis=1)
        past = {n.replace("present", "past_key_values"): v for n, v in zip(names[1:], out[1:])}
        chunk, end = ids[:, end:end + 1], end + 1


@pytest.mark.parametrize("cfg", [LLAMA, GEMMA, dataclasses.replace(LLAMA, tie_embeddings=False)],
                         ids=["llama", "gemma3", "llama-untied"])
@pytest.mark.parametrize(("embedding_bits", "skip"), [(8, ()), (None, ()), (8, (r"\.k_proj", r"\.up_proj"))],
                         ids=["table-int8", "table-float", "k-up-float"])
def test_prefill_and_cached_decode_compute_the_simulation(cfg, embedding_bits, skip):
    net, result = quantized(cfg, embedding_bits, skip)
    session = ort.InferenceSession(decoder_graph(net, result, FLOAT_ACTIVATIONS).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    ids = np.random.default_rng(1).integers(0, cfg.vocab_size, (1, 12))
    with paddle.no_grad():
        ours = net(paddle.to_tensor(ids))[0].numpy()
    theirs = run_cached(session, cfg, ids, prompt=7)
    assert theirs.shape == ours.shape
    # float activations: the codes decide every weight, only float rounding differs
    assert np.abs(theirs - ours).max() < 1e-4 * np.abs(ours).max()


def test_the_graph_is_built_of_the_fused_ops():
    net, result = quantized(GEMMA)
    ops = Counter(n.op_type for n in decoder_graph(net, result).graph.node)
    layers = GEMMA.num_layers
    assert ops["GroupQueryAttention"] == layers
    assert ops["MatMulNBits"] == 4 * layers + 1  # q k v joined, o, gate and up joined, down; the tied head
    assert ops["Split"] == 2 * layers  # q / k / v for the q and k norms, gate / up
    assert ops["GatherBlockQuantized"] == 1
    # Gemma's four norms a layer, the final one, q/k norms: residual adds folded into the skip norms
    assert ops["SkipSimplifiedLayerNormalization"] == 2 * layers
    assert ops["SimplifiedLayerNormalization"] == 1 + 2 * layers + 2 * layers
    # attention and the cache are GroupQueryAttention's: no softmax, no cache concatenated (one Concat: the rows' shape)
    assert "Softmax" not in ops and ops["Concat"] == 1


def test_llama_attention_reads_q_k_v_packed_and_unequal_grids_stay_apart():
    net, result = quantized(LLAMA)
    nodes = decoder_graph(net, result).graph.node
    attention = [n for n in nodes if n.op_type == "GroupQueryAttention"]
    assert [list(n.input[1:3]) for n in attention] == [["", ""]] * LLAMA.num_layers
    qkv = next(n for n in nodes if n.name == "layers.0.attn.qkv.nbits")
    assert next(a.i for a in qkv.attribute if a.name == "N") == (4 + 2 + 2) * 16
    net, result = quantized(LLAMA, skip=(r"\.k_proj",))  # k float: q and v cannot join it
    ops = Counter(n.op_type for n in decoder_graph(net, result).graph.node)
    assert ops["MatMulNBits"] == 2 * (2 + 1 + 1 + 1) + 1 and ops["MatMul"] == 2  # q, v; o; gate+up; down; head


def test_genai_generator_with_a_shared_cache_buffer_continues_as_the_port(tmp_path):
    og = pytest.importorskip("onnxruntime_genai")
    cfg = LLAMA
    net, result = quantized(cfg)
    prompt, max_length = [5, 17, 3, 60, 42], 24
    ours = generate(net, prompt, max_length - len(prompt))
    eos = min(set(range(cfg.vocab_size)) - set(ours))  # never produced: generation runs its full length
    shape = DecoderShape(type="llama", vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                         num_layers=cfg.num_layers, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
                         head_dim=cfg.head_dim, context_length=cfg.context_length, bos_token_id=None,
                         eos_token_id=eos)
    tokenizer = '{"version": "1.0", "model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"}}'
    folder = write_genai_folder(tmp_path / "genai", lambda w: decoder_graph(net, result, FLOAT_ACTIVATIONS, w), shape,
                                tokenizer, {"tokenizer_class": "PreTrainedTokenizerFast"})
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    while not generator.is_done():
        generator.generate_next_token()
    assert list(generator.get_sequence(0))[len(prompt):] == ours
