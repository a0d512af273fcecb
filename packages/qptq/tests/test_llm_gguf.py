"""GGUF for llama.cpp: every block type's bytes decode (by the gguf package's own reader) to exactly the values
our codes stand for; a tiny Llama made here, quantized on GGUF grids and written with its source's metadata and
tokenizer, reads back as exactly the simulated model; llama.cpp (when installed) computes our simulation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")
gguf = pytest.importorskip("gguf")

from qcore.errors import ConfigError  # noqa: E402
from qcore.export.gguf import block_bytes, write_gguf  # noqa: E402
from qcore.groupwise import GGUF_GRIDS, quantize_groups  # noqa: E402
from qdemo.testing import save_tiny_llama_gguf  # noqa: E402
from qptq.llm.config import DecoderConfig  # noqa: E402
from qptq.llm.gguf_export import save_gguf  # noqa: E402
from qptq.llm.gguf_weights import read_gguf  # noqa: E402
from qptq.llm.llama import load_gguf  # noqa: E402
from qptq.weight_only import WeightOnlyConfig, quantize_  # noqa: E402

# qdemo's tiny Llama: every width a multiple of GGUF's 32-wide blocks
CFG = DecoderConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=16, rope_theta=10000.0, rms_eps=1e-5, context_length=256)


@pytest.mark.parametrize("grid", sorted({g.name: g for g in GGUF_GRIDS.values()}.values(), key=lambda g: g.name),
                         ids=lambda g: g.name)
def test_each_block_type_decodes_in_the_gguf_package_to_our_values(grid):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((96, 5)) * rng.uniform(0.01, 2.0, (1, 5))
    w[:32, 0] = 0.0  # a block of zeros
    w[32:64, 1] = np.abs(w[32:64, 1]) + 0.5  # a block whose values are all positive: Q*_1's offset is its minimum
    q = quantize_groups(w, grid.bits, 32, grid.name.endswith("_0"), family="gguf")
    assert q.grid == grid
    data = block_bytes(q)
    size, block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[grid.name]]
    assert data.shape == (5, 96 // size * block)
    theirs = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[grid.name])  # [N, K]
    np.testing.assert_array_equal(theirs, q.dequantize().T)
    assert not theirs[0, :32].any()
    err = np.abs(q.dequantize() - w).max(axis=0) / np.abs(w).max(axis=0)
    assert (err < {4: 0.15, 5: 0.07, 8: 0.005}[grid.bits]).all(), err  # about half a step of the largest block


def test_q4_0_codes_by_hand():
    w = np.zeros((32, 1))
    w[:4, 0] = [0.8, -0.4, 0.1, -0.8]  # largest magnitude 0.8 (positive first): step 0.8 / -8 = -0.1
    q = quantize_groups(w, 4, 32, True, family="gguf")
    assert q.scales[0, 0] == np.float32(np.float16(-0.1))
    np.testing.assert_array_equal(q.codes[:4, 0], [-8, 4, -1, 7])  # -0.8 / -0.1 = 8 clips to 7
    byte0 = block_bytes(q)[0, 2]  # after the 2 bytes of d: code 0 (+8 = 0) low nibble, code 16 (+8 = 8) high
    assert byte0 == 0 | (8 << 4)


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """The source GGUF, the model read from it, its float logits, and a Q4_0 copy (GPTQ + clip search, Q8_0 table)
    with its logits and the GGUF written from it."""
    tmp = tmp_path_factory.mktemp("gguf")
    rng = np.random.default_rng(1)
    source = save_tiny_llama_gguf(tmp / "source.gguf")
    model, _ = load_gguf(source)
    assert model.cfg == dataclasses.replace(CFG, rms_eps=float(np.float32(1e-5)))  # GGUF stores float32
    ids = rng.integers(3, CFG.vocab_size, (1, 48))
    with paddle.no_grad():
        float_logits = model(paddle.to_tensor(ids))[0].numpy()
    calib = [rng.integers(3, CFG.vocab_size, (1, 64)) for _ in range(8)]
    config = WeightOnlyConfig(bits=4, group_size=32, symmetric=True, grid="gguf", algo="gptq", clip_search=True,
                              embedding_bits=8)
    result = quantize_(model, config, calib)
    with paddle.no_grad():
        sim_logits = model(paddle.to_tensor(ids))[0].numpy()
    out = save_gguf(model, result, source, tmp / "q4_0.gguf")
    return source, model, result, out, ids, float_logits, sim_logits


def test_the_written_gguf_is_exactly_the_simulated_model(quantized, assert_gguf_is_simulation):
    source, model, result, out, ids, float_logits, sim_logits = quantized
    back = read_gguf(out)
    assert back.metadata["general.architecture"] == "llama" and back.metadata["general.file_type"] == 2  # Q4_0
    assert back.metadata["tokenizer.ggml.tokens"] == read_gguf(source).metadata["tokenizer.ggml.tokens"]
    assert back.storage["blk.0.attn_q.weight"] == "Q4_0" and back.storage["token_embd.weight"] == "Q8_0"
    assert back.storage["blk.1.ffn_norm.weight"] == "F32"
    assert {r.bits for r in result.layers} == {4, 8} and len(result.layers) == 7 * CFG.num_layers + 1
    assert_gguf_is_simulation(out, model, ids, sim_logits, float_logits)
    assert out.stat().st_size < 0.3 * source.stat().st_size


def test_bad_gguf_writes_are_one_line_and_leave_nothing(quantized, tmp_path):
    source, model, result, *_ = quantized
    target = tmp_path / "x.gguf"
    with pytest.raises(ConfigError, match="'blk.9.attn_q.weight' is not a tensor of"):
        write_gguf(target, source, {"blk.9.attn_q.weight": np.zeros((64, 64), np.float32)})
    with pytest.raises(ConfigError, match=r"blk.0.attn_q.weight is \[64, 64\] in .*; the values given are \[64, 32\]"):
        write_gguf(target, source, {"blk.0.attn_q.weight": np.zeros((64, 32), np.float32)})
    int_codes = quantize_groups(np.ones((64, 64)), 4, 32)
    with pytest.raises(ConfigError, match="codes on the uint4 grid are not a GGUF block type"):
        write_gguf(target, source, {"blk.0.attn_q.weight": int_codes})
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ConfigError, match=r"GGUF blocks hold 32 input channels, or 256 for the K-quants; use "
                                          r"group_size=32 or 256 \(got 128\)"):
        WeightOnlyConfig(bits=4, group_size=128, grid="gguf")
    with pytest.raises(ConfigError, match="awq=True divides each linear's input by scales a GGUF file cannot hold"):
        WeightOnlyConfig(bits=4, group_size=32, grid="gguf", awq=True)


def test_llama_cpp_computes_our_simulation(quantized, llama_cpp_deviation):
    source, model, result, out, ids, float_logits, sim_logits = quantized
    deployed_error, quantization_error, top1 = llama_cpp_deviation(out, ids, sim_logits, float_logits)
    # llama.cpp multiplies Q4_0 weights by activations it quantizes to 8 bits: small against what the 4-bit
    # weights themselves change, and far from the float model's logits
    assert deployed_error < 0.2 * quantization_error, (deployed_error, quantization_error)
    assert top1 >= 0.95


def test_the_writer_makes_and_drops_one_tensor_at_a_time(quantized, tmp_path):
    """The GGUF is written a tensor at a time from a mapping that makes its values when read: no more than one
    made value is alive at once, and the bytes equal those written from the values held all at once."""
    import weakref
    from collections.abc import Mapping

    from qptq.llm.gguf_export import GGUFTensors

    source, model, result, out, *_ = quantized
    tensors = GGUFTensors(model, result)

    class Counted(Mapping):
        def __init__(self):
            self.alive, self.most = 0, 0

        def __getitem__(self, key):
            value = tensors[key]
            value = value.copy() if isinstance(value, np.ndarray) else dataclasses.replace(value)
            self.alive += 1
            self.most = max(self.most, self.alive)
            weakref.finalize(value, self._dropped)
            return value

        def _dropped(self):
            self.alive -= 1

        def __iter__(self):
            return iter(tensors)

        def __len__(self):
            return len(tensors)

    counted = Counted()
    streamed = write_gguf(tmp_path / "streamed.gguf", source, counted)
    assert counted.most == 1
    held = write_gguf(tmp_path / "held.gguf", source, dict(tensors.items()))
    assert streamed.read_bytes() == held.read_bytes() == out.read_bytes()
