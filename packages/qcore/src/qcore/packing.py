"""Sub-byte codes packed into bytes, and the byte -> values table a program unpacks them with.

Codes of ``bits`` <= 4 share a byte: 2-bit codes four to a byte, 3- and 4-bit codes two to a byte
(:func:`field_bits`), the first code in the lowest bits. A code is stored as its field: the low
``field_bits`` bits of its two's complement (signed codes) or the code itself (unsigned codes).
Paddle has no 4-bit or 2-bit dtype and its lookups take float or int8 tables only, so a packed table
is an int8 array; a program looks up its packed rows and turns each byte into its codes' values with
one more lookup, in a 256-row table indexed by ``byte + 128`` (:func:`byte_values`).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .errors import ConfigError

#: Largest code width that is packed; wider codes take a byte each.
MAX_PACKED_BITS = 4


def field_bits(bits: int) -> int:
    """Width of the field a ``bits``-bit code takes in a packed byte (2 or 4; 8 when not packed)."""
    if not 1 <= bits <= 8:
        raise ConfigError(f"bits={bits!r} is not valid for packing; use 1 to 8")
    return 2 if bits <= 2 else 4 if bits <= MAX_PACKED_BITS else 8


def codes_per_byte(bits: int) -> int:
    return 8 // field_bits(bits)


def packed_width(dim: int, bits: int) -> int:
    """Bytes per row for ``dim`` codes of ``bits`` bits."""
    k = codes_per_byte(bits)
    return -(-dim // k)


def pack_codes(codes: ArrayLike, bits: int) -> NDArray[np.int8]:
    """Pack integer ``codes`` (signed or unsigned, each fitting ``bits`` bits) along the last axis.

    The last axis is padded with zero codes to a whole byte. Returns int8 bytes (bit patterns).
    """
    width = field_bits(bits)
    k = 8 // width
    c = np.asarray(codes)
    pad = (-c.shape[-1]) % k
    if pad:
        c = np.concatenate([c, np.zeros((*c.shape[:-1], pad), c.dtype)], axis=-1)
    fields = (c.astype(np.int16) & ((1 << width) - 1)).astype(np.uint8)
    groups = fields.reshape(*fields.shape[:-1], -1, k)
    packed = np.zeros(groups.shape[:-1], np.uint8)
    for j in range(k):
        packed |= groups[..., j] << np.uint8(j * width)
    return packed.view(np.int8)


def unpack_fields(packed: ArrayLike, bits: int, dim: int) -> NDArray[np.uint8]:
    """The fields of :func:`pack_codes`' bytes (unsigned, ``0 .. 2**field_bits - 1``), first ``dim`` per row."""
    width = field_bits(bits)
    k = 8 // width
    p = np.asarray(packed).view(np.uint8)
    shifts = (np.arange(k, dtype=np.uint8) * np.uint8(width))
    fields = (p[..., None] >> shifts) & np.uint8((1 << width) - 1)
    return fields.reshape(*p.shape[:-1], -1)[..., :dim]


def signed_fields(fields: ArrayLike, bits: int) -> NDArray[np.int8]:
    """Fields read back as two's complement codes of their field width."""
    width = field_bits(bits)
    f = np.asarray(fields).astype(np.int16)
    return np.where(f >= 1 << (width - 1), f - (1 << width), f).astype(np.int8)


def byte_values(bits: int, field_value: ArrayLike) -> NDArray[np.float32]:
    """``[256, codes_per_byte]`` float32: row ``b + 128`` holds the values of the codes in byte ``b``
    (an int8 bit pattern); ``field_value[f]`` is the value of field ``f``."""
    width = field_bits(bits)
    values = np.asarray(field_value, np.float32).reshape(-1)
    if values.size != 1 << width:
        raise ConfigError(f"field_value needs {1 << width} entries for {bits}-bit codes, got {values.size}")
    byte = np.arange(-128, 128, dtype=np.int16).astype(np.int8)
    return values[unpack_fields(byte[:, None], bits, codes_per_byte(bits))]
