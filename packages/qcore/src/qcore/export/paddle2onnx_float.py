"""The float ONNX graph of a Paddle program, from paddle2onnx (the optional ``onnx`` extra of ``paddle-quant-core``).

paddle2onnx 2.1 reads both IRs (it translates legacy programs to PIR first), keeps parameter
names as initializer names and names activations ``p2o.pd_op.<op>.<n>.0``. It runs:

* in a child process: on a program it cannot convert it ends its process (measured: exit status
  255 on PP-OCRv4 det as Paddle saves it, "the 0th elementwise MUST be ir::FloatAttribute", before
  :func:`float_interp_scales`), which must not take the caller down; its error line is reported
  instead, with the op it failed on (its verbose log names each op as it starts and finishes
  converting it);
* with its graph optimizers off: they install packages at run time (onnx-graphsurgeon through
  Polygraphy, from NVIDIA's package index) and may rewrite the weights whose names the QDQ writer
  looks up; both runtimes optimize the graph themselves when they load it. ``enable_optimize=False``
  turns off only the C++ one: paddle2onnx 2.1 folds constants with Polygraphy whenever it saves the
  file itself, so it returns the bytes and the child writes them;
* inside a temporary directory, as its working directory and its ``TMPDIR``: whatever it writes
  (its intermediate PIR program, files a crash leaves) stays there and is removed with it, whether
  the conversion succeeds, fails or the child is killed;
* on a PIR program in that directory (:func:`pir_program`): a legacy program is translated to PIR
  here, as paddle2onnx would translate it itself, so that the program it reads can be fixed first:
  Paddle 3 declares an interpolation's ``scale`` attribute as doubles (``double[]``, stored as
  ``0.a_f64`` in the program's JSON) while paddle2onnx 2.1 reads it as floats and aborts on the first
  double ("the 0th elementwise MUST be ir::FloatAttribute"; PP-OCRv4 det, any
  ``F.interpolate(scale_factor=...)``); :func:`float_interp_scales` writes those scales as float32
  (ONNX ``Resize`` takes float32 scales anyway; the export is checked against Paddle after).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .. import ONNX_INSTALL
from ..errors import ExportError

if TYPE_CHECKING:
    import onnx

    from ..model_io import ModelFiles

#: The opset exported graphs use: per-channel ``DequantizeLinear`` (``axis``) needs 13.
OPSET = 13
#: PIR ops with a ``scale`` attribute (``double[]``) paddle2onnx 2.1 reads as ``float[]`` (its interpolate mapper),
#: as a program's JSON names them (``1.``: the ``pd_op`` dialect).
INTERP_OPS = ("1.nearest_interp", "1.bilinear_interp", "1.bicubic_interp")
#: A program's JSON type tags of an array attribute, a double and a float element.
_ARRAY, _DOUBLE, _FLOAT = "0.a_array", "0.a_f64", "0.a_f32"
#: Set to 1 to see what paddle2onnx prints while it converts (``qcli --verbose`` does).
PADDLE2ONNX_LOGS_ENV = "QCORE_PADDLE2ONNX_LOGS"

_CONVERT = """
import sys
import paddle2onnx
data = paddle2onnx.export(sys.argv[1], sys.argv[2], None, opset_version=int(sys.argv[4]), enable_optimize=False,
                          enable_onnx_checker=False, verbose=True)
with open(sys.argv[3], "wb") as out:
    out.write(data)
"""


def require_onnx() -> None:
    """Raise :class:`ExportError` naming the extra to install when onnx, paddle2onnx or onnxruntime (which runs
    every export before it is kept) is missing."""
    for module in ("onnx", "paddle2onnx", "onnxruntime"):
        try:
            __import__(module)
        except ImportError as error:
            raise ExportError(f"ONNX export needs {module} ({error}); install it with: {ONNX_INSTALL}") \
                from None


#: paddle2onnx's verbose log: "Start export pd_op.nearest_interp, op_id: 1922", then "Finish export ..." once done.
_STARTED = re.compile(r"Start export (\S+), op_id: (\d+)")
_FINISHED = re.compile(r"Finish export \S+, op_id: (\d+)")


def _failed_op(log: str) -> str | None:
    """The op paddle2onnx started converting and never finished (its verbose log), or None."""
    finished = set(_FINISHED.findall(log))
    started = [(op, op_id) for op, op_id in _STARTED.findall(log) if op_id not in finished]
    return f"{started[-1][0]} (op {started[-1][1]})" if started else None


def _error_line(log: str) -> str:
    lines = [line.strip() for line in log.splitlines() if line.strip() and not set(line.strip()) <= set("-=")]
    at = next((i for i, line in enumerate(lines) if "ERROR" in line or "Error" in line), None)
    found = lines[at] if at is not None else (lines[-1] if lines else "")
    if found.startswith("Error Message Summary") and at is not None and at + 1 < len(lines):
        found = lines[at + 1]  # Paddle's enforce message: the summary line, then the error itself
    return found.split("[ERROR]")[-1].strip()[:300]


def float_interp_scales(program: object) -> int:
    """Write the ``scale`` attribute of each :data:`INTERP_OPS` op in ``program`` (a PIR program's JSON, nested
    blocks included) as float32s, in place; returns how many ops changed."""
    if isinstance(program, list):
        return sum(float_interp_scales(item) for item in program)
    if not isinstance(program, dict):
        return 0
    changed = 0
    if program.get("#") in INTERP_OPS:
        for attr in program.get("A", []):
            elements = attr["AT"]["D"] if attr.get("N") == "scale" and attr["AT"].get("#") == _ARRAY else []
            doubles = [e for e in elements if e.get("#") == _DOUBLE]
            for element in doubles:
                element["#"] = _FLOAT
            changed += bool(doubles)
    return changed + sum(float_interp_scales(value) for value in program.values())


def pir_program(files: ModelFiles, directory: Path) -> tuple[Path, Path]:
    """The program of ``files`` as a PIR JSON file in ``directory`` that paddle2onnx 2.1 converts, and its params
    file: a legacy program translated to PIR (:func:`qcore.model_io.load_model`), interpolation scales as float32
    (:func:`float_interp_scales`). ``files`` are only read."""
    from ..model_io import load_model, save_model

    if files.family == "legacy":
        files = save_model(load_model(files, family="pir"), directory / "pir")
    program = json.loads(files.model_file.read_text())
    float_interp_scales(program)
    model_file = directory / "program.json"
    model_file.write_text(json.dumps(program))
    assert files.params_file is not None
    return model_file, files.params_file


def float_onnx(files: ModelFiles, opset: int = OPSET) -> onnx.ModelProto:
    """paddle2onnx's ONNX graph of the float program in ``files`` (a combined-params model)."""
    require_onnx()
    import onnx

    with tempfile.TemporaryDirectory(prefix="qcore-p2o-") as tmp:
        out = Path(tmp) / "model.onnx"
        model_file, params_file = pir_program(files, Path(tmp))
        done = subprocess.run(
            [sys.executable, "-c", _CONVERT, str(model_file.resolve()), str(params_file.resolve()), str(out),
             str(opset)],
            capture_output=True, text=True, cwd=tmp, env={**os.environ, "GLOG_minloglevel": "2", "TMPDIR": tmp},
            check=False,
        )
        if os.environ.get(PADDLE2ONNX_LOGS_ENV) == "1":
            sys.stderr.write(done.stdout + done.stderr)
        if done.returncode != 0 or not out.is_file():
            log = done.stdout + done.stderr
            op = _failed_op(log)
            raise ExportError(f"paddle2onnx could not convert {files.model_file.name}{f' at {op}' if op else ''}: "
                              f"{_error_line(log) or f'exit status {done.returncode}'}")
        return onnx.load(str(out))
