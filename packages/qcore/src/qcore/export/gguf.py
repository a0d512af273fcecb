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

The K-quants' blocks hold 256 inputs; ``sc`` / ``m`` are the 6-bit codes of the sub-block steps and offsets against
the float16 ``d`` / ``dmin`` (:func:`qcore.groupwise.factor_steps` recovers them from the codes' steps):

* ``Q4_K`` (144 bytes): ``d``, ``dmin``, 12 bytes of scales, 128 bytes of nibbles. Scale byte ``j < 4`` holds
  ``sc[j]`` in its low 6 bits and bits 4-5 of ``sc[j + 4]`` in its top 2; byte ``4 + j`` the same for ``m``; byte
  ``8 + j`` the low 4 bits of ``sc[j + 4]`` (low nibble) and of ``m[j + 4]`` (high nibble). Nibble byte
  ``32 c + l`` holds ``u[64 c + l]`` (low) and ``u[64 c + 32 + l]`` (high).
* ``Q5_K`` (176 bytes): as ``Q4_K`` with 32 bytes after the scales whose byte ``l`` has bit ``j`` = bit 4 of
  ``u[32 j + l]``, then the low nibbles.
* ``Q6_K`` (210 bytes; ``u = code + 32``): 128 bytes of low nibbles (byte ``64 h + p``: ``u[128 h + p]`` low,
  ``u[128 h + 64 + p]`` high), 64 bytes of high 2-bit pairs (byte ``32 h + p``, bits ``2 t``: ``u[128 h + 32 t +
  p] >> 4``), 16 int8 sub-block scale codes, ``d``.

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
from ..groupwise import GroupCodes, factor_steps
from ..mapped import drop_pages
from ..outputs import atomic_file
from .quiet import quiet_loggers

#: ``general.file_type`` (llama.cpp's ``llama_ftype``) of a file whose weights are mostly of one block type.
FILE_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q4_K": 15, "Q5_K": 17, "Q6_K": 18}
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
    """``[..., 2 h]`` codes (their low nibbles) as ``[..., h]`` bytes: ``u[j] | u[j + h] << 4``."""
    low = (u & 0x0F).astype(np.uint8)
    half = u.shape[-1] // 2
    return low[..., :half] | (low[..., half:] << 4)


def _half_bytes(values: np.ndarray) -> np.ndarray:
    """``[...]`` values as ``[..., 2]`` little-endian float16 bytes."""
    return values.astype("<f2")[..., None].view(np.uint8)


def _k_block_bytes(codes: GroupCodes, u: np.ndarray) -> list[np.ndarray]:
    """The parts of the K-quant blocks of ``codes`` (``u``: unsigned codes ``[N, blocks, 256]``), in file order."""
    grid = codes.grid
    n, blocks = u.shape[:2]
    steps = codes.scales.T.reshape(n, blocks, -1)
    d, sc = factor_steps(steps, grid)
    if grid.name == "Q6_K":
        high = ((u.reshape(n, blocks, 2, 4, 32) >> 4) & 3) << (2 * np.arange(4, dtype=np.uint8))[:, None]
        return [_nibbles(u.reshape(n, blocks, 2, 128)).reshape(n, blocks, 128),
                np.bitwise_or.reduce(high, axis=3).reshape(n, blocks, 64),
                sc.astype(np.int8).view(np.uint8), _half_bytes(d[..., 0])]
    dmin, m = factor_steps(-codes.offsets.T.reshape(n, blocks, -1), grid)
    sc, m = sc.astype(np.uint8), m.astype(np.uint8)
    scales = [sc[..., :4] | (sc[..., 4:] >> 4) << 6, m[..., :4] | (m[..., 4:] >> 4) << 6,
              (sc[..., 4:] & 0x0F) | (m[..., 4:] & 0x0F) << 4]
    parts = [_half_bytes(d[..., 0]), _half_bytes(dmin[..., 0]), *scales]
    if grid.bits == 5:  # bit 4 of u[32 j + l] is bit j of byte l
        parts.append(np.packbits((u.reshape(n, blocks, 8, 32) >> 4) & 1, axis=2, bitorder="little")[:, :, 0])
    parts.append(_nibbles(u.reshape(n, blocks, 4, 64)).reshape(n, blocks, 128))
    return parts


def _check_block_type(codes: GroupCodes) -> None:
    if codes.grid is None or codes.grid.name not in FILE_TYPES:
        raise ConfigError(f"codes on the {'int' if codes.grid is None else codes.grid.name} grid are not a GGUF "
                          "block type; quantize with grid='gguf' (WeightOnlyConfig) so that the codes are chosen on it")


def block_bytes(codes: GroupCodes) -> np.ndarray:
    """The GGUF blocks of ``codes`` as ``[N, K / block * block bytes]`` uint8 (one row per output)."""
    _check_block_type(codes)
    grid = codes.grid
    k, n = codes.codes.shape
    blocks = k // grid.block
    c = codes.codes.T.reshape(n, blocks, grid.block).astype(np.int16)  # [N, blocks, 32 or 256]
    u = (c - grid.lowest).astype(np.uint8)
    if grid.sub is not None:
        return np.concatenate(_k_block_bytes(codes, u), axis=-1).reshape(n, -1)
    parts = [_half_bytes(codes.scales.T)]  # d: [N, blocks, 2]
    if codes.offsets is not None:
        parts.append(_half_bytes(codes.offsets.T))
    if grid.bits == 8:
        parts.append(c.astype(np.int8).view(np.uint8))
    else:
        if grid.bits == 5:
            parts.append(np.packbits((u >> 4) & 1, axis=-1, bitorder="little"))  # 4 bytes: bit j of a 32-bit word
        parts.append(_nibbles(u))
    return np.concatenate(parts, axis=-1).reshape(n, -1)


def _block_type(value: GroupCodes | np.ndarray) -> tuple[str | None, int]:
    """The block type of ``value`` (None: float) and its number of weights."""
    coded = isinstance(value, GroupCodes) and value.grid is not None
    return (value.grid.name, value.codes.size) if coded else (None, np.size(value))


def _file_type(tensors: Mapping[str, GroupCodes | np.ndarray]) -> int:
    weights: dict[str, int] = {}
    for kind, size in (_block_type(tensors[name]) for name in tensors):  # a value at a time: none kept
        if kind is not None:
            weights[kind] = weights.get(kind, 0) + size
    return FILE_TYPES[max(weights, key=weights.__getitem__)] if weights else _ALL_F32


def _check_value(name: str, value: GroupCodes | np.ndarray, shape: tuple[int, ...], source: Any) -> None:
    """One line when ``value`` is not the ``shape`` (numpy order) of the source's tensor ``name``, or codes off the
    block grids."""
    given = value.codes.T.shape if isinstance(value, GroupCodes) else np.shape(value)
    if given != shape:
        raise ConfigError(f"{name} is {list(shape)} in {source}; the values given are {list(given)}")
    if isinstance(value, GroupCodes):
        _check_block_type(value)


def write_gguf(path: str | os.PathLike[str], source: str | os.PathLike[str],
               tensors: Mapping[str, GroupCodes | np.ndarray]) -> Path:
    """Write ``path``: ``source``'s metadata and tensors, those named in ``tensors`` replaced by their codes
    (a block type) or float32 arrays (GGUF orientation: ``[rows, row length]``); ``general.file_type`` says the
    block type most weights have. Atomic: ``path`` is either the whole file or untouched. The file is written a
    tensor at a time; a ``tensors`` mapping that makes each value when it is read (and keeps none) bounds the
    memory by the largest tensor."""
    gguf = require_gguf()
    reader = gguf.GGUFReader(str(source))
    known = {t.name: t for t in reader.tensors}
    unknown = sorted(set(tensors) - set(known))
    if unknown:
        raise ConfigError(f"{unknown[0]!r} is not a tensor of {source} ({len(unknown)} unknown names); write "
                          "the source file's tensor names")
    for name in tensors:
        _check_value(name, tensors[name], tuple(int(d) for d in reversed(known[name].shape)), source)
    arch = reader.fields["general.architecture"].contents()
    path = Path(path)
    with quiet_loggers("gguf"):
        _write(gguf, reader, arch, path, tensors)
    return path


def _write(gguf: Any, reader: Any, arch: str, path: Path, tensors: Mapping[str, GroupCodes | np.ndarray]) -> None:
    """Every tensor's place first (shape, type, bytes), then each tensor's bytes made and written in turn: memory
    holds one tensor, not the file (``tensors`` may make its values when read)."""
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
            _add_info(gguf, writer, t, tensors.get(t.name))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in reader.tensors:
            writer.write_tensor_data(_data(t, tensors.get(t.name)))
        writer.close()


def _add_info(gguf: Any, writer: Any, source: Any, value: GroupCodes | np.ndarray | None) -> None:
    """The place of the tensor the file holds for ``source`` (a reader's tensor): ``value`` when given."""
    if value is None:
        writer.add_tensor_info(source.name, source.data.shape, source.data.dtype, source.data.nbytes,
                               raw_dtype=source.tensor_type)
    elif isinstance(value, GroupCodes):
        kind = gguf.GGMLQuantizationType[value.grid.name]
        k, n = value.codes.shape
        block, size = gguf.GGML_QUANT_SIZES[kind]
        writer.add_tensor_info(source.name, (n, k // block * size), np.dtype(np.uint8), n * (k // block) * size,
                               raw_dtype=kind)
    else:
        writer.add_tensor_info(source.name, np.shape(value), np.dtype(np.float32), 4 * np.size(value))


def _data(source: Any, value: GroupCodes | np.ndarray | None) -> np.ndarray:
    """The bytes the file holds for ``source`` (a reader's tensor): ``value``'s blocks or float32, else the
    source's own."""
    if value is None:
        return source.data
    if not isinstance(value, GroupCodes):
        return np.ascontiguousarray(value, np.float32)
    blocks = block_bytes(value)
    drop_pages(value.codes)  # memory-mapped codes: their pages can go once the blocks are made
    return blocks
