"""Real decoder weights from GGUF files, dequantized to float32 numpy arrays (no torch, no Paddle).

The reference model of the LLM benchmarks is a GGUF file's weights dequantized to float32. Those weights
were already quantized (SmolLM2's file: Q4_1 blocks, about 4.5 bits a weight, and a Q8_0 embedding; Gemma 3's:
Q4_K_M, i.e. Q4_K / Q5_0 / Q6_K / Q8_0 blocks and a Q8_0 embedding), so a method's loss measured against this
reference is smaller than against the original float checkpoint; comparisons between methods (and with NNCF /
ONNX Runtime) that start from the same reference stay fair.

    pip install gguf tokenizers      # the [llm] extra of paddle-quant-ptq
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from qcore.groupwise import GroupCodes

from .config import DecoderConfig, Gemma3Config

# GGUF token types (llama.cpp's llama_token_type): control tokens are the special ones.
_CONTROL, _USER_DEFINED = 3, 4
# SmolLM2's "smollm" pre-tokenizer (llama.cpp): every digit alone, then GPT-2's split.
_DIGIT_FIRST_PRE = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone"}


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


def read_metadata(path: str | Path) -> dict[str, Any]:
    """A GGUF file's key-value metadata (architecture, hyper-parameters, tokenizer), without reading tensors."""
    from gguf import GGUFReader

    return reader_metadata(GGUFReader(str(path)))


def reader_metadata(reader: Any) -> dict[str, Any]:
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

    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling != "none":
        raise NotImplementedError(f"{arch}.rope.scaling.type={scaling!r}: only unscaled rotary positions are ported")
    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    vocab = meta.get(f"{arch}.vocab_size") or len(meta["tokenizer.ggml.tokens"])
    extra: dict[str, Any] = {}
    if arch == "gemma3":
        # The file stores the window; the 5 local : 1 global layer pattern and the local layers' rotary base
        # (10,000) are not in Gemma 3 GGUFs: llama.cpp and Hugging Face fix them for the architecture.
        extra = {"sliding_window": int(get("attention.sliding_window")), "global_every": 6,
                 "local_rope_theta": 10000.0}
    return (Gemma3Config if arch == "gemma3" else DecoderConfig)(
        **extra,
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

    path = Path(path)
    reader = GGUFReader(str(path))
    meta = reader_metadata(reader)
    tensors, storage = {}, {}
    for t in reader.tensors:
        tensors[t.name] = dequantized(t)
        storage[t.name] = t.tensor_type.name
    config = config_from_metadata(meta, has_output="output.weight" in tensors)
    return GGUFModel(path, meta["general.architecture"], config, tensors, meta, storage)


def dequantized(tensor: Any) -> np.ndarray:
    """One tensor of a ``gguf.GGUFReader`` in float32, row-major (GGUF lists dimensions fastest first)."""
    from gguf.quants import dequantize

    shape = tuple(int(d) for d in reversed(tensor.shape))
    return np.ascontiguousarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32).reshape(shape)


def outer_tensors(cfg: DecoderConfig) -> dict[str, GGUFTensor]:
    """The GGUF tensors outside the decoder layers: the table, the final norm, an untied LM head."""
    table = {"embed_tokens.weight": GGUFTensor("token_embd.weight"), "norm.weight": GGUFTensor("output_norm.weight")}
    if not cfg.tie_embeddings:
        table["lm_head.weight"] = GGUFTensor("output.weight", transposed=True)
    return table


def rope_row_order(rows: int, heads: int) -> np.ndarray:
    """Index ``p`` with ``hf = gguf[p]``: llama.cpp's converter stores, per head, the rows of the two rotary halves
    interleaved (``[x0, x_half, x1, x_half+1, ...]``) so its rope can rotate adjacent pairs; Hugging Face's Llama
    (and this port) rotates the first half against the second. ``gguf = hf[argsort(p)]``."""
    half = rows // heads // 2
    return np.arange(rows).reshape(heads, half, 2).transpose(0, 2, 1).reshape(rows)


def unpermute_rope_rows(weight: np.ndarray, heads: int) -> np.ndarray:
    """``[heads * head_dim, in]`` q/k projection rows from llama.cpp's rotary order to Hugging Face's."""
    return weight[rope_row_order(weight.shape[0], heads)]


#: The projections of a decoder layer: GGUF tensor stem -> Paddle sublayer (both architectures).
LINEARS = {"attn_q": "attn.q_proj", "attn_k": "attn.k_proj", "attn_v": "attn.v_proj", "attn_output": "attn.o_proj",
           "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


@dataclass(frozen=True)
class GGUFTensor:
    """Where a Paddle parameter is in a GGUF file: the tensor's name, whether the file stores it transposed
    (``[out, in]`` against ``Linear``'s ``[in, out]``) and, for q/k projections in llama.cpp's rotary row order,
    the number of heads."""

    name: str
    transposed: bool = False
    rope_heads: int | None = None

    def to_paddle(self, value: np.ndarray) -> np.ndarray:
        """The file's array as the Paddle parameter."""
        if self.rope_heads is not None:
            value = unpermute_rope_rows(value, self.rope_heads)
        return value.T if self.transposed else value

    def from_paddle(self, value: np.ndarray) -> np.ndarray:
        """The Paddle parameter as the file's array."""
        value = value.T if self.transposed else value
        if self.rope_heads is not None:
            value = value[np.argsort(rope_row_order(value.shape[0], self.rope_heads))]
        return np.ascontiguousarray(value)

    def codes_from_paddle(self, codes: GroupCodes) -> GroupCodes:
        """Codes of a Paddle ``[in, out]`` weight (or of a table's transpose) with the file's row order; the
        file's rows are the codes' output columns."""
        if self.rope_heads is None:
            return codes
        return codes.select_outputs(np.argsort(rope_row_order(codes.codes.shape[1], self.rope_heads)))


def tokenizer_from_metadata(meta: dict[str, Any]) -> Any:
    """A ``tokenizers.Tokenizer`` for the file's vocabulary: byte-level BPE (``gpt2``, with the split its
    ``tokenizer.ggml.pre`` names) or SentencePiece BPE (``llama``, see :func:`_sentencepiece_bpe`); control
    tokens as special tokens, user-defined ones matched whole; BOS prepended when ``add_bos_token`` says so."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    kind = meta.get("tokenizer.ggml.model")
    tokens = list(meta["tokenizer.ggml.tokens"])
    if kind == "gpt2":
        merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
        tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if meta.get("tokenizer.ggml.pre") in _DIGIT_FIRST_PRE:
            tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        else:
            tok.pre_tokenizer = byte_level
        tok.decoder = decoders.ByteLevel()
    elif kind == "llama":
        tok, tokens = _sentencepiece_bpe(meta, tokens)
    else:
        raise NotImplementedError(f"tokenizer.ggml.model={kind!r}: only 'gpt2' and 'llama' (BPE) vocabularies are read")
    types = meta.get("tokenizer.ggml.token_type", [])
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i, t in enumerate(types) if t == _CONTROL])
    tok.add_tokens([AddedToken(tokens[i], normalized=False) for i, t in enumerate(types)
                    if t == _USER_DEFINED and tok.token_to_id(tokens[i]) == i])
    if meta.get("tokenizer.ggml.add_bos_token"):
        bos = tokens[int(meta["tokenizer.ggml.bos_token_id"])]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, tok.token_to_id(bos))])
    return tok


def _sentencepiece_bpe(meta: dict[str, Any], tokens: list[str]) -> tuple[Any, list[str]]:
    """SentencePiece BPE (Gemma's vocabulary) from the GGUF's token list: spaces are spelled ``▁`` (the file
    spells the tokens made only of spaces with real spaces: they are respelled), byte-fallback tokens
    ``<0xNN>`` cover the rest. The file lists no merges: every token that splits into two vocabulary tokens
    gives a merge, ranked by the token's id (the order in which SentencePiece learned the pieces; Gemma's scores
    do not follow it). Returns the tokenizer and the respelled token list."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    space = "\u2581"
    tokens = [space * len(t) if t and not t.strip(" ") else t for t in tokens]
    vocab = {t: i for i, t in enumerate(tokens)}
    types = meta.get("tokenizer.ggml.token_type", [])
    mergeable = [i for i, t in enumerate(types) if t in (1, _USER_DEFINED)] if types else range(len(tokens))
    ranked = []
    for i in mergeable:
        token = tokens[i]
        for cut in range(1, len(token)):
            left, right = vocab.get(token[:cut]), vocab.get(token[cut:])
            if left is not None and right is not None:
                ranked.append((i, left, right))
    ranked.sort()
    merges = [(tokens[left], tokens[right]) for _, left, right in ranked]
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    tok = Tokenizer(models.BPE(vocab, merges, unk_token=None if unk is None else tokens[int(unk)],
                               fuse_unk=True, byte_fallback=True))
    steps = [normalizers.Replace(" ", space)]
    if meta.get("tokenizer.ggml.add_space_prefix"):
        steps.insert(0, normalizers.Prepend(space))
    tok.normalizer = normalizers.Sequence(steps)
    tok.decoder = decoders.Sequence([decoders.Replace(space, " "), decoders.ByteFallback(), decoders.Fuse()])
    return tok, tokens
