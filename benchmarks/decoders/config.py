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

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}; "
                "grouped-query attention needs whole groups"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} is odd; rotary embeddings rotate pairs of channels")
