from __future__ import annotations

import re

import pytest

from qcli import plugins
from qcli.main import main


def test_qat_prints_float_and_int8_rows(tmp_path, capsys):
    assert main(["qat", "--steps", "60", "--pact", "--family", "pir", "--out", str(tmp_path / "int8")]) == 0
    out = capsys.readouterr().out
    rows = {m.group(1): [float(v) for v in m.groups()[1:]] for m in re.finditer(
        r"^\| (float|int8 \(QAT \+ PACT\)) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", out, re.M)}
    assert set(rows) == {"float", "int8 (QAT + PACT)"}, out
    assert rows["float"][0] == pytest.approx(86.0, abs=0.5)
    assert rows["int8 (QAT + PACT)"][1] >= rows["float"][1] - 1.0  # deployed int8 after 60 steps
    assert rows["int8 (QAT + PACT)"][3] < 0.3 * rows["float"][3]  # int8-stored weights
    assert (tmp_path / "int8" / "inference.json").is_file()


def test_qat_names_the_missing_package(monkeypatch, capsys):
    monkeypatch.setattr(plugins, "installed", lambda package: False)
    assert main(["qat", "--steps", "1"]) == 9
    assert "pip install packages/qqat packages/qdemo" in capsys.readouterr().err
