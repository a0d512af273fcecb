"""A weight-only quantized decoder (:mod:`.llama`, :mod:`.gemma3`) as a GGUF file for llama.cpp: every parameter
under its GGUF name (the architecture's :func:`gguf_tensors` table), quantized ones as the block codes the
algorithms chose (``WeightOnlyConfig(grid="gguf")``), the rest float32; metadata and tokenizer from the source
GGUF the model was read from (:func:`qcore.export.gguf.write_gguf`)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
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


class GGUFTensors(Mapping[str, "GroupCodes | np.ndarray"]):
    """Every parameter of a decoder (a port, or a :class:`.streaming.StreamedDecoder`) by GGUF name: the codes the
    result holds for it, else its float value, made when read and not kept (the writer reads one at a time)."""

    def __init__(self, model: Any, result: WeightOnlyResult) -> None:
        self.state = model.state_dict()
        self.codes = {f"{layer.name}.weight": result.codes[layer.weight] for layer in result.layers}
        self.where = {where.name: (name, where) for name, where in gguf_table(model).items()}

    def __getitem__(self, key: str) -> GroupCodes | np.ndarray:
        name, where = self.where[key]
        if name in self.codes:
            return where.codes_from_paddle(self.codes[name])
        return where.from_paddle(np.asarray(self.state[name], np.float32))

    def __iter__(self) -> Iterator[str]:
        return iter(self.where)

    def __len__(self) -> int:
        return len(self.where)


def save_gguf(model: Any, result: WeightOnlyResult, source: str | os.PathLike[str],
              path: str | os.PathLike[str]) -> Path:
    """Write ``model`` (quantized in place by :func:`qptq.weight_only.quantize_` with ``grid="gguf"``) to ``path``
    with the metadata and tokenizer of ``source``, the GGUF it was read from."""
    return write_gguf(path, source, GGUFTensors(model, result))
