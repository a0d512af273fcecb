"""llama.cpp's K-quants as grids: a block of 256 inputs whose sub-block steps (and offsets) are integer codes of a
float16 step; our codes' bytes decode in the gguf package's own dequantizer to exactly the values they stand for;
a block worked out by hand; codes on any other steps are refused by the writer."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from qcore.errors import ConfigError  # noqa: E402
from qcore.export.gguf import block_bytes  # noqa: E402
from qcore.groupwise import K_GRIDS, factor_steps, grid_of, quantize_groups  # noqa: E402


def _theirs(q):
    """The gguf package's dequantization of our bytes, ``[K, N]``."""
    return gguf.quants.dequantize(block_bytes(q), gguf.GGMLQuantizationType[q.grid.name]).T


@pytest.mark.parametrize("grid", K_GRIDS.values(), ids=lambda g: g.name)
def test_each_k_quant_decodes_in_the_gguf_package_to_our_values(grid):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((512, 6)) * rng.uniform(0.01, 2.0, (1, 6))
    w[:256, 0] = 0.0  # a block of zeros
    w[256:288, 1] = np.abs(w[256:288, 1]) + 0.5  # a sub-block of positive values: its offset is 0
    w[:, 2] *= 100.0
    w[:, 3] = np.where(np.arange(512)[:, None] % 64 < 32, w[:, 3:4], w[:, 3:4] * 1e-3)[:, 0]  # steps 1000x apart
    clip = rng.choice([0.7, 0.9, 1.0], (512 // grid.sub, 6))
    q = quantize_groups(w, grid.bits, 256, clip=clip, family="gguf")
    assert q.grid == grid and q.group_size == grid.sub
    size, block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[grid.name]]
    assert (size, block_bytes(q).shape) == (256, (6, 2 * block))
    np.testing.assert_array_equal(_theirs(q), q.dequantize())
    assert not q.dequantize()[:256, 0].any()
    unclipped = quantize_groups(w, grid.bits, 256, family="gguf").dequantize()
    err = np.abs(unclipped - w).max(axis=0) / np.abs(w).max(axis=0)
    assert (err < {4: 0.08, 5: 0.04, 6: 0.02}[grid.bits]).all(), err  # about half a step of the largest sub-block


def test_q4_k_block_by_hand():
    # sub-block j: values s_j * q - m_j for q = 0..15 twice; s_j = sc_j / 64, m_j = mc_j / 32, so that d = 1/64
    # (the largest step, 63/64, on code 63) and dmin = 1/32 (the largest offset, 63/32, on code 63)
    sc = np.array([63, 40, 20, 10, 5, 3, 2, 1])
    mc = np.array([0, 63, 10, 20, 30, 40, 50, 60])
    q = np.tile(np.arange(16), 2)
    w = np.concatenate([s / 64 * q - m / 32 for s, m in zip(sc, mc)])[:, None]
    codes = quantize_groups(w, 4, 256, family="gguf")
    np.testing.assert_array_equal(codes.codes[:, 0], np.tile(q, 8))
    np.testing.assert_array_equal(codes.scales[:, 0], sc / 64)
    np.testing.assert_array_equal(codes.offsets[:, 0], -mc / 32)
    np.testing.assert_array_equal(codes.dequantize(), w)
    data = block_bytes(codes)[0]
    assert data.shape == (144,)
    assert data[:4].tolist() == [0x00, 0x24, 0x00, 0x28]  # float16 1/64 and 1/32, little-endian
    # scale bytes: sc[j] | (sc[j+4] >> 4) << 6, m[j] | (m[j+4] >> 4) << 6, then sc[j+4] & 15 | (m[j+4] & 15) << 4
    assert data[4:16].tolist() == [63, 40, 20, 10, 0 | 1 << 6, 63 | 2 << 6, 10 | 3 << 6, 20 | 3 << 6,
                                   5 | 14 << 4, 3 | 8 << 4, 2 | 2 << 4, 1 | 12 << 4]
    assert data[16:20].tolist() == [0 | 0 << 4, 1 | 1 << 4, 2 | 2 << 4, 3 | 3 << 4]  # u[l] low, u[32 + l] high
    np.testing.assert_array_equal(_theirs(codes), w)


def test_q6_k_puts_the_largest_sub_block_step_on_code_minus_128():
    w = np.zeros((256, 1))
    w[0, 0], w[1, 0], w[16, 0] = 3.2, -1.0, -0.5  # sub-block 0's largest magnitude is positive: its step < 0
    q = quantize_groups(w, 6, 256, family="gguf")
    assert q.codes[0, 0] == -32 and q.scales[0, 0] < 0
    d, codes = factor_steps(q.scales.T, K_GRIDS[6])
    assert d[0, 0] == np.float16(3.2 / 32 / 128) and codes[0, 0] == -128
    assert codes[0, 1] == np.rint(-0.5 / -32 / d[0, 0]) and not codes[0, 2:].any()
    np.testing.assert_array_equal(_theirs(q), q.dequantize())
    assert abs(q.dequantize()[0, 0] - 3.2) < 2e-3


def test_steps_off_the_grid_are_refused_and_k_quants_want_blocks_of_256():
    q = quantize_groups(np.random.default_rng(1).standard_normal((256, 2)), 4, 256, family="gguf")
    with pytest.raises(ConfigError, match=r"the steps are not Q4_K's \(a float16 step per block times codes 0..63\)"):
        block_bytes(dataclasses.replace(q, scales=q.scales * np.float32(1.001)))
    with pytest.raises(ConfigError, match="weight_bits=6 is the K-quant Q6_K only; use group_size=256"):
        grid_of(6, True, "gguf", 32)
    with pytest.raises(ConfigError, match=r"weight_bits=8 has no K-quant block of 256; use \[4, 5, 6\]"):
        grid_of(8, True, "gguf", 256)
    with pytest.raises(ConfigError, match="group_size=256 does not divide the 320 input channels"):
        quantize_groups(np.ones((320, 2)), 4, 256, family="gguf")
