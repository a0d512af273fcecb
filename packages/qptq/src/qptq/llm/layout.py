"""What a runtime's graph builder needs to know of a decoder port (:mod:`.llama`, :mod:`.gemma3`), as data: the
norms around each block, the activation, the embedding scale, and each layer's attention window and rotary base.
The native graph writers (:mod:`.ort_graph`) read this, not the port's classes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import Gemma3Config


@dataclass(frozen=True)
class DecoderLayout:
    """A decoder's structure beyond its shapes (``cfg``).

    Per layer: ``attn_norm`` before attention, ``attn_out_norm`` on its output (Gemma's ``post_attn_norm``),
    ``ffn_norm`` before the feed-forward, ``ffn_out_norm`` on its output; ``None`` where the family has no such
    norm. ``windows[i]``: keys layer ``i`` sees including its own (``None``: all); ``thetas[i]``: its rotary base.
    """

    cfg: Any
    activation: str  # "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    embed_scale: float | None
    qk_norm: bool
    attention_scale: float
    attn_norm: str
    attn_out_norm: str | None
    ffn_norm: str
    ffn_out_norm: str | None
    windows: tuple[int | None, ...]
    thetas: tuple[float, ...]

    @classmethod
    def of(cls, model: Any) -> DecoderLayout:
        cfg = model.cfg
        layers = range(cfg.num_layers)
        if isinstance(cfg, Gemma3Config):
            return cls(cfg, "gelu_tanh", float(np.float32(math.sqrt(cfg.hidden_size))), True,
                       cfg.query_scale if cfg.query_scale is not None else cfg.head_dim ** -0.5,
                       "input_norm", "post_attn_norm", "pre_ffn_norm", "post_ffn_norm",
                       tuple(None if cfg.is_global(i) else cfg.sliding_window for i in layers),
                       tuple(cfg.rope_theta if cfg.is_global(i) else cfg.local_rope_theta for i in layers))
        return cls(cfg, "silu", None, False, cfg.head_dim ** -0.5, "input_norm", None, "post_norm", None,
                   (None,) * cfg.num_layers, (cfg.rope_theta,) * cfg.num_layers)


def rotary_frequencies(head_dim: int, theta: float) -> np.ndarray:
    """``theta ** (-2i / head_dim)`` for ``i < head_dim / 2``, float32: the rotary frequencies of every port and
    graph writer."""
    dims = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    return (1.0 / np.power(np.float32(theta), dims)).astype(np.float32)


def rotary_cache(theta: float, head_dim: int, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """``cos, sin`` ``[positions, head_dim / 2]`` float32 of the rotary angles ``p * theta ** (-2i / head_dim)``,
    from :func:`rotary_frequencies`, as :func:`.common.rotary_tables` computes them."""
    angles = np.arange(positions, dtype=np.float32)[:, None] * rotary_frequencies(head_dim, theta)[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def parameters_and_codes(model: Any, result: Any
                         ) -> tuple[dict[str, np.ndarray], dict[str, Any], dict[str, np.ndarray]]:
    """``model``'s parameters (a port's, or a :class:`.streaming.StreamedDecoder`'s), and ``result``'s codes and AWQ
    input scales (a :class:`qptq.weight_only.plan.WeightOnlyResult`), all by parameter name
    (``layers.0.attn.q_proj.weight``)."""
    state = {name: np.asarray(value) for name, value in model.state_dict().items()}
    codes = {f"{layer.name}.weight": result.codes[layer.weight] for layer in result.layers}
    scales = {f"{layer.name}.weight": result.input_scales[layer.weight] for layer in result.layers
              if layer.weight in result.input_scales}
    return state, codes, scales
