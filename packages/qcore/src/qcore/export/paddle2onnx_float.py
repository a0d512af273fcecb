"""The float ONNX graph of a Paddle program, from paddle2onnx (the optional ``qcore[onnx]`` extra).

paddle2onnx 2.1 reads both IRs (it translates legacy programs to PIR first), keeps parameter
names as initializer names and names activations ``p2o.pd_op.<op>.<n>.0``. It runs with its
graph optimizer off: that optimizer installs packages at run time (onnx-graphsurgeon through
polygraphy) and may rewrite the weights whose names the QDQ writer looks up; both runtimes
optimize the graph themselves when they load it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ExportError
from ..paddle_env import native_output_quiet

if TYPE_CHECKING:
    import onnx

    from ..model_io import ModelFiles

#: The opset exported graphs use: per-channel ``DequantizeLinear`` (``axis``) needs 13.
OPSET = 13
#: Set to 1 to see what paddle2onnx prints while it converts (``qcli --verbose`` does).
PADDLE2ONNX_LOGS_ENV = "QCORE_PADDLE2ONNX_LOGS"


def require_onnx() -> None:
    """Raise :class:`ExportError` naming the extra to install when paddle2onnx or onnx is missing."""
    for module in ("onnx", "paddle2onnx"):
        try:
            __import__(module)
        except ImportError as error:
            raise ExportError(f"ONNX export needs {module} ({error}); install it with: pip install 'qcore[onnx]'") \
                from None


def float_onnx(files: ModelFiles, opset: int = OPSET) -> onnx.ModelProto:
    """paddle2onnx's ONNX graph of the float program in ``files`` (a combined-params model)."""
    require_onnx()
    import onnx
    import paddle2onnx

    assert files.params_file is not None
    with tempfile.TemporaryDirectory(prefix="qcore-p2o-") as tmp:
        out = Path(tmp) / "model.onnx"
        try:
            with native_output_quiet(os.environ.get(PADDLE2ONNX_LOGS_ENV) != "1"):
                paddle2onnx.export(str(files.model_file), str(files.params_file), str(out), opset_version=opset,
                                   enable_optimize=False, enable_onnx_checker=False, verbose=False)
        except Exception as error:  # paddle2onnx raises bare Exceptions / AssertionErrors
            raise ExportError(f"paddle2onnx could not convert {files.model_file.name}: {error}") from None
        if not out.is_file():
            raise ExportError(f"paddle2onnx wrote no ONNX file for {files.model_file.name} (an op it cannot convert: "
                              f"set {PADDLE2ONNX_LOGS_ENV}=1 to see its log)")
        return onnx.load(str(out))
