"""The exit-code table of docs/safety.md is the codes qcli returns, and every output path follows one rule."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from qcli.commands import ptq as ptq_command
from qcli.main import EXIT_CODES, INTERRUPTED, main
from qdemo import demo_model_dir, load_demo_data

DOCS = Path(__file__).resolve().parents[3] / "docs"


def _documented_codes() -> dict[int, str]:
    """``{code: meaning}`` of the exit-code table in docs/safety.md."""
    text = (DOCS / "safety.md").read_text(encoding="utf-8")
    return {int(code): meaning for code, meaning in re.findall(r"^\| (\d+) \| (.+) \|$", text, re.M)}


def test_the_documented_exit_codes_are_the_codes_qcli_uses():
    table = _documented_codes()
    assert set(table) == {0, 2, *EXIT_CODES.values(), ptq_command.VERIFICATION_FAILED, INTERRUPTED}
    for kind, code in EXIT_CODES.items():
        if kind.endswith("Error") and kind not in ("FileNotFoundError", "PermissionError", "QuantError"):
            assert f"`{kind}`" in table[code], (kind, code, table[code])
    assert "usage error" in table[2] and "interrupted" in table[INTERRUPTED]
    assert "verifying it on the backend failed" in table[ptq_command.VERIFICATION_FAILED]


def test_each_documented_exit_code_is_what_its_case_returns(tmp_path, capsys):
    model = str(demo_model_dir("legacy"))
    zeros = tmp_path / "zeros.npy"
    np.save(zeros, np.zeros((20, 1, 28, 28), np.float32))
    a_file = tmp_path / "a_file"
    a_file.write_text("keep")
    cases = {
        3: (["export", "onnx", model, str(tmp_path / "model.bin")], "name the ONNX file with the .onnx suffix"),
        4: (["ptq", "dynamic", str(tmp_path / "missing"), str(tmp_path / "o")], "model not found"),
        5: (["ptq", "static", model, str(tmp_path / "o"), "--data", str(zeros)], "calibration data is constant"),
        6: (["ptq", "dynamic", model, str(a_file)], "is an existing file, not a directory"),
        7: (["embed", model, str(tmp_path / "o"), "--params-name", "nope"], "no lookup_table"),  # nothing to rewrite
    }
    table = _documented_codes()
    for code, (argv, message) in cases.items():
        assert main(argv) == code, (argv, table[code])
        err = capsys.readouterr().err
        last = err.splitlines()[-1]  # after the progress lines of a run that got that far
        assert last.startswith(f"qcli {argv[0]}: error: ") and message in last and "Traceback" not in err, err
    with pytest.raises(SystemExit) as usage:
        main(["ptq", "static", model, str(tmp_path / "o"), "--data", str(zeros), "--mean", "abc"])
    assert usage.value.code == 2
    assert not (tmp_path / "o").exists() and a_file.read_text() == "keep"


def test_every_output_creates_its_missing_directories(tmp_path, capsys):
    model = str(demo_model_dir("legacy"))
    deep = tmp_path / "a" / "b"
    calib = tmp_path / "calib.npy"
    np.save(calib, load_demo_data("calib")[0][:20])
    argv = ["ptq", "static", model, str(deep / "model"), "--data", str(calib), "--algo", "abs_max", "--backend",
            "onednn", "--report", str(deep / "r" / "r.json"), "--report-html", str(deep / "h" / "r.html")]
    assert main(argv) == 0, capsys.readouterr().err
    assert (deep / "model" / "inference.pdmodel").is_file()
    assert '"method": "static"' in (deep / "r" / "r.json").read_text() and (deep / "h" / "r.html").is_file()
    bench = ["bench", model, "--backends", "onednn", "--batch", "1", "--repeats", "1",
             "--json", str(deep / "j" / "b.json")]
    assert main(bench) == 0, capsys.readouterr().err
    assert "batch 1" in (deep / "j" / "b.json").read_text()
    assert main(["export", "onnx", model, str(deep / "x" / "m.onnx")]) == 0, capsys.readouterr().err
    assert (deep / "x" / "m.onnx").stat().st_size > 100_000


def test_an_output_under_a_file_or_a_directory_for_a_file_is_refused_alike(tmp_path, capsys):
    model = str(demo_model_dir("legacy"))
    a_file = tmp_path / "a_file"
    a_file.write_text("keep")
    under = str(a_file / "sub" / "x.json")
    cases = [
        (["ptq", "dynamic", model, str(tmp_path / "o"), "--report", under], f"output {a_file / 'sub'} lies under"),
        (["ptq", "static", model, str(tmp_path / "o"), "--data", str(a_file), "--report-html", under],
         "an existing file"),
        (["ptq", "dynamic", model, str(tmp_path / "o"), "--report", str(tmp_path)], "is a directory"),
        (["bench", model, "--json", under], "an existing file"),
        (["bench", model, "--json", str(tmp_path)], "--json"),
        (["export", "onnx", model, str(a_file / "m.onnx")], "is an existing file"),
    ]
    for argv, message in cases:
        assert main(argv) == 6, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"] and a_file.read_text() == "keep"
