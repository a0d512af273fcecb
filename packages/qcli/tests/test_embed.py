"""qcli embed on a saved Paddle model (PIR and legacy) and on a raw .npy table."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import paddle
import pytest

from qcli import plugins
from qcli.main import main
from qcore.inference import predict
from qcore.model_io import find_model_files
from qdemo.testing import EMBEDDING_INPUT_SPEC, TinyEmbeddingNet, save_tiny_net

pytest.importorskip("qembed")


@pytest.fixture(scope="module", params=["pir", "legacy_separate"])
def model(request, tmp_path_factory):
    paddle.seed(0)
    net = TinyEmbeddingNet(vocab=4000, dim=32)
    net.eval()
    directory = tmp_path_factory.mktemp("emb") / request.param
    kwargs = save_tiny_net(net, directory, request.param, EMBEDDING_INPUT_SPEC)
    return directory, kwargs


def test_embed_model(model, tmp_path, capsys):
    directory, kwargs = model
    argv = ["embed", str(directory), str(tmp_path / "q"), "--per-row", "auto", "--bits", "4", "--fused-lookup", "off"]
    if kwargs["model_filename"]:
        argv += ["--model-filename", kwargs["model_filename"]]
    assert main(argv) == 0
    out = capsys.readouterr().out
    row = re.search(r"^\| embedding_0\.w_0 \| lookup_table \| 4000x32 \| abs_max int4 packed( \+ offsets)? \| "
                    r"(one|per-row) \| op sequence \| ([\d.]+) \| ([\d.]+) \| 0\.49 \| 0\.0[6-9] \|$", out, re.M)
    assert row, out
    before, after = map(float, re.search(r"model on disk: ([\d.]+) MiB -> ([\d.]+) MiB", out).groups())
    assert after < 0.2 * before  # two codes a byte
    files = find_model_files(tmp_path / "q", kwargs["model_filename"])
    ids = np.arange(12, dtype=np.int64).reshape(2, 6)
    assert predict(files, {"ids": ids})[0].shape == (2, 4)


def test_embed_prints_no_paddle_notice_on_loading(model, tmp_path):
    """docs/cli.md: Paddle's "old way to load" line (logged on every load of these file layouts) and its
    "No ccache found" import warning are not printed; the command's own output is."""
    directory, kwargs = model
    argv = ["embed", str(directory), str(tmp_path / "q")]
    if kwargs["model_filename"]:
        argv += ["--model-filename", kwargs["model_filename"]]
    proc = subprocess.run([sys.executable, "-c", "import sys; from qcli.main import main; sys.exit(main(sys.argv[1:]))",
                           *argv], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "| lookup_table | 4000x32 |" in proc.stdout and "model on disk" in proc.stdout
    printed = proc.stdout + proc.stderr
    assert "old way to load" not in printed and "No ccache found" not in printed, printed


def test_embed_model_config_file_and_bad_input(model, tmp_path, capsys):
    directory, kwargs = model
    extra = ["--model-filename", kwargs["model_filename"]] if kwargs["model_filename"] else []
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"lookup_table": {"quantize_type": "log"}}))
    assert main(["embed", str(directory), str(tmp_path / "q"), "--config", str(config), *extra]) == 0
    assert "| log int8 | one |" in capsys.readouterr().out
    assert main(["embed", str(directory), str(tmp_path / "q2"), "--params-name", "nope", *extra]) == 7
    err = capsys.readouterr().err
    assert re.fullmatch(r"qcli embed: error: .*'nope' .*tables found: embedding_0.w_0.*\n", err), err
    assert main(["embed", str(directory), str(tmp_path / "q2"), "--bits", "9", *extra]) == 3
    assert "quantize_bits=9" in capsys.readouterr().err
    assert main(["embed", str(directory), str(tmp_path / "q3"), "--bits", "auto", "--max-error", "0.15",
                 "--per-row", "on", *extra]) == 0
    assert re.search(r"\| abs_max int4 packed.* \(auto: int2 0\.\d+, int4 0\.\d+\) \| per-row \|",
                     capsys.readouterr().out)
    assert main(["embed", str(directory), str(tmp_path / "q4"), "--per-row", "on", "--scale-dtype", "float16",
                 "--fused-lookup", "off", *extra]) == 0
    assert "| abs_max int8 | per-row float16 | op sequence |" in capsys.readouterr().out


def test_embed_fused_lookup(model, tmp_path, capsys, monkeypatch):
    """--fused-lookup on: the compiled op where it loads, else one error line saying what to install."""
    from qembed import ext

    directory, kwargs = model
    argv = ["embed", str(directory), str(tmp_path / "q"), "--per-row", "on", "--fused-lookup", "on"]
    argv += ["--model-filename", kwargs["model_filename"]] if kwargs["model_filename"] else []
    with monkeypatch.context() as mp:  # a machine without the op (a registered op cannot be unloaded)
        mp.setenv(ext.DIR_ENV, str(tmp_path / "ext"))
        mp.setattr(ext, "SHIPPED", tmp_path / "no-wheel" / ext.SHIPPED.name)
        mp.setattr(ext, "_registered", None)
        assert main(argv) == 3
    assert "not available here; pip install --find-links dist paddle-quant-embed" in capsys.readouterr().err
    assert not (tmp_path / "q").exists()
    if ext.loaded() is None and ext.shipped() is None:
        if ext.compiler() is None:
            pytest.skip("no C++ compiler and no shipped library: the fused lookup is not available here")
        monkeypatch.setenv(ext.DIR_ENV, str(tmp_path / "ext"))
        ext.build()
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| per-row | fused (qembed_lookup) |" in out and "every machine that serves it needs it: pip install " \
                                                           "--find-links dist paddle-quant-embed" in out
    ids = np.arange(12, dtype=np.int64).reshape(2, 6)
    files = find_model_files(tmp_path / "q", kwargs["model_filename"])
    assert predict(files, {"ids": ids})[0].shape == (2, 4)


def test_embed_npy_table(tmp_path, capsys):
    table = np.random.default_rng(0).normal(0, 0.1, (5000, 33)).astype(np.float32)
    np.save(tmp_path / "t.npy", table)
    assert main(["embed", str(tmp_path / "t.npy"), str(tmp_path / "q.npy"), "--bits", "4", "--chunk-rows", "999"]) == 0
    out = capsys.readouterr().out
    assert "5000x33 abs_max int4 packed 2 per byte, per-row scale(s)" in out, out
    ratio = float(re.search(r"\(([\d.]+)x\)", out).group(1))
    assert ratio < 0.16  # 17 bytes of codes + 4 of scale per row vs 132 bytes of fp32
    import qembed.table

    back = qembed.table.load_quantized_npy(tmp_path / "q.npy").rows([0, 4999])
    step = np.abs(table[[0, 4999]]).max(1, keepdims=True) / 7
    assert (np.abs(back - table[[0, 4999]]) <= step / 2 + 1e-6).all()
    assert main(["embed", str(tmp_path / "t.npy"), str(tmp_path / "q.npy"), "--per-row", "auto"]) == 3
    assert "auto needs the table in memory" in capsys.readouterr().err
    assert main(["embed", str(tmp_path / "t.npy"), str(tmp_path / "h.npy"), "--bits", "4", "--scale-dtype",
                 "float16"]) == 0
    assert "int4 packed 2 per byte, per-row float16 scale(s)" in capsys.readouterr().out
    assert (tmp_path / "h.scales.npy").stat().st_size == 128 + 2 * 5000  # 2 bytes a row (header 128)
    expected = qembed.quantize_table(table, bits=4, per_row=True, scale_dtype="float16").dequantize()
    np.testing.assert_array_equal(qembed.table.load_quantized_npy(tmp_path / "h.npy").dequantize(), expected)


def test_embed_without_qembed_names_the_package(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(plugins, "installed", lambda package: False)
    assert main(["embed", str(tmp_path / "t.npy"), str(tmp_path / "q.npy")]) == 9
    assert "pip install packages/qembed;" in capsys.readouterr().err
