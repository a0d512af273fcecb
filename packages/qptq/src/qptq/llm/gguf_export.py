"""A weight-only quantized decoder (:mod:`.llama`, :mod:`.gemma3`) as a GGUF file for llama.cpp: every parameter
under its GGUF name (the architecture's :func:`gguf_tensors` table), quantized ones as the block codes the
algorithms chose (``WeightOnlyConfig(grid="gguf")``), the rest float32; metadata and tokenizer from the source
GGUF the model was read from (:func:`qcore.export.gguf.write_gguf`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from qcore.errors import ConfigError
from qcore.export.gguf import write_gguf
from qcore.groupwise import GroupCodes

from ..weight_only.plan import WeightOnlyResult
from . import gemma3, llama
from .config import Gemma3Config
from .gguf_weights import GGUFTensor


def gguf_table(model: Any) -> dict[str, GGUFTensor]:
    """The GGUF tensor of each of ``model``'s parameters."""
    cfg = getattr(model, "cfg", None)
    if cfg is None:
        raise ConfigError(f"{type(model).__name__} is not a qptq.llm decoder; GGUF export takes llama.Llama or "
                          "gemma3.Gemma3 models (read with load_gguf)")
    return (gemma3 if isinstance(cfg, Gemma3Config) else llama).gguf_tensors(cfg)


def gguf_tensors_of(model: Any, result: WeightOnlyResult) -> dict[str, GroupCodes | np.ndarray]:
    """Every parameter of ``model`` by GGUF name: the codes ``result`` holds for it, else its float value."""
    table = gguf_table(model)
    codes = {f"{layer.name}.weight": result.codes[layer.weight] for layer in result.layers}
    out: dict[str, GroupCodes | np.ndarray] = {}
    for name, param in model.state_dict().items():
        where = table[name]
        out[where.name] = (where.codes_from_paddle(codes[name]) if name in codes
                           else where.from_paddle(param.numpy().astype(np.float32)))
    return out


def save_gguf(model: Any, result: WeightOnlyResult, source: str | os.PathLike[str],
              path: str | os.PathLike[str]) -> Path:
    """Write ``model`` (quantized in place by :func:`qptq.weight_only.quantize_` with ``grid="gguf"``) to ``path``
    with the metadata and tokenizer of ``source``, the GGUF it was read from."""
    return write_gguf(path, source, gguf_tensors_of(model, result))
