"""The deployment-target registry, predictors per backend and format, and lean saved programs."""

from __future__ import annotations

import os

import numpy as np
import paddle
import pytest

from qcore.deploy import BACKEND_NAMES, TARGETS, available_targets, get_target, host
from qcore.deploy.onednn import NO_VNNI_PROBLEM, OneDnnTarget
from qcore.deploy.openvino import OpenVinoTarget, cache_dir
from qcore.errors import ConfigError
from qcore.graph import open_graph
from qcore.inference import create_predictor, predict
from qcore.model_io import find_model_files, load_model, save_model
from qdemo import demo_model_dir


def test_names_aliases_and_unknown_names():
    assert get_target("mkldnn") is get_target("ONEDNN") is TARGETS["onednn"]
    assert get_target(None) is TARGETS["onednn"]  # the default: oneDNN's rules, correct everywhere
    assert get_target("trt").name == "tensorrt" and get_target("paddle").name == "native"
    assert set(BACKEND_NAMES) >= {"onednn", "mkldnn", "openvino", "tensorrt", "native"}
    assert get_target("ORT").name == "onnxruntime" and get_target("ov").name == "openvino-runtime"
    with pytest.raises(ConfigError, match="valid: onednn, mkldnn, openvino"):
        get_target("coreml")
    # no GPU on CPU wheels; the ONNX runtimes come with the qcore[onnx] extra the tests install
    assert [t.name for t in available_targets()] == ["onednn", "openvino", "native", "onnxruntime", "openvino-runtime"]


def test_targets_state_their_int8_ops_as_data():
    onednn, openvino, trt = TARGETS["onednn"], TARGETS["openvino"], TARGETS["tensorrt"]
    assert "conv2d_transpose" in onednn.float_ops and "conv2d_transpose" in openvino.int8_ops
    assert openvino.int8_families == ("legacy",) and onednn.int8_families == ("legacy",)
    assert "elementwise_add" in trt.int8_ops and trt.residual_adds == "both"
    assert TARGETS["native"].int8_families == ()  # nothing runs int8: the simulation is exact


@pytest.mark.parametrize("family", ["legacy", "pir"])
def test_float_models_run_alike_on_every_cpu_backend(family):
    files = find_model_files(demo_model_dir(family))
    x = np.random.default_rng(0).standard_normal((4, 1, 28, 28)).astype("float32")
    expected = load_model(files).run({"image": x})[0]
    backends = ["onednn", "native"] + (["openvino"] if family == "legacy" else [])
    for backend in backends:
        np.testing.assert_allclose(predict(files, {"image": x}, backend=backend)[0], expected, atol=1e-4)
    assert predict(files.directory, {"image": x}, onednn=False)[0].shape == expected.shape  # old keywords


def test_openvino_takes_every_legacy_layout_and_caches_outside_the_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QCORE_OPENVINO_CACHE", str(tmp_path / "cache"))
    model = load_model(demo_model_dir("legacy"))
    x = np.random.default_rng(1).standard_normal((2, 1, 28, 28)).astype("float32")
    expected = model.run({"image": x})[0]
    for name, params in [("__model__", "__params__"), ("__model__", None)]:
        files = save_model(model, tmp_path / f"out_{params}", name, params)
        np.testing.assert_allclose(predict(files, {"image": x}, backend="openvino")[0], expected, atol=1e-4)
    assert not (tmp_path / "__cache__").exists() and any(cache_dir().iterdir())


def test_backends_that_cannot_run_say_why():
    with pytest.raises(ConfigError, match="tensorrt.*no CUDA"):
        create_predictor(demo_model_dir("legacy"), backend="tensorrt")
    with pytest.raises(ConfigError, match="OpenVINO engine does not convert PIR"):
        create_predictor(demo_model_dir("pir"), backend="openvino")


def test_saved_programs_carry_no_call_stacks(tmp_path):
    model = load_model(demo_model_dir("legacy"))
    assert any(op.desc.has_attr("op_callstack") for op in model.program.global_block().ops)
    files = save_model(model, tmp_path / "out")
    assert files.model_file.stat().st_size < model.source.model_file.stat().st_size
    saved = load_model(files)
    assert not any(op.desc.has_attr("op_callstack") for op in saved.program.global_block().ops)
    assert any(op.desc.has_attr("op_callstack") for op in model.program.global_block().ops)  # input untouched


def _cpuinfo(tmp_path, flags: str):
    path = tmp_path / f"cpuinfo-{abs(hash(flags))}"
    path.write_text(f"processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 {flags}\n\n")
    return path


def test_the_host_saturates_int8_pairs_only_on_x86_without_vnni(tmp_path, monkeypatch):
    monkeypatch.setattr(host.platform, "machine", lambda: "x86_64")
    assert host.int8_pairs_saturate(_cpuinfo(tmp_path, "avx avx2 fma"))
    assert not host.int8_pairs_saturate(_cpuinfo(tmp_path, "avx2 avx512f avx512_vnni"))
    assert not host.int8_pairs_saturate(_cpuinfo(tmp_path, "avx2 avx_vnni"))
    assert not host.int8_pairs_saturate(tmp_path / "missing")
    monkeypatch.setattr(host.platform, "machine", lambda: "aarch64")
    assert not host.int8_pairs_saturate(_cpuinfo(tmp_path, "asimd"))


def test_the_cpu_class_and_its_int8_and_bf16_facts_come_from_the_flags(tmp_path, monkeypatch):
    monkeypatch.setattr(host.platform, "machine", lambda: "x86_64")
    zen4 = _cpuinfo(tmp_path, "avx2 fma avx512f avx512bw avx512_vnni avx512_bf16")
    zen3 = _cpuinfo(tmp_path, "avx2 fma")
    alder = _cpuinfo(tmp_path, "avx2 fma avx_vnni")
    cascade = _cpuinfo(tmp_path, "avx2 fma avx512f avx512_vnni")
    skylake = _cpuinfo(tmp_path, "avx2 fma avx512f")
    assert [host.cpu_class(p) for p in (zen4, zen3, alder, cascade, skylake)] == [
        "AVX-512 VNNI/BF16", "AVX2 only", "AVX2 VNNI", "AVX-512 VNNI", "AVX-512 (no VNNI)"]
    assert [host.has_vnni(p) for p in (zen4, zen3, alder, cascade, skylake)] == [True, False, True, True, False]
    assert [host.has_bf16(p) for p in (zen4, zen3, alder, cascade, skylake)] == [True, False, False, False, False]
    assert host.describe_cpu(zen3).endswith(f"AVX2 only, {os.cpu_count()} cores (avx2 fma)")
    assert "avx512_vnni avx512_bf16)" in host.describe_cpu(zen4)
    monkeypatch.setattr(host.platform, "machine", lambda: "aarch64")
    arm = _cpuinfo(tmp_path, "asimd avx512_vnni")  # flags of a non-x86 machine are not read as x86 ones
    assert host.cpu_class(arm) == "aarch64" and not host.has_vnni(arm)


def test_cpu_targets_keep_weight_codes_within_64_when_the_fix_is_on(monkeypatch):
    assert OpenVinoTarget(overflow_fix=True).weight_max_code(8, "legacy") == 64
    assert OpenVinoTarget(overflow_fix=False).weight_max_code(8, "legacy") is None
    assert OpenVinoTarget(overflow_fix=True).weight_max_code(4, "legacy") is None  # 4-bit pairs cannot overflow
    assert OpenVinoTarget(overflow_fix=True).weight_max_code(8, "pir") is None  # PIR runs float kernels
    assert OneDnnTarget(overflow_fix=True).weight_max_code(8, "legacy") == 64
    for name in ("tensorrt", "native"):  # GPU dp4a and float kernels add in int32 / float
        assert get_target(name).weight_max_code(8, "legacy") is None
    monkeypatch.setenv(host.OVERFLOW_FIX_ENV, "1")
    assert get_target("openvino").weight_max_code(8, "legacy") == 64
    monkeypatch.setenv(host.OVERFLOW_FIX_ENV, "0")
    assert get_target(None).weight_max_code(8, "legacy") is None
    monkeypatch.setenv(host.OVERFLOW_FIX_ENV, "yes")
    with pytest.raises(ConfigError, match="QCORE_OVERFLOW_FIX='yes': set it to 1"):
        get_target("openvino").weight_max_code(8, "legacy")


def test_weight_codes_bounded_by_max_code_still_represent_the_weight():
    model = load_model(demo_model_dir())
    graph = open_graph(model)
    op = graph.ops(["conv2d"])[0]
    weight = graph.weight_operand(op)
    w = graph.get_param(weight.name)
    stored = graph.quantize_weight(weight, 8, 0, max_code=64)
    per_channel = np.abs(w).reshape(w.shape[0], -1).max(axis=1)
    np.testing.assert_allclose(stored.thresholds, per_channel * 127 / 64, rtol=1e-6)
    assert np.abs(stored.codes).max() == 64
    step = (per_channel / 64).reshape(-1, 1, 1, 1)
    assert (np.abs(stored.dequantized() - w) <= step / 2 + 1e-7).all()  # half a (coarser) step


class _Joins(paddle.nn.Layer):
    """A residual add read by a LayerNorm, one read by a ReLU, and an attention-bias chain into a softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = paddle.nn.Linear(8, 8)
        self.norm = paddle.nn.LayerNorm(8)
        self.relative = self.create_parameter([1, 2, 4, 4])

    def forward(self, x: paddle.Tensor, mask: paddle.Tensor) -> paddle.Tensor:
        y = self.fc(x)
        normed = self.norm(y + x)  # post-LayerNorm residual: float
        plain = paddle.nn.functional.relu(y + normed)  # a CNN-style join: int8
        q = plain.reshape([0, 4, 2, 4]).transpose([0, 2, 1, 3])
        mask_bias = ((1.0 - mask) * -10000.0).unsqueeze([1, 2])
        bias = paddle.nn.functional.relu(self.relative) + mask_bias  # read by a join only
        scores = paddle.matmul(q, q, transpose_y=True) * 0.5 + bias  # read by the softmax: float
        return paddle.nn.functional.softmax(scores, -1).sum([1, 2, 3])


def test_int8_joins_keep_only_joins_an_int8_kernel_reads(tmp_path):
    """PIR only: Paddle 3.3.1's legacy jit.save cannot export paddle.matmul of two activations (_C_ops dispatch)."""
    from qcore.deploy.base import int8_joins, residual_joins
    from qcore.graph import open_graph
    from qcore.model_io import export_layer, load_model

    paddle.disable_static()
    paddle.seed(0)
    spec = [paddle.static.InputSpec([None, 4, 8], "float32", "x"), paddle.static.InputSpec([None, 4], "float32", "m")]
    export_layer(_Joins(), tmp_path / "m" / "inference", spec, "pir")
    graph = open_graph(load_model(tmp_path / "m"))
    joins = residual_joins(graph)
    kept = int8_joins(graph)
    assert len(joins) == 4  # y + x, y + normed, relative + mask, scores + bias
    assert len(kept) == 1  # only the join the ReLU reads
    readers = graph.readers([t.op for t in kept])
    assert [r.op.type.split(".")[-1] for r in readers[id(kept[0].op.raw)]] == ["relu"]


@pytest.mark.parametrize("flags", [frozenset({"avx2", "fma"}), frozenset({"avx2", "avx512f", "avx512_vnni"})],
                         ids=["avx2-only", "vnni"])
def test_a_onednn_predictor_for_a_quantized_model_warns_exactly_where_int8_pairs_saturate(tmp_path, monkeypatch, flags):
    """What an AVX2-only user sees from oneDNN, checked on any machine by replacing the CPU flags."""
    import warnings

    monkeypatch.setattr(host, "cpu_flags", lambda cpuinfo=None: flags)
    files = find_model_files(demo_model_dir("legacy"))
    model = load_model(files)
    graph = open_graph(model)
    conv = graph.ops(["conv2d"])[0]
    graph.quantize_weight(graph.weight_operand(conv), 8, graph.weight_channel_axis(conv))
    graph.insert_act_qdq(graph.activation_operands(conv)[0], 1.0, 8)
    quantized = graph.save(tmp_path / "q")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        create_predictor(quantized, backend="onednn")
        create_predictor(files, backend="onednn")  # a float model: nothing to warn about
    messages = [str(w.message) for w in seen if "VNNI" in str(w.message)]
    assert len(messages) == (0 if "avx512_vnni" in flags else 1)
    if messages:
        assert messages[0].endswith(NO_VNNI_PROBLEM) and str(quantized.model_file) in messages[0]
