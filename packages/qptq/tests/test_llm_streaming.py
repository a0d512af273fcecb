"""Layer-by-layer quantization (:mod:`qptq.llm.streaming`) against the whole model in memory, and the exact
Hessians and rank shares it rests on (:mod:`qptq.weight_only.hessian`, :func:`qptq.weight_only.plan.owners`)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import paddle
import pytest

pytest.importorskip("gguf")
pytest.importorskip("safetensors")

from qdemo.testing import save_tiny_llama_gguf, save_tiny_paddlenlp_checkpoint  # noqa: E402
from qptq.llm import gemma3, llama  # noqa: E402
from qptq.llm.config import Gemma3Config  # noqa: E402
from qptq.llm.paddlenlp import load_checkpoint  # noqa: E402
from qptq.llm.sources import open_source  # noqa: E402
from qptq.llm.streaming import quantize_streaming  # noqa: E402
from qptq.weight_only import WeightOnlyConfig, quantize_  # noqa: E402
from qptq.weight_only.gptq import inverse_cholesky  # noqa: E402
from qptq.weight_only.hessian import HessianAccumulator, InputRange, fixed_point_bits  # noqa: E402
from qptq.weight_only.plan import owners  # noqa: E402

GPTQ = WeightOnlyConfig(bits=4, group_size=32, algo="gptq", clip_search=True, sequential=True, embedding_bits=8)


def windows(vocab: int, count: int = 4, length: int = 24, seed: int = 5) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, (1, length)).astype(np.int64) for _ in range(count)]


# -- exact Hessians -----------------------------------------------------------------------------------------------

def test_fixed_point_bits_keep_every_sum_below_two_to_the_53():
    assert fixed_point_bits(1) == 24  # a float32's significand: more would add nothing
    assert fixed_point_bits(16384) == 19  # 2**14 rows of products below 2**38
    for rows in (3, 1000, 16384, 10**6):
        assert rows * 4 ** fixed_point_bits(rows) <= 2 ** 53


def test_an_exact_hessian_is_the_same_bits_whatever_the_order_and_split_of_its_rows():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((600, 24)) * np.linspace(0.01, 30, 24)).astype(np.float32)  # channels of all scales
    span = InputRange(24)
    span.update(x)
    whole = HessianAccumulator(24, span)
    whole.update(x)
    parts = [HessianAccumulator(24, span) for _ in range(3)]  # three "ranks", rows shuffled, uneven batches
    order = rng.permutation(600)
    for i, lo in enumerate(range(0, 600, 70)):
        parts[i % 3].update(x[order[lo: lo + 70]])
    summed = HessianAccumulator(24, span)
    summed.sum = parts[2].sum + parts[0].sum + parts[1].sum
    summed.rows = 600
    assert np.array_equal(whole.hessian(), summed.hessian())
    exact = 2 * x.astype(np.float64).T @ x.astype(np.float64) / 600
    np.testing.assert_allclose(whole.hessian(), exact, rtol=1e-5, atol=1e-6 * np.abs(exact).max())


def test_the_sum_grows_in_place_by_the_exact_products():
    """Batches are added into the one [K, K] float64 sum (no temporary of its size: 640 MB at K = 8960), and on
    fixed-point inputs the sum is the exact integer one."""
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((90, 300)) * np.linspace(0.1, 9, 300)).astype(np.float32)
    span = InputRange(300)
    span.update(x)
    acc = HessianAccumulator(300, span)
    held = acc.sum
    acc.update(x[:40])
    acc.update(x[40:])
    assert np.shares_memory(acc.sum, held) and acc.sum.flags.c_contiguous
    fixed = np.rint(x.astype(np.float64) / acc.step)
    assert np.array_equal(acc.sum, fixed.T @ fixed)  # integers below 2**53: any order of sums gives these


def test_an_exact_hessian_refuses_rows_its_range_did_not_count():
    span = InputRange(4)
    span.update(np.ones((3, 4), np.float32))
    acc = HessianAccumulator(4, span)
    with pytest.raises(Exception, match="more calibration rows"):
        acc.update(np.ones((5, 4), np.float32))


def test_the_inverse_cholesky_factor_is_upper_and_inverts_the_hessian():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((80, 40))
    h = a.T @ a + np.eye(40)
    u = inverse_cholesky(h)
    assert np.array_equal(u, np.triu(u))
    np.testing.assert_allclose(u.T @ u, np.linalg.inv(h), atol=1e-12)
    np.testing.assert_allclose(u, np.linalg.cholesky(np.linalg.inv(h)).T, atol=1e-12)


def test_the_float32_factor_over_several_factor_blocks_matches_float64():
    """GPTQ factors in float32 (half float64's time); across block edges it keeps float32's precision."""
    from qptq.weight_only.gptq import FACTOR_BLOCK
    rng = np.random.default_rng(2)
    k = 2 * FACTOR_BLOCK + 88
    a = rng.standard_normal((3 * k, k)) * rng.uniform(0.2, 3.0, k)
    h = a.T @ a / len(a) + 0.01 * np.eye(k)
    exact = np.linalg.cholesky(np.linalg.inv(h)).T
    u = inverse_cholesky(h, np.float32)
    assert u.dtype == np.float32 and np.array_equal(u, np.triu(u))
    assert np.max(np.abs(u - exact)) < 1e-4 * np.max(np.abs(exact))


def test_jobs_go_to_the_least_loaded_rank_largest_first():
    assert owners([5.0, 1.0, 4.0, 3.0], 2) == [0, 0, 1, 1]  # 5 -> r0, 4 -> r1, 3 -> r1 (4 < 5), 1 -> r0 (5 < 7)
    assert owners([1.0, 1.0, 1.0], 1) == [0, 0, 0]
    assert owners([2.0, 2.0], 3) == [0, 1]


# -- streaming equals the whole model ----------------------------------------------------------------------------

class DictSource:
    """A decoder's parameters from memory: the smallest TensorSource."""

    def __init__(self, cfg, state):
        self.config, self.state, self.reads = cfg, state, []

    def tensor(self, name):
        self.reads.append(name)
        return self.state[name]


def codes_by_layer(result):
    return {layer.name: result.codes[layer.weight] for layer in result.layers}


def assert_same_codes(streamed, whole):
    a, b = codes_by_layer(streamed), codes_by_layer(whole)
    assert list(a) == list(b)
    for name in a:
        for field in ("codes", "scales", "zero_points", "offsets"):
            x, y = getattr(a[name], field), getattr(b[name], field)
            assert (x is None and y is None) or np.array_equal(x, y), (name, field)


def stream_and_whole(source, model, config, ids):
    probe = ids[0][:, :16]
    done = quantize_streaming(source, config, ids, probe)
    result = quantize_(model, config, ids)
    with paddle.no_grad():
        logits = model(paddle.to_tensor(probe))[0].numpy()[0]
    return done, result, logits


@pytest.mark.parametrize("sequential", [True, False])
def test_a_gguf_llama_streamed_gets_the_whole_models_codes_and_logits(tmp_path, sequential):
    path = save_tiny_llama_gguf(tmp_path / "tiny.gguf", layers=3)
    model, _ = llama.load_gguf(path)
    config = replace(GPTQ, sequential=sequential)
    done, whole, logits = stream_and_whole(open_source(path), model, config, windows(model.cfg.vocab_size))
    assert_same_codes(done.result, whole)
    np.testing.assert_array_equal(done.probe_logits, logits)
    # the writers' view holds no quantized linear: those are codes only
    assert not any("proj" in name for name in done.model.state)
    assert done.result.calibration_seconds > 0 and done.result.math_seconds > 0


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_paddlenlp_checkpoint_streamed_gets_the_whole_models_codes(tmp_path, family):
    directory = save_tiny_paddlenlp_checkpoint(tmp_path / "ckpt", family, weights="safetensors", shards=2, layers=3)
    model, _, _ = load_checkpoint(directory)
    done, whole, logits = stream_and_whole(open_source(directory), model, GPTQ, windows(model.cfg.vocab_size))
    assert_same_codes(done.result, whole)
    np.testing.assert_array_equal(done.probe_logits, logits)
    assert {"norm.weight", "embed_tokens.weight"} <= set(done.model.state)
    if model.cfg.qkv_bias:
        assert "layers.0.attn.q_proj.bias" in done.model.state
    if not model.cfg.tie_embeddings:  # the untied head: calibrated on the last hidden states, coded
        assert "lm_head" in codes_by_layer(done.result) and "lm_head.weight" not in done.model.state


def test_gemma3_layers_stream_with_their_windows_and_rotary_bases():
    cfg = Gemma3Config(vocab_size=97, hidden_size=64, intermediate_size=96, num_layers=3, num_heads=4,
                       num_kv_heads=2, head_dim=16, rope_theta=1e6, rms_eps=1e-6, context_length=128,
                       sliding_window=4, global_every=3, local_rope_theta=1e4)
    paddle.seed(0)
    model = gemma3.Gemma3(cfg)
    model.eval()
    state = {n: v.numpy() * 0.5 for n, v in model.state_dict().items()}  # random init, smaller
    llama.load_state(model, state)
    source = DictSource(cfg, {n: v.copy() for n, v in state.items()})
    done, whole, logits = stream_and_whole(source, model, GPTQ, windows(cfg.vocab_size, length=12))
    assert_same_codes(done.result, whole)
    np.testing.assert_allclose(done.probe_logits, logits, rtol=0, atol=1e-5 * np.abs(logits).max())
    # read layer by layer, in order, each parameter once; the table once (coded up front, its rows dequantized
    # from the codes at the end)
    layers = [int(n.split(".")[1]) for n in source.reads if n.startswith("layers.")]
    assert layers == sorted(layers) and len(layers) == len(set(source.reads) - {"embed_tokens.weight",
                                                                                  "norm.weight"})
    assert source.reads.count("embed_tokens.weight") == 1


def test_quant_post_dynamic_takes_a_checkpoint_directory_and_streams_it(tmp_path):
    onnx = pytest.importorskip("onnx")
    from qcore.errors import ConfigError
    from qcore.export.external_data import ALIGN, THRESHOLD
    from qptq import quant_post_dynamic

    directory = save_tiny_paddlenlp_checkpoint(tmp_path / "ckpt", "qwen2", weights="safetensors", shards=2)
    with pytest.raises(ConfigError, match="format='onnxruntime-genai'"):
        quant_post_dynamic(directory, tmp_path / "none", weight_bits=4)
    assert not (tmp_path / "none").exists()
    report = quant_post_dynamic(directory, tmp_path / "new" / "ort", weight_bits=4, group_size=32, algo="gptq",
                                format="onnxruntime-genai", calibration=np.arange(3, 259).reshape(2, 128))
    assert (report.output / "model.onnx").is_file() and report.format == "onnxruntime-genai"
    assert {layer.bits for layer in report.result.layers} == {4}
    # the writer put every weight's bytes in model.onnx.data as it went: the graph holds references only
    graph = onnx.load(str(report.output / "model.onnx"), load_external_data=False).graph
    assert all(len(t.raw_data) < THRESHOLD for t in graph.initializer)
    external = [t for t in graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert {t.name for t in external} >= {f"layers.{i}.mlp.down_proj.weight.nbits.B" for i in range(2)}
    spans = [(int(e["offset"]), int(e["length"])) for e in ({e.key: e.value for e in t.external_data}
                                                              for t in external)]
    assert all(offset % ALIGN == 0 for offset, _ in spans)
    assert max(o + n for o, n in spans) == (report.output / "model.onnx.data").stat().st_size
    assert not list(tmp_path.glob(".codes-*"))  # the spilled codes are gone once written
