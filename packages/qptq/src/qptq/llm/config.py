"""Hyper-parameters of a decoder, shared by the GGUF reader (numpy only) and the Paddle port."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecoderConfig:
    """Shapes and constants of a Llama-style decoder (names as in the GGUF metadata, in words)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    context_length: int = 2048
    tie_embeddings: bool = True
    qkv_bias: bool = False  # the q/k/v projections add a bias (Qwen2)

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}; "
                "grouped-query attention needs whole groups"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} is odd; rotary embeddings rotate pairs of channels")


@dataclass(frozen=True)
class Gemma3Config(DecoderConfig):
    """A Gemma 3 decoder: local (sliding-window) layers with their own rotary base, and a global layer every
    ``global_every`` layers (layer ``i`` is global when ``(i + 1) % global_every == 0``).

    ``rope_theta`` is the global layers' base; ``query_scale`` multiplies ``q . k`` (Gemma's
    ``query_pre_attn_scalar ** -0.5``; the GGUF does not store it: llama.cpp and Hugging Face use ``head_dim``
    for every size but 27B, so the default is ``head_dim ** -0.5``)."""

    sliding_window: int = 512
    global_every: int = 6
    local_rope_theta: float = 10000.0
    query_scale: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sliding_window < 1 or self.global_every < 1:
            raise ValueError(f"sliding_window={self.sliding_window} and global_every={self.global_every} must be >= 1")

    def is_global(self, layer: int) -> bool:
        """Whether ``layer`` attends to every earlier position (else only the last ``sliding_window``)."""
        return (layer + 1) % self.global_every == 0
