"""A weight-only quantized decoder (:mod:`.llama`, :mod:`.gemma3`) as a runtime's LLM folder, with the tokenizer of
the GGUF or checkpoint the model was read from (:class:`TokenizerFiles`): ONNX Runtime GenAI's
(:mod:`qcore.export.ortgenai`) holds the graph :mod:`.ort_graph` writes with ONNX Runtime's contrib ops; OpenVINO
GenAI's (:mod:`qcore.export.openvino_genai`) the stateful model :mod:`.openvino_graph` writes."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qcore.export.openvino_genai import write_openvino_genai_folder
from qcore.export.ortgenai import DecoderShape, write_genai_folder

from ..weight_only.plan import WeightOnlyResult
from .config import Gemma3Config
from .ort_graph import decoder_graph

#: GenAI's model family per decoder config class (its ``type``): both run as its generic decoder-only model.
GENAI_TYPES = {Gemma3Config: "gemma3_text"}


@dataclass(frozen=True)
class TokenizerFiles:
    """What a runtime's folder holds of the tokenizer: ``tokenizer.json`` (``text``), ``tokenizer_config.json``
    (``config``: its kind and special tokens) and the special ids generation needs."""

    text: str
    config: dict[str, Any]
    bos_token_id: int | None
    eos_token_id: int | list[int]
    pad_token_id: int | None = None


def tokenizer_files(tokenizer: Any, metadata: dict[str, Any]) -> TokenizerFiles:
    """The files of a GGUF's tokenizer: ``tokenizer.json`` (the ``tokenizers.Tokenizer`` built from the GGUF) and a
    ``tokenizer_config.json`` naming its kind (byte-level BPE: GPT-2's; SentencePiece BPE: Llama's) and special
    tokens."""
    tokens = metadata["tokenizer.ggml.tokens"]
    config: dict[str, Any] = {
        "tokenizer_class": "GPT2Tokenizer" if metadata.get("tokenizer.ggml.model") == "gpt2" else "LlamaTokenizer",
        "add_bos_token": bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
        "clean_up_tokenization_spaces": False,
    }
    for key in ("bos", "eos", "unknown", "padding"):
        index = metadata.get(f"tokenizer.ggml.{key}_token_id")
        if index is not None:
            config[{"unknown": "unk_token", "padding": "pad_token"}.get(key, f"{key}_token")] = tokens[int(index)]
    bos, pad = metadata.get("tokenizer.ggml.bos_token_id"), metadata.get("tokenizer.ggml.padding_token_id")
    return TokenizerFiles(tokenizer.to_str(), config, None if bos is None else int(bos),
                          int(metadata.get("tokenizer.ggml.eos_token_id", 0)), None if pad is None else int(pad))


def decoder_shape(model: Any, files: TokenizerFiles) -> DecoderShape:
    cfg = model.cfg
    return DecoderShape(
        type=GENAI_TYPES.get(type(cfg), "llama"), vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        context_length=cfg.context_length, bos_token_id=files.bos_token_id, eos_token_id=files.eos_token_id,
        pad_token_id=files.pad_token_id)


def save_ortgenai(model: Any, result: WeightOnlyResult, files: TokenizerFiles, out: str | os.PathLike[str],
                  threads: int | None = None) -> Path:
    """Write the ONNX Runtime GenAI folder ``out`` of ``model`` (quantized in place by
    :func:`qptq.weight_only.quantize_`, ``grid="int"``) with the tokenizer ``files``."""
    return write_genai_folder(out, lambda weights: decoder_graph(model, result, weights=weights),
                              decoder_shape(model, files), files.text, files.config, threads)


def save_openvino_genai(model: Any, result: WeightOnlyResult, files: TokenizerFiles,
                        out: str | os.PathLike[str]) -> Path:
    """Write the OpenVINO GenAI folder ``out`` of ``model`` (quantized in place, ``grid="int"``): its stateful
    model and the tokenizer IRs of ``files``."""
    from .openvino_graph import decoder_model

    return write_openvino_genai_folder(out, decoder_model(model, result), decoder_shape(model, files), files.text,
                                       files.config)
