"""Where a decoder's parameters come from, one tensor at a time (:class:`TensorSource`), so that a decoder larger
than memory can be quantized layer by layer (:mod:`.streaming`): a GGUF file (:class:`GGUFSource`: memory-mapped
by the ``gguf`` package, each tensor dequantized when it is read) or a PaddleNLP checkpoint directory
(:class:`.paddlenlp.CheckpointSource`). Both give float32 arrays under the port's parameter names and layout
(``layers.3.attn.q_proj.weight``, ``[in, out]``)."""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import numpy as np

from . import gemma3, llama, paddlenlp
from .config import DecoderConfig, Gemma3Config


class TensorSource(Protocol):
    """A decoder's hyper-parameters and its parameters by port name, in float32."""

    config: DecoderConfig

    def tensor(self, name: str) -> np.ndarray: ...


def port_of(cfg: DecoderConfig) -> ModuleType:
    """The port module (:mod:`.llama` or :mod:`.gemma3`) of a decoder's hyper-parameters."""
    return gemma3 if isinstance(cfg, Gemma3Config) else llama


class GGUFSource:
    """The tensors of a GGUF file of a ported architecture, as the port's parameters."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        from gguf import GGUFReader

        from .gguf_weights import config_from_metadata, reader_metadata

        reader = GGUFReader(str(path))
        self._tensors = {t.name: t for t in reader.tensors}
        self.config = config_from_metadata(reader_metadata(reader), has_output="output.weight" in self._tensors)
        self._table = port_of(self.config).gguf_tensors(self.config)

    def tensor(self, name: str) -> np.ndarray:
        from .gguf_weights import dequantized

        where = self._table[name]
        return np.ascontiguousarray(where.to_paddle(dequantized(self._tensors[where.name])))


def open_source(source: str | os.PathLike[str]) -> Any:
    """The :class:`TensorSource` of a GGUF file or a PaddleNLP checkpoint directory."""
    path = Path(source)
    if path.is_dir():
        return paddlenlp.CheckpointSource(paddlenlp.open_checkpoint(path))
    return GGUFSource(path)
