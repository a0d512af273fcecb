"""A weight-only quantized decoder (:mod:`.llama`, :mod:`.gemma3`) as a runtime's LLM folder, with the tokenizer of
the GGUF the model was read from: ONNX Runtime GenAI's (:mod:`qcore.export.ortgenai`) holds the graph
:mod:`.ort_graph` writes with ONNX Runtime's contrib ops; OpenVINO GenAI's (:mod:`qcore.export.openvino_genai`) the
stateful model :mod:`.openvino_graph` writes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from qcore.export.openvino_genai import write_openvino_genai_folder
from qcore.export.ortgenai import DecoderShape, write_genai_folder

from ..weight_only.plan import WeightOnlyResult
from .config import Gemma3Config
from .ort_graph import decoder_graph

#: GenAI's model family per decoder config class (its ``type``): both run as its generic decoder-only model.
GENAI_TYPES = {Gemma3Config: "gemma3_text"}


def tokenizer_files(tokenizer: Any, metadata: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """``tokenizer.json`` (the ``tokenizers.Tokenizer`` built from the GGUF) and a ``tokenizer_config.json``
    naming its kind (byte-level BPE: GPT-2's; SentencePiece BPE: Llama's) and special tokens."""
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
    return tokenizer.to_str(), config


def decoder_shape(model: Any, metadata: dict[str, Any]) -> DecoderShape:
    cfg = model.cfg
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    return DecoderShape(
        type=GENAI_TYPES.get(type(cfg), "llama"), vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers, num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        context_length=cfg.context_length, bos_token_id=None if bos is None else int(bos),
        eos_token_id=int(metadata.get("tokenizer.ggml.eos_token_id", 0)),
        pad_token_id=metadata.get("tokenizer.ggml.padding_token_id"))


def save_ortgenai(model: Any, result: WeightOnlyResult, tokenizer: Any, metadata: dict[str, Any],
                  out: str | os.PathLike[str], threads: int | None = None) -> Path:
    """Write the ONNX Runtime GenAI folder ``out`` of ``model`` (quantized in place by
    :func:`qptq.weight_only.quantize_`, ``grid="int"``)."""
    text, config = tokenizer_files(tokenizer, metadata)
    return write_genai_folder(out, decoder_graph(model, result), decoder_shape(model, metadata), text, config,
                              threads)


def save_openvino_genai(model: Any, result: WeightOnlyResult, tokenizer: Any, metadata: dict[str, Any],
                        out: str | os.PathLike[str]) -> Path:
    """Write the OpenVINO GenAI folder ``out`` of ``model`` (quantized in place, ``grid="int"``): its stateful
    model and the tokenizer IRs."""
    from .openvino_graph import decoder_model

    text, config = tokenizer_files(tokenizer, metadata)
    return write_openvino_genai_folder(out, decoder_model(model, result), decoder_shape(model, metadata), text, config)
