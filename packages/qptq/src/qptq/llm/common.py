"""Pieces the decoder ports share (:mod:`.llama`, :mod:`.gemma3`): RMSNorm, rotary
embeddings, grouped-query attention with a KV cache, the gated feed-forward, attention masks, PIR export of the
prefill and decode steps, greedy generation and perplexity.

A port is a ``paddle.nn.Layer`` with a ``cfg`` (:class:`.config.DecoderConfig`) whose
``forward(input_ids [B, T], past)`` returns ``(logits [B, T, V], present)``. Cache layout: one
``[batch, kv_heads, length, head_dim]`` key and value tensor per layer, in layer order
(``past_key_0, past_value_0, past_key_1, ...``); ``present`` is ``past`` grown by ``T`` positions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import paddle
import paddle.nn.functional as F
from paddle import nn

from .config import DecoderConfig
from .layout import rotary_frequencies

MASKED = -1e30  # added to the scores of hidden positions; exp() of it is exactly 0 in float32


class RMSNorm(nn.Layer):
    """``x / sqrt(mean(x**2) + eps) * weight`` over the last axis."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = self.create_parameter([size], default_initializer=nn.initializer.Constant(1.0))

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return x * paddle.rsqrt(paddle.mean(x * x, axis=-1, keepdim=True) + self.eps) * self.weight


def inverse_frequencies(head_dim: int, theta: float) -> paddle.Tensor:
    """``theta ** (-2i / head_dim)`` for ``i < head_dim / 2``, float32 (the rotary frequencies)."""
    return paddle.to_tensor(rotary_frequencies(head_dim, theta))


def rotary_tables(pos: paddle.Tensor, inv_freq: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
    """``cos, sin [T, D]`` of positions ``pos [T]`` (float32), each frequency twice (halves rotated together)."""
    freqs = pos.unsqueeze(1) * inv_freq.unsqueeze(0)  # [T, D/2]
    angles = paddle.concat([freqs, freqs], axis=-1)
    return paddle.cos(angles), paddle.sin(angles)


def rotate(x: paddle.Tensor, cos: paddle.Tensor, sin: paddle.Tensor) -> paddle.Tensor:
    """Rotary embedding of ``x [..., T, D]``: channel ``i`` is rotated against channel ``i + D/2``."""
    first, second = paddle.chunk(x, 2, axis=-1)
    return x * cos + paddle.concat([-second, first], axis=-1) * sin


def attention_bias(start: int, length: int, window: int | None = None) -> paddle.Tensor:
    """``[T, S]`` additive mask for queries at positions ``start .. start+T-1`` over keys ``0 .. S-1``
    (``S = start + T``): future keys are masked, and with ``window`` also keys ``window`` or more positions back
    (a query sees itself and the ``window - 1`` positions before it)."""
    pos = paddle.arange(start, start + length, dtype="float32").unsqueeze(1)
    keys = paddle.arange(0, start + length, dtype="float32").unsqueeze(0)
    hidden = keys > pos
    if window is not None:
        hidden = paddle.logical_or(hidden, keys <= pos - window)
    return paddle.cast(hidden, "float32") * MASKED


class Attention(nn.Layer):
    """Grouped-query self-attention with rotary positions and a KV cache; q/k/v projections with biases when
    ``cfg.qkv_bias`` (Qwen2); with ``qk_norm_eps`` the queries and keys are RMS-normalised per head before the
    rotation (``q_norm``, ``k_norm``, Gemma 3)."""

    def __init__(self, cfg: DecoderConfig, scale: float | None = None, qk_norm_eps: float | None = None) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.scale = 1.0 / math.sqrt(cfg.head_dim) if scale is None else scale
        bias = None if cfg.qkv_bias else False
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias_attr=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias_attr=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias_attr=bias)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias_attr=False)
        if qk_norm_eps is not None:
            self.q_norm = RMSNorm(cfg.head_dim, qk_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, qk_norm_eps)
        else:
            self.q_norm = self.k_norm = None

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

        q, k = heads(self.q_proj(h), self.heads), heads(self.k_proj(h), self.kv_heads)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        v = heads(self.v_proj(h), self.kv_heads)
        if past_k is not None:
            k, v = paddle.concat([past_k, k], axis=2), paddle.concat([past_v, v], axis=2)
        # query head j uses kv head j // group: [B, KV, group, T, D] against [B, KV, 1, S, D], no copies of k/v
        q = q.reshape([batch, self.kv_heads, group, length, self.head_dim])
        scores = paddle.matmul(q, k.unsqueeze(2), transpose_y=True) * self.scale + bias
        out = paddle.matmul(F.softmax(scores, axis=-1), v.unsqueeze(2))
        out = out.reshape([batch, self.heads, length, self.head_dim]).transpose([0, 2, 1, 3])
        return self.o_proj(out.reshape([batch, length, self.heads * self.head_dim])), k, v


def gelu_tanh(x: paddle.Tensor) -> paddle.Tensor:
    """GELU, tanh approximation: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``. Written out because
    paddle2onnx 2.1 exports ``F.gelu(x, approximate=True)`` as the erf GELU (measured: 4.7e-4 apart on [-4, 4]),
    which would make the ONNX models of the benchmarks differ from the port."""
    return 0.5 * x * (1.0 + paddle.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


class GatedMLP(nn.Layer):
    """``down(act(gate(x)) * up(x))``: SwiGLU with ``F.silu`` (Llama), GeGLU with :func:`gelu_tanh` (Gemma)."""

    def __init__(self, cfg: DecoderConfig, act: Callable[[paddle.Tensor], paddle.Tensor]) -> None:
        super().__init__()
        self.act = act
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias_attr=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias_attr=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias_attr=False)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


def lm_logits(h: paddle.Tensor, embedding: nn.Embedding, lm_head: nn.Linear | None) -> paddle.Tensor:
    """Logits of the final hidden states: the embedding table as the LM head when tied
    (``paddle.matmul(h, table, transpose_y=True)``, the form the toolkit's tied-head quantization finds),
    else ``lm_head``."""
    if lm_head is None:
        return paddle.matmul(h, embedding.weight, transpose_y=True)
    return lm_head(h)


def split_past(past: list[paddle.Tensor] | None, cfg: DecoderConfig) -> tuple[list[paddle.Tensor], int]:
    """The cache list (checked: two tensors a layer, or empty) and the number of positions it holds."""
    past = list(past or [])
    if past and len(past) != 2 * cfg.num_layers:
        raise ValueError(f"past has {len(past)} tensors; a {cfg.num_layers}-layer cache has 2 per layer")
    return past, past[0].shape[2] if past else 0


def load_state(model: nn.Layer, state: dict[str, np.ndarray]) -> None:
    """Set every parameter of ``model`` from ``state`` (names as ``model.state_dict()``), then ``eval()``."""
    missing = set(model.state_dict()) - set(state)
    if missing:
        raise KeyError(f"the checkpoint gives no values for {sorted(missing)[:4]}; is it the right architecture?")
    model.set_state_dict({k: paddle.to_tensor(np.ascontiguousarray(v)) for k, v in state.items()})
    model.eval()


class _Prefill(nn.Layer):
    def __init__(self, model: nn.Layer) -> None:
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


def export(model: nn.Layer, directory: str | Path) -> tuple[Path, Path]:
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


@paddle.no_grad()
def generate(model: nn.Layer, ids: list[int], new_tokens: int) -> list[int]:
    """Greedy continuation of one prompt through the KV cache: prefill once, then one token a step."""
    logits, cache = model(paddle.to_tensor([ids], dtype="int64"))
    out = []
    for _ in range(new_tokens):
        nxt = int(paddle.argmax(logits[0, -1]).item())
        out.append(nxt)
        logits, cache = model(paddle.to_tensor([[nxt]], dtype="int64"), cache)
    return out


def token_windows(ids: list[int] | np.ndarray, length: int, count: int | None = None, bos: int | None = None
                  ) -> np.ndarray:
    """``[count, length]`` int64: consecutive non-overlapping windows from the start of ``ids`` (all that fit
    when ``count`` is None); with ``bos`` every window is that token then ``length - 1`` tokens of text (models
    such as Gemma read a window without it badly; a leading ``bos`` in ``ids`` is dropped first). Raises
    ``ValueError`` naming the shortfall when the text is too short."""
    ids = np.asarray(ids, dtype=np.int64)
    if bos is not None:
        body = token_windows(ids[1:] if len(ids) and ids[0] == bos else ids, length - 1, count)
        return np.concatenate([np.full((len(body), 1), bos, np.int64), body], axis=1)
    fit = len(ids) // length
    want = fit if count is None else count
    if fit == 0 or want > fit:
        raise ValueError(
            f"text has {len(ids)} tokens, {fit} windows of {length}; {max(want, 1)} were asked for: "
            "give more text or fewer/shorter windows"
        )
    return ids[: want * length].reshape(want, length)


@paddle.no_grad()
def perplexity(model: nn.Layer, ids: list[int] | np.ndarray, window: int = 512, batch: int = 4) -> float:
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
