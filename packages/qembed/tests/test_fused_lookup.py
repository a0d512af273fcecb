"""The compiled lookup (qembed.ext): the shipped library (a platform wheel's) or this machine's build, equal bit for
bit to the op sequence and to the numpy rows in both IRs, pooled forms, every code path giving the same bits, and
the fallback where the op is not available."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import paddle
import pytest

from qcore.errors import ConfigError
from qcore.inference import predict
from qcore.model_io import load_model
from qcore.packing import byte_values, pack_codes
from qdemo.testing import save_tiny_net
from qembed import ext, quant_embedding_model, quantize_table
from qembed.program import FUSED, OP_SEQUENCE
from qembed.table import choose_table_quantization

ROWS, DIM, BAG = 300, 7, 5  # an odd dim: the last packed byte of a row is not full
SCHEMES = {
    "int8-one-scale": {},
    "int8-per-row": {"per_row": True},
    "int6-per-row": {"quantize_bits": 6, "per_row": True},
    "int4-packed": {"quantize_bits": 4, "per_row": True, "asymmetric": False},
    "int4-one-scale-packed": {"quantize_bits": 4},
    "int4-offsets-packed": {"quantize_bits": 4, "per_row": True, "asymmetric": True},
    "int3-offsets-packed": {"quantize_bits": 3, "per_row": True, "asymmetric": True},
    "int2-offsets-packed": {"quantize_bits": 2, "per_row": True, "asymmetric": True},
    "log4-packed": {"quantize_type": "log", "quantize_bits": 4, "per_row": True},
    "log8": {"quantize_type": "log", "per_row": True},
}
HALF = {"scale_dtype": "float16"}  # per-row scales (and offsets) stored float16
SCHEMES |= {f"{name}-fp16": {**SCHEMES[name], **HALF} for name in (
    "int8-one-scale", "int8-per-row", "int4-packed", "int4-offsets-packed", "int2-offsets-packed", "log8")}
# Log values: the op's come from a table computed in float64 and rounded, as the packed sequence's do; the unpacked
# sequence computes exp in float32 (a few float32 steps off), numpy multiplies by the scale in float64 (one step).
LOG = ("log4-packed", "log8", "log8-fp16")


class Rows(paddle.nn.Layer):
    """ids [batch, BAG] -> their rows (id 0 is padding: zero rows)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = paddle.nn.Embedding(ROWS, DIM, padding_idx=0)

    def forward(self, ids: paddle.Tensor) -> paddle.Tensor:
        return self.emb(ids)


@pytest.fixture(autouse=True)
def _dynamic_afterwards():
    yield
    paddle.disable_static()


def hide_the_op(monkeypatch: pytest.MonkeyPatch, directory) -> None:
    """Act as a machine with neither the shipped library nor a build (a registered op stays registered in this
    process: it cannot be unloaded)."""
    monkeypatch.setenv(ext.DIR_ENV, str(directory))
    monkeypatch.setattr(ext, "SHIPPED", directory / "lib" / ext.SHIPPED.name)
    monkeypatch.setattr(ext, "MANIFEST", directory / "lib" / ext.MANIFEST.name)
    monkeypatch.setattr(ext, "_registered", None)


@pytest.fixture
def not_built(tmp_path, monkeypatch):
    """A machine without the op."""
    hide_the_op(monkeypatch, tmp_path / "empty")


@pytest.fixture(scope="module")
def table() -> np.ndarray:
    values = np.random.default_rng(0).normal(0, 0.1, (ROWS, DIM)).astype(np.float32)
    values[1:10] *= 8  # hot rows of large norm
    values[0] = 0
    return values


@pytest.fixture(scope="module")
def ids() -> np.ndarray:
    batch = np.random.default_rng(1).integers(1, ROWS, (6, BAG)).astype(np.int64)
    batch[1, 2:] = 0  # a short list, padded
    batch[3] = 0  # an empty list
    batch[4, 0] = ROWS - 1
    return batch


@pytest.fixture(scope="module", params=["pir", "legacy_pdmodel"])
def rows_model(request, table, tmp_path_factory):
    paddle.disable_static()
    net = Rows()
    net.emb.weight.set_value(table)
    net.eval()
    directory = tmp_path_factory.mktemp("rows") / request.param
    spec = [paddle.static.InputSpec([None, BAG], "int64", "ids")]
    return directory, save_tiny_net(net, directory, request.param, spec)


def test_build_is_cached_per_machine_and_atomic(tmp_path, monkeypatch):
    if ext.compiler() is None:
        pytest.skip("no C++ compiler")
    monkeypatch.setenv(ext.DIR_ENV, str(tmp_path))
    built = ext.build()
    assert built.is_file() and built.parent == tmp_path and ext.library_path() == built
    stamp = built.stat().st_mtime_ns
    assert ext.build() == built and built.stat().st_mtime_ns == stamp  # built once
    assert not [p for p in built.parent.iterdir() if p.name.endswith(".tmp")]


def test_the_op_runs_the_widest_code_path_this_cpu_has(built):
    from qcore.deploy.host import cpu_flags

    flags = set(cpu_flags() or ())
    widest = ("avx512" if {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags else
              "avx2" if "avx2" in flags else "x86-64")
    assert ext.isa() == widest


@pytest.mark.parametrize("scheme", SCHEMES)
def test_fused_equals_the_op_sequence_and_the_numpy_rows(built, rows_model, ids, tmp_path, scheme):
    directory, kwargs = rows_model
    config = SCHEMES[scheme]
    seq_files, (seq,) = quant_embedding_model(directory, tmp_path / "seq", {**config, "fused_lookup": False},
                                              **kwargs)
    files, (report,) = quant_embedding_model(directory, tmp_path / "fused", {**config, "fused_lookup": True},
                                             **kwargs)
    assert (seq.lookup, report.lookup) == (OP_SEQUENCE, FUSED)
    assert b"qembed_lookup" in files.model_file.read_bytes()
    assert report.quantized_bytes == seq.quantized_bytes
    q = report.choice.table
    expected = np.where((ids == 0)[..., None], np.float32(0), q.rows(ids))
    sequence = load_model(seq_files).run({"ids": ids})[0]
    for got in (load_model(files).run({"ids": ids})[0], predict(files, {"ids": ids})[0]):
        assert got.shape == (len(ids), BAG, DIM)
        if scheme.startswith("log8"):
            np.testing.assert_allclose(got, sequence, rtol=1e-6, atol=0)
        else:
            np.testing.assert_array_equal(got, sequence)
        if scheme in LOG:
            np.testing.assert_allclose(got, expected, rtol=2e-7, atol=0)
        else:
            np.testing.assert_array_equal(got, expected)
    assert np.count_nonzero(got[3]) == 0 and np.count_nonzero(got[1, 2:]) == 0  # padding rows are zeros


def _op_inputs(q, bits: int) -> list:
    """The op's tensors for the numpy table ``q`` (what quant_embedding stores)."""
    scale = q.scales.reshape(-1, 1) if q.per_row else q.scales[:1]
    offset = None if q.offsets is None else paddle.to_tensor(q.offsets.reshape(-1, 1))
    if bits > 4:
        return [paddle.to_tensor(q.codes), paddle.to_tensor(scale), offset, None, 1]
    fields = np.arange(4 if bits <= 2 else 16)
    values = fields if q.offsets is not None else np.where(fields >= len(fields) // 2, fields - len(fields), fields)
    lut = byte_values(bits, values.astype(np.float32))
    return [paddle.to_tensor(pack_codes(q.codes, bits)), paddle.to_tensor(scale), offset, paddle.to_tensor(lut),
            lut.shape[1]]


# (bits, per_row, asymmetric, scale_dtype): every branch of the kernel (one scale, per row, offsets, packed)
FORMS = [(8, False, False, "float32"), (8, True, False, "float32"), (4, True, False, "float32"),
         (4, True, True, "float32"), (2, True, True, "float32"), (8, True, False, "float16"),
         (4, True, True, "float16"), (2, True, True, "float16")]
POOLINGS = ("none", "sum", "mean", "sqrt_mean")


def op_outputs() -> dict[str, np.ndarray]:
    """The loaded op's output for every form and pooling on a table whose rows are wider than an AVX-512 register
    and not a multiple of one (vector loops and their tails), and the code path that computed them."""
    paddle.disable_static()
    rng = np.random.default_rng(5)
    table = (rng.normal(0, 0.1, (64, 71)) * rng.lognormal(0, 1, (64, 1))).astype(np.float32)
    ids = rng.integers(0, 64, (9, 11)).astype(np.int64)
    outputs = {"isa": np.array(ext.isa())}
    for bits, per_row, asymmetric, scale_dtype in FORMS:
        q = choose_table_quantization(table, "abs_max", bits, per_row, None, asymmetric, scale_dtype=scale_dtype).table
        codes, scale, offset, values, packed = _op_inputs(q, bits)
        for pooling in POOLINGS:
            (got,) = paddle._C_ops._run_custom_op(ext.OP_TYPE, paddle.to_tensor(ids), codes, scale, offset, values,
                                                  table.shape[1], packed, pooling, 0)
            outputs[f"int{bits} per_row={per_row} offsets={asymmetric} {scale_dtype} {pooling}"] = got.numpy()
    return outputs


def test_every_code_path_gives_the_same_bits(built: Path, tmp_path):
    """QEMBED_ISA forces each code path this CPU runs, in a process of its own (a process chooses once)."""
    here = op_outputs()
    paths = ("avx512", "avx2", "x86-64")
    for isa in paths[paths.index(str(here["isa"])):]:
        script = ("import sys, numpy as np; sys.path.insert(0, sys.argv[1]); from qembed import ext; ext.require(); "
                  "import test_fused_lookup as t; np.savez(sys.argv[2], **t.op_outputs())")
        env = {**os.environ, "QEMBED_ISA": isa, ext.DIR_ENV: str(built.parent)}  # (the shipped one is preferred)
        subprocess.run([sys.executable, "-c", script, str(Path(__file__).parent), str(tmp_path / isa)], env=env,
                       check=True)
        there = dict(np.load(tmp_path / f"{isa}.npz"))
        assert str(there.pop("isa")) == isa and there.keys() == {k for k in here if k != "isa"}
        for name, values in there.items():
            assert values.tobytes() == here[name].tobytes(), (isa, name)
    script = "from qembed import ext; print(ext.isa())"
    told = subprocess.run([sys.executable, "-c", script], env={**env, "QEMBED_ISA": "sse9"}, check=True,
                          capture_output=True, text=True).stdout
    assert told == "QEMBED_ISA=sse9 is not one of avx512, avx2, x86-64\n"


@pytest.mark.parametrize("pooling", ["sum", "mean", "sqrt_mean"])
@pytest.mark.parametrize("bits,per_row,asymmetric,scale_dtype", [
    (8, False, False, "float32"), (8, True, False, "float32"), (4, True, False, "float32"), (4, True, True, "float32"),
    (2, True, True, "float32"), (8, True, False, "float16"), (4, True, True, "float16"), (2, True, True, "float16")])
def test_pooled_bags_equal_numpy_sums_in_id_order(built, table, ids, pooling, bits, per_row, asymmetric, scale_dtype):
    """Padding ids are left out of the bag (and of the mean's count); an empty bag pools to zeros."""
    paddle.disable_static()
    q = choose_table_quantization(table, "abs_max", bits, per_row, None, asymmetric, scale_dtype=scale_dtype).table
    assert q.scales.dtype == scale_dtype or not per_row
    codes, scale, offset, values, packed = _op_inputs(q, bits)
    (got,) = paddle._C_ops._run_custom_op(ext.OP_TYPE, paddle.to_tensor(ids), codes, scale, offset, values, DIM,
                                          packed, pooling, 0)
    rows = q.rows(ids)
    expected = np.zeros((len(ids), DIM), np.float32)
    for j in range(BAG):  # id by id, in float32
        keep = ids[:, j] != 0
        expected[keep] += rows[keep, j]
    count = (ids != 0).sum(axis=1).astype(np.float32)[:, None]
    if pooling != "sum":
        divisor = count if pooling == "mean" else np.sqrt(count)
        expected = np.where(count > 0, expected / np.maximum(divisor, 1), expected)
    np.testing.assert_array_equal(got.numpy(), expected)
    assert not got.numpy()[3].any()
    (as_int32,) = paddle._C_ops._run_custom_op(ext.OP_TYPE, paddle.to_tensor(ids.astype(np.int32)), codes, scale,
                                               offset, values, DIM, packed, pooling, 0)
    np.testing.assert_array_equal(as_int32.numpy(), expected)
    (no_ids,) = paddle._C_ops._run_custom_op(ext.OP_TYPE, paddle.to_tensor(np.zeros((3, 0), np.int64)), codes, scale,
                                             offset, values, DIM, packed, pooling, 0)
    assert no_ids.shape == [3, DIM] and not no_ids.numpy().any()  # bags of length 0


def test_bad_ids_and_pooling_are_refused_in_one_line(built, table):
    paddle.disable_static()
    q = quantize_table(table, bits=8, per_row=True)
    codes, scale, *_ = _op_inputs(q, 8)
    with pytest.raises(Exception, match=f"id {ROWS} is outside the table's {ROWS} rows"):
        paddle._C_ops._run_custom_op(ext.OP_TYPE, paddle.to_tensor([[1, ROWS]]), codes, scale, None, None, DIM, 1,
                                     "sum", -1)
    with pytest.raises(Exception, match="pooling must be none, sum, mean or sqrt_mean, got max"):
        paddle._C_ops._run_custom_op(ext.OP_TYPE, paddle.to_tensor([[1]]), codes, scale, None, None, DIM, 1, "max",
                                     -1)


# ---- without the extension: the op sequence, and a clear error where it is required -----------------------
def test_auto_falls_back_to_the_op_sequence_when_not_built(not_built, rows_model, ids, tmp_path):
    directory, kwargs = rows_model
    files, (report,) = quant_embedding_model(directory, tmp_path / "q", {"per_row": True}, **kwargs)  # auto
    assert report.lookup == OP_SEQUENCE and b"qembed_lookup" not in files.model_file.read_bytes()
    np.testing.assert_array_equal(predict(files, {"ids": ids})[0],
                                  np.where((ids == 0)[..., None], 0, report.choice.table.rows(ids)))


def test_fused_lookup_true_without_the_build_says_how_to_build(not_built, rows_model, tmp_path):
    directory, kwargs = rows_model
    with pytest.raises(ConfigError, match=r"^[^\n]*not available here; pip install --find-links dist "
                                          r"paddle-quant-embed .* run `python -m qembed.build_ext`[^\n]*$"):
        quant_embedding_model(directory, tmp_path / "q", {"fused_lookup": True}, **kwargs)
    assert not (tmp_path / "q").exists()


def test_a_fused_model_without_the_build_says_how_to_build(built, rows_model, tmp_path, monkeypatch):
    directory, kwargs = rows_model
    files, _ = quant_embedding_model(directory, tmp_path / "q", {"fused_lookup": True}, **kwargs)
    hide_the_op(monkeypatch, tmp_path / "elsewhere")  # e.g. a server without the wheel or a build
    for read in (lambda: predict(files, {"ids": np.ones((1, BAG), np.int64)}), lambda: load_model(files)):
        with pytest.raises(ConfigError, match=r"^[^\n]*pip install --find-links dist paddle-quant-embed "
                                                r".*`python -m qembed.build_ext`"):
            read()


def test_the_shipped_library_is_refused_under_another_paddle(tmp_path, monkeypatch):
    """A wheel's library built for another Paddle is not loaded: one line naming both versions and what to do."""
    import paddle

    hide_the_op(monkeypatch, tmp_path)
    (tmp_path / "lib").mkdir()
    ext.SHIPPED.write_bytes(b"not loaded")
    ext.MANIFEST.write_text('{"paddle": "3.0.0"}')
    with pytest.warns(UserWarning, match=f"built for Paddle 3.0.0, not the installed {paddle.__version__}"):
        assert not ext.load()
    with pytest.raises(ConfigError, match=r"^[^\n]*Paddle 3.0.0.*pip install paddlepaddle==3.0.0 .*build_ext"), \
            pytest.warns(UserWarning):
        ext.require()


def test_no_compiler_is_one_clear_error(not_built, monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    monkeypatch.setattr(ext.cxx.shutil, "which", lambda name: None)
    with pytest.raises(Exception, match="no C\\+\\+ compiler found .* qembed keeps working without"):
        ext.build()



def save_bags(directory, family: str, tables: list[np.ndarray], padding: bool) -> None:
    """ids [batch, BAG] -> (sum, mean) over the bag of the rows of two tables (id 0 is padding if ``padding``)."""
    from qcore.paddle_env import static_mode

    scope = paddle.static.Scope()
    with static_mode(family, scope):
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            feed = paddle.static.data("ids", [-1, BAG], "int64")
            rows = [paddle.nn.functional.embedding(feed, paddle.static.create_parameter([ROWS, DIM], "float32",
                                                   name=f"t{k}"), padding_idx=0 if padding else None)
                    for k in range(2)]
            if family == "pir":
                total = paddle.sum(rows[0], axis=1)
            else:  # paddle.sum builds no legacy op in Paddle 3.3.1: the op older programs hold
                total = main.global_block().create_var(name="bag_sum", dtype="float32", shape=[-1, DIM])
                main.global_block().append_op(type="reduce_sum", inputs={"X": [rows[0]]}, outputs={"Out": [total]},
                                              attrs={"dim": [1], "keep_dim": False, "reduce_all": False})
            mean = paddle.mean(rows[1], axis=-2)
        exe = paddle.static.Executor(paddle.CPUPlace())
        exe.run(startup)
        for k, values in enumerate(tables):
            scope.var(f"t{k}").get_tensor().set(values, paddle.CPUPlace())
        paddle.static.save_inference_model(str(directory / "inference"), [feed], [total, mean], exe, program=main)


def _op_types(files) -> list[str]:
    program = load_model(files).program
    return [op.type if isinstance(op, paddle.static.Operator) else op.name() for op in program.global_block().ops]


def _bag_sum(q, ids: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Rows of ``ids`` summed id by id in float32, those not kept left out."""
    rows, total = q.rows(ids), np.zeros((len(ids), DIM), np.float32)
    for j in range(ids.shape[1]):
        total[keep[:, j]] += rows[keep[:, j], j]
    return total


@pytest.mark.parametrize("family", ["pir", "legacy"])
@pytest.mark.parametrize("padding", [True, False])
def test_a_bag_sum_or_mean_after_the_lookup_is_folded_into_it(built, table, ids, tmp_path, family, padding):
    """The program's mean divides by the bag's length, padding included, the op's by its ids: a mean is
    folded only where there is no padding_idx; a sum always."""
    save_bags(tmp_path / "float", family, [table, table[::-1].copy()], padding)
    feed = ids if padding else np.where(ids == 0, 5, ids)
    files, reports = quant_embedding_model(tmp_path / "float", tmp_path / "q", {"per_row": True,
                                                                               "fused_lookup": True})
    types = _op_types(files)
    reduces = [t for t in types if t in ("pd_op.sum", "pd_op.mean", "reduce_sum", "reduce_mean")]
    assert sum("qembed_lookup" in t for t in types) == 2
    assert reduces == (["pd_op.mean" if family == "pir" else "reduce_mean"] if padding else [])
    q_sum, q_mean = sorted((r.choice.table for r in reports), key=lambda q: abs(q.rows([1]) - table[1]).max())
    keep = feed != 0 if padding else np.ones(feed.shape, bool)
    expected_mean = np.where(keep[..., None], q_mean.rows(feed), np.float32(0)).mean(axis=1)
    for got in (load_model(files).run({"ids": feed}), predict(files, {"ids": feed})):
        np.testing.assert_array_equal(got[0], _bag_sum(q_sum, feed, keep))  # folded: summed id by id in the op
        if padding:  # Paddle's mean over the bag, padding rows (zeros) counted
            np.testing.assert_allclose(got[1], expected_mean, rtol=1e-5, atol=1e-7)
        else:
            np.testing.assert_array_equal(got[1], _bag_sum(q_mean, feed, keep) / np.float32(BAG))


@pytest.mark.parametrize("op_type,sparse", [("lookup_table", False), ("lookup_table_v2", True)])
def test_v1_lookups_and_sparse_lookups_fuse_too(built, op_type, sparse):
    """Paddle 1.x's lookup_table (ids [n, 1], rows [n, dim]) and a PaddleRec-style is_sparse lookup."""
    from qembed_programs import build_static_program

    from qembed import quant_embedding

    table = np.random.default_rng(3).normal(0, 0.1, (100, 8)).astype(np.float32)
    word = np.array([[0], [99], [7], [7], [42]], np.int64)
    outputs = []
    for fused in (False, True):
        p = build_static_program("legacy", op_type, table=table)
        with p.guard, paddle.static.scope_guard(p.scope):
            for op in p.main.global_block().ops:
                if op.type == op_type and sparse:
                    op._set_attr("is_sparse", True)
            quant_embedding(p.main, None, {"quantize_bits": 4, "per_row": True, "fused_lookup": fused}, p.scope)
            assert any(op.type == "qembed_lookup" for op in p.main.global_block().ops) == fused
            outputs.append(p.exe.run(p.main, feed={"word": word}, fetch_list=[p.out])[0])
    assert outputs[1].shape == outputs[0].shape
    np.testing.assert_array_equal(outputs[1], outputs[0])


def test_a_fused_model_is_refused_by_the_onnx_export_in_one_line(built, rows_model, tmp_path, monkeypatch):
    pytest.importorskip("paddle2onnx")
    from qcore.errors import ExportError
    from qcore.export import export_onnx

    directory, kwargs = rows_model
    files, _ = quant_embedding_model(directory, tmp_path / "q", {"fused_lookup": True}, **kwargs)
    with pytest.raises(ExportError, match="custom op .*qembed_lookup.*fused_lookup=False"):
        export_onnx(files, tmp_path / "model.onnx")
    assert not (tmp_path / "model.onnx").exists()
    hide_the_op(monkeypatch, tmp_path / "elsewhere")  # a machine without the op: same line, not "install the op"
    with pytest.raises(ExportError, match="custom op .*qembed_lookup.*fused_lookup=False"):
        export_onnx(files, tmp_path / "model.onnx")
