from __future__ import annotations

import re

import numpy as np
import pytest

from qcli import plugins
from qcli.main import EXIT_CODES, exit_code, main
from qcore.errors import ModelFormatError
from qdemo import demo_model_dir


def test_demo_prints_before_after_table(tmp_path, capfd):
    assert main(["demo", "--calib-samples", "60", "--out", str(tmp_path / "int8")]) == 0
    out = capfd.readouterr().out  # file descriptor level: what Paddle's C++ passes print too
    assert "--- " not in out  # the oneDNN passes' "--- fused ..." lines show only with --verbose
    rows = {m.group(1): [float(v) for v in m.groups()[1:]] for m in re.finditer(
        r"^\| (float|int8 \(kl\)) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", out, re.M)}
    assert set(rows) == {"float", "int8 (kl)"}, out
    float_row, int8_row = rows["float"], rows["int8 (kl)"]
    assert float_row[0] == pytest.approx(86.0, abs=0.5)
    assert int8_row[1] >= float_row[1] - 1.5  # deployed int8 top-1 within 1.5 points
    assert int8_row[3] < 0.3 * float_row[3]  # params file shrinks to about 1/4
    assert (tmp_path / "int8" / "inference.pdmodel").is_file()


def test_missing_method_package_names_the_install_command(monkeypatch):
    monkeypatch.setattr(plugins, "installed", lambda package: False)
    with pytest.raises(SystemExit, match=r"pip install packages/qptq"):
        plugins.require("demo")


def test_version(capsys):
    with pytest.raises(SystemExit):
        main(["--version"])
    assert "qcli 0.1.0" in capsys.readouterr().out


def test_errors_are_one_line_on_stderr_with_an_exit_code_per_kind(tmp_path, capsys):
    model = str(demo_model_dir("legacy"))
    assert main(["ptq", "dynamic", str(tmp_path / "missing"), str(tmp_path / "o")]) == 4
    err = capsys.readouterr().err
    assert err.startswith("qcli ptq: error: model not found") and err.count("\n") == 1, err
    a_file = tmp_path / "a_file"
    a_file.write_text("keep")
    assert main(["ptq", "dynamic", model, str(a_file)]) == 6
    assert "is an existing file, not a directory" in capsys.readouterr().err and a_file.read_text() == "keep"
    assert main(["ptq", "dynamic", model, str(tmp_path / "o"), "--report", str(tmp_path / "no" / "r.json")]) == 6
    assert "does not exist" in capsys.readouterr().err and not (tmp_path / "o").exists()
    data = tmp_path / "zeros.npy"
    np.save(data, np.zeros((20, 1, 28, 28), np.float32))
    assert main(["ptq", "static", model, str(tmp_path / "o"), "--data", str(data)]) == 5
    assert "calibration data is constant" in capsys.readouterr().err
    with pytest.raises(ModelFormatError):  # --verbose shows the traceback instead
        main(["--verbose", "ptq", "dynamic", str(tmp_path / "missing"), str(tmp_path / "o")])
    assert EXIT_CODES["ConfigError"] == 3 and exit_code(KeyError("x")) is None
