"""Group-wise codes (:class:`qcore.groupwise.GroupCodes`) as a GGUF file for llama.cpp, written with the ``gguf``
package (the format's reference writer).

The codes must have been chosen on one of llama.cpp's block grids (:data:`qcore.groupwise.GGUF_GRIDS`): this
module stores them, it never re-rounds. A GGUF tensor lists its fastest dimension first, so a ``[K, N]`` matmul
weight (``K`` inputs) is ``N`` rows of ``K`` values, each row cut into blocks of 32 inputs. Block layouts (all
little-endian, ``d`` the float16 step, ``m`` the float16 offset, ``u`` the code shifted to be unsigned):

* ``Q8_0``: ``d``, 32 int8 codes;
* ``Q4_0`` / ``Q4_1``: ``d`` (, ``m``), 16 bytes, byte ``j`` holding ``u[j]`` in its low and ``u[j + 16]`` in its
  high nibble (``u = code + 8`` for ``Q4_0``);
* ``Q5_0`` / ``Q5_1``: ``d`` (, ``m``), a 32-bit word whose bit ``j`` is bit 4 of ``u[j]``, then the low nibbles as
  in ``Q4_0`` (``u = code + 16`` for ``Q5_0``).

:func:`write_gguf` copies a source GGUF's metadata (architecture, hyper-parameters, tokenizer) and the tensors it
is not given, and writes the given ones in their block type (codes) or as float32 (arrays).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..groupwise import GroupCodes
from ..outputs import atomic_file
from .quiet import quiet_loggers

#: ``general.file_type`` (llama.cpp's ``llama_ftype``) of a file whose weights are mostly of one block type.
FILE_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9}
_ALL_F32 = 0
_FILE_TYPE_KEY = "general.file_type"


def require_gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise ConfigError("writing GGUF needs the gguf package; install the [llm] extra: "
                          "pip install 'paddle-quant-ptq[llm]' (or pip install gguf)") from None
    return gguf


def _nibbles(u: np.ndarray) -> np.ndarray:
    """``[..., 32]`` codes (0..15 in their low nibble) as ``[..., 16]`` bytes: ``u[j] | u[j + 16] << 4``."""
    low = (u & 0x0F).astype(np.uint8)
    return low[..., :16] | (low[..., 16:] << 4)


def _check_block_type(codes: GroupCodes) -> None:
    if codes.grid is None or codes.grid.name not in FILE_TYPES:
        raise ConfigError(f"codes on the {'int' if codes.grid is None else codes.grid.name} grid are not a GGUF "
                          "block type; quantize with grid='gguf' (WeightOnlyConfig) so that the codes are chosen on it")


def block_bytes(codes: GroupCodes) -> np.ndarray:
    """The GGUF blocks of ``codes`` as ``[N, K / 32 * block bytes]`` uint8 (one row per output)."""
    _check_block_type(codes)
    grid = codes.grid
    k, n = codes.codes.shape
    blocks = k // codes.group_size
    c = codes.codes.T.reshape(n, blocks, codes.group_size).astype(np.int16)  # [N, blocks, 32]
    u = (c - grid.lowest).astype(np.uint8)
    parts = [codes.scales.T.astype(np.float16)[..., None].view(np.uint8)]  # d: [N, blocks, 2]
    if codes.offsets is not None:
        parts.append(codes.offsets.T.astype(np.float16)[..., None].view(np.uint8))
    if grid.bits == 8:
        parts.append(c.astype(np.int8).view(np.uint8))
    else:
        if grid.bits == 5:
            parts.append(np.packbits((u >> 4) & 1, axis=-1, bitorder="little"))  # 4 bytes: bit j of a 32-bit word
        parts.append(_nibbles(u))
    return np.concatenate(parts, axis=-1).reshape(n, -1)


def _file_type(tensors: Mapping[str, GroupCodes | np.ndarray]) -> int:
    weights: dict[str, int] = {}
    for value in tensors.values():
        if isinstance(value, GroupCodes) and value.grid is not None:
            weights[value.grid.name] = weights.get(value.grid.name, 0) + value.codes.size
    return FILE_TYPES[max(weights, key=weights.__getitem__)] if weights else _ALL_F32


def write_gguf(path: str | os.PathLike[str], source: str | os.PathLike[str],
               tensors: Mapping[str, GroupCodes | np.ndarray]) -> Path:
    """Write ``path``: ``source``'s metadata and tensors, those named in ``tensors`` replaced by their codes
    (a block type) or float32 arrays (GGUF orientation: ``[rows, row length]``); ``general.file_type`` says the
    block type most weights have. Atomic: ``path`` is either the whole file or untouched."""
    gguf = require_gguf()
    reader = gguf.GGUFReader(str(source))
    known = {t.name: t for t in reader.tensors}
    unknown = sorted(set(tensors) - set(known))
    if unknown:
        raise ConfigError(f"{unknown[0]!r} is not a tensor of {source} ({len(unknown)} unknown names); write "
                          "the source file's tensor names")
    for name, value in tensors.items():
        shape = tuple(int(d) for d in reversed(known[name].shape))  # slowest first, as numpy
        given = value.codes.T.shape if isinstance(value, GroupCodes) else np.shape(value)
        if given != shape:
            raise ConfigError(f"{name} is {list(shape)} in {source}; the values given are {list(given)}")
        if isinstance(value, GroupCodes):
            _check_block_type(value)
    arch = reader.fields["general.architecture"].contents()
    path = Path(path)
    with quiet_loggers("gguf"):
        _write(gguf, reader, arch, path, tensors)
    return path


def _write(gguf: Any, reader: Any, arch: str, path: Path, tensors: Mapping[str, GroupCodes | np.ndarray]) -> None:
    with atomic_file(path) as tmp:
        writer = gguf.GGUFWriter(str(tmp), arch)
        for field in reader.fields.values():
            if field.name.startswith("GGUF.") or field.name in ("general.architecture", _FILE_TYPE_KEY):
                continue
            kind = field.types[0]
            sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
        writer.add_key_value(_FILE_TYPE_KEY, _file_type(tensors), gguf.GGUFValueType.UINT32)
        for t in reader.tensors:
            value = tensors.get(t.name)
            if value is None:
                writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
            elif isinstance(value, GroupCodes):
                writer.add_tensor(t.name, block_bytes(value), raw_dtype=gguf.GGMLQuantizationType[value.grid.name])
            else:
                writer.add_tensor(t.name, np.ascontiguousarray(value, np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
