"""The Llama decoder in plain ``paddle.nn``, with a KV cache and PIR export of its prefill and decode steps.

RMSNorm, rotary embeddings (first half rotated against the second, as Hugging Face's Llama), grouped-query
attention, SwiGLU feed-forward; the LM head is the embedding table (``paddle.matmul(h, table, transpose_y)``)
when the weights tie them. Projections are ``paddle.nn.Linear`` (weights ``[in, out]``, no bias), so the
toolkit's matmul quantization finds them. :func:`load_gguf` fills the model from a GGUF file
(:mod:`.gguf_weights`); :func:`export` writes ``prefill/`` and ``decode/`` PIR inference models.

Cache layout, export, generation and perplexity: :mod:`.common` (re-exported here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn

from .common import (
    Attention,
    GatedMLP,
    RMSNorm,
    attention_bias,
    cache_names,
    export,
    generate,
    inverse_frequencies,
    lm_logits,
    load_state,
    perplexity,
    rotary_tables,
    split_past,
)
from .config import DecoderConfig
from .gguf_weights import LINEARS, GGUFTensor, outer_tensors

__all__ = ["Llama", "cache_names", "export", "generate", "gguf_tensors", "load_gguf", "perplexity", "state_from_gguf"]


class Block(nn.Layer):
    """Pre-norm decoder layer: ``h + attn(norm(h))``, then ``h + mlp(norm(h))``."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.attn = Attention(cfg)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.mlp = GatedMLP(cfg, F.silu)

    def forward(self, h, cos, sin, bias, past_k, past_v):  # noqa: ANN001, ANN201 (same types as Attention)
        a, k, v = self.attn(self.input_norm(h), cos, sin, bias, past_k, past_v)
        h = h + a
        return h + self.mlp(self.post_norm(h)), k, v


class Llama(nn.Layer):
    """The decoder: ``forward(input_ids [B, T], past)`` -> ``(logits [B, T, V], present)``.

    ``past`` is a list of ``2 * num_layers`` cache tensors (empty for a prefill); ``present`` the same list
    grown by ``T`` positions. Positions continue from the cache length.
    """

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.LayerList([Block(cfg) for _ in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias_attr=False)
        self.register_buffer("inv_freq", inverse_frequencies(cfg.head_dim, cfg.rope_theta), persistable=False)

    def forward(
        self, input_ids: paddle.Tensor, past: list[paddle.Tensor] | None = None
    ) -> tuple[paddle.Tensor, list[paddle.Tensor]]:
        past, start = split_past(past, self.cfg)
        inputs = layer_inputs(self.cfg, start, input_ids.shape[1], self.inv_freq)
        h = self.embed_tokens(input_ids)
        present = []
        for i, layer in enumerate(self.layers):
            pk, pv = (past[2 * i], past[2 * i + 1]) if past else (None, None)
            h, k, v = layer(h, *inputs[i], pk, pv)
            present += [k, v]
        return lm_logits(self.norm(h), self.embed_tokens, self.lm_head), present


def layer_inputs(cfg: DecoderConfig, start: int, length: int, inv_freq: paddle.Tensor | None = None
                 ) -> list[tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]]:
    """Each layer's ``(cos, sin, mask)`` for positions ``start .. start + length - 1``; ``inv_freq``: the model's
    rotary frequencies (default: from ``cfg``)."""
    inv_freq = inverse_frequencies(cfg.head_dim, cfg.rope_theta) if inv_freq is None else inv_freq
    cos, sin = rotary_tables(paddle.arange(start, start + length, dtype="float32"), inv_freq)
    return [(cos, sin, attention_bias(start, length))] * cfg.num_layers


def gguf_tensors(cfg: DecoderConfig) -> dict[str, GGUFTensor]:
    """Each Paddle parameter's GGUF tensor (``[out, in]`` matrices stored transposed from ``Linear``'s
    ``[in, out]``; q/k rows in llama.cpp's rotary order)."""
    table = outer_tensors(cfg)
    for i in range(cfg.num_layers):
        blk = f"blk.{i}"
        table[f"layers.{i}.input_norm.weight"] = GGUFTensor(f"{blk}.attn_norm.weight")
        table[f"layers.{i}.post_norm.weight"] = GGUFTensor(f"{blk}.ffn_norm.weight")
        for src, dst in LINEARS.items():
            heads = {"attn_q": cfg.num_heads, "attn_k": cfg.num_kv_heads}.get(src)
            table[f"layers.{i}.{dst}.weight"] = GGUFTensor(f"{blk}.{src}.weight", transposed=True, rope_heads=heads)
    return table


def state_from_gguf(tensors: dict[str, np.ndarray], cfg: DecoderConfig) -> dict[str, np.ndarray]:
    """Paddle parameter names -> arrays, from a Llama GGUF's tensors (:func:`gguf_tensors`)."""
    return {name: t.to_paddle(tensors[t.name]) for name, t in gguf_tensors(cfg).items()}


def load_gguf(path: str | Path) -> tuple[Llama, Any]:
    """The Llama of a GGUF file in float32, and its tokenizer."""
    from .gguf_weights import read_gguf

    gg = read_gguf(path)
    if gg.architecture != "llama":
        raise ValueError(f"{gg.path} is a {gg.architecture!r} model; llama.load_gguf reads 'llama' files only")
    model = Llama(gg.config)
    load_state(model, state_from_gguf(gg.tensors, gg.config))
    return model, gg.tokenizer()
