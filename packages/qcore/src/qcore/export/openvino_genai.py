"""A decoder as an OpenVINO GenAI folder: a stateful IR (``openvino_model.xml`` / ``.bin``) with the tokenizer and
detokenizer IRs of ``openvino-tokenizers``, which ``openvino_genai.LLMPipeline(folder, "CPU")`` runs with no code
of the user's.

The decoder comes as an ``openvino.Model`` (``qptq.llm.openvino_graph`` writes it) with the inputs the pipeline
feeds (``input_ids``, ``attention_mask``, ``position_ids``, ``beam_idx``) and its KV cache as ``past_*``
parameters and ``present_*`` results; OpenVINO's make-stateful transformation turns every pair into a state
variable, so the cache stays inside the model between steps.
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


def require_openvino_genai() -> None:
    """One line naming what to install when the converter's packages are missing."""
    import importlib.util

    missing = [p for p in ("openvino", "openvino_tokenizers", "transformers") if importlib.util.find_spec(p) is None]
    if missing:
        raise ConfigError(f"the OpenVINO GenAI folder needs {', '.join(missing)}; install the [openvino-genai] extra "
                          "of paddle-quant-core (openvino-genai, openvino-tokenizers[transformers])")


def make_stateful(model: Any) -> Any:
    """``model`` (an ``openvino.Model`` with a ``past_<name>`` parameter and a ``present_<name>`` result per cache
    tensor, batch first, and an ``input_ids`` input) with every such pair turned into a state variable, in place.

    Each state starts as zeros of ``[batch of input_ids, fixed dims, 0 for the dynamic ones]``: the CPU plugin
    compiles a state read into its fused cached attention only with such an initial value."""
    import numpy as np
    from openvino import opset13 as ops
    from openvino._offline_transformations import apply_make_stateful_transformation

    names = [p.get_friendly_name() for p in model.get_parameters() if p.get_friendly_name().startswith("past_")]
    apply_make_stateful_transformation(model, {name: name.replace("past_", "present_", 1) for name in names})
    batch = ops.gather(ops.shape_of(model.input("input_ids"), "i64"), ops.constant(np.array([0], np.int64)),
                       ops.constant(np.int64(0)))
    for op in model.get_ops():
        if op.get_type_name() == "ReadValue":
            dims = [batch] + [ops.constant(np.array([d.get_min_length()], np.int64))
                              for d in list(op.get_output_partial_shape(0))[1:]]
            zero = ops.constant(np.zeros((), op.get_output_element_type(0).to_dtype()))
            op.set_arguments([ops.broadcast(zero, ops.concat(dims, 0))])
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


def write_openvino_genai_folder(out_dir: str | os.PathLike[str], model: Any, shape: DecoderShape,
                                tokenizer_json: str, tokenizer_config: Mapping[str, Any]) -> Path:
    """Write the folder (staged: every file or none); ``model`` a decoder as :func:`make_stateful` takes it."""
    import openvino as ov

    require_openvino_genai()
    model = make_stateful(model)
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
