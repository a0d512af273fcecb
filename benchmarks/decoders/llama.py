"""The Llama decoder in plain ``paddle.nn``, with a KV cache and PIR export of its prefill and decode steps.

RMSNorm, rotary embeddings (first half rotated against the second, as Hugging Face's Llama), grouped-query
attention, SwiGLU feed-forward; the LM head is the embedding table (``paddle.matmul(h, table, transpose_y)``)
when the weights tie them. Projections are ``paddle.nn.Linear`` (weights ``[in, out]``, no bias), so the
toolkit's matmul quantization finds them. :func:`load_gguf` fills the model from a GGUF file
(:mod:`llm.gguf_weights`); :func:`export` writes ``prefill/`` and ``decode/`` PIR inference models.

Cache layout: one ``[batch, kv_heads, length, head_dim]`` key and value tensor per layer, in layer order
(``past_key_0, past_value_0, past_key_1, ...``); every forward returns the grown cache (``present_*``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn

from .config import DecoderConfig
from .text import token_windows

_MASKED = -1e30  # added to the scores of future positions; exp() of it is exactly 0 in float32


class RMSNorm(nn.Layer):
    """``x / sqrt(mean(x**2) + eps) * weight`` over the last axis."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = self.create_parameter([size], default_initializer=nn.initializer.Constant(1.0))

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return x * paddle.rsqrt(paddle.mean(x * x, axis=-1, keepdim=True) + self.eps) * self.weight


def rotate(x: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor) -> paddle.Tensor:
    """Rotary embedding of ``x [..., T, D]``: channel ``i`` is rotated against channel ``i + D/2``."""
    first, second = paddle.chunk(x, 2, axis=-1)
    return x * cos + paddle.concat([-second, first], axis=-1) * sin


class Attention(nn.Layer):
    """Grouped-query self-attention with rotary positions and a KV cache."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias_attr=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias_attr=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias_attr=False)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias_attr=False)

    def forward(
        self,
        h: paddle.Tensor,
        cos: paddle.Tensor,
        sin: paddle.Tensor,
        bias: paddle.Tensor,
        past_k: paddle.Tensor | None,
        past_v: paddle.Tensor | None,
    ) -> tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]:
        batch, length = h.shape[0], h.shape[1]
        group = self.heads // self.kv_heads

        def heads(x: paddle.Tensor, n: int) -> paddle.Tensor:
            return x.reshape([batch, length, n, self.head_dim]).transpose([0, 2, 1, 3])

        q = rotate(heads(self.q_proj(h), self.heads), cos, sin)
        k = rotate(heads(self.k_proj(h), self.kv_heads), cos, sin)
        v = heads(self.v_proj(h), self.kv_heads)
        if past_k is not None:
            k, v = paddle.concat([past_k, k], axis=2), paddle.concat([past_v, v], axis=2)
        # query head j uses kv head j // group: [B, KV, group, T, D] against [B, KV, 1, S, D], no copies of k/v
        q = q.reshape([batch, self.kv_heads, group, length, self.head_dim])
        scores = paddle.matmul(q, k.unsqueeze(2), transpose_y=True) * (1.0 / math.sqrt(self.head_dim)) + bias
        out = paddle.matmul(F.softmax(scores, axis=-1), v.unsqueeze(2))
        out = out.reshape([batch, self.heads, length, self.head_dim]).transpose([0, 2, 1, 3])
        return self.o_proj(out.reshape([batch, length, self.heads * self.head_dim])), k, v


class MLP(nn.Layer):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias_attr=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias_attr=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias_attr=False)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Layer):
    """Pre-norm decoder layer: ``h + attn(norm(h))``, then ``h + mlp(norm(h))``."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.attn = Attention(cfg)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.mlp = MLP(cfg)

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
        dims = np.arange(0, cfg.head_dim, 2, dtype=np.float32) / np.float32(cfg.head_dim)
        inv_freq = (1.0 / np.power(np.float32(cfg.rope_theta), dims)).astype(np.float32)
        self.register_buffer("inv_freq", paddle.to_tensor(inv_freq), persistable=False)

    def forward(
        self, input_ids: paddle.Tensor, past: list[paddle.Tensor] | None = None
    ) -> tuple[paddle.Tensor, list[paddle.Tensor]]:
        past = list(past or [])
        if past and len(past) != 2 * self.cfg.num_layers:
            raise ValueError(f"past has {len(past)} tensors; a {self.cfg.num_layers}-layer cache has 2 per layer")
        length = input_ids.shape[1]
        start = past[0].shape[2] if past else 0
        pos = paddle.arange(start, start + length, dtype="float32")
        freqs = pos.unsqueeze(1) * self.inv_freq.unsqueeze(0)  # [T, D/2]
        angles = paddle.concat([freqs, freqs], axis=-1)
        cos, sin = paddle.cos(angles), paddle.sin(angles)
        keys = paddle.arange(0, start + length, dtype="float32").unsqueeze(0)
        bias = paddle.cast(keys > pos.unsqueeze(1), "float32") * _MASKED  # [T, S]: future keys masked

        h = self.embed_tokens(input_ids)
        present = []
        for i, layer in enumerate(self.layers):
            pk, pv = (past[2 * i], past[2 * i + 1]) if past else (None, None)
            h, k, v = layer(h, cos, sin, bias, pk, pv)
            present += [k, v]
        h = self.norm(h)
        if self.lm_head is None:
            logits = paddle.matmul(h, self.embed_tokens.weight, transpose_y=True)
        else:
            logits = self.lm_head(h)
        return logits, present


class _Prefill(nn.Layer):
    def __init__(self, model: Llama) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: paddle.Tensor) -> list[paddle.Tensor]:
        logits, present = self.model(input_ids)
        return [logits, *present]


class _Decode(_Prefill):
    def forward(self, input_ids: paddle.Tensor, past: list[paddle.Tensor]) -> list[paddle.Tensor]:
        logits, present = self.model(input_ids, past)
        return [logits, *present]


def cache_names(cfg: DecoderConfig, prefix: str = "past") -> list[str]:
    """``[prefix_key_0, prefix_value_0, ...]``: the order of cache tensors in feeds and fetches."""
    return [f"{prefix}_{kind}_{i}" for i in range(cfg.num_layers) for kind in ("key", "value")]


def export(model: Llama, directory: str | Path) -> tuple[Path, Path]:
    """Save ``directory/prefill`` (feed ``input_ids``) and ``directory/decode`` (feeds ``input_ids`` and the
    cache) as PIR inference models (``inference.json`` + ``.pdiparams``); batch and lengths are free. Both
    fetch ``logits`` then the present cache in :func:`cache_names` order. Returns the two directories."""
    cfg, directory = model.cfg, Path(directory)
    ids = paddle.static.InputSpec([None, None], "int64", "input_ids")
    cache = [paddle.static.InputSpec([None, cfg.num_kv_heads, None, cfg.head_dim], "float32", n)
             for n in cache_names(cfg)]
    model.eval()
    paths = directory / "prefill", directory / "decode"
    paddle.jit.save(_Prefill(model), str(paths[0] / "inference"), input_spec=[ids])
    paddle.jit.save(_Decode(model), str(paths[1] / "inference"), input_spec=[ids, cache])
    return paths


def state_from_gguf(tensors: dict[str, np.ndarray], cfg: DecoderConfig) -> dict[str, np.ndarray]:
    """Paddle parameter names -> arrays, from a Llama GGUF's tensors (``[out, in]`` matrices are transposed to
    ``Linear``'s ``[in, out]``; q/k rows are put back in Hugging Face's rotary order)."""
    from .gguf_weights import unpermute_rope_rows

    state = {"embed_tokens.weight": tensors["token_embd.weight"], "norm.weight": tensors["output_norm.weight"]}
    if not cfg.tie_embeddings:
        state["lm_head.weight"] = tensors["output.weight"].T
    names = {"attn_q": "attn.q_proj", "attn_k": "attn.k_proj", "attn_v": "attn.v_proj",
             "attn_output": "attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj"}
    for i in range(cfg.num_layers):
        blk = f"blk.{i}"
        state[f"layers.{i}.input_norm.weight"] = tensors[f"{blk}.attn_norm.weight"]
        state[f"layers.{i}.post_norm.weight"] = tensors[f"{blk}.ffn_norm.weight"]
        for src, dst in names.items():
            w = tensors[f"{blk}.{src}.weight"]
            if src == "attn_q":
                w = unpermute_rope_rows(w, cfg.num_heads)
            elif src == "attn_k":
                w = unpermute_rope_rows(w, cfg.num_kv_heads)
            state[f"layers.{i}.{dst}.weight"] = w.T
    return state


def load_gguf(path: str | Path | None = None) -> tuple[Llama, Any]:
    """The Llama of a GGUF file (default: SmolLM2-135M-Instruct) in float32, and its tokenizer."""
    from .gguf_weights import read_gguf, smollm2_gguf

    gg = read_gguf(path or smollm2_gguf())
    if gg.architecture != "llama":
        raise ValueError(f"{gg.path} is a {gg.architecture!r} model; llama.load_gguf reads 'llama' files only")
    model = Llama(gg.config)
    model.set_state_dict({k: paddle.to_tensor(np.ascontiguousarray(v)) for k, v in
                          state_from_gguf(gg.tensors, gg.config).items()})
    model.eval()
    return model, gg.tokenizer()


@paddle.no_grad()
def generate(model: Llama, ids: list[int], new_tokens: int) -> list[int]:
    """Greedy continuation of one prompt through the KV cache: prefill once, then one token a step."""
    logits, cache = model(paddle.to_tensor([ids], dtype="int64"))
    out = []
    for _ in range(new_tokens):
        nxt = int(paddle.argmax(logits[0, -1]).item())
        out.append(nxt)
        logits, cache = model(paddle.to_tensor([[nxt]], dtype="int64"), cache)
    return out


@paddle.no_grad()
def perplexity(model: Llama, ids: list[int] | np.ndarray, window: int = 512, batch: int = 4) -> float:
    """Perplexity over ``ids`` cut into non-overlapping windows of ``window`` tokens (the remainder dropped);
    each window is scored from its own start (no context carried over), ``batch`` windows a forward."""
    windows = token_windows(ids, window)
    nll, n = 0.0, 0
    for lo in range(0, len(windows), batch):
        chunk = paddle.to_tensor(windows[lo: lo + batch])
        logits, _ = model(chunk)
        loss = F.cross_entropy(logits[:, :-1], chunk[:, 1:].unsqueeze(-1), reduction="sum")
        nll += float(loss)
        n += chunk.shape[0] * (window - 1)
    return math.exp(nll / n)
