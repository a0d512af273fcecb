"""The Gemma 3 decoder (text only) in plain ``paddle.nn``, with a KV cache and PIR export of its prefill and decode
steps; the shared pieces (attention, gated feed-forward, cache layout, export, generation, perplexity) are
:mod:`.common`'s, re-exported here.

Against Llama: the embedding is multiplied by ``sqrt(hidden_size)`` (the tied LM head uses the table
unscaled, ``paddle.matmul(h, table, transpose_y=True)``); GeGLU feed-forward with tanh-GELU; queries and keys
RMS-normalised per head before the rotation; four norms a layer (before and after attention, before and after
the feed-forward, each output normalised before its residual add); local layers attend to the last
``sliding_window`` positions only, with rotary base ``local_rope_theta`` (10,000), and every ``global_every``-th
layer (the 6th, 12th, 18th of the 270M) attends to all of them with base ``rope_theta`` (1,000,000).

Gemma's RMSNorm multiplies by ``1 + weight``; llama.cpp's converter stores ``1 + weight`` in the GGUF
(Hugging Face's GGUF loader subtracts the 1 again), so :class:`.common.RMSNorm` takes the file's
values as they are. q/k rows are in Hugging Face's rotary order already (llama.cpp rotates Gemma's halves
"NEOX"-style: no permutation to undo).

KV cache: the local layers keep every position, like the global ones, and mask those beyond the window: one
cache layout for all layers (:func:`.common.cache_names`), exact logits, more memory than a ring
buffer of ``sliding_window`` positions once a sequence is longer than the window.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import paddle
from paddle import nn

from .common import (
    Attention,
    GatedMLP,
    RMSNorm,
    attention_bias,
    cache_names,
    export,
    gelu_tanh,
    generate,
    inverse_frequencies,
    lm_logits,
    load_state,
    perplexity,
    rotary_tables,
    split_past,
)
from .config import Gemma3Config
from .gguf_weights import LINEARS, GGUFTensor, outer_tensors

__all__ = ["Gemma3", "cache_names", "export", "generate", "gguf_tensors", "load_gguf", "perplexity",
           "state_from_gguf"]


class Block(nn.Layer):
    """``h + post_attn_norm(attn(input_norm(h)))``, then ``h + post_ffn_norm(mlp(pre_ffn_norm(h)))``."""

    def __init__(self, cfg: Gemma3Config) -> None:
        super().__init__()
        size, eps = cfg.hidden_size, cfg.rms_eps
        self.input_norm = RMSNorm(size, eps)
        self.attn = Attention(cfg, scale=cfg.query_scale, qk_norm_eps=eps)
        self.post_attn_norm = RMSNorm(size, eps)
        self.pre_ffn_norm = RMSNorm(size, eps)
        self.mlp = GatedMLP(cfg, gelu_tanh)
        self.post_ffn_norm = RMSNorm(size, eps)

    def forward(self, h, cos, sin, bias, past_k, past_v):  # noqa: ANN001, ANN201 (same types as Attention)
        a, k, v = self.attn(self.input_norm(h), cos, sin, bias, past_k, past_v)
        h = h + self.post_attn_norm(a)
        return h + self.post_ffn_norm(self.mlp(self.pre_ffn_norm(h))), k, v


class Gemma3(nn.Layer):
    """The decoder: ``forward(input_ids [B, T], past)`` -> ``(logits [B, T, V], present)``.

    ``past`` is a list of ``2 * num_layers`` cache tensors (empty for a prefill); ``present`` the same list
    grown by ``T`` positions. Positions continue from the cache length.
    """

    def __init__(self, cfg: Gemma3Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_scale = float(np.float32(math.sqrt(cfg.hidden_size)))
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.LayerList([Block(cfg) for _ in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias_attr=False)
        self.register_buffer("inv_freq_global", inverse_frequencies(cfg.head_dim, cfg.rope_theta), persistable=False)
        self.register_buffer("inv_freq_local", inverse_frequencies(cfg.head_dim, cfg.local_rope_theta),
                             persistable=False)

    def forward(
        self, input_ids: paddle.Tensor, past: list[paddle.Tensor] | None = None
    ) -> tuple[paddle.Tensor, list[paddle.Tensor]]:
        past, start = split_past(past, self.cfg)
        inputs = layer_inputs(self.cfg, start, input_ids.shape[1], self.inv_freq_global, self.inv_freq_local)
        h = self.embed_tokens(input_ids) * self.embed_scale
        present = []
        for i, layer in enumerate(self.layers):
            pk, pv = (past[2 * i], past[2 * i + 1]) if past else (None, None)
            h, k, v = layer(h, *inputs[i], pk, pv)
            present += [k, v]
        return lm_logits(self.norm(h), self.embed_tokens, self.lm_head), present


def layer_inputs(cfg: Gemma3Config, start: int, length: int, inv_freq_global: paddle.Tensor | None = None,
                 inv_freq_local: paddle.Tensor | None = None) -> list[tuple[paddle.Tensor, ...]]:
    """Each layer's ``(cos, sin, mask)`` for positions ``start .. start + length - 1``: global layers see every
    position with base ``rope_theta``, local ones the window with ``local_rope_theta``; the frequencies default
    to ``cfg``'s."""
    pos = paddle.arange(start, start + length, dtype="float32")
    frequencies = {True: inverse_frequencies(cfg.head_dim, cfg.rope_theta) if inv_freq_global is None
                   else inv_freq_global,
                   False: inverse_frequencies(cfg.head_dim, cfg.local_rope_theta) if inv_freq_local is None
                   else inv_freq_local}
    per_kind = {kind: (*rotary_tables(pos, frequencies[kind]),
                       attention_bias(start, length, None if kind else cfg.sliding_window)) for kind in (True, False)}
    return [per_kind[cfg.is_global(i)] for i in range(cfg.num_layers)]


#: Gemma 3's four norms a layer and the q/k norms: Paddle sublayer -> GGUF tensor stem.
NORMS = {"attn_norm": "input_norm", "post_attention_norm": "post_attn_norm", "ffn_norm": "pre_ffn_norm",
         "post_ffw_norm": "post_ffn_norm", "attn_q_norm": "attn.q_norm", "attn_k_norm": "attn.k_norm"}


def gguf_tensors(cfg: Gemma3Config) -> dict[str, GGUFTensor]:
    """Each Paddle parameter's GGUF tensor (``[out, in]`` matrices stored transposed from ``Linear``'s
    ``[in, out]``; norm weights as stored, ``1 + weight`` already)."""
    table = outer_tensors(cfg)
    for i in range(cfg.num_layers):
        for src, dst in LINEARS.items():
            table[f"layers.{i}.{dst}.weight"] = GGUFTensor(f"blk.{i}.{src}.weight", transposed=True)
        for src, dst in NORMS.items():
            table[f"layers.{i}.{dst}.weight"] = GGUFTensor(f"blk.{i}.{src}.weight")
    return table


def state_from_gguf(tensors: dict[str, np.ndarray], cfg: Gemma3Config) -> dict[str, np.ndarray]:
    """Paddle parameter names -> arrays, from a Gemma 3 GGUF's tensors (:func:`gguf_tensors`)."""
    return {name: t.to_paddle(tensors[t.name]) for name, t in gguf_tensors(cfg).items()}


def load_gguf(path: str | Path) -> tuple[Gemma3, Any]:
    """The Gemma 3 model of a GGUF file in float32, and its tokenizer (which prepends ``<bos>``, as the file
    asks: Gemma expects it)."""
    from .gguf_weights import read_gguf

    gg = read_gguf(path)
    if gg.architecture != "gemma3":
        raise ValueError(f"{gg.path} is a {gg.architecture!r} model; gemma3.load_gguf reads 'gemma3' files only")
    model = Gemma3(gg.config)
    load_state(model, state_from_gguf(gg.tensors, gg.config))
    return model, gg.tokenizer()
