"""What a recommender team gets from the built wheels: ``paddle-quant-embed`` and the ``paddle-quant-core`` it pins,
in a venv holding nothing else of ours. ``nox -s wheels`` builds every package and installs only those two wheels
(their other dependencies from the index) before it runs this file, with no C++ compiler on the PATH and an empty
``QEMBED_EXT_DIR``: the embedding package's platform wheel serves fused models with the op it ships."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

VERSION = (Path(__file__).resolve().parents[1] / "VERSION").read_text(encoding="utf-8").strip()
IMPORT_NAMES = ("qcore", "qptq", "qqat", "qembed", "qcli", "qdemo")


def test_the_venv_holds_the_embedding_and_core_wheels_and_nothing_else_of_ours():
    ours = {d.metadata["Name"]: d.version for d in importlib.metadata.distributions()
            if d.metadata["Name"].startswith("paddle-quant-")}
    assert ours == {"paddle-quant-core": VERSION, "paddle-quant-embed": VERSION}
    found = {name: importlib.util.find_spec(name) for name in IMPORT_NAMES}
    assert sorted(name for name, spec in found.items() if spec is not None) == ["qcore", "qembed"]
    for name in ("qcore", "qembed"):  # imported from the installed wheel, not from the repository's sources
        assert Path(sys.prefix).resolve() in Path(found[name].origin).resolve().parents, found[name].origin


def test_a_numpy_table_quantizes_to_int8_codes_within_half_a_step():
    from qembed import quantize_table

    table = np.random.default_rng(0).normal(size=(1000, 16)).astype(np.float32)
    quantized = quantize_table(table, bits=8, per_row=True)
    assert quantized.codes.dtype == np.int8 and quantized.codes.shape == (1000, 16)
    steps = np.abs(table).max(axis=1, keepdims=True) / 127
    assert (np.abs(quantized.dequantize() - table) <= steps / 2 + 1e-6).all()
    assert quantized.stored_bytes < table.nbytes / 3


def test_quant_embedding_rewrites_a_program_whose_lookups_stay_within_half_a_step():
    import paddle

    from qembed import quant_embedding

    paddle.enable_static()
    with paddle.pir_utils.OldIrGuard():
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            word = paddle.static.data("word", [None, 1], "int64")
            attr = paddle.ParamAttr(name="emb", initializer=paddle.nn.initializer.Uniform(-0.5, 0.5))
            emb = paddle.static.nn.embedding(word, size=[100, 8], param_attr=attr)
        exe = paddle.static.Executor(paddle.CPUPlace())
        scope = paddle.static.Scope()
        with paddle.static.scope_guard(scope):
            exe.run(startup)
            table = np.array(scope.find_var("emb").get_tensor())
            ids = np.array([[3], [97], [3]], "int64")
            config = {"quantize_op_types": ["lookup_table"], "lookup_table": {"quantize_type": "abs_max"}}
            quant_embedding(main, paddle.CPUPlace(), config, scope=scope)
            (out,) = exe.run(main, feed={"word": ids}, fetch_list=[emb.name])
    assert "emb" not in {v.name for v in main.list_vars()}
    assert np.asarray(scope.find_var("emb.quantized").get_tensor()).dtype == np.int8
    step = np.abs(table).max() / 127
    np.testing.assert_allclose(out.reshape(3, 8), table[ids[:, 0]], atol=step / 2 + 1e-6)
    assert 0 < np.abs(out.reshape(3, 8) - table[ids[:, 0]]).max()  # really int8 codes, not the float rows


# ---- the compiled lookup the platform wheel ships -------------------------------------------------------------------
ROWS, DIM, BAG = 500, 70, 6  # rows wider than an AVX-512 register and not a multiple of one


def _widest_code_path() -> str:
    flags = set(next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
                .split(":", 1)[1].split())
    if {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags:
        return "avx512"
    return "avx2" if "avx2" in flags else "x86-64"


def test_the_platform_wheel_ships_the_op_for_the_paddle_it_pins():
    import paddle

    from qembed import ext

    dist = importlib.metadata.distribution("paddle-quant-embed")
    assert f"Tag: cp{sys.version_info.major}{sys.version_info.minor}-cp{sys.version_info.major}" \
           f"{sys.version_info.minor}-linux_x86_64" in dist.read_text("WHEEL")
    (pin,) = [r for r in dist.requires if 'extra == "fused"' in r]
    assert pin.split(";")[0] == f"paddlepaddle=={paddle.__version__}"
    assert Path(sys.prefix).resolve() in ext.SHIPPED.resolve().parents
    assert ext.shipped_paddle() == paddle.__version__ and ext.shipped() == ext.SHIPPED


def test_with_no_compiler_the_shipped_library_is_the_one_loaded():
    from qembed import ext

    assert [shutil.which(name) for name in ("c++", "g++", "gcc", "cc", "clang++")] == [None] * 5
    assert ext.compiler() is None
    assert ext.load() and ext.loaded() == ext.SHIPPED
    cache = Path(os.environ[ext.DIR_ENV])  # nothing was built for this machine
    assert not cache.exists() or not any(cache.iterdir())
    assert ext.isa() == _widest_code_path()


class _Rows(__import__("paddle").nn.Layer):
    """ids [batch, BAG] -> their rows (id 0 is padding), and the bag's sum of them."""

    def __init__(self) -> None:
        import paddle

        super().__init__()
        self.emb = paddle.nn.Embedding(ROWS, DIM, padding_idx=0)
        self.bag = paddle.nn.Embedding(ROWS, DIM)

    def forward(self, ids):  # type: ignore[no-untyped-def]
        import paddle

        return self.emb(ids), paddle.sum(self.bag(ids), axis=1)


@pytest.fixture(scope="module")
def float_model(tmp_path_factory) -> tuple[Path, list[str]]:
    """The saved PIR model, and its two tables' names (the rows', the bag's)."""
    import paddle

    paddle.disable_static()
    paddle.seed(0)
    net = _Rows()
    rng = np.random.default_rng(0)
    for layer in (net.emb, net.bag):
        table = (rng.normal(0, 0.1, (ROWS, DIM)) * rng.lognormal(0, 1, (ROWS, 1))).astype(np.float32)
        table[0] = 0
        layer.weight.set_value(table)
    net.eval()
    directory = tmp_path_factory.mktemp("float") / "rows"
    spec = [paddle.static.InputSpec([None, BAG], "int64", "ids")]
    paddle.jit.save(net, str(directory / "inference"), input_spec=spec)
    return directory, [net.emb.weight.name, net.bag.weight.name]


def _ids() -> np.ndarray:
    ids = np.random.default_rng(1).integers(1, ROWS, (16, BAG)).astype(np.int64)
    ids[1, 2:] = 0  # a short list, padded
    ids[3] = 0  # an empty list
    return ids


@pytest.mark.parametrize("config", [{"per_row": True}, {"quantize_bits": 4, "per_row": True},
                                    {"quantize_bits": 2, "per_row": True, "scale_dtype": "float16"}],
                         ids=["int8", "int4", "int2-fp16"])
def test_the_default_config_serves_fused_models_equal_to_the_numpy_rows(float_model, tmp_path, config):
    from qcore.inference import predict
    from qcore.model_io import load_model
    from qembed import quant_embedding_model
    from qembed.program import FUSED

    directory, names = float_model
    files, reports = quant_embedding_model(directory, tmp_path / "q", config)  # fused_lookup: the default, auto
    assert [r.lookup for r in reports] == [FUSED, FUSED]
    assert files.model_file.read_bytes().count(b"qembed_lookup") >= 2
    rows_q, bag_q = ({r.name: r.choice.table for r in reports}[name] for name in names)
    ids = _ids()
    rows = np.where((ids == 0)[..., None], np.float32(0), rows_q.rows(ids))
    bag = np.zeros((len(ids), DIM), np.float32)
    for j in range(BAG):  # summed id by id in float32
        bag += bag_q.rows(ids[:, j])
    for got in (load_model(files).run({"ids": ids}), predict(files, {"ids": ids})):
        np.testing.assert_array_equal(got[0], rows)
        np.testing.assert_array_equal(got[1], bag)
    assert 0 < np.abs(rows).max() and not rows[3].any()


def test_every_code_path_serves_the_same_bits(float_model, tmp_path):
    """QEMBED_ISA forces the AVX2 and the baseline paths (a process chooses once: one process each)."""
    from qcore.inference import predict
    from qembed import quant_embedding_model

    files, _ = quant_embedding_model(float_model[0], tmp_path / "q", {"quantize_bits": 4, "per_row": True})
    here = predict(files, {"ids": _ids()})
    np.save(tmp_path / "ids.npy", _ids())
    script = ("import sys, numpy as np; from qcore.inference import predict; from qcore.model_io import "
              "find_model_files; from qembed import ext; ext.require(); "
              "out = predict(find_model_files(sys.argv[1]), {'ids': np.load(sys.argv[2])}); "
              "np.savez(sys.argv[3], *out); print(ext.isa())")
    paths = ("avx512", "avx2", "x86-64")
    for isa in paths[paths.index(_widest_code_path()):]:
        done = subprocess.run([sys.executable, "-c", script, str(files.directory), str(tmp_path / "ids.npy"),
                               str(tmp_path / isa)], env={**os.environ, "QEMBED_ISA": isa}, check=True,
                              capture_output=True, text=True)
        assert done.stdout.splitlines()[-1] == isa
        there = np.load(tmp_path / f"{isa}.npz")
        assert [there[f"arr_{k}"].tobytes() for k in range(len(here))] == [a.tobytes() for a in here]
