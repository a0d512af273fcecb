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
from .gguf_weights import GGUFTensor
from .sources import port_of


def gguf_table(model: Any) -> dict[str, GGUFTensor]:
    """The GGUF tensor of each of ``model``'s parameters."""
    cfg = getattr(model, "cfg", None)
    if cfg is None:
        raise ConfigError(f"{type(model).__name__} is not a qptq.llm decoder; GGUF export takes llama.Llama or "
                          "gemma3.Gemma3 models (read with load_gguf)")
    return port_of(cfg).gguf_tensors(cfg)


def gguf_tensors_of(model: Any, result: WeightOnlyResult) -> dict[str, GroupCodes | np.ndarray]:
    """Every parameter of ``model`` (a port, or a :class:`.streaming.StreamedDecoder`) by GGUF name: the codes
    ``result`` holds for it, else its float value."""
    state = model.state_dict()
    codes = {f"{layer.name}.weight": result.codes[layer.weight] for layer in result.layers}
    return {where.name: (where.codes_from_paddle(codes[name]) if name in codes
                         else where.from_paddle(np.asarray(state[name], np.float32)))
            for name, where in gguf_table(model).items()}


def save_gguf(model: Any, result: WeightOnlyResult, source: str | os.PathLike[str],
              path: str | os.PathLike[str]) -> Path:
    """Write ``model`` (quantized in place by :func:`qptq.weight_only.quantize_` with ``grid="gguf"``) to ``path``
    with the metadata and tokenizer of ``source``, the GGUF it was read from."""
    return write_gguf(path, source, gguf_tensors_of(model, result))
