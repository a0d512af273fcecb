from __future__ import annotations

import re

import pytest

from qcli import plugins
from qcli.main import main


def test_demo_prints_before_after_table(tmp_path, capsys):
    assert main(["demo", "--calib-samples", "60", "--out", str(tmp_path / "int8")]) == 0
    out = capsys.readouterr().out
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
