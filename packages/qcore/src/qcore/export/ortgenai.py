"""A decoder's ONNX graph as an ONNX Runtime GenAI model folder: ``model.onnx`` (+ ``model.onnx.data``),
``genai_config.json``, and the tokenizer (``tokenizer.json``, ``tokenizer_config.json``), which
``onnxruntime_genai.Model(folder)`` and its generator run with no code of the user's.

The graph (written by ``qptq.llm.ort_graph``) names its I/O as :data:`INPUTS` / :data:`OUTPUTS` say (``%d`` the
layer): ``input_ids`` and ``attention_mask`` ``[batch, total]``, and per layer a key and a value cache
``[batch, kv_heads, max_length, head_dim]`` that is one buffer for past and present
(``past_present_share_buffer``: ``GroupQueryAttention`` writes each step's key and value into it in place).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..outputs import staged_output
from .external_data import ExternalData

MODEL_FILE, DATA_FILE, CONFIG_FILE = "model.onnx", "model.onnx.data", "genai_config.json"
#: Graph input and output names, ``%d`` the layer (``genai_config.json``'s ``inputs`` / ``outputs``).
INPUTS = {"input_ids": "input_ids", "attention_mask": "attention_mask",
          "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"}
OUTPUTS = {"logits": "logits", "present_key_names": "present.%d.key", "present_value_names": "present.%d.value"}


@dataclass(frozen=True)
class DecoderShape:
    """What GenAI's config says of a decoder (``type``: its model family, e.g. ``llama``, ``gemma3_text``)."""

    type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    context_length: int
    bos_token_id: int | None
    eos_token_id: int | list[int]
    pad_token_id: int | None = None


def genai_config(shape: DecoderShape, threads: int | None = None) -> dict[str, Any]:
    """``genai_config.json`` for a graph named as :data:`INPUTS` / :data:`OUTPUTS` say; greedy search by default."""
    session: dict[str, Any] = {"log_id": "onnxruntime-genai", "provider_options": []}
    if threads:
        session["intra_op_num_threads"] = threads
    model = {
        "type": shape.type, "vocab_size": shape.vocab_size, "context_length": shape.context_length,
        "eos_token_id": shape.eos_token_id,
        "pad_token_id": shape.pad_token_id if shape.pad_token_id is not None else shape.eos_token_id,
        **({} if shape.bos_token_id is None else {"bos_token_id": shape.bos_token_id}),  # GenAI refuses a null
        "decoder": {"filename": MODEL_FILE, "session_options": session, "hidden_size": shape.hidden_size,
                    "head_size": shape.head_dim, "num_attention_heads": shape.num_heads,
                    "num_key_value_heads": shape.num_kv_heads, "num_hidden_layers": shape.num_layers,
                    "inputs": INPUTS, "outputs": OUTPUTS},
    }
    search = {"max_length": shape.context_length, "min_length": 0, "do_sample": False, "num_beams": 1,
              "num_return_sequences": 1, "past_present_share_buffer": True, "repetition_penalty": 1.0,
              "temperature": 1.0, "top_k": 1, "top_p": 1.0, "early_stopping": True, "length_penalty": 1.0,
              "no_repeat_ngram_size": 0, "diversity_penalty": 0.0}
    return {"model": model, "search": search}


def write_genai_folder(out_dir: str | os.PathLike[str], graph: Callable[[ExternalData], Any], shape: DecoderShape,
                       tokenizer_json: str, tokenizer_config: Mapping[str, Any], threads: int | None = None) -> Path:
    """Write the folder (staged: ``out_dir`` gets every file or none of them). ``graph(weights)`` builds the
    ``onnx.ModelProto`` (I/O named as :data:`INPUTS` / :data:`OUTPUTS` say), writing its initializers to
    ``weights``, ``model.onnx.data``, as it goes: memory holds one tensor at a time, not the model."""
    import onnx

    out = Path(out_dir)
    with staged_output(out, last=[CONFIG_FILE]) as staging:
        with ExternalData(staging / DATA_FILE) as weights:
            model = graph(weights)
        onnx.save(model, str(staging / MODEL_FILE))
        (staging / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
        (staging / "tokenizer_config.json").write_text(json.dumps(dict(tokenizer_config), indent=1), encoding="utf-8")
        (staging / CONFIG_FILE).write_text(json.dumps(genai_config(shape, threads), indent=1), encoding="utf-8")
    return out
