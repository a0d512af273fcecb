"""The Paddle Llama port on a tiny random decoder (no GGUF needed): KV-cache decode equals full recompute,
the exported PIR prefill/decode models give the eager logits, and the GGUF q/k row order is undone."""

from __future__ import annotations

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

from qptq.llm.config import DecoderConfig  # noqa: E402
from qptq.llm.gguf_weights import unpermute_rope_rows  # noqa: E402
from qptq.llm.llama import Llama, cache_names, export, perplexity  # noqa: E402

CFG = DecoderConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=16, rope_theta=10000.0, rms_eps=1e-5, context_length=128)


@pytest.fixture(scope="module")
def model() -> Llama:
    paddle.seed(7)
    net = Llama(CFG)
    rng = np.random.default_rng(0)
    for p in net.parameters():  # norms away from 1 so they matter
        p.set_value(rng.normal(0.0, 0.3 if p.ndim == 2 else 1.0, p.shape).astype("float32"))
    net.eval()
    return net


def test_decode_with_cache_equals_full_recompute(model: Llama) -> None:
    ids = np.random.default_rng(1).integers(0, CFG.vocab_size, (2, 11))
    full, _ = model(paddle.to_tensor(ids))
    logits, cache = model(paddle.to_tensor(ids[:, :6]))
    steps = [logits.numpy()]
    for t in range(6, 11):
        logits, cache = model(paddle.to_tensor(ids[:, t: t + 1]), cache)
        steps.append(logits.numpy())
    got = np.concatenate(steps, axis=1)
    assert cache[0].shape == [2, CFG.num_kv_heads, 11, CFG.head_dim]
    np.testing.assert_allclose(got, full.numpy(), rtol=1e-4, atol=1e-4)
    # a causal model: the first 6 positions' logits do not see the later tokens
    np.testing.assert_allclose(full.numpy()[:, :6], steps[0], rtol=1e-4, atol=1e-4)
    assert np.abs(full.numpy()).max() > 1.0  # real logits, not a degenerate net


def test_export_reloads_with_same_logits(model: Llama, tmp_path) -> None:
    qcore = pytest.importorskip("qcore.model_io")
    prefill_dir, decode_dir = export(model, tmp_path)
    ids = np.random.default_rng(2).integers(0, CFG.vocab_size, (3, 7))
    want, want_cache = model(paddle.to_tensor(ids[:, :5]))
    want_next, _ = model(paddle.to_tensor(ids[:, 5:6]), want_cache)

    prefill = qcore.load_model(prefill_dir)
    assert prefill.feed_names == ["input_ids"]
    out = prefill.run({"input_ids": ids[:, :5]})
    assert len(out) == 1 + 2 * CFG.num_layers
    np.testing.assert_allclose(out[0], want.numpy(), rtol=1e-4, atol=1e-4)

    decode = qcore.load_model(decode_dir)
    assert decode.feed_names == ["input_ids", *cache_names(CFG)]
    step = decode.run({"input_ids": ids[:, 5:6], **dict(zip(cache_names(CFG), out[1:]))})
    np.testing.assert_allclose(step[0], want_next.numpy(), rtol=1e-4, atol=1e-4)
    assert step[1].shape == (3, CFG.num_kv_heads, 6, CFG.head_dim)


def test_unpermute_rope_rows_inverts_llama_cpp_order() -> None:
    heads, head_dim, cols = 3, 8, 5
    hf = np.arange(heads * head_dim * cols, dtype=np.float32).reshape(heads * head_dim, cols)
    # llama.cpp's order, per head: rows 0, 4, 1, 5, 2, 6, 3, 7 (the two rotary halves interleaved)
    order = np.concatenate([h * head_dim + np.stack([np.arange(4), np.arange(4) + 4], 1).ravel()
                            for h in range(heads)])
    np.testing.assert_array_equal(unpermute_rope_rows(hf[order], heads), hf)


def test_perplexity_of_uniform_logits_is_vocab_size() -> None:
    net = Llama(CFG)
    for p in net.parameters():
        p.set_value(np.zeros(p.shape, "float32"))
    ids = np.random.default_rng(3).integers(0, CFG.vocab_size, 40)
    assert perplexity(net, ids, window=16) == pytest.approx(CFG.vocab_size, rel=1e-5)
    with pytest.raises(ValueError, match="10 tokens, 0 windows of 16"):
        perplexity(net, ids[:10], window=16)
