"""ONNX Runtime's ``com.microsoft.MatMulNBits`` node for group-wise codes (:class:`qcore.groupwise.GroupCodes`)
and its inputs' byte layout (described in :mod:`.nbits`), shared by the matmul (:mod:`.nbits`) and table
(:mod:`.gather_nbits`) writers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..groupwise import GroupCodes
from ..packing import pack_codes

MS_DOMAIN = "com.microsoft"
#: ``accuracy_level`` values: int8 activations per block (fast), float activations (exact to the codes).
INT8_ACTIVATIONS, FLOAT_ACTIVATIONS = 4, 0


def packed(codes: np.ndarray, bits: int) -> np.ndarray:
    """Unsigned codes along the last axis as bytes: two to a byte for 4 bits (first in the low nibble), one for 8."""
    if bits == 8:
        return codes.astype(np.uint8)
    return pack_codes(codes.astype(np.int16), bits).view(np.uint8)


@dataclass(frozen=True)
class NBitsArrays:
    """``MatMulNBits``' inputs for a ``[K, N]`` weight: ``b`` ``[N, blocks, block * bits / 8]``, ``scales``
    ``[N, blocks]``, ``zero_points`` packed ``[N, ceil(blocks * bits / 8)]`` (None: symmetric, the default
    ``2 ** (bits - 1)``) and, unpacked, ``zero_codes`` ``[N, blocks]``."""

    b: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    zero_codes: np.ndarray | None
    k: int
    block: int
    bits: int


def nbits_arrays(q: GroupCodes) -> NBitsArrays:
    """The codes of ``q`` in ``MatMulNBits``' layout; one group per output of a width that is no power of two is
    the next power-of-two block, its tail padded with codes that read as 0. One line for a group that can be
    no block."""
    k, n = q.codes.shape
    block = q.group_size
    if block == k:
        block = max(16, 1 << (k - 1).bit_length())
    if block < 16 or block & (block - 1):
        raise ConfigError(f"group_size={block} cannot be a MatMulNBits block; use a power of two >= 16 (32, 64, 128)")
    blocks = -(-k // block)
    zero = np.full((1, n), 2 ** (q.bits - 1)) if q.zero_points is None else q.zero_points[:1].astype(np.int16)
    codes = q.codes.astype(np.int16) + (2 ** (q.bits - 1) if q.zero_points is None else 0)
    codes = np.concatenate([codes, np.repeat(zero, blocks * block - k, axis=0)])  # the padding reads as 0
    zero_codes = None if q.zero_points is None else np.ascontiguousarray(q.zero_points.T, np.uint8)
    return NBitsArrays(packed(codes.T.reshape(n, blocks, block), q.bits),
                       np.ascontiguousarray(q.scales.T, np.float32),
                       None if zero_codes is None else packed(zero_codes, q.bits), zero_codes, k, block, q.bits)


def matmul_nbits(
    q: GroupCodes, a: str, y: str, name: str, accuracy_level: int = INT8_ACTIVATIONS
) -> tuple[Any, list[Any]]:
    """The ``MatMulNBits`` node computing ``y = a @ dequantize(q)`` and its initializers (``{name}.B``,
    ``{name}.scales``, ``{name}.zero_points``)."""
    from onnx import helper, numpy_helper

    arrays = nbits_arrays(q)
    inits = [numpy_helper.from_array(arrays.b, f"{name}.B"), numpy_helper.from_array(arrays.scales, f"{name}.scales")]
    inputs = [a, f"{name}.B", f"{name}.scales"]
    if arrays.zero_points is not None:
        inits.append(numpy_helper.from_array(arrays.zero_points, f"{name}.zero_points"))
        inputs.append(f"{name}.zero_points")
    node = helper.make_node("MatMulNBits", inputs, [y], name=name, domain=MS_DOMAIN, K=arrays.k,
                            N=arrays.b.shape[0], bits=q.bits, block_size=arrays.block, accuracy_level=accuracy_level)
    return node, inits
