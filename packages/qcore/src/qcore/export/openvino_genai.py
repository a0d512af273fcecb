"""A decoder's ONNX decode step as an OpenVINO GenAI folder: a stateful IR (``openvino_model.xml`` / ``.bin``) with the
tokenizer and detokenizer IRs of ``openvino-tokenizers``, which ``openvino_genai.LLMPipeline(folder, "CPU")`` runs
with no code of the user's.

The graph is a decode step with an explicit KV cache (paddle2onnx's export of a decoder's PIR decode program,
weights replaced by :mod:`.nbits`), named by :func:`name_decoder_io`: ``input_ids``, ``past_key_<i>`` /
``past_value_<i>`` in, ``logits`` and ``present_*`` out. Read by the OpenVINO runtime's ONNX frontend
(``MatMulNBits`` become its compressed weights), it gets the inputs the pipeline feeds: ``attention_mask`` and
``position_ids`` (unused: the graph derives masks and positions from the cache length, so generation is batch 1
without padding) and ``beam_idx``, which reorders each cache along the batch before use; then OpenVINO's make-
stateful transformation turns every past/present pair into a state variable, so the cache stays inside the model
between steps.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..outputs import staged_output
from .ortgenai import DecoderShape
from .quiet import quiet_loggers

MODEL_XML = "openvino_model.xml"


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


def require_openvino_genai() -> None:
    """One line naming what to install when the converter's packages are missing."""
    import importlib.util

    missing = [p for p in ("openvino", "openvino_tokenizers", "transformers") if importlib.util.find_spec(p) is None]
    if missing:
        raise ConfigError(f"the OpenVINO GenAI folder needs {', '.join(missing)}; install the [openvino-genai] extra "
                          "of paddle-quant-core (openvino-genai, openvino-tokenizers[transformers])")


def stateful_model(onnx_path: Path) -> Any:
    """The OpenVINO model of the decode step in ``onnx_path``, with the pipeline's inputs and the cache as state."""
    import numpy as np
    import openvino as ov
    from openvino import opset13 as ops
    from openvino._offline_transformations import apply_make_stateful_transformation

    model = ov.Core().read_model(str(onnx_path))
    past = [p for p in model.get_parameters() if p.get_friendly_name().startswith("past_")]
    extra = []
    for name, shape, kind in (("beam_idx", [-1], ov.Type.i32), ("attention_mask", [-1, -1], ov.Type.i64),
                              ("position_ids", [-1, -1], ov.Type.i64)):
        parameter = ops.parameter(shape, kind, name=name)
        parameter.output(0).set_names({name})
        extra.append(parameter)
    beam = extra[0]
    for parameter in past:  # every reader of a cache reads it reordered by beam_idx
        readers = list(parameter.output(0).get_target_inputs())
        reordered = ops.gather(parameter, beam, ops.constant(np.int64(0)))
        for reader in readers:
            reader.replace_source_output(reordered.output(0))
    model.add_parameters(extra)
    apply_make_stateful_transformation(
        model, {p.get_friendly_name(): p.get_friendly_name().replace("past_", "present_", 1) for p in past})
    model.validate_nodes_and_infer_types()
    return model


def tokenizer_models(tokenizer_json: str, tokenizer_config: Mapping[str, Any]) -> tuple[Any, Any]:
    """The tokenizer and detokenizer IRs of ``openvino-tokenizers`` for a ``tokenizer.json``."""
    from openvino_tokenizers import convert_tokenizer
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    specials = {k: v for k, v in tokenizer_config.items() if k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    wrapped = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tokenizer_json), **specials)
    with quiet_loggers("openvino_tokenizers"):
        return convert_tokenizer(wrapped, with_detokenizer=True, skip_special_tokens=True)


def write_openvino_genai_folder(out_dir: str | os.PathLike[str], onnx_path: Path, shape: DecoderShape,
                                tokenizer_json: str, tokenizer_config: Mapping[str, Any]) -> Path:
    """Write the folder (staged: every file or none); ``onnx_path`` a decode step named as
    :func:`name_decoder_io` names it, its weights beside it."""
    import openvino as ov

    require_openvino_genai()
    model = stateful_model(onnx_path)
    tokenizer, detokenizer = tokenizer_models(tokenizer_json, tokenizer_config)
    ids = {"bos_token_id": shape.bos_token_id, "eos_token_id": shape.eos_token_id,
           "pad_token_id": shape.pad_token_id if shape.pad_token_id is not None else shape.eos_token_id}
    out = Path(out_dir)
    with staged_output(out, last=[MODEL_XML]) as staging:
        # weights as the codes store them; float ones (norms) not narrowed to float16
        ov.save_model(model, str(staging / MODEL_XML), compress_to_fp16=False)
        ov.save_model(tokenizer, str(staging / "openvino_tokenizer.xml"), compress_to_fp16=False)
        ov.save_model(detokenizer, str(staging / "openvino_detokenizer.xml"), compress_to_fp16=False)
        (staging / "generation_config.json").write_text(json.dumps(ids, indent=1), encoding="utf-8")
        config = {"model_type": shape.type, "vocab_size": shape.vocab_size, "hidden_size": shape.hidden_size,
                  "num_hidden_layers": shape.num_layers, "num_attention_heads": shape.num_heads,
                  "num_key_value_heads": shape.num_kv_heads, "head_dim": shape.head_dim,
                  "max_position_embeddings": shape.context_length, **ids}
        (staging / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return out
