"""A weight-only quantized decoder (:mod:`.llama`, :mod:`.gemma3`) as a runtime's LLM folder, with the tokenizer of
the GGUF the model was read from: ONNX Runtime GenAI's (:mod:`qcore.export.ortgenai`) holds the graph
:mod:`.ort_graph` writes with ONNX Runtime's contrib ops; OpenVINO GenAI's (:mod:`qcore.export.openvino_genai`)
the stateful IR of the PIR decode step (explicit KV cache) through paddle2onnx, matmuls swapped for
``MatMulNBits`` and the table for the OpenVINO runtime's quantized lookup (:mod:`qcore.export.nbits`)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from qcore.export.gather_nbits import BLOCK_DQ_OPSET
from qcore.export.nbits import INT8_ACTIVATIONS, replace_matmuls
from qcore.export.openvino_genai import name_decoder_io, write_openvino_genai_folder
from qcore.export.ortgenai import MODEL_FILE, DecoderShape, write_genai_folder
from qcore.export.paddle2onnx_float import float_onnx
from qcore.model_io import find_model_files

from ..weight_only.plan import WeightOnlyResult
from .common import export
from .config import Gemma3Config
from .ort_graph import decoder_graph

#: GenAI's model family per decoder config class (its ``type``): both run as its generic decoder-only model.
GENAI_TYPES = {Gemma3Config: "gemma3_text"}


def decoder_onnx(model: Any, result: WeightOnlyResult, accuracy_level: int = INT8_ACTIVATIONS) -> Any:
    """The ONNX decode step of ``model`` (quantized in place, ``grid="int"``) through paddle2onnx, with
    ``result``'s codes, the quantized table in the OpenVINO runtime's form (opset 21)."""
    with tempfile.TemporaryDirectory(prefix="qptq-llm-") as tmp:
        export(model, tmp)
        onnx_model = float_onnx(find_model_files(Path(tmp) / "decode"), BLOCK_DQ_OPSET)
    replace_matmuls(onnx_model, result.codes, result.input_scales, accuracy_level, "openvino-runtime")
    name_decoder_io(onnx_model, model.cfg.num_layers)
    return onnx_model


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
    """Write the OpenVINO GenAI folder ``out`` of ``model`` (quantized in place, ``grid="int"``): the stateful IR
    of its ONNX decode step (the table in the OpenVINO runtime's form) and the tokenizer IRs."""
    import onnx

    text, config = tokenizer_files(tokenizer, metadata)
    with tempfile.TemporaryDirectory(prefix="qptq-ovgenai-") as tmp:
        path = Path(tmp) / MODEL_FILE
        onnx.save(decoder_onnx(model, result), str(path), save_as_external_data=True,
                  location=MODEL_FILE + ".data")
        return write_openvino_genai_folder(out, path, decoder_shape(model, metadata), text, config)
