"""A decoder's ONNX graph as an ONNX Runtime GenAI model folder: ``model.onnx`` (+ ``model.onnx.data``),
``genai_config.json``, and the tokenizer (``tokenizer.json``, ``tokenizer_config.json``), which
``onnxruntime_genai.Model(folder)`` and its generator run with no code of the user's.

The graph is a decode step with an explicit KV cache (what :mod:`qcore.export.paddle2onnx_float` makes of a
decoder's PIR decode program, weights replaced by :mod:`qcore.export.nbits`): inputs ``input_ids`` and
``past_key_<i>`` / ``past_value_<i>`` (``[batch, kv_heads, past, head_dim]``; a prefill passes an empty
cache), outputs the logits then each layer's grown cache. GenAI reads such names from ``genai_config.json``'s
``inputs`` / ``outputs`` (``%d`` for the layer) and feeds only the inputs the graph has (no attention mask or
positions here: the graph derives them from the cache length); the past and present caches are separate
buffers (``past_present_share_buffer`` false).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..outputs import staged_output

MODEL_FILE, CONFIG_FILE = "model.onnx", "genai_config.json"
INPUTS = {"input_ids": "input_ids", "past_key_names": "past_key_%d", "past_value_names": "past_value_%d"}
OUTPUTS = {"logits": "logits", "present_key_names": "present_key_%d", "present_value_names": "present_value_%d"}


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


def name_decoder_io(model: Any, layers: int) -> None:
    """Rename ``model``'s outputs in place: the first to ``logits``, then ``present_key_<i>``,
    ``present_value_<i>`` per layer (one line when the graph does not have ``1 + 2 * layers`` outputs)."""
    outputs = list(model.graph.output)
    if len(outputs) != 1 + 2 * layers:
        raise ConfigError(f"the decoder graph has {len(outputs)} outputs; a {layers}-layer decode step has "
                          f"{1 + 2 * layers} (logits, then a key and a value per layer)")
    names = ["logits"] + [f"present_{kind}_{i}" for i in range(layers) for kind in ("key", "value")]
    renamed = {old.name: new for old, new in zip(outputs, names)}
    for node in model.graph.node:
        for field in (node.input, node.output):
            for k, value in enumerate(field):
                if value in renamed:
                    field[k] = renamed[value]
    for output in outputs:
        output.name = renamed[output.name]


def genai_config(shape: DecoderShape, threads: int | None = None) -> dict[str, Any]:
    """``genai_config.json`` for a graph named as :func:`name_decoder_io` names it; greedy search by default."""
    session: dict[str, Any] = {"log_id": "onnxruntime-genai", "provider_options": []}
    if threads:
        session["intra_op_num_threads"] = threads
    model = {
        "type": shape.type, "vocab_size": shape.vocab_size, "context_length": shape.context_length,
        "bos_token_id": shape.bos_token_id, "eos_token_id": shape.eos_token_id,
        "pad_token_id": shape.pad_token_id if shape.pad_token_id is not None else shape.eos_token_id,
        "decoder": {"filename": MODEL_FILE, "session_options": session, "hidden_size": shape.hidden_size,
                    "head_size": shape.head_dim, "num_attention_heads": shape.num_heads,
                    "num_key_value_heads": shape.num_kv_heads, "num_hidden_layers": shape.num_layers,
                    "inputs": INPUTS, "outputs": OUTPUTS},
    }
    search = {"max_length": shape.context_length, "min_length": 0, "do_sample": False, "num_beams": 1,
              "num_return_sequences": 1, "past_present_share_buffer": False, "repetition_penalty": 1.0,
              "temperature": 1.0, "top_k": 1, "top_p": 1.0, "early_stopping": True, "length_penalty": 1.0,
              "no_repeat_ngram_size": 0, "diversity_penalty": 0.0}
    return {"model": model, "search": search}


def write_genai_folder(out_dir: str | os.PathLike[str], model: Any, shape: DecoderShape, tokenizer_json: str,
                       tokenizer_config: Mapping[str, Any], threads: int | None = None) -> Path:
    """Write the folder (staged: ``out_dir`` gets every file or none of them); ``model`` named by
    :func:`name_decoder_io`, its weights saved beside it as ``model.onnx.data``."""
    import onnx

    out = Path(out_dir)
    with staged_output(out, last=[CONFIG_FILE]) as staging:
        onnx.save(model, str(staging / MODEL_FILE), save_as_external_data=True, location=MODEL_FILE + ".data")
        (staging / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
        (staging / "tokenizer_config.json").write_text(json.dumps(dict(tokenizer_config), indent=1), encoding="utf-8")
        (staging / CONFIG_FILE).write_text(json.dumps(genai_config(shape, threads), indent=1), encoding="utf-8")
    return out
