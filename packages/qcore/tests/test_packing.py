"""Sub-byte packing (qcore.packing): bytes by hand, round trips, the byte -> values table."""

from __future__ import annotations

import numpy as np
import pytest

from qcore.errors import ConfigError
from qcore.packing import (
    byte_values,
    codes_per_byte,
    field_bits,
    pack_codes,
    packed_width,
    signed_fields,
    unpack_fields,
)


def test_4_bit_codes_by_hand():
    # fields (two's complement nibbles): -1 -> 0xF, 2 -> 0x2, 7 -> 0x7, -8 -> 0x8, 3 -> 0x3, then a zero pad
    packed = pack_codes(np.array([[-1, 2, 7, -8, 3]], np.int8), 4)
    assert packed.dtype == np.int8 and packed.shape == (1, 3)
    assert packed.view(np.uint8).tolist() == [[0x2F, 0x87, 0x03]]  # first code in the low nibble


def test_2_bit_codes_by_hand():
    # fields: 1 -> 01, -2 -> 10, 0 -> 00, -1 -> 11 | 1 -> 01 then three zero pads
    packed = pack_codes(np.array([[1, -2, 0, -1, 1]], np.int8), 2)
    assert packed.view(np.uint8).tolist() == [[0b11_00_10_01, 0b01]]


def test_unsigned_codes_are_their_own_fields():
    assert pack_codes(np.array([[15, 0, 9]], np.int8), 4).view(np.uint8).tolist() == [[0x0F, 0x09]]
    assert pack_codes(np.array([[3, 2, 1, 0]], np.int8), 2).view(np.uint8).tolist() == [[0b00_01_10_11]]


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("dim", [1, 5, 7, 8, 9])
def test_round_trip_for_every_width_and_odd_dims(bits, dim):
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    codes = np.random.default_rng(bits * 10 + dim).integers(lo, hi + 1, (6, dim)).astype(np.int8)
    packed = pack_codes(codes, bits)
    assert packed.shape == (6, packed_width(dim, bits)) == (6, -(-dim // codes_per_byte(bits)))
    np.testing.assert_array_equal(signed_fields(unpack_fields(packed, bits, dim), bits), codes)


@pytest.mark.parametrize("bits", [2, 4])
def test_byte_values_row_b_plus_128_holds_the_values_of_byte_b(bits):
    values = np.arange(1 << field_bits(bits), dtype=np.float32) * 0.5 - 1  # field f -> f / 2 - 1
    table = byte_values(bits, values)
    assert table.shape == (256, codes_per_byte(bits)) and table.dtype == np.float32
    codes = np.random.default_rng(1).integers(0, 1 << field_bits(bits), (40, 12)).astype(np.int8)
    packed = pack_codes(codes, bits)
    decoded = table[packed.astype(np.int64) + 128].reshape(40, -1)  # what the program computes
    np.testing.assert_array_equal(decoded, values[codes])
    assert table[0x2F + 128].tolist() == ([values[15], values[2]] if bits == 4 else [values[3], values[3],
                                                                                      values[2], values[0]])


def test_bad_widths_are_one_line():
    with pytest.raises(ConfigError, match="bits=9 is not valid for packing"):
        field_bits(9)
    with pytest.raises(ConfigError, match="field_value needs 16 entries for 4-bit codes, got 3"):
        byte_values(4, [0, 1, 2])
