from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from qcli import plugins
from qcli.main import EXIT_CODES, exit_code, main
from qcore.errors import ExportError, ModelFormatError
from qdemo import demo_model_dir, load_demo_data


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


REPO = Path(__file__).resolve().parents[3]


def test_missing_method_package_names_the_install_commands_and_exits_with_the_documented_status(monkeypatch, capsys):
    """Before publication a bare ``pip install paddle-quant-demo`` finds nothing: the line gives the clone's path
    and the wheels' --find-links form (test_install_lines checks both against the pyprojects), and the exit
    status is docs/safety.md's 9, not Python's 1."""
    monkeypatch.setattr(plugins, "installed", lambda package: package not in ("qptq", "qdemo"))
    assert main(["demo"]) == 9
    assert capsys.readouterr().err == (
        "qcli demo: error: 'qptq' and 'qdemo' are not installed (none of this toolkit's packages is on PyPI yet); "
        "from a clone of the repository: pip install packages/qptq packages/qdemo; from the wheels python3 -m nox "
        "-s build writes: pip install --find-links dist paddle-quant-ptq paddle-quant-demo\n"
    )
    monkeypatch.setattr(plugins, "installed", lambda package: package != "qdemo")
    assert main(["demo"]) == 9
    assert "'qdemo' is not installed" in capsys.readouterr().err


def test_install_hints_name_each_packages_own_distribution():
    """The import names are taken on PyPI by other projects: a hint must name the distribution each pyproject builds."""
    for package, distribution in plugins.DISTRIBUTIONS.items():
        pyproject = (REPO / "packages" / package / "pyproject.toml").read_text(encoding="utf-8")
        assert re.search(r'^name = "(.+)"$', pyproject, re.M).group(1) == distribution
    assert set(plugins.DISTRIBUTIONS) == {p for providers in plugins.PROVIDERS.values() for p in providers}


def test_version(capsys):
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out == f"qcli {(REPO / 'VERSION').read_text(encoding='utf-8').strip()}\n"


def test_errors_are_one_line_on_stderr_with_an_exit_code_per_kind(tmp_path, capsys):
    model = str(demo_model_dir("legacy"))
    assert main(["ptq", "dynamic", str(tmp_path / "missing"), str(tmp_path / "o")]) == 4
    err = capsys.readouterr().err
    assert err.startswith("qcli ptq: error: model not found") and err.count("\n") == 1, err
    a_file = tmp_path / "a_file"
    a_file.write_text("keep")
    assert main(["ptq", "dynamic", model, str(a_file)]) == 6
    assert "is an existing file, not a directory" in capsys.readouterr().err and a_file.read_text() == "keep"
    assert main(["ptq", "dynamic", model, str(tmp_path / "o"), "--report", str(a_file / "r.json")]) == 6
    assert "an existing file" in capsys.readouterr().err and not (tmp_path / "o").exists()
    data = tmp_path / "zeros.npy"
    np.save(data, np.zeros((20, 1, 28, 28), np.float32))
    assert main(["ptq", "static", model, str(tmp_path / "o"), "--data", str(data)]) == 5
    assert "calibration data is constant" in capsys.readouterr().err
    with pytest.raises(ModelFormatError):  # --verbose shows the traceback instead
        main(["--verbose", "ptq", "dynamic", str(tmp_path / "missing"), str(tmp_path / "o")])
    assert EXIT_CODES["ConfigError"] == 3 and exit_code(KeyError("x")) is None


def test_bad_values_and_files_end_with_one_line_and_a_documented_status(tmp_path, capsys):
    model, out = str(demo_model_dir("legacy")), str(tmp_path / "o")
    calib = tmp_path / "calib.npy"
    np.save(calib, load_demo_data("calib")[0][:20])
    with pytest.raises(SystemExit) as usage:  # argparse's refusal: status 2, its last line names the option
        main(["ptq", "static", model, out, "--data", str(calib), "--mean", "abc"])
    assert usage.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "qcli ptq static: error: argument --mean: 'abc' is not a comma-separated list of numbers, "
        "e.g. 0.485,0.456,0.406")
    ragged = np.empty(2, object)
    ragged[:] = [np.zeros((1, 28, 28), np.float32), np.zeros((1, 28, 14), np.float32)]
    np.save(tmp_path / "ragged.npy", ragged, allow_pickle=True)
    (tmp_path / "bad.json").write_text("weight_bits: 8")
    (tmp_path / "list.json").write_text("[8]")
    cases = [
        (["ptq", "static", model, out, "--data", str(tmp_path / "ragged.npy")], 5,
         f"qcli ptq: error: --data {tmp_path / 'ragged.npy'} holds Python objects (dtype object), not one numeric "
         "array; save samples of one shape with np.save(path, np.stack(samples))"),
        (["bench", model, "--data", str(tmp_path / "ragged.npy")], 5, "holds Python objects (dtype object)"),
        (["qat", "--config", str(tmp_path / "bad.json")], 3,
         f"qcli qat: error: --config {tmp_path / 'bad.json'} is not JSON (Expecting value: line 1 column 1 (char 0)); "
         "write a JSON object of config keys"),
        (["qat", "--config", str(tmp_path / "list.json")], 3, "holds a list, not a JSON object of config keys"),
        (["embed", model, out, "--config", str(tmp_path / "missing.json")], 3, "missing.json: no such file"),
    ]
    for argv, code, message in cases:
        assert main(argv) == code, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()


def test_ctrl_c_while_qcli_imports_is_one_line_and_status_130(tmp_path):
    qcli = Path(sys.executable).with_name("qcli")  # the console script, as a user runs it
    # as from a terminal: SIGINT at its default (a runner such as nox may start the tests with it ignored, which
    # qcli, like any process, inherits and leaves alone)
    process = subprocess.Popen([str(qcli), "ptq", "dynamic", str(demo_model_dir("legacy")), str(tmp_path / "o")],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(0.3)  # importing Paddle takes over a second
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130 and "Traceback" not in err, err
    assert err.splitlines() == ["qcli: interrupted"], err


def test_help_imports_neither_paddle_nor_the_method_packages():
    heavy = ("paddle", "numpy", "qptq", "qcore.model_io", "matplotlib")
    script = ("import sys\nfrom qcli.main import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
              f"print(sorted(m for m in {heavy} if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60)
    assert result.stdout.splitlines()[-1] == "[]", result.stdout
    assert all(f"    {command} " in result.stdout for command in ("bench", "demo", "embed", "export", "ptq", "qat"))


def test_paddles_noise_shows_only_with_verbose(tmp_path):
    """Paddle's log lines and the budget's per-candidate 'left in float' lines show only with --verbose; its
    "old way to load" line and ccache warning (about how qcore calls Paddle) not even then (docs/cli.md)."""
    model = str(demo_model_dir("legacy"))
    np.save(tmp_path / "calib.npy", load_demo_data("calib")[0][:20])
    script = "import sys\nfrom qcli.main import main\ncode = main(sys.argv[1:])\nprint('matplotlib' in sys.modules)\n" \
             "sys.exit(code)"
    run = ["ptq", "static", model, str(tmp_path / "int8"), "--data", str(tmp_path / "calib.npy"), "--algo",
           "abs_max", "--batch-size", "10", "--backend", "onednn", "--max-output-error", "0.02"]
    result = subprocess.run([sys.executable, "-c", script, *run], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "quantized model:" in result.stdout and result.stdout.splitlines()[-1] == "False"  # no matplotlib
    noise = ("old way to load", "ccache", "left in float", "WARNING")
    assert not [n for n in noise if n in result.stderr], result.stderr
    verbose = subprocess.run([sys.executable, "-c", script, "--verbose", "ptq", "dynamic", model,
                              str(tmp_path / "w8")], capture_output=True, text=True, timeout=600)
    paddles_own = ("New Executor is Running", "---    quantized")  # its C++ log, its passes' lines
    assert verbose.returncode == 0 and any(line in verbose.stderr for line in paddles_own), verbose.stderr
    assert "old way to load" not in verbose.stderr and "ccache" not in verbose.stderr, verbose.stderr


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_every_failed_run_leaves_an_existing_output_byte_identical(tmp_path, capsys, monkeypatch):
    """Issue 29's target: OUT already holds a model (and its report); each failure mode below exits non-zero
    and leaves every byte under tmp_path as it was. (Exit 8, a verification failure after the model is
    written, is the one documented exception: docs/safety.md.)"""
    model = str(demo_model_dir("legacy"))
    calib = tmp_path / "calib.npy"
    np.save(calib, load_demo_data("calib")[0][:20])
    out = tmp_path / "out"
    assert main(["ptq", "static", model, str(out), "--data", str(calib), "--algo", "abs_max"]) == 0
    objects = np.empty(2, object)
    objects[:] = [np.zeros(3), np.zeros(4)]
    np.save(tmp_path / "objects.npy", objects, allow_pickle=True)
    (tmp_path / "a_file").write_text("not a directory")
    before = _tree(tmp_path)
    assert {"out/inference.pdmodel", "out/inference.pdiparams", "out.report.json"} <= set(before)
    base = ["ptq", "static", model, str(out), "--data", str(calib)]
    cases = [
        (base + ["--eval-data", str(tmp_path / "missing.npy")], 5),
        (base + ["--eval-labels", str(tmp_path / "missing.npy"), "--eval-data", str(calib)], 5),
        (base + ["--report-html", str(tmp_path / "a_file" / "r.html")], 6),
        (base + ["--report", str(tmp_path / "a_file" / "r.json")], 6),
        (["ptq", "static", model, str(out), "--data", str(tmp_path / "objects.npy")], 5),
        (base + ["--max-drop", "0.01", "--eval-data", str(calib), "--eval-labels", str(tmp_path / "objects.npy")], 5),
        (["ptq", "dynamic", str(tmp_path / "missing"), str(out)], 4),
        (["embed", model, str(out), "--bits", "9"], 3),
        (["ptq", "static", model, str(tmp_path / "a_file"), "--data", str(calib)], 6),
    ]
    for argv, code in cases:
        assert main(argv) == code, argv
        assert "Traceback" not in capsys.readouterr().err
        assert _tree(tmp_path) == before, argv
    monkeypatch.setenv("QCORE_OPENVINO_CACHE", str(tmp_path / "a_file" / "cache"))  # under a file: unwritable
    assert main(base + ["--backend", "openvino"]) == 6
    assert _tree(tmp_path) == before
    for argv in (base + ["--mean", "abc"], base + ["--algo", "kll"]):
        with pytest.raises(SystemExit) as usage:
            main(argv)
        assert usage.value.code == 2 and _tree(tmp_path) == before


def test_an_empty_program_file_is_one_line_not_a_traceback(tmp_path, capsys):
    copy = tmp_path / "model"
    shutil.copytree(demo_model_dir("pir"), copy)
    (copy / "inference.json").write_bytes(b"")
    assert main(["ptq", "dynamic", str(copy), str(tmp_path / "o")]) == 4
    assert capsys.readouterr().err == (
        f"qcli ptq: error: {copy / 'inference.json'} is empty (0 bytes); copy the model file again from where the "
        "model was saved\n")


def test_export_of_a_model_paddle2onnx_converts_wrongly_fails_in_one_line_and_writes_nothing(tmp_path, capsys):

    from qdemo.testing import save_fft_net

    save_fft_net(tmp_path / "fft")  # paddle2onnx 2.1 writes rfft as a graph of another output shape
    assert main(["export", "onnx", str(tmp_path / "fft"), str(tmp_path / "fft.onnx")]) == exit_code(ExportError(""))
    err = capsys.readouterr().err.strip()
    assert "does not compute the Paddle model" in err and "(2, 4, 28, 15)" in err and "\n" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fft"]
