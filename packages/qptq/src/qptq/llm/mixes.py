"""llama.cpp-like per-tensor mixes of GGUF block types, as :class:`~qptq.weight_only.WeightOnlyConfig` rules.

``Q4_K_M`` (:func:`q4_k_m`): ``Q4_K`` everywhere; ``Q6_K`` for the value projection and the FFN down projection of
the layers llama.cpp gives more bits (the first and last eighth of the decoder, and every third layer between:
about half of them), for an untied LM head and for the token table (which a tied head reads); rows that 256 does
not divide get llama.cpp's fallback (``Q4_K`` -> ``Q5_0``, ``Q6_K`` -> ``Q8_0``). llama.cpp's other rules for
``Q4_K_M`` concern architectures and sizes outside the decoders read here (Falcon, mixtures of experts, 70B)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from qcore.errors import ConfigError

from ..weight_only.config import WeightOnlyConfig


def more_bits(layer: int, layers: int) -> bool:
    """Whether llama.cpp's ``Q4_K_M`` gives decoder layer ``layer`` (of ``layers``) the larger type."""
    eighth = layers // 8
    return layer < eighth or layer >= 7 * layers // 8 or (layer - eighth) % 3 == 2


def q4_k_m_rules(layers: int) -> dict[str, int]:
    """``bits_by_name`` rules of :func:`q4_k_m` for a decoder of ``layers`` layers (the port's linear names)."""
    chosen = "|".join(str(i) for i in range(layers) if more_bits(i, layers))
    return {rf"^layers\.({chosen})\.(attn\.v_proj|mlp\.down_proj)$": 6, r"^lm_head$": 6}


def q4_k_m(layers: int, **fields: Any) -> WeightOnlyConfig:
    """A ``Q4_K_M``-like GGUF config for a decoder of ``layers`` layers; ``fields`` set the rest (``algo``,
    ``clip_search``, ...) or replace these."""
    defaults: dict[str, Any] = {"bits": 4, "group_size": 256, "grid": "gguf", "embedding_bits": 6,
                                "group_size_fallback": "adjust", "bits_by_name": q4_k_m_rules(layers)}
    return WeightOnlyConfig(**{**defaults, **fields})


#: Mixes by name (``--bits-for q4_k_m``): the ``bits_by_name`` rules for a decoder of ``layers`` layers.
MIXES: dict[str, Callable[[int], dict[str, int]]] = {"q4_k_m": q4_k_m_rules}


def decoder_layers(source: str | os.PathLike[str]) -> int:
    """The number of decoder layers of a GGUF checkpoint (its ``{architecture}.block_count``)."""
    from .gguf_weights import read_metadata

    meta = read_metadata(source)
    key = f"{meta.get('general.architecture')}.block_count"
    if key not in meta:
        raise ConfigError(f"{source} has no {key}; a mix needs the decoder's layer count")
    return int(meta[key])
